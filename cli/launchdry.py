"""`spz launch --dryrun` once its flags are parsed: load the task, check its autostop flags, print
where it would run (cli/dryrun.py).

Parsed by typer (cli/cmd_launch.py) or, in a cold process whose arguments are only `--dryrun`,
`-o` and the entrypoint, by cli/fastpath.py: this module imports no typer (an error line does,
through cli/context.py, when there is one to print). There, a plain task (`plain_dryrun`) is
placed without the pydantic models too.
"""

from __future__ import annotations

from typing import Any


def idle_and_wait_for(task: Any, idle_minutes: int | None, wait_for: str | None) -> tuple[int | None, str | None]:
    """-i (else the task's resources.autostop) and --wait-for (else the task's autostop.wait_for);
    --wait-for without an idle interval is a usage error."""
    autostop = task.autostop()
    enabled = autostop is not None and autostop.enabled
    idle = idle_minutes if idle_minutes is not None else (autostop.idle_minutes if enabled else None)
    wait_for = wait_for or (getattr(autostop, "wait_for", None) if enabled else None)
    if wait_for is not None and idle is None:
        from .context import fail

        raise fail("--wait-for goes with -i/--idle-minutes-to-autostop (or the task's resources.autostop)", 2)
    return idle, wait_for


def plain_dryrun(entrypoint: list[str], output: str) -> int | None:
    """`spz launch --dryrun FILE` with no other flag, for a task the plain loader vouches for
    (events/taskspec/plaintask.py): no pydantic model is made. None: nothing done, run
    `launch_dryrun` (the models load the task and report what is wrong with it)."""
    from skypurza.events.taskspec.plaintask import load_plain

    task = load_plain(entrypoint)
    if task is None:
        return None
    from .dryrun import dryrun_command

    return dryrun_command(task, None, output)


def launch_dryrun(entrypoint: list[str], overrides: Any, output: str, idle_minutes: int | None = None,
                  wait_for: str | None = None) -> int:
    """The exit code of `spz launch --dryrun` (typer.Exit, from cli/context.py `fail`, on a bad task)."""
    from .submit import SubmitError, load_task

    try:
        task = load_task(entrypoint, overrides)
    except SubmitError as exc:
        from .context import fail

        raise fail(str(exc), exc.code)
    idle_and_wait_for(task, idle_minutes, wait_for)
    try:
        from .dryrun import dryrun_command
    except ImportError:
        from .context import fail

        raise fail("--dryrun is not available in this build")
    return dryrun_command(task, None, output)
