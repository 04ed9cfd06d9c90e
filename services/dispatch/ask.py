"""A dispatch read, from whoever has it: the dispatch service's answer over the bus, current to
the log's end (events/dispatch_queries.py); without one (no dispatch service runs, or it is
behind), the fold of the log computed here, the same view (reads.py). So `spz dispatch` works
with or without the service and prints the same thing; only the cost differs (one request
against a replay of the whole log)."""

from __future__ import annotations

from typing import Any

from skypurza.events import dispatch_queries
from skypurza.events.bus import Bus
from skypurza.events.clock import SYSTEM_CLOCK, Clock

from . import reads
from .service import load_state


async def from_service(bus: Bus, query: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The service's answer, as fresh as the log is now; None when none answers."""
    try:
        return await dispatch_queries.ask(bus, query, params, min_seq=await bus.last_seq())
    except Exception:  # no responders, a timeout, a service behind or refusing: fold instead
        return None


async def read(bus: Bus, query: str, params: dict[str, Any] | None = None,
               clock: Clock = SYSTEM_CLOCK) -> dict[str, Any]:
    """One of reads.VIEWS, from the service when it answers, else from the fold of the log (which
    raises what the view raises: a bad `algorithm`, say)."""
    answer = await from_service(bus, query, params)
    if answer is not None:
        return answer
    return reads.view(await load_state(bus), query, clock.now(), params)
