"""What only the live log tells: a pure fold of events into counters and one histogram.

The projections answer "what is" (clusters, jobs, cost); the log answers "how often": placement
attempts, failovers by error class, preemptions, provisioning latency (the TaskSubmitted's store
time to its ClusterProvisioned's), GPU-hours metered (UsageRecorded x the node's GPUs). The fold
starts at the first event each time the service starts, so its counters are the log's, never a
second source of truth kept somewhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from skypurza.events.dispatch_events import TaskAdmitted, TaskHeld
from skypurza.events.models import (
    CapacityError,
    ClusterProvisioned,
    ClusterTerminated,
    DownRequested,
    GpuUnhealthy,
    OrphanFound,
    PlacementChosen,
    PlacementFailed,
    SpotPreempted,
    TaskSubmitted,
    UsageRecorded,
)

# Seconds: a local launch takes about one, a cloud one minutes, a capacity hunt hours.
PROVISION_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
MAX_PENDING_TASKS = 100_000  # submissions still waiting for a cluster (oldest forgotten first)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket (not cumulative), +Inf last
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        value = max(0.0, value)
        for i, upper in enumerate(self.buckets):
            if value <= upper:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        out, run = [], 0
        for upper, n in zip([*map(_le, self.buckets), "+Inf"], self.counts):
            run += n
            out.append((upper, run))
        return out


def _le(x: float) -> str:
    return f"{float(x):g}" if x != int(x) else f"{float(x):.1f}"


def histogram_of(values: list[float], buckets: tuple[float, ...]) -> Histogram:
    h = Histogram(buckets)
    for v in values:
        h.observe(v)
    return h


@dataclass
class LogCounters:
    events: int = 0
    last_seq: int = 0
    placements: dict[str, int] = field(default_factory=dict)  # "first" | "failover"
    failovers: dict[str, int] = field(default_factory=dict)  # by CapacityError.error_class (closed set)
    placement_failures: int = 0
    preemptions: int = 0
    gpu_seconds: dict[str, float] = field(default_factory=dict)  # by team
    provisioning: Histogram = field(default_factory=lambda: Histogram(PROVISION_BUCKETS))
    submitted_at: dict[str, datetime] = field(default_factory=dict)  # task id -> TaskSubmitted store time
    # For the Prometheus alerting rules (services/observability/rules/): closed label sets.
    gpu_findings: dict[tuple[str, str], int] = field(default_factory=dict)  # (severity, rule)
    orphans: dict[str, int] = field(default_factory=dict)  # OrphanFound by action: reported | terminated
    # Tasks dispatch holds now: task id -> (HoldKind, cluster); the gauge counts them by kind (a
    # closed set), as dispatch forgets them (admitted, failed, their cluster gone).
    held: dict[str, tuple[str, str]] = field(default_factory=dict)


UNASSIGNED = "(none)"


def apply(c: LogCounters, seq: int, time: datetime, event: object) -> None:
    """Fold one stored event (its sequence, store time and decoded event; None when undecodable)."""
    c.events += 1
    c.last_seq = max(c.last_seq, seq)
    if isinstance(event, TaskSubmitted):
        if len(c.submitted_at) >= MAX_PENDING_TASKS:
            c.submitted_at.pop(next(iter(c.submitted_at)))
        c.submitted_at.setdefault(event.task_id, time)
    elif isinstance(event, PlacementChosen):
        kind = "first" if event.attempt <= 1 else "failover"
        c.placements[kind] = c.placements.get(kind, 0) + 1
    elif isinstance(event, CapacityError):
        c.failovers[event.error_class] = c.failovers.get(event.error_class, 0) + 1
    elif isinstance(event, TaskHeld):
        c.held.pop(event.task_id, None)
        if len(c.held) >= MAX_PENDING_TASKS:
            c.held.pop(next(iter(c.held)))
        c.held[event.task_id] = (event.kind, event.cluster)
    elif isinstance(event, TaskAdmitted):
        c.held.pop(event.task_id, None)
    elif isinstance(event, (DownRequested, ClusterTerminated)):
        for task in [t for t, (_, cluster) in c.held.items() if cluster == event.cluster]:
            del c.held[task]
    elif isinstance(event, PlacementFailed):
        c.held.pop(event.task_id, None)
        c.placement_failures += 1
    elif isinstance(event, SpotPreempted):
        c.preemptions += 1
    elif isinstance(event, ClusterProvisioned):
        began = c.submitted_at.pop(event.task_id, None)
        if began is not None:  # a cluster provisioned for a task submitted before the log began: not timed
            c.provisioning.observe((time - began).total_seconds())
    elif isinstance(event, GpuUnhealthy):
        k = (event.severity, event.rule)
        c.gpu_findings[k] = c.gpu_findings.get(k, 0) + 1
    elif isinstance(event, OrphanFound):
        c.orphans[event.action] = c.orphans.get(event.action, 0) + 1
    elif isinstance(event, UsageRecorded):
        gpus = int(event.tres.get("gres/gpu", 0) or 0)
        if gpus > 0:
            seconds = (event.end - event.start).total_seconds() * gpus  # a correction is negative: it subtracts
            team = event.team or UNASSIGNED
            c.gpu_seconds[team] = c.gpu_seconds.get(team, 0.0) + seconds
