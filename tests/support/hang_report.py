"""When a test is about to be killed by pytest-timeout, print what every asyncio task of every
running event loop is waiting on: the timeout's own traceback shows only the main thread asleep
in `select`, which says nothing about which await never returned."""

from __future__ import annotations

import asyncio
import gc
import io
import sys
import threading


def running_loops() -> list[asyncio.AbstractEventLoop]:
    return [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()]


def report() -> str:
    out = io.StringIO()
    for loop in running_loops():
        try:
            tasks = list(asyncio.all_tasks(loop))
        except RuntimeError:  # the set changed under us (another thread's loop): one retry
            tasks = list(asyncio.all_tasks(loop))
        print(f"--- event loop {id(loop):#x}: {len(tasks)} tasks", file=out)
        for task in tasks:
            print(f"task {task.get_name()} ({task.get_coro()!r}):", file=out)
            try:
                task.print_stack(limit=30, file=out)
            except Exception as exc:  # diagnostics never fail the test on their own
                print(f"  (stack not readable: {exc})", file=out)
    return out.getvalue()


def arm(after_s: float) -> threading.Timer:
    def fire() -> None:
        sys.stderr.write("\n=== hang report: the test is still running after %.0f s ===\n%s" % (after_s, report()))
        sys.stderr.flush()

    timer = threading.Timer(after_s, fire)
    timer.daemon = True
    timer.start()
    return timer
