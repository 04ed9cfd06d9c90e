"""Events of managed jobs (`mjob` aggregate, keyed by managed_job_id).

Emitted by: the CLI (ManagedJobSubmitted, ManagedJobCancelRequested), the recovery service
(ManagedJobStatusChanged, with optimistic concurrency on the job's subject so two recovery
services never act twice).
"""

from __future__ import annotations

from typing import Any, Literal

from .registry import Event, register

ManagedJobStatus = Literal[
    "PENDING", "STARTING", "RUNNING", "RECOVERING", "SUCCEEDED", "FAILED", "FAILED_SETUP",
    "FAILED_NO_RESOURCE", "FAILED_CONTROLLER", "CANCELLING", "CANCELLED",
]
TERMINAL_STATUSES = frozenset(
    {"SUCCEEDED", "FAILED", "FAILED_SETUP", "FAILED_NO_RESOURCE", "FAILED_CONTROLLER", "CANCELLED"}
)


class _ManagedEvent(Event):
    AGGREGATE = "mjob"
    AGGREGATE_KEY = "managed_job_id"
    managed_job_id: int


@register
class ManagedJobSubmitted(_ManagedEvent):
    EVENT_NAME = "managed_job_submitted"
    name: str
    tasks: list[dict[str, Any]]
    user: str = ""
    team: str | None = None
    project: str | None = None
    skypilot_task_ids: list[str] = []
    secrets_key: str | None = None


@register
class ManagedJobStatusChanged(_ManagedEvent):
    EVENT_NAME = "managed_job_status_changed"
    status: ManagedJobStatus
    task_index: int = 0
    cluster: str | None = None
    recoveries: int = 0
    restarts_on_errors: int = 0
    reason: str = ""


@register
class ManagedJobCancelRequested(_ManagedEvent):
    EVENT_NAME = "managed_job_cancel_requested"
    requested_by: str = ""
