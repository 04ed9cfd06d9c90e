"""stop_tasks (events/aiotasks.py): a task that missed its cancellation is asked again, and
nothing waits for ever on one that never stops."""

from __future__ import annotations

import asyncio
import logging

import pytest

from skypurza.events.aiotasks import stop_tasks


async def _deaf_once() -> str:
    """Swallows the first cancellation, as Python 3.11's wait_for does when its wait ends in the
    same turn as the cancel, then stops at the second."""
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        pass
    await asyncio.sleep(3600)
    return "never"


async def _deaf(released: asyncio.Event) -> None:
    while not released.is_set():
        try:
            await released.wait()
        except asyncio.CancelledError:
            continue


def test_a_task_that_missed_its_cancellation_is_cancelled_again() -> None:
    async def main() -> None:
        deaf = asyncio.create_task(_deaf_once())
        polite = asyncio.create_task(asyncio.sleep(3600))
        failed = asyncio.create_task(asyncio.sleep(0))
        await asyncio.sleep(0.01)
        t0 = asyncio.get_running_loop().time()
        await stop_tasks(deaf, polite, None, failed, grace_s=0.2)
        assert deaf.cancelled() and polite.cancelled() and failed.done()
        assert asyncio.get_running_loop().time() - t0 < 1.0

    asyncio.run(main())


def test_a_task_that_never_stops_is_given_up_on_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        released = asyncio.Event()
        stuck = asyncio.create_task(_deaf(released), name="stuck-loop")
        await asyncio.sleep(0.01)
        t0 = asyncio.get_running_loop().time()
        with caplog.at_level(logging.WARNING, logger="skypurza.tasks"):
            await stop_tasks(stuck, grace_s=0.05, rounds=3)
        assert asyncio.get_running_loop().time() - t0 < 1.0
        assert not stuck.done()
        assert "stuck-loop" in caplog.text and "3 cancellations" in caplog.text
        released.set()
        await stuck

    asyncio.run(main())


def test_an_exception_of_a_stopped_task_is_consumed() -> None:
    async def boom() -> None:
        raise RuntimeError("x")

    async def main() -> None:
        t = asyncio.create_task(boom())
        await asyncio.sleep(0.01)
        await stop_tasks(t)
        assert isinstance(t.exception(), RuntimeError)

    asyncio.run(main())
