"""Replay as a regression net: the golden log (and a few scripted histories) through every
decider, compared with committed decisions (Temporal's Replayer is the model).

The deciders are called as pure functions — no bus, no services — on events decoded from
tests/golden/events.jsonl by the real `events.envelope.decode` (its poison lines are skipped
and counted). One JSON document `{decider: {key: outputs}}` is built and compared with
tests/golden/decisions.json; a change in any decider's behaviour shows as a unified diff of that
JSON, which the change must take on purpose:

    SKYPURZA_REGEN_DECISIONS=1 pytest tests/test_replay_net.py     # rewrites decisions.json

then read the diff of decisions.json in review: it is the behaviour change.

- optimizer (services/optimizer/decide.py, the shipped catalog; aws only, except two cases
  given a fixed local machine):
  the first placement of every TaskSubmitted and the next placement after each of its
  CapacityErrors in the log; for tests/support/replay_history.py's cases, a failover chain in
  which each CapacityError names the candidate the optimizer just chose;
- provisioner (services/provisioner/plan.py): for every PlacementChosen with its TaskSubmitted
  (the golden log's and the optimizer cases' first choices): the matching request, the launch
  spec (user data rendered for aws, as the service does: its presence is recorded), the event
  each failure kind becomes, the ClusterProvisioned for a fixed set of nodes, job 1's fields;
- recovery (services/recovery/machine.py): the golden log's managed job folded event by event,
  with the decision each fact from its clusters' events would cause; and scripted episodes
  run closed-loop (each decision applied as the service would publish it), with the state,
  the wanted launch (and its recovery launch plan) and the clusters to tear down at each step;
- agent (services/agent/view.py + decide.py): every cluster of the golden log folded event by
  event, and what a fresh agent of each rank decides after each event, at the event's own time
  (and the head a day later, where that differs: autostop);
- ledger: tests/test_ledger_golden.py replays the same log into DuckDB (not repeated here).

No decider here reads the wall clock or the environment: every time is the log's or fixed.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import os
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from replay_history import OPTIMIZER_CASES, RECOVERY_CASES, T0

from skypurza.events.envelope import Envelope, Event, PoisonEvent, decode
from skypurza.events.managed_events import ManagedJobCancelRequested, ManagedJobStatusChanged, ManagedJobSubmitted
from skypurza.events.models import (
    CapacityError, ClusterTerminated, JobCancelled, JobFailed, JobStarted, JobSucceeded, NodeLost,
    PlacementChosen, PlacementFailed, ProvisionFailed, SpotPreempted, TaskSubmitted,
)
from skypurza.services.agent import decide as agent_decide
from skypurza.services.agent.agent import CONTRACT as AGENT_CONTRACT
from skypurza.services.agent.view import ClusterView
from skypurza.services.optimizer import decide as optimizer
from skypurza.services.optimizer.catalog import shipped_catalog
from skypurza.services.provisioner import plan, userdata
from skypurza.services.provisioner.adapter import Failure, FailureKind, FailureScope, NodeInfo, NodeState, ProvisionError
from skypurza.services.recovery import machine
from skypurza.services.recovery.strategy import LaunchPlan, recovery_launch

GOLDEN = Path(__file__).parent / "golden"
EVENTS = GOLDEN / "events.jsonl"
DECISIONS = GOLDEN / "decisions.json"
REGEN = "SKYPURZA_REGEN_DECISIONS"
STAGE = "golden"
NATS_URL = "nats://control-plane.golden:4222"
NODE_INSTALL = "skypurza"  # not the version: a release must not show as a changed decision


# ---------------------------------------------------------------- plain data


def plain(v: Any) -> Any:
    """A decider's output as deterministic JSON data (sets sorted, times as ISO text)."""
    if hasattr(v, "model_dump"):
        return plain(v.model_dump(mode="json"))
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {"type": type(v).__name__, **{f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}}
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (set, frozenset)):
        return sorted((plain(x) for x in v), key=lambda x: json.dumps(x, sort_keys=True))
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, datetime):
        return v.isoformat()
    return v


def golden_log() -> tuple[list[tuple[int, Envelope, Event]], list[str]]:
    """(seq, envelope, event) of every readable line, in order; and why the others were skipped."""
    out, skipped = [], []
    for seq, line in enumerate((x for x in EVENTS.read_bytes().splitlines() if x.strip()), 1):
        try:
            d = decode(line)
        except PoisonEvent as exc:
            skipped.append(f"{seq}: poison: {exc}")
            continue
        if d.event is None or d.envelope is None:
            skipped.append(f"{seq}: {d.status}: {d.reason}")
            continue
        out.append((seq, d.envelope, d.event))
    return out, skipped


# ---------------------------------------------------------------- optimizer


def placement_summary(ev: PlacementChosen | PlacementFailed) -> dict[str, Any]:
    if isinstance(ev, PlacementChosen):
        return {"chosen": ev.candidate.label(), "attempt": ev.attempt, "price_micros": ev.candidate.hourly_price_micros,
                "num_nodes": ev.num_nodes, "remaining": [c.label() for c in ev.remaining]}
    return {"failed": ev.reason, "attempts": len(ev.attempts)}


def capacity_error(pc: PlacementChosen, error_class: str, n: int) -> CapacityError:
    return CapacityError(task_id=pc.task_id, cluster=pc.cluster, placement_id=f"placement-{pc.task_id}-{pc.attempt}",
                         attempt=pc.attempt, candidate=pc.candidate, error_class=error_class,  # type: ignore[arg-type]
                         code=f"Scripted{n}", message=f"scripted {error_class}")


def optimizer_decisions(log: list[tuple[int, Envelope, Event]], world: optimizer.World
                        ) -> tuple[dict[str, Any], dict[str, tuple[TaskSubmitted, PlacementChosen]]]:
    """The decisions, and the scripted cases' first choices (for the provisioner's planning)."""
    out: dict[str, Any] = {}
    submitted = {ev.task_id: ev for _, _, ev in log if isinstance(ev, TaskSubmitted)}
    errors: dict[str, list[CapacityError]] = defaultdict(list)
    for _, _, ev in log:
        if isinstance(ev, CapacityError):
            errors[ev.task_id].append(ev)
    for task_id, sub in submitted.items():
        steps = [{"on": "TaskSubmitted", **placement_summary(optimizer.first_placement(sub, world))}]
        for i, err in enumerate(errors[task_id]):
            steps.append({"on": f"CapacityError {err.error_class} of attempt {err.attempt} ({err.candidate.label()})",
                          **placement_summary(optimizer.after_capacity_error(sub, errors[task_id][:i + 1], world))})
        out[f"golden:{task_id}"] = steps
    firsts: dict[str, tuple[TaskSubmitted, PlacementChosen]] = {}
    for name, case in OPTIMIZER_CASES.items():
        w = dataclasses.replace(world, enabled_infras=case.infras, local=case.local, max_attempts=case.max_attempts)
        sub = case.submitted
        decision = optimizer.first_placement(sub, w)
        steps = [{"on": "TaskSubmitted", **placement_summary(decision)}]
        if isinstance(decision, PlacementChosen):
            firsts[name] = (sub, decision)
        errs: list[CapacityError] = []
        for n, error_class in enumerate(case.errors, 1):
            if not isinstance(decision, PlacementChosen):
                break
            errs.append(capacity_error(decision, error_class, n))
            decision = optimizer.after_capacity_error(sub, errs, w)
            steps.append({"on": f"CapacityError {error_class} of attempt {errs[-1].attempt}",
                          **placement_summary(decision)})
        out[f"scripted:{name}"] = steps
    return out, firsts


# ---------------------------------------------------------------- provisioner planning

FAILURES = [
    (FailureKind.CAPACITY, "InsufficientInstanceCapacity", ""), (FailureKind.SPOT_CAPACITY, "SpotMaxPriceTooLow", ""),
    (FailureKind.QUOTA, "VcpuLimitExceeded", "ask for more"), (FailureKind.UNSUPPORTED, "Unsupported", ""),
    (FailureKind.TRANSIENT, "RequestLimitExceeded", ""), (FailureKind.AUTH, "UnauthorizedOperation", "fix the role"),
    (FailureKind.INVALID, "InvalidParameterValue", ""), (FailureKind.UNKNOWN, "Weird", ""),
]


def planning(pc: PlacementChosen, placement_id: str, seq: int, sub: TaskSubmitted, launched_at: datetime) -> dict[str, Any]:
    request = plan.matching_request(plan.requests_of(sub.task), pc.candidate)
    # As the provisioner's _launch_spec: user data that starts the agents on aws; elsewhere the
    # backend starts them and reads where from from a label.
    user_data, labels = None, {}
    if pc.candidate.infra == "aws":
        agent = plan.agent_spec(nats_url=NATS_URL, stage=STAGE, placement=pc, start_seq=seq)
        user_data = userdata.render(agent, install=NODE_INSTALL)
    else:
        labels[plan.START_SEQ] = str(seq)
    spec = plan.launch_spec(stage=STAGE, placement=pc, placement_id=placement_id, submitted=sub, request=request,
                            job_id=1, user_data=user_data, labels=labels)
    spec_out = plain(spec)
    spec_out["user_data"] = spec.user_data is not None
    n = spec.num_nodes
    zone = pc.candidate.zone or f"{pc.candidate.region}a"
    nodes = [NodeInfo(instance_id=f"i-{pc.task_id}-{r}", rank=r, state=NodeState.RUNNING, zone=zone,
                      private_ip=f"10.0.0.{r + 1}") for r in range(n)]
    failures = {}
    for kind, code, hint in FAILURES:
        ev = plan.failure_event(ProvisionError(Failure(kind, FailureScope.ZONE, code, "m", hint)), pc, placement_id)
        failures[kind.value] = {"event": type(ev).__name__, "error_class": ev.error_class, "message": ev.message}
    return {
        "request": plain(request),
        "launch_spec": spec_out,
        "agent_spec": plain(plan.agent_spec(nats_url=NATS_URL, stage=STAGE, placement=pc, start_seq=seq)),
        "failure_event": failures,
        "provision_failed": plain(plan.provision_failed(pc, placement_id, "TaskNotFound", "no TaskSubmitted")),
        "provisioned": plain(plan.provisioned_event(placement=pc, placement_id=placement_id, submitted=sub,
                                                    nodes=nodes, launched_at=launched_at)),
        "job_fields": plain(plan.job_fields(sub)),
    }


def provisioner_decisions(log: list[tuple[int, Envelope, Event]],
                          firsts: dict[str, tuple[TaskSubmitted, PlacementChosen]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    submitted = {ev.task_id: ev for _, _, ev in log if isinstance(ev, TaskSubmitted)}
    for seq, env, ev in log:
        if isinstance(ev, PlacementChosen) and ev.task_id in submitted:
            out[f"golden:{ev.task_id}#{ev.attempt}"] = planning(ev, env.id, seq, submitted[ev.task_id], env.time)
    for name, (sub, pc) in firsts.items():
        out[f"scripted:{name}"] = planning(pc, f"placement-{name}", 1, sub, T0)
    return out


# ---------------------------------------------------------------- recovery machine


def transition_out(t: machine.Transition | None) -> Any:
    return None if t is None else plain(t)


def effects(s: machine.JobState, placed: Any = None) -> dict[str, Any]:
    launch = machine.wanted_launch(s)
    out: dict[str, Any] = {"status": s.status, "why": s.why, "cluster": s.cluster, "clusters": list(s.clusters),
                           "recoveries": s.recoveries, "restarts_on_errors": s.restarts_on_errors,
                           "tear_down": machine.clusters_to_tear_down(s), "launch": plain(launch)}
    if launch is not None:
        out["launch_task_id"] = launch.task_id(s.job_id)
        lp = LaunchPlan(s.tasks[launch.task_index])
        if launch.episode in machine.LOSS_WHYS and launch.lost_cluster:
            lp = recovery_launch(lp.task, s.recovery.strategy, placed, launch.phase)
        resources = lp.task.resources
        out["launch_plan"] = {"resources": None if resources is None else resources.to_dict(),
                              "blocks": plain(lp.blocks), "note": lp.note}
    return out


def golden_fact(ev: Event) -> machine.Fact | None:
    """The fact a cluster event is to the machine (the details are the replay's own text)."""
    if isinstance(ev, JobStarted):
        return machine.JobStartedF(ev.cluster)
    if isinstance(ev, JobSucceeded):
        return machine.JobSucceededF(ev.cluster)
    if isinstance(ev, JobCancelled):
        return machine.JobCancelledF(ev.cluster)
    if isinstance(ev, JobFailed):
        return machine.JobFailedF(ev.cluster, ev.phase, ev.exit_code, ev.reason)
    if isinstance(ev, SpotPreempted):
        return machine.LostF(ev.cluster, "preempted", f"node {ev.rank} ({ev.instance_id})")
    if isinstance(ev, NodeLost):
        return machine.LostF(ev.cluster, "node_lost", f"node {ev.rank} ({ev.instance_id})")
    if isinstance(ev, ClusterTerminated):
        return machine.TerminatedF(ev.cluster, f"cluster terminated ({ev.reason})")
    if isinstance(ev, PlacementFailed):
        return machine.PlacementFailedF(ev.cluster, ev.reason)
    if isinstance(ev, ProvisionFailed):
        return machine.ProvisionFailedF(ev.cluster, f"{ev.code}: {ev.message}")
    return None


def recovery_golden(log: list[tuple[int, Envelope, Event]]) -> dict[str, Any]:
    """Each managed job of the log folded in log order; at each of its own events the state, and
    at each event of one of its clusters the decision that fact would cause (not applied: the
    log says what happened next)."""
    out: dict[str, Any] = {}
    states: dict[int, machine.JobState] = {}
    steps: dict[int, list[Any]] = defaultdict(list)
    for seq, env, ev in log:
        if isinstance(ev, (ManagedJobSubmitted, ManagedJobStatusChanged, ManagedJobCancelRequested)):
            job_id = ev.managed_job_id
            new = machine.apply(states.get(job_id), ev, seq, env.time)
            if new is None:
                continue
            states[job_id] = new
            step: dict[str, Any] = {"seq": seq, "event": type(ev).__name__, **effects(new)}
            if isinstance(ev, ManagedJobSubmitted):
                step["decides"] = transition_out(machine.decide(new, machine.Kick()))
            elif isinstance(ev, ManagedJobCancelRequested):
                step["decides"] = transition_out(machine.decide(new, machine.Cancel()))
            steps[job_id].append(step)
            continue
        fact = golden_fact(ev)
        cluster = getattr(ev, "cluster", None)
        for job_id, s in states.items():
            if fact is not None and cluster in s.clusters:
                steps[job_id].append({"seq": seq, "event": type(ev).__name__, "fact": plain(fact),
                                      "decides": transition_out(machine.decide(s, fact))})
    for job_id, s in sorted(states.items()):
        out[f"golden:mjob-{job_id}"] = {"steps": steps[job_id], "summary": plain(s.summary())}
    return out


def recovery_scripted() -> dict[str, Any]:
    """Each case closed-loop: a decision is applied as its ManagedJobStatusChanged, in order."""
    out: dict[str, Any] = {}
    for name, case in RECOVERY_CASES.items():
        seq, t = 1, T0
        s = machine.apply(None, case.submitted, seq, t)
        assert s is not None
        steps: list[Any] = []
        for what, fact_of in case.facts:
            fact = fact_of(s)
            if isinstance(fact, machine.Cancel):  # the service decides on Cancel once the request is in the log
                seq, t = seq + 1, t + timedelta(seconds=1)
                s = machine.apply(s, ManagedJobCancelRequested(managed_job_id=s.job_id, requested_by="carol"), seq, t)
                assert s is not None
            transition = machine.decide(s, fact)
            if transition is not None:
                seq, t = seq + 1, t + timedelta(seconds=1)
                s = machine.apply(s, transition.event(s.job_id), seq, t)
                assert s is not None
            steps.append({"fact": what, "as": plain(fact), "decides": transition_out(transition),
                          **effects(s, case.placed)})
        out[f"scripted:{name}"] = {"steps": steps, "summary": plain(s.summary())}
    return out


# ---------------------------------------------------------------- agent decisions


def actions_out(actions: list[agent_decide.Action]) -> list[Any]:
    return [plain(a) for a in actions]


def agent_decisions(log: list[tuple[int, Envelope, Event]]) -> dict[str, Any]:
    """Each cluster's events folded into a view; after each event the agent consumes, what a
    fresh agent of every rank (no process running, nothing done locally: one just started,
    reading the log) decides."""
    by_cluster: dict[str, list[tuple[int, Envelope, Event]]] = defaultdict(list)
    for seq, env, ev in log:
        if env.subject and env.subject.startswith("cluster/"):
            by_cluster[env.subject.split("/", 1)[1]].append((seq, env, ev))
    out: dict[str, Any] = {}
    for cluster, events in sorted(by_cluster.items()):
        view = ClusterView(cluster=cluster, num_nodes=1)
        steps = []
        for seq, env, ev in events:
            step: dict[str, Any] = {"seq": seq, "event": type(ev).__name__}
            try:
                view.apply_all_or_nothing(ev, env.id, env.time, seq)
            except Exception as exc:  # a view refusing an event is a decision too
                step["refused"] = f"{type(exc).__name__}: {exc}"
            if type(ev) not in AGENT_CONTRACT.consumes and "refused" not in step:
                continue  # folded as the agent folds its whole aggregate, but not a step of its own
            step["status"] = view.status
            step["summary"] = plain(view.summary())
            step["ranks"] = {str(r): actions_out(agent_decide.decide(view, r, agent_decide.LocalState(), env.time))
                             for r in range(view.num_nodes)}
            later = actions_out(agent_decide.decide(view, agent_decide.HEAD, agent_decide.LocalState(),
                                                    env.time + timedelta(days=1)))
            if later != step["ranks"]["0"]:
                step["head_a_day_later"] = later
            steps.append(step)
        if steps:
            out[f"golden:{cluster}"] = steps
    return out


# ---------------------------------------------------------------- the net


def build_decisions() -> dict[str, Any]:
    log, skipped = golden_log()
    world = optimizer.World(catalog=shipped_catalog(), enabled_infras=frozenset({"aws"}), local=None)
    opt, firsts = optimizer_decisions(log, world)
    doc = {
        "log": {"events": len(log), "skipped": skipped},
        "optimizer": opt,
        "provisioner": provisioner_decisions(log, firsts),
        "recovery": {**recovery_golden(log), **recovery_scripted()},
        "agent": agent_decisions(log),
        "ledger": "tests/test_ledger_golden.py (tests/golden/expected_tables.json)",
    }
    # Through JSON and back: what is compared is exactly what is committed.
    return json.loads(dump(doc))


def dump(doc: Any) -> str:
    return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def test_every_decider_decides_what_the_committed_decisions_say():
    got = build_decisions()
    if os.environ.get(REGEN):
        DECISIONS.write_text(dump(got))
    assert DECISIONS.exists(), f"no {DECISIONS}: run with {REGEN}=1 once, and commit it"
    expected = json.loads(DECISIONS.read_text())
    if got != expected:
        diff = "".join(difflib.unified_diff(dump(expected).splitlines(keepends=True), dump(got).splitlines(keepends=True),
                                            "tests/golden/decisions.json (committed)", "decided now", n=4))
        paths = changed_paths(expected, got)
        listed = "\n".join(f"  {p}" for p in paths[:40]) + (f"\n  ... {len(paths) - 40} more" if len(paths) > 40 else "")
        raise AssertionError(f"{len(paths)} decision(s) changed; if on purpose, rerun with {REGEN}=1 and commit "
                             f"tests/golden/decisions.json:\n{listed}\n\n{diff[:20000]}")


def changed_paths(old: Any, new: Any, path: str = "") -> list[str]:
    """Where two documents differ, as `decider/key/.../field: old -> new` lines."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [line for k in sorted(set(old) | set(new))
                for line in changed_paths(old.get(k, "<absent>"), new.get(k, "<absent>"), f"{path}/{k}")]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [line for i, (a, b) in enumerate(zip(old, new)) for line in changed_paths(a, b, f"{path}[{i}]")]
    if old == new:
        return []
    def short(v: Any) -> str:
        text = json.dumps(v, sort_keys=True)
        return text if len(text) <= 80 else text[:77] + "..."
    return [f"{path.lstrip('/')}: {short(old)} -> {short(new)}"]


def test_the_net_covers_every_decider_and_every_case():
    """The document is not vacuous: each decider has outputs for the log and the scripts."""
    doc = build_decisions()
    log, _ = golden_log()
    tasks = {ev.task_id for _, _, ev in log if isinstance(ev, TaskSubmitted)}
    assert {f"golden:{t}" for t in tasks} | {f"scripted:{n}" for n in OPTIMIZER_CASES} == set(doc["optimizer"])
    placements = sum(1 for _, _, ev in log if isinstance(ev, PlacementChosen))
    assert sum(k.startswith("golden:") for k in doc["provisioner"]) == placements
    assert {f"scripted:{n}" for n in RECOVERY_CASES} <= set(doc["recovery"])
    assert "golden:mjob-1" in doc["recovery"]
    assert {"golden:c1", "golden:mj-1", "golden:c5"} <= set(doc["agent"])
    # The script reaches the outcomes it is there for (a failover chain, a give-up, an end state).
    opt = doc["optimizer"]
    assert len(opt["scripted:spot-a10g"]) == 4 and all("chosen" in s for s in opt["scripted:spot-a10g"])
    assert "gave up after 3 attempts" in opt["scripted:pinned-type-gives-up"][-1]["failed"]
    assert "failed" in opt["scripted:infeasible"][0]
    ends = {n: doc["recovery"][f"scripted:{n}"]["summary"]["status"] for n in RECOVERY_CASES}
    assert ends["spot-preempted-fallback-succeeds"] == "SUCCEEDED"
    assert ends["failover-strategy-then-no-resource"] == "FAILED_NO_RESOURCE"
    assert ends["restarts-and-exit-codes"] == "FAILED"
    assert ends["pipeline-setup-fails-on-task-1"] == "FAILED_SETUP"
    assert ends["agent-lost-and-strategy-none"] == "FAILED"
    assert ends["driver-lost"] == "FAILED_CONTROLLER"
    assert ends["provision-failed"] == "FAILED_NO_RESOURCE"
    assert ends["cancel-while-running"] == ends["cancel-before-up"] == ends["cancel-pending"] == "CANCELLED"


def test_building_the_decisions_twice_gives_the_same_document():
    """Deterministic: no clock, no random, no order of a set or of a cache hit leaks in."""
    from skypurza.services.optimizer import placement

    first = dump(build_decisions())
    for cache in (getattr(optimizer, "_PLAN_CACHE", None), getattr(placement, "_INDEXES", None)):
        if cache is not None:
            cache.clear()  # a cold cache decides what a warm one does
    assert dump(build_decisions()) == first
