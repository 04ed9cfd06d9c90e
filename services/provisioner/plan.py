"""The provisioner's decisions as pure functions: what to launch for a placement, how a failure
is reported, what the provisioned cluster looks like. No bus, no cloud, no clock."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from skypurza.events.agentspec import AgentSpec
from skypurza.events.models import CapacityError, ClusterProvisioned, PlacementChosen, ProvisionFailed, TaskSubmitted
from skypurza.events.payloads import TaskPayload
from skypurza.events.taskspec.request import ResourceRequest
from skypurza.events.team_credentials import TeamCredentials
from skypurza.events.types import Candidate
from skypurza.events.types import NodeInfo as EventNode

from .adapter import FailureKind, LaunchSpec, NodeInfo, OptionsLaunchSpec, ProvisionError

# Failure kind -> the CapacityError class the optimizer blocks by. Kinds not here are not
# capacity-class: they end the task with ProvisionFailed.
CAPACITY_CLASSES: dict[FailureKind, str] = {
    FailureKind.CAPACITY: "capacity",
    FailureKind.SPOT_CAPACITY: "spot_capacity",
    FailureKind.QUOTA: "quota",
    FailureKind.UNSUPPORTED: "unsupported",
    FailureKind.TRANSIENT: "transient",  # only once the provisioner's own retries ran out
}
FATAL_CLASSES: dict[FailureKind, str] = {
    FailureKind.AUTH: "auth",
    FailureKind.INVALID: "other",
    FailureKind.UNKNOWN: "other",
}
START_SEQ = "start_seq"  # AgentSpec.extra key: where an agent starts reading its cluster's events


def failure_event(err: ProvisionError, placement: PlacementChosen, placement_id: str) -> CapacityError | ProvisionFailed:
    """CapacityError for what another placement may fix, ProvisionFailed for the rest."""
    message = err.failure.message + (f" ({err.failure.hint})" if err.failure.hint else "")
    capacity = CAPACITY_CLASSES.get(err.kind)
    if capacity is not None:
        return CapacityError(
            task_id=placement.task_id, cluster=placement.cluster, placement_id=placement_id,
            attempt=placement.attempt, candidate=placement.candidate, error_class=capacity,  # type: ignore[arg-type]
            code=err.code, message=message,
        )
    return ProvisionFailed(
        task_id=placement.task_id, cluster=placement.cluster, placement_id=placement_id,
        candidate=placement.candidate, error_class=FATAL_CLASSES.get(err.kind, "other"),  # type: ignore[arg-type]
        code=err.code, message=message,
    )


def provision_failed(placement: PlacementChosen, placement_id: str, code: str, message: str,
                     error_class: str = "other") -> ProvisionFailed:
    return ProvisionFailed(task_id=placement.task_id, cluster=placement.cluster, placement_id=placement_id,
                           candidate=placement.candidate, error_class=error_class,  # type: ignore[arg-type]
                           code=code, message=message)


def matching_request(requests: Sequence[ResourceRequest], candidate: Candidate) -> ResourceRequest | None:
    """The task's resource alternative the optimizer chose `candidate` from (best match first):
    it carries what the candidate does not (ports, labels, disk and network tier, image map)."""
    def score(r: ResourceRequest) -> int | None:
        if r.cloud not in (None, candidate.infra) or r.use_spot != candidate.use_spot:
            return None
        if r.region not in (None, candidate.region):
            return None
        if r.instance_type not in (None, candidate.instance_type):
            return None
        points = 0
        if r.instance_type == candidate.instance_type:
            points += 4
        if r.accelerator and candidate.accelerators and r.accelerator in candidate.accelerators:
            points += 2
        if r.region == candidate.region and r.region is not None:
            points += 1
        return points

    scored = [(s, -i, r) for i, r in enumerate(requests) if (s := score(r)) is not None]
    if not scored:
        return requests[0] if requests else None
    return max(scored, key=lambda t: (t[0], t[1]))[2]


def requests_of(task: TaskPayload) -> list[ResourceRequest]:
    """The task's resource alternatives; none when the stored task cannot be read back."""
    try:
        from skypurza.events.taskspec.task import Task

        return Task.from_public_dict(task.to_dict()).resource_requests()
    except Exception:
        return []


def launch_spec(
    *,
    stage: str,
    placement: PlacementChosen,
    placement_id: str,
    submitted: TaskSubmitted | None,
    request: ResourceRequest | None,
    job_id: int | None,
    user_data: str | None = None,
    labels: dict[str, str] | None = None,
) -> LaunchSpec:
    c = placement.candidate
    num_nodes = placement.num_nodes or c.num_nodes or 1
    image: Any = c.image_id or (request.image_id if request else None)
    network_tier = request.network_tier if request else None
    return LaunchSpec(
        stage=stage,
        cluster=placement.cluster,
        launch_token=placement_id,
        instance_type=c.instance_type or c.infra,
        region=c.region or c.infra,
        zone=c.zone,
        num_nodes=num_nodes,
        use_spot=c.use_spot,
        infra=c.infra,
        task_id=placement.task_id,
        job_id=str(job_id) if job_id is not None else None,
        image_id=image,
        disk_size_gb=c.disk_size_gb or (request.disk_size_gb if request else None),
        disk_tier=request.disk_tier if request else None,
        network_tier=network_tier,
        # A multi-node gang that asks for the best network is packed close together.
        placement_group=num_nodes > 1 and network_tier == "best",
        user_data=user_data,
        ports=tuple(str(p) for p in (request.ports if request else ())),
        labels={**(request.labels if request else {}), **(labels or {})},
        user=submitted.user if submitted is not None else "",
        reservation_kind=c.reservation.kind if c.reservation is not None else None,
        reservation_id=c.reservation.id if c.reservation is not None else None,
    )


# The task's `config.<section>` keys a backend takes, per infra (SkyPilot's overridable ones).
BACKEND_OPTION_KEYS: dict[str, tuple[str, tuple[str, ...]]] = {
    "kubernetes": ("kubernetes", ("pod_config", "provision_timeout")),
}


def with_team_credentials(spec: LaunchSpec, creds: TeamCredentials) -> LaunchSpec:
    """The spec with what the team's workspace says for its backend that the backend instance
    does not already carry (pure): a Slurm account (an AWS profile, a namespace: backends.py)."""
    if spec.infra == "slurm" and creds.slurm is not None:
        return dataclasses.replace(spec, slurm_account=creds.slurm.account)
    return spec


def with_backend_options(spec: LaunchSpec, submitted: TaskSubmitted | None) -> LaunchSpec:
    """The spec with the task's own settings for its backend, when it has some (pure)."""
    section = BACKEND_OPTION_KEYS.get(spec.infra)
    if section is None or submitted is None:
        return spec
    config = submitted.task.to_dict().get("config")
    given = config.get(section[0]) if isinstance(config, dict) else None
    options = {k: given[k] for k in section[1] if isinstance(given, dict) and given.get(k) is not None}
    if not options:
        return spec
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(LaunchSpec)}
    return OptionsLaunchSpec(**fields, options=options)


def agent_spec(*, nats_url: str, stage: str, placement: PlacementChosen, start_seq: int) -> AgentSpec:
    """The gang's agent spec as user-data renders it (per-node values are filled in at boot)."""
    c = placement.candidate
    return AgentSpec(
        nats_url=nats_url, stage=stage, cluster=placement.cluster, rank=0,
        num_nodes=placement.num_nodes or c.num_nodes or 1, infra=c.infra, region=c.region, zone=c.zone,
        extra={START_SEQ: str(start_seq)},
    )


def tres_of(candidate: Candidate) -> dict[str, int]:
    """Slurm-style trackable resources of one node (memory in MiB), for billing."""
    tres: dict[str, int] = {"node": 1}
    if candidate.vcpus:
        tres["cpu"] = int(math.ceil(candidate.vcpus))
    if candidate.memory_gib:
        tres["mem"] = int(round(candidate.memory_gib * 1024))
    gpus = 0
    for name, count in (candidate.accelerators or {}).items():
        n = int(math.ceil(count))
        if n > 0:
            tres[f"gres/gpu:{name.lower()}"] = n
            gpus += n
    if gpus:
        tres["gres/gpu"] = gpus
    return tres


def event_nodes(nodes: Sequence[NodeInfo]) -> list[EventNode]:
    return [
        EventNode(rank=n.rank if n.rank is not None else i, instance_id=n.instance_id, private_ip=n.private_ip,
                  public_ip=n.public_ip, zone=n.zone)
        for i, n in enumerate(nodes)
    ]


def provisioned_event(
    *,
    placement: PlacementChosen,
    placement_id: str,
    submitted: TaskSubmitted | None,
    nodes: Sequence[NodeInfo],
    launched_at: datetime,
) -> ClusterProvisioned:
    c = placement.candidate
    zones = {n.zone for n in nodes if n.zone}
    # The zone AWS chose when the placement left it open, so metering and recovery know it.
    candidate = c.model_copy(update={"zone": zones.pop()}) if c.zone is None and len(zones) == 1 else c
    down = bool(submitted and submitted.down)
    return ClusterProvisioned(
        cluster=placement.cluster,
        task_id=placement.task_id,
        placement_id=placement_id,
        candidate=candidate,
        nodes=event_nodes(nodes),
        hourly_price_micros=c.hourly_price_micros,
        launched_at=launched_at,
        user=submitted.user if submitted else "",
        team=submitted.team if submitted else None,
        project=submitted.project if submitted else None,
        managed_job_id=submitted.managed_job_id if submitted else None,
        idle_minutes=submitted.idle_minutes if submitted else None,
        down_when_idle=down,
        down_after_job=down,
        tres=tres_of(c),
    )


def job_fields(submitted: TaskSubmitted) -> dict[str, Any]:
    """JobQueued fields of the task's first job on its new cluster."""
    return dict(
        task_id=submitted.task_id,
        task=submitted.task,
        name=submitted.task.name,
        user=submitted.user,
        run_setup=True,
        secrets_key=submitted.secrets_key,
        skypilot_task_id=submitted.skypilot_task_id or "",
        managed_job_id=submitted.managed_job_id,
        managed_task_ids=list(submitted.managed_task_ids),
        job_rank=submitted.job_rank, num_jobs=submitted.num_jobs, job_group=submitted.job_group,
        root_job_id=submitted.root_job_id,
        down_after=submitted.down,
    )
