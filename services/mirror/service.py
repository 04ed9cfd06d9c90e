"""The mirror: job events republished as CloudEvents on the public subjects (docs/events.md).

A service of its own, not a part of the API server: the API server keeps no state and runs as
several replicas, each of which would republish every event; the mirror is one durable consumer
(replicas share it), so each event goes out once, and its user on the secured bus may publish
the public subjects and nothing else (events/natsauth.py). Outsiders hold the `public` user:
subscribe to `naming.public_filter(stage)`, nothing more.

Delivery to outsiders is core NATS (live, at most once to whoever is subscribed); the
`sequence` extension and (`source`, `id`) let them order and de-duplicate.
"""

from __future__ import annotations

from collections import OrderedDict

from skypurza.events.bus import Stored
from skypurza.events.contract import BusAccess, InOrder, Reactions, ServiceContract, handles
from skypurza.events.job_events import JobCancelled, JobFailed, JobQueued, JobStarted, JobSucceeded
from skypurza.events.principal import principal_of
from skypurza.events.service import EmitContext
from skypurza.events.task_events import TaskSubmitted

from .cloudevent import CONTENT_TYPE, encode, public_subject_of, to_cloudevent

JOB_EVENTS = (JobQueued, JobStarted, JobSucceeded, JobFailed, JobCancelled)
MAX_OWNERS = 10_000  # clusters whose owner is remembered (bounded: the oldest is forgotten)

CONTRACT = ServiceContract(
    name="mirror",
    consumes=(TaskSubmitted, *JOB_EVENTS),
    emits=(),
    delivery=InOrder(),
    bus=BusAccess(public="write"),
    consume_notes={TaskSubmitted: "republished on the public subjects (CloudEvents); its stamp is the owner of "
                                  "the cluster's job events",
                   JobQueued: "republished (CloudEvents)", JobStarted: "republished (CloudEvents)",
                   JobSucceeded: "republished (CloudEvents)", JobFailed: "republished (CloudEvents)",
                   JobCancelled: "republished (CloudEvents)"},
)


class MirrorService:
    contract = CONTRACT

    def __init__(self) -> None:
        self._owners: OrderedDict[str, tuple[str, str | None]] = OrderedDict()

    async def start(self, bus: object) -> None:
        return None

    async def close(self) -> None:
        return None

    def _remember(self, cluster: str, owner: tuple[str, str | None]) -> None:
        self._owners[cluster] = owner
        self._owners.move_to_end(cluster)
        while len(self._owners) > MAX_OWNERS:
            self._owners.popitem(last=False)

    async def _republish(self, stored: Stored, ctx: EmitContext, owner: tuple[str, str | None] | None) -> None:
        env = stored.envelope
        assert env is not None  # the runner hands handlers decoded events only
        body = encode(to_cloudevent(env, stored.seq, owner))
        await ctx.bus.nc.publish(public_subject_of(ctx.bus.stage, env), body, headers={"Content-Type": CONTENT_TYPE})

    @handles(TaskSubmitted)
    async def on_task(self, stored: Stored, ctx: EmitContext) -> Reactions:
        ev = stored.event
        assert isinstance(ev, TaskSubmitted)
        owner = principal_of(stored.envelope, ev)
        self._remember(ev.cluster, owner)
        await self._republish(stored, ctx, owner)
        return []

    @handles(*JOB_EVENTS)
    async def on_job(self, stored: Stored, ctx: EmitContext) -> Reactions:
        ev = stored.event
        owner = self._owners.get(getattr(ev, "cluster", ""))
        if owner is None and isinstance(ev, JobQueued) and ev.user:
            owner = (ev.user, None)
        await self._republish(stored, ctx, owner)
        return []
