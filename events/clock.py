"""The one clock of every decision that depends on "now": injected, so a test sets the time.

A `Clock` has two readings:
- `now()`: the wall clock, an aware UTC datetime — what events carry (`terminated_at`,
  `detected_at`, envelope times) and what a decision compares them with (a job ended long
  enough ago, a cleanup retry due, an autostop interval passed, a usage tick due);
- `monotonic()`: seconds that never go back — for intervals measured inside one process
  (a heartbeat's silence, a cache entry's age).

Services take a clock at construction (default `SYSTEM_CLOCK`) and hand it to their loops;
handlers read it from their service or from `EmitContext.clock` (the runner's, which also
stamps the envelopes of returned reactions). Pure deciders never read a clock: `now` is one of
their arguments (recovery's `reconcile.due`, the agent's `decide`, the ledger's `due_usage`,
the provisioner's `cleanup.skip_keys`). `ManualClock` is the tests' clock: it moves only when
told (`advance`, `set`), so a test decides at a given instant instead of sleeping.
`tests/test_clock.py` fails when a decider module reads the time itself, or when any other
module of events/ or services/ does outside the list of I/O places below.

What stays on the loop clock (asyncio) or the system clock directly, on purpose — these bound
waits, they decide nothing a replay or a test must reproduce:
- I/O timeouts and pacing: `asyncio.wait_for`/`asyncio.sleep` between polls, retries and ticks,
  the runner's keep-alive, a launch's or a kill's deadline (provisioner/aws.py, local.py, slurm.py,
  agent/procs.py), nats-server's start wait (events/natsserver.py), the bus's reconnect grace
  (`Bus.disconnected_at`);
- stamps of identity or of storage: a pid file's start time (agent/procs.py, compared with
  /proc), a dead letter's `parked_at`, a log chunk's `ts`, an unreadable message's stand-in
  timestamp, the local backend's node records, a catalog build's date.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, aware, in UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary start that never go back."""
        ...


class SystemClock:
    """The machine's clocks."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK: Clock = SystemClock()

# A fixed, unremarkable instant for tests that need no particular date.
MANUAL_START = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)


class ManualClock:
    """A clock that moves only when told: both readings move together by `advance`."""

    def __init__(self, start: datetime = MANUAL_START, monotonic: float = 1000.0):
        self._now = _utc(start)
        self._mono = float(monotonic)

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> datetime:
        """Move on by `seconds` (never back: a monotonic clock cannot); returns the new now."""
        if seconds < 0:
            raise ValueError("a clock does not go back: advance by a positive number of seconds")
        self._now += timedelta(seconds=seconds)
        self._mono += seconds
        return self._now

    def set(self, when: datetime) -> datetime:
        """Jump to `when` (not before the current time)."""
        return self.advance((_utc(when) - self._now).total_seconds())

    def __repr__(self) -> str:
        return f"ManualClock({self._now.isoformat()}, monotonic={self._mono:g})"


def _utc(when: datetime) -> datetime:
    return when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when.astimezone(timezone.utc)
