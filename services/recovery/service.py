"""The recovery service: managed jobs driven through their states, preempted nodes found and
replaced. Part of the control plane: no controller VM, and its state is the event log.

Eats (durable consumer):
    mjob:    ManagedJobSubmitted -> STARTING (first launch), ManagedJobCancelRequested -> CANCELLING
    task:    PlacementFailed -> fallback launch or FAILED_NO_RESOURCE, ProvisionFailed -> FAILED_NO_RESOURCE
    cluster: JobStarted -> RUNNING; JobSucceeded -> next task or SUCCEEDED; JobFailed -> restart or
             FAILED/FAILED_SETUP; SpotPreempted, NodeLost, ClusterTerminated (of the job's current
             cluster) -> RECOVERING on a new cluster; ClusterProvisioned (of a cluster the job no
             longer uses) -> torn down.
Emits: ManagedJobStatusChanged (optimistic concurrency on the job's subject), TaskSubmitted
       (kind="managed", one per launch, id derived from the job and launch number),
       DownRequested (every cluster of the job but the current one; all of them at the end),
       SpotPreempted / NodeLost (from EC2 and heartbeats, with the evidence).
       Declared in `CONTRACT`; the runner refuses anything else. A handler's transitions and
       effects are published inside its optimistic-concurrency retry loop, so they go through
       the handler's `EmitContext` bus (recorded by the runner); the detectors and
       reconciliation loops publish on the service's own bus, checked against the same contract.

This module is the state machine's I/O: the job-state cache, the handlers and the effects. The
loops beside it are modules of their own, wired in `start`: heartbeats.py (silent agents),
instancewatch.py (EC2 polling; ec2watch.py asks, detect.py reads), losses.py (one
SpotPreempted/NodeLost per lost node, for both), reconcile.py (every unfinished job again).
A cluster's job is found from the events (`_job_of_cluster`), never from the cluster's name.
A job group's members are tied by their root job id (`_peers`, kept from every member's
events folded); when the primary tasks have ended, `machine.group_end` says when each other
member is cancelled, and a timer (redone by reconciliation after a restart) acts then.

How a decision is made (`_act`): load the job's state (a fold of its `mjob` events, cached and
checked against the subject's last sequence), `machine.decide(state, fact)`, publish the
transition with `expected_last_seq` = the state's sequence. A second recovery service that
decided from the same state loses the race (ConcurrencyConflict), reloads, and finds the fact
already acted on; the same decision from the same state even derives the same event id.
What a state needs done (`_realize`: tear down old clusters, wait until the lost one is gone,
submit the launch) is checked against the log before each publish, so it is done exactly once
whoever does it, and redone after a crash between the transition and its effects (at start
and every `reconcile_s`).

Time comes from the injected clock (events/clock.py, `clock=`; the system's by default): the
transitions' envelope times (a job's `ended_at`), which ended jobs are still rechecked, the
detectors' `detected_at` and heartbeat silences. The loops' pacing is the event loop's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import replace
from typing import Any

from skypurza.events import deadletters, naming
from skypurza.events.aiotasks import stop_tasks
from skypurza.events.bus import Bus, ConcurrencyConflict, Stored
from skypurza.events.clock import SYSTEM_CLOCK, Clock
from skypurza.events.envelope import Event, derive_id
from skypurza.events.models import (
    ClusterProvisioned,
    ClusterTerminated,
    DownRequested,
    JobCancelled,
    JobFailed,
    JobQueued,
    JobStarted,
    JobSucceeded,
    ManagedJobCancelRequested,
    ManagedJobStatusChanged,
    ManagedJobSubmitted,
    NodeLost,
    PlacementFailed,
    ProvisionFailed,
    SpotPreempted,
    TaskSubmitted,
)
from skypurza.events.contract import BusAccess
from skypurza.events.dispatch_events import TaskPreempted
from skypurza.events.service import EmitContext, Reactions, ServiceContract, handles

from . import buckets, machine
from .ec2watch import Ec2Watch
from .heartbeats import HeartbeatWatch, Node
from .history import history
from .instancewatch import InstanceWatch
from .slurmwatch import SlurmWatch
from .losses import LossReporter
from .reconcile import Reconciler
from .settings import RecoverySettings
from .strategy import LaunchPlan, Placed, recovery_launch

log = logging.getLogger("skypurza.recovery")

_REMEMBER = 10_000  # own transition ids kept to recognise them when they come back

CONTRACT = ServiceContract(
    name="recovery",
    consumes=(ManagedJobSubmitted, ManagedJobCancelRequested, ManagedJobStatusChanged,
              PlacementFailed, ProvisionFailed,
              ClusterProvisioned, ClusterTerminated, JobStarted, JobSucceeded, JobFailed, JobCancelled,
              SpotPreempted, NodeLost, TaskPreempted),
    emits=(ManagedJobStatusChanged, TaskSubmitted, DownRequested, SpotPreempted, NodeLost),
    consume_notes={ManagedJobSubmitted: "runs the pipeline", ManagedJobCancelRequested: "cancels",
                   ManagedJobStatusChanged: "another recovery's decision: sees it through",
                   PlacementFailed: "fallback launch or FAILED_NO_RESOURCE", ProvisionFailed: "FAILED_NO_RESOURCE",
                   ClusterProvisioned: "tears down clusters a job no longer uses",
                   JobSucceeded: "next task or SUCCEEDED", JobFailed: "restarts or FAILED",
                   SpotPreempted: "recovers the managed job", NodeLost: "recovers the managed job",
                   TaskPreempted: "recovers the managed job dispatch preempted (its cluster)",
                   ClusterTerminated: "recovers the managed job"},
    emit_notes={ManagedJobStatusChanged: "with optimistic concurrency on the job",
                TaskSubmitted: "each task of a managed job", DownRequested: "the clusters a job no longer uses",
                SpotPreempted: "EC2 polling", NodeLost: "EC2 polling, heartbeats"},
    # beats: the heartbeat detector (heartbeats.py); secrets: a task's, copied to each launch's
    # cluster (whose agent's bus user reads only its cluster's keys).
    bus=BusAccess(beats="read", secrets="write"),
)


class RecoveryService:
    contract = CONTRACT
    name = CONTRACT.name

    def __init__(self, settings: RecoverySettings | None = None, *, aws_session: Any = None,
                 endpoint_url: str | None = None, bucket_store: str | None = None, clock: Clock = SYSTEM_CLOCK):
        self.settings = settings or RecoverySettings.load()
        self.clock = clock
        self._aws_session = aws_session
        self._endpoint_url = endpoint_url
        self._bucket_store = bucket_store or self.settings.bucket_store
        self._bus: Bus | None = None
        self.jobs: dict[int, machine.JobState] = {}
        self._locks: dict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._placed: dict[str, ClusterProvisioned] = {}
        self._published: dict[str, None] = {}  # ids of the transitions this process published (newest last)
        self._owners: dict[str, int | None] = {}  # cluster -> the managed job its ClusterProvisioned names
        self._tasks: list[asyncio.Task[Any]] = []
        self._heartbeats: HeartbeatWatch | None = None
        self._instances: InstanceWatch | None = None
        self._slurm: InstanceWatch | None = None
        self._parked: set[int] = set()  # seqs of events the state machine could not take
        self._peers: dict[int, dict[int, machine.Peer]] = {}  # job group root id -> task index -> member
        self._group_timers: dict[int, asyncio.Task[None]] = {}  # member -> its pending GroupEnded

    # ------------------------------------------------------------------ Service protocol

    @property
    def bus(self) -> Bus:
        assert self._bus is not None, "start(bus) first"
        return self._bus

    async def start(self, bus: Bus) -> None:
        """Rebuild the jobs from the log, then start the detectors and reconciliation, each a
        loop of its own publishing on `bus` (the runner's, checked against CONTRACT)."""
        self._bus = bus
        await self._rebuild()
        if not self._tasks:
            reporter = LossReporter(bus, service=self.name, clock=self.clock)
            if self.settings.heartbeat_timeout_s > 0:
                self._heartbeats = HeartbeatWatch(bus, reporter, self._watched_nodes,
                                                  timeout_s=self.settings.heartbeat_timeout_s, clock=self.clock)
                await self._heartbeats.start()
                self._tasks.append(asyncio.create_task(self._heartbeats.run(), name="recovery-heartbeats"))
            if self.settings.ec2_poll_s > 0:
                ec2 = Ec2Watch(session=self._aws_session, endpoint_url=self._endpoint_url,
                               missing_polls=self.settings.missing_polls)
                self._instances = InstanceWatch(ec2, reporter, self._provisioned, self._watched,
                                                poll_s=self.settings.ec2_poll_s)
                self._tasks.append(asyncio.create_task(self._instances.run(), name="recovery-ec2"))
            if self.settings.slurm_poll_s > 0:
                self._slurm = InstanceWatch(SlurmWatch(), reporter, self._provisioned, self._watched,
                                            poll_s=self.settings.slurm_poll_s, infra="slurm")
                self._tasks.append(asyncio.create_task(self._slurm.run(), name="recovery-slurm"))
            self._tasks.append(asyncio.create_task(self._reconciler().run(), name="recovery-reconcile"))

    async def close(self) -> None:
        await stop_tasks(*self._tasks, *self._group_timers.values())
        self._tasks.clear()
        self._group_timers.clear()
        if self._heartbeats is not None:
            await self._heartbeats.close()
            self._heartbeats = None
        if self._instances is not None:
            await self._instances.close()
            self._instances = None
        self._slurm = None

    @handles(ManagedJobSubmitted)
    async def on_submitted(self, stored: Stored, ctx: EmitContext) -> Reactions:
        assert isinstance(stored.event, ManagedJobSubmitted)
        await self._act(ctx.bus, stored.event.managed_job_id, machine.Kick(), _cause(stored))
        return []

    @handles(ManagedJobCancelRequested)
    async def on_cancel(self, stored: Stored, ctx: EmitContext) -> Reactions:
        assert isinstance(stored.event, ManagedJobCancelRequested)
        await self._act(ctx.bus, stored.event.managed_job_id, machine.Cancel(), _cause(stored))
        return []

    @handles(ManagedJobStatusChanged)
    async def on_status_changed(self, stored: Stored, ctx: EmitContext) -> Reactions:
        assert isinstance(stored.event, ManagedJobStatusChanged)
        if _cause(stored) not in self._published:  # another recovery service's decision: see it through
            await self._realize(ctx.bus, stored.event.managed_job_id)
        return []

    @handles(PlacementFailed)
    async def on_placement_failed(self, stored: Stored, ctx: EmitContext) -> Reactions:
        ev = stored.event
        assert isinstance(ev, PlacementFailed)
        job = await self._job_of_cluster(ev.cluster, ev.managed_job_id, ev.task_id)
        if job is not None:
            await self._act(ctx.bus, job, machine.PlacementFailedF(ev.cluster, await self._placement_detail(job, ev)),
                            _cause(stored))
        return []

    @handles(ProvisionFailed)
    async def on_provision_failed(self, stored: Stored, ctx: EmitContext) -> Reactions:
        ev = stored.event
        assert isinstance(ev, ProvisionFailed)
        job = await self._job_of_cluster(ev.cluster, task_id=ev.task_id)
        if job is not None:
            await self._act(ctx.bus, job, machine.ProvisionFailedF(ev.cluster, f"{ev.code}: {ev.message}"),
                            _cause(stored))
        return []

    @handles(ClusterProvisioned)
    async def on_provisioned(self, stored: Stored, ctx: EmitContext) -> Reactions:
        ev = stored.event
        assert isinstance(ev, ClusterProvisioned)
        self._remember_owner(ev.cluster, ev.managed_job_id)
        job = await self._job_of_cluster(ev.cluster, ev.managed_job_id)
        if job is not None:
            self._placed[ev.cluster] = ev
            await self._realize(ctx.bus, job)
        return []

    @handles(ClusterTerminated)
    async def on_terminated(self, stored: Stored, ctx: EmitContext) -> Reactions:
        ev = stored.event
        assert isinstance(ev, ClusterTerminated)
        job = await self._job_of_cluster(ev.cluster)
        if job is not None:
            await self._act(ctx.bus, job, machine.TerminatedF(ev.cluster, f"cluster terminated ({ev.reason})"),
                            _cause(stored))
        return []

    @handles(SpotPreempted, NodeLost, TaskPreempted)
    async def on_lost(self, stored: Stored, ctx: EmitContext) -> Reactions:
        ev = stored.event
        assert isinstance(ev, (SpotPreempted, NodeLost, TaskPreempted))
        job = await self._job_of_cluster(ev.cluster)
        if job is not None:
            await self._act(ctx.bus, job, _lost_fact(ev), _cause(stored))
        return []

    @handles(JobStarted, JobSucceeded, JobFailed, JobCancelled)
    async def on_job(self, stored: Stored, ctx: EmitContext) -> Reactions:
        ev = stored.event
        assert isinstance(ev, (JobStarted, JobSucceeded, JobFailed, JobCancelled))
        job = await self._job_of_cluster(ev.cluster)
        if job is not None and await self._is_managed_job(ev.cluster, ev.job_id, job):
            await self._act(ctx.bus, job, await self._job_fact(ev), _cause(stored))
        return []

    # ------------------------------------------------------------------ state

    async def _rebuild(self) -> None:
        """Every managed job's state from the log (the service keeps nothing else)."""
        subject = naming.aggregate_events_subject(self.bus.stage, "mjob")
        if await self.bus.last_event(subject) is None:
            return
        async for s in self.bus.replay(filter_subject=subject):
            ev = s.event
            job_id = getattr(ev, "managed_job_id", None)
            if ev is None or job_id is None:
                continue
            state = await self._fold(self.jobs.get(job_id), s)
            if state is not None:
                self.jobs[job_id] = state
        now = self.clock.now()
        total = len(self.jobs)
        for job_id, state in list(self.jobs.items()):
            if state.terminal and (state.ended_at is None
                                   or (now - state.ended_at).total_seconds() >= self.settings.recheck_ended_s):
                del self.jobs[job_id]  # long ended: kept in the log, not in memory
        log.info("recovery: %d managed job(s) in the log, %d unfinished", total,
                 sum(1 for j in self.jobs.values() if not j.terminal))

    async def load(self, job_id: int) -> machine.JobState | None:
        """The job's state as the log has it now (the cache, brought up to the subject's end)."""
        subject = naming.aggregate_subjects(self.bus.stage, "mjob", str(job_id))
        last = await self.bus.last_event(subject)
        if last is None:
            return None
        state = self.jobs.get(job_id)
        if state is not None and state.last_seq >= last.seq:
            return state
        start = state.last_seq + 1 if state is not None else 1
        async for s in history(self.bus, subject, start):
            if s.event is not None:
                state = await self._fold(state, s)
        if state is not None:
            self.jobs[job_id] = state
        return state

    async def _fold(self, state: machine.JobState | None, s: Stored) -> machine.JobState | None:
        """One event into a job's state. An event the state machine raises on is parked with its
        error and skipped (the state is left as it was: `machine.apply` builds a new one), so one
        bad event can neither stop the rebuild at start nor every later fact of its job."""
        try:
            return self._note_peer(machine.apply(state, s.event, s.seq, s.envelope.time if s.envelope else s.timestamp))
        except Exception as exc:
            if s.seq not in self._parked:
                self._parked.add(s.seq)
                try:
                    await deadletters.park(self.bus, self.name, seq=s.seq, subject=s.subject, raw=s.raw, error=exc)
                except Exception as park_exc:
                    log.error("seq %d could not be parked (%s): %s", s.seq, exc, park_exc)
            if state is not None:
                return replace(state, last_seq=max(state.last_seq, s.seq))
            return None

    async def _act(self, out: Bus, job_id: int, fact: machine.Fact, cause: str = "") -> None:
        """Decide on one fact and publish the transition (with optimistic concurrency) on `out`
        (a handler's context bus, or the service's own from its loops), then see the new state's
        effects through."""
        async with self._locks[job_id]:
            for _ in range(25):
                state = await self.load(job_id)
                if state is None:
                    return
                transition = machine.decide(state, fact)
                if transition is None:
                    break
                event = transition.event(job_id)
                # Same state version + same decision = same id, whoever decides it.
                env = self.bus.envelope(event, id=derive_id(f"mjob:{job_id}:{state.last_seq}", self.name,
                                                            f"{transition.status}|{transition.cluster}"),
                                        time=self.clock.now())
                try:
                    ack = await out.publish(env, expected_last_seq=state.last_seq)
                except ConcurrencyConflict:
                    log.info("job %s changed under us; deciding again", job_id)
                    await asyncio.sleep(0)
                    continue
                self._published[env.id] = None
                while len(self._published) > _REMEMBER:
                    del self._published[next(iter(self._published))]
                log.info("job %s: %s -> %s (%s)", job_id, state.status, transition.status, transition.reason)
                new = machine.apply(state, event, ack.seq, env.time)
                if new is not None and not ack.duplicate:
                    self.jobs[job_id] = new
                break
        await self._realize(out, job_id)

    # ------------------------------------------------------------------ effects

    async def _realize(self, out: Bus, job_id: int) -> None:
        async with self._locks[job_id]:
            state = await self.load(job_id)
            if state is None:
                return
            gone: dict[str, str] = {}
            for cluster in machine.clusters_to_tear_down(state):
                gone[cluster] = await self._ensure_down(out, state, cluster)
            launch = machine.wanted_launch(state)
            if launch is not None:
                waiting = [c for c in state.clusters if c != state.cluster and gone.get(c) == "going"]
                if waiting:
                    log.info("job %s: waiting for %s to be torn down before launching %s", job_id,
                             ", ".join(waiting), launch.cluster)
                else:
                    await self._ensure_launch(out, state, launch)
            done = machine.NothingToCancel(state.cluster)
            cancel_done = (state.status == "CANCELLING" and (state.cluster is None or gone.get(state.cluster) == "absent")
                           and machine.decide(state, done) is not None)
            if state.terminal and all(g in ("gone", "absent") for g in gone.values()):
                self._forget(state)
        if cancel_done:
            await self._act(out, job_id, done)
        await self._watch_group(out, state)

    # ------------------------------------------------------------------ job groups

    def _note_peer(self, state: machine.JobState | None) -> machine.JobState | None:
        if state is not None and state.group is not None:
            members = self._peers.pop(state.group.root_job_id, {})
            members[state.group.index] = machine.peer_of(state)
            self._peers[state.group.root_job_id] = members  # newest last: the oldest group is forgotten first
            while len(self._peers) > _REMEMBER:
                del self._peers[next(iter(self._peers))]
        return state

    async def _watch_group(self, out: Bus, state: machine.JobState) -> None:
        """A primary task that ended may end its group's other members; a member still running
        is ended when its group's primaries are (now, or after the termination delay)."""
        group = state.group
        if group is None:
            return
        self._note_peer(state)
        if not group.primary:
            await self._end_in_group(out, state.job_id)
        elif state.terminal and group.primaries:
            for peer in list(self._peers.get(group.root_job_id, {}).values()):
                if peer.index not in group.primaries and not peer.terminal:
                    await self._end_in_group(out, peer.job_id)

    async def _end_in_group(self, out: Bus, job_id: int) -> None:
        state = await self.load(job_id)
        if state is None or state.group is None or job_id in self._group_timers:
            return
        end = machine.group_end(state, self._peers.get(state.group.root_job_id, {}).values())
        if end is None:
            return
        wait_s = (end.due_at - self.clock.now()).total_seconds()
        if wait_s <= 0:
            await self._act(out, job_id, machine.GroupEnded(end.detail))
            return

        async def later() -> None:
            try:
                await asyncio.sleep(wait_s)
                await self._act(self.bus, job_id, machine.GroupEnded(end.detail))
            except asyncio.CancelledError:
                raise
            except Exception:  # reconciliation tries again
                log.exception("ending job %s of its group failed", job_id)
            finally:
                self._group_timers.pop(job_id, None)

        log.info("job %s: its group's primary tasks ended; cancelling it in %.0f s", job_id, wait_s)
        self._group_timers[job_id] = asyncio.create_task(later(), name=f"recovery-group-end-{job_id}")

    def _forget(self, state: machine.JobState) -> None:
        """An ended job whose clusters are all gone leaves the cache (the log still has it: a
        late event about it loads it again)."""
        self.jobs.pop(state.job_id, None)
        for cluster in state.clusters:
            self._placed.pop(cluster, None)

    async def _ensure_down(self, out: Bus, state: machine.JobState, cluster: str) -> str:
        """'gone' (terminated), 'going' (teardown asked), or 'absent' (never provisioned, so far)."""
        prov = await self._last(cluster, ClusterProvisioned)
        if prov is None:
            return "absent"
        term = await self._last(cluster, ClusterTerminated)
        if term is not None and term.seq > prov.seq:
            return "gone"
        down = await self._last(cluster, DownRequested)
        if down is not None and down.seq > prov.seq:
            return "going"
        assert prov.envelope is not None
        reason = "managed_job_done" if state.terminal or state.status == "CANCELLING" else "recovery"
        env = self.bus.envelope(DownRequested(cluster=cluster, reason=reason, requested_by=f"recovery:job {state.job_id}"),
                                id=derive_id(prov.envelope.id, self.name, "down"), time=self.clock.now())
        await out.publish(env)
        log.info("job %s: tearing down %s (%s)", state.job_id, cluster, reason)
        return "going"

    async def _ensure_launch(self, out: Bus, state: machine.JobState, launch: machine.Launch) -> None:
        task_id = launch.task_id(state.job_id)
        subject = naming.event_subject(self.bus.stage, "task", task_id, TaskSubmitted.EVENT_NAME)
        if await self.bus.last_event(subject) is not None:
            return
        task = state.tasks[launch.task_index]
        plan = LaunchPlan(task)
        if launch.episode in machine.LOSS_WHYS and launch.lost_cluster:
            placed = await self._placement(launch.lost_cluster)
            plan = recovery_launch(task, state.recovery.strategy, placed, launch.phase)
        launched, named = buckets.checkpoint_buckets(plan.task, self.bus.stage, state.job_id)
        for bucket in sorted(set(named.values())):
            await asyncio.to_thread(buckets.ensure_bucket, self.bus.stage, bucket, kind=self._bucket_store)
        secrets_key = f"{state.secrets_key}-{launch.task_index}" if state.secrets_key else None
        if secrets_key and not await self.bus.copy_secrets(secrets_key, launch.cluster):
            secrets_key = None  # this task has none (a pipeline's others may), or they expired
        submitted = TaskSubmitted(
            task_id=task_id, kind="managed", cluster=launch.cluster, task=launched, num_nodes=task.nodes(),
            user=state.user, team=state.team, project=state.project,
            secrets_key=secrets_key, down=False, managed_job_id=state.job_id, task_index=launch.task_index,
            initial_blocks=list(plan.blocks), skypilot_task_id=state.skypilot_task_id(launch.task_index) or None,
            managed_task_ids=list(state.skypilot_task_ids), job_rank=state.job_rank, num_jobs=state.num_jobs,
            job_group=state.group.name if state.group else None,
            root_job_id=state.group.root_job_id if state.group else None,
        )
        await out.publish(self.bus.envelope(submitted, id=derive_id(task_id, self.name, "task_submitted"),
                                            time=self.clock.now()))
        log.info("job %s: launch %d of task %d on %s (%s)", state.job_id, launch.number, launch.task_index,
                 launch.cluster, plan.note or launch.episode)

    # ------------------------------------------------------------------ lookups

    async def _last(self, cluster: str, cls: type[Event]) -> Stored | None:
        return await self.bus.last_event(naming.event_subject(self.bus.stage, "cluster", cluster, cls.EVENT_NAME))

    async def _placement(self, cluster: str) -> Placed | None:
        prov = await self._provisioned(cluster)
        if prov is None:
            return None
        c = prov.candidate
        return Placed(c.infra, c.region, c.zone, c.instance_type, c.use_spot)

    async def _provisioned(self, cluster: str) -> ClusterProvisioned | None:
        prov = self._placed.get(cluster)
        if prov is None:
            found = await self._last(cluster, ClusterProvisioned)
            if found is not None and isinstance(found.event, ClusterProvisioned):
                prov = found.event
                self._placed[cluster] = prov
        return prov

    async def _job_of_cluster(self, cluster: str, hint: int | None = None, task_id: str | None = None) -> int | None:
        """The managed job a cluster belongs to, from what the events say (never from the
        cluster's name): the event's own `managed_job_id`, a cached job that lists the cluster,
        else the job its launch names (`_owner`); the job's own events confirm it."""
        candidates = [hint] if hint is not None else []
        candidates += [j.job_id for j in self.jobs.values() if cluster in j.clusters]
        if not candidates:
            owner = await self._owner(cluster, task_id)
            if owner is None:
                return None
            candidates.append(owner)
        for job_id in dict.fromkeys(candidates):
            state = self.jobs.get(job_id)
            if state is None or cluster not in state.clusters:
                state = await self.load(job_id)
            if state is not None and cluster in state.clusters:
                return job_id
        return None

    async def _owner(self, cluster: str, task_id: str | None) -> int | None:
        """The managed job named by the cluster's last ClusterProvisioned (kept from every one
        this service sees, looked up in the log for those before it started), or, for a launch
        that never came up, by its task's TaskSubmitted."""
        if cluster in self._owners:
            return self._owners[cluster]
        prov = await self._last(cluster, ClusterProvisioned)
        if prov is not None and isinstance(prov.event, ClusterProvisioned):
            self._remember_owner(cluster, prov.event.managed_job_id)
            return prov.event.managed_job_id
        if task_id:
            sub = await self.bus.last_event(naming.event_subject(self.bus.stage, "task", task_id,
                                                                 TaskSubmitted.EVENT_NAME))
            if sub is not None and isinstance(sub.event, TaskSubmitted):
                return sub.event.managed_job_id
        return None

    def _remember_owner(self, cluster: str, job_id: int | None) -> None:
        self._owners.pop(cluster, None)
        self._owners[cluster] = job_id
        while len(self._owners) > _REMEMBER:
            del self._owners[next(iter(self._owners))]

    async def _is_managed_job(self, cluster: str, job_id: int, managed_job_id: int) -> bool:
        """Whether job `job_id` of the cluster is the managed job (not an `spz exec` beside it)."""
        subject = naming.event_subject(self.bus.stage, "cluster", cluster, JobQueued.EVENT_NAME)
        last = await self.bus.last_event(subject)
        if last is not None and isinstance(last.event, JobQueued) and last.event.job_id == job_id:
            return last.event.managed_job_id == managed_job_id
        async for s in history(self.bus, subject):
            if isinstance(s.event, JobQueued) and s.event.job_id == job_id:
                return s.event.managed_job_id == managed_job_id
        return False

    async def _job_fact(self, ev: Event) -> machine.Fact:
        if isinstance(ev, JobStarted):
            return machine.JobStartedF(ev.cluster)
        if isinstance(ev, JobSucceeded):
            return machine.JobSucceededF(ev.cluster)
        if isinstance(ev, JobCancelled):
            return machine.JobCancelledF(ev.cluster)
        assert isinstance(ev, JobFailed)
        # A node that died takes its job with it: look before calling it the user's failure.
        lost = await self._check_cluster_now(ev.cluster)
        if lost is not None:
            return lost
        where = f"on node {ev.failed_rank}"
        detail = ev.reason + (f" {where}" if ev.failed_rank is not None and where not in ev.reason else "")
        return machine.JobFailedF(ev.cluster, ev.phase, ev.exit_code, detail.strip())

    async def _placement_detail(self, job_id: int, ev: PlacementFailed) -> str:
        """The failure's own text (every attempt is listed in it), with the episode's earlier try."""
        text = ev.reason
        state = self.jobs.get(job_id)
        if state is not None and state.phase >= 2 and len(state.clusters) >= 2:
            earlier = machine.launch_task_id(job_id, len(state.clusters) - 1)
            prev = await self.bus.last_event(naming.event_subject(self.bus.stage, "task", earlier,
                                                                  PlacementFailed.EVENT_NAME))
            if prev is not None and isinstance(prev.event, PlacementFailed):
                text = f"{text}\nbefore that, with the recovery strategy's constraints: {prev.event.reason}"
        return text

    # ------------------------------------------------------------------ detectors

    def _watched(self) -> list[str]:
        """The clusters the detectors watch: the current cluster of every active job."""
        return [j.cluster for j in self.jobs.values() if j.status in machine.ACTIVE and j.cluster]

    async def _watched_nodes(self) -> list[Node]:
        nodes: list[Node] = []
        for cluster in self._watched():
            prov = await self._provisioned(cluster)
            if prov is not None:
                nodes += [(cluster, n.rank, n.instance_id) for n in prov.nodes]
        return nodes

    async def check_ec2(self, clusters: list[str]) -> list[Event]:
        """Ask EC2 about these clusters' nodes; publish SpotPreempted/NodeLost for lost ones."""
        return await self._instances.check(clusters) if self._instances is not None else []

    async def check_heartbeats(self) -> list[Event]:
        return await self._heartbeats.check() if self._heartbeats is not None else []

    async def reconcile(self, include_recently_ended: bool = False) -> None:
        """Look at every unfinished job again (reconcile.py)."""
        await self._reconciler().once(include_recently_ended)

    def _reconciler(self) -> Reconciler:
        async def kick(job_id: int) -> None:
            await self._act(self.bus, job_id, machine.Kick())

        async def realize(job_id: int) -> None:
            await self._realize(self.bus, job_id)

        return Reconciler(lambda: list(self.jobs.values()), kick, realize, period_s=self.settings.reconcile_s,
                          recheck_ended_s=self.settings.recheck_ended_s, clock=self.clock)

    async def _check_cluster_now(self, cluster: str) -> machine.LostF | None:
        """EC2's (or Slurm's) word on one cluster right now (after a job failure), as a loss fact or None."""
        if self._instances is None and self._slurm is None:
            return None
        found = []
        for watch in (self._instances, self._slurm):
            if watch is None:
                continue
            try:
                found += await watch.check([cluster])
            except Exception as exc:
                log.warning("cannot check %s with %s: %s", cluster, watch.infra, exc)
        if found:
            return _lost_fact(found[0])  # type: ignore[arg-type]
        prior = await self._last(cluster, SpotPreempted)
        if prior is not None and isinstance(prior.event, SpotPreempted):
            return _lost_fact(prior.event)
        if self._slurm is not None:
            # Slurm's poll may have reported the allocation's end just after the step failed (the
            # NodeLost is behind this JobFailed in the log): a loss of one of the current nodes counts.
            lost = await self._last(cluster, NodeLost)
            prov = await self._provisioned(cluster)
            current = {n.instance_id for n in prov.nodes} if prov is not None and prov.candidate.infra == "slurm" \
                else set()
            if lost is not None and isinstance(lost.event, NodeLost) and lost.event.instance_id in current:
                return _lost_fact(lost.event)
        return None


def _cause(stored: Stored) -> str:
    return stored.envelope.id if stored.envelope else ""


def _lost_fact(ev: SpotPreempted | NodeLost | TaskPreempted) -> machine.LostF:
    if isinstance(ev, TaskPreempted):  # dispatch took the cluster's quota back: a new launch waits for admission
        return machine.LostF(ev.cluster, "preempted", f"dispatch: {ev.reason}")
    e = ev.evidence or {}
    where = f"node {ev.rank}" if ev.rank is not None else "a node"
    if isinstance(ev, SpotPreempted):
        what = e.get("state_reason_code") or "spot interruption"
        return machine.LostF(ev.cluster, "preempted", f"{where} ({ev.instance_id}): {what}")
    why = e.get("state_reason_code") or (f"no heartbeat for {e.get('silent_s')} s" if e.get("source") == "heartbeat"
                                         else e.get("state") or "lost")
    return machine.LostF(ev.cluster, "node_lost", f"{where} ({ev.instance_id}): {why}")
