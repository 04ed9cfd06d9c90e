"""Stopping asyncio tasks that may not stop when asked once.

A cancellation can be lost: Python 3.11's `asyncio.wait_for` (inside nats-py and aiobotocore)
returns the result instead of raising when what it awaits finishes in the same loop turn as
the cancel, so a loop told to stop once may go on for ever (a test teardown waited its whole
300 s timeout on one). `stop_tasks` cancels, waits a little, cancels again what still runs, and
gives up after a bound, logged, so no shutdown — a service's, the agent's, a CLI command's —
waits for ever on a task that missed its cancellation.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("skypurza.tasks")

GRACE_S = 2.0  # how long one cancellation is given before the next
ROUNDS = 5  # cancellations before giving up on a task (it is left running, and logged)


async def stop_tasks(*tasks: "asyncio.Future[Any] | None", grace_s: float = GRACE_S, rounds: int = ROUNDS) -> None:
    """Cancel `tasks` (None ignored) and wait until they have ended, asking again each `grace_s`;
    their results and exceptions are consumed (as `gather(..., return_exceptions=True)` would)."""
    given = [t for t in tasks if t is not None]
    pending = {t for t in given if not t.done()}
    for _ in range(rounds):
        if not pending:
            break
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=grace_s)
    for t in given:
        if t.done() and not t.cancelled():
            t.exception()  # retrieved: no "exception was never retrieved" at exit
    if pending:
        log.warning("%d task(s) did not stop after %d cancellations: %s", len(pending), rounds,
                    ", ".join(sorted(t.get_name() if isinstance(t, asyncio.Task) else repr(t) for t in pending)))
