"""`spz launch` and `spz exec`: a task onto a cluster, new or existing, and its output streamed.

What launch does on the cluster it finds (start a stopped one, queue on one that is up, submit a
new task) is decided by `launchplan.plan_launch`; this module does the I/O and the printing.
"""

from __future__ import annotations

import uuid
from typing import Any, Optional

import typer

from . import bounds, options
from .context import check_output, fail, print_json, run_async, stage
from skypurza.events.verbs import retry_delay_s  # noqa: F401  (moved there: the launch through a server waits the same)
from .launchdry import idle_and_wait_for as _idle_and_wait_for
from .verbs import _TASK, _config, _confirm, _detached_hint, _prepare, _stream, _watched


# ------------------------------------------------------------------------------------------ launch

@options.with_flags(res=options.ResourceFlags, task_flags=options.TaskFlags)
def launch_command(
    entrypoint: Optional[list[str]] = typer.Argument(None, metavar="FILE|CMD",
                                                     help="A task YAML file, or a command to run (quote it)."),
    cluster: Optional[str] = typer.Option(None, "-c", "--cluster", callback=bounds.cluster_option,
                                          help="Cluster name: reused when it is up, else launched under this name."),
    detach_run: bool = typer.Option(False, "--detach-run/-no-d", "-d", show_default=False,
                                    help="Return once the job is queued on the cluster; do not stream its logs."),
    async_: bool = options.async_option("Return as soon as the submission is in the event log."),
    down: bool = typer.Option(False, "--down", help="Tear the cluster down when the job ends (with -i: when idle "
                                                    "that long)."),
    idle_minutes: Optional[int] = typer.Option(None, "-i", "--idle-minutes-to-autostop", parser=bounds.IDLE_MINUTES,
                                               help="Stop the cluster after this many idle minutes."),
    wait_for: Optional[str] = options.wait_for_option(),
    retry_until_up: bool = typer.Option(False, "-r", "--retry-until-up",
                                        help="When no place has capacity, submit again (with back-off) until the "
                                             "cluster is up; Ctrl-C stops."),
    no_setup: bool = typer.Option(False, "--no-setup", help="On an existing cluster, do not run setup."),
    fast: bool = typer.Option(False, "--fast", help="On a cluster that is up, skip setup (as --no-setup)."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    dryrun: bool = typer.Option(False, "--dryrun", help="Show where the task would run and what it costs; launch nothing."),
    output: str = typer.Option("table", "-o", "--output",
                               help="table, or json (a summary object on stdout; job output goes to stderr)."),
    name: Optional[str] = typer.Option(None, "-n", "--name", help="Task name.", rich_help_panel=_TASK),
    priority: Optional[str] = options.priority_option(),
    clone_disk_from: Optional[str] = typer.Option(None, "--clone-disk-from", "--clone", hidden=True,
                                                  help="Not supported: spz cannot clone a cluster's disk."),
    resize: bool = typer.Option(False, "--resize", hidden=True, help="Not supported yet: launch a new cluster."),
    docker: bool = typer.Option(False, "--docker", hidden=True, help="Not supported: SkyPilot's local Docker backend."),
    workspace: Optional[str] = options.workspace_option(),
    res: options.ResourceFlags = None,  # type: ignore[assignment]  (the options of options.with_flags)
    task_flags: options.TaskFlags = None,  # type: ignore[assignment]
) -> None:
    """Launch a cluster and run a task on it, streaming its output until it ends.

    FILE|CMD is a SkyPilot task YAML or a command. The exit status is the job's: 0 when it succeeded, 100 failed, 103 cancelled (1: it could not be placed or launched).

    On an existing cluster (-c NAME that is UP) the job is queued there, and setup runs again only if it changed. Ctrl-C while streaming detaches: the job keeps running.

    Examples:

      spz launch examples/hello.yaml

      spz launch -c dev --gpus A10G:1 'nvidia-smi'

      spz launch -c dist examples/distributed.yaml -d
    """
    check_output(output)
    if idle_minutes is not None and idle_minutes < 0:
        raise fail(f"-i must be 0 or more minutes, found {idle_minutes}")
    for given, flag, why in ((clone_disk_from is not None, "--clone-disk-from", "spz cannot clone a cluster's disk "
                              "yet; launch the new cluster and copy the data with file_mounts"),
                             (resize, "--resize", "spz cannot resize a cluster yet; spz down it and launch it again "
                              "with --num-nodes"),
                             (docker, "--docker", "SkyPilot's local Docker backend is not supported; use "
                              "--infra local (processes on this machine) or a docker image_id on a cloud")):
        if given:
            raise fail(f"{flag} is not supported: {why}", 2)
    workspace = options.workspace_of(workspace)
    overrides = options.overrides_of(res, task_flags, name=name, priority=priority)
    if dryrun:
        from .launchdry import launch_dryrun  # also cli/fastpath.py's, for a cold `launch --dryrun FILE`

        raise typer.Exit(launch_dryrun(entrypoint or [], overrides, output, idle_minutes, wait_for))
    task, public = _prepare(entrypoint or [], overrides)
    cfg = options.with_workspace(_config(), workspace)
    from .submit import SubmitError, cluster_name

    try:
        name_ = cluster_name(cluster, cfg.user)
    except SubmitError as exc:
        raise fail(str(exc))
    autostop = task.autostop()
    idle, wait_for = _idle_and_wait_for(task, idle_minutes, wait_for)
    down_ = down or bool(autostop is not None and autostop.enabled and autostop.down and idle_minutes is None)
    if not async_:
        _confirm(f"Launch task {task.name or '(unnamed)'} on cluster {name_}?", yes, destructive=False)
    from .progress import StatusLine, echo_err, echo_out

    status = StatusLine()
    out = echo_err if output == "json" else echo_out
    from .jobwatch import SubmissionFailed
    from .transport import api

    t = api()
    try:
        if t is not None:
            from . import via_api

            code, summary = via_api.launch(t, task, public, name_, idle=idle, down=down_, detach_run=detach_run,
                                           async_=async_, status=status, out=out, no_setup=no_setup or fast,
                                           wait_for=wait_for, workspace=workspace, retry_until_up=retry_until_up)
        else:
            code, summary = run_async(_launch(task, public, name_, cfg, idle=idle, down=down_,
                                              no_setup=no_setup or fast, detach_run=detach_run, async_=async_,
                                              status=status, out=out, wait_for=wait_for,
                                              retry_until_up=retry_until_up))
    except SubmissionFailed as exc:
        status.stop()
        raise fail(str(exc))
    except KeyboardInterrupt:
        status.stop()
        status.note("\nDetached from the logs (Ctrl-C): nothing was cancelled. "
                    f"Follow again: spz logs {name_}; cancel: spz cancel {name_}")
        raise typer.Exit(130)
    finally:
        status.stop()
    if output == "json":
        print_json(summary)
    raise typer.Exit(code)


async def _with_uploads(bus: Any, task: Any, public: dict[str, Any], cluster_infra: str | None) -> dict[str, Any]:
    """The task with its local sources sent to the object store when a cloud node may run it."""
    from .submit import SubmitError
    from .uploads import for_submit

    try:
        return await for_submit(bus, task, public, cluster_infra=cluster_infra)
    except SubmitError as exc:
        raise fail(str(exc), exc.code)


async def _launch(task: Any, public: dict[str, Any], cluster: str, cfg: Any, *, idle: int | None, down: bool,
                  no_setup: bool, detach_run: bool, async_: bool, status: Any, out: Any, wait_for: str | None = None,
                  retry_until_up: bool = False) -> tuple[int, dict[str, Any]]:
    import asyncio
    from skypurza.events.cluster_events import AutostopSet, StartRequested
    from skypurza.events.jobqueue import queue_job
    from skypurza.events.task_events import TaskSubmitted

    from .clusterlog import exit_code_of, read_cluster
    from .control import connect_bus
    from .jobwatch import SubmissionFailed, wait_for_job
    from .launchplan import Misfit, QueueOn, StartStopped, SubmitNew, TooFewNodes, Wanted, plan_launch

    labels = dict(task.resources.labels or {}) if task.resources is not None and task.resources.labels else {}
    status.update("Connecting to the control plane")
    bus = await connect_bus(stage(), "launch")
    summary: dict[str, Any] = {"cluster": cluster}
    try:
        existing = await read_cluster(bus, cluster)
        task_id = str(uuid.uuid4())
        summary["task_id"] = task_id
        secret_values = task.secret_values()
        if secret_values:
            await bus.put_secrets(task_id, secret_values, cluster)
        wanted = Wanted(nodes=task.num_nodes or 1, setup=task.setup, no_setup=no_setup, idle_minutes=idle, down=down,
                        requests=tuple(task.resource_requests()))
        plan = plan_launch(existing, wanted)
        if isinstance(plan, StartStopped):
            # As sky launch does: a stopped cluster is started again, in the same place.
            status.note(f"Cluster {cluster} is stopped: starting it.")
            await bus.publish(StartRequested(cluster=cluster))
            await _watched(_wait_started(bus, existing, status))
            plan = plan_launch(existing, wanted)  # on the started cluster
            if isinstance(plan, StartStopped):
                raise SubmissionFailed(f"cluster {cluster} did not come up")
        if isinstance(plan, (TooFewNodes, Misfit)):
            raise fail(plan.message())
        public = await _with_uploads(bus, task, public, existing.infra if isinstance(plan, QueueOn) else None)
        if isinstance(plan, QueueOn):
            job, _ = await queue_job(bus, cluster=cluster, task_id=task_id, task=public, name=task.name,
                                     user=cfg.user, run_setup=plan.run_setup,
                                     secrets_key=task_id if secret_values else None,
                                     down_after=plan.down_after)
            if plan.autostop is not None:  # after the job is queued, so the cluster is not idle in between
                await bus.publish(AutostopSet(cluster=cluster, idle_minutes=plan.autostop.idle_minutes,
                                              down=plan.autostop.down, wait_for=wait_for or "jobs_and_ssh"))
            status.note(f"Cluster {cluster} is up: job {job.job_id} queued "
                        f"({'setup runs again' if plan.run_setup else 'setup unchanged, skipped'}).")
            job_id = job.job_id
        else:
            assert isinstance(plan, SubmitNew)
            if wait_for is not None and async_:
                raise fail("--wait-for on a new cluster needs it up: leave out --async, or set it later with "
                           f"spz autostop {cluster} -i {idle} --wait-for {wait_for}", 2)
            attempt = 0
            while True:
                ack = await bus.publish(TaskSubmitted(
                    task_id=task_id, cluster=cluster, task=public, num_nodes=plan.num_nodes, user=cfg.user,
                    team=cfg.team_of(cfg.user, labels), project=cfg.project_of(labels),
                    secrets_key=task_id if secret_values else None, down=down, idle_minutes=idle))
                summary["task_id"] = task_id
                summary["submitted_seq"] = ack.seq
                from .lostplane import still_running

                still_running(f"the submission is in the event log and goes on when the control plane is back; "
                              f"follow it with spz logs {cluster}")
                if async_:
                    status.note(f"Submitted task {task_id} for cluster {cluster}. Follow: spz logs {cluster}; "
                                f"see it: spz status")
                    summary["status"] = "SUBMITTED"
                    return 0, summary
                try:
                    from .requestwatch import subject_prefix, unless_parked

                    # A service that gave up on this task's events (parked them) fails the wait at once.
                    waiting = wait_for_job(bus, task_id=task_id, cluster=cluster, start_seq=ack.seq,
                                           status=status.update, note=status.note)
                    job_id, _ = await _watched(unless_parked(
                        bus, waiting, failure=SubmissionFailed, min_seq=ack.seq,
                        prefixes=[subject_prefix(bus.stage, "task", task_id),
                                  subject_prefix(bus.stage, "cluster", cluster)]))
                    break
                except SubmissionFailed as exc:
                    if retry_until_up and getattr(exc, "retryable", False):
                        # -r: as `sky launch -r`, submit again after a back-off until some place has capacity.
                        attempt += 1
                        delay = retry_delay_s(attempt)
                        status.note(f"[yellow]{exc}[/yellow]\nNo capacity anywhere yet (-r): submitting again in "
                                    f"{delay:.0f} s (attempt {attempt + 1}); Ctrl-C stops.")
                        await asyncio.sleep(delay)
                        task_id = str(uuid.uuid4())
                        if secret_values:
                            await bus.put_secrets(task_id, secret_values, cluster)
                        continue
                    status.stop()
                    status.note(f"[red]✗ {exc}[/red]")
                    summary["status"] = "FAILED"
                    summary["reason"] = str(exc)
                    return 1, summary
            if wait_for is not None and idle is not None:
                # `sky launch -i N --wait-for X` is `sky launch` then `sky autostop -i N --wait-for X`.
                await bus.publish(AutostopSet(cluster=cluster, idle_minutes=idle, down=down, wait_for=wait_for))
        summary["job_id"] = job_id
        if async_ or detach_run:
            status.note(f"Job {job_id} queued on cluster {cluster}. " + _detached_hint(cluster, job_id))
            summary["status"] = "QUEUED"
            return 0, summary
        code = await _stream(bus, cluster, job_id, status, out)
        final = (await read_cluster(bus, cluster)).jobs.get(job_id)
        summary["status"] = final.status if final else None
        # One name, one meaning (as `queue -o json`): `exit_code` is the job's own exit status;
        # what this command exits with (SkyPilot's 100 for a failed job, ...) is `cli_exit_code`.
        summary["exit_code"] = final.state.exit_code if final else None
        summary["cli_exit_code"] = code if final is None else exit_code_of(final.status)
        return code, summary
    finally:
        await bus.close()


async def _wait_started(bus: Any, cluster: Any, status: Any) -> None:
    """Follow the cluster's events until ClusterStarted (the cluster is UP again)."""
    from skypurza.events import naming

    from .clusterlog import apply
    from .jobwatch import SubmissionFailed, merged_follow

    status.update(f"Starting cluster {cluster.name}")
    async for s in merged_follow(bus, [naming.aggregate_subjects(bus.stage, "cluster", cluster.name)],
                                 cluster.last_seq + 1):
        if s.event is None or s.envelope is None:
            continue
        apply(cluster, s.event, s.envelope.time)
        if s.event.EVENT_NAME == "cluster_started":
            status.note(f"Cluster {cluster.name} is up again.")
            return
        if cluster.status == "TERMINATED":
            raise SubmissionFailed(f"cluster {cluster.name} was terminated while starting")


# -------------------------------------------------------------------------------------------- exec

@options.with_flags(res=options.ResourceFlags, task_flags=options.TaskFlags)
def exec_command(
    cluster_arg: Optional[str] = typer.Argument(None, metavar="CLUSTER", help="An existing cluster (spz status)."),
    entrypoint: Optional[list[str]] = typer.Argument(None, metavar="FILE|CMD", help="A task YAML file or a command."),
    cluster_opt: Optional[str] = typer.Option(None, "-c", "--cluster", callback=bounds.cluster_option,
                                              help="The cluster, as an option (then every argument is the task)."),
    detach_run: bool = typer.Option(False, "-d", "--detach-run", help="Return once queued; do not stream logs."),
    async_: bool = options.async_option("Return as soon as the job is queued in the event log."),
    name: Optional[str] = typer.Option(None, "-n", "--name", help="Task name.", rich_help_panel=_TASK),
    res: options.ResourceFlags = None,  # type: ignore[assignment]  (the options of options.with_flags)
    task_flags: options.TaskFlags = None,  # type: ignore[assignment]
) -> None:
    """Run a task or command on an existing cluster: no provisioning, no setup.

    The workdir and file mounts are synced again; the job waits for earlier jobs. Exit status as spz launch.

    Examples:

      spz exec mycluster 'python train.py --epochs 1'

      spz exec mycluster task.yaml --env LR=0.01
    """
    words = list(entrypoint or [])
    if cluster_opt is not None:
        # `sky exec -c NAME CMD...`: the first argument is part of the task, not the cluster.
        words = ([cluster_arg] if cluster_arg is not None else []) + words
        cluster = cluster_opt
    elif cluster_arg is not None:
        cluster = bounds.check_cluster_name(cluster_arg, "CLUSTER", pattern=False) or cluster_arg
    else:
        raise fail("name the cluster: spz exec CLUSTER FILE|CMD (or -c CLUSTER)", 2)
    entrypoint = words
    detach_run = detach_run or async_
    overrides = options.overrides_of(res, task_flags, name=name)
    task, public = _prepare(entrypoint or [], overrides)
    cfg = _config()
    from .progress import StatusLine, echo_out
    from .transport import api

    status = StatusLine()
    t = api()
    try:
        if t is not None:  # through the server: POST /api/v1/clusters/{name}/jobs (cli/via_api.py)
            from . import via_api

            code = via_api.exec_(t, task, public, cluster, detach_run=detach_run, status=status, out=echo_out)
        else:
            code = run_async(_exec(task, public, cluster, cfg, detach_run, status, echo_out))
    except KeyboardInterrupt:
        status.stop()
        status.note(f"\nDetached from the logs (Ctrl-C): nothing was cancelled. Follow again: spz logs {cluster}")
        raise typer.Exit(130)
    finally:
        status.stop()
    raise typer.Exit(code)


async def _exec(task: Any, public: dict[str, Any], cluster: str, cfg: Any, detach_run: bool, status: Any,
                out: Any) -> int:
    from skypurza.events.jobqueue import queue_job

    from .clusterfit import misfit
    from .clusterlog import read_cluster
    from .control import connect_bus

    bus = await connect_bus(stage(), "exec")
    try:
        c = await read_cluster(bus, cluster)
        if c.status not in ("UP", "INIT"):  # INIT: a node was lost; the cluster still takes jobs
            what = "does not exist" if c.status in (None, "TERMINATED") else f"is {c.status}"
            raise fail(f"cluster {cluster} {what}" + (f": spz start {cluster}" if c.status == "STOPPED" else
                                                       "; launch it with spz launch -c " + cluster))
        unfit = misfit(c, task.resource_requests(), task.num_nodes or 1)
        if unfit is not None:
            raise fail(unfit.message())
        task_id = str(uuid.uuid4())
        secret_values = task.secret_values()
        if secret_values:
            await bus.put_secrets(task_id, secret_values, cluster)
        public = await _with_uploads(bus, task, public, c.infra or "local")
        job, _ = await queue_job(bus, cluster=cluster, task_id=task_id, task=public, name=task.name, user=cfg.user,
                                 run_setup=False, secrets_key=task_id if secret_values else None)
        status.note(f"Job {job.job_id} queued on cluster {cluster}.")
        if detach_run:
            status.note(_detached_hint(cluster, job.job_id))
            return 0
        return await _stream(bus, cluster, job.job_id, status, out)
    finally:
        await bus.close()


def register(app: typer.Typer) -> None:
    """Add `launch` and `exec` to the spz app (cli/commandtable.py names this module for them)."""
    app.command("launch")(launch_command)
    app.command("exec")(exec_command)
