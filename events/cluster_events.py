"""Events of the `cluster` aggregate (keyed by cluster name): lifecycle, health, usage.

Emitted by: the provisioner (ClusterProvisioned, ClusterStopped, ClusterStarted,
ClusterTerminated, OrphanFound, CleanupFailed, SlurmAllocationAccounted), the CLI (DownRequested, StopRequested, StartRequested,
AutostopSet), the agent (NodeReady, ClusterIdle), the recovery service (SpotPreempted, NodeLost),
the ledger's meter (UsageRecorded).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from .registry import Event, register
from .types import Candidate, Market, NodeInfo


class _ClusterEvent(Event):
    AGGREGATE = "cluster"
    AGGREGATE_KEY = "cluster"
    cluster: str


@register
class ClusterProvisioned(_ClusterEvent):
    EVENT_NAME = "cluster_provisioned"
    task_id: str
    placement_id: str
    candidate: Candidate
    nodes: list[NodeInfo]
    hourly_price_micros: int  # per node, the price metering will use (replay never re-prices)
    launched_at: datetime
    user: str = ""
    team: str | None = None
    project: str | None = None
    managed_job_id: int | None = None
    idle_minutes: int | None = None
    down_when_idle: bool = False
    down_after_job: bool = False
    # Slurm-style TRES vector per node: {"cpu": 8, "mem": 32768 (MiB), "node": 1, "gres/gpu": 1, "gres/gpu:a10g": 1}
    tres: dict[str, int] = {}


@register
class NodeReady(_ClusterEvent):
    EVENT_NAME = "node_ready"
    rank: int
    host: str = ""
    pid: int = 0
    agent_id: str = ""
    gpus: dict[str, int] = {}


@register
class DownRequested(_ClusterEvent):
    EVENT_NAME = "down_requested"
    reason: Literal["user", "autostop", "job_done", "managed_job_done", "recovery", "orphan"] = "user"
    requested_by: str = ""


@register
class StopRequested(_ClusterEvent):
    EVENT_NAME = "stop_requested"
    reason: Literal["user", "autostop"] = "user"


@register
class StartRequested(_ClusterEvent):
    EVENT_NAME = "start_requested"


@register
class ClusterStopped(_ClusterEvent):
    EVENT_NAME = "cluster_stopped"
    stopped_at: datetime


@register
class ClusterStarted(_ClusterEvent):
    EVENT_NAME = "cluster_started"
    started_at: datetime
    nodes: list[NodeInfo] = []


@register
class ClusterTerminated(_ClusterEvent):
    EVENT_NAME = "cluster_terminated"
    terminated_at: datetime
    reason: str = "user"
    instance_ids: list[str] = []


@register
class AutostopSet(_ClusterEvent):
    EVENT_NAME = "autostop_set"
    idle_minutes: int | None  # None cancels autostop
    down: bool = False
    # What resets the idle timer (SkyPilot's --wait-for): jobs_and_ssh and jobs (spz has no SSH
    # sessions to wait for) count jobs; none is a hard limit: idle_minutes after this event.
    wait_for: Literal["jobs_and_ssh", "jobs", "none"] = "jobs_and_ssh"


@register
class ClusterIdle(_ClusterEvent):
    """The head agent saw no job for the autostop interval; the provisioner stops or downs."""

    EVENT_NAME = "cluster_idle"
    idle_since: datetime
    idle_minutes: int
    down: bool = False


@register
class SpotPreempted(_ClusterEvent):
    EVENT_NAME = "spot_preempted"
    rank: int | None = None
    instance_id: str
    detected_at: datetime
    evidence: dict[str, Any] = {}


@register
class NodeLost(_ClusterEvent):
    EVENT_NAME = "node_lost"
    rank: int
    instance_id: str | None = None
    last_heartbeat: datetime | None = None
    detected_at: datetime
    evidence: dict[str, Any] = {}


@register
class OrphanFound(_ClusterEvent):
    """An instance with this stage's tags that no live cluster owns (cluster = its tag or '?')."""

    EVENT_NAME = "orphan_found"
    instance_id: str
    region: str
    action: Literal["reported", "terminated"] = "reported"
    detail: str = ""


@register
class CleanupFailed(_ClusterEvent):
    """A warning: a secondary resource (security group, key pair, placement group) could not be
    released after the nodes were gone. Never keeps a cluster alive: a teardown's warnings come
    just before its ClusterTerminated, which follows whatever happens. Retried in the background
    with back-off while `will_retry`. `cluster` is the cluster whose teardown found it, or '?' for
    the background sweep."""

    EVENT_NAME = "cleanup_failed"
    infra: str = "aws"
    region: str
    resource_type: str  # security-group | key-pair | placement-group | instances (the listing)
    resource: str  # its name; "*" when listing that kind of resource failed
    resource_id: str = ""
    code: str
    message: str = ""
    attempt: int = 1
    will_retry: bool = True  # False: given up (not implemented there, or the attempts are used up)
    failed_at: datetime


@register
class UsageRecorded(_ClusterEvent):
    """One metered interval [start, end) of one node. Sum over ticks == lifetime cost."""

    EVENT_NAME = "usage_recorded"
    rank: int
    instance_id: str
    start: datetime
    end: datetime
    instance_type: str | None = None
    infra: str = "aws"
    region: str | None = None
    zone: str | None = None
    market: Market = "on-demand"
    hourly_price_micros: int
    cost_micros: int
    tres: dict[str, int] = {}
    billing_seconds: int = 0  # billing units x seconds for this interval (Slurm's stored integer)
    # The untruncated billing of the node (Slurm's billable_tres double): fairshare's RawUsage
    # accrues billing x seconds (dispatch); 0 in intervals recorded before it was carried.
    billing: float = 0.0
    user: str = ""
    team: str | None = None
    project: str | None = None
    final: bool = False  # the interval ending at stop/termination
    correction: bool = False  # a negative interval: a stop that became known late
    # Id of the event that began this node's run (ClusterProvisioned or ClusterStarted): which
    # lifetime the interval belongs to, when a stop and a restart fall on the same instant.
    lifetime_id: str = ""


@register
class SlurmAllocationAccounted(_ClusterEvent):
    """What Slurm says one of our allocations used, read when it ended (the provisioner's sacct
    over SSH; `source="spz"`: the cluster keeps no accounting, so the TRES `scontrol show job`
    gave while it ran and our own start and end). The ledger bills it with the partition's
    TRESBillingWeights and PriorityFlags carried here, so a replay never asks Slurm again."""

    EVENT_NAME = "slurm_allocation_accounted"
    slurm_cluster: str = Field(max_length=256)
    slurm_job_id: int = Field(ge=1, le=2**32)
    partition: str = Field(default="", max_length=256)
    state: str = Field(default="", max_length=64)
    alloc_tres: dict[str, int] = Field(default={}, max_length=64)  # the whole allocation's, mem in MiB, no billing
    slurm_billing: int | None = Field(default=None, ge=0)  # AllocTRES billing= as Slurm stored it
    elapsed_s: int = Field(ge=0, le=10 * 366 * 86_400)
    start: datetime
    end: datetime
    billing_weights: str = Field(default="", max_length=4096)  # the partition's TRESBillingWeights
    priority_flags: str = Field(default="", max_length=1024)
    source: Literal["sacct", "spz"] = "sacct"
    instance_ids: list[str] = Field(default=[], max_length=10_000)
