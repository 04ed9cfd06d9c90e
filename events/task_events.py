"""Events of the `task` aggregate (one submission, keyed by task_id): submit and placement.

Emitted by: the CLI (TaskSubmitted), the optimizer (PlacementChosen, PlacementFailed), the
provisioner (CapacityError, ProvisionFailed). See docs/events.md for who reacts.
"""

from __future__ import annotations

from typing import Literal

from .payloads import BlockField, TaskField
from .registry import Event, register
from .types import Attempt, Candidate, ErrorClass


class _TaskEvent(Event):
    AGGREGATE = "task"
    AGGREGATE_KEY = "task_id"
    task_id: str


@register
class TaskSubmitted(_TaskEvent):
    """A user asked for a task to run. Carries the task without secret values (`TaskPayload`)."""

    EVENT_NAME = "task_submitted"
    kind: Literal["cluster", "managed"] = "cluster"
    cluster: str
    task: TaskField
    num_nodes: int = 1
    user: str = ""
    team: str | None = None
    project: str | None = None
    # Secrets live in the secrets KV bucket under this key, never in the log.
    secrets_key: str | None = None
    # What to do once the cluster is up: tear down after the job (launch --down), autostop.
    down: bool = False
    idle_minutes: int | None = None
    managed_job_id: int | None = None
    task_index: int = 0
    # Blocks to start with (recovery excludes where the job was lost): the optimizer's Blocks.
    initial_blocks: list[BlockField] = []
    # The SKYPILOT_TASK_ID the job will see (stable across recoveries of a managed job).
    skypilot_task_id: str | None = None
    # Managed pipelines: every task's SKYPILOT_TASK_ID, in order (SKYPILOT_TASK_IDS).
    managed_task_ids: list[str] = []
    # Managed jobs: SKYPILOT_JOB_RANK / _NUM_JOBS (--num-jobs), and of a job group's member
    # SKYPILOT_JOBGROUP_NAME / _ROOT_JOB_ID (None for every other job).
    job_rank: int = 0
    num_jobs: int = 1
    job_group: str | None = None
    root_job_id: int | None = None


@register
class PlacementChosen(_TaskEvent):
    EVENT_NAME = "placement_chosen"
    cluster: str
    attempt: int  # 1 for the first choice, +1 for each failover
    candidate: Candidate
    remaining: list[Candidate] = []
    num_nodes: int = 1


@register
class PlacementFailed(_TaskEvent):
    EVENT_NAME = "placement_failed"
    cluster: str
    reason: str
    attempts: list[Attempt] = []
    managed_job_id: int | None = None


@register
class CapacityError(_TaskEvent):
    """A launch failed for a reason another place may not have: the optimizer fails over."""

    EVENT_NAME = "capacity_error"
    cluster: str
    placement_id: str  # id of the PlacementChosen that failed
    attempt: int
    candidate: Candidate
    error_class: ErrorClass
    code: str
    message: str


@register
class ProvisionFailed(_TaskEvent):
    """A launch failed in a way no other placement fixes (credentials, permissions ...)."""

    EVENT_NAME = "provision_failed"
    cluster: str
    placement_id: str
    candidate: Candidate | None = None
    error_class: ErrorClass = "other"
    code: str = ""
    message: str = ""
