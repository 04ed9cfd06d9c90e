"""Process-wide CLI settings (the global --stage) and small helpers every command uses."""

from __future__ import annotations

import os
import sys
from typing import Any, Coroutine, TypeVar

import typer

T = TypeVar("T")

OUTPUT_FORMATS = ("table", "json")


class _Settings:
    stage: str | None = None


settings = _Settings()


def stage() -> str:
    if settings.stage:
        return settings.stage
    from skypurza.events.config import load_config

    return load_config().stage


def check_output(output: str, accepted: tuple[str, ...] = OUTPUT_FORMATS) -> str:
    if output not in accepted:
        raise typer.BadParameter(f"{output!r}; accepted: {', '.join(accepted)}", param_hint="-o/--output")
    return output


from .jsonout import print_json  # noqa: E402,F401  (in a module of its own: cli/dryrun.py imports no typer)


def fail(message: str, code: int = 1) -> "typer.Exit":
    """`error: <message>` on stderr, never wrapped (a pipe or a CI log gets whole lines) and never
    read as markup (a message may hold `[...]`), and the Exit to raise."""
    return error_line(message, code)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's async part. A control plane lost while it runs (cli/lostplane.py) ends
    the command with one line on stderr and exit code 69, never a hang or a traceback."""
    import asyncio
    from .lostplane import EXIT_LOST_CONTROL_PLANE, LostControlPlane, guarded

    try:
        return asyncio.run(_quiet_loop(guarded(coro)))
    except LostControlPlane as exc:
        raise error_line(str(exc), EXIT_LOST_CONTROL_PLANE)


async def _quiet_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on a loop whose stray errors stay out of the user's terminal: a task of the
    NATS client that failed while a connection was closing (a server killed at that moment)
    would otherwise print its traceback when the loop shuts down. SKYPURZA_DEBUG=1 shows them."""
    import asyncio
    loop = asyncio.get_running_loop()
    if not os.environ.get("SKYPURZA_DEBUG"):
        loop.set_exception_handler(_log_loop_error)
    return await coro


def _log_loop_error(loop: Any, context: dict[str, Any]) -> None:
    import logging

    logging.getLogger("skypurza.cli").debug("event loop: %s (%r)", context.get("message"), context.get("exception"))


def error_line(message: str, code: int) -> "typer.Exit":
    """`error: <message>` on stderr as one line (no markup, no wrapping), and the Exit to raise."""
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]error:[/red] {escape(message)}")
    return typer.Exit(code)
