"""A cluster and its jobs as the event log tells them, read by the CLI itself.

The ledger's projections answer `spz status` and `spz queue`; the commands that act on a
cluster (launch on an existing cluster, exec, logs, cancel) read the cluster's own events
instead, so they decide on the log as it is this instant, even while the ledger catches up.
`fold()` is pure; `read_cluster()` replays one cluster's subject.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable

# `spz logs --status` / `spz launch` exit codes, as SkyPilot's JobExitCode.
EXIT_SUCCEEDED = 0
EXIT_FAILED = 100
EXIT_NOT_FINISHED = 101
EXIT_NOT_FOUND = 102
EXIT_CANCELLED = 103

TERMINAL_JOB = ("SUCCEEDED", "FAILED", "FAILED_SETUP", "FAILED_DRIVER", "CANCELLED")


def exit_code_of(status: str | None) -> int:
    if status is None:
        return EXIT_NOT_FOUND
    if status == "SUCCEEDED":
        return EXIT_SUCCEEDED
    if status == "CANCELLED":
        return EXIT_CANCELLED
    if status in TERMINAL_JOB:
        return EXIT_FAILED
    return EXIT_NOT_FINISHED


@dataclass
class Job:
    job_id: int
    task_id: str
    name: str | None
    user: str
    num_nodes: int
    run_setup: bool
    setup: str | None
    submitted_at: datetime
    status: str = "PENDING"  # PENDING, SETTING_UP, RUNNING, then one of TERMINAL_JOB
    started_at: datetime | None = None
    ended_at: datetime | None = None
    setup_done: set[int] = field(default_factory=set)
    run_done: set[int] = field(default_factory=set)
    exit_code: int | None = None
    failed_rank: int | None = None
    reason: str = ""
    cancel_requested: bool = False

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_JOB

    def as_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "name": self.name, "user": self.user, "status": self.status,
                "task_id": self.task_id, "num_nodes": self.num_nodes,
                "submitted_at": self.submitted_at.isoformat(),
                "started_at": self.started_at.isoformat() if self.started_at else None,
                "ended_at": self.ended_at.isoformat() if self.ended_at else None,
                "exit_code": self.exit_code, "failed_rank": self.failed_rank, "reason": self.reason or None}


@dataclass
class Cluster:
    name: str
    status: str | None = None  # None: never provisioned (or not yet); UP, STOPPED, TERMINATED
    num_nodes: int = 0
    infra: str | None = None
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    use_spot: bool = False
    accelerators: dict[str, float] | None = None
    hourly_price_micros: int = 0  # per node
    launched_at: datetime | None = None
    user: str = ""
    idle_minutes: int | None = None
    idle_down: bool = False
    task_id: str | None = None
    jobs: dict[int, Job] = field(default_factory=dict)
    ready_ranks: set[int] = field(default_factory=set)
    last_seq: int = 0

    @property
    def exists(self) -> bool:
        return self.status in ("UP", "STOPPED")

    def last_job(self) -> Job | None:
        return self.jobs[max(self.jobs)] if self.jobs else None

    def last_setup(self) -> Job | None:
        """The last job that ran setup: what the nodes were set up with (exec never runs setup)."""
        ran = [j for j in self.jobs.values() if j.run_setup]
        return max(ran, key=lambda j: j.job_id) if ran else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "status": self.status, "infra": self.infra, "region": self.region, "zone": self.zone,
            "instance_type": self.instance_type, "num_nodes": self.num_nodes, "use_spot": self.use_spot,
            "accelerators": self.accelerators,
            "hourly_price_micros": self.hourly_price_micros,  # per node, as the ledger has it
            "launched_at": self.launched_at.isoformat() if self.launched_at else None, "user": self.user,
            "autostop": self.idle_minutes, "autodown": self.idle_down, "market": "spot" if self.use_spot else "on-demand",
        }


def fold(name: str, events: Iterable[tuple[Any, datetime, int]]) -> Cluster:
    """Replay (event, envelope time, seq) of one cluster's subject, oldest first."""
    c = Cluster(name)
    for event, at, seq in events:
        c.last_seq = max(c.last_seq, seq)
        apply(c, event, at)
    return c


def apply(c: Cluster, event: Any, at: datetime) -> None:
    kind = getattr(event, "EVENT_NAME", "")
    if kind == "cluster_provisioned":
        cand = event.candidate
        if c.status == "TERMINATED":
            c.jobs = {}  # a new cluster under an old name: the old one's jobs are history
        c.status, c.num_nodes = "UP", len(event.nodes) or cand.num_nodes
        c.infra, c.region, c.zone = cand.infra, cand.region, cand.zone
        c.instance_type, c.use_spot, c.accelerators = cand.instance_type, cand.use_spot, cand.accelerators
        c.hourly_price_micros, c.launched_at, c.user = event.hourly_price_micros, event.launched_at, event.user
        c.idle_minutes, c.idle_down, c.task_id = event.idle_minutes, event.down_when_idle, event.task_id
        c.ready_ranks = set()
    elif kind == "node_ready":
        c.ready_ranks.add(event.rank)
    elif kind == "cluster_started":
        c.status = "UP"
    elif kind == "cluster_stopped":
        c.status = "STOPPED"
    elif kind == "cluster_terminated":
        c.status = "TERMINATED"
    elif kind == "autostop_set":
        c.idle_minutes, c.idle_down = event.idle_minutes, event.down
    elif kind == "job_queued":
        task = event.task or {}
        nodes = task.get("num_nodes") if isinstance(task.get("num_nodes"), int) else 1
        c.jobs[event.job_id] = Job(event.job_id, event.task_id, event.name or task.get("name"), event.user,
                                   nodes or 1, event.run_setup, task.get("setup"), at)
    else:
        job = c.jobs.get(getattr(event, "job_id", -1))
        if job is not None:
            _apply_job(job, kind, event, at)


def _apply_job(job: Job, kind: str, event: Any, at: datetime) -> None:
    if job.terminal:
        return
    if kind == "job_started":
        job.started_at = event.started_at
        job.status = "SETTING_UP" if job.run_setup and job.setup else "RUNNING"
    elif kind == "job_node_finished":
        (job.setup_done if event.phase == "setup" else job.run_done).add(event.rank)
        if job.status == "SETTING_UP" and event.phase == "setup" and len(job.setup_done) >= job.num_nodes:
            job.status = "RUNNING"
    elif kind == "cancel_requested":
        job.cancel_requested = True
    elif kind == "job_succeeded":
        job.status, job.ended_at, job.exit_code = "SUCCEEDED", event.ended_at, 0
    elif kind == "job_cancelled":
        job.status, job.ended_at = "CANCELLED", event.ended_at
    elif kind == "job_failed":
        job.status = {"setup": "FAILED_SETUP", "agent": "FAILED_DRIVER"}.get(event.phase, "FAILED")
        job.ended_at, job.exit_code, job.failed_rank, job.reason = (event.ended_at, event.exit_code,
                                                                    event.failed_rank, event.reason)


async def read_cluster(bus: Any, name: str) -> Cluster:
    from skypurza.events import naming

    items = []
    async for s in bus.replay(filter_subject=naming.aggregate_subjects(bus.stage, "cluster", name)):
        if s.event is not None and s.envelope is not None:
            if getattr(s.event, "EVENT_NAME", "") == "usage_recorded":
                continue
            items.append((s.event, s.envelope.time, s.seq))
    return fold(name, items)


async def cluster_names(bus: Any) -> list[str]:
    """Every cluster the log has provisioned (then `read_cluster` tells which still exist)."""
    from skypurza.events import naming

    names: list[str] = []
    subject = naming.event_filter(bus.stage, "cluster", "cluster_provisioned")
    async for s in bus.replay(filter_subject=subject):
        if s.event is not None and s.event.cluster not in names:
            names.append(s.event.cluster)
    return names
