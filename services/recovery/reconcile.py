"""Reconciliation: every unfinished managed job looked at again, at start and every
`reconcile_s`, so a crash between a transition and its effects (a teardown or a launch not yet
asked for) is repaired, and a job left PENDING (or with a cancel not yet acted on) is kicked.

`due` is the pure part (which job gets which look, at a given `now`); `Reconciler` is the loop,
with the service's two actions and its clock injected (`kick`: decide on machine.Kick;
`realize`: see the state's effects through).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Awaitable, Callable, Iterable, Literal

from skypurza.events.clock import SYSTEM_CLOCK, Clock

from .machine import JobState

log = logging.getLogger("skypurza.recovery")

Look = Literal["kick", "realize"]


@dataclass(frozen=True)
class Due:
    job_id: int
    look: Look


def due(jobs: Iterable[JobState], now: datetime, recheck_ended_s: float, include_recently_ended: bool) -> list[Due]:
    """The jobs to look at: every unfinished one, and (at start) those ended less than
    `recheck_ended_s` ago, whose teardowns may not all have been asked for before a crash."""
    out = []
    for state in jobs:
        recent = (include_recently_ended and state.ended_at is not None
                  and (now - state.ended_at).total_seconds() < recheck_ended_s)
        if state.terminal and not recent:
            continue
        out.append(Due(state.job_id, "kick" if state.status == "PENDING" or state.cancel_requested else "realize"))
    return out


class Reconciler:
    def __init__(self, jobs: Callable[[], Iterable[JobState]], kick: Callable[[int], Awaitable[None]],
                 realize: Callable[[int], Awaitable[None]], *, period_s: float, recheck_ended_s: float,
                 clock: Clock = SYSTEM_CLOCK):
        self._jobs = jobs
        self._kick = kick
        self._realize = realize
        self.period_s = period_s
        self.recheck_ended_s = recheck_ended_s
        self._clock = clock

    async def once(self, include_recently_ended: bool = False) -> list[Due]:
        looked = due(list(self._jobs()), self._clock.now(), self.recheck_ended_s, include_recently_ended)
        for d in looked:
            try:
                await (self._kick if d.look == "kick" else self._realize)(d.job_id)
            except asyncio.CancelledError:
                raise
            except Exception:  # one job's trouble must not keep the others from being repaired
                log.exception("reconciling job %s failed", d.job_id)
        return looked

    async def run(self) -> None:
        await self.once(include_recently_ended=True)
        while True:
            await asyncio.sleep(self.period_s)
            try:
                await self.once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reconciliation failed")
