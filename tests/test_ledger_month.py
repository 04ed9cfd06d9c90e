"""A simulated month: 50 clusters across teams (preempted, stopped and started, still running),
metered by the ledger at each tick through a restart; showback equals price × time computed here;
settlement; then a late event becomes a compensating line, not a change."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import duckdb
from ledger_history import History, cand
from nats_fixtures import connect_bus

from skypurza.events import ledger_queries as lq
from skypurza.events.clock import ManualClock
from skypurza.events.models import (
    ClusterProvisioned, ClusterStarted, ClusterStopped, ClusterTerminated, SpotPreempted, TaskSubmitted,
)
from skypurza.events.types import NodeInfo
from skypurza.services.ledger.billing import billing, weights_for_team
from skypurza.services.ledger.ledgerconfig import parse_ledger_config
from skypurza.services.ledger.service import LedgerService
from skypurza.services.ledger.showback import UsageRow, report

OCT = datetime(2026, 10, 1, tzinfo=UTC)
NOV = datetime(2026, 11, 1, tzinfo=UTC)
MID = datetime(2026, 10, 15, tzinfo=UTC)
TEAMS = ["ml", "vision", "infra", "research"]
CFG = parse_ledger_config({
    "billing": {"weights": {"default": "CPU=1.0,Mem=0.25G,GRES/gpu=2.0",
                            "teams": {"vision": "CPU=0.5,GRES/gpu=4.0", "research": "CPU=0.29"}}},
})
TICK_S = 6 * 3600
US = timedelta(microseconds=1)


@dataclass
class Run:
    cluster: str
    rank: int
    team: str
    user: str
    price: int
    tres: dict
    start: datetime
    end: datetime | None = None  # None: still running

    def cost(self, until: datetime) -> int:
        return self.price * ((min(self.end or until, until) - self.start) // US) // 3_600_000_000

    def billing_seconds(self, until: datetime) -> int:
        b = billing(weights_for_team(self.team, CFG.team_weights, CFG.default_weights), self.tres).billing_int
        return b * ((min(self.end or until, until) - self.start) // US) // 1_000_000


def schedule(seed: int = 7):
    """(time, event) pairs for 50 clusters, the node runs they imply, and two clusters to use later."""
    rng = random.Random(seed)
    events, runs = [], []
    late_stop = late_term = None
    for i in range(50):
        name, team, user = f"m{i}", TEAMS[i % 4], f"user{i % 7}"
        nodes, spot = 1 + i % 3, i % 5 == 2
        price = 150_000 + 37_123 * i
        tres = {"cpu": 4 * (1 + i % 4), "mem": 16384 * (1 + i % 2), "node": 1}
        if i % 3 == 0:
            tres.update({"gres/gpu": 1 + i % 2, "gres/gpu:a10g": 1 + i % 2})
        launch = OCT + timedelta(days=rng.randint(0, 18), seconds=rng.randint(0, 86_399),
                                 microseconds=rng.randint(0, 999_999))
        c = cand(num_nodes=nodes, use_spot=spot, hourly_price_micros=price)
        ranks = list(range(nodes))
        events.append((launch - timedelta(seconds=5), TaskSubmitted(task_id=f"t{name}", cluster=name, task={},
                                                                    num_nodes=nodes, user=user, team=team)))
        events.append((launch, ClusterProvisioned(
            cluster=name, task_id=f"t{name}", placement_id=f"p{name}", candidate=c,
            nodes=[NodeInfo(rank=r, instance_id=f"i-{name}-{r}") for r in ranks], hourly_price_micros=price,
            launched_at=launch, user=user, team=team, tres=tres)))
        first = [Run(name, r, team, user, price, tres, launch) for r in ranks]
        runs += first
        kind = i % 5
        d1 = timedelta(hours=rng.randint(3, 200), seconds=rng.randint(0, 3599))
        if kind == 0:  # runs, then torn down
            end = launch + d1
            events.append((end, ClusterTerminated(cluster=name, terminated_at=end)))
            for run in first:
                run.end = end
        elif kind in (1, 4):  # stopped, started again; 1 is then torn down, 4 still runs
            stop = launch + d1
            start2 = stop + timedelta(hours=rng.randint(1, 48))
            events.append((stop, ClusterStopped(cluster=name, stopped_at=stop)))
            events.append((start2, ClusterStarted(cluster=name, started_at=start2)))
            for run in first:
                run.end = stop
            second = [Run(name, r, team, user, price, tres, start2) for r in ranks]
            runs += second
            if kind == 1:
                end = start2 + timedelta(hours=rng.randint(2, 100), minutes=rng.randint(0, 59))
                end = min(end, NOV - timedelta(hours=1))
                events.append((end, ClusterTerminated(cluster=name, terminated_at=end)))
                for run in second:
                    run.end = end
            elif late_term is None:
                late_term = (name, second)
        elif kind == 2:  # spot: rank 0 preempted, the cluster torn down a bit later
            pre = launch + d1
            end = pre + timedelta(minutes=17, seconds=3)
            events.append((pre, SpotPreempted(cluster=name, rank=0, instance_id=f"i-{name}-0", detected_at=pre)))
            events.append((end, ClusterTerminated(cluster=name, terminated_at=end, reason="recovery")))
            for run in first:
                run.end = pre if run.rank == 0 else end
        elif kind == 3 and late_stop is None and launch < MID - timedelta(hours=30):
            late_stop = (name, first)
    for t, ev in events:
        assert t < NOV
    return sorted(events, key=lambda te: te[0]), runs, late_stop, late_term


def test_a_metered_month_settles_and_late_usage_is_compensated(nats_server, tmp_path):
    events, runs, late_stop, late_term = schedule()
    assert late_stop and late_term
    # The stop of one cluster becomes known only after the meter has run past it.
    stop_at = MID - timedelta(hours=4, seconds=13)
    for run in late_stop[1]:
        run.end = stop_at
    clock = ManualClock(MID)
    db = tmp_path / "ledger.duckdb"

    def service() -> LedgerService:
        return LedgerService(db, tick_s=TICK_S, config=CFG, clock=clock, meter_every_s=3600)

    async def settle_down(bus, svc) -> None:
        """Meter until nothing is due and the projection has the whole log."""
        for _ in range(20):
            assert await svc.wait_caught_up(30)
            if await svc.meter_once() == 0 and await svc.compensate() == 0:
                assert await svc.wait_caught_up(30)
                return
        raise AssertionError("the meter did not settle")

    async def main():
        bus = await connect_bus(nats_server)
        h = History(prefix="month")
        first = [(t, ev) for t, ev in events if t < MID]
        rest = [(t, ev) for t, ev in events if t >= MID]
        for t, ev in first:
            h.add(ev, at=t)
        await bus.publish_many(h.envs)
        svc = service()
        await svc.start(bus)
        await settle_down(bus, svc)
        mid_rows = await svc._read(lambda cur: cur.execute("SELECT count(*) FROM usage").fetchall()[0][0])
        await svc.close()  # restart: the next ledger continues from the log, no double count

        n0 = len(h.envs)
        h.add(ClusterStopped(cluster=late_stop[0], stopped_at=stop_at), at=MID + timedelta(minutes=5))
        for t, ev in rest:
            h.add(ev, at=t)
        await bus.publish_many(h.envs[n0:])
        clock.set(NOV)
        svc = service()
        await svc.start(bus)
        await settle_down(bus, svc)
        oct_report = {by: await lq.cost_report(bus, by=by, since="2026-10", until="2026-11")
                      for by in ("team", "cluster", "user", "day", "region")}
        settled = await lq.settle(bus, "2026-10")
        try:
            await lq.settle(bus, "2026-10")
            raise AssertionError("settled twice")
        except RuntimeError as exc:
            assert "already settled" in str(exc)

        # After settlement: a teardown on Oct 31, known only now.
        late_end = datetime(2026, 10, 31, 12, 0, 7, tzinfo=UTC)
        h.add(ClusterTerminated(cluster=late_term[0], terminated_at=late_end), at=NOV + timedelta(hours=1))
        await bus.publish(h.envs[-1])
        await settle_down(bus, svc)
        oct_after = await lq.cost_report(bus, by="team", since="2026-10", until="2026-11")
        nov_after = await lq.cost_report(bus, by="team", since="2026-11")
        settlements = await lq.settlements(bus)
        await svc.close()
        await bus.close()
        return mid_rows, oct_report, settled, late_end, oct_after, nov_after, settlements

    mid_rows, oct_report, settled, late_end, oct_after, nov_after, settlements = asyncio.run(main())
    assert mid_rows > 500

    # Showback == price × time per node run, computed here (integer micro-dollars, no drift).
    want_cost, want_bill = defaultdict(int), defaultdict(int)
    for run in runs:
        want_cost[run.team] += run.cost(NOV)
        want_bill[run.team] += run.billing_seconds(NOV)
    lines = {line["key"]: line for line in oct_report["team"]["lines"] if line["kind"] == "usage"}
    assert {t: lines[t]["cost_micros"] for t in lines} == dict(want_cost)
    assert {t: lines[t]["billing_seconds"] for t in lines} == dict(want_bill)
    assert not [line for line in oct_report["team"]["lines"] if line["kind"] == "compensation"]
    by_cluster = defaultdict(int)
    for run in runs:
        by_cluster[run.cluster] += run.cost(NOV)
    assert {line["key"]: line["cost_micros"] for line in oct_report["cluster"]["lines"]} == dict(by_cluster)
    for by in ("user", "day", "region"):
        assert sum(line["cost_micros"] for line in oct_report[by]["lines"]) == sum(want_cost.values())

    # The settlement carries exactly those totals.
    assert {t: v["cost_micros"] for t, v in settled["teams"].items()} == dict(want_cost)
    assert {t: v["billing_seconds"] for t, v in settled["teams"].items()} == dict(want_bill)

    # The late teardown: October's lines and the settlement do not change; November shows a
    # compensation for October of exactly the time taken back.
    assert oct_after["lines"] == oct_report["team"]["lines"]
    assert [s["total_micros"] for s in settlements] == [sum(want_cost.values())]
    comp = [line for line in nov_after["lines"] if line["kind"] == "compensation"]
    team = late_term[1][0].team
    taken_back = sum(r.price * ((NOV - r.start) // US) // 3_600_000_000
                     - r.price * ((late_end - r.start) // US) // 3_600_000_000 for r in late_term[1])
    assert comp == [{**comp[0], "key": team, "for_period": "2026-10", "cost_micros": -taken_back}]
    assert taken_back > 0

    # The SQL report agrees with showback.report (the pure rules) on the very same rows.
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute('SELECT event_id, cluster, start_at, end_at, cost_micros, "user", team, project, region, '
                       'billing_seconds, booked_period, period, seq FROM usage').fetchall()
    n_comp = con.execute("SELECT count(*) FROM compensations WHERE for_period = '2026-10'").fetchall()[0][0]
    corrections = con.execute("SELECT cluster, count(*) FROM usage WHERE correction GROUP BY cluster ORDER BY cluster").fetchall()
    con.close()
    usage_rows = [UsageRow(r[0], r[1], r[2].replace(tzinfo=UTC), r[3].replace(tzinfo=UTC), r[4], r[5] or "", r[6],
                           r[7], r[8], r[9]) for r in rows if r[10] == r[11]]
    pure = report(usage_rows, by="team", since=OCT, until=NOV)
    assert [(p.key, p.cost_micros, p.billing_seconds, p.rows) for p in pure] == \
        [(line["key"], line["cost_micros"], line["billing_seconds"], line["rows"]) for line in oct_after["lines"]]
    assert n_comp == len(late_term[1])  # the ledger recorded a CompensationRecorded per late row
    assert len({r[0] for r in rows}) == len(rows)
    # Both late stops were taken back by negative intervals, one per node.
    assert dict(corrections) == {late_stop[0]: len(late_stop[1]), late_term[0]: len(late_term[1])}
