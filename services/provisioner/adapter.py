"""The backend interface of the provisioner: what every compute backend (AWS, local, later
Kubernetes and Slurm over SSH) offers, and the plain data it takes and gives.

A backend launches a *gang*: the N nodes of one cluster, all or nothing. It can describe,
stop, start and terminate a cluster, and list everything it holds for a stage so that the
provisioner can reconcile the cloud with the event log. Nothing here does I/O.

Failures are exceptions carrying a `Failure`: what kind of failure it is and how wide its
blast radius is (zone, region, the whole cloud, or just this request). The provisioner turns
capacity-class failures into CapacityError events and the optimizer blocks the `scope` and
picks the next placement; fatal ones stop the task with the actionable hint.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from skypurza.events.natscreds import BusCredentials


class FailureKind(enum.StrEnum):
    CAPACITY = "capacity"  # no capacity for this type in this zone right now
    SPOT_CAPACITY = "spot_capacity"  # no spot capacity, or the spot price is above our maximum
    QUOTA = "quota"  # account limit (vCPUs, instances, spot requests) in this region
    UNSUPPORTED = "unsupported"  # this configuration is not offered here (type, image, zone)
    AUTH = "auth"  # credentials or permissions: fatal until a human acts
    TRANSIENT = "transient"  # throttling, internal errors: retry the same thing later
    INVALID = "invalid"  # the request itself is wrong: fatal for this task
    UNKNOWN = "unknown"


class FailureScope(enum.StrEnum):
    """What the optimizer should stop trying after this failure."""

    ZONE = "zone"
    REGION = "region"
    CLOUD = "cloud"
    REQUEST = "request"  # nothing to block: retry (transient) or give up (invalid)


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    scope: FailureScope
    code: str  # the provider's own error code (e.g. InsufficientInstanceCapacity)
    message: str  # the provider's own message, unchanged
    hint: str = ""  # what a human should do (auth, quota, unsupported)

    @property
    def failover(self) -> bool:
        """True when another placement may succeed (the optimizer should try the next one)."""
        return self.kind in _FAILOVER_KINDS

    @property
    def fatal(self) -> bool:
        return self.kind in (FailureKind.AUTH, FailureKind.INVALID)

    @property
    def retryable(self) -> bool:
        return self.kind in (FailureKind.TRANSIENT, FailureKind.UNKNOWN)


_FAILOVER_KINDS = frozenset(
    {FailureKind.CAPACITY, FailureKind.SPOT_CAPACITY, FailureKind.QUOTA, FailureKind.UNSUPPORTED}
)


class ProvisionError(Exception):
    """A classified backend failure, with the placement it happened in."""

    def __init__(
        self,
        failure: Failure,
        *,
        infra: str = "",
        region: str | None = None,
        zone: str | None = None,
        instance_type: str | None = None,
        use_spot: bool | None = None,
    ) -> None:
        text = f"{failure.code}: {failure.message}"
        if failure.hint:
            text += f" ({failure.hint})"
        super().__init__(text)
        self.failure = failure
        self.infra = infra
        self.region = region
        self.zone = zone
        self.instance_type = instance_type
        self.use_spot = use_spot

    @property
    def kind(self) -> FailureKind:
        return self.failure.kind

    @property
    def scope(self) -> FailureScope:
        return self.failure.scope

    @property
    def code(self) -> str:
        return self.failure.code


class PartialListing(Exception):
    """`list_owned` answered for some regions and not for others: the nodes it found, and why
    each other region could not be listed. A caller that does not know it sees a failure, as
    before; reconciliation uses the nodes found and leaves the unlisted regions' clusters alone
    (not seen is not vanished)."""

    def __init__(self, nodes: Sequence["NodeInfo"], unreachable: Mapping[str, str]) -> None:
        super().__init__("; ".join(f"{region}: {why}" for region, why in sorted(unreachable.items())))
        self.nodes = list(nodes)
        self.unreachable = dict(unreachable)


class CapacityError(ProvisionError):
    """Capacity, spot capacity, quota or unsupported configuration: fail over elsewhere."""


class FatalProvisionError(ProvisionError):
    """Auth/permission or an invalid request: no other placement will help."""


class TransientProvisionError(ProvisionError):
    """Still failing after the retries: the same placement may work later."""


def provision_error(failure: Failure, **context: object) -> ProvisionError:
    """The exception class that matches the failure's kind."""
    if failure.failover:
        cls: type[ProvisionError] = CapacityError
    elif failure.fatal:
        cls = FatalProvisionError
    else:
        cls = TransientProvisionError
    return cls(failure, **context)  # type: ignore[arg-type]


class NodeState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    UNKNOWN = "unknown"


ALIVE_STATES = frozenset({NodeState.PENDING, NodeState.RUNNING, NodeState.STOPPING, NodeState.STOPPED})


@dataclass(frozen=True)
class LaunchSpec:
    """One launch attempt: a gang of `num_nodes` identical nodes in one placement.

    `launch_token` is derived from the PlacementChosen event id: the same token always means
    the same attempt, so a redelivered event or a restarted provisioner finds the nodes that
    were already launched instead of launching a second set.
    """

    stage: str
    cluster: str
    launch_token: str
    instance_type: str
    region: str
    zone: str | None = None  # zone name (us-east-1a) or zone id (use1-az4)
    num_nodes: int = 1
    use_spot: bool = False
    infra: str = "aws"
    task_id: str | None = None
    job_id: str | None = None
    image_id: str | Mapping[str, str] | None = None  # one id, or {region: id}
    disk_size_gb: int | None = None
    disk_tier: str | None = None  # low | medium | high | ultra | best
    network_tier: str | None = None  # standard | best
    placement_group: bool = False  # pack the gang close together (cluster placement group)
    # Bootstrap script: starts the node agent (in a deployment it holds the cluster's bus
    # password, so the spec's repr never shows it).
    user_data: str | None = field(default=None, repr=False)
    ports: tuple[str, ...] = ()  # "8080" or "8000-8010", opened to the world
    labels: Mapping[str, str] = field(default_factory=dict)  # extra tags
    user: str = ""  # the submission's spz user (Slurm's submit_as_user maps it to a Unix account)
    # The reservation dispatch admitted the task to (docs/dispatch.md, *Reservations*): an AWS
    # capacity reservation or capacity block id (cr-…), or a Slurm reservation's name.
    reservation_kind: str | None = None  # aws | aws_capacity_block | slurm
    reservation_id: str | None = None
    # A deployment's bus user of this cluster's agents (events/agentusers.py), for a backend that
    # hands the agent its environment itself (Kubernetes pods); EC2 gets it in `user_data`.
    bus_credentials: BusCredentials | None = None
    # The Slurm account the allocation is charged to (a team's workspace, teamcreds.py): sbatch
    # --account, over any the cluster's sbatch_options name. None: those options decide.
    slurm_account: str | None = None

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {self.num_nodes}")
        if not self.launch_token:
            raise ValueError("launch_token is required: it makes launches idempotent")


@dataclass(frozen=True)
class OptionsLaunchSpec(LaunchSpec):
    """A LaunchSpec with the task's own settings for its backend (`config.kubernetes`:
    pod_config, provision_timeout), for backends that take them."""

    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeInfo:
    instance_id: str  # instance id, pod name, slurm node name
    rank: int | None
    state: NodeState
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    use_spot: bool = False
    private_ip: str | None = None
    public_ip: str | None = None
    stage: str | None = None
    cluster: str | None = None
    job_id: str | None = None
    launch_token: str | None = None
    state_reason_code: str | None = None
    state_reason_message: str | None = None
    launched_at: datetime | None = None


@dataclass(frozen=True)
class OwnedObject:
    """A cluster's object that is not a node (a Kubernetes cluster's headless Service, its
    Secret), as listed for reconciliation: it bills nothing, but left behind it is an orphan."""

    kind: str  # "Service", "Secret"
    name: str
    region: str  # the Kubernetes context
    stage: str | None = None  # its stage label
    cluster: str | None = None  # its cluster label
    created_at: datetime | None = None


@dataclass(frozen=True)
class ObjectListing:
    """What `list_owned_objects` found, and why each region it could not list failed."""

    objects: list[OwnedObject] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class ObjectOwner(Protocol):
    """A backend whose clusters hold objects besides their nodes (Kubernetes). Reconciliation
    lists them beside the nodes and deletes the ones no cluster accounts for."""

    async def list_owned_objects(self, stage: str, regions: Sequence[str] | None = None) -> ObjectListing:
        """Every such object labelled with `stage`, in every region listed for nodes."""
        ...

    async def delete_objects(self, stage: str, objects: Sequence[OwnedObject]) -> list[str]:
        """Delete the given objects (orphans); only those labelled with `stage`, and only while
        their cluster still has no node. Returns the names deleted (gone already counts)."""
        ...


@dataclass(frozen=True)
class ClusterRef:
    """Enough to find a cluster's nodes again: its name, where it is, and the ids we know."""

    stage: str
    cluster: str
    region: str | None = None
    zone: str | None = None
    instance_ids: tuple[str, ...] = ()
    infra: str = "aws"


@dataclass(frozen=True)
class CleanupFailure:
    """A secondary resource (security group, key pair, placement group) that could not be
    released after the nodes were gone. It costs little or nothing, so it never keeps a cluster
    alive: it is reported (CleanupFailed) and retried in the background."""

    region: str | None
    resource_type: str  # security-group | key-pair | placement-group | instances (the listing)
    resource: str  # its name; "*" when listing that kind of resource failed
    resource_id: str  # the cloud's id (one creation of that name), "" when unknown
    failure: Failure

    @property
    def retryable(self) -> bool:
        """An operation the cloud does not offer, or a configuration it does not support, stays so."""
        return self.failure.kind is not FailureKind.UNSUPPORTED


@dataclass
class ReleaseReport:
    """What releasing unused per-stage resources did: deleted names, and each failure."""

    deleted: list[str] = field(default_factory=list)
    failures: list[CleanupFailure] = field(default_factory=list)


class CleanupIncomplete(ProvisionError):
    """The nodes are terminated, but some secondary resources could not be released."""

    def __init__(self, terminated: Sequence[str], failures: Sequence[CleanupFailure], **context: object) -> None:
        super().__init__(failures[0].failure, **context)  # type: ignore[arg-type]
        self.terminated = list(terminated)
        self.failures = list(failures)


@runtime_checkable
class ComputeBackend(Protocol):
    """What the provisioner needs from a backend. Every method is idempotent."""

    infra: str

    async def launch(self, spec: LaunchSpec) -> list[NodeInfo]:
        """Launch (or find, for a known launch token) the whole gang and wait until every node
        runs. Returns nodes ordered by rank. All or nothing: on failure no node stays up and a
        ProvisionError is raised."""
        ...

    async def describe(self, ref: ClusterRef) -> list[NodeInfo]:
        """The cluster's nodes that still exist, any state, ordered by rank."""
        ...

    async def stop(self, ref: ClusterRef) -> list[NodeInfo]:
        ...

    async def start(self, ref: ClusterRef) -> list[NodeInfo]:
        ...

    async def terminate(self, ref: ClusterRef, *, release: bool = True) -> list[str]:
        """Terminate every node of the cluster and wait until they are gone. Returns the node ids
        terminated. With `release`, then release the per-stage resources nobody uses any more
        (raising CleanupIncomplete, after the nodes are gone, when some could not be)."""
        ...

    async def release_unused(self, stage: str, regions: Iterable[str], *,
                             skip: Collection[str] = ()) -> ReleaseReport:
        """Release this stage's secondary resources in `regions` that no node uses any more.
        Never raises for one resource: each failure is in the report and the others are still
        tried. `skip`: resource ids (or names) not to try (given up). Backends with no such
        resources return an empty report."""
        ...

    async def list_owned(self, stage: str, regions: Sequence[str] | None = None) -> list[NodeInfo]:
        """Every node this stage holds (any state but terminated), for reconciliation."""
        ...

    async def terminate_nodes(self, stage: str, nodes: Sequence[NodeInfo]) -> list[str]:
        """Terminate the given nodes (orphans); only nodes tagged with `stage` are touched."""
        ...

    async def close(self) -> None:
        ...


def find_orphans(
    owned: Iterable[NodeInfo],
    live_clusters: Mapping[str, Collection[str]] | Collection[str],
) -> tuple[list[NodeInfo], dict[str, tuple[str, ...]]]:
    """Compare what the cloud holds with what the event log says is alive.

    `live_clusters` maps each live cluster to the node ids the log knows for it (empty while a
    launch is in flight: then any node tagged with that cluster is accepted). A plain
    collection of names means "ids unknown". Returns (orphans, vanished): orphans are owned
    nodes that no live cluster accounts for; vanished maps a live cluster to the node ids the
    log knows but the cloud no longer holds alive.
    """
    expected: dict[str, frozenset[str]] = (
        {c: frozenset(ids) for c, ids in live_clusters.items()}
        if isinstance(live_clusters, Mapping)
        else {c: frozenset() for c in live_clusters}
    )
    orphans: list[NodeInfo] = []
    present: set[str] = set()
    for node in owned:
        if node.state not in ALIVE_STATES:
            continue  # already going away: neither an orphan nor proof of life
        present.add(node.instance_id)
        ids = expected.get(node.cluster or "")
        if ids is None or (ids and node.instance_id not in ids):
            orphans.append(node)
    vanished = {
        cluster: tuple(sorted(ids - present)) for cluster, ids in expected.items() if ids - present
    }
    orphans.sort(key=lambda n: (n.region or "", n.cluster or "", n.instance_id))
    return orphans, vanished
