"""`spz jobs launch` of several managed jobs at once: `--num-jobs N` (N jobs of the same task,
ranks 0..N-1) and job groups (a YAML whose header says `execution: parallel`: every task a
managed job of its own, run at once, tied by the group's root job id).

`plan_jobs` is the pure decision (events/managed_plan.py: which jobs, with which rank and group
place); `launch_many` submits them on the bus (managed_plan.submit_plans: the group's root first,
all or none) and follows them all until they end, each line prefixed with the job it comes from.
Through an API server the server submits them (cli/via_api_jobs.launch_many).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from .context import fail, print_json, run_async, stage
from .submit import SubmitError

if TYPE_CHECKING:  # the event models load when a launch needs them, not for `spz --help`
    from skypurza.events.managed_plan import JobPlan

# Jobs whose output is followed live at once; the others' is printed from the log when a
# follower is free (nothing is lost, and 1,000 jobs do not hold 1,000 consumers).
LIVE_FOLLOWERS = 16


def plan_jobs(job_name: str, tasks: list[Any], header: dict[str, Any], num_jobs: int) -> list[JobPlan]:
    """The managed jobs one launch submits (events/managed_plan.py decides; a refusal is a usage error)."""
    from skypurza.events.managed_plan import PlanError, plan_jobs as plan

    try:
        return plan(job_name, [t.name for t in tasks], header, num_jobs)
    except PlanError as exc:
        raise SubmitError(str(exc), 2) from None


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


def labels_of(tasks: list[Any], plan: JobPlan) -> dict[str, str]:
    """The resource labels of a planned job's tasks (its team and project come from them)."""
    labels: dict[str, str] = {}
    for k in plan.task_indexes:
        t = tasks[k]
        if t.resources is not None and t.resources.labels:
            labels.update(t.resources.labels)
    return labels


def finish(status: Any, summaries: list[dict[str, Any]], finals: list[str | None]) -> int:
    """Each followed job's end said; the exit status is the first (in submission order) that did
    not succeed, else 0 (the same on the bus and through a server)."""
    from skypurza.events.fold import exit_code_of

    code = 0
    for s, final in zip(summaries, finals):
        s["status"] = final
        color = "green" if final == "SUCCEEDED" else ("yellow" if final == "CANCELLED" else "red")
        status.note(f"[{color}]Managed job {s['id']} ({s['name']}): {final}[/{color}]")
        if final != "SUCCEEDED" and code == 0:
            code = exit_code_of(final)
    return code


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
        from .control import connect_bus

        status.update("Connecting to the control plane")
        bus = await connect_bus(stage(), "jobs-launch")
        try:
            from .uploads import for_submit

            try:  # local sources are sent once, before any job of the group is submitted
                sent = [await for_submit(bus, t, p) for t, p in zip(tasks, publics)]
            except SubmitError as exc:
                raise fail(str(exc), exc.code)
            from skypurza.events.managed_plan import PartialSubmission, submit_plans, summary

            summaries: list[dict[str, Any]] = []

            def said(plan: JobPlan, job: Any) -> None:
                submitted.append(job.managed_job_id)
                summaries.append(summary(plan, job))
                status.note(f"Managed job {job.managed_job_id} ({plan.name}) submitted.")
                if len(submitted) < len(plans):
                    status.update(f"Submitting managed job {len(submitted) + 1} of {len(plans)}")

            def attribution(plan: JobPlan) -> tuple[str | None, str | None]:
                labels = labels_of(tasks, plan)
                return cfg.team_of(cfg.user, labels), cfg.project_of(labels)

            status.update(f"Submitting managed job 1 of {len(plans)}")
            try:
                await submit_plans(bus, plans, sent, [t.secret_values() for t in tasks], user=cfg.user,
                                   attribution=attribution, on_submitted=said)
            except PartialSubmission as exc:
                submitted.clear()  # cancelled: nothing keeps running
                raise fail(str(exc))
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
            return finish(status, summaries, list(finals)), summaries
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
