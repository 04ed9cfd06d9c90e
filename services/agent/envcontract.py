"""The environment a job's scripts see: SkyPilot 0.14.1's `SKYPILOT_*` contract, plus `SKYPURZA_*`.

Pure functions only (the values are tested directly). Facts from
../shared/reference/skypilot-contract.md §2:
- run: SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS (newline-separated, head first),
  SKYPILOT_NUM_NODES, SKYPILOT_NUM_GPUS_PER_NODE, SKYPILOT_TASK_ID, SKYPILOT_CLUSTER_INFO,
  SKYPILOT_USER, SKYPILOT_INTERNAL_JOB_ID, and for managed jobs SKYPILOT_MANAGED_JOB_ID,
  SKYPILOT_TASK_IDS, SKYPILOT_JOB_RANK, SKYPILOT_NUM_JOBS, and for a job group's tasks
  SKYPILOT_JOBGROUP_NAME and SKYPILOT_ROOT_JOB_ID (absent for every other job);
- setup: SKYPILOT_SETUP_NODE_RANK, SKYPILOT_SETUP_NODE_IPS, SKYPILOT_SETUP_NUM_GPUS_PER_NODE,
  SKYPILOT_TASK_ID, SKYPILOT_CLUSTER_INFO, SKYPILOT_USER, SKYPILOT_NUM_NODES.
The user's `envs` and secrets come first and the contract wins over them, as in SkyPilot
(its exports of the predefined variables follow the task's).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from skypurza.events.payloads import ResourcesPayload, TaskPayload

SKYPILOT = "SKYPILOT_"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
# Set by Ray for run, unset for setup (../shared/reference/skypilot-contract.md §2).
UNSET_IN_SETUP = (CUDA_VISIBLE_DEVICES,)
ALIAS = "SKYPURZA_"

# SkyPilot's display names of clouds in SKYPILOT_CLUSTER_INFO ("AWS", not "aws").
_CLOUD_NAMES = {"aws": "AWS", "gcp": "GCP", "azure": "Azure", "kubernetes": "Kubernetes", "k8s": "Kubernetes",
                "local": "Local", "slurm": "Slurm", "ssh": "SSH"}


def task_id_timestamp(when: datetime) -> str:
    """`sky-YYYY-MM-DD-HH-MM-SS-ffffff`, in UTC so that every node derives the same text."""
    return "sky-" + when.astimezone(timezone.utc).strftime("%Y-%m-%d-%H-%M-%S-%f")


def cluster_task_id(queued_at: datetime, cluster: str, job_id: int) -> str:
    """SKYPILOT_TASK_ID of a cluster job: `sky-<ts>_<cluster>_<job_id>`."""
    return f"{task_id_timestamp(queued_at)}_{cluster}_{job_id}"


def managed_task_id(submitted_at: datetime, dag_name: str, managed_job_id: int, task_index: int = 0,
                    task_name: str | None = None) -> str:
    """SKYPILOT_TASK_ID of a managed job's task: `sky-managed-<ts>_<dag>[_<task>]_<id>-<idx>`."""
    ts = submitted_at.astimezone(timezone.utc).strftime("%Y-%m-%d-%H-%M-%S-%f")
    name = dag_name if not task_name or task_name == dag_name else f"{dag_name}_{task_name}"
    return f"sky-managed-{ts}_{name}_{managed_job_id}-{task_index}"


def cluster_info(cluster: str, infra: str, region: str | None, zone: str | None) -> str:
    """SKYPILOT_CLUSTER_INFO: JSON with cluster_name, cloud (display name), region, zone."""
    cloud = _CLOUD_NAMES.get(infra.lower(), infra)
    return json.dumps({"cluster_name": cluster, "cloud": cloud, "region": region, "zone": zone})


def gpus_per_node(task: TaskPayload, placed: dict[str, float] | None = None) -> int:
    """SKYPILOT_NUM_GPUS_PER_NODE: ceil of the task's accelerator count, 0 without accelerators.

    When the task offers several accelerators, the one the cluster was placed with (`placed`,
    from the candidate) decides; TPUs count as 0, as in SkyPilot.
    """
    offered = _accelerators(task.resources)
    if not offered:
        return 0
    name = next((n for n in (placed or {}) if n in offered), next(iter(offered)))
    if name.lower().startswith("tpu"):
        return 0
    count = offered[name]
    return int(math.ceil(count)) if count is not None else 1


def _accelerators(resources: ResourcesPayload | None) -> dict[str, float | None]:
    """Accelerator name -> count from every form `accelerators` may take (first alternative first)."""
    out: dict[str, float | None] = {}

    def add(value: Any) -> None:
        if value is None:
            return
        if isinstance(value, str):
            text = value.strip()
            if text.startswith(("{", "[")):
                for part in text.strip("{}[]").split(","):
                    add(part)
                return
            name, _, count = text.partition(":")
            if name.strip():
                out.setdefault(name.strip(), float(count) if count.strip() else None)
        elif isinstance(value, dict):
            for k, v in value.items():
                out.setdefault(str(k), float(v) if v is not None else None)
        elif isinstance(value, list):
            for item in value:
                add(item)

    if resources is not None:
        for res in (resources, *resources.alternatives()):
            add(res.accelerators_given())
    return out


@dataclass(frozen=True)
class JobContext:
    """Everything the contract needs about one job on one node."""

    cluster: str
    job_id: int
    rank: int
    cluster_ips: tuple[str, ...]  # every node of the cluster, head first
    job_num_nodes: int  # the job runs on ranks 0..job_num_nodes-1
    task_id: str
    user: str
    infra: str
    region: str | None = None
    zone: str | None = None
    gpus_per_node: int = 0
    managed_job_id: int | None = None
    managed_task_ids: tuple[str, ...] = ()
    job_rank: int = 0
    num_jobs: int = 1
    job_group: str | None = None  # a job group's name (its tasks only)
    root_job_id: int | None = None
    envs: dict[str, str] = field(default_factory=dict)  # the task's envs, then secrets
    cuda_visible_devices: str | None = None  # run only; None: left as the node has it


def contract(ctx: JobContext, phase: Literal["setup", "run"]) -> dict[str, str]:
    """The predefined variables of one phase, SKYPILOT_* names only."""
    env: dict[str, str] = {
        "SKYPILOT_TASK_ID": ctx.task_id,
        "SKYPILOT_CLUSTER_INFO": cluster_info(ctx.cluster, ctx.infra, ctx.region, ctx.zone),
        "SKYPILOT_USER": ctx.user,
        "SKYPILOT_NUM_NODES": str(ctx.job_num_nodes),
    }
    if phase == "setup":
        env["SKYPILOT_SETUP_NODE_RANK"] = str(ctx.rank)
        env["SKYPILOT_SETUP_NODE_IPS"] = "\n".join(ctx.cluster_ips)
        env["SKYPILOT_SETUP_NUM_GPUS_PER_NODE"] = str(ctx.gpus_per_node)
    else:
        env["SKYPILOT_NODE_RANK"] = str(ctx.rank)
        env["SKYPILOT_NODE_IPS"] = "\n".join(ctx.cluster_ips[: ctx.job_num_nodes])
        env["SKYPILOT_NUM_GPUS_PER_NODE"] = str(ctx.gpus_per_node)
        env["SKYPILOT_INTERNAL_JOB_ID"] = str(ctx.job_id)
        if ctx.cuda_visible_devices is not None:
            env[CUDA_VISIBLE_DEVICES] = ctx.cuda_visible_devices
        if ctx.managed_job_id is not None:
            env["SKYPILOT_MANAGED_JOB_ID"] = str(ctx.managed_job_id)
            env["SKYPILOT_TASK_IDS"] = "\n".join(ctx.managed_task_ids or (ctx.task_id,))
            env["SKYPILOT_JOB_RANK"] = str(ctx.job_rank)
            env["SKYPILOT_NUM_JOBS"] = str(ctx.num_jobs)
            if ctx.job_group is not None:
                env["SKYPILOT_JOBGROUP_NAME"] = ctx.job_group
            if ctx.root_job_id is not None:
                env["SKYPILOT_ROOT_JOB_ID"] = str(ctx.root_job_id)
    return env


def cuda_visible_devices(job_indices: tuple[int, ...] | None, node_gpus: int, rank: int,
                         infra: str) -> str | None:
    """CUDA_VISIBLE_DEVICES of a job's run on one node: the GPU indices its JobStarted recorded
    (packing.py; a fractional job shares its index with others, as under Ray), "" for a job that
    asked none on a node with GPUs (Ray hides them from it too), None on a node without GPUs
    (left as the node has it). The indices are the node's: on `local` every node is this one
    machine, and node `rank` holds GPUs `rank*G .. rank*G+G-1` of it (the optimizer reserved
    `G` per node, none shared between nodes)."""
    if node_gpus <= 0:
        return None
    base = rank * node_gpus if infra.lower() == "local" else 0
    return ",".join(str(base + i) for i in (job_indices or ()) if 0 <= i < node_gpus)


def with_aliases(env: dict[str, str]) -> dict[str, str]:
    """Each SKYPILOT_X also as SKYPURZA_X (same value)."""
    out = dict(env)
    for key, value in env.items():
        if key.startswith(SKYPILOT):
            out[ALIAS + key[len(SKYPILOT):]] = value
    return out


def job_environment(ctx: JobContext, phase: Literal["setup", "run"]) -> dict[str, str]:
    """What a phase's script gets on top of the node's environment: task envs and secrets,
    then the contract with its aliases (the contract wins on a clash), PYTHONUNBUFFERED=1."""
    env = dict(ctx.envs)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(with_aliases(contract(ctx, phase)))
    return env
