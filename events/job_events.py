"""Events of jobs on a cluster. They belong to the `cluster` aggregate (a cluster's job ids are
allocated with optimistic concurrency on the cluster's subject), with `job_id` in the payload.

Emitted by: the provisioner or the CLI (JobQueued), the head agent (JobStarted, JobSucceeded,
JobFailed, JobCancelled), every agent (JobNodeFinished), the CLI (CancelRequested).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from .payloads import TaskField
from .registry import Event, register


class _JobEvent(Event):
    AGGREGATE = "cluster"
    AGGREGATE_KEY = "cluster"
    cluster: str
    job_id: int


@register
class JobQueued(_JobEvent):
    EVENT_NAME = "job_queued"
    task_id: str
    task: TaskField
    name: str | None = None
    user: str = ""
    run_setup: bool = True
    secrets_key: str | None = None
    skypilot_task_id: str = ""
    managed_job_id: int | None = None
    # Managed-job extras for the env contract (SKYPILOT_TASK_IDS, JOB_RANK, NUM_JOBS,
    # JOBGROUP_NAME, ROOT_JOB_ID), as the job's TaskSubmitted carries them.
    managed_task_ids: list[str] = []
    job_rank: int = 0
    num_jobs: int = 1
    job_group: str | None = None
    root_job_id: int | None = None
    down_after: bool = False


@register
class JobStarted(_JobEvent):
    EVENT_NAME = "job_started"
    started_at: datetime
    # The GPU indices of each of the job's nodes the head gave it (CUDA_VISIBLE_DEVICES, the same
    # on every node; services/agent/packing.py). None: not recorded (no GPUs, or an older head).
    gpu_indices: list[int] | None = None


@register
class JobNodeFinished(_JobEvent):
    EVENT_NAME = "job_node_finished"
    rank: int
    phase: Literal["setup", "run"]
    exit_code: int


@register
class JobSucceeded(_JobEvent):
    EVENT_NAME = "job_succeeded"
    ended_at: datetime


@register
class JobFailed(_JobEvent):
    EVENT_NAME = "job_failed"
    ended_at: datetime
    phase: Literal["setup", "run", "agent"] = "run"
    exit_code: int | None = None
    failed_rank: int | None = None
    reason: str = ""


@register
class CancelRequested(_JobEvent):
    EVENT_NAME = "cancel_requested"
    requested_by: str = ""


@register
class JobCancelled(_JobEvent):
    EVENT_NAME = "job_cancelled"
    ended_at: datetime
