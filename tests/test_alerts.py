"""Alerts (services/observability/alerts/): the pure rules with a clock, the webhook forms, a real
HTTP receiver that fails before it takes a message, the whole path through a real nats-server
(events in, webhooks called, `spz alerts list -o json`), and the Prometheus rules file under
Debian's `promtool`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path

import pytest
from nats_fixtures import connect_bus

from skypurza.events.alert_events import AlertDelivered, AlertDeliveryClaimed, AlertRaised, AlertResolved
from skypurza.events.clock import SYSTEM_CLOCK, ManualClock
from skypurza.events.cluster_events import AutostopSet, ClusterProvisioned, ClusterTerminated, OrphanFound
from skypurza.events.deadletters import park
from skypurza.events.dispatch_events import TaskAdmitted, TaskHeld
from skypurza.events.health_events import GpuUnhealthy
from skypurza.events.job_events import JobQueued, JobStarted, JobSucceeded
from skypurza.events.managed_events import ManagedJobStatusChanged, ManagedJobSubmitted
from skypurza.events.settings import SettingsError
from skypurza.events.types import Candidate, NodeInfo
from skypurza.services.observability.alerts import claims, delivery, rules
from skypurza.services.observability.alerts.cli import history
from skypurza.services.observability.alerts.service import AlertsService, Book
from skypurza.services.observability.alerts.settings import AlertSettings, Webhook
from skypurza.services.observability.samples import Snapshot, families

CFG = AlertSettings(idle_s=3600, pending_s=600, max_recoveries=2, dead_letter_window_s=300)


def _provisioned(cluster: str, *, idle_minutes: int | None = None) -> ClusterProvisioned:
    return ClusterProvisioned(cluster=cluster, task_id=f"t-{cluster}", placement_id="p", candidate=Candidate(infra="local"),
                              nodes=[NodeInfo(rank=0, instance_id="i-0")], hourly_price_micros=1,
                              launched_at=ManualClock().now(), user="alice", idle_minutes=idle_minutes)


def _gpu(cluster: str, severity: str = "fatal") -> GpuUnhealthy:
    return GpuUnhealthy(cluster=cluster, rank=0, gpu_index=None, rule="xid", severity=severity,
                        detail="Xid 79 (GPU has fallen off the bus)", evidence={"xid": 79}, detected_at=ManualClock().now())


def _kinds(state: rules.AlertState, clock: ManualClock) -> dict[str, str]:
    return {k: a.kind for k, a in rules.firing(state, clock.now(), CFG).items()}


# ---------------------------------------------------------------- the rules, pure, with a clock


def test_idle_cluster_without_autostop_fires_after_the_threshold_and_a_job_resolves_it() -> None:
    clock, s = ManualClock(), rules.AlertState()
    rules.apply(s, clock.now(), _provisioned("idle"))
    rules.apply(s, clock.now(), _provisioned("auto", idle_minutes=30))  # autostop on: never this alert
    clock.advance(3599)
    assert _kinds(s, clock) == {}
    clock.advance(1)
    assert _kinds(s, clock) == {"cluster_idle:idle": "cluster_idle"}
    alert = rules.firing(s, clock.now(), CFG)["cluster_idle:idle"]
    assert alert.evidence["idle_s"] == 3600 and "no autostop" in alert.summary
    rules.apply(s, clock.now(), JobQueued(cluster="idle", job_id=1, task_id="x", task={"run": "true"}))
    assert "cluster_idle:idle" not in _kinds(s, clock)  # busy now (pending counts)
    rules.apply(s, clock.now(), JobStarted(cluster="idle", job_id=1, started_at=clock.now()))
    rules.apply(s, clock.advance(60), JobSucceeded(cluster="idle", job_id=1, ended_at=clock.now()))
    clock.advance(3599)
    assert _kinds(s, clock) == {}  # idle again, counted from the job's end
    clock.advance(1)
    assert "cluster_idle:idle" in _kinds(s, clock)
    rules.apply(s, clock.now(), AutostopSet(cluster="idle", idle_minutes=10))
    assert _kinds(s, clock) == {}
    rules.apply(s, clock.now(), AutostopSet(cluster="auto", idle_minutes=None))  # autostop cancelled
    assert _kinds(s, clock) == {"cluster_idle:auto": "cluster_idle"}
    rules.apply(s, clock.now(), ClusterTerminated(cluster="auto", terminated_at=clock.now()))
    assert _kinds(s, clock) == {}


def test_pending_jobs_and_recovered_managed_jobs() -> None:
    clock, s = ManualClock(), rules.AlertState()
    rules.apply(s, clock.now(), _provisioned("busy", idle_minutes=5))
    rules.apply(s, clock.now(), JobQueued(cluster="busy", job_id=7, task_id="x", task={"run": "true"}, name="train"))
    rules.apply(s, clock.now(), ManagedJobSubmitted(managed_job_id=3, name="ft", tasks=[{"run": "true"}]))
    clock.advance(599)
    assert _kinds(s, clock) == {}
    clock.advance(1)
    assert _kinds(s, clock) == {"job_pending:busy:7": "job_pending", "job_pending:managed:3": "job_pending"}
    rules.apply(s, clock.now(), JobStarted(cluster="busy", job_id=7, started_at=clock.now()))
    for n in (1, 2, 3):
        rules.apply(s, clock.now(), ManagedJobStatusChanged(managed_job_id=3, status="RECOVERING", kind="preempted",
                                                            recoveries=n))
        assert ("managed_job_recoveries:3" in _kinds(s, clock)) == (n > CFG.max_recoveries)
    assert "job_pending:managed:3" not in _kinds(s, clock)  # no longer pending
    rules.apply(s, clock.now(), ManagedJobStatusChanged(managed_job_id=3, status="SUCCEEDED", kind="succeeded",
                                                        recoveries=3))
    assert _kinds(s, clock) == {}  # a finished job is forgotten


def test_dead_letters_orphans_gpu_findings_and_budget_holds() -> None:
    clock, s = ManualClock(), rules.AlertState()
    rules.apply_dead_letter(s, "ledger", clock.now(), CFG.dead_letter_window_s)
    rules.apply_dead_letter(s, "ledger", clock.advance(10), CFG.dead_letter_window_s)
    got = rules.firing(s, clock.now(), CFG)["dead_letters:ledger"]
    assert got.severity == "critical" and got.evidence["count"] == 2
    clock.advance(300)
    assert _kinds(s, clock) == {}  # quiet for the window: resolved
    rules.apply_dead_letter(s, "ledger", clock.now(), CFG.dead_letter_window_s)
    assert rules.firing(s, clock.now(), CFG)["dead_letters:ledger"].evidence["count"] == 1  # a new episode
    clock.advance(300)

    rules.apply(s, clock.now(), OrphanFound(cluster="old", instance_id="i-9", region="us-east-1"))
    assert _kinds(s, clock) == {"orphan:old:i-9": "orphan"}
    rules.apply(s, clock.now(), OrphanFound(cluster="old", instance_id="i-9", region="us-east-1", action="terminated"))
    assert _kinds(s, clock) == {}

    rules.apply(s, clock.now(), _provisioned("gpubox", idle_minutes=5))
    rules.apply(s, clock.now(), _gpu("gpubox"))
    rules.apply(s, clock.now(), _gpu("gpubox"))  # the same finding again: one alert
    firing = rules.firing(s, clock.now(), CFG)
    assert list(firing) == ["gpu_unhealthy:gpubox:0:None:xid:79"]
    assert firing["gpu_unhealthy:gpubox:0:None:xid:79"].severity == "critical"
    rules.apply(s, clock.now(), ClusterTerminated(cluster="gpubox", terminated_at=clock.now()))
    assert _kinds(s, clock) == {}
    rules.apply(s, clock.now(), _gpu("gpubox"))  # a late sample of the gone cluster: nothing to fix
    assert _kinds(s, clock) == {}

    rules.apply(s, clock.now(), TaskHeld(task_id="t5", cluster="c5", submitted_seq=9, kind="budget",
                                         reason="team ml spent $100.00 of its $100 monthly budget"))
    assert rules.firing(s, clock.now(), CFG)["budget:t5"].summary.endswith("monthly budget")
    rules.apply(s, clock.now(), TaskAdmitted(task_id="t5", cluster="c5", submitted_seq=9))
    assert _kinds(s, clock) == {}


def test_a_soft_budget_alert_fires_at_its_level_and_ends_with_its_period() -> None:
    from skypurza.events.dispatch_events import BudgetThresholdCrossed

    clock, s = ManualClock(), rules.AlertState()
    key = clock.now().strftime("%Y-%m")

    def crossed(state: str, spent: float) -> BudgetThresholdCrossed:
        return BudgetThresholdCrossed(budget_id="ml/month", team="ml", period="month", period_key=key, state=state,
                                      spent_usd=spent, limit_usd=100, fraction=spent / 100, hard=False, alert_at=0.8)

    rules.apply(s, clock.now(), crossed("alert", 81))
    got = rules.firing(s, clock.now(), CFG)["budget_level:ml/month"]
    assert (got.kind, got.severity) == ("budget", "warning")
    assert got.summary == "ml: $81.00 of $100.00 monthly budget past its 80% alert level (81%)"
    rules.apply(s, clock.now(), crossed("exceeded", 100.5))
    assert rules.firing(s, clock.now(), CFG)["budget_level:ml/month"].severity == "critical"
    rules.apply(s, clock.now(), crossed("ok", 40))  # a higher limit: resolved
    assert _kinds(s, clock) == {}
    rules.apply(s, clock.now(), crossed("alert", 85))
    clock.advance(40 * 86400)  # the next month: the budget starts from 0 again
    assert _kinds(s, clock) == {}


def test_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rules, "MAX_TRACKED", 50)
    s, clock = rules.AlertState(), ManualClock()
    for i in range(500):
        rules.apply(s, clock.now(), JobQueued(cluster=f"c{i}", job_id=i, task_id="x", task={"run": "true"}))
    assert len(s.pending) == 50 and len(s.clusters) == 50


# ---------------------------------------------------------------- settings and the message forms


def test_settings_are_bounded_and_never_echo_a_webhook_url() -> None:
    cfg = AlertSettings.load(env={}, config={"alerts": {"slack_webhooks": ["https://hooks.example/T/B/secret"],
                                                        "json_webhooks": "http://127.0.0.1:9/a,http://127.0.0.1:9/a"}})
    assert [h.form for h in cfg.webhooks] == ["slack", "json"]  # the same URL twice is one webhook
    assert "secret" not in cfg.webhooks[0].id and cfg.webhooks[0].id.startswith("slack-")
    with pytest.raises(SettingsError) as err:
        AlertSettings.load(env={"SKYPURZA_ALERTS_SLACK_WEBHOOKS": "ftp://x/token-123"}, config={})
    assert "token-123" not in str(err.value)
    with pytest.raises(SettingsError, match="SKYPURZA_ALERTS_ATTEMPTS"):
        AlertSettings.load(env={"SKYPURZA_ALERTS_ATTEMPTS": "1000"}, config={})
    with pytest.raises(SettingsError, match="SKYPURZA_ALERTS_IDLE_S"):
        AlertSettings.load(env={"SKYPURZA_ALERTS_IDLE_S": "1"}, config={})
    with pytest.raises(SettingsError, match="at most 10"):
        AlertSettings.load(env={"SKYPURZA_ALERTS_JSON_WEBHOOKS": ",".join(f"http://h/{i}" for i in range(11))},
                           config={})


MSG = delivery.Message("test", "raised", "gpu_unhealthy:gpubox:0:None:xid:79", "gpu_unhealthy", "gpubox node 0",
                       "critical", "gpubox node 0: Xid 79 <@here>", 1, "2026-01-05T12:00:00+00:00", {"xid": 79})


def test_slack_and_plain_json_forms() -> None:
    slack = json.loads(delivery.body_of(Webhook("http://h/s", "slack"), MSG))
    assert set(slack) == {"text", "blocks"} and "[CRITICAL]" in slack["text"]
    assert all(b["type"] in ("section", "context") for b in slack["blocks"])
    assert "<@here>" not in json.dumps(slack["blocks"])  # a summary cannot mention or link in Slack
    assert "*xid*: 79" in slack["blocks"][1]["text"]["text"]
    plain = json.loads(delivery.body_of(Webhook("http://h/j", "json"), MSG))
    assert plain == {"version": 1, "status": "firing", "stage": "test", "key": MSG.key, "kind": "gpu_unhealthy",
                     "subject": "gpubox node 0", "severity": "critical", "summary": MSG.summary, "occurrence": 1,
                     "raised_at": MSG.at, "evidence": {"xid": 79}}
    done = delivery.Message("test", "resolved", MSG.key, MSG.kind, MSG.subject, "critical", MSG.summary, 1,
                            "2026-01-05T13:00:00+00:00", {}, reason="the cluster was terminated")
    assert json.loads(delivery.body_of(Webhook("http://h/j", "json"), done))["status"] == "resolved"
    assert json.loads(delivery.body_of(Webhook("http://h/s", "slack"), done))["text"].startswith(":white_check_mark:")


# ---------------------------------------------------------------- a real webhook receiver


class Receiver:
    """An HTTP server on 127.0.0.1 that answers 500 to the first `fail` POSTs of each path."""

    def __init__(self, fail: int = 2, status: int = 500):
        self.fail, self.status = fail, status
        self.posts: dict[str, list[dict]] = {}  # path -> every body received
        self.taken: dict[str, list[dict]] = {}  # path -> the bodies answered 200
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    seen = outer.posts.setdefault(self.path, [])
                    seen.append(body)
                    ok = len(seen) > outer.fail
                    if ok:
                        outer.taken.setdefault(self.path, []).append(body)
                self.send_response(200 if ok else outer.status)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_a_failing_receiver_gets_the_message_once_after_retries(receiver: Receiver) -> None:
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)

    out = asyncio.run(delivery.deliver(Webhook(receiver.url + "/hook", "json"), MSG, attempts=5, backoff_s=0.5,
                                       timeout_s=5, sleep=sleep))
    assert out == delivery.Outcome("delivered", 3)
    assert len(receiver.posts["/hook"]) == 3 and len(receiver.taken["/hook"]) == 1
    assert waits == [0.5, 1.0]  # doubled
    # A receiver that keeps failing: bounded, given up with why, never raised.
    out = asyncio.run(delivery.deliver(Webhook("http://127.0.0.1:9/none", "json"), MSG, attempts=3, backoff_s=0.01,
                                       timeout_s=1))
    assert out.outcome == "gave_up" and out.attempts == 3 and "127.0.0.1:9" not in out.error


def test_a_refusing_receiver_is_given_up_at_once() -> None:
    r = Receiver(fail=100, status=404)
    try:
        out = asyncio.run(delivery.deliver(Webhook(r.url + "/x", "slack"), MSG, attempts=5, backoff_s=0.01, timeout_s=2))
        assert out == delivery.Outcome("gave_up", 1, "_Refused: HTTP 404")
    finally:
        r.close()


# ---------------------------------------------------------------- end to end, real nats-server


async def _until(what: str, fn, timeout: float = 30.0):
    for _ in range(int(timeout / 0.05)):
        got = fn()
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what}: gave up")


async def _alert_events(bus) -> list:
    from skypurza.events import naming

    return [st.event async for st in bus.replay(filter_subject=naming.aggregate_events_subject(bus.stage, "alert"))]


def test_end_to_end_events_to_webhooks_and_spz_alerts_list(nats_server, receiver: Receiver, tmp_path) -> None:
    hooks = (Webhook(receiver.url + "/slack", "slack"), Webhook(receiver.url + "/json", "json"))
    cfg = AlertSettings(eval_s=0.1, webhooks=hooks, attempts=5, backoff_s=0.05, timeout_s=2)
    env = {**os.environ, "SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": "test",
           "SKYPURZA_HOME": str(tmp_path / "home")}

    def spz(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, capture_output=True,
                              text=True, timeout=60)

    async def main() -> None:
        bus = await connect_bus(nats_server)
        stop = asyncio.Event()
        svc = AlertsService(cfg)
        task = asyncio.create_task(svc.run(bus, stop))
        try:
            await asyncio.wait_for(svc.serving(), 20)
            await bus.publish(_provisioned("gpubox", idle_minutes=5))
            await bus.publish(_gpu("gpubox"))
            await park(bus, "ledger", seq=1, subject="x", raw=b'{"type":"io.skypurza.nope.v1"}', error="boom")
            # Each webhook failed twice, then took each of the two alerts once.
            await _until("both alerts delivered to both webhooks",
                         lambda: all(len(receiver.taken.get(p, [])) == 2 for p in ("/slack", "/json")))
            await asyncio.sleep(1.0)  # ten more rounds of the rules: nothing sent again
            assert {p: len(v) for p, v in receiver.taken.items()} == {"/slack": 2, "/json": 2}
            assert all(len(v) == 4 for v in receiver.posts.values())  # 2 failures + 2 messages
            kinds = sorted(b["kind"] for b in receiver.taken["/json"])
            assert kinds == ["dead_letters", "gpu_unhealthy"]
            assert all(set(b) == {"text", "blocks"} for b in receiver.taken["/slack"])
            evs = await _alert_events(bus)
            assert sorted(e.kind for e in evs if isinstance(e, AlertRaised)) == ["dead_letters", "gpu_unhealthy"]
            delivered = [e for e in evs if isinstance(e, AlertDelivered)]
            assert len(delivered) == 4 and all(e.outcome == "delivered" for e in delivered)
            assert {e.attempts for e in delivered} >= {3}  # the first of each webhook took three tries

            # `spz alerts list -o json`: both firing, with their deliveries.
            shown = await asyncio.to_thread(spz, "alerts", "list", "-o", "json")
            assert shown.returncode == 0, shown.stderr
            rows = json.loads(shown.stdout)
            assert sorted(r["kind"] for r in rows) == ["dead_letters", "gpu_unhealthy"]
            assert all(r["state"] == "firing" and len(r["deliveries"]) == 2 for r in rows)

            # A second instance (a restart) reads the log back: it raises and sends nothing again.
            stop.set()
            await asyncio.wait_for(task, 10)
            stop = asyncio.Event()
            svc = AlertsService(cfg)
            task = asyncio.create_task(svc.run(bus, stop))
            await asyncio.wait_for(svc.serving(), 20)
            await asyncio.sleep(0.6)
            assert sum(len(v) for v in receiver.posts.values()) == 8
            assert len([e for e in await _alert_events(bus) if isinstance(e, AlertRaised)]) == 2

            # The cluster goes: its alert resolves, and each webhook is told once.
            await bus.publish(ClusterTerminated(cluster="gpubox", terminated_at=ManualClock().now()))
            await _until("the resolve delivered",
                         lambda: any(b.get("status") == "resolved" for b in receiver.taken.get("/json", [])))
            evs = await _alert_events(bus)
            assert [e.kind for e in evs if isinstance(e, AlertResolved)] == ["gpu_unhealthy"]
            shown = await asyncio.to_thread(spz, "alerts", "list", "-o", "json")
            assert [r["kind"] for r in json.loads(shown.stdout)] == ["dead_letters"]
            shown = await asyncio.to_thread(spz, "alerts", "list", "--all", "-o", "json")
            assert {r["kind"]: r["state"] for r in json.loads(shown.stdout)} == {"gpu_unhealthy": "resolved",
                                                                                 "dead_letters": "firing"}
            table = await asyncio.to_thread(spz, "alerts", "list")
            assert table.returncode == 0 and "dead_letters" in table.stdout and "gpu_unhealthy" not in table.stdout
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
            await bus.close()

    asyncio.run(main())


# ---------------------------------------------------------------- several instances: one post per message


def test_who_posts_a_message_follows_the_claim_on_the_log() -> None:
    now = ManualClock().now()
    later = now + timedelta(seconds=60)
    mine, theirs = claims.Claim("me", 1, later), claims.Claim("other", 1, later)
    assert claims.next_step(None, False, "me", now) == ("claim", 1)
    assert claims.next_step(mine, False, "me", now) == ("deliver", 1)  # our append whose ack was lost
    assert claims.next_step(theirs, False, "me", now) == ("wait", 1)
    assert claims.next_step(theirs, False, "me", later) == ("claim", 2)  # lapsed: taken over
    assert claims.next_step(theirs, True, "me", later)[0] == "done"
    assert claims.next_step(mine, True, "me", now)[0] == "done"
    # The log's claim is the highest round; of one round, the first stored.
    held: dict = {}
    k = ("key", 1, "raised", "json-x")
    claims.fold(held, k, theirs)
    claims.fold(held, k, mine)
    assert held[k] is theirs
    claims.fold(held, k, claims.Claim("me", 2, later))
    assert held[k].claimant == "me" and held[k].round == 2
    # A claim outlives the longest delivery: every attempt timing out, every back-off slept.
    assert delivery.longest_s(3, 2.0, 10.0) == 3 * (10.0 + delivery.ATTEMPT_GRACE_S) + 2.0 + 4.0
    assert delivery.longest_s(1, 2.0, 10.0) == 10.0 + delivery.ATTEMPT_GRACE_S
    cfg = AlertSettings(attempts=3, backoff_s=2.0, timeout_s=10.0)
    assert claims.lease(cfg, now) == now + timedelta(seconds=51.0 + claims.CLOCK_MARGIN_S)
    # A claim's hold is bounded from when it was made: a clock years ahead holds a message for
    # hours, not for ever, and no delivery the settings allow outlasts the bound.
    bogus = claims.claim_of("skewed", 1, now, now + timedelta(days=3650))
    assert bogus.until == now + timedelta(seconds=claims.MAX_CLAIM_S)
    assert claims.next_step(bogus, False, "me", bogus.until) == ("claim", 2)
    assert claims.claim_of("a", 1, now, later).until == later
    assert delivery.longest_s(20, 300.0, 60.0) + claims.CLOCK_MARGIN_S < claims.MAX_CLAIM_S  # settings.py's bounds


def test_the_book_folds_claims_until_the_message_is_delivered() -> None:
    t = ManualClock().now()
    book = Book()
    claim = AlertDeliveryClaimed(key="k", webhook_id="json-x", claimant="a", until=t + timedelta(seconds=9), at=t)
    book.apply(claim)
    assert book.claims[("k", 1, "raised", "json-x")] == claims.Claim("a", 1, t + timedelta(seconds=9))
    book.apply(AlertDelivered(key="k", webhook_id="json-x", outcome="delivered", at=t))
    assert book.claims == {} and ("k", 1, "raised", "json-x") in book.delivered
    book.apply(claim)  # a claim read after its delivery (two followers' order) holds nothing
    assert book.claims == {}


@contextlib.asynccontextmanager
async def _serving(bus, *services: AlertsService):
    """The services running on `bus` until the block ends (then stopped, as a SIGTERM stops one)."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(s.run(bus, stop)) for s in services]
    try:
        await asyncio.wait_for(asyncio.gather(*(s.serving() for s in services)), 20)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)


def _two_hooks(receiver: Receiver) -> tuple[Webhook, Webhook]:
    return Webhook(receiver.url + "/slack", "slack"), Webhook(receiver.url + "/json", "json")


def test_two_instances_judging_the_same_round_post_each_message_once(nats_server) -> None:
    receiver = Receiver(fail=0)
    # eval_s an hour: each instance judges once as it starts (nothing fires yet); the test then
    # has both judge the same round, as two instances whose timers coincide would.
    cfg = AlertSettings(eval_s=3600, webhooks=_two_hooks(receiver), attempts=3, backoff_s=0.05, timeout_s=2)

    async def main() -> None:
        bus = await connect_bus(nats_server)
        a, b = AlertsService(cfg), AlertsService(cfg)
        try:
            async with _serving(bus, a, b):
                await bus.publish(_provisioned("gpubox", idle_minutes=5))
                await bus.publish(_gpu("gpubox"))
                await _until("both instances folded the GPU finding",
                             lambda: all("gpu_unhealthy" in {x.kind for x in rules.firing(s.state, SYSTEM_CLOCK.now(),
                                                                                          cfg).values()}
                                         for s in (a, b)))
                raised_a, raised_b = await asyncio.gather(a.judge(), b.judge())
                assert [e.kind for e in raised_a[0]] == [e.kind for e in raised_b[0]] == ["gpu_unhealthy"]
                await _until("the alert taken by both webhooks",
                             lambda: all(len(receiver.taken.get(p, [])) >= 1 for p in ("/slack", "/json")))
                await _until_events(bus, lambda evs: sum(isinstance(e, AlertDelivered) for e in evs) >= 2)
                await asyncio.sleep(0.5)
                assert {p: len(v) for p, v in receiver.posts.items()} == {"/slack": 1, "/json": 1}
                evs = await _alert_events(bus)
                assert len([e for e in evs if isinstance(e, AlertRaised)]) == 1  # one stored: its id is derived
                claimed = [e for e in evs if isinstance(e, AlertDeliveryClaimed)]
                assert sorted(e.webhook_id for e in claimed) == sorted(h.id for h in cfg.webhooks)
                assert {e.claimant for e in claimed} <= {a.me, b.me} and {e.round for e in claimed} == {1}
                assert len([e for e in evs if isinstance(e, AlertDelivered)]) == 2
        finally:
            await bus.close()
            receiver.close()

    asyncio.run(main())


async def _until_events(bus, fn, timeout: float = 30.0) -> list:
    for _ in range(int(timeout / 0.1)):
        evs = await _alert_events(bus)
        if fn(evs):
            return evs
        await asyncio.sleep(0.1)
    raise AssertionError("the alert events never came")


def test_a_stopped_instances_claim_is_taken_over_once_it_lapses(nats_server) -> None:
    from skypurza.events.envelope import derive_id

    receiver = Receiver(fail=0)
    cfg = AlertSettings(eval_s=0.1, webhooks=_two_hooks(receiver), attempts=3, backoff_s=0.05, timeout_s=2)

    async def main() -> None:
        bus = await connect_bus(nats_server)
        # Instance "gone" raised the alert and claimed its message for both webhooks, then stopped.
        await bus.publish(_provisioned("gpubox", idle_minutes=5))
        await bus.publish(_gpu("gpubox"))
        now = SYSTEM_CLOCK.now()
        key = "gpu_unhealthy:gpubox:0:None:xid:79"
        await bus.publish(AlertRaised(key=key, kind="gpu_unhealthy", subject="gpubox node 0", severity="critical",
                                      raised_at=now), id=derive_id(key, "alerts", "raised:1"))
        until = now + timedelta(seconds=2.5)
        for hook in cfg.webhooks:
            await bus.publish(AlertDeliveryClaimed(key=key, webhook_id=hook.id, claimant="gone", until=until, at=now),
                              id=derive_id(key, "alerts", f"claim:1:raised:{hook.id}:1"))
        svc = AlertsService(cfg)
        try:
            async with _serving(bus, svc):
                await asyncio.sleep(0.8)  # eight rounds while the claim holds: nothing is posted
                assert receiver.posts == {}
                await _until("the lapsed claim taken over",
                             lambda: all(receiver.taken.get(p) for p in ("/slack", "/json")))
                await asyncio.sleep(0.5)
                assert {p: len(v) for p, v in receiver.posts.items()} == {"/slack": 1, "/json": 1}
                evs = await _until_events(bus, lambda evs: sum(isinstance(e, AlertDelivered) for e in evs) >= 2)
                claimed = sorted((e.round, e.claimant) for e in evs if isinstance(e, AlertDeliveryClaimed))
                assert claimed == [(1, "gone"), (1, "gone"), (2, svc.me), (2, svc.me)]
                assert svc.book.claims == {}
        finally:
            await bus.close()
            receiver.close()

    asyncio.run(main())


def test_a_stopping_instance_gives_up_its_claims_and_the_next_posts_at_once(nats_server) -> None:
    receiver = Receiver(fail=1)  # the first post fails: the first instance is stopped while it backs off
    hooks = (Webhook(receiver.url + "/json", "json"),)
    slow = AlertSettings(eval_s=0.1, webhooks=hooks, attempts=5, backoff_s=60, timeout_s=2)
    quick = AlertSettings(eval_s=0.1, webhooks=hooks, attempts=3, backoff_s=0.05, timeout_s=2)

    async def main() -> None:
        bus = await connect_bus(nats_server)
        await bus.publish(_provisioned("gpubox", idle_minutes=5))
        await bus.publish(_gpu("gpubox"))
        first, second = AlertsService(slow), AlertsService(quick)
        try:
            async with _serving(bus, first):
                await _until("the first attempt made", lambda: receiver.posts.get("/json"))
            evs = await _alert_events(bus)
            claimed = [(e.round, e.claimant, e.until > e.at) for e in evs if isinstance(e, AlertDeliveryClaimed)]
            assert claimed == [(1, first.me, True), (2, first.me, False)]  # claimed, then given up, lapsed as made
            # The next instance posts it in its first rounds, not a lease (~2 min with these settings) later.
            async with _serving(bus, second):
                await _until("the message taken", lambda: receiver.taken.get("/json"), timeout=10)
                evs = await _until_events(bus, lambda evs: any(isinstance(e, AlertDelivered) for e in evs))
                assert [(e.round, e.claimant) for e in evs if isinstance(e, AlertDeliveryClaimed)][-1] == (3, second.me)
                assert len(receiver.taken["/json"]) == 1
        finally:
            await bus.close()
            receiver.close()

    asyncio.run(main())


def test_cli_history_folds_occurrences() -> None:
    t = ManualClock().now()
    evs = [AlertRaised(key="k", kind="orphan", subject="i-1", raised_at=t),
           AlertResolved(key="k", kind="orphan", subject="i-1", resolved_at=t + timedelta(seconds=5)),
           AlertRaised(key="k", kind="orphan", subject="i-1", occurrence=2, raised_at=t + timedelta(seconds=9))]
    rows = history(evs)
    assert [(r["occurrence"], r["state"]) for r in rows] == [(1, "resolved"), (2, "firing")]


# ---------------------------------------------------------------- the metrics the rules file reads


def test_the_metrics_the_prometheus_rules_read() -> None:
    clusters = [{"name": "idle", "status": "UP", "autostop_minutes": None, "launched_at": "2026-01-01T00:00:00+00:00"},
                {"name": "busy", "status": "UP", "autostop_minutes": None, "launched_at": "2025-01-01T00:00:00+00:00"},
                {"name": "auto", "status": "UP", "autostop_minutes": 5, "launched_at": "2024-01-01T00:00:00+00:00"}]
    jobs = [{"cluster": "busy", "status": "PENDING", "submitted_at": "2026-01-02T00:00:00+00:00"},
            {"cluster": "idle", "status": "SUCCEEDED", "submitted_at": "2026-01-01T00:00:00+00:00",
             "ended_at": "2026-01-03T00:00:00+00:00"}]
    managed = [{"status": "RECOVERING", "recoveries": 4}, {"status": "SUCCEEDED", "recoveries": 9}]
    out = {s.name: s.value for f in families(Snapshot(clusters=clusters, jobs=jobs, managed=managed), 10)
           for s in f.samples}
    from datetime import datetime

    assert out["skypurza_oldest_idle_cluster_without_autostop_timestamp_seconds"] == \
        datetime.fromisoformat("2026-01-03T00:00:00+00:00").timestamp()  # idle since its last job ended
    assert out["skypurza_oldest_pending_job_timestamp_seconds"] == \
        datetime.fromisoformat("2026-01-02T00:00:00+00:00").timestamp()
    assert out["skypurza_managed_job_recoveries_max"] == 4  # the finished one does not count


def test_the_dispatch_pending_gauge_counts_held_tasks_by_reason() -> None:
    from datetime import datetime, timezone

    from skypurza.events.cluster_events import DownRequested
    from skypurza.services.observability import logfold

    c, t = logfold.LogCounters(), datetime(2026, 12, 1, tzinfo=timezone.utc)
    for i, kind in enumerate(["quota", "quota", "budget", "quota"]):
        logfold.apply(c, i + 1, t, TaskHeld(task_id=f"t{i}", cluster=f"c{i}", submitted_seq=i, kind=kind, reason="r"))
    logfold.apply(c, 9, t, TaskHeld(task_id="t0", cluster="c0", submitted_seq=0, kind="user_limit", reason="r2"))
    logfold.apply(c, 10, t, TaskAdmitted(task_id="t1", cluster="c1", submitted_seq=1))
    logfold.apply(c, 11, t, DownRequested(cluster="c3"))

    def gauge() -> dict:
        return {s.labels["reason"]: s.value for f in families(Snapshot(log=c), 10) for s in f.samples
                if s.name == "skypurza_dispatch_pending_tasks"}
    assert gauge() == {"user_limit": 1, "budget": 1}  # t0 re-held for another reason, t1 admitted, c3 downed


PROMTOOL = shutil.which("promtool")


def test_prometheus_rules_file_is_shipped_and_passes_promtool(tmp_path: Path) -> None:
    assert PROMTOOL, "promtool is missing: apt-get install prometheus (README, .ci/run)"
    shipped = resources.files("skypurza.services.observability") / "rules" / "skypurza.rules.yml"
    text = shipped.read_text()
    check = subprocess.run([PROMTOOL, "check", "rules", str(shipped)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "SUCCESS: 9 rules found" in check.stdout, check.stdout + check.stderr
    # Every metric the rules read is one /metrics serves (a renamed metric fails here).
    import re

    served = {"skypurza_oldest_idle_cluster_without_autostop_timestamp_seconds",
              "skypurza_oldest_pending_job_timestamp_seconds", "skypurza_managed_job_recoveries_max",
              "skypurza_dead_letters", "skypurza_orphans_found_total", "skypurza_gpu_unhealthy_findings_total",
              "skypurza_metrics_source_up"}
    assert set(re.findall(r"skypurza_[a-z_]+", text)) == served
    (tmp_path / "skypurza.rules.yml").write_text(text)
    tests = Path(__file__).parent / "promtool" / "skypurza.rules.test.yml"
    shutil.copy(tests, tmp_path / tests.name)
    run = subprocess.run([PROMTOOL, "test", "rules", tests.name], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
    # The test file is not vacuous: a threshold moved makes it fail.
    (tmp_path / "skypurza.rules.yml").write_text(text.replace("> 14400", "> 99999"))
    bad = subprocess.run([PROMTOOL, "test", "rules", tests.name], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0
