"""The provisioner service: placements become clusters, lifecycle requests become cloud calls.

Consumes (durable consumer, see events/service.py):
    PlacementChosen  -> launch the gang -> ClusterProvisioned, then job 1 (JobQueued)
                        | CapacityError (capacity, spot_capacity, quota, unsupported, transient)
                        | ProvisionFailed (auth, invalid, unknown)
                        | ClusterTerminated + ProvisionFailed (DownRequested) when a DownRequested
                          for the cluster is newer than the task's submission: never launched
    DownRequested    -> terminate -> [CleanupFailed ...] ClusterTerminated; for a cluster never up
                        (a launch in flight) ClusterTerminated at once
    StopRequested    -> stop -> ClusterStopped         StartRequested -> start -> ClusterStarted
    ClusterIdle      -> stop, or terminate when down (or spot, which cannot stop)

Idempotent under redelivery and restarts:
- The launch token is the PlacementChosen's envelope id; the backend finds nodes launched under
  it instead of launching again (AWS: ClientToken and a tag), and a rolled-back gang remembers
  its failure. Before launching, the log is asked whether this placement already has an outcome.
- Every event published has an id derived from its cause (JetStream drops copies), and the
  first job's JobQueued id is derived from the placement, looked up before queueing.
- Cluster state (backend, region, nodes, stopped or not) is rebuilt from the log for every
  event (state.py), so a restarted provisioner knows everything a running one knew.

What it consumes and may emit is declared in `CONTRACT` (events/contract.py; the runner
refuses anything else). Handlers return their reactions; what must be in the log before the
next step (ClusterProvisioned before job 1 is queued with optimistic concurrency, ClusterTerminated
before the teardown's bookkeeping ends) is published through the handler's `EmitContext`.

Concurrency: launches take minutes, so the service asks its runner (events/service.py) for
`Keyed(concurrency)` delivery, ordered per cluster: one slow launch does not
hold up another task's failover, and a DownRequested still waits for the launch of its own
cluster. Each event is acked only after its reactions are in the log; messages waiting their
turn are kept alive. `ack_wait` bounds how long a dead provisioner's events stay invisible.

Teardown: what ends billing ends the cluster. The nodes are terminated, the cluster's region is
released of unused per-stage resources (bounded by `cleanup_wait_s`; each failure is a
CleanupFailed warning), then ClusterTerminated says when the nodes went. A secondary resource
never holds it up; the background sweep (cleanup.py, every `cleanup_interval_s`, and right after
a teardown) retries what failed and cleans every region the stage touched.

Reconciliation runs every `reconcile_interval_s` (reconcile.py).

Time comes from the injected clock (events/clock.py, `clock=`; the system's by default): the
times the events carry (`launched_at`, `terminated_at`, `stopped_at`, `started_at`), when a
cleanup retry is due and how old an orphan is. Launch polls, back-offs and the loops' pacing
are the event loop's.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from skypurza.events import naming
from skypurza.events.agentusers import REMOTE_INFRAS, AgentUserStore, per_cluster
from skypurza.events.aiotasks import stop_tasks
from skypurza.events.bus import Bus, Stored
from skypurza.events.clock import SYSTEM_CLOCK, Clock
from skypurza.events.envelope import Event, derive_id
from skypurza.events.natscreds import BusCredentials
from skypurza.events.jobqueue import job_queued_subject, queue_job
from skypurza.events.models import CapacityError as CapacityErrorEvent
from skypurza.events.models import (
    CleanupFailed,
    ClusterIdle,
    ClusterProvisioned,
    ClusterStarted,
    ClusterStopped,
    ClusterTerminated,
    DownRequested,
    JobQueued,
    OrphanFound,
    PlacementChosen,
    ProvisionFailed,
    SlurmAllocationAccounted,
    StartRequested,
    StopRequested,
    TaskSubmitted,
)
from skypurza.events.contract import BusAccess
from skypurza.events.identity_events import TeamAdded, TeamRemoved, TeamUpdated
from skypurza.events.provisioner_queries import SERVICE as QUERY_SERVICE
from skypurza.events.service import (Emit, EmitContext, InOrder, Keyed, Reactions, ServiceContract, Unretryable,
                                     handles)
from skypurza.events.slurmpath import slurm_config_path
from skypurza.events.team_credentials import NO_CREDENTIALS, TeamCredentials

from . import cleanup, plan, teamcreds, userdata
from .adapter import (
    CapacityError,
    ClusterRef,
    ComputeBackend,
    FatalProvisionError,
    LaunchSpec,
    NodeInfo,
    ProvisionError,
    TransientProvisionError,
)
from .backends import Backends, CredentialsNotFound, UnsupportedInfra, aws_account, credentials_key
from .reconcile import ReconcileReport, reconcile, refresh_infras
from .settings import ProvisionerSettings
from .state import ClusterState, event_with_id, live_clusters, load_cluster_state, placement_outcome

log = logging.getLogger(__name__)

AGENT_USER_LIVE_S = 20.0  # how long a launch waits for its cluster's new bus user to be live
AGENT_USER_PROBE_S = 0.2

# Delivery and ack wait come from the settings (see `ProvisionerService.contract`).
CONTRACT = ServiceContract(
    name="provisioner",
    consumes=(PlacementChosen, DownRequested, StopRequested, StartRequested, ClusterIdle),
    emits=(ClusterProvisioned, JobQueued, CapacityErrorEvent, ProvisionFailed, ClusterTerminated, CleanupFailed,
           ClusterStopped, ClusterStarted, OrphanFound, SlurmAllocationAccounted),
    reads=(TaskSubmitted, CleanupFailed, TeamAdded, TeamUpdated, TeamRemoved),
    delivery=InOrder(),
    consume_notes={TaskSubmitted: "reads the task", CleanupFailed: "bounded retries with back-off",
                   TeamAdded: "the team's credentials", TeamUpdated: "the team's credentials",
                   TeamRemoved: "the team's credentials",
                   PlacementChosen: "launches", DownRequested: "terminates", StopRequested: "stops",
                   StartRequested: "starts", ClusterIdle: "stop, or terminate with down"},
    emit_notes={JobQueued: "first job", ClusterTerminated: "teardown, reconciliation",
                CleanupFailed: "teardown, background cleanup sweep", OrphanFound: "reconciliation",
                SlurmAllocationAccounted: "a Slurm allocation ended (sacct over SSH), before ClusterTerminated/Stopped; "
                                          "at start, those a dead provisioner had not published"},
    # `reconcile`: a pass now, asked by the API server for `spz status -r` (events/provisioner_queries.py).
    bus=BusAccess(answers=QUERY_SERVICE),
)


def _cluster_of(stored: Stored) -> str:
    return str(getattr(stored.event, "cluster", ""))


def _accounts(backend: ComputeBackend, cluster: str, stage: str) -> list[Emit]:
    """What the backend read of the cluster's ended allocations (Slurm's sacct), to publish."""
    take = getattr(backend, "take_accounts", None)
    if take is None:
        return []
    return [Emit(ev, id=accounted_id(stage, ev)) for ev in take(cluster)]


def accounted_id(stage: str, ev: SlurmAllocationAccounted) -> str:
    """One id per allocation, whichever handler (or restart) publishes it: a repeat is a duplicate."""
    return derive_id(f"{stage}/slurm/{ev.slurm_cluster}/{ev.slurm_job_id}", CONTRACT.name, "slurm-accounted")


class ProvisionerService:
    name = CONTRACT.name

    def __init__(self, settings: ProvisionerSettings | None = None,
                 backends: Mapping[str, ComputeBackend] | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.settings = settings or ProvisionerSettings.load()
        self.clock = clock
        # Read by ServiceRunner: handlers at once (ordered per cluster) and the ack wait.
        self.contract = replace(CONTRACT, delivery=Keyed(max(1, self.settings.concurrency), _cluster_of),
                                ack_wait_s=self.settings.ack_wait_s)
        self._overrides = dict(backends or {})
        self._bus: Bus | None = None
        self._backends: Backends | None = None
        self._launching: set[str] = set()  # clusters this process is launching right now
        self._terminating: set[str] = set()  # clusters this process is tearing down right now
        self._tearing_down_in: Counter[str] = Counter()  # their regions: a teardown releases those itself
        self._reconciler: asyncio.Task[None] | None = None
        self._cleaner: asyncio.Task[None] | None = None
        self._settler: asyncio.Task[None] | None = None
        self._sweep_soon = asyncio.Event()
        self._sweep_lock = asyncio.Lock()  # one sweep at a time: each reads the attempts from the log
        self._touched = cleanup.TouchedRegions()
        # A deployment's per-cluster agent users (events/agentusers.py); None: the shared agent user.
        self._agent_users: AgentUserStore | None = None
        self._minted: dict[str, float] = {}  # cluster -> when this process minted its user
        self._agent_sync: asyncio.Task[None] | None = None
        self._queries: list[Any] = []  # the request-reply subscriptions (the `reconcile` query)

    # ------------------------------------------------------------------ Service protocol

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        self._backends = Backends(self.settings, stage=bus.stage, nats_url=_url_of(bus), overrides=self._overrides)
        if self.settings.reconcile_interval_s > 0 and self._reconciler is None:
            self._reconciler = asyncio.create_task(self._reconcile_loop(), name="provisioner-reconcile")
        if self.settings.cleanup_interval_s > 0 and self._cleaner is None:
            self._cleaner = asyncio.create_task(self._cleanup_loop(), name="provisioner-cleanup")
        if self._settler is None:
            self._settler = asyncio.create_task(self._settle_accounts(), name="provisioner-slurm-accounts")
        if per_cluster(os.environ) and self._agent_users is None:
            self._agent_users = AgentUserStore(bus.stage)
            # After a crash: the users of the clusters the log says are up, and no others.
            self._agent_sync = asyncio.create_task(self.sync_agent_users(), name="provisioner-agent-users")
        if not self._queries:
            self._queries = await bus.serve_queries(QUERY_SERVICE, {"reconcile": self._answer_reconcile})

    async def _publish_accounts(self, publish: Callable[[Emit], Awaitable[Any]], backend: ComputeBackend,
                                cluster: str) -> None:
        emits = _accounts(backend, cluster, self.bus.stage)
        for emit in emits:
            await publish(emit)
        forget = getattr(backend, "forget_accounts", None)
        if emits and forget is not None:
            forget([e.event for e in emits])

    async def _settle_accounts(self) -> None:
        """Once at start: publish what a provisioner that died before publishing it had read of
        ended Slurm allocations, and account those it had begun to end (their records say so)."""
        if not self.backends.has("slurm") and not slurm_config_path().exists():
            return  # no Slurm here: nothing was ever accounted
        try:
            backend = self.backends.get("slurm")
            settle = getattr(backend, "settle_accounts", None)
            events = await settle() if settle is not None else []
            for ev in events:
                await self.bus.publish(self.bus.envelope(ev, id=accounted_id(self.bus.stage, ev)))
            if events:
                log.info("published %d Slurm accounting(s) left by an earlier provisioner", len(events))
                backend.forget_accounts(events)  # type: ignore[attr-defined]
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never a blocker of the start: the next start tries again
            log.warning("settling Slurm accountings failed: %s", exc)

    async def close(self) -> None:
        for sub in self._queries:
            try:
                await sub.unsubscribe()
            except Exception:  # the connection is already gone: nothing left to answer on
                pass
        self._queries = []
        await stop_tasks(self._reconciler, self._cleaner, self._settler, self._agent_sync)
        self._reconciler = self._cleaner = self._settler = self._agent_sync = None
        if self._backends is not None:
            await self._backends.close()

    @property
    def bus(self) -> Bus:
        assert self._bus is not None, "start(bus) first"
        return self._bus

    @property
    def backends(self) -> Backends:
        assert self._backends is not None, "start(bus) first"
        return self._backends

    # ------------------------------------------------------------------ launch

    @handles(PlacementChosen)
    async def on_placement(self, stored: Stored, ctx: EmitContext) -> Reactions:
        assert stored.envelope is not None and isinstance(stored.event, PlacementChosen)
        pc = stored.event
        placement_id = stored.envelope.id
        outcome = await placement_outcome(self.bus, task_id=pc.task_id, cluster=pc.cluster, placement_id=placement_id)
        if outcome.failed is not None:
            return []  # already answered (a redelivery)
        submitted = await self._submitted(pc.task_id)
        if outcome.provisioned is not None:
            if submitted is not None:
                await self._queue_first_job(ctx, placement_id, pc.cluster, submitted)
            return []
        if submitted is None:
            return [plan.provision_failed(pc, placement_id, "TaskNotFound",
                                          f"no TaskSubmitted for task {pc.task_id} in the log")]
        state = await load_cluster_state(self.bus, pc.cluster)
        if state.live:
            # Two launches raced for one name (the CLI queues directly on clusters that are up):
            # the task runs on the cluster that exists.
            log.info("cluster %s is already up; queueing task %s on it", pc.cluster, pc.task_id)
            await self._queue_first_job(ctx, placement_id, pc.cluster, submitted)
            return []
        down_seq = await self._down_after_submission(pc)
        if down_seq:
            # `spz down` (or `down -a`) came while the task was still being placed: launching now
            # would leave a cluster nobody wants, running and billed. The cluster ends here.
            log.info("cluster %s: down requested before it came up; task %s not launched", pc.cluster, pc.task_id)
            failed = plan.provision_failed(pc, placement_id, "DownRequested",
                                           f"spz down was requested for cluster {pc.cluster} before it came up; "
                                           "it was not launched")
            if state.terminated_seq > state.provisioned_seq and state.terminated_seq > down_seq:
                return [failed]  # the down was already answered with the cluster's end
            return [ClusterTerminated(cluster=pc.cluster, terminated_at=self.clock.now(),
                                      reason="down requested before launch", instance_ids=[]), failed]
        if (refusal := self._no_agent_bus(pc.candidate.infra)) is not None:
            # Launching would start machines whose agents can never join: refused before any cost.
            reason, why = refusal
            log.warning("launch of %s refused: %s", pc.cluster, why)
            return [plan.provision_failed(pc, placement_id, reason, why, error_class="auth")]
        try:
            creds = await self._team_credentials(pc.candidate.infra, submitted.team)
            backend = self.backends.get(pc.candidate.infra, creds, team=submitted.team or "")
        except UnsupportedInfra as exc:
            return [plan.provision_failed(pc, placement_id, "UnsupportedInfra", str(exc))]
        except CredentialsNotFound as exc:
            # Not a capacity error: another place of the same team needs the same profile.
            log.warning("launch of %s refused: %s", pc.cluster, exc)
            return [plan.provision_failed(pc, placement_id, "CredentialsNotFound", str(exc), error_class="auth")]
        self._launching.add(pc.cluster)  # before its bus user is minted (sync_agent_users keeps it)
        try:
            spec = plan.with_team_credentials(await self._launch_spec(stored, pc, placement_id, submitted), creds)
            result = await self._launch(backend, spec, pc, placement_id)
        finally:
            self._launching.discard(pc.cluster)
        # An earlier allocation under this name that the launch ended (or found ended) is billed.
        await self._publish_accounts(ctx.publish, backend, pc.cluster)
        if isinstance(result, Event):
            log.warning("launch of %s (attempt %d, %s) failed: %s", pc.cluster, pc.attempt,
                        pc.candidate.label(), getattr(result, "code", ""))
            self._drop_agent_user(pc.cluster)  # no node of this launch runs (the cluster is not up)
            return [result]
        provisioned = plan.provisioned_event(placement=pc, placement_id=placement_id, submitted=submitted,
                                             nodes=result, launched_at=self.clock.now())
        # In the log before job 1 is queued (the agents read the cluster before its jobs).
        await ctx.publish(provisioned)
        await self._queue_first_job(ctx, placement_id, pc.cluster, submitted)
        return []

    async def _launch_spec(self, stored: Stored, pc: PlacementChosen, placement_id: str,
                           submitted: TaskSubmitted) -> LaunchSpec:
        request = plan.matching_request(plan.requests_of(submitted.task), pc.candidate)
        job_id = await self._planned_job_id(pc.cluster, placement_id)
        user_data = None
        labels: dict[str, str] = {}
        creds = await self._mint_agent_user(pc, placement_id)
        if pc.candidate.infra == "aws":
            agent = plan.agent_spec(nats_url=self.settings.agent_nats_url or _url_of(self.bus), stage=self.bus.stage,
                                    placement=pc, start_seq=stored.seq)
            user_data = userdata.render(agent, install=self.settings.node_install, credentials=creds)
        else:
            # Backends that start agents themselves (local) read where to start from here.
            labels[plan.START_SEQ] = str(stored.seq)
        spec = plan.launch_spec(stage=self.bus.stage, placement=pc, placement_id=placement_id, submitted=submitted,
                                request=request, job_id=job_id, user_data=user_data, labels=labels)
        if creds is not None and pc.candidate.infra != "aws":
            spec = replace(spec, bus_credentials=creds)
        return plan.with_backend_options(spec, submitted)

    # ------------------------------------------------------------------ per-cluster agent users

    def _no_agent_bus(self, infra: str) -> tuple[str, str] | None:
        """Why a remote cluster's agents could not join this bus (a reason code and a sentence),
        or None. On a secured bus (this process connects as a user) a remote node's agent needs a
        bus user of its own, which only a deployment that mints them gives (SKYPURZA_AGENT_BUS_USERS:
        `spz api start --deploy`, compose); the CDK app does not yet. And it needs an address it can
        reach: where the deployment says one is required (compose, whose nodes' names resolve only
        inside it), SKYPURZA_AGENT_NATS_URL. Local and Slurm agents use the shared agent user."""
        if infra not in REMOTE_INFRAS:
            return None
        if self.bus.user and self._agent_users is None:
            return ("NoAgentBusUser",
                    f"this deployment gives a {infra} cluster's node agents no bus user, so they could not join its "
                    "secured bus (the AWS CDK app does not mint per-cluster agent users yet); launch on local or "
                    "slurm, or run the control plane with compose or `spz api start --deploy --bus-host ... "
                    "--bus-advertise ...` (docs/team.md, Node agents on remote machines)")
        if self.settings.agent_nats_url_required and not self.settings.agent_nats_url:
            return ("NoAgentBusAddress",
                    f"this deployment has no bus address a {infra} cluster's node agents can reach: set "
                    "SKYPURZA_AGENT_NATS_URL to the NATS nodes' client addresses as those machines reach them "
                    "(nats://HOST:4222,nats://HOST:4223,nats://HOST:4224 for compose, with SKYPURZA_BUS_BIND "
                    "publishing the ports there) and restart the provisioner (docs/team.md, A compose "
                    "deployment's bus)")
        return None

    async def _mint_agent_user(self, pc: PlacementChosen, placement_id: str) -> BusCredentials | None:
        """In a deployment, a remote cluster's own bus user: minted (its hash on disk; the
        supervisor reloads nats-server) and waited for until it is live, so the nodes' agents
        never meet a server that does not know them yet. None: the shared agent user."""
        store = self._agent_users
        if store is None or pc.candidate.infra not in REMOTE_INFRAS:
            return None
        creds = await asyncio.to_thread(store.mint, pc.cluster, placement_id, pc.task_id)
        self._minted[pc.cluster] = self.clock.monotonic()
        await self._await_live(pc.cluster, creds)
        return creds

    async def _await_live(self, cluster: str, creds: BusCredentials) -> None:
        """Until every server of the bus takes the new password: an agent may reach any of them,
        and each node of a cluster reloads its own block (cli/busnode.py)."""
        waiting = [u for u in _url_of(self.bus).split(",") if u]
        for _ in range(int(AGENT_USER_LIVE_S / AGENT_USER_PROBE_S)):  # bounded by tries, not a clock
            for url in list(waiting):
                try:
                    probe = await Bus.connect(url, self.bus.stage, ensure=False, credentials=creds,
                                              source=f"/{naming.PROJECT}/{self.bus.stage}/provisioner",
                                              max_reconnect_attempts=0, connect_timeout=2.0)
                    await probe.close()
                    waiting.remove(url)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    pass
            if not waiting:
                return
            await asyncio.sleep(AGENT_USER_PROBE_S)
        # Agents that meet a refusal exit and are restarted (systemd); the launch goes on.
        log.warning("cluster %s: its bus user is not live on %s after %.0f s (is nats-server being reloaded?)",
                    cluster, ", ".join(waiting), AGENT_USER_LIVE_S)

    def _drop_agent_user(self, cluster: str) -> None:
        if self._agent_users is not None and self._agent_users.remove(cluster):
            self._minted.pop(cluster, None)
            log.info("cluster %s: its bus user removed", cluster)

    async def sync_agent_users(self) -> None:
        """The per-cluster users made what the log says: one per remote cluster that is up (its
        password derived again, events/agentusers.py), a launch with no outcome yet kept, every
        other removed. Run at start (a crash between minting and reloading, or a teardown whose
        user was not removed) and after each reconciliation (clusters it ended)."""
        store = self._agent_users
        if store is None:
            return
        started = self.clock.monotonic()
        try:
            live = await live_clusters(self.bus)
            up = {c: ev.placement_id for c, ev in live.items() if ev.candidate.infra in REMOTE_INFRAS}
            pending: set[str] = set()
            for cluster, user in store.users().items():
                if cluster in up or not user.task_id:
                    continue
                outcome = await placement_outcome(self.bus, task_id=user.task_id, cluster=cluster,
                                                  placement_id=user.placement_id)
                if outcome.failed is None and outcome.provisioned is None:
                    pending.add(cluster)  # redelivered: its launch goes on with this password
            # Read at the moment the files are: a launch begun since the log was read is kept.
            recent = {c for c, t in self._minted.items() if t >= started}
            done = await asyncio.to_thread(store.retain, up, pending | recent | set(self._launching))
        except asyncio.CancelledError:
            raise
        except Exception:  # the next reconciliation tries again; a stale user grants only its cluster
            log.exception("syncing the per-cluster bus users failed")
            return
        if done.mint or done.remove:
            log.info("bus users: %d re-derived, %d removed", len(done.mint), len(done.remove))

    async def _launch(self, backend: ComputeBackend, spec: LaunchSpec, pc: PlacementChosen,
                      placement_id: str) -> list[NodeInfo] | Event:
        """The gang's nodes, or the event that reports why there are none."""
        attempts = max(1, self.settings.transient_attempts)
        last: ProvisionError | None = None
        for attempt in range(attempts):
            try:
                return await backend.launch(spec)
            except (CapacityError, FatalProvisionError) as err:
                return plan.failure_event(err, pc, placement_id)
            except TransientProvisionError as err:
                # Same token: the next try adopts whatever this one left running.
                last = err
                log.warning("launch %s: transient failure (try %d of %d): %s", spec.launch_token, attempt + 1,
                            attempts, err)
                if attempt + 1 < attempts:
                    await asyncio.sleep(self.settings.transient_backoff_s * 2 ** attempt)
            except ProvisionError as err:
                return plan.failure_event(err, pc, placement_id)
            except Exception as exc:  # a bug or an unexpected answer: end the task visibly
                log.exception("launch %s failed unexpectedly", spec.launch_token)
                await self._clean_up(backend, spec)
                return plan.provision_failed(pc, placement_id, type(exc).__name__, str(exc))
        assert last is not None
        await self._clean_up(backend, spec)
        return plan.failure_event(last, pc, placement_id)

    async def _clean_up(self, backend: ComputeBackend, spec: LaunchSpec) -> None:
        """Terminate what a given-up launch left (the cluster is not live, so all of it)."""
        try:
            await backend.terminate(ClusterRef(stage=spec.stage, cluster=spec.cluster, region=spec.region,
                                               zone=spec.zone, infra=spec.infra))
        except Exception:
            log.exception("cleaning up after launch %s failed; reconciliation will find the nodes", spec.launch_token)

    async def _down_after_submission(self, pc: PlacementChosen) -> int:
        """The stream seq of the cluster's newest DownRequested when it is newer than the task's
        submission (the launch was cancelled before it started), else 0."""
        down = await self.bus.last_event(naming.event_subject(self.bus.stage, "cluster", pc.cluster,
                                                              DownRequested.EVENT_NAME))
        if down is None:
            return 0
        submitted = await self.bus.last_event(naming.event_subject(self.bus.stage, "task", pc.task_id,
                                                                   TaskSubmitted.EVENT_NAME))
        return down.seq if submitted is not None and down.seq > submitted.seq else 0

    async def _submitted(self, task_id: str) -> TaskSubmitted | None:
        found = await self.bus.last_event(naming.event_subject(self.bus.stage, "task", task_id,
                                                               TaskSubmitted.EVENT_NAME))
        return found.event if found is not None and isinstance(found.event, TaskSubmitted) else None

    def _job_event_id(self, placement_id: str) -> str:
        return derive_id(placement_id, self.name, "job")

    async def _planned_job_id(self, cluster: str, placement_id: str) -> int:
        """The id job 1 of this placement gets (tagged on the nodes before it is queued)."""
        subject = job_queued_subject(self.bus.stage, cluster)
        mine = await event_with_id(self.bus, subject, self._job_event_id(placement_id))
        if mine is not None and mine.event is not None:
            return int(mine.event.job_id)  # type: ignore[attr-defined]
        last = await self.bus.last_event(subject)
        return int(last.event.job_id) + 1 if last is not None and last.event is not None else 1  # type: ignore[attr-defined]

    async def _queue_first_job(self, ctx: EmitContext, placement_id: str, cluster: str,
                               submitted: TaskSubmitted) -> None:
        event_id = self._job_event_id(placement_id)
        if await event_with_id(self.bus, job_queued_subject(self.bus.stage, cluster), event_id) is not None:
            return
        # Job ids are allocated with optimistic concurrency (a retry loop): through the context.
        await queue_job(ctx.bus, cluster=cluster, id=event_id, **plan.job_fields(submitted))

    # ------------------------------------------------------------------ lifecycle

    async def _state(self, cluster: str) -> tuple[ClusterState, ComputeBackend | None]:
        """The cluster and the backend that reaches it. Its team's credentials reference naming
        nothing on this server any more (a profile removed from the credentials file) is
        Unretryable: the request is parked at once with a reason naming team and profile, so
        `spz down` says why now (the cluster stays in the records: its nodes may still bill)."""
        state = await load_cluster_state(self.bus, cluster)
        if not state.live or state.infra is None:
            return state, None
        launched_with = await self._launched_with(state)
        try:
            return state, self.backends.get(state.infra, launched_with, team=self._team_of(state))
        except CredentialsNotFound as exc:
            raise Unretryable(unreachable_reason(cluster, exc.team, launched_with, str(exc))) from None
        except UnsupportedInfra as exc:
            log.error("cluster %s: %s", cluster, exc)
            return state, None

    @staticmethod
    def _team_of(state: ClusterState) -> str:
        return (state.provisioned.team if state.provisioned is not None else None) or ""

    async def _launched_with(self, state: ClusterState) -> TeamCredentials:
        """The credentials the cluster's team had when it was launched (teamcreds.py: a team moved
        to another account since still reaches its running nodes where they are)."""
        return await self._team_credentials(state.infra or "", self._team_of(state), state.provisioned_seq)

    async def _team_credentials(self, infra: str, team: str | None, seq: int | None = None) -> TeamCredentials:
        """The team's credentials at `seq` (None: now); only AWS (a profile), Kubernetes (a
        namespace) and Slurm (an account) take any yet, so no read for the others."""
        if infra not in ("aws", "kubernetes", "k8s", "slurm") or not team:
            return NO_CREDENTIALS
        return (await teamcreds.load_history(self.bus, team)).as_of(seq)

    @handles(DownRequested)
    async def on_down(self, stored: Stored, ctx: EmitContext) -> Reactions:
        assert isinstance(stored.event, DownRequested)
        ev = stored.event
        state, backend = await self._state(ev.cluster)
        if stored.seq < state.terminated_seq:
            return []  # served by an earlier termination
        if not state.live and state.provisioned is None:
            # Never up: the request is for a launch still in flight (`spz down` sends no other
            # for such a name). The cluster ends now, so the waiting command and `spz status` see
            # it end; the placement, when it comes, is cancelled (on_placement). A cluster that
            # was up and has ended needs nothing: a new launch under its name is cancelled there.
            return [ClusterTerminated(cluster=ev.cluster, terminated_at=self.clock.now(),
                                      reason="down requested before launch", instance_ids=[])]
        if backend is None:
            return []  # an infra this build cannot reach (logged by _state)
        await self._terminate(ctx, stored, state, backend, ev.reason)
        return []

    async def _terminate(self, ctx: EmitContext, stored: Stored, state: ClusterState, backend: ComputeBackend,
                         reason: str) -> None:
        """Terminate the nodes, release the cluster's region (bounded), publish ClusterTerminated.

        `terminated_at` is when the nodes were gone, which is when metering stops. A failure to
        release a security group, key pair or placement group is a CleanupFailed warning
        published before ClusterTerminated (so a waiting `spz down` sees it), never a blocker.
        ClusterTerminated is published here, through the context, while the cluster is still
        marked as terminating (so reconciliation does not take it for vanished)."""
        assert stored.envelope is not None and state.provisioned is not None
        region = state.provisioned.candidate.region
        self._terminating.add(state.cluster)
        self._tearing_down_in[region or ""] += 1
        try:
            ids = await backend.terminate(state.ref(self.bus.stage), release=False)
            ended = self.clock.now()
            await self._publish_accounts(ctx.publish, backend, state.cluster)
            infra = state.provisioned.candidate.infra
            if region:  # in the account it was made in (`aws@PROFILE` for a team's own)
                await self._release_after_teardown(
                    ctx, state.cluster, credentials_key(infra, await self._launched_with(state)), region)
            known = [n.instance_id for n in state.nodes]
            event = ClusterTerminated(cluster=state.cluster, terminated_at=ended, reason=reason,
                                      instance_ids=sorted(set(known) | set(ids)))
            await ctx.publish(event)
            self._drop_agent_user(state.cluster)  # in the log first: a crash here is undone at start
        finally:
            self._terminating.discard(state.cluster)
            self._tearing_down_in[region or ""] -= 1
        self._sweep_soon.set()  # the other regions the stage touched (one where every launch failed)

    async def _release_after_teardown(self, ctx: EmitContext, cluster: str, infra: str, region: str) -> None:
        try:
            await asyncio.wait_for(self._sweep({infra: [region]}, cluster=cluster, bus=ctx.bus),
                                   max(0.1, self.settings.cleanup_wait_s))
        except asyncio.TimeoutError:
            log.warning("cluster %s: releasing resources in %s took over %.0f s; the background sweep goes on",
                        cluster, region, self.settings.cleanup_wait_s)
        except asyncio.CancelledError:
            raise
        except Exception:  # never a blocker of ClusterTerminated; the sweep retries
            log.exception("cluster %s: releasing resources in %s failed; the background sweep retries", cluster,
                          region)

    def _cleanup_policy(self) -> cleanup.RetryPolicy:
        return cleanup.RetryPolicy(attempts=max(1, self.settings.cleanup_attempts),
                                   backoff_s=max(0.0, self.settings.cleanup_backoff_s))

    @handles(StopRequested)
    async def on_stop(self, stored: Stored, ctx: EmitContext) -> Reactions:
        assert isinstance(stored.event, StopRequested)
        ev = stored.event
        state, backend = await self._state(ev.cluster)
        if backend is None or state.stopped or stored.seq < state.terminated_seq:
            return []
        try:
            await backend.stop(state.ref(self.bus.stage))
        except FatalProvisionError as err:
            log.warning("cannot stop cluster %s: %s", ev.cluster, err)
            return []
        await self._publish_accounts(ctx.publish, backend, ev.cluster)
        return [ClusterStopped(cluster=ev.cluster, stopped_at=self.clock.now())]

    @handles(StartRequested)
    async def on_start(self, stored: Stored, ctx: EmitContext) -> Reactions:
        assert isinstance(stored.event, StartRequested)
        ev = stored.event
        state, backend = await self._state(ev.cluster)
        if backend is None or not state.stopped:
            return []
        try:
            nodes = await backend.start(state.ref(self.bus.stage))
        except (CapacityError, FatalProvisionError) as err:
            log.warning("cannot start cluster %s: %s", ev.cluster, err)
            return []
        return [ClusterStarted(cluster=ev.cluster, started_at=self.clock.now(),
                               nodes=plan.event_nodes(nodes))]

    @handles(ClusterIdle)
    async def on_idle(self, stored: Stored, ctx: EmitContext) -> Reactions:
        assert isinstance(stored.event, ClusterIdle)
        ev = stored.event
        state, backend = await self._state(ev.cluster)
        if backend is None or state.stopped or stored.seq < max(state.provisioned_seq, state.started_seq):
            return []  # not up, already stopped, or idle from before the cluster (re)started
        job = await self.bus.last_event(job_queued_subject(self.bus.stage, ev.cluster))
        if job is not None and job.seq > stored.seq:
            return []  # a job arrived after the agent declared the cluster idle
        assert state.provisioned is not None
        if ev.down or state.provisioned.candidate.use_spot:
            await self._terminate(ctx, stored, state, backend, "autostop")
            return []
        try:
            await backend.stop(state.ref(self.bus.stage))
        except FatalProvisionError as err:
            log.warning("autostop of %s: cannot stop (%s); terminating", ev.cluster, err)
            await self._terminate(ctx, stored, state, backend, "autostop")
            return []
        await self._publish_accounts(ctx.publish, backend, ev.cluster)
        return [ClusterStopped(cluster=ev.cluster, stopped_at=self.clock.now())]

    # ------------------------------------------------------------------ reconciliation

    async def reconcile(self, *, terminate: bool | None = None, infras: Sequence[str] | None = None) -> ReconcileReport:
        return await reconcile(
            self.bus, self.backends,
            terminate=self.settings.reconcile_terminate if terminate is None else terminate,
            grace_s=self.settings.reconcile_grace_s, infras=infras, launching=set(self._launching),
            terminating=set(self._terminating), cleanup_policy=self._cleanup_policy(), now=self.clock.now(),
        )

    async def _answer_reconcile(self, params: dict[str, Any]) -> dict[str, Any]:
        """The `reconcile` query: the pass `spz status -r` runs on the embedded bus (the same
        infras: refresh_infras), with this process's launches and teardowns left alone."""
        from .state import live_clusters

        infras = refresh_infras(await live_clusters(self.bus), self.settings)
        report = await self.reconcile(terminate=params.get("terminate") is True, infras=infras)
        return report.to_dict()

    async def sweep(self) -> cleanup.SweepReport:
        """Release unused per-stage resources in every region the stage touched (background)."""
        touched = await self._touched.update(self.bus)
        # A region with a teardown under way is released by that teardown (its warnings then
        # name its cluster); the next sweep covers it.
        busy = {r for r, n in self._tearing_down_in.items() if n > 0}
        # Every team account too (each AWS profile a team has ever had: teamcreds.py).
        accounts = [credentials_key("aws", aws_account(p))
                    for p in teamcreds.profiles_ever((await teamcreds.load_all(self.bus)).values())]
        touched = cleanup.with_accounts(touched, accounts)
        return await self._sweep({infra: set(regions) - busy for infra, regions in touched.items()})

    async def _sweep(self, regions: Mapping[str, Sequence[str] | set[str]],
                     cluster: str = cleanup.SWEEP_CLUSTER, bus: Bus | None = None) -> cleanup.SweepReport:
        """`bus`: a handler's context bus when a teardown releases its region (its CleanupFailed
        are then its reactions); otherwise the service's own."""
        async with self._sweep_lock:
            return await cleanup.sweep(bus or self.bus, self.backends, regions, self._cleanup_policy(),
                                       cluster=cluster, now=self.clock.now())

    async def _cleanup_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._sweep_soon.wait(), self.settings.cleanup_interval_s)
            except asyncio.TimeoutError:
                pass
            self._sweep_soon.clear()
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("background cleanup sweep failed")

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reconcile_interval_s)
            try:
                report = await self.reconcile()
                await self.sync_agent_users()
                if report.orphans or report.orphan_objects or report.vanished:
                    log.warning("reconcile: %d orphan(s), %d vanished cluster(s) (%d ended)",
                                len(report.orphans) + len(report.orphan_objects),
                                len(report.vanished), len(report.ended))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("periodic reconciliation failed")


def unreachable_reason(cluster: str, team: str, launched_with: TeamCredentials, fallback: str) -> str:
    """Pure: why a cluster's teardown, stop or start cannot be done: the reference it was launched
    with names nothing here. Changing the team's profile would not help (a cluster is reached
    with what it was made with), so the message says what does."""
    if launched_with.aws is None:
        return f"cluster {cluster} cannot be reached: {fallback}"
    return (f"cluster {cluster} cannot be reached: team {team}'s AWS profile {launched_with.aws.profile}, which it "
            "was launched with, is not on this server. Add the profile back to the server's AWS credentials file "
            "(AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials) and ask again; spz down --purge drops the "
            "cluster from spz's records (its nodes may still run and bill in that account)")


def _url_of(bus: Bus) -> str:
    # A cluster: the agents get every node, so one node down does not keep them off the bus.
    servers = getattr(bus, "servers", None)
    if isinstance(servers, list) and len(servers) > 1:
        return ",".join(servers)
    url: Any = getattr(bus.nc, "connected_url", None)
    if url is None:
        return ""
    return str(url.geturl()) if hasattr(url, "geturl") else str(url)
