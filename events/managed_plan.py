"""Which managed jobs one `spz jobs launch` (or `POST /api/v1/jobs`) submits, and submitting them
all or none.

`plan_jobs` is the pure decision: one job (a task or a pipeline), N of it (`--num-jobs`, ranks
0..N-1), or one per task of a job group (a header saying `execution: parallel`). `submit_plans`
submits them in order (the group's root first: its id is the group's) through
events/managed_submit.py. Here, not in cli/, because the CLI on the bus and the API server both
submit, the same way.

All or none: every task is validated before the first id is taken; if a submission still fails
(the bus refused it, ids could not be allocated), the jobs already in the log are cancelled at
once (ManagedJobCancelRequested, stamped like the submissions) before the error is raised, so
no partial group is left to run. The API server runs this shielded from the client's request,
so a client that goes away mid-group does not interrupt it half-way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .bus import Bus
from .limits import MAX_NUM_JOBS
from .managed_events import JobGroupMember, ManagedJobCancelRequested, ManagedJobSubmitted
from .managed_submit import submit_managed_job
from .payloads import ManagedTask
from .principal import stamp
from .taskspec.jobgroup import delay_of, primary_indexes

log = logging.getLogger("skypurza.managed")


class PlanError(ValueError):
    """A launch that cannot be planned (a bound, --num-jobs with a job group); says why."""


class PartialSubmission(RuntimeError):
    """A submission failed after `submitted` were in the log; `cancelled` of them were cancelled."""

    def __init__(self, message: str, submitted: list[int], cancelled: list[int]) -> None:
        super().__init__(message)
        self.submitted = submitted
        self.cancelled = cancelled


@dataclass(frozen=True)
class JobPlan:
    """One managed job of a launch."""

    name: str
    task_indexes: tuple[int, ...]  # the launch's tasks this job runs (a pipeline: all of them)
    label: str  # what prefixes its lines when several jobs are followed
    job_rank: int = 0
    num_jobs: int = 1
    group: JobGroupMember | None = None  # root_job_id 0: filled in from the root's id


def plan_jobs(job_name: str, task_names: Sequence[str | None], header: dict[str, Any], num_jobs: int) -> list[JobPlan]:
    """The managed jobs one launch submits: one (a task or a pipeline), N of it (--num-jobs), or
    one per task of a job group (`header` is the group's header, empty otherwise)."""
    if not 1 <= num_jobs <= MAX_NUM_JOBS:
        raise PlanError(f"--num-jobs must be from 1 to {MAX_NUM_JOBS:,}, found {num_jobs}")
    if header.get("execution") == "parallel":
        if num_jobs > 1:
            raise PlanError("--num-jobs applies to one task (or a pipeline); a job group's jobs are its tasks")
        names = list(task_names)
        group = str(header.get("name"))
        primaries = primary_indexes(header.get("primary_tasks"), names)
        delay = header.get("termination_delay")
        return [JobPlan(name=f"{group}/{n}", task_indexes=(i,), label=str(n),
                        group=JobGroupMember(name=group, root_job_id=0, index=i, size=len(names),
                                             primaries=primaries, termination_delay_s=delay_of(delay, n)))
                for i, n in enumerate(names)]
    every = tuple(range(len(task_names)))
    return [JobPlan(name=job_name, task_indexes=every, label=f"rank {r}" if num_jobs > 1 else job_name,
                    job_rank=r, num_jobs=num_jobs) for r in range(num_jobs)]


def summary(plan: JobPlan, job: ManagedJobSubmitted) -> dict[str, Any]:
    """What `spz jobs launch -o json` (and POST /api/v1/jobs) says of one submitted job."""
    return {"id": job.managed_job_id, "name": plan.name, "task_ids": job.skypilot_task_ids,
            "job_rank": plan.job_rank, "num_jobs": plan.num_jobs,
            "job_group": job.group.name if job.group else None,
            "root_job_id": job.group.root_job_id if job.group else None}


async def submit_plans(bus: Bus, plans: Sequence[JobPlan], tasks: Sequence[dict[str, Any]],
                       secrets: Sequence[dict[str, str]], *, user: str,
                       attribution: Callable[[JobPlan], tuple[str | None, str | None]],
                       stamped: tuple[str, str] | None = None,
                       on_submitted: Callable[[JobPlan, ManagedJobSubmitted], None] | None = None,
                       submit: Callable[..., Any] = submit_managed_job) -> list[ManagedJobSubmitted]:
    """Submit every plan, in order; `tasks[i]`/`secrets[i]` are the launch's task i (its public
    dict, sources uploaded) and its secret values; `attribution(plan)` is its (team, project).
    All or none (the module's docstring): on a failure the submitted ones are cancelled and
    PartialSubmission raised. `submit` is the one submission (events/managed_submit.py)."""
    for t in tasks:  # a bad task is refused before any id is taken
        ManagedTask.model_validate(t)
    done: list[ManagedJobSubmitted] = []
    root = 0
    try:
        for plan in plans:
            team, project = attribution(plan)
            group = plan.group.model_copy(update={"root_job_id": root}) if plan.group else None
            job = await submit(bus, name=plan.name, tasks=[tasks[k] for k in plan.task_indexes], user=user,
                               team=team, project=project, secrets=[secrets[k] for k in plan.task_indexes],
                               job_rank=plan.job_rank, num_jobs=plan.num_jobs, group=group, stamped=stamped)
            if job.group is not None and not root:
                root = job.group.root_job_id
            done.append(job)
            if on_submitted is not None:
                on_submitted(plan, job)
    except Exception as exc:
        if not done:
            raise
        ids = [j.managed_job_id for j in done]
        cancelled = await _cancel_all(bus, ids, user, stamped)
        left = [j for j in ids if j not in cancelled]
        after = (f"the {len(done)} submitted before it ({', '.join(map(str, ids))}) were cancelled" if not left else
                 f"of the {len(done)} submitted before it, {', '.join(map(str, left))} could not be cancelled: "
                 f"cancel them (spz jobs cancel {' '.join(map(str, left))})")
        raise PartialSubmission(f"submitting managed job {len(done) + 1} of {len(plans)} failed "
                                f"({type(exc).__name__}: {str(exc)[:200]}); {after}", ids, cancelled) from exc
    return done


async def _cancel_all(bus: Bus, ids: list[int], user: str, stamped: tuple[str, str] | None) -> list[int]:
    cancelled = []
    for job_id in ids:
        for _attempt in range(3):  # the failure may have been the bus's for a moment
            try:
                env = bus.envelope(ManagedJobCancelRequested(managed_job_id=job_id, requested_by=user))
                await bus.publish(stamp(env, *stamped) if stamped is not None else env)
                cancelled.append(job_id)
                break
            except Exception as exc:
                log.warning("cancelling managed job %s of a failed group: %s: %s", job_id, type(exc).__name__, exc)
    return cancelled
