"""ManagedJobStatusChanged v1 -> v2: the transition kind, once only the first word of `reason`,
is the typed field `kind`; stored v1 events are read as v2 through the registered upcaster.

Stored v1 events come from the golden log (tests/golden/events.jsonl, kept as it was written)
and from the recovery scenarios: every transition the state machine makes, written the way a v1
writer wrote it (same reason text, no `kind`, type `...v1`). They are decoded by the real decode
path, replayed from a real nats-server, and read by the real recovery service."""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from managed_fixtures import STAGE, Stand, recovery, statuses, until, wait_status
from nats_fixtures import connect_bus

from skypurza.events import naming
from skypurza.events.envelope import UPCASTERS, Envelope, PoisonEvent, decode, make_envelope, upcast
from skypurza.events.managed_events import (
    TRANSITION_KINDS,
    ManagedJobStatusChanged,
    ManagedJobSubmitted,
    managed_job_status_changed_v1_to_v2,
)
from skypurza.services.recovery import machine as m
from skypurza.services.recovery.submit import submit_managed_job

GOLDEN = Path(__file__).parent / "golden" / "events.jsonl"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
NAME = ManagedJobStatusChanged.EVENT_NAME
V1 = f"io.skypurza.{NAME}.v1"
V2 = f"io.skypurza.{NAME}.v2"
TASK = {"name": "eval", "run": "python eval.py", "resources": {"infra": "aws", "use_spot": True}}


def as_v1(ev: ManagedJobStatusChanged, *, id: str | None = None, source: str = "/tests/v1-writer") -> Envelope:
    """The envelope a v1 writer stored for this transition: the same fields but `kind`, type v1."""
    env = make_envelope(ev, source=source, id=id, time=T0)
    data = {k: v for k, v in env.data_dict().items() if k != "kind"}
    return env.model_copy(update={"type": V1, "data": data})


# ------------------------------------------------------------------ the machine's own transitions

def _submitted(tasks: list[dict] | None = None, name: str = "train", job_id: int = 7) -> tuple[ManagedJobSubmitted, m.JobState]:
    ev = ManagedJobSubmitted(managed_job_id=job_id, name=name, tasks=tasks or [{"name": name, "run": "x"}])
    s = m.apply(None, ev, seq=1, at=T0)
    assert s is not None
    return ev, s


def _run(facts_of: list, tasks: list[dict] | None = None, name: str = "train") -> tuple[ManagedJobSubmitted, list[ManagedJobStatusChanged]]:
    """Drive the machine through `facts_of` (facts, or functions of the state giving one); the
    ManagedJobStatusChanged events it writes, in order."""
    sub, s = _submitted(tasks, name)
    out = []
    for f in facts_of:
        fact = f(s) if callable(f) else f
        t = m.decide(s, fact)
        assert t is not None, f"{fact} changed nothing in {s.status}"
        ev = t.event(s.job_id)
        out.append(ev)
        s = m.apply(s, ev, seq=s.last_seq + 1, at=T0)
    return sub, out


RESTARTS = {"name": "t", "run": "x", "resources": {"job_recovery": {"max_restarts_on_errors": 1,
                                                                    "recover_on_exit_codes": [33]}}}
SCENARIOS = {
    "happy": ([m.Kick(), m.JobStartedF("train-7-1"), m.JobSucceededF("train-7-1")], None, "train"),
    "fallback then no place": ([m.Kick(), m.JobStartedF("train-7-1"),
                                m.LostF("train-7-1", "preempted", "node 0 (i-1): Server.SpotInstanceTermination"),
                                m.PlacementFailedF("train-7-2", "region blocked; attempts:\n1) a"),
                                m.PlacementFailedF("train-7-3", "every candidate was tried")], None, "train"),
    "node lost, provisioning fails": ([m.Kick(), m.JobStartedF("train-7-1"), m.TerminatedF("train-7-1", "user down"),
                                       m.ProvisionFailedF("train-7-2", "InsufficientInstanceCapacity: none")],
                                      None, "train"),
    "restarts": ([m.Kick(), m.JobStartedF("t-7-1"), m.JobFailedF("t-7-1", "run", 33), m.JobStartedF("t-7-2"),
                  m.JobFailedF("t-7-2", "run", 1), m.JobStartedF("t-7-3"), m.JobFailedF("t-7-3", "run", 1)],
                 [RESTARTS], "t"),
    "setup fails": ([m.Kick(), m.JobFailedF("train-7-1", "setup", 2)], None, "train"),
    "agent lost": ([m.Kick(), m.JobStartedF("train-7-1"), m.JobFailedF("train-7-1", "agent", None, "agent gone")],
                   None, "train"),
    "cancelled while running": ([m.Kick(), m.JobStartedF("train-7-1"), m.Cancel(), m.TerminatedF("train-7-1")],
                                None, "train"),
    "cancelled before launch": ([m.Cancel()], None, "train"),
    "cancelled, nothing up": ([m.Kick(), m.Cancel(), m.NothingToCancel("train-7-1")], None, "train"),
}


def _all_transitions() -> list[tuple[str, ManagedJobSubmitted, list[ManagedJobStatusChanged]]]:
    return [(name, *_run(facts, tasks, job)) for name, (facts, tasks, job) in SCENARIOS.items()]


def test_the_scenarios_write_every_kind_but_unclassified_and_the_reason_still_begins_with_it():
    kinds = set()
    for _, _, events in _all_transitions():
        for ev in events:
            kinds.add(ev.kind)
            assert ev.reason.split(":", 1)[0] == ev.kind, ev  # people read the same word in the reason
    assert kinds == TRANSITION_KINDS - {"unclassified"}


def test_every_v1_transition_of_the_scenarios_decodes_to_the_v2_event_it_was():
    for name, _, events in _all_transitions():
        for ev in events:
            raw = as_v1(ev).to_json()
            assert b'"kind"' not in raw and V1.encode() in raw
            got = decode(raw)
            assert got.status == "ok" and got.envelope is not None and got.envelope.type == V1, name
            assert isinstance(got.event, ManagedJobStatusChanged)
            assert got.event == ev, f"{name}: {ev.reason!r} read back as kind {got.event.kind!r}"


def test_a_v1_history_folds_to_the_same_state_as_the_v2_one():
    for name, sub, events in _all_transitions():
        v2 = v1 = m.apply(None, sub, seq=1, at=T0)
        for i, ev in enumerate(events, start=2):
            v2 = m.apply(v2, ev, seq=i, at=T0)
            v1 = m.apply(v1, decode(as_v1(ev).to_json()).event, seq=i, at=T0)
            assert v1 == v2, f"{name}: after {ev.reason!r}"
            assert m.wanted_launch(v1) == m.wanted_launch(v2) and m.clusters_to_tear_down(v1) == m.clusters_to_tear_down(v2)


# ------------------------------------------------------------------ the golden (historical) log

def _golden_v1_lines() -> list[bytes]:
    return [line for line in GOLDEN.read_bytes().splitlines() if f'"type":"{V1}"'.encode() in line]


def test_golden_log_v1_events_decode_to_v2_as_unclassified():
    lines = _golden_v1_lines()
    assert len(lines) == 7  # the golden log is history: it keeps its v1 events
    for line in lines:
        stored = json.loads(line)["data"]
        assert "kind" not in stored and stored["reason"] == ""
        got = decode(line)
        assert got.status == "ok" and isinstance(got.event, ManagedJobStatusChanged)
        # An empty v1 reason names no kind: `unclassified` (v1's state machine read "no tag").
        assert got.event.kind == "unclassified"
        assert got.event.model_dump(mode="json") == {**stored, "kind": "unclassified"}


def test_golden_log_job_folds_with_no_launch_asked_for():
    """The golden job's events (written by a test, not by recovery) fold as v1's machine folded
    them: the statuses and counters are taken, and no `unclassified` transition starts a launch."""
    sub = ManagedJobSubmitted(managed_job_id=1, name="mj", tasks=[{"run": "x"}])
    s = m.apply(None, sub, seq=1, at=T0)
    for i, line in enumerate(_golden_v1_lines(), start=2):
        s = m.apply(s, decode(line).event, seq=i, at=T0)
        assert s.why in (None, "unclassified") and s.episode == "" and m.wanted_launch(s) is None
    assert (s.status, s.recoveries, s.clusters) == ("CANCELLED", 1, ["mj-1"])  # the late RUNNING changed nothing


# ------------------------------------------------------------------ the upcaster itself

@pytest.mark.parametrize("reason,kind", [
    ("launch: task 0 of 1", "launch"),
    ("started: on train-1-1", "started"),
    ("preempted: train-1-1: node 0 (i-train-1-1): Server.SpotInstanceTermination", "preempted"),
    ("node_lost: train-1-1: node 0 (i-1): no heartbeat for 30 s", "node_lost"),
    ("restart: run exited with 1; restart 1 of 2", "restart"),
    ("exit_code: run exited with 33; a recover_on_exit_codes code", "exit_code"),
    ("fallback: the strategy's first choice has no place (x); trying the task's own constraints", "fallback"),
    ("no_resource: provisioning failed: InsufficientInstanceCapacity: none", "no_resource"),
    ("failed_setup: setup exited with 2", "failed_setup"),
    ("failed_controller: agent exited with None", "failed_controller"),
    ("cancelling", "cancelling"),  # a cancel with no cluster: the kind alone, no colon
    ("  succeeded : on c  ", "succeeded"),  # v1 stripped the word
    ("", "unclassified"),
    ("preempted", "preempted"),
    ("Preempted: x", "unclassified"),  # v1 read the word exactly, case included
    ("spot went away: preempted", "unclassified"),
    ("relaunch: x", "unclassified"),
])
def test_v1_reason_to_kind(reason, kind):
    data = {"managed_job_id": 3, "status": "RECOVERING", "task_index": 0, "cluster": "c", "recoveries": 1,
            "restarts_on_errors": 0, "reason": reason}
    assert managed_job_status_changed_v1_to_v2(data) == {**data, "kind": kind}
    env = Envelope(id="e1", source="/tests", type=V1, time=T0, subject="mjob/3", data=data)
    got = decode(env.to_json())
    assert got.event.kind == kind and got.event.reason == reason


def test_the_upcaster_is_registered_and_pure():
    assert UPCASTERS[(NAME, 1)] is managed_job_status_changed_v1_to_v2
    data = {"managed_job_id": 1, "status": "RECOVERING", "reason": "preempted: c-1-1: gone"}
    before = copy.deepcopy(data)
    first, second = managed_job_status_changed_v1_to_v2(data), managed_job_status_changed_v1_to_v2(data)
    assert first == second == {**data, "kind": "preempted"} and data == before  # its input untouched
    assert upcast(NAME, 1, data) == first
    # No I/O: run it under an audit hook that fails on any file, socket, process or import event.
    probe = (
        "import sys\n"
        "from skypurza.events.managed_events import managed_job_status_changed_v1_to_v2 as up\n"
        "seen = []\n"
        "on = [False]\n"
        "def hook(event, args):\n"
        "    if on[0] and event.split('.')[0] in ('open', 'socket', 'subprocess', 'os', 'import', 'shutil', 'time'):\n"
        "        seen.append(event)\n"
        "sys.addaudithook(hook)\n"
        "d = {'managed_job_id': 1, 'status': 'RUNNING', 'reason': 'started: on c'}\n"
        "on[0] = True\n"
        "out = [up(d) for _ in range(3)]\n"
        "on[0] = False\n"
        "assert out[0] == out[1] == out[2] == {**d, 'kind': 'started'}, out\n"
        "print('events:', seen)\n"
    )
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "events: []", res.stdout


def test_v2_round_trip_and_what_is_poison():
    ev = ManagedJobStatusChanged(managed_job_id=4, status="RECOVERING", kind="node_lost", cluster="a-4-2",
                                 recoveries=1, reason="node_lost: a-4-1: node 0 (i-1): no heartbeat")
    raw = make_envelope(ev, source="/tests", time=T0).to_json()
    assert V2.encode() in raw and json.loads(raw)["data"]["kind"] == "node_lost"
    got = decode(raw)
    assert got.status == "ok" and got.event == ev and got.envelope.type == V2
    # A v2 payload must carry its kind (every v2 writer sets it); a v1 payload that does not
    # validate is poison after upcasting as before; a newer version is held, not guessed at.
    no_kind = json.loads(raw)
    del no_kind["data"]["kind"]
    with pytest.raises(PoisonEvent, match="kind"):
        decode(json.dumps(no_kind).encode())
    bad_v1 = {**json.loads(as_v1(ev).to_json()), "data": {**as_v1(ev).data, "status": "LOST"}}
    with pytest.raises(PoisonEvent, match="status"):
        decode(json.dumps(bad_v1).encode())
    assert decode(raw.replace(V2.encode(), f"io.skypurza.{NAME}.v3".encode())).status == "newer"


# ------------------------------------------------------------------ on a real bus

def test_v1_envelopes_on_nats_replay_as_v2_and_fold_as_before(nats_server):
    async def main():
        bus = await connect_bus(nats_server)
        try:
            folded = []  # each scenario as a job of its own (one id for all would mix them)
            for n, (name, sub, events) in enumerate(_all_transitions(), start=1):
                sub = sub.model_copy(update={"managed_job_id": 100 + n})
                events = [e.model_copy(update={"managed_job_id": 100 + n}) for e in events]
                await bus.publish(sub)
                for i, ev in enumerate(events):
                    await bus.publish(as_v1(ev, id=f"v1-{n}-{i}"))
                folded.append((100 + n, sub, events))
            for job_id, sub, events in folded:
                subject = naming.aggregate_subjects(STAGE, "mjob", str(job_id))
                stored = [s async for s in bus.replay(filter_subject=subject)]
                assert [s.envelope.type for s in stored[1:]] == [V1] * len(events)
                assert [s.event for s in stored[1:]] == events  # read as v2, kinds included
                s = None
                for st in stored:
                    s = m.apply(s, st.event, seq=st.seq, at=st.timestamp)
                want = m.apply(None, sub, seq=stored[0].seq, at=stored[0].timestamp)
                for st, ev in zip(stored[1:], events):
                    want = m.apply(want, ev, seq=st.seq, at=st.timestamp)
                assert s == want
        finally:
            await bus.close()

    asyncio.run(main())


def test_recovery_service_sees_a_v1_recovering_through(nats_server, spz_home):
    """An older recovery service wrote RECOVERING (v1: the kind only in the reason) and stopped
    before its effects. The current service must read it as a preemption: tear the preempted
    cluster down, then launch the new one with the lost cluster's region blocked. Were the kind
    lost in upcasting (`unclassified`), it would launch nothing and the job would never end."""

    async def main():
        bus = await connect_bus(nats_server)
        stand = await Stand(bus, script={"eval-1-1": "hold"}).start()
        try:
            async with recovery(bus):
                await submit_managed_job(bus, name="eval", tasks=[TASK])
                await wait_status(bus, 1, "RUNNING")
            last = await bus.last_event(naming.aggregate_subjects(STAGE, "mjob", "1"))
            old = ManagedJobStatusChanged(managed_job_id=1, status="RECOVERING", kind="preempted", cluster="eval-1-2",
                                          recoveries=1, reason="preempted: eval-1-1: node 0 (i-eval-1-1): "
                                                               "Server.SpotInstanceTermination")
            await bus.publish(as_v1(old, source="/skypurza/test/recovery"), expected_last_seq=last.seq)
            async with recovery(bus):
                await until(lambda: len(stand.submitted) == 2, what="the relaunch after the v1 RECOVERING")
                got = await wait_status(bus, 1, "SUCCEEDED")
            assert "eval-1-1" in stand.downs and [t.cluster for t in stand.submitted] == ["eval-1-1", "eval-1-2"]
            relaunch = stand.submitted[1]
            assert [(b.scope, b.region) for b in relaunch.initial_blocks] == [("region", "us-east-1")]
            assert [(e.status, e.kind) for e in got] == [("STARTING", "launch"), ("RUNNING", "started"),
                                                        ("RECOVERING", "preempted"), ("RUNNING", "started"),
                                                        ("SUCCEEDED", "succeeded")]
            subject = naming.event_filter(STAGE, "mjob", NAME)
            types = [s.envelope.type async for s in bus.replay(filter_subject=subject)]
            assert types == [V2, V2, V1, V2, V2]
            assert [e.kind for e in await statuses(bus, 1)] == [e.kind for e in got]
        finally:
            await stand.stop()
            await bus.close()

    asyncio.run(main())
