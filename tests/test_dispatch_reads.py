"""`spz dispatch queue|share|prio`, `spz budgets` and the API's dispatch routes ask the dispatch
service, which answers from the state it keeps current: a read of a month-old log costs what a
read of a new one does (issue 21). Counted in messages read, not seconds: the reader and the
service replay nothing for a read, however many UsageRecorded pile up, while the fold of the log
(what answers when no dispatch service runs) reads all of them and answers the same.
Real parts: a nats-server, our bus, the dispatch service under ServiceRunner."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any, AsyncIterator

from skypurza.events import dispatch_queries
from skypurza.events.bus import Bus
from skypurza.events.dispatch_events import DispatchPolicyApplied
from skypurza.events.models import TaskSubmitted, UsageRecorded
from skypurza.events.service import ServiceRunner
from skypurza.services.dispatch import ask, reads
from skypurza.services.dispatch.policy import load_policy
from skypurza.services.dispatch.service import DispatchService, load_state

POLICY = """
flavors:
  - name: local
    infra: local
queues:
  - name: team-a
    team: team-a
    quotas:
      - flavor: local
        resources:
          cpu: {nominal: 1}
budgets:
  - team: team-a
    period: month
    limit_usd: 1000
priority:
  weights: {fairshare: 10000, jobsize: 500}
  shares:
    - team: team-a
      shares: 1
      users: {ana: 1, bo: 2}
"""


class CountingBus(Bus):
    """Our bus, counting the messages its replays hand out."""

    read = 0

    async def replay_raw(self, **kwargs: Any) -> AsyncIterator[Any]:
        async for msg in super().replay_raw(**kwargs):
            self.read += 1
            yield msg


def _submit(task_id: str, user: str) -> TaskSubmitted:
    return TaskSubmitted(task_id=task_id, cluster=f"c-{task_id}", user=user, team="team-a",
                         task={"resources": {"cpus": 1, "infra": "local"}, "run": "true"})


def _usage(n: int) -> list[UsageRecorded]:
    t = datetime.now(timezone.utc) - timedelta(hours=1)  # this month: the budget counts it
    return [UsageRecorded(cluster="c-old", rank=0, instance_id="i-1", start=t + timedelta(seconds=i),
                          end=t + timedelta(seconds=i + 1), hourly_price_micros=3_600_000, cost_micros=1_000, billing=2.0,
                          user="ana", team="team-a") for i in range(n)]


def _stable(view: dict[str, Any]) -> dict[str, Any]:
    """What does not move with the instant it is computed at (the decayed usage does, in its
    last digits): each pending task's place, reason and priority; the quotas; the tree, rounded."""
    return {"pending": [(p["task_id"], p["position"], p["kind"], p["reason"], p["user"], p["request"])
                        for p in view["pending"]],
            "policy": view["policy"], "priority": view["priority"], "queues": view["queues"]}


async def _until(check, what: str, timeout: float = 20.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while not (got := await check()):
        assert asyncio.get_running_loop().time() < deadline, f"waited for {what}"
        await asyncio.sleep(0.05)
    return got


def test_a_dispatch_read_costs_the_same_for_a_short_and_a_long_log(nats_server) -> None:
    async def main() -> None:
        reader = await CountingBus.connect(nats_server.url, "test", source="/tests")
        service_bus = await CountingBus.connect(nats_server.url, "test", source="/tests")
        service = DispatchService()
        runner = ServiceRunner(service_bus, service)
        job = asyncio.create_task(runner.run())
        try:
            await reader.publish(DispatchPolicyApplied(policy=load_policy(POLICY, "p.yaml"), source="p.yaml"))
            await reader.publish_many([_submit("t1", "ana"), _submit("t2", "bo"), _submit("t3", "ana")])

            async def two_held() -> Any:
                v = await ask.read(reader, "queue")
                return v if sum(p["kind"] == "quota" for p in v["pending"]) == 2 else None

            await _until(two_held, "two tasks held for quota")
            await _until(lambda: dispatch_queries.ask(reader, "queue"), "the service answering")

            async def reads_of_each() -> tuple[int, dict[str, Any], int]:
                reader.read, before = 0, service_bus.read
                views = {q: await ask.read(reader, q) for q in reads.VIEWS}
                return reader.read, views, service_bus.read - before

            short_read, short, short_service = await reads_of_each()
            assert short_read == 0 and short_service == 0, (short_read, short_service)

            # A long history: 3,000 metered seconds (each folded: spend, decayed usage), then a
            # new submission right before the read, which the answer must already show.
            await reader.publish_many(_usage(3000))
            await reader.publish(_submit("t4", "bo"))
            long_read, long, long_service = await reads_of_each()
            assert long_read == 0 and long_service == 0, (long_read, long_service)  # not 3,000
            assert "t4" in [p["task_id"] for p in long["queue"]["pending"]]  # current to the log's end
            assert long["budgets"]["budgets"][0]["spent_usd"] == 3.0  # 3,000 × $0.001, folded
            ana = next(r for r in long["share"]["rows"] if r["user"] == "ana")
            assert ana["raw_usage"] > 0 and long["share"]["algorithm"] == "fair_tree"

            # The same answer as the fold of the whole log, which reads every event it folds.
            reader.read = 0
            now = datetime.now(timezone.utc)
            folded = await load_state(reader)
            fold_read = reader.read
            assert fold_read > 3000, fold_read
            assert _stable(reads.view(folded, "queue", now)) == _stable(long["queue"])
            assert reads.view(folded, "budgets", now) == long["budgets"]
            def tree(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
                return [(r["path"], r["raw_shares"], None if r["fairshare"] is None else round(r["fairshare"], 6))
                        for r in rows]

            assert tree(reads.view(folded, "share", now)["rows"]) == tree(long["share"]["rows"])

            # No dispatch service: the reader folds the log itself, with the same answer.
            runner.stop()
            await job
            await service.close()  # what the host does on the way out: it answers no more
            assert await ask.from_service(reader, "queue") is None
            reader.read = 0
            alone = await ask.read(reader, "queue")
            assert reader.read == fold_read and _stable(alone) == _stable(long["queue"])
        finally:
            runner.stop()
            if not job.done():
                await job
            await reader.close()
            await service_bus.close()

    asyncio.run(main())


def test_a_bad_query_is_refused_and_the_service_goes_on(nats_server) -> None:
    async def main() -> None:
        bus = await Bus.connect(nats_server.url, "test", source="/tests")
        runner = ServiceRunner(bus, DispatchService())
        job = asyncio.create_task(runner.run())
        try:
            await _until(lambda: ask.from_service(bus, "queue"), "the service answering")
            for params, says in (({"min_seq": "soon"}, "min_seq"), ({"min_seq": -1}, "min_seq"),
                                 ({"algorithm": "x" * 100}, "algorithm")):
                query = "share" if "algorithm" in params else "queue"
                try:
                    await bus.request(dispatch_queries.SERVICE, query, params, timeout=5)
                except RuntimeError as exc:
                    assert says in str(exc), exc
                else:
                    raise AssertionError(f"{params} was answered")
            # Past the log's end: it waits at most its bound, then says it is behind (the caller folds).
            await bus.publish(DispatchPolicyApplied(policy=None, source="x"))
            assert (await dispatch_queries.ask(bus, "queue", min_seq=await bus.last_seq()))["policy"] is False
            view = await dispatch_queries.ask(bus, "budgets", min_seq=10 ** 9)
            assert view == {"budgets": []}  # nothing dispatch reads lies past the end: no wait
        finally:
            runner.stop()
            await job
            await bus.close()

    asyncio.run(main())
