"""`spz jobs launch|queue|cancel|logs`: managed jobs, as `sky jobs` has them.

A managed job is a task (or a pipeline of tasks) that the recovery service runs to the end: it
launches a cluster per task, brings the job back on a new cluster when a spot node is
preempted or a node is lost, tears every cluster down when the job ends. There is no
controller VM: the recovery service is part of the control plane, and its state is the log.

`launch` publishes ManagedJobSubmitted (the job id allocated by the log with optimistic
concurrency), then follows the job's output across its clusters until it ends. `queue` asks
the status service's projection and reads the log itself when it does not answer (or with -r).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Optional

import typer


from . import bounds, fanout, options
from .context import check_output, fail, print_json, run_async, stage
from .jobrows import final_note as _final_note, projected_jobs as _projected_jobs, queue_row  # noqa: F401

jobs_app = typer.Typer(name="jobs", help="Managed jobs: run to the end, recovered from spot preemption.",
                       no_args_is_help=True, rich_markup_mode="rich")

POLL_S = 0.5


# ------------------------------------------------------------------------------------------ launch

def load_job(entrypoint: list[str], overrides: Any, job_recovery: str | None, name: str | None,
             cwd: Path, group: dict[str, Any] | None = None) -> tuple[str, list[Any], list[dict[str, Any]]]:
    """(job name, tasks, public task dicts) for an entrypoint: a YAML file (a pipeline or a job
    group allowed) or a command; overrides apply to a single task (SkyPilot refuses them for
    pipelines). A job group's header is put in `group` (when given; else a group is refused)."""
    from skypurza.events.taskspec import TaskSpecError, apply_overrides, is_yaml_entrypoint, load_tasks
    from skypurza.events.taskspec.overrides import task_from_command

    from .submit import SubmitError, localise

    words = [w for w in entrypoint if w.strip()]
    if not words:
        raise SubmitError("give a task YAML file or a command (e.g. spz jobs launch train.yaml)")
    text = " ".join(words)
    header_name: str | None = None
    try:
        if len(words) == 1 and is_yaml_entrypoint(text):
            loaded = load_tasks(text, env_overrides=dict(overrides.envs), secret_overrides=dict(overrides.secrets))
            if loaded.at_launch:
                raise TaskSpecError(loaded.at_launch)
            if loaded.is_job_group:
                if group is None:
                    raise SubmitError(f"{text} is a job group (execution: parallel): launch it with spz jobs launch")
                group.update(loaded.header)
            tasks = list(loaded.tasks)
            header_name = loaded.name
            if len(tasks) == 1 and not loaded.is_job_group:
                tasks = [apply_overrides(tasks[0], overrides)]
            elif (overrides.resource_overrides() or overrides.num_nodes or overrides.workdir or overrides.git_url
                  or overrides.git_ref):
                what = "job group" if loaded.is_job_group else "pipeline"
                raise SubmitError("resource, --num-nodes and --workdir overrides apply to one task; "
                                  f"{text} is a {what} of {len(tasks)} tasks: set them in the YAML")
        else:
            tasks = [task_from_command(text, overrides)]
            header_name = "sky-cmd"
    except TaskSpecError as exc:
        from .submit import _from_spec_error

        raise _from_spec_error(exc) from None
    publics = []
    for t in tasks:
        public = localise(t, t.public_dict(), cwd)
        if job_recovery:
            public = with_job_recovery(public, job_recovery)
        publics.append(public)
    job_name = name or header_name or (tasks[0].name if len(tasks) == 1 else None) or "sky-managed"
    return job_name, tasks, publics


def with_job_recovery(public: dict[str, Any], strategy: str) -> dict[str, Any]:
    """--job-recovery: the strategy of every resource alternative (restart settings kept)."""
    from skypurza.events.taskspec.resources import check_strategy

    check_strategy(strategy)
    resources = dict(public.get("resources") or {})
    current = resources.get("job_recovery")
    resources["job_recovery"] = {**current, "strategy": strategy} if isinstance(current, dict) else strategy
    for key in ("ordered", "any_of"):
        if isinstance(resources.get(key), list):
            resources[key] = [{k: v for k, v in a.items() if k != "job_recovery"} if isinstance(a, dict) else a
                              for a in resources[key]]
    return {**public, "resources": resources}


@options.with_flags(res=options.ResourceFlags, task_flags=options.TaskFlags)
def launch_command(
    entrypoint: Optional[list[str]] = typer.Argument(None, metavar="FILE|CMD",
                                                     help="A task YAML (several documents: a pipeline) or a command."),
    name: Optional[str] = typer.Option(None, "-n", "--name", help="Job name (default: the YAML's name)."),
    cluster: Optional[str] = typer.Option(None, "-c", "--cluster", hidden=True,
                                          help="Alias of --name (as in sky jobs launch)."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    detach_run: bool = typer.Option(False, "-d", "--detach-run", help="Return once submitted; do not stream output."),
    async_: bool = options.async_option("Return once the job is submitted (as -d)."),
    job_recovery: Optional[str] = typer.Option(None, "--job-recovery",
                                               help="EAGER_NEXT_REGION (default), FAILOVER or none."),
    output: str = typer.Option("table", "-o", "--output", help="table or json (a summary on stdout)."),
    priority: Optional[str] = options.priority_option(),
    pool: Optional[str] = typer.Option(None, "-p", "--pool", help="SkyPilot pool (spz has none: clusters of the "
                                                                  "job's own)."),
    num_jobs: Optional[int] = typer.Option(None, "--num-jobs", parser=bounds.NUM_JOBS,
                                           help="Number of jobs to submit: N managed jobs of the same task, "
                                                "each with SKYPILOT_JOB_RANK 0..N-1 and SKYPILOT_NUM_JOBS=N."),
    job_group: Optional[str] = typer.Option(None, "--job-group", help="Attach to an existing job group (spz "
                                            "refuses it: declare the group's tasks in one YAML)."),
    no_job_group: bool = typer.Option(False, "--no-job-group", help="A top-level job (spz's jobs always are)."),
    workspace: Optional[str] = options.workspace_option(),
    res: options.ResourceFlags = None,  # type: ignore[assignment]  (the options of options.with_flags)
    task_flags: options.TaskFlags = None,  # type: ignore[assignment]
) -> None:
    """Launch a managed job: run to the end on clusters of its own, recovered from preemption.

    A YAML whose first document says `execution: parallel` is a job group: every task at once,
    each a managed job on clusters of its own. --num-jobs N submits N jobs of the task.

    Exit status (without --detach-run): 0 succeeded, 100 failed, 103 cancelled (several jobs:
    the first that did not succeed decides). Ctrl-C while streaming detaches: the jobs keep
    running (spz jobs cancel ID stops one).

    Examples:

      spz jobs launch train.yaml -n llm --detach-run

      spz jobs launch --use-spot --job-recovery FAILOVER 'python train.py'

      spz jobs launch --num-jobs 8 shard.yaml
    """
    check_output(output)
    from .verbs import _config, _confirm
    from .submit import SubmitError

    if name is not None and cluster is not None and name != cluster:
        raise fail("-c/--cluster is an alias of -n/--name: give one of them", 2)
    name = name if name is not None else cluster
    if job_group is not None:
        raise fail("--job-group (attaching a job to a running job group) is not supported: declare the group's "
                   "tasks in one YAML (execution: parallel)", 2)
    if pool is not None:
        options.unused("-p/--pool", "SkyPurza has no pools; the job runs on clusters of its own")
    if no_job_group:
        options.unused("--no-job-group", "spz's managed jobs are always top-level")
    workspace = options.workspace_of(workspace)
    detach_run = detach_run or async_
    overrides = options.overrides_of(res, task_flags, priority=priority)
    header: dict[str, Any] = {}
    try:
        job_name, tasks, publics = load_job(entrypoint or [], overrides, job_recovery, name, Path.cwd(), header)
        plans = fanout.plan_jobs(job_name, tasks, header, num_jobs or 1)
    except SubmitError as exc:
        raise fail(str(exc), exc.code)
    except Exception as exc:  # e.g. an unknown --job-recovery strategy
        raise fail(str(exc))
    cfg = options.with_workspace(_config(), workspace)
    from .transport import api

    t = api()
    _confirm(f"Launch {fanout.describe(job_name, tasks, plans)}?", yes, destructive=False)
    body: dict[str, Any] | None = None
    if t is not None:  # the server submits a pipeline, a group, --num-jobs as the bus path does
        from . import via_api_jobs

        body = via_api_jobs.job_body(job_name, tasks, publics, header, num_jobs or 1, workspace)
        if fanout.needed(plans):
            raise typer.Exit(via_api_jobs.launch_many(t, plans, body, output=output, detach_run=detach_run))
    if fanout.needed(plans):
        raise typer.Exit(fanout.launch_many(plans, tasks, publics, cfg, output=output, detach_run=detach_run,
                                            follow_job=follow_job))
    from .progress import StatusLine, echo_err, echo_out

    status = StatusLine()
    out = echo_err if output == "json" else echo_out
    submitted: list[int] = []  # the managed job's id once it is in the log (for a Ctrl-C)

    async def run() -> tuple[int, dict[str, Any]]:
        from skypurza.events.fold import exit_code_of  # the event models: not for --help
        from skypurza.services.recovery.submit import submit_managed_job

        from .control import connect_bus

        status.update("Connecting to the control plane")
        bus = await connect_bus(stage(), "jobs-launch")
        try:
            labels: dict[str, str] = {}
            for t in tasks:
                if t.resources is not None and t.resources.labels:
                    labels.update(t.resources.labels)
            from .submit import SubmitError
            from .uploads import for_submit

            try:  # a managed job's tasks are placed afresh at every recovery: send local sources
                sent = [await for_submit(bus, t, p) for t, p in zip(tasks, publics)]
            except SubmitError as exc:
                raise fail(str(exc), exc.code)
            job = await submit_managed_job(bus, name=job_name, tasks=sent, user=cfg.user,
                                           team=cfg.team_of(cfg.user, labels), project=cfg.project_of(labels),
                                           secrets=[t.secret_values() for t in tasks])
            submitted.append(job.managed_job_id)
            summary: dict[str, Any] = {"id": job.managed_job_id, "name": job_name,
                                       "task_ids": job.skypilot_task_ids}
            status.note(f"Managed job {job.managed_job_id} ({job_name}) submitted.")
            if detach_run:
                status.note(f"Follow it: spz jobs logs {job.managed_job_id}; see it: spz jobs queue; "
                            f"cancel it: spz jobs cancel {job.managed_job_id}")
                summary["status"] = "PENDING"
                return 0, summary
            final = await follow_job(bus, job.managed_job_id, out, follow=True, status=status)
            summary["status"] = final
            return exit_code_of(final), summary
        finally:
            await bus.close()

    try:
        if t is not None:
            from . import via_api_jobs

            code, summary = via_api_jobs.launch(t, job_name, tasks[0], publics[0], detach_run=detach_run,
                                                status=status, out=out, workspace=workspace, body=body)
            submitted.append(summary["id"])
        else:
            code, summary = run_async(run())
    except KeyboardInterrupt:
        status.stop()
        if submitted:
            status.note(f"\nDetached (Ctrl-C): managed job {submitted[0]} keeps running. Follow it: spz jobs logs "
                        f"{submitted[0]}; cancel it: spz jobs cancel {submitted[0]}")
        else:
            status.note("\nStopped (Ctrl-C) before the managed job was submitted: nothing runs.")
        raise typer.Exit(130)
    finally:
        status.stop()
    if output == "json":
        print_json(summary)
    raise typer.Exit(code)


# ------------------------------------------------------------------------------------------- logs

async def _held_reason(bus: Any, job_id: int, state: Any) -> str | None:
    """Why dispatch holds the job's current launch (its TaskHeld's reason), None once it is
    admitted or when no policy holds it: two gets, no consumer."""
    from skypurza.events import naming
    from skypurza.services.recovery.machine import launch_task_id

    task_id = launch_task_id(job_id, state.clusters.index(state.cluster) + 1)
    admitted = await bus.last_event(naming.event_subject(bus.stage, "task", task_id, "task_admitted"))
    if admitted is not None:
        return None
    held = await bus.last_event(naming.event_subject(bus.stage, "task", task_id, "task_held"))
    return getattr(held.event, "reason", None) if held is not None else None


async def follow_job(bus: Any, job_id: int, out: Any, *, follow: bool, status: Any = None,
                     tail: int = 0) -> str | None:
    """Print the job's output across its clusters (each launch under a header); with `follow`,
    until the job ends; with `tail`, only the last `tail` lines of what was printed already.
    Returns the job's status (None: no such job).

    What was printed already comes from one replay per cluster; then one live follower per
    cluster (a recovery adds a cluster: a follower starts for it), and the job's state is
    polled with consumer-less reads."""
    import asyncio

    from skypurza.events import naming
    from skypurza.events.aiotasks import stop_tasks
    from skypurza.services.recovery.submit import read_jobs

    from .jobwatch import DRAIN_S, ChunkFilter, format_line, held_text, parse_log

    state = (await read_jobs(bus, [job_id])).get(job_id)
    if state is None:
        return None
    printed: dict[str, int] = {}  # cluster -> last logs-stream sequence printed
    chunks = ChunkFilter()  # a chunk stored twice prints once
    nodes = state.task.nodes()

    def show(cluster: str, msg: Any) -> None:
        line = parse_log(msg)
        if line.seq <= printed.get(cluster, 0):
            return
        if cluster not in printed:
            out(f"── launch {state.clusters.index(cluster) + 1}: cluster {cluster} ──")
        printed[cluster] = line.seq
        if chunks.fresh(line):
            out(format_line(line, nodes))

    history: list[str] = []
    printing = out
    if tail > 0:
        out = history.append  # the lines so far, of which the last `tail` are printed
    for cluster in list(state.clusters):
        async for msg in bus.replay_raw(stream=bus.logs_stream,
                                        filter_subject=naming.logs_subject_filter(bus.stage, cluster)):
            show(cluster, msg)
    if tail > 0:
        out = printing
        for text in history[-tail:]:
            out(text)
    if not follow or state.terminal:
        _final_note(status, job_id, state)
        return state.status
    from . import lostplane

    lostplane.still_running(f"managed job {job_id} keeps running on its cluster; "
                            f"follow it with spz jobs logs {job_id}")
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    followers: dict[str, asyncio.Task[None]] = {}

    async def pump(cluster: str, start: int) -> None:
        async for msg in bus.follow(stream=bus.logs_stream, start_seq=start,
                                    filter_subject=naming.logs_subject_filter(bus.stage, cluster)):
            await queue.put((cluster, msg))

    async def changes() -> None:
        # The job's own events wake the loop at once (its end above all), not the next poll; the
        # poll stays for an event stored before this follower began.
        async for _ in bus.follow(filter_subject=naming.aggregate_subjects(bus.stage, "mjob", str(job_id)),
                                  new_only=True):
            await queue.put(("", None))

    shown_status = None
    shown_held: str | None = None  # the dispatch hold's reason last shown ("held: ...")
    ended_at: float | None = None
    watcher = asyncio.create_task(changes())
    try:
        while True:
            for cluster in state.clusters:
                if cluster not in followers:
                    followers[cluster] = asyncio.create_task(pump(cluster, printed.get(cluster, 0) + 1))
            try:
                cluster, msg = await asyncio.wait_for(queue.get(), timeout=POLL_S)
                if msg is not None:
                    show(cluster, msg)
                    continue
            except asyncio.TimeoutError:
                pass
            if ended_at is not None and asyncio.get_running_loop().time() - ended_at > DRAIN_S:
                break
            state = (await read_jobs(bus, [job_id]))[job_id]
            if status is not None and not state.terminal and state.cluster and state.cluster not in printed:
                held = await _held_reason(bus, job_id, state)
                if held != shown_held:
                    shown_held, shown_status = held, None  # admitted: the job's status line again
                    if held:
                        status.update(held_text(held))
            if state.status != shown_status and status is not None and not shown_held:
                shown_status = state.status
                status.update(f"Managed job {job_id}: {state.status}" + (f" on {state.cluster}" if state.cluster else ""))
            if state.terminal and state.status == "SUCCEEDED":
                break  # every node reported its run, output stored first, before the job succeeded
            if state.terminal and ended_at is None:
                ended_at = asyncio.get_running_loop().time()  # a failing node's neighbours may still print
    finally:
        await stop_tasks(watcher, *followers.values())
    for cluster in list(state.clusters):  # what the followers had not brought yet, up to the end now
        async for msg in bus.replay_raw(stream=bus.logs_stream, start_seq=printed.get(cluster, 0) + 1,
                                        filter_subject=naming.logs_subject_filter(bus.stage, cluster)):
            show(cluster, msg)
    _final_note(status, job_id, state)
    return state.status


def logs_command(
    job_id: Optional[int] = typer.Argument(None, parser=bounds.JOB_ID, help="The managed job (default: the latest)."),
    name: Optional[str] = typer.Option(None, "-n", "--name", help="The job by name (the latest of that name)."),
    follow: bool = typer.Option(True, "--follow/--no-follow", help="Follow until the job ends, or print what there is."),
    tail: int = typer.Option(0, "--tail", parser=bounds.TAIL_LINES, help="Only the last N lines already printed "
                                                                         "(0: all)."),
    controller: bool = typer.Option(False, "--controller", help="The job's recovery history (spz has no jobs "
                                    "controller: its launches, preemptions and recoveries are events)."),
    refresh: bool = typer.Option(False, "-r", "--refresh", help="Read the latest (spz always does)."),
    sync_down: bool = typer.Option(False, "-s", "--sync-down", help="Write the job's output to "
                                   "~/sky_logs/managed_jobs/ID/ (a file per cluster and node) and say where."),
) -> None:
    """Print a managed job's output, every launch of it (recoveries included), in order."""
    from .progress import StatusLine, echo_out

    if refresh:
        options.unused("-r/--refresh", "there is no jobs controller to restart; spz reads the event log as it is")
    from .transport import api

    t = api()
    if controller or sync_down:
        if t is not None:
            from . import via_api_history
            from .clusterhistory import sky_logs_dir

            raise typer.Exit(via_api_history.managed_records(t, job_id, name, controller=controller,
                                                             dest_root=sky_logs_dir()))
        raise typer.Exit(run_async(_job_records(job_id, name, controller=controller)))
    status = StatusLine()

    async def run() -> int:
        from skypurza.events.fold import EXIT_NOT_FOUND, exit_code_of  # models: not for --help
        from skypurza.services.recovery.submit import read_jobs

        from .control import connect_bus

        bus = await connect_bus(stage(), "jobs-logs")
        try:
            target = job_id
            if target is None:
                jobs = await read_jobs(bus)
                matching = sorted(j for j, s in jobs.items() if name is None or s.name == name)
                if not matching:
                    status.note("No managed jobs" + (f" named {name}." if name else "."))
                    return EXIT_NOT_FOUND
                target = matching[-1]
            final = await follow_job(bus, target, echo_out, follow=follow, status=status if follow else None,
                                     tail=tail)
            if final is None:
                status.note(f"[red]No managed job {target}.[/red]")
                return EXIT_NOT_FOUND
            return exit_code_of(final) if follow else 0
        finally:
            await bus.close()

    try:
        if t is not None:
            from . import via_api_jobs

            code = via_api_jobs.logs(t, job_id, name, follow, tail, status, echo_out)
        else:
            code = run_async(run())
    except KeyboardInterrupt:
        status.stop()
        status.note("\nStopped following (Ctrl-C); the job keeps running.")
        raise typer.Exit(130)
    finally:
        status.stop()
    raise typer.Exit(code)


async def _job_records(job_id: int | None, name: str | None, *, controller: bool) -> int:
    """`jobs logs --controller` (the job's recovery events, oldest first) or `--sync-down` (its
    output written under ~/sky_logs/managed_jobs/ID/, a directory per cluster)."""
    from skypurza.events import naming
    from skypurza.events.fold import EXIT_NOT_FOUND
    from skypurza.services.recovery.submit import read_jobs

    from .clusterhistory import event_line, sky_logs_dir, sync_down
    from .clusterlog import read_cluster
    from .control import connect_bus

    bus = await connect_bus(stage(), "jobs-logs")
    try:
        jobs = await read_jobs(bus, [job_id] if job_id is not None else None)
        matching = sorted(j for j, s in jobs.items() if name is None or s.name == name)
        if not matching:
            typer.echo("No managed job" + (f" {job_id}" if job_id else (f" named {name}" if name else "s")) + ".",
                       err=True)
            return EXIT_NOT_FOUND
        target = matching[-1]
        if controller:
            async for s in bus.replay(filter_subject=naming.aggregate_subjects(bus.stage, "mjob", str(target))):
                if s.event is not None and s.envelope is not None:
                    typer.echo(event_line(s.event, s.envelope.time))
            return 0
        base = sky_logs_dir() / "managed_jobs" / str(target)
        written = []
        for cluster in jobs[target].clusters:
            c = await read_cluster(bus, cluster)
            for job in sorted(c.jobs):
                written += await sync_down(bus, cluster, job, base / cluster / str(job))
        if not written:
            typer.echo(f"Managed job {target} has printed nothing yet.")
            return 0
        typer.echo(f"Managed job {target}'s logs: {base}")
        for f in written:
            typer.echo(f"  {f}")
        return 0
    finally:
        await bus.close()


# ------------------------------------------------------------------------------------------ queue

def queue_command(
    all_: bool = typer.Option(False, "-a", "--all", help="Every job (default: the latest 50)."),
    skip_finished: bool = typer.Option(False, "-s", "--skip-finished", help="Only unfinished jobs."),
    output: str = typer.Option("table", "-o", "--output", help="table or json (a list of jobs)."),
    refresh: bool = typer.Option(False, "-r", "--refresh", help="Read the event log itself, not the status service."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Every column: user, started, ended, reason."),
    limit: int = typer.Option(50, "-l", "--limit", parser=bounds.BoundedInt(1, 1_000_000, "jobs"),
                              help="Show at most this many, newest first (-a: all)."),
    status_filter: Optional[str] = typer.Option(None, "--status", metavar="STATUS[,STATUS...]",
                                                help="Only jobs in these statuses (e.g. FAILED,FAILED_SETUP)."),
    since: Optional[str] = typer.Option(None, "--since", help="Only jobs submitted within this window: 30m, 48h, "
                                                              "7d, 2w (a bare number: seconds)."),
    after: Optional[str] = typer.Option(None, "--after", help="Only jobs submitted at or after this local time "
                                                              "(2026-01-13 or 2026-01-13 15:30:00)."),
    before: Optional[str] = typer.Option(None, "--before", help="Only jobs submitted at or before this local time."),
    infra: Optional[str] = typer.Option(None, "--infra", help="Only jobs on this infra: aws, aws/REGION, local ..."),
    all_users: bool = options.all_users_option(),
) -> None:
    """Show managed jobs: id, name, status, recoveries, the cluster they run on."""
    check_output(output)
    from skypurza.events.managed_events import TERMINAL_STATUSES

    from .transport import api

    t = api()
    if t is None:
        options.all_users_note(all_users)
    # Through a server, -r changes nothing: the server's answer has caught up with the whole log
    # already (the status service asked with the log's last sequence).
    if since is not None and after is not None:
        raise typer.BadParameter("give --since or --after, not both", param_hint="--since")
    statuses = _statuses(status_filter)
    now = datetime.now(timezone.utc)
    low = now - timedelta(seconds=options.parse_window(since)) if since is not None else (
        options.parse_local_time(after, "--after") if after is not None else None)
    high = options.parse_local_time(before, "--before") if before is not None else None

    async def run() -> list[dict[str, Any]]:
        from .control import connect_bus

        bus = await connect_bus(stage(), "jobs-queue")
        try:
            # The server cuts to the newest `limit` when no filter of ours comes after it.
            cut = None if all_ or statuses or low is not None or high is not None or infra is not None else limit
            rows = None if refresh else await _projected_jobs(bus, skip_finished, cut)
            if isinstance(rows, list):
                rows = [queue_row(r) for r in rows]
            else:  # no status service answered: the fold of the log
                from skypurza.services.recovery.submit import read_jobs

                jobs = await read_jobs(bus)
                rows = [queue_row(s.summary()) for _, s in sorted(jobs.items(), reverse=True)]
            if infra is not None:
                rows = await _on_infra(bus, rows, infra)
            return rows
        finally:
            await bus.close()

    if t is not None:
        from . import via_api_jobs

        rows = via_api_jobs.queue_rows(t, skip_finished, all_users)
        if infra is not None:
            rows = via_api_jobs.on_infra(t, rows, infra)
    else:
        rows = run_async(run())
    if skip_finished:
        rows = [r for r in rows if r["status"] not in TERMINAL_STATUSES]
    if statuses:
        rows = [r for r in rows if r["status"] in statuses]
    if low is not None or high is not None:
        from .tables import parse_time

        def inside(r: dict[str, Any]) -> bool:
            at = parse_time(r["submitted_at"])
            return at is not None and (low is None or at >= low) and (high is None or at <= high)

        rows = [r for r in rows if inside(r)]
    rows.sort(key=lambda r: -int(r["id"] or 0))
    if not all_:
        rows = rows[:limit]
    if output == "json":
        print_json(rows)
        return
    from .tables import since
    from .tables import parse_time, print_line, print_table

    if not rows:
        print_line("No managed jobs.")
        return
    now = datetime.now(timezone.utc)

    def line(r: dict[str, Any]) -> list[str]:
        task = f"{(r['task_index'] or 0) + 1}/{r['num_tasks']}" if (r["num_tasks"] or 1) > 1 else "-"
        cells = [str(r["id"]), r["name"] or "-", task, since(parse_time(r["submitted_at"]), now), r["status"] or "-",
                 str(r["recoveries"] or 0), r["cluster"] or "-"]
        if verbose:
            cells += [r["user"] or "-", since(parse_time(r["started_at"]), now), since(parse_time(r["ended_at"]), now),
                      r["reason"] or "-"]
        return cells

    columns = ("ID", "NAME", "TASK", "SUBMITTED", "STATUS", "RECOVERIES", "CLUSTER")
    print_table((*columns, "USER", "STARTED", "ENDED", "REASON") if verbose else columns, [line(r) for r in rows])


def _statuses(value: str | None) -> set[str]:
    """--status FAILED,FAILED_SETUP: each a managed-job status of sky's."""
    if value is None:
        return set()
    from typing import get_args

    from skypurza.events.managed_events import ManagedJobStatus

    # sky's own list has three spz never reaches (no controller to submit to or wind down, no prechecks
    # phase: a task spz refuses fails at submission); they are accepted and match nothing.
    known = (*get_args(ManagedJobStatus), "SUBMITTED", "WINDING_DOWN", "FAILED_PRECHECKS")
    wanted = {v.strip().upper() for v in value.split(",") if v.strip()}
    unknown = sorted(wanted - set(known))
    if unknown:
        raise typer.BadParameter(f"{', '.join(unknown)} is not a managed-job status; accepted: {', '.join(known)}",
                                 param_hint="--status")
    return wanted


async def _on_infra(bus: Any, rows: list[dict[str, Any]], infra: str) -> list[dict[str, Any]]:
    """The jobs whose current cluster runs on `infra` (aws, aws/REGION, aws/REGION/ZONE, local)."""
    from .clusterlog import read_cluster

    where: dict[str, tuple[Any, ...]] = {}
    for name in {r.get("cluster") for r in rows if r.get("cluster")}:
        c = await read_cluster(bus, name)
        where[name] = (c.infra, c.region, c.zone)
    from .jobrows import on_infra

    return on_infra(rows, infra, where)


# ----------------------------------------------------------------------------------------- cancel

def cancel_command(
    job_ids: Optional[list[int]] = typer.Argument(None, metavar="[ID]...", parser=bounds.JOB_ID, help="Managed job ids."),
    name: Optional[str] = typer.Option(None, "-n", "--name", help="Every unfinished job of this name (or of this job group)."),
    all_: bool = typer.Option(False, "-a", "--all", help="Every unfinished managed job."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    async_: bool = options.async_option("Do not wait until they are cancelled."),
    pool: Optional[str] = typer.Option(None, "-p", "--pool", help="SkyPilot pool (spz has none)."),
    task: Optional[str] = typer.Option(None, "--task", help="One dynamic task of a job group (spz has none)."),
    graceful: bool = options.graceful_option(),
    graceful_timeout: Optional[int] = options.graceful_timeout_option(),
    all_users: bool = options.all_users_option(),
) -> None:
    """Cancel managed jobs: their clusters are torn down and they end CANCELLED."""
    import asyncio
    if pool is not None:
        raise fail("-p/--pool: SkyPurza has no pools; cancel the jobs by id, -n NAME or --all", 2)
    if task is not None:
        raise fail("--task: spz has no dynamic tasks; each task of a job group is a managed job of its own: "
                   "cancel it by its id (spz jobs queue)", 2)
    if graceful:
        options.unused("--graceful", "spz has no MOUNT_CACHED uploads to wait for; jobs cancel waits until the jobs "
                                     "have ended anyway")
    chosen = sum(1 for x in (bool(job_ids), name is not None, all_) if x)
    if chosen != 1:
        raise fail("give job ids, or -n NAME, or --all (exactly one of them)")
    from .verbs import WAIT_S, _confirm

    wait_s = float(graceful_timeout) if graceful_timeout is not None else WAIT_S
    from .transport import api

    t = api()
    if t is not None:
        from . import via_api_jobs

        raise typer.Exit(via_api_jobs.cancel(t, list(job_ids or []), name, all_, yes, async_, wait_s, all_users))
    options.all_users_note(all_users)

    async def run() -> int:
        from skypurza.services.recovery.submit import read_jobs, request_cancel

        from .control import connect_bus

        bus = await connect_bus(stage(), "jobs-cancel")
        try:
            jobs = await read_jobs(bus, list(job_ids) if job_ids else None)
            if job_ids:
                missing = [j for j in job_ids if j not in jobs]
                if missing:
                    raise fail(f"no managed job {', '.join(map(str, missing))}")
                targets = [j for j in job_ids if not jobs[j].terminal]
                for j in job_ids:
                    if jobs[j].terminal:
                        typer.echo(f"Managed job {j} already ended ({jobs[j].status}).")
            else:
                targets = sorted(j for j, s in jobs.items() if not s.terminal and (
                    name is None or s.name == name or (s.group is not None and s.group.name == name)))
            if not targets:
                typer.echo("Nothing to cancel.")
                return 0
            _confirm(f"Cancel managed job(s) {', '.join(map(str, targets))}?", yes)
            user = os.environ.get("SKYPURZA_USER") or ""
            for j in targets:
                await request_cancel(bus, j, requested_by=user)
            if async_:
                typer.echo(f"Cancellation requested for {', '.join(map(str, targets))}.")
                return 0
            deadline = asyncio.get_running_loop().time() + wait_s
            while True:
                now = await read_jobs(bus, targets)
                if all(now[j].terminal for j in targets):
                    break
                if asyncio.get_running_loop().time() > deadline:
                    raise fail("the jobs did not end in time; see spz jobs queue")
                await asyncio.sleep(POLL_S)
            for j in targets:
                typer.echo(f"Managed job {j}: {now[j].status}.")
            return 0
        finally:
            await bus.close()

    raise typer.Exit(run_async(run()))


def register(app: typer.Typer) -> None:
    """Add `spz jobs ...` to the spz app."""
    jobs_app.command("launch")(launch_command)
    jobs_app.command("queue")(queue_command)
    jobs_app.command("cancel")(cancel_command)
    jobs_app.command("logs")(logs_command)
    app.add_typer(jobs_app, name="jobs")

