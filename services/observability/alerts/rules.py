"""The built-in alert rules: a pure fold of the log into what the rules need (`AlertState`,
`apply`, `apply_dead_letter`) and a pure judgement of that state at a given `now` (`firing`).
No I/O and no clock of its own: the service feeds it stored events with their store times and
asks it at its own `now`, and the tests do the same with a ManualClock.

Conditions (each alert's key is what makes it once-only: one condition, one alert until resolved):
- cluster_idle: a cluster UP with no job pending or running, and no autostop, for `idle_s`;
- job_pending: a cluster job PENDING (JobQueued, not started) or a managed job PENDING for `pending_s`;
- managed_job_recoveries: a managed job, not finished, recovered more than `max_recoveries` times;
- dead_letters: a service parked an event in the last `dead_letter_window_s`;
- orphan: reconciliation reported a node no cluster accounts for, not yet terminated;
- gpu_unhealthy: a GpuUnhealthy finding on a cluster still alive (fatal: critical, else warning);
- budget: dispatch holds a task because its team's (or user's) budget is spent (TaskHeld of kind
  `budget`), until the task is admitted or ends; and a budget at its `alert_at` fraction
  (warning) or at 100% (critical), from dispatch's BudgetThresholdCrossed, until it is back to
  ok or its period ends.

Memory is bounded: each table keeps at most `MAX_TRACKED` entries (the oldest go first); only
what can still fire is kept (a finished job, a terminated cluster are forgotten).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from skypurza.events.dispatch_events import BudgetThresholdCrossed, TaskAdmitted, TaskHeld
from skypurza.events.cluster_events import (
    AutostopSet,
    ClusterProvisioned,
    ClusterStarted,
    ClusterStopped,
    ClusterTerminated,
    OrphanFound,
)
from skypurza.events.fold import cluster_after
from skypurza.events.health_events import GpuUnhealthy
from skypurza.events.job_events import JobCancelled, JobFailed, JobQueued, JobStarted, JobSucceeded
from skypurza.events.managed_events import TERMINAL_STATUSES as MANAGED_TERMINAL
from skypurza.events.managed_events import ManagedJobStatusChanged, ManagedJobSubmitted
from skypurza.events.task_events import PlacementFailed, ProvisionFailed

from .settings import AlertSettings

MAX_TRACKED = 100_000  # entries per table (clusters, pending jobs, managed jobs, findings...)
MAX_KEY = 200  # characters of a de-dup key (it is a subject token on the log)


@dataclass(frozen=True)
class Alert:
    key: str
    kind: str
    subject: str
    severity: str  # critical | warning | info
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClusterFacts:
    status: str | None = None
    autostop_minutes: int | None = None
    active: set[int] = field(default_factory=set)  # job ids pending or running
    idle_since: datetime | None = None  # when it last became UP with nothing to do
    user: str = ""


@dataclass
class ManagedFacts:
    name: str = ""
    status: str = "PENDING"
    recoveries: int = 0
    pending_since: datetime | None = None
    cluster: str | None = None


@dataclass
class DeadLetterFacts:
    total: int = 0
    last_at: datetime | None = None
    episode_start: datetime | None = None  # the first dead letter after a quiet window
    in_episode: int = 0


@dataclass
class AlertState:
    clusters: dict[str, ClusterFacts] = field(default_factory=dict)
    pending: dict[tuple[str, int], tuple[datetime, str]] = field(default_factory=dict)  # -> (queued at, name)
    managed: dict[int, ManagedFacts] = field(default_factory=dict)
    orphans: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (cluster, instance)
    gpu: dict[str, dict[str, Any]] = field(default_factory=dict)  # finding key -> what it said
    dead_letters: dict[str, DeadLetterFacts] = field(default_factory=dict)  # by parking service
    budget_holds: dict[str, dict[str, Any]] = field(default_factory=dict)  # task id -> the hold
    budget_levels: dict[str, dict[str, Any]] = field(default_factory=dict)  # budget id -> its crossing
    ended: dict[str, datetime] = field(default_factory=dict)  # clusters terminated (until provisioned again)


def _put(table: dict, key: Any, value: Any) -> None:
    table[key] = value
    while len(table) > MAX_TRACKED:
        table.pop(next(iter(table)))


def _cluster(state: AlertState, name: str) -> ClusterFacts:
    facts = state.clusters.get(name)
    if facts is None:
        facts = ClusterFacts()
        _put(state.clusters, name, facts)
    return facts


def _job_done(state: AlertState, cluster: str, job_id: int, at: datetime) -> None:
    state.pending.pop((cluster, job_id), None)
    facts = state.clusters.get(cluster)
    if facts is not None and job_id in facts.active:
        facts.active.discard(job_id)
        if not facts.active:
            facts.idle_since = at


def _forget_cluster(state: AlertState, name: str, at: datetime) -> None:
    state.clusters.pop(name, None)
    _put(state.ended, name, at)
    for k in [k for k in state.pending if k[0] == name]:
        del state.pending[k]
    for k in [k for k, f in state.gpu.items() if f["cluster"] == name]:
        del state.gpu[k]


def gpu_key(ev: GpuUnhealthy) -> str:
    code = ev.evidence.get("xid", "") if isinstance(ev.evidence, dict) else ""
    return f"gpu_unhealthy:{ev.cluster}:{ev.rank}:{ev.gpu_index}:{ev.rule}:{code}"


def apply(state: AlertState, at: datetime, event: object) -> None:
    """Fold one stored event (decoded; None or an unrelated type changes nothing) stored at `at`."""
    if isinstance(event, (ClusterProvisioned, ClusterStarted, ClusterStopped, ClusterTerminated)):
        if isinstance(event, ClusterTerminated):
            _forget_cluster(state, event.cluster, at)
            return
        facts = _cluster(state, event.cluster)
        facts.status = cluster_after(facts.status, event)
        if isinstance(event, ClusterProvisioned):
            state.ended.pop(event.cluster, None)
            facts.autostop_minutes = event.idle_minutes
            facts.user = event.user
            # New nodes: what was found on the old ones no longer holds.
            for k in [k for k, f in state.gpu.items() if f["cluster"] == event.cluster]:
                del state.gpu[k]
        if isinstance(event, (ClusterProvisioned, ClusterStarted)) and not facts.active:
            facts.idle_since = at
    elif isinstance(event, AutostopSet):
        _cluster(state, event.cluster).autostop_minutes = event.idle_minutes
    elif isinstance(event, JobQueued):
        _put(state.pending, (event.cluster, event.job_id), (at, event.name or ""))
        _cluster(state, event.cluster).active.add(event.job_id)
    elif isinstance(event, JobStarted):
        state.pending.pop((event.cluster, event.job_id), None)
        facts = _cluster(state, event.cluster)
        facts.active.add(event.job_id)
    elif isinstance(event, (JobSucceeded, JobFailed, JobCancelled)):
        _job_done(state, event.cluster, event.job_id, at)
    elif isinstance(event, ManagedJobSubmitted):
        _put(state.managed, event.managed_job_id, ManagedFacts(name=event.name, pending_since=at))
    elif isinstance(event, ManagedJobStatusChanged):
        if event.status in MANAGED_TERMINAL:
            state.managed.pop(event.managed_job_id, None)
            return
        m = state.managed.get(event.managed_job_id)
        if m is None:
            m = ManagedFacts()
            _put(state.managed, event.managed_job_id, m)
        if event.status == "PENDING" and m.status != "PENDING":
            m.pending_since = at
        m.status, m.recoveries, m.cluster = event.status, max(m.recoveries, event.recoveries), event.cluster
    elif isinstance(event, OrphanFound):
        key = (event.cluster, event.instance_id)
        if event.action == "terminated":
            state.orphans.pop(key, None)
        else:
            _put(state.orphans, key, {"region": event.region, "detail": event.detail, "found_at": at.isoformat()})
    elif isinstance(event, TaskHeld):
        if event.kind == "budget":
            _put(state.budget_holds, event.task_id, {"cluster": event.cluster, "queue": event.queue,
                                                     "reason": event.reason, "held_at": at.isoformat(),
                                                     "managed_job_id": event.managed_job_id})
        else:
            state.budget_holds.pop(event.task_id, None)
    elif isinstance(event, (TaskAdmitted, PlacementFailed, ProvisionFailed)):
        state.budget_holds.pop(event.task_id, None)
    elif isinstance(event, BudgetThresholdCrossed):
        if event.state == "ok":
            state.budget_levels.pop(event.budget_id, None)
        else:
            _put(state.budget_levels, event.budget_id, event.model_dump(mode="json"))
    elif isinstance(event, GpuUnhealthy):
        if event.cluster in state.ended:
            return  # a late sample's finding on a cluster already gone: nothing left to fix
        _put(state.gpu, gpu_key(event), {"cluster": event.cluster, "rank": event.rank, "gpu_index": event.gpu_index,
                                        "rule": event.rule, "severity": event.severity, "detail": event.detail,
                                        "evidence": dict(event.evidence), "detected_at": event.detected_at.isoformat()})


def apply_dead_letter(state: AlertState, service: str, at: datetime, window_s: float) -> None:
    """One event parked by `service` at `at` (the dead-letter stream's store time)."""
    facts = state.dead_letters.get(service)
    if facts is None:
        facts = DeadLetterFacts()
        _put(state.dead_letters, service, facts)
    if facts.last_at is None or (at - facts.last_at).total_seconds() >= window_s:
        facts.episode_start, facts.in_episode = at, 0
    facts.total += 1
    facts.in_episode += 1
    facts.last_at = at if facts.last_at is None else max(facts.last_at, at)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _bounded_key(key: str) -> str:
    return key[:MAX_KEY]


def firing(state: AlertState, now: datetime, cfg: AlertSettings) -> dict[str, Alert]:
    """Every alert whose condition holds at `now`, by key."""
    out: list[Alert] = []
    for name, c in state.clusters.items():
        if c.status != "UP" or c.active or c.autostop_minutes is not None or c.idle_since is None:
            continue
        idle = (now - c.idle_since).total_seconds()
        if idle >= cfg.idle_s:
            out.append(Alert(f"cluster_idle:{name}", "cluster_idle", name, "warning",
                             f"cluster {name} idle for {_hours(idle)} with no autostop (`spz autostop {name} -i N`)",
                             {"idle_since": c.idle_since.isoformat(), "idle_s": round(idle), "threshold_s": cfg.idle_s,
                              "user": c.user}))
    for (cluster, job_id), (queued_at, job_name) in state.pending.items():
        waited = (now - queued_at).total_seconds()
        if waited >= cfg.pending_s:
            out.append(Alert(f"job_pending:{cluster}:{job_id}", "job_pending", f"{cluster}/{job_id}", "warning",
                             f"job {job_id}{' (' + job_name + ')' if job_name else ''} on {cluster} pending for "
                             f"{_hours(waited)}", {"queued_at": queued_at.isoformat(), "pending_s": round(waited),
                                                   "threshold_s": cfg.pending_s}))
    for job_id, m in state.managed.items():
        if m.status == "PENDING" and m.pending_since is not None:
            waited = (now - m.pending_since).total_seconds()
            if waited >= cfg.pending_s:
                out.append(Alert(f"job_pending:managed:{job_id}", "job_pending", f"managed job {job_id}", "warning",
                                 f"managed job {job_id}{' (' + m.name + ')' if m.name else ''} pending for "
                                 f"{_hours(waited)}", {"pending_since": m.pending_since.isoformat(),
                                                       "pending_s": round(waited), "threshold_s": cfg.pending_s}))
        if m.recoveries > cfg.max_recoveries:
            out.append(Alert(f"managed_job_recoveries:{job_id}", "managed_job_recoveries", f"managed job {job_id}",
                             "warning", f"managed job {job_id}{' (' + m.name + ')' if m.name else ''} recovered "
                             f"{m.recoveries} times (more than {cfg.max_recoveries})",
                             {"recoveries": m.recoveries, "threshold": cfg.max_recoveries, "cluster": m.cluster}))
    for service, d in state.dead_letters.items():
        if d.last_at is not None and (now - d.last_at).total_seconds() < cfg.dead_letter_window_s:
            assert d.episode_start is not None
            out.append(Alert(f"dead_letters:{service}", "dead_letters", service, "critical",
                             f"{service} parked {d.in_episode} event(s) it could not apply (`spz events dlq`)",
                             {"since": d.episode_start.isoformat(), "last_at": d.last_at.isoformat(),
                              "count": d.in_episode, "total": d.total, "window_s": cfg.dead_letter_window_s}))
    for (cluster, instance), o in state.orphans.items():
        out.append(Alert(f"orphan:{cluster}:{instance}", "orphan", f"{instance} ({o['region']})", "critical",
                         f"node {instance} in {o['region']} is running for no live cluster ({cluster}): "
                         "it is being paid for", {"cluster": cluster, "instance_id": instance, **o}))
    for key, g in state.gpu.items():
        where = f"{g['cluster']} node {g['rank']}"
        out.append(Alert(key, "gpu_unhealthy", where, "critical" if g["severity"] == "fatal" else "warning",
                         f"{where}: {g['detail'] or g['rule']}", dict(g)))
    for bid, b in state.budget_levels.items():
        if now.astimezone(timezone.utc).strftime("%Y-%m-%d" if b["period"] == "day" else "%Y-%m") != b["period_key"]:
            continue  # a new day or month: the budget starts again from 0
        who = b["team"] + (f"/{b['user']}" if b["user"] else "")
        level = "spent" if b["state"] == "exceeded" else f"past its {b['alert_at']:.0%} alert level"
        out.append(Alert(f"budget_level:{bid}", "budget", who, "critical" if b["state"] == "exceeded" else "warning",
                         f"{who}: ${b['spent_usd']:,.2f} of ${b['limit_usd']:,.2f} {'daily' if b['period'] == 'day' else 'monthly'} budget {level} "
                         f"({b['fraction']:.0%})", dict(b)))
    for task_id, h in state.budget_holds.items():
        out.append(Alert(f"budget:{task_id}", "budget", h["cluster"], "warning",
                         f"launch of {h['cluster']} held by dispatch: {h['reason']}", {"task_id": task_id, **h}))
    return {_bounded_key(a.key): a for a in out}
