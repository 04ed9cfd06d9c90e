"""What the cluster verbs share: the task-override options, loading a task, confirmation, the
job-output stream and its last line, the control-plane watchdog, the status service's query with the log as
its fallback. The verbs themselves are cmd_launch.py (launch, exec), cmd_inspect.py (status,
queue, logs, cancel) and cmd_lifecycle.py (stop, start, down, autostop); `spz jobs` uses these too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer


from . import bounds
from .context import fail, stage

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

    job = await stream_job(bus, cluster, job_id, print_line=out, status=status.update,
                           progress=status.update if getattr(status, "live", False) else None)
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
    from skypurza.events.aiotasks import stop_tasks
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
        await stop_tasks(main)
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


# ------------------------------------------------------------------------------- status from the log

async def _status_service(bus: Any, query: str, **params: Any) -> Any | None:
    """The status service's answer, up to date with the log as it is now; None when no status
    service answers (then the caller reads the log itself)."""
    from skypurza.events import status_queries

    try:
        seq = await bus.last_seq()
        return await getattr(status_queries, query)(bus, min_seq=seq, **params)
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
