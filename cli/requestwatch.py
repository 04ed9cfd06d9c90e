"""Watching a request for its failure, so that a waiting command never waits for ever.

A command that published a request (DownRequested, StopRequested, StartRequested, a task's
TaskSubmitted) waits for the event that says it worked. It must also see the request fail:

- a service that could not handle the request (or an event the request caused, such as the
  task's PlacementChosen) retries it and then parks it on the dead-letter stream with the
  error. `first_dead_letter` follows that stream and returns the dead letter that names the
  request (by the stream sequence of the parked event, or by its subject);
- the failure events of the request's own aggregate (ProvisionFailed, PlacementFailed: see
  jobwatch.py; CleanupFailed warnings for `spz down`: see cmd_lifecycle.py);
- and time: every wait has a bound (`--timeout`, a documented default).

`unless_parked` runs any waiting coroutine and ends it with `failure(reason)` as soon as a
matching dead letter appears. A lost control plane is a separate watch (cli/lostplane.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from skypurza.events import deadletters, naming
from skypurza.events.aiotasks import stop_tasks

T = TypeVar("T")


@dataclass(frozen=True)
class DeadLetter:
    service: str
    error: str
    stream_seq: int  # where the parked event sits in the event log
    subject: str  # the parked event's subject

    @property
    def event_name(self) -> str:
        return self.subject.rsplit(".", 1)[-1] if self.subject else "event"

    def reason(self) -> str:
        return f"the {self.service or 'a'} service gave up on the {self.event_name} (parked): {self.error}"


def _letter(msg: Any) -> DeadLetter:
    h = msg.headers or {}
    try:
        seq = int(h.get(deadletters.H_SEQ, "0"))
    except ValueError:
        seq = 0
    return DeadLetter(service=str(h.get(deadletters.H_SERVICE, "") or ""), error=str(h.get(deadletters.H_ERROR, "") or ""),
                      stream_seq=seq, subject=str(h.get(deadletters.H_SUBJECT, "") or ""))


def subject_prefix(stage: str, aggregate: str, key: str) -> str:
    """The subject prefix every event of one aggregate shares (`...evt.<aggregate>.<key>.`)."""
    return naming.aggregate_subjects(stage, aggregate, key).rstrip(">")


async def first_dead_letter(bus: Any, *, seqs: Collection[int] = (), prefixes: Collection[str] = (),
                            min_seq: int = 0) -> DeadLetter:
    """Wait for a dead letter of one of the events at `seqs`, or of an event at `min_seq` or later
    on a subject starting with one of `prefixes`. Dead letters are rare: the stream is read
    from its start, so one parked before the watch began is seen too."""
    wanted = set(seqs)
    async for msg in bus.follow(stream=bus.dlq_stream, filter_subject=f"{naming.subject_prefix(bus.stage)}.dlq.>",
                                start_seq=1):
        letter = _letter(msg)
        if letter.stream_seq in wanted:
            return letter
        if letter.stream_seq >= min_seq and any(letter.subject.startswith(p) for p in prefixes):
            return letter
    raise asyncio.CancelledError  # pragma: no cover - follow only ends when the bus is closed


async def unless_parked(bus: Any, coro: Coroutine[Any, Any, T], *, failure: Callable[[str], Exception],
                        seqs: Collection[int] = (), prefixes: Collection[str] = (), min_seq: int = 0) -> T:
    """Run `coro`; if a matching dead letter appears first, cancel it and raise `failure(reason)`."""
    main = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(first_dead_letter(bus, seqs=seqs, prefixes=prefixes, min_seq=min_seq))
    try:
        done, _ = await asyncio.wait([main, watch], return_when=asyncio.FIRST_COMPLETED)
        if main in done:
            return main.result()
        letter = watch.result()
        raise failure(letter.reason())
    finally:
        await stop_tasks(main, watch)
