"""Cluster verbs as `sky` has them: launch, exec, status, queue, logs, cancel, stop, start, down,
autostop.

Every verb is a client of the event log: it publishes what the user asks for (TaskSubmitted,
JobQueued, CancelRequested, StopRequested ...) and watches the log for what happened. The
embedded control plane is started on first use. `status` and `queue` ask the ledger's
projections (request-reply) and read the log directly when the ledger does not answer or with
`--refresh`; the verbs that act on one cluster always decide on the log itself.
"""

from __future__ import annotations

import fnmatch
import os
import sys
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import typer

from . import bounds
from .context import check_output, fail, print_json, run_async, stage

WAIT_S = 300.0  # stop/start/down/cancel wait this long for the outcome before giving up
EXIT_CLEANUP_INCOMPLETE = 3  # down: the clusters are gone, some shared resource is not released yet

_RES = "Resources (override the task YAML)"
_TASK = "Task (override the task YAML)"


# ---------------------------------------------------------------------------------- shared options

def _overrides(*, infra: str | None, gpus: str | None, cpus: str | None, memory: str | None,
               instance_type: str | None, use_spot: bool | None, num_nodes: int | None, disk_size: int | None,
               image_id: str | None, env: list[str], secret: list[str], name: str | None,
               workdir: str | None) -> Any:
    from skypurza.events.taskspec import CliOverrides, TaskSpecError
    from skypurza.events.taskspec.overrides import parse_var_flags

    try:
        envs = parse_var_flags(env, os.environ, "--env")
        secrets = parse_var_flags(secret, os.environ, "--secret")
    except TaskSpecError as exc:
        raise fail("; ".join(f"{p.path}: {p.message}" for p in exc.problems))
    bounds.check_var_flags(envs, secrets)
    if num_nodes is not None and num_nodes < 1:
        raise fail(f"--num-nodes must be at least 1, found {num_nodes}")
    return CliOverrides(infra=infra, gpus=gpus, cpus=cpus, memory=memory, instance_type=instance_type,
                        use_spot=use_spot, num_nodes=num_nodes, disk_size=disk_size, image_id=image_id,
                        envs=envs, secrets=secrets, name=name, workdir=workdir)


def _prepare(entrypoint: list[str], overrides: Any) -> tuple[Any, dict[str, Any]]:
    from .submit import SubmitError, load_task, localise

    try:
        task = load_task(entrypoint, overrides)
        public = localise(task, task.public_dict(), Path.cwd())
    except SubmitError as exc:
        raise fail(str(exc), exc.code)
    return task, public


def _confirm(question: str, yes: bool, destructive: bool = True) -> None:
    """Ask on a terminal. Without one, a destructive verb needs -y; launching just proceeds."""
    if yes:
        return
    if not sys.stdin.isatty():
        if destructive:
            raise fail(f"{question} Add -y to confirm when not running interactively.")
        return
    if not typer.confirm(question, default=True):
        raise typer.Exit(1)


def _detached_hint(cluster: str, job_id: int) -> str:
    return (f"Job {job_id} keeps running on cluster {cluster}. Follow it: spz logs {cluster} {job_id}; "
            f"cancel it: spz cancel {cluster} {job_id}")


async def _stream(bus: Any, cluster: str, job_id: int, status: Any, out: Any) -> int:
    from .clusterlog import EXIT_NOT_FOUND, exit_code_of
    from .jobwatch import stream_job

    job = await stream_job(bus, cluster, job_id, print_line=out, status=status.update)
    status.stop()
    if job is None:
        status.note(f"[red]Job {job_id} not found on cluster {cluster}.[/red]")
        return EXIT_NOT_FOUND
    _report_job(status, cluster, job)
    return exit_code_of(job.status)


def _report_job(status: Any, cluster: str, job: Any) -> None:
    if job.status == "SUCCEEDED":
        status.note(f"[green]✓ Job {job.job_id} on {cluster} succeeded.[/green]")
    elif job.status == "CANCELLED":
        status.note(f"[yellow]Job {job.job_id} on {cluster} was cancelled.[/yellow]")
    elif job.terminal:
        status.note(f"[red]✗ Job {job.job_id} on {cluster}: {job.status}"
                    + (f" — {job.reason}" if job.reason else "") + "[/red]")
    else:
        status.note(f"Job {job.job_id} on {cluster}: {job.status}")


async def _watched(coro: Any, service: str = "provisioner") -> Any:
    """Run `coro`, failing early when the embedded control plane it waits on has stopped, or
    when the services process (or `service`) keeps failing: a command never waits out its
    timeout on a control plane that cannot answer it."""
    import asyncio

    from .control import ControlPlane
    from .jobwatch import SubmissionFailed

    plane = ControlPlane(stage())

    async def watchdog() -> None:
        while True:
            await asyncio.sleep(3.0)
            st = await asyncio.to_thread(plane.status)
            if st["mode"] != "embedded":
                continue
            if not st["running"]:
                from .lostplane import stopped

                raise stopped(f"the control plane stopped; see spz api logs, or {plane.logs_dir / 'services.log'}")
            why = await asyncio.to_thread(plane.failing, service)
            if why:
                raise SubmissionFailed(f"{why}\nThe request is in the event log and is served once it runs again.")

    main = asyncio.ensure_future(coro)
    dog = asyncio.ensure_future(watchdog())
    try:
        done, _ = await asyncio.wait([main, dog], return_when=asyncio.FIRST_COMPLETED)
        if main in done:
            return main.result()
        main.cancel()
        await asyncio.gather(main, return_exceptions=True)
        return dog.result()
    finally:
        dog.cancel()
        main.cancel()


def _config() -> Any:
    from skypurza.events.config import ConfigError, load_config

    try:
        return load_config()
    except ConfigError as exc:
        raise fail(str(exc))


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
    from .submit import setup_changed

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
        nodes = task.num_nodes or 1
        if existing.status == "STOPPED":
            # As sky launch does: a stopped cluster is started again, in the same place.
            status.note(f"Cluster {cluster} is stopped: starting it.")
            await bus.publish(StartRequested(cluster=cluster))
            await _watched(_wait_started(bus, existing, status))
        if existing.status in ("UP", "INIT"):  # INIT: a node was lost; the cluster still takes jobs
            if nodes > existing.num_nodes:
                raise fail(f"the task needs {nodes} nodes; cluster {cluster} has {existing.num_nodes}")
            last = existing.last_setup()
            run_setup = not no_setup and (last is None or setup_changed(task.setup, last.setup))
            job, _ = await queue_job(bus, cluster=cluster, task_id=task_id, task=public, name=task.name,
                                     user=cfg.user, run_setup=run_setup,
                                     secrets_key=task_id if secret_values else None,
                                     down_after=down and idle is None)
            # After the job is queued, so that the cluster is not idle in between. `--down` alone
            # on a cluster that has an autostop interval becomes "down as soon as idle".
            if idle is not None or (down and existing.idle_minutes is not None):
                await bus.publish(AutostopSet(cluster=cluster, idle_minutes=idle if idle is not None else 0,
                                              down=down))
            status.note(f"Cluster {cluster} is up: job {job.job_id} queued "
                        f"({'setup runs again' if run_setup else 'setup unchanged, skipped'}).")
            job_id = job.job_id
        else:
            ack = await bus.publish(TaskSubmitted(
                task_id=task_id, cluster=cluster, task=public, num_nodes=nodes, user=cfg.user,
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

    from .clusterlog import read_cluster
    from .control import connect_bus

    bus = await connect_bus(stage(), "exec")
    try:
        c = await read_cluster(bus, cluster)
        if c.status not in ("UP", "INIT"):  # INIT: a node was lost; the cluster still takes jobs
            what = "does not exist" if c.status in (None, "TERMINATED") else f"is {c.status}"
            raise fail(f"cluster {cluster} {what}" + (f": spz start {cluster}" if c.status == "STOPPED" else
                                                       "; launch it with spz launch -c " + cluster))
        nodes = task.num_nodes or 1
        if nodes > c.num_nodes:
            raise fail(f"the task needs {nodes} nodes; cluster {cluster} has {c.num_nodes}")
        if task.resources is not None and task.resources.infra:
            wanted = str(task.resources.infra).split("/")[0].lower()
            if wanted not in ("*", (c.infra or "").lower()):
                raise fail(f"the task asks for infra {task.resources.infra}; cluster {cluster} is on {c.infra}")
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


# -------------------------------------------------------------------------------------------- logs

def logs_command(
    cluster: str = typer.Argument(..., callback=bounds.cluster_argument, help="The cluster."),
    job_id: Optional[int] = typer.Argument(None, parser=bounds.JOB_ID, help="The job (default: the cluster's latest)."),
    follow: bool = typer.Option(True, "--follow/--no-follow", help="Follow until the job ends, or print what there is."),
    status_only: bool = typer.Option(False, "--status", help="Print the job's status and exit with it: 0 succeeded, "
                                                            "100 failed, 101 not finished, 102 not found, 103 cancelled."),
    tail: int = typer.Option(0, "--tail", parser=bounds.TAIL_LINES, help="Only the last N lines of what was already printed (0: all)."),
    timestamps: bool = typer.Option(False, "--timestamps", help="Prefix each line with when it was printed."),
) -> None:
    """Print a job's output (every node, prefixed by rank when there are several).

    Works after the job ended and after the control plane restarted: output is kept in the logs stream (30 days). Ctrl-C stops following; the job keeps running.
    """
    from .progress import StatusLine, echo_out

    status = StatusLine()
    try:
        code = run_async(_logs(cluster, job_id, follow, status_only, tail, timestamps, status, echo_out))
    except KeyboardInterrupt:
        status.stop()
        status.note("\nStopped following (Ctrl-C); the job keeps running.")
        raise typer.Exit(130)
    finally:
        status.stop()
    raise typer.Exit(code)


async def _logs(cluster: str, job_id: int | None, follow: bool, status_only: bool, tail: int, timestamps: bool,
                status: Any, out: Any) -> int:
    from .clusterlog import EXIT_NOT_FOUND, exit_code_of, read_cluster
    from .control import connect_bus
    from .jobwatch import stream_job

    bus = await connect_bus(stage(), "logs")
    try:
        c = await read_cluster(bus, cluster)
        if not c.jobs and c.status is None:
            status.note(f"[red]No cluster named {cluster}.[/red]")
            return EXIT_NOT_FOUND
        if job_id is None:
            last = c.last_job()
            if last is None:
                status.note(f"Cluster {cluster} has no jobs yet.")
                return EXIT_NOT_FOUND
            job_id = last.job_id
        job = c.jobs.get(job_id)
        if status_only:
            out(f"Job {job_id}: {job.status if job else 'NOT FOUND'}")
            return exit_code_of(job.status if job else None)
        if job is None:
            status.note(f"[red]Job {job_id} not found on cluster {cluster}.[/red]")
            return EXIT_NOT_FOUND
        done = await stream_job(bus, cluster, job_id, print_line=out, follow=follow, tail=tail,
                                timestamps=timestamps, status=status.update if follow else None)
        status.stop()
        if done is not None and done.terminal and follow:
            _report_job(status, cluster, done)
        return exit_code_of(done.status) if done is not None and (follow or done.terminal) else 0
    finally:
        await bus.close()


# ----------------------------------------------------------------------------------- status, queue

def _fmt_price(micros: Any) -> str:
    return "-" if micros in (None, 0) else f"${int(micros) / 1e6:.3f}"


def cluster_row(d: dict[str, Any]) -> dict[str, Any]:
    """One cluster in `status -o json` form, from a ledger row or the log's fold (both give the
    price per node as `hourly_price_micros`); `hourly_price` is the whole cluster's, in dollars."""
    nodes = int(d.get("num_nodes") or 0)
    node_micros = d.get("hourly_price_micros")
    total = int(node_micros) * max(nodes, 1) if node_micros is not None else None
    return {
        "name": d.get("name") or d.get("cluster"),
        "status": d.get("status"),
        "infra": d.get("infra"),
        "region": d.get("region"),
        "zone": d.get("zone"),
        "instance_type": d.get("instance_type"),
        "num_nodes": nodes,
        "accelerators": d.get("accelerators"),
        "use_spot": bool(d.get("use_spot") or d.get("market") == "spot"),
        "hourly_price": total / 1_000_000 if total is not None else None,
        "hourly_price_micros": total,
        "node_hourly_price_micros": int(node_micros) if node_micros is not None else None,
        "launched_at": d.get("launched_at"),
        "user": d.get("user"),
        "autostop": d.get("autostop", d.get("autostop_minutes")),
        "autodown": bool(d.get("autodown", d.get("autostop_down", False))),
    }


def job_row(d: dict[str, Any]) -> dict[str, Any]:
    """One job in `queue -o json` form (SkyPilot's status names: SETTING_UP, not the SETUP of
    ledger files written before the one fold)."""
    from skypurza.events.fold import LEGACY_JOB_STATUS

    out = dict(d)
    if out.get("status") in LEGACY_JOB_STATUS:
        out["status"] = LEGACY_JOB_STATUS[out["status"]]
    return out


async def _ledger(bus: Any, query: str, **params: Any) -> Any | None:
    """The ledger's answer, up to date with the log as it is now; None when no ledger answers
    (then the caller reads the log itself)."""
    from skypurza.events import ledger_queries

    try:
        seq = await bus.last_seq()
        return await getattr(ledger_queries, query)(bus, min_seq=seq, **params)
    except Exception:
        return None


async def _clusters_from_log(bus: Any, include_terminated: bool) -> list[Any]:
    from .clusterlog import cluster_names, read_cluster

    out = []
    for n in await cluster_names(bus):
        c = await read_cluster(bus, n)
        if c.status in ("UP", "STOPPED", "INIT") or (include_terminated and c.status):
            out.append(c)
    return out


def status_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Only these clusters (glob patterns allowed)."),
    all_: bool = typer.Option(False, "-a", "--all", help="Also show terminated clusters."),
    output: str = typer.Option("table", "-o", "--output", help="table or json (a list of clusters)."),
    refresh: bool = typer.Option(False, "-r", "--refresh", help="Reconcile first: list what the clouds hold with this "
                                 "stage's tags, report orphans (instances no live cluster owns, recorded as OrphanFound "
                                 "events) and clusters whose instances vanished; then read the event log itself "
                                 "instead of the ledger's projection."),
    terminate_orphans: bool = typer.Option(False, "--terminate-orphans", help="With --refresh: also terminate the "
                                           "orphans found (only this stage's; other stages are never touched)."),
) -> None:
    """Show clusters: status, where they run, what they cost per hour, autostop."""
    check_output(output)
    if terminate_orphans and not refresh:
        raise typer.BadParameter("--terminate-orphans goes with --refresh", param_hint="--terminate-orphans")
    report: dict[str, Any] | None = None
    if refresh:
        from .cmd_provision import refresh_command

        report = refresh_command(terminate_orphans=terminate_orphans)
        _print_reconcile(report, to_stderr=output == "json")

    async def run() -> list[dict[str, Any]]:
        from .control import connect_bus

        bus = await connect_bus(stage(), "status")
        try:
            rows = None if refresh else await _ledger(bus, "status", all=all_)
            if rows is None:
                rows = [c.as_dict() for c in await _clusters_from_log(bus, all_)]
            return [cluster_row(r) for r in rows]
        finally:
            await bus.close()

    rows = run_async(run())
    if not all_:
        rows = [r for r in rows if r["status"] != "TERMINATED"]
    if clusters:
        rows = [r for r in rows if any(fnmatch.fnmatchcase(r["name"] or "", p) for p in clusters)]
    if output == "json":
        print_json(rows)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not rows:
        console.print("No existing clusters.")
        return
    now = datetime.now(timezone.utc)
    from .jobwatch import since

    table = Table(box=None, header_style="bold")
    for col in ("NAME", "LAUNCHED", "INFRA", "RESOURCES", "STATUS", "AUTOSTOP", "$/HOUR"):
        table.add_column(col)
    for r in rows:
        where = "/".join(str(p) for p in (r["infra"], r["region"], r["zone"]) if p)
        acc = ", ".join(f"{k}:{v:g}" for k, v in (r["accelerators"] or {}).items()) if isinstance(r["accelerators"], dict) else ""
        res = f"{r['num_nodes']}x {r['instance_type'] or r['infra'] or ''}" + (f" ({acc})" if acc else "") + (
            " [spot]" if r["use_spot"] else "")
        launched = datetime.fromisoformat(str(r["launched_at"]).replace("Z", "+00:00")) if r["launched_at"] else None
        auto = "-" if r["autostop"] is None else f"{r['autostop']}m" + (" (down)" if r["autodown"] else "")
        table.add_row(r["name"], since(launched, now), where, res, r["status"] or "-", auto,
                      _fmt_price(r["hourly_price_micros"]))
    console.print(table)


def _print_reconcile(report: dict[str, Any], to_stderr: bool) -> None:
    """What reconciliation found, in words (on stderr when stdout is JSON for a script)."""
    from rich.console import Console

    console = Console(highlight=False, stderr=to_stderr)
    checked = ", ".join(f"{infra} ({', '.join(regions) or 'all regions'})" for infra, regions in
                        (report.get("checked") or {}).items()) or "nothing"
    console.print(f"Reconciled with: {checked}.")
    for o in report.get("orphans") or []:
        what = "terminated" if o.get("terminated") else "reported"
        console.print(f"[yellow]Orphan[/yellow] {o.get('instance_id')} ({o.get('instance_type') or '?'}, "
                      f"{o.get('region') or '?'}, tag cluster={o.get('cluster') or '-'}): {what}."
                      + ("" if o.get("terminated") else " Terminate with: spz status --refresh --terminate-orphans"))
    for cluster, ids in (report.get("vanished") or {}).items():
        console.print(f"[yellow]Vanished[/yellow]: cluster {cluster} lost {', '.join(ids)}.")
    for infra, message in (report.get("errors") or {}).items():
        console.print(f"[red]Could not check {infra}[/red]: {message}")


def queue_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Clusters to show (default: every existing cluster)."),
    skip_finished: bool = typer.Option(False, "-s", "--skip-finished", help="Only pending and running jobs."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Show the job queue of clusters: each job's id, name, user, times and status."""
    check_output(output)

    async def run() -> list[dict[str, Any]]:
        from .clusterlog import read_cluster
        from .control import connect_bus

        bus = await connect_bus(stage(), "queue")
        try:
            names = list(clusters or [])
            for n in names:
                c = await read_cluster(bus, n)
                if c.status is None and not c.jobs:
                    raise fail(f"no cluster named {n}")
            if not names:
                names = [c.name for c in await _clusters_from_log(bus, False)]
            if not names:
                return []
            rows = await _ledger(bus, "queue", clusters=names)
            if rows is None:
                rows = []
                for n in names:
                    c = await read_cluster(bus, n)
                    rows += [{"cluster": n, **j.as_dict()} for j in sorted(c.jobs.values(), key=lambda j: -j.job_id)]
            return [job_row(r) for r in rows]
        finally:
            await bus.close()

    rows = run_async(run())
    if skip_finished:
        from .clusterlog import TERMINAL_JOB

        rows = [r for r in rows if r.get("status") not in TERMINAL_JOB]
    if output == "json":
        print_json(rows)
        return
    from rich.console import Console
    from rich.table import Table

    from .jobwatch import duration, since

    now = datetime.now(timezone.utc)

    def t(v: Any) -> datetime | None:
        return datetime.fromisoformat(str(v).replace("Z", "+00:00")) if v else None

    console = Console(highlight=False)
    by_cluster: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_cluster.setdefault(r["cluster"], []).append(r)
    if not by_cluster:
        console.print("No jobs.")
    for cname, jobs in by_cluster.items():
        console.print(f"[bold]Job queue of cluster {cname}[/bold]")
        table = Table(box=None, header_style="bold")
        for col in ("ID", "NAME", "USER", "SUBMITTED", "STARTED", "DURATION", "NODES", "STATUS"):
            table.add_column(col)
        for r in sorted(jobs, key=lambda r: -int(r.get("job_id") or 0)):
            table.add_row(str(r.get("job_id")), r.get("name") or "-", r.get("user") or "-",
                          since(t(r.get("submitted_at")), now), since(t(r.get("started_at")), now),
                          duration(t(r.get("started_at")), t(r.get("ended_at")), now), str(r.get("num_nodes") or 1),
                          str(r.get("status")))
        console.print(table)


# ------------------------------------------------------------------------------------------ cancel

def cancel_command(
    cluster: str = typer.Argument(..., callback=bounds.cluster_argument, help="The cluster."),
    job_ids: Optional[list[int]] = typer.Argument(None, parser=bounds.JOB_ID, help="Jobs to cancel (default: the latest unfinished one)."),
    all_: bool = typer.Option(False, "-a", "--all", help="Cancel every unfinished job on the cluster."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    async_: bool = typer.Option(False, "--async", help="Do not wait for the jobs to stop."),
) -> None:
    """Cancel jobs: their whole process groups get SIGTERM, then SIGKILL after a grace period."""
    if all_ and job_ids:
        raise fail("give job ids or --all, not both")

    async def run() -> int:
        from skypurza.events.job_events import CancelRequested

        from .clusterlog import read_cluster
        from .control import connect_bus
        from .jobwatch import merged_follow

        bus = await connect_bus(stage(), "cancel")
        try:
            c = await read_cluster(bus, cluster)
            if c.status is None and not c.jobs:
                raise fail(f"no cluster named {cluster}")
            open_jobs = [j for j in c.jobs.values() if not j.terminal]
            if all_:
                targets = open_jobs
            elif job_ids:
                missing = [j for j in job_ids if j not in c.jobs]
                if missing:
                    raise fail(f"no job {', '.join(map(str, missing))} on cluster {cluster}")
                done = [j for j in job_ids if c.jobs[j].terminal]
                for j in done:
                    typer.echo(f"Job {j} already ended ({c.jobs[j].status}).")
                targets = [c.jobs[j] for j in job_ids if not c.jobs[j].terminal]
            else:
                running = [j for j in open_jobs if j.status != "PENDING"] or open_jobs
                targets = running[-1:]
            if not targets:
                typer.echo(f"No unfinished jobs to cancel on cluster {cluster}.")
                return 0
            ids = [j.job_id for j in targets]
            _confirm(f"Cancel job(s) {', '.join(map(str, ids))} on cluster {cluster}?", yes or bool(job_ids))
            cfg = _config()
            for j in ids:
                await bus.publish(CancelRequested(cluster=cluster, job_id=j, requested_by=cfg.user))
            if async_:
                typer.echo(f"Cancellation of job(s) {', '.join(map(str, ids))} requested.")
                return 0
            from skypurza.events import naming
            import asyncio

            pending = set(ids)
            results: dict[int, str] = {}

            async def watch() -> None:
                from .clusterlog import apply

                async for s in merged_follow(bus, [naming.aggregate_subjects(bus.stage, "cluster", cluster)],
                                             c.last_seq + 1):
                    if s.event is None or s.envelope is None:
                        continue
                    apply(c, s.event, s.envelope.time)
                    for j in list(pending):
                        if c.jobs[j].terminal:
                            results[j] = c.jobs[j].status
                            pending.discard(j)
                    if not pending:
                        return

            try:
                await asyncio.wait_for(watch(), WAIT_S)
            except asyncio.TimeoutError:
                pass
            for j in ids:
                typer.echo(f"Job {j}: {results.get(j, 'cancellation requested, not confirmed yet')}")
            return 0 if not pending else 1
        finally:
            await bus.close()

    raise typer.Exit(run_async(run()))


# --------------------------------------------------------------------------- stop, start, down

async def _resolve(bus: Any, patterns: list[str], all_: bool, states: tuple[str, ...],
                   launching: bool = False) -> list[Any]:
    """The clusters named (globs allowed) or all, in `states`. With `launching`, clusters whose
    launch is still in flight (INIT: placed, not yet up) count too — `down` must reach them, or
    a launch racing `spz down -a` would leave a cluster running that nobody asked for."""
    from .clusterlog import read_cluster

    known = await _clusters_from_log(bus, False)
    if launching:
        known += [c for c in await _launching_clusters(bus) if c.name not in {k.name for k in known}]
    if all_:
        return [c for c in known if c.status in states]
    chosen: list[Any] = []
    for p in patterns:
        if any(ch in p for ch in "*?["):
            matched = [c for c in known if fnmatch.fnmatchcase(c.name, p)]
            if not matched:
                raise fail(f"no cluster matches {p!r}")
            chosen += [c for c in matched if c not in chosen]
        else:
            c = next((k for k in known if k.name == p and k.status == "INIT"), None) or await read_cluster(bus, p)
            if c.status not in ("UP", "STOPPED", "INIT"):
                raise fail(f"no cluster named {p}" + (" (it was terminated)" if c.status == "TERMINATED" else ""))
            chosen.append(c)
    return chosen


async def _launching_clusters(bus: Any) -> list[Any]:
    """Clusters the ledger shows INIT that the log has not seen come up (a launch in flight)."""
    from .clusterlog import read_cluster

    rows = await _ledger(bus, "status", all=False) or []
    out = []
    for row in rows:
        if row.get("status") != "INIT" or not row.get("name"):
            continue
        c = await read_cluster(bus, row["name"])
        if c.status not in ("UP", "STOPPED"):
            c.status = "INIT"
            out.append(c)
    return out


def _lifecycle(verb: str, clusters: list[str], all_: bool, yes: bool, async_: bool,
               timeout: float = WAIT_S) -> None:
    if not clusters and not all_:
        raise fail(f"name the cluster(s) to {verb}, or use -a for all")

    async def run() -> int:
        import asyncio

        from skypurza.events import naming
        from skypurza.events.cluster_events import DownRequested, StartRequested, StopRequested

        from .clusterlog import apply
        from .control import connect_bus
        from .jobwatch import merged_follow
        from .progress import StatusLine
        from .jobwatch import SubmissionFailed
        from .requestwatch import first_dead_letter

        bus = await connect_bus(stage(), verb)
        try:
            states = {"stop": ("UP", "INIT"), "start": ("STOPPED",), "down": ("UP", "STOPPED", "INIT")}[verb]
            targets = await _resolve(bus, clusters, all_, ("UP", "STOPPED", "INIT"), launching=verb == "down")
            skipped = [c for c in targets if c.status not in states]
            for c in skipped:
                typer.echo(f"Cluster {c.name} is already {c.status}.")
            targets = [c for c in targets if c.status in states]
            if not targets:
                return 0
            names = ", ".join(c.name for c in targets)
            what = {"stop": "Stop", "start": "Start", "down": "Tear down"}[verb]
            _confirm(f"{what} cluster(s) {names}?", yes or verb == "start")
            cfg = _config()
            request_seq: dict[int, str] = {}  # stream sequence of each request -> its cluster
            for c in targets:
                if verb == "stop":
                    if c.use_spot:
                        raise fail(f"cluster {c.name} runs on spot instances, which cannot be stopped: spz down {c.name}")
                    ev: Any = StopRequested(cluster=c.name)
                elif verb == "start":
                    ev = StartRequested(cluster=c.name)
                else:
                    ev = DownRequested(cluster=c.name, reason="user", requested_by=cfg.user)
                ack = await bus.publish(ev)
                request_seq[ack.seq] = c.name
            if async_:
                typer.echo(f"{what} requested for {names}.")
                return 0
            goal = {"stop": "STOPPED", "start": "UP", "down": "TERMINATED"}[verb]
            pending = {c.name: c for c in targets}
            status = StatusLine()
            status.update(f"{what} {names}: waiting for the provisioner")
            # `start` waits for ClusterStarted, not for the UP the cluster had before it stopped.
            seen_started: set[str] = set()
            failed: dict[str, str] = {}  # cluster -> why its request failed
            warnings: dict[str, list[str]] = {}  # cluster -> resources its teardown could not release

            async def watch(c: Any) -> None:
                async for s in merged_follow(bus, [naming.aggregate_subjects(bus.stage, "cluster", c.name)],
                                             c.last_seq + 1):
                    if s.event is None or s.envelope is None:
                        continue
                    apply(c, s.event, s.envelope.time)
                    if s.event.EVENT_NAME == "cluster_started":
                        seen_started.add(c.name)
                    if s.event.EVENT_NAME == "cleanup_failed":
                        e = s.event
                        warnings.setdefault(c.name, []).append(
                            f"{e.resource_type} {e.resource} in {e.region}: {e.code}: {e.message}")
                    if c.status == goal and (verb != "start" or c.name in seen_started):
                        status.note(f"Cluster {c.name}: {goal}.")
                        pending.pop(c.name, None)
                        return

            async def dead_letters(watchers: dict[str, asyncio.Task[None]]) -> None:
                # A request the provisioner gave up on (parked with its error) ends that cluster's wait.
                while set(request_seq.values()) & (set(pending) - set(failed)):
                    seqs = [q for q, n in request_seq.items() if n in pending and n not in failed]
                    letter = await first_dead_letter(bus, seqs=seqs)
                    name = request_seq[letter.stream_seq]
                    failed[name] = letter.reason()
                    pending.pop(name, None)
                    watchers[name].cancel()

            watchers = {c.name: asyncio.ensure_future(watch(c)) for c in targets}
            parked = asyncio.ensure_future(dead_letters(watchers))
            try:
                await _watched(asyncio.wait(list(watchers.values()), timeout=timeout))
            except SubmissionFailed as exc:
                status.stop()
                typer.echo(f"{what} of {names} not confirmed: {exc}", err=True)
                return 1
            finally:
                status.stop()
                for t in [*watchers.values(), parked]:
                    t.cancel()
                await asyncio.gather(*watchers.values(), parked, return_exceptions=True)
            for n, why in failed.items():
                typer.echo(f"Cluster {n}: {what.lower()} failed: {why}", err=True)
            for n in pending:
                typer.echo(f"Cluster {n}: {what.lower()} requested, not confirmed within {timeout:.0f}s "
                           "(see spz status and spz events dlq).", err=True)
            for n, lines in warnings.items():
                for line in lines:
                    typer.echo(f"Cluster {n}: warning: not released: {line} (retried in the background)", err=True)
            if failed or pending:
                return 1
            return EXIT_CLEANUP_INCOMPLETE if warnings else 0
        finally:
            await bus.close()

    raise typer.Exit(run_async(run()))


def stop_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Clusters to stop (glob patterns allowed)."),
    all_: bool = typer.Option(False, "-a", "--all", help="Stop every running cluster."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    async_: bool = typer.Option(False, "--async", help="Do not wait until they are stopped."),
    timeout: float = typer.Option(WAIT_S, "--timeout", min=1, max=86400,
                                  help="Seconds to wait for the provisioner's confirmation (exit 1 after)."),
) -> None:
    """Stop clusters: nodes (and running jobs) stop, disks and homes are kept; spz start resumes."""
    _lifecycle("stop", clusters or [], all_, yes, async_, timeout)


def start_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Clusters to start (glob patterns allowed)."),
    all_: bool = typer.Option(False, "-a", "--all", help="Start every stopped cluster."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    async_: bool = typer.Option(False, "--async", help="Do not wait until they are up."),
    timeout: float = typer.Option(WAIT_S, "--timeout", min=1, max=86400,
                                  help="Seconds to wait for the provisioner's confirmation (exit 1 after)."),
) -> None:
    """Start stopped clusters again, in the same place."""
    _lifecycle("start", clusters or [], all_, yes, async_, timeout)


def down_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Clusters to tear down (glob patterns allowed)."),
    all_: bool = typer.Option(False, "-a", "--all", help="Tear down every cluster."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    async_: bool = typer.Option(False, "--async", help="Do not wait until they are gone."),
    timeout: float = typer.Option(WAIT_S, "--timeout", min=1, max=86400,
                                  help="Seconds to wait for the provisioner's confirmation (exit 1 after)."),
) -> None:
    """Tear clusters down: every node is terminated and its disk (or local home) deleted; billing stops.

    Exit status: 0 gone; 1 a teardown failed or was not confirmed in time (the reason is printed);
    3 gone, but a security group, key pair or placement group is not released yet (retried in the background)."""
    _lifecycle("down", clusters or [], all_, yes, async_, timeout)


# ---------------------------------------------------------------------------------------- autostop

def autostop_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Clusters (glob patterns allowed)."),
    idle_minutes: Optional[int] = typer.Option(None, "-i", "--idle-minutes", parser=bounds.IDLE_MINUTES, help="Idle minutes before stopping."),
    down: bool = typer.Option(False, "--down", help="Tear down instead of stopping."),
    cancel: bool = typer.Option(False, "--cancel", help="Turn autostop off."),
    all_: bool = typer.Option(False, "-a", "--all", help="Every running cluster."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
) -> None:
    """Stop (or, with --down, tear down) a cluster after it has been idle for -i minutes.

    Idle means no job pending or running. The head node's agent measures it, so it works with your laptop closed. Setting autostop restarts the idle timer.

    Examples:

      spz autostop mycluster -i 30

      spz autostop mycluster -i 0 --down

      spz autostop mycluster --cancel
    """
    if cancel and idle_minutes is not None:
        raise fail("give -i MINUTES or --cancel, not both")
    if not cancel and idle_minutes is None:
        raise fail("give -i MINUTES (or --cancel to turn autostop off)")
    if idle_minutes is not None and idle_minutes < 0:
        raise fail(f"-i must be 0 or more minutes, found {idle_minutes}")
    if not clusters and not all_:
        raise fail("name the cluster(s), or use -a for all")

    async def run() -> int:
        from skypurza.events.cluster_events import AutostopSet

        from .control import connect_bus

        bus = await connect_bus(stage(), "autostop")
        try:
            targets = await _resolve(bus, clusters or [], all_, ("UP",))
            for c in targets:
                await bus.publish(AutostopSet(cluster=c.name, idle_minutes=None if cancel else idle_minutes,
                                              down=down))
                if cancel:
                    typer.echo(f"Autostop of {c.name}: off.")
                else:
                    typer.echo(f"Autostop of {c.name}: {'tear down' if down else 'stop'} after {idle_minutes} idle "
                               f"minute(s).")
            return 0
        finally:
            await bus.close()

    raise typer.Exit(run_async(run()))


# ---------------------------------------------------------------------------------------- register

def register(app: typer.Typer) -> None:
    """Add the cluster verbs to the spz app."""
    app.command("launch")(launch_command)
    app.command("exec")(exec_command)
    app.command("status")(status_command)
    app.command("queue")(queue_command)
    app.command("logs")(logs_command)
    app.command("cancel")(cancel_command)
    app.command("stop")(stop_command)
    app.command("start")(start_command)
    app.command("down")(down_command)
    app.command("autostop")(autostop_command)
