"""`spz jobs launch` of several managed jobs at once: `--num-jobs N` (N jobs of the same task,
ranks 0..N-1) and job groups (a YAML whose header says `execution: parallel`: every task a
managed job of its own, run at once, tied by the group's root job id).

`plan_jobs` is the pure decision (which jobs, with which rank and group place); `launch_many`
submits them (the group's root first: its id is the group's) and follows them all until they
end, each line prefixed with the job it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import typer

from skypurza.events.limits import MAX_NUM_JOBS

from .context import fail, print_json, run_async, stage
from .submit import SubmitError

if TYPE_CHECKING:  # the event models load when a launch needs them, not for `spz --help`
    from skypurza.events.managed_events import JobGroupMember

# Jobs whose output is followed live at once; the others' is printed from the log when a
# follower is free (nothing is lost, and 1,000 jobs do not hold 1,000 consumers).
LIVE_FOLLOWERS = 16


@dataclass(frozen=True)
class JobPlan:
    """One managed job of a launch."""

    name: str
    task_indexes: tuple[int, ...]  # the launch's tasks this job runs (a pipeline: all of them)
    label: str  # what prefixes its lines when several jobs are followed
    job_rank: int = 0
    num_jobs: int = 1
    group: JobGroupMember | None = None  # root_job_id 0: filled in from the root's id


def plan_jobs(job_name: str, tasks: list[Any], header: dict[str, Any], num_jobs: int) -> list[JobPlan]:
    """The managed jobs one launch submits: one (a task or a pipeline), N of it (--num-jobs), or
    one per task of a job group (`header` is the group's header, empty otherwise)."""
    from skypurza.events.taskspec.jobgroup import delay_of, primary_indexes
    from skypurza.events.managed_events import JobGroupMember

    if not 1 <= num_jobs <= MAX_NUM_JOBS:
        raise SubmitError(f"--num-jobs must be from 1 to {MAX_NUM_JOBS:,}, found {num_jobs}", 2)
    if header.get("execution") == "parallel":
        if num_jobs > 1:
            raise SubmitError("--num-jobs applies to one task (or a pipeline); a job group's jobs are its tasks", 2)
        names = [t.name for t in tasks]
        group = str(header.get("name"))
        primaries = primary_indexes(header.get("primary_tasks"), names)
        delay = header.get("termination_delay")
        return [JobPlan(name=f"{group}/{n}", task_indexes=(i,), label=str(n),
                        group=JobGroupMember(name=group, root_job_id=0, index=i, size=len(tasks),
                                             primaries=primaries, termination_delay_s=delay_of(delay, n)))
                for i, n in enumerate(names)]
    every = tuple(range(len(tasks)))
    return [JobPlan(name=job_name, task_indexes=every, label=f"rank {r}" if num_jobs > 1 else job_name,
                    job_rank=r, num_jobs=num_jobs) for r in range(num_jobs)]


def describe(job_name: str, tasks: list[Any], plans: list[JobPlan]) -> str:
    """What the confirmation asks about."""
    if plans and plans[0].group is not None:
        return f"job group {plans[0].group.name} ({len(plans)} tasks at once, each a managed job)"
    what = f"{len(tasks)} tasks" if len(tasks) > 1 else "task"
    if len(plans) > 1:
        return f"{len(plans)} managed jobs {job_name} ({what} each, ranks 0..{len(plans) - 1})"
    return f"managed job {job_name} ({what})"


def needed(plans: list[JobPlan]) -> bool:
    """Whether the launch is several jobs (or a group), which `launch_many` submits."""
    return len(plans) > 1 or any(p.group is not None for p in plans)


def launch_many(plans: list[JobPlan], tasks: list[Any], publics: list[dict[str, Any]], cfg: Any, *,
                output: str, detach_run: bool, follow_job: Any) -> int:
    """Submit every planned job, then (without --detach-run) follow them all to their end with
    `follow_job` (cmd_jobs's). The exit status is the first job's (in submission order) that did
    not succeed, else 0."""
    import asyncio
    from .progress import StatusLine, echo_err, echo_out

    status = StatusLine()
    out = echo_err if output == "json" else echo_out
    submitted: list[int] = []

    async def run() -> tuple[int, list[dict[str, Any]]]:
        from skypurza.events.fold import exit_code_of
        from skypurza.services.recovery.submit import submit_managed_job

        from .control import connect_bus

        status.update("Connecting to the control plane")
        bus = await connect_bus(stage(), "jobs-launch")
        try:
            from .uploads import for_submit

            try:  # local sources are sent once, before any job of the group is submitted
                sent = [await for_submit(bus, t, p) for t, p in zip(tasks, publics)]
            except SubmitError as exc:
                raise fail(str(exc), exc.code)
            summaries: list[dict[str, Any]] = []
            root = 0
            for i, plan in enumerate(plans):
                status.update(f"Submitting managed job {i + 1} of {len(plans)}")
                mine = [tasks[k] for k in plan.task_indexes]
                labels: dict[str, str] = {}
                for t in mine:
                    if t.resources is not None and t.resources.labels:
                        labels.update(t.resources.labels)
                group = plan.group.model_copy(update={"root_job_id": root}) if plan.group else None
                job = await submit_managed_job(
                    bus, name=plan.name, tasks=[sent[k] for k in plan.task_indexes], user=cfg.user,
                    team=cfg.team_of(cfg.user, labels), project=cfg.project_of(labels),
                    secrets=[t.secret_values() for t in mine], job_rank=plan.job_rank, num_jobs=plan.num_jobs,
                    group=group)
                if job.group is not None and not root:
                    root = job.group.root_job_id
                submitted.append(job.managed_job_id)
                summaries.append({"id": job.managed_job_id, "name": plan.name, "task_ids": job.skypilot_task_ids,
                                  "job_rank": plan.job_rank, "num_jobs": plan.num_jobs,
                                  "job_group": job.group.name if job.group else None,
                                  "root_job_id": job.group.root_job_id if job.group else None})
                status.note(f"Managed job {job.managed_job_id} ({plan.name}) submitted.")
            ids = " ".join(map(str, submitted))
            if detach_run:
                status.note(f"See them: spz jobs queue; follow one: spz jobs logs ID; cancel them: "
                            f"spz jobs cancel {ids}")
                for s in summaries:
                    s["status"] = "PENDING"
                return 0, summaries
            status.update(f"Following {len(submitted)} managed jobs")
            gate = asyncio.Semaphore(LIVE_FOLLOWERS)

            async def follow(job_id: int, label: str) -> str | None:
                async with gate:
                    return await follow_job(bus, job_id, lambda line: out(f"({label}) {line}"), follow=True)

            finals = await asyncio.gather(*(follow(j, p.label) for j, p in zip(submitted, plans)))
            status.stop()
            code = 0
            for s, final in zip(summaries, finals):
                s["status"] = final
                color = "green" if final == "SUCCEEDED" else ("yellow" if final == "CANCELLED" else "red")
                status.note(f"[{color}]Managed job {s['id']} ({s['name']}): {final}[/{color}]")
                if final != "SUCCEEDED" and code == 0:
                    code = exit_code_of(final)
            return code, summaries
        finally:
            await bus.close()

    try:
        code, summaries = run_async(run())
    except KeyboardInterrupt:
        status.stop()
        ids = " ".join(map(str, submitted))
        if submitted:
            status.note(f"\nDetached (Ctrl-C): managed jobs {ids} keep running. See them: spz jobs queue; "
                        f"cancel them: spz jobs cancel {ids}")
        else:
            status.note("\nStopped (Ctrl-C) before any managed job was submitted: nothing runs.")
        raise typer.Exit(130)
    finally:
        status.stop()
    if output == "json":
        print_json(summaries)
    return code
