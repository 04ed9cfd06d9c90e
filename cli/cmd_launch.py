"""`spz launch` and `spz exec`: a task onto a cluster, new or existing, and its output streamed.

What launch does on the cluster it finds (start a stopped one, queue on one that is up, submit a
new task) is decided by `launchplan.plan_launch`; this module does the I/O and the printing.
"""

from __future__ import annotations

import uuid
from typing import Any, Optional

import typer

from . import bounds
from .context import check_output, fail, print_json, run_async, stage
from .verbs import _RES, _TASK, _config, _confirm, _detached_hint, _overrides, _prepare, _stream, _watched


# ------------------------------------------------------------------------------------------ launch

def launch_command(
    entrypoint: Optional[list[str]] = typer.Argument(None, metavar="FILE|CMD",
                                                     help="A task YAML file, or a command to run (quote it)."),
    cluster: Optional[str] = typer.Option(None, "-c", "--cluster", callback=bounds.cluster_option,
                                          help="Cluster name: reused when it is up, else launched under this name."),
    detach_run: bool = typer.Option(False, "-d", "--detach-run",
                                    help="Return once the job is queued on the cluster; do not stream its logs."),
    async_: bool = typer.Option(False, "--async", help="Return as soon as the submission is in the event log."),
    down: bool = typer.Option(False, "--down", help="Tear the cluster down when the job ends (with -i: when idle "
                                                    "that long)."),
    idle_minutes: Optional[int] = typer.Option(None, "-i", "--idle-minutes-to-autostop", parser=bounds.IDLE_MINUTES,
                                               help="Stop the cluster after this many idle minutes."),
    no_setup: bool = typer.Option(False, "--no-setup", help="On an existing cluster, do not run setup."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    dryrun: bool = typer.Option(False, "--dryrun", help="Show where the task would run and what it costs; launch nothing."),
    output: str = typer.Option("table", "-o", "--output",
                               help="table, or json (a summary object on stdout; job output goes to stderr)."),
    infra: Optional[str] = typer.Option(None, "--infra", help="aws, aws/REGION, aws/REGION/ZONE or local.", rich_help_panel=_RES),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="e.g. A100:8, or none.", rich_help_panel=_RES),
    cpus: Optional[str] = typer.Option(None, "--cpus", help="vCPUs per node: 4 (exactly) or 4+ (at least).", rich_help_panel=_RES),
    memory: Optional[str] = typer.Option(None, "--memory", help="GiB per node: 16 or 16+.", rich_help_panel=_RES),
    instance_type: Optional[str] = typer.Option(None, "-t", "--instance-type", help="e.g. g5.xlarge, or none.", rich_help_panel=_RES),
    use_spot: Optional[bool] = typer.Option(None, "--use-spot/--no-use-spot", help="Spot instances or not.", rich_help_panel=_RES),
    num_nodes: Optional[int] = typer.Option(None, "--num-nodes", parser=bounds.NODES, help="Number of nodes.", rich_help_panel=_RES),
    disk_size: Optional[int] = typer.Option(None, "--disk-size", parser=bounds.DISK_GB, help="OS disk size in GB.", rich_help_panel=_RES),
    image_id: Optional[str] = typer.Option(None, "--image-id", help="Image (AMI) id, or none.", rich_help_panel=_RES),
    env: list[str] = typer.Option([], "-e", "--env", metavar="NAME[=VALUE]", help="Set an env var (repeatable).", rich_help_panel=_TASK),
    secret: list[str] = typer.Option([], "--secret", metavar="NAME[=VALUE]", help="Set a secret (never stored in the log).", rich_help_panel=_TASK),
    name: Optional[str] = typer.Option(None, "-n", "--name", help="Task name.", rich_help_panel=_TASK),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="Directory synced to ~/sky_workdir.", rich_help_panel=_TASK),
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
    overrides = _overrides(infra=infra, gpus=gpus, cpus=cpus, memory=memory, instance_type=instance_type,
                           use_spot=use_spot, num_nodes=num_nodes, disk_size=disk_size, image_id=image_id,
                           env=env, secret=secret, name=name, workdir=workdir)
    if dryrun:
        from .submit import SubmitError, load_task

        try:
            task = load_task(entrypoint or [], overrides)
        except SubmitError as exc:
            raise fail(str(exc), exc.code)
        try:
            from .dryrun import dryrun_command
        except ImportError:
            raise fail("--dryrun is not available in this build")
        raise typer.Exit(dryrun_command(task, None, output))
    task, public = _prepare(entrypoint or [], overrides)
    cfg = _config()
    from .submit import SubmitError, cluster_name

    try:
        name_ = cluster_name(cluster, cfg.user)
    except SubmitError as exc:
        raise fail(str(exc))
    autostop = task.autostop()
    idle = idle_minutes if idle_minutes is not None else (
        autostop.idle_minutes if autostop is not None and autostop.enabled else None)
    down_ = down or bool(autostop is not None and autostop.enabled and autostop.down and idle_minutes is None)
    if not async_:
        _confirm(f"Launch task {task.name or '(unnamed)'} on cluster {name_}?", yes, destructive=False)
    from .progress import StatusLine, echo_err, echo_out

    status = StatusLine()
    out = echo_err if output == "json" else echo_out
    from .jobwatch import SubmissionFailed

    try:
        code, summary = run_async(_launch(task, public, name_, cfg, idle=idle, down=down_, no_setup=no_setup,
                                          detach_run=detach_run, async_=async_, status=status, out=out))
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


async def _launch(task: Any, public: dict[str, Any], cluster: str, cfg: Any, *, idle: int | None, down: bool,
                  no_setup: bool, detach_run: bool, async_: bool, status: Any, out: Any) -> tuple[int, dict[str, Any]]:
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
            await bus.put_secrets(task_id, secret_values)
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
        if isinstance(plan, QueueOn):
            job, _ = await queue_job(bus, cluster=cluster, task_id=task_id, task=public, name=task.name,
                                     user=cfg.user, run_setup=plan.run_setup,
                                     secrets_key=task_id if secret_values else None,
                                     down_after=plan.down_after)
            if plan.autostop is not None:  # after the job is queued, so the cluster is not idle in between
                await bus.publish(AutostopSet(cluster=cluster, idle_minutes=plan.autostop.idle_minutes,
                                              down=plan.autostop.down))
            status.note(f"Cluster {cluster} is up: job {job.job_id} queued "
                        f"({'setup runs again' if plan.run_setup else 'setup unchanged, skipped'}).")
            job_id = job.job_id
        else:
            assert isinstance(plan, SubmitNew)
            ack = await bus.publish(TaskSubmitted(
                task_id=task_id, cluster=cluster, task=public, num_nodes=plan.num_nodes, user=cfg.user,
                team=cfg.team_of(cfg.user, labels), project=cfg.project_of(labels),
                secrets_key=task_id if secret_values else None, down=down, idle_minutes=idle))
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
                    prefixes=[subject_prefix(bus.stage, "task", task_id), subject_prefix(bus.stage, "cluster", cluster)]))
            except SubmissionFailed as exc:
                status.stop()
                status.note(f"[red]✗ {exc}[/red]")
                summary["status"] = "FAILED"
                summary["reason"] = str(exc)
                return 1, summary
        summary["job_id"] = job_id
        if async_ or detach_run:
            status.note(f"Job {job_id} queued on cluster {cluster}. " + _detached_hint(cluster, job_id))
            summary["status"] = "QUEUED"
            return 0, summary
        code = await _stream(bus, cluster, job_id, status, out)
        final = (await read_cluster(bus, cluster)).jobs.get(job_id)
        summary["status"] = final.status if final else None
        summary["exit_code"] = code if final is None else exit_code_of(final.status)
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

def exec_command(
    cluster: str = typer.Argument(..., callback=bounds.cluster_argument, help="An existing cluster (spz status)."),
    entrypoint: Optional[list[str]] = typer.Argument(None, metavar="FILE|CMD", help="A task YAML file or a command."),
    detach_run: bool = typer.Option(False, "-d", "--detach-run", help="Return once queued; do not stream logs."),
    infra: Optional[str] = typer.Option(None, "--infra", help="Must match the cluster.", rich_help_panel=_RES),
    gpus: Optional[str] = typer.Option(None, "--gpus", rich_help_panel=_RES),
    cpus: Optional[str] = typer.Option(None, "--cpus", rich_help_panel=_RES),
    memory: Optional[str] = typer.Option(None, "--memory", rich_help_panel=_RES),
    instance_type: Optional[str] = typer.Option(None, "-t", "--instance-type", rich_help_panel=_RES),
    use_spot: Optional[bool] = typer.Option(None, "--use-spot/--no-use-spot", rich_help_panel=_RES),
    num_nodes: Optional[int] = typer.Option(None, "--num-nodes", parser=bounds.NODES, help="Nodes to run on (at most the cluster's).", rich_help_panel=_RES),
    env: list[str] = typer.Option([], "-e", "--env", metavar="NAME[=VALUE]", help="Set an env var (repeatable).", rich_help_panel=_TASK),
    secret: list[str] = typer.Option([], "--secret", metavar="NAME[=VALUE]", help="Set a secret.", rich_help_panel=_TASK),
    name: Optional[str] = typer.Option(None, "-n", "--name", help="Task name.", rich_help_panel=_TASK),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="Directory synced to ~/sky_workdir.", rich_help_panel=_TASK),
) -> None:
    """Run a task or command on an existing cluster: no provisioning, no setup.

    The workdir and file mounts are synced again; the job waits for earlier jobs. Exit status as spz launch.

    Examples:

      spz exec mycluster 'python train.py --epochs 1'

      spz exec mycluster task.yaml --env LR=0.01
    """
    overrides = _overrides(infra=infra, gpus=gpus, cpus=cpus, memory=memory, instance_type=instance_type,
                           use_spot=use_spot, num_nodes=num_nodes, disk_size=None, image_id=None,
                           env=env, secret=secret, name=name, workdir=workdir)
    task, public = _prepare(entrypoint or [], overrides)
    cfg = _config()
    from .progress import StatusLine, echo_out

    status = StatusLine()
    try:
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
            await bus.put_secrets(task_id, secret_values)
        job, _ = await queue_job(bus, cluster=cluster, task_id=task_id, task=public, name=task.name, user=cfg.user,
                                 run_setup=False, secrets_key=task_id if secret_values else None)
        status.note(f"Job {job.job_id} queued on cluster {cluster}.")
        if detach_run:
            status.note(_detached_hint(cluster, job.job_id))
            return 0
        return await _stream(bus, cluster, job.job_id, status, out)
    finally:
        await bus.close()
