"""Events of managed jobs (`mjob` aggregate, keyed by managed_job_id).

Emitted by: the CLI (ManagedJobSubmitted, ManagedJobCancelRequested), the recovery service
(ManagedJobStatusChanged, with optimistic concurrency on the job's subject so two recovery
services never act twice).

ManagedJobStatusChanged is at version 2: v1 carried the transition's kind only as the first
word of its free-text `reason` (`preempted: ...`), which the state machine parsed back; v2 has
it as the typed field `kind`, and the upcaster below reads stored v1 events into v2 the way
that parser did. The first real use of the upcaster path (events/registry.py).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from .payloads import ManagedTaskField
from .registry import Event, register, upcaster
from .types import Value

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


class JobGroupMember(Value):
    """A managed job's place in a job group (a YAML whose header says `execution: parallel`):
    every task of the group is a managed job of its own, submitted together, run at once, each
    on its own clusters and recovered on its own (docs/managed-jobs.md, *Job groups*)."""

    name: str  # the header's name: SKYPILOT_JOBGROUP_NAME
    root_job_id: int  # the group's first job: SKYPILOT_ROOT_JOB_ID, and what ties the members together
    index: int  # this job's task, in the file's order
    size: int  # jobs in the group
    primaries: list[int] = []  # indexes of the primary tasks (empty: every task is primary)
    # Seconds the other tasks still run once every primary task has ended (then they are cancelled).
    termination_delay_s: int = 0

    @property
    def primary(self) -> bool:
        return not self.primaries or self.index in self.primaries


@register
class ManagedJobSubmitted(_ManagedEvent):
    EVENT_NAME = "managed_job_submitted"
    name: str
    tasks: list[ManagedTaskField]  # the tasks of a pipeline, in order
    user: str = ""
    team: str | None = None
    project: str | None = None
    skypilot_task_ids: list[str] = []
    secrets_key: str | None = None
    # `spz jobs launch --num-jobs N`: this job's rank 0..N-1 and N (SKYPILOT_JOB_RANK, _NUM_JOBS).
    job_rank: int = 0
    num_jobs: int = 1
    group: JobGroupMember | None = None  # a member of a job group


# What a transition was for: the recovery state machine (services/recovery/machine.py) folds
# these, never the prose of `reason`. A launch (task start or recovery) is one of
#   launch      a task's first launch (STARTING)    preempted   spot preemption -> new cluster
#   node_lost   node or cluster lost -> new cluster restart     user-code failure, counted restart
#   exit_code   failure with a recover_on_exit_codes code
#   fallback    the strategy's first try found no place; the task's own constraints now
# and the others are `started` (RUNNING) and the ends: succeeded, failed, failed_setup,
# failed_controller, no_resource, cancelling, cancelled.
# `unclassified` is only ever produced by the v1 -> v2 upcaster, for a v1 reason whose first word
# is none of these (v1 events not written by the recovery service, e.g. with an empty reason):
# the v1 state machine read those as "no tag", and the fold treats `unclassified` the same way
# (not a launch: it starts no episode and asks for no cluster).
ManagedTransitionKind = Literal[
    "launch", "started", "preempted", "node_lost", "restart", "exit_code", "fallback",
    "succeeded", "failed", "failed_setup", "failed_controller", "no_resource", "cancelling", "cancelled",
    "unclassified",
]
TRANSITION_KINDS: frozenset[str] = frozenset(get_args(ManagedTransitionKind))
UNCLASSIFIED: ManagedTransitionKind = "unclassified"


@register
class ManagedJobStatusChanged(_ManagedEvent):
    """One transition of a managed job; `kind` says what it was for, `reason` explains it to people
    (it still begins with the kind, `preempted: ...`, but nothing parses it)."""

    EVENT_NAME = "managed_job_status_changed"
    VERSION = 2
    status: ManagedJobStatus
    kind: ManagedTransitionKind
    task_index: int = 0
    cluster: str | None = None
    recoveries: int = 0
    restarts_on_errors: int = 0
    reason: str = ""


def kind_of_v1_reason(reason: object) -> ManagedTransitionKind:
    """The kind a v1 reason names: its first word before `:` when that is a kind (exactly how the
    v1 state machine's `tag_of` read it), else `unclassified`."""
    if not isinstance(reason, str):
        return UNCLASSIFIED  # not a v1 reason at all: validation of `reason` says so (poison)
    head = reason.split(":", 1)[0].strip()
    return head if head in TRANSITION_KINDS else UNCLASSIFIED  # type: ignore[return-value]


@upcaster(ManagedJobStatusChanged.EVENT_NAME, 1)
def managed_job_status_changed_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Adds `kind`, read from the v1 reason's first word as v1's state machine read it
    (`unclassified` when that word names no kind); `reason` is kept as it was.

    Pure (the payload alone, no clock, no I/O): replaying the same v1 log gives the same v2
    events."""
    return {**data, "kind": kind_of_v1_reason(data.get("reason", ""))}


@register
class ManagedJobCancelRequested(_ManagedEvent):
    EVENT_NAME = "managed_job_cancel_requested"
    requested_by: str = ""
