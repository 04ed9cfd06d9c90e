"""The node agent: one process per node that runs its cluster's jobs.

It connects to the bus, announces NodeReady, replays its cluster's events from
`AgentSpec.extra["start_seq"]` (so a late boot still sees everything), finds the processes a
previous agent on this node left behind, then follows the cluster's events live. After every
event, process exit and tick it asks `decide()` what to do and does it. It never keeps state
that the log and its home directory do not hold: kill it at any moment and start it again,
and it carries on (see docs/agent.md).

"Now" — what `decide()` is given (autostop), the times the events carry and their envelopes'
— is the injected clock's (events/clock.py; the system's by default), so a test drives the
agent's decisions with a `ManualClock`. Its waits (ticks, heartbeats, kill grace) are the
event loop's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from skypurza.events import naming
from skypurza.events.agentspec import READY_LINE, AgentSpec
from skypurza.events import deadletters
from skypurza.events.aiotasks import stop_tasks
from skypurza.events.bus import CANNOT_CONNECT, Bus, Stored, log_chunk_id
from skypurza.events.clock import SYSTEM_CLOCK, Clock
from skypurza.events.cluster_events import ClusterIdle, ClusterStopped, ClusterTerminated, DownRequested, NodeReady
from skypurza.events.envelope import Event, new_id
from skypurza.events.health_events import GpuUnhealthy
from skypurza.events.job_events import JobCancelled, JobFailed, JobNodeFinished, JobStarted, JobSucceeded
from skypurza.events.contract import BusAccess, Contract
from skypurza.events.job_events import CancelRequested, JobQueued
from skypurza.events.cluster_events import AutostopSet, ClusterProvisioned, ClusterStarted, StopRequested
from skypurza.events.service import declared_bus, read_stored

from . import mounts, slurmexec, storage, userenv
from .decide import (
    LOST_EXIT,
    SYNC_FAILED_EXIT,
    Action,
    Kill,
    LocalState,
    Outcome,
    PublishDown,
    PublishIdle,
    PublishOutcome,
    PublishStarted,
    Start,
    decide,
    key,
)
from .envcontract import (CUDA_VISIBLE_DEVICES, UNSET_IN_SETUP, JobContext, cluster_task_id, cuda_visible_devices, gpus_per_node,
                          job_environment)
from .gpus import detect_gpus
from .procs import Chunk, ExitWatch, LogTail, PhaseFiles, exit_status, group_alive, kill_group, pid_alive, spawn
from .view import ClusterView, JobView

log = logging.getLogger("skypurza.agent")

STATE_DIRNAME = ".spz-agent"
READY_FILE = "ready"
HANDLER = "agent"
# Secret values shorter than this are not masked in job output (they would mask ordinary words).
MIN_REDACT_LENGTH = 8
REDACTED = "<redacted>"
# One chunk of output is retried this often (each try waits up to LOG_PUBLISH_TIMEOUT_S for its
# ack), then dropped so that a bus that stays away cannot keep the job's outcome unreported.
LOG_ATTEMPTS = 8
# An unterminated piece of output ("Downloading... " before a long pause) is sent as it is after
# this long, so a follower sees it; its rest follows as the next chunk.
PARTIAL_LINE_FLUSH_S = 1.0
LOG_PUBLISH_TIMEOUT_S = 5.0
LOG_RETRY_DELAYS_S = (0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0)
# A running phase's output file is read this often (the file, not a pipe: a restarted agent reads
# on from where the last one stopped). The phase's exit does not wait for it (procs.ExitWatch).
OUTPUT_READ_S = 0.1


# What a node agent reads (its own cluster's aggregate, folded by view.py) and may publish; its
# bus refuses anything else (events/contract.py).
CONTRACT = Contract(
    name="agent",
    consumes=(ClusterProvisioned, ClusterStarted, ClusterStopped, ClusterTerminated, AutostopSet, ClusterIdle,
              DownRequested, StopRequested, JobQueued, JobStarted, JobNodeFinished, CancelRequested, JobSucceeded,
              JobFailed, JobCancelled, GpuUnhealthy),
    emits=(NodeReady, JobStarted, JobNodeFinished, JobSucceeded, JobFailed, JobCancelled, ClusterIdle, DownRequested),
    consume_notes={ClusterProvisioned: "the cluster's lifetime starts", ClusterTerminated: "agents exit",
                   AutostopSet: "head agent", JobQueued: "runs it", CancelRequested: "kills the job's process groups",
                   JobNodeFinished: "head agent decides the job's outcome",
                   GpuUnhealthy: "a fatal finding drains the cluster: no new job is admitted"},
    emit_notes={JobStarted: "head agent", JobNodeFinished: "every agent", JobSucceeded: "head agent",
                JobFailed: "head agent", JobCancelled: "head agent", ClusterIdle: "head agent, autostop",
                DownRequested: "`--down` after the job, autostop"},
    # Job output, a job's secrets and uploads, heartbeats and node samples (the secured bus's grants).
    bus=BusAccess(logs="write", secrets="read", objects="read", beats="write", samples="write"),
)


def log_retry_horizon_s() -> float:
    """The longest one agent process keeps re-sending one chunk: the logs stream's duplicate
    window (events/bus.py LOGS_DUPLICATE_WINDOW_S) must be longer, so every copy is dropped."""
    return LOG_ATTEMPTS * LOG_PUBLISH_TIMEOUT_S + sum(LOG_RETRY_DELAYS_S[:LOG_ATTEMPTS - 1])


@dataclass
class _Prepared:
    task: Any
    secrets: dict[str, str]


def start_time_of(pid: int) -> float | None:
    """When a process started (epoch seconds), from /proc: tells a reused pid from ours."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
        ticks = int(fields[19])
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def is_our_process(pid: int, started_at: float | None) -> bool:
    if not pid_alive(pid):
        return False
    if started_at is None:
        return True
    began = start_time_of(pid)
    return began is None or abs(began - started_at) < 5.0


class Agent:
    def __init__(self, spec: AgentSpec, *, heartbeat_s: float = 5.0, kill_grace_s: float = 10.0,
                 tick_s: float = 1.0, clock: Clock = SYSTEM_CLOCK, detect_gpu: bool = True,
                 checkpoint_sync_s: float | None = None, bucket_store: str | None = None,
                 sample_s: float = 0.0, xid_source: str = "auto", ready_fd: int | None = None,
                 gpu_source: str = "auto", tool_timeout_s: float = 10.0):
        self.spec = spec
        self.ready_fd = ready_fd  # the local backend's pipe (agentspec.READY_FD_VAR), told once
        self.rank = spec.rank
        self.home = Path(spec.home).expanduser() if spec.home else Path.home()
        self.state = self.home / STATE_DIRNAME
        self.workdir = self.home / mounts.SKY_WORKDIR
        self.runtime = userenv.Runtime.current()  # taken out of every job's environment
        self.view = ClusterView(spec.cluster, spec.num_nodes)
        self.local = LocalState()
        self.heartbeat_s = heartbeat_s
        self.kill_grace_s = kill_grace_s
        self.tick_s = tick_s
        self.clock = clock
        self.detect_gpu = detect_gpu
        self.agent_id = new_id()
        self.bus: Bus | None = None
        self.stop_event = asyncio.Event()
        self._wake = asyncio.Event()
        self._ending: str | None = None
        self._pgids: dict[tuple[int, str], int] = {}
        self._watchers: set[asyncio.Task] = set()
        self._user_env: asyncio.Task | None = None  # a local node's ~/sky-user-env being made
        self._prepared: dict[int, _Prepared] = {}
        self._parked: set[int] = set()  # seqs this agent has parked (each is parked once)
        self._decide_error = ""
        self.checkpoints = storage.Checkpoints(spec.infra, spec.stage, checkpoint_sync_s,
                                               bucket_store)  # checkpoint buckets (storage.py)
        self._subject = naming.aggregate_subjects(spec.stage, "cluster", spec.cluster)
        self.sample_s = sample_s  # 0: no node samples (sampling.py)
        self.xid_source = xid_source
        self.gpu_source = gpu_source  # auto: DCGM when it answers, else nvidia-smi (sampling.py)
        self.tool_timeout_s = tool_timeout_s

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> int:
        self.state.mkdir(parents=True, exist_ok=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bus = await self._connect()
        gpus = await asyncio.to_thread(detect_gpus, self.gpu_source, timeout_s=self.tool_timeout_s) \
            if self.detect_gpu else {}
        await self._publish(NodeReady(cluster=self.spec.cluster, rank=self.rank, host=self._ip(),
                                      pid=os.getpid(), agent_id=self.agent_id, gpus=gpus))
        # Tells whoever started this agent (the local backend waits for it) that it is connected.
        (self.state / READY_FILE).write_text(str(os.getpid()))
        self._tell_ready()
        if self.spec.infra == "local":
            self._user_env_made()  # made while the first job is still on its way, not after it comes
        heartbeat = asyncio.create_task(self._heartbeats())
        sampler = asyncio.create_task(self._samples()) if self.sample_s > 0 else None
        follower: asyncio.Task | None = None
        try:
            start_seq = await self._start_seq()
            async for stored in self.bus.replay(filter_subject=self._subject, start_seq=start_seq):
                self._fold(stored)
            if self.view.terminated:
                log.info("cluster %s is terminated; nothing to do", self.spec.cluster)
                await self._kill_leftovers()
                return 0
            await self._recover()
            follower = asyncio.create_task(self._follow(max(start_seq, self.view.last_seq + 1)))
            while not self.stop_event.is_set():
                if self._ending:
                    await self._end(self._ending)
                    return 0
                await self._step()
                await self._wait()
            return 0
        finally:
            await stop_tasks(heartbeat, sampler, follower, self._user_env, *self._watchers)
            await self.bus.close()

    def _user_env_made(self) -> asyncio.Task:
        """The local node's user environment (userenv.ensure_user_env), made once in the background;
        one that failed is tried again by the next job that needs it (which reports the error)."""
        task = self._user_env
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = self._user_env = asyncio.create_task(asyncio.to_thread(userenv.ensure_user_env, self.home))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no warning
        return task

    def _tell_ready(self) -> None:
        """The backend waiting on our ready pipe learns it now, not at its next look at the file."""
        fd, self.ready_fd = self.ready_fd, None
        if fd is None:
            return
        try:
            os.write(fd, READY_LINE)
        except OSError as exc:  # the backend went away: the ready file still says it
            log.debug("ready pipe: %s", exc)
        finally:
            try:
                os.close(fd)
            except OSError:
                pass

    async def _connect(self) -> Bus:
        delay = 0.5
        source = f"/{naming.PROJECT}/{self.spec.stage}/agent/{self.spec.cluster}/{self.rank}"
        while True:
            try:
                return declared_bus(await Bus.connect(self.spec.nats_url, self.spec.stage, source=source), CONTRACT)
            except CANNOT_CONNECT:  # its credentials are wrong: no retry mends that
                raise
            except Exception as exc:  # the bus may come up after the node (EC2 boot, restarts)
                log.warning("cannot reach the bus at %s (%s); retrying", self.spec.nats_url, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _start_seq(self) -> int:
        given = self.spec.extra.get("start_seq")
        if given:
            return int(given)
        assert self.bus is not None
        # A direct get by subject: a cluster's own bus user may not get messages by sequence.
        # A replica behind may miss the newest termination: the replay then starts earlier.
        last = await self.bus.last_event(
            naming.event_subject(self.spec.stage, "cluster", self.spec.cluster, ClusterTerminated.EVENT_NAME),
            direct=True)
        return last.seq + 1 if last is not None else 1

    async def _follow(self, start_seq: int) -> None:
        """The cluster's events, live, into the view. A follow that breaks is started again from
        the next sequence: without it the agent would go deaf while its jobs still run."""
        assert self.bus is not None
        while True:
            try:
                async for msg in self.bus.follow(filter_subject=self._subject, start_seq=self.view.last_seq + 1
                                                 if self.view.last_seq else start_seq):
                    stored = read_stored(msg)
                    if stored.seq <= self.view.last_seq:
                        continue
                    self._fold(stored)
                    if isinstance(stored.event, (ClusterStopped, ClusterTerminated)):
                        self._ending = stored.event.EVENT_NAME
                    self._wake.set()
                if self.bus.nc.is_closed:
                    return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("following the cluster's events failed; following again")
            await asyncio.sleep(0.5)

    def _fold(self, stored: Stored) -> None:
        """One of the cluster's events into the view. An event the view cannot take (a value it
        cannot act on, or anything it raises) is parked with its error and the agent goes on:
        one bad event must not keep the node from running and reporting its jobs."""
        if stored.event is None or stored.envelope is None:
            self.view.last_seq = max(self.view.last_seq, stored.seq)
            if stored.status == "poison":
                self._park(stored, stored.reason, "PoisonEvent")
            return
        try:
            self.view.apply_all_or_nothing(stored.event, stored.envelope.id, stored.envelope.time, stored.seq)
        except Exception as exc:
            self.view.last_seq = max(self.view.last_seq, stored.seq)
            self._park(stored, exc)

    @property
    def dead_letter_service(self) -> str:
        return f"{HANDLER}:{self.spec.cluster}:{self.rank}"

    def _park(self, stored: Stored, error: BaseException | str, error_type: str | None = None) -> None:
        log.error("seq %d (%s) cannot be applied, parked: %s", stored.seq, stored.subject, error)
        if stored.seq in self._parked:
            return
        self._parked.add(stored.seq)
        assert self.bus is not None
        self._background(deadletters.park(self.bus, self.dead_letter_service, seq=stored.seq,
                                          subject=stored.subject, raw=stored.raw, error=error,
                                          error_type=error_type))

    async def _wait(self) -> None:
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=self.tick_s)
        except asyncio.TimeoutError:
            pass
        self._wake.clear()

    async def _end(self, why: str) -> None:
        """The cluster stopped or was terminated under us: stop what runs, then exit."""
        log.info("cluster %s: %s; stopping", self.spec.cluster, why)
        for job_id in self.local.jobs():
            await self._do(Kill(job_id, why))
        if self._watchers:
            await asyncio.wait(list(self._watchers), timeout=self.kill_grace_s + 5)

    # ------------------------------------------------------------------ deciding

    async def _step(self) -> None:
        running = set(self.local.jobs())
        for job_id in [j for j in self._prepared if j not in running and self.view.jobs.get(j) is not None
                       and self.view.jobs[j].terminal]:
            del self._prepared[job_id]  # task and secrets of ended jobs are not kept in memory
        for _ in range(50):
            try:
                actions = decide(self.view, self.rank, self.local, self.clock.now())
            except Exception as exc:  # a bug, not an event (those are refused when folded): go on
                text = f"{type(exc).__name__}: {exc}"
                if text != self._decide_error:
                    self._decide_error = text
                    log.exception("deciding the next step failed; trying again at the next tick")
                return
            if not actions:
                return
            for action in actions:
                try:
                    await self._do(action)
                except Exception:
                    log.exception("action %r failed; will retry", action)
                    return

    async def _do(self, action: Action) -> None:
        if isinstance(action, Start):
            await self._start(self.view.jobs[action.job_id], action.phase)
        elif isinstance(action, Kill):
            phases = sorted(p for p in self.local.running if p[0] == action.job_id)
            if not phases:
                return
            self.local.killing.add(action.job_id)
            for running in phases:  # the job's process only: the other jobs of the node go on
                pgid = self._pgids.get(running)
                log.info("stopping job %s %s: %s", running[0], running[1], action.reason)
                if pgid is not None:
                    self._background(kill_group(pgid, self.kill_grace_s))
        elif isinstance(action, PublishStarted):
            job = self.view.jobs[action.job_id]
            await self._publish(JobStarted(cluster=self.spec.cluster, job_id=job.job_id, started_at=self.clock.now(),
                                           gpu_indices=list(action.gpu_indices) if action.gpu_indices else None),
                                cause=job.queued_id, key="started")
        elif isinstance(action, PublishOutcome):
            await self._publish_outcome(self.view.jobs[action.job_id], action.outcome)
        elif isinstance(action, PublishDown):
            job = self.view.jobs[action.job_id]
            await self._publish(DownRequested(cluster=self.spec.cluster, reason="job_done",
                                              requested_by=f"agent:{self.rank}"),
                                cause=job.queued_id, key="down_after")
        elif isinstance(action, PublishIdle):
            await self._publish(ClusterIdle(cluster=self.spec.cluster, idle_since=action.idle_since,
                                            idle_minutes=action.idle_minutes, down=action.down),
                                cause=action.activity_id, key="idle")
        k = key(action)
        if k:
            self.local.published.add(k)

    async def _publish_outcome(self, job: JobView, outcome: Outcome) -> None:
        now = self.clock.now()
        event: Event
        if outcome.status == "succeeded":
            event = JobSucceeded(cluster=self.spec.cluster, job_id=job.job_id, ended_at=now)
        elif outcome.status == "cancelled":
            event = JobCancelled(cluster=self.spec.cluster, job_id=job.job_id, ended_at=now)
        else:
            event = JobFailed(cluster=self.spec.cluster, job_id=job.job_id, ended_at=now,
                              phase=outcome.phase or "run", exit_code=outcome.exit_code,
                              failed_rank=outcome.failed_rank, reason=outcome.reason)
        # One key for every outcome: a restarted head can never publish a second, different one.
        await self._publish(event, cause=job.queued_id, key="outcome")

    # ------------------------------------------------------------------ running phases

    async def _start(self, job: JobView, phase: str) -> None:
        files = PhaseFiles(self.state, job.job_id, phase)
        prepared = self._prepared.get(job.job_id)
        if prepared is None:
            try:
                prepared = await self._prepare(job)
            except Exception as exc:
                await self._agent_line(job.job_id, f"job {job.job_id}: {exc}")
                self.local.done[(job.job_id, phase)] = SYNC_FAILED_EXIT
                await self._report(job, phase, SYNC_FAILED_EXIT, files)
                return
        script = prepared.task.setup if phase == "setup" else prepared.task.run
        if not script or not script.strip():
            self.local.done[(job.job_id, phase)] = 0
            await self._report(job, phase, 0, files)
            return
        job_env = job_environment(self._context(job, prepared), phase)  # type: ignore[arg-type]
        env = userenv.job_process_environment(os.environ, self.runtime, job_env,
                                              home=self.home if self.spec.infra == "local" else None)
        if phase == "setup":
            for name in UNSET_IN_SETUP:
                env.pop(name, None)
        if self.spec.infra == "slurm":  # the same process, running the phase as an srun step over SSH
            env.pop(CUDA_VISIBLE_DEVICES, None)  # Slurm's, from the allocation's GRES
            body = slurmexec.executor_script(
                script, job_env, config=self.spec.extra["slurm_config"], host=self.spec.extra["slurm_host"],
                job=self.spec.extra["slurm_job"], node=self.spec.extra["slurm_node"],
                step_name=f"{job.job_id}-{phase}", remote_dir=naming.slurm_dir(self.spec.stage, self.spec.cluster),
                uid=self.spec.extra.get("slurm_uid") or None)
        else:
            body = userenv.phase_script(script, self.workdir, job_env)
        proc = await asyncio.to_thread(spawn, files, body, self.workdir, env)
        self.local.running.add((job.job_id, phase))
        self.local.killing.discard(job.job_id)
        self._pgids[(job.job_id, phase)] = proc.pid
        log.info("job %s: %s started (pid %s)", job.job_id, phase, proc.pid)
        self._watch(job, phase, files, proc.pid, proc)

    async def _prepare(self, job: JobView) -> _Prepared:
        """Secrets, the task, the workdir and file mounts of a job on this node (once per job)."""
        from skypurza.events.taskspec.task import Task

        assert self.bus is not None
        # Keyed under this cluster; a cluster's own bus user may read no other key (the key alone,
        # as older versions wrote it, is read by the shared agent user only).
        secrets = await self.bus.get_secrets(job.queued.secrets_key, self.spec.cluster,
                                             legacy=self.bus.user != naming.cluster_agent_user(self.spec.cluster))
        try:
            task = Task.from_public_dict(job.queued.task.to_dict(), secrets)
        except Exception as exc:
            raise RuntimeError(f"the task cannot be read: {exc}") from None
        workdir = task.workdir.model_dump(exclude_none=True) if hasattr(task.workdir, "model_dump") else task.workdir
        file_mounts = {dst: (src.model_dump(exclude_none=True) if hasattr(src, "model_dump") else src)
                       for dst, src in (task.file_mounts or {}).items()}
        synced = self.state / "jobs" / str(job.job_id) / "synced"
        file_mounts = await self.checkpoints.attach(job.job_id, file_mounts, self.home, download=not synced.exists())
        # A Slurm node's agent runs on the control plane: its files go to its own home first
        # (never elsewhere on this machine), then to the cluster (slurmexec.sync_home).
        confined = (self.spec.infra == "local" and not mounts.host_paths_allowed(os.environ)) or \
            self.spec.infra == "slurm"
        steps = [] if synced.exists() else mounts.plan(workdir, file_mounts, self.home, confined=confined)
        # A cloud node gets the user's local paths from the object store (fetch.py); `local` copies them.
        uploads = (job.queued.task.uploads or {}) if self.spec.infra != "local" else {}
        for step in steps:
            try:
                if step.kind == "copy" and step.source in uploads:
                    from . import fetch  # only a job with uploads needs it (issue 21: light start)

                    await fetch.put_in_place(self.bus, uploads[step.source], step.dest, self.state / "uploads")
                else:
                    await asyncio.to_thread(mounts.apply_step, step)
            except mounts.SyncError as exc:
                hint = "" if self.spec.infra == "local" or step.source in uploads else (
                    " (on cloud nodes, name a bucket (s3://...) or a path that exists on the node image)")
                raise RuntimeError(f"cannot put {step.source} in place at {step.dest}: {exc}{hint}") from None
        if steps and self.spec.infra == "slurm":
            x = self.spec.extra
            await asyncio.to_thread(slurmexec.sync_home, str(self.home), config=x["slurm_config"],
                                    host=x["slurm_host"], remote_dir=naming.slurm_dir(self.spec.stage, self.spec.cluster),
                                    uid=x.get("slurm_uid") or None)
        if self.spec.infra == "local":  # this machine's Python is shared: the task gets its own
            try:
                await asyncio.shield(self._user_env_made())
            except (OSError, subprocess.SubprocessError) as exc:
                raise RuntimeError(f"cannot make the node's user environment (~/{userenv.USER_ENV_DIRNAME}): "
                                   f"{exc}") from None
        synced.parent.mkdir(parents=True, exist_ok=True)
        synced.touch()
        prepared = _Prepared(task, secrets)
        self._prepared[job.job_id] = prepared
        return prepared

    def _context(self, job: JobView, prepared: _Prepared) -> JobContext:
        q = job.queued
        task = prepared.task
        prov = self.view.provisioned
        region = self.spec.region or (prov.candidate.region if prov else None)
        zone = self.spec.zone or (prov.candidate.zone if prov else None)
        return JobContext(
            cluster=self.spec.cluster, job_id=job.job_id, rank=self.rank, cluster_ips=self._cluster_ips(),
            job_num_nodes=job.num_nodes,
            task_id=q.skypilot_task_id or cluster_task_id(job.queued_at, self.spec.cluster, job.job_id),
            user=q.user, infra=self.spec.infra, region=region, zone=zone,
            gpus_per_node=gpus_per_node(q.task, self.view.placed_accelerators()),
            cuda_visible_devices=cuda_visible_devices(job.gpu_indices, sum(self.view.capacity().accelerators.values()),
                                                      self.rank, self.spec.infra),
            managed_job_id=q.managed_job_id, managed_task_ids=tuple(q.managed_task_ids),
            job_rank=q.job_rank, num_jobs=q.num_jobs, job_group=q.job_group, root_job_id=q.root_job_id,
            envs={**task.env_values(), **prepared.secrets},
        )

    def _cluster_ips(self) -> tuple[str, ...]:
        if self.spec.node_ips:
            return tuple(self.spec.node_ips)
        prov = self.view.provisioned
        if prov is not None and prov.nodes:
            return tuple(n.private_ip or "127.0.0.1" for n in sorted(prov.nodes, key=lambda n: n.rank))
        return tuple("127.0.0.1" for _ in range(self.view.num_nodes))

    def _watch(self, job: JobView, phase: str, files: PhaseFiles, pid: int,
               proc: subprocess.Popen | None) -> None:
        self._background(self._watch_phase(job, phase, files, pid, proc))

    def _background(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._watchers.add(task)

        def done(t: asyncio.Task) -> None:
            self._watchers.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("background task failed", exc_info=t.exception())

        task.add_done_callback(done)

    async def _watch_phase(self, job: JobView, phase: str, files: PhaseFiles, pid: int,
                           proc: subprocess.Popen | None) -> None:
        """Publish the phase's output as it comes, then its exit status."""
        assert self.bus is not None
        tail = LogTail(files.log, *files.read_position())
        redact = self._redactor(job.job_id)
        loop = asyncio.get_running_loop()
        partial_since: float | None = None  # when the unterminated tail was first seen (loop clock)
        watch = ExitWatch(pid)  # the phase's exit ends the wait below at once
        try:
            while True:
                exited = (proc.poll() is not None) if proc is not None else not pid_alive(pid)
                waited = partial_since is not None and loop.time() - partial_since >= PARTIAL_LINE_FLUSH_S
                chunks = tail.read_chunks(final=exited, flush_partial=waited)
                if not tail.has_partial:
                    partial_since = None
                elif partial_since is None or chunks:  # a new unterminated tail: it waits from now
                    partial_since = loop.time()
                for chunk in chunks:
                    await self._log_line(job.job_id, redact(chunk.line), phase, chunk)
                if chunks:
                    files.write_offset(tail.committed, tail.seq)
                if exited:
                    break
                await watch.wait(OUTPUT_READ_S)
        finally:
            watch.close()
        code = files.read_exit()
        if code is None:
            if proc is not None:
                code = exit_status(proc.returncode)
            elif job.job_id in self.local.killing:
                code = 128 + signal.SIGTERM
            else:
                code = LOST_EXIT
                await self._agent_line(job.job_id, f"the {phase} process (pid {pid}) is gone; its exit status "
                                                   "is unknown")
        if group_alive(pid):
            await kill_group(pid, self.kill_grace_s)  # what the script left running in its group
            # What they printed while being stopped (a `trap ... TERM` handler) is the phase's
            # output too: read the file once more before the phase is reported.
            chunks = tail.read_chunks(final=True, flush_partial=True)
            for chunk in chunks:
                await self._log_line(job.job_id, redact(chunk.line), phase, chunk)
            if chunks:
                files.write_offset(tail.committed, tail.seq)
        self.local.done[(job.job_id, phase)] = code
        self.local.running.discard((job.job_id, phase))
        if not self.local.runs(job.job_id):
            self.local.killing.discard(job.job_id)
        self._pgids.pop((job.job_id, phase), None)
        log.info("job %s: %s ended with %s", job.job_id, phase, code)
        if phase == "run":
            await self.checkpoints.detach(job.job_id)  # the last upload of the job's buckets
        await self._report(job, phase, code, files)
        self._wake.set()

    async def _report(self, job: JobView, phase: str, code: int, files: PhaseFiles) -> None:
        event = JobNodeFinished(cluster=self.spec.cluster, job_id=job.job_id, rank=self.rank,
                                phase=phase, exit_code=code)  # type: ignore[arg-type]
        delay = 0.5
        while True:
            try:
                await self._publish(event, cause=job.queued_id, key=f"node-{self.rank}-{phase}")
                break
            except Exception as exc:  # the report is the truth: keep it until the bus takes it
                log.warning("cannot publish JobNodeFinished (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        files.dir.mkdir(parents=True, exist_ok=True)
        files.mark_reported(code)
        self._wake.set()

    # ------------------------------------------------------------------ after a restart

    async def _recover(self) -> None:
        """Find the phases a previous agent on this node started, and carry on truthfully."""
        jobs_dir = self.state / "jobs"
        if not jobs_dir.is_dir():
            return
        for entry in sorted(jobs_dir.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
            if not entry.name.isdigit():
                continue
            job_id = int(entry.name)
            job = self.view.jobs.get(job_id)
            for phase in ("setup", "run"):
                files = PhaseFiles(self.state, job_id, phase)
                info = files.read_pid()
                if info is None:
                    continue
                pid = int(info.get("pid", 0))
                alive = pid > 0 and is_our_process(pid, info.get("started_at"))
                if job is None or files.is_reported() or job.report(self.rank, phase) is not None:
                    if job is not None and files.is_reported():
                        try:
                            self.local.done[(job_id, phase)] = int(files.reported.read_text().strip())
                        except ValueError:
                            pass
                    if alive and (job is None or job.terminal):
                        await kill_group(pid, self.kill_grace_s)
                    continue
                if alive:
                    log.info("job %s: adopting the running %s (pid %s)", job_id, phase, pid)
                    self.local.running.add((job_id, phase))
                    self._pgids[(job_id, phase)] = pid
                    try:
                        await self._prepare(job)  # the task and secrets again; files are in place already
                    except Exception as exc:
                        log.warning("job %s: cannot read its task again: %s", job_id, exc)
                    self._watch(job, phase, files, pid, None)
                else:
                    code = files.read_exit()
                    tail = LogTail(files.log, *files.read_position())
                    redact = self._redactor(job_id)
                    for chunk in tail.read_chunks(final=True):
                        await self._log_line(job_id, redact(chunk.line), phase, chunk)
                    files.write_offset(tail.committed, tail.seq)
                    if code is None:
                        code = LOST_EXIT
                        await self._agent_line(job_id, f"the {phase} process (pid {pid}) ended while the agent was "
                                                       "down; its exit status is unknown")
                    self.local.done[(job_id, phase)] = code
                    await self._report(job, phase, code, files)

    async def _kill_leftovers(self) -> None:
        run_dir = self.state / "run"
        if not run_dir.is_dir():
            return
        for f in run_dir.glob("*.pgid"):
            try:
                pgid = int(f.read_text().strip())
            except (OSError, ValueError):
                continue
            if group_alive(pgid):
                await kill_group(pgid, self.kill_grace_s)
            f.unlink(missing_ok=True)

    # ------------------------------------------------------------------ bus helpers

    async def _publish(self, event: Event, *, cause: str | None = None, key: str = "") -> None:
        assert self.bus is not None
        now = self.clock.now()
        env = (self.bus.envelope(event, cause=cause, handler=HANDLER, key=key, time=now) if cause
               else self.bus.envelope(event, time=now))
        await self.bus.publish(env)

    async def _log_line(self, job_id: int, line: str, stream: str, chunk: Chunk | None = None) -> None:
        """One output line to the logs stream; retried for a while when the bus is away, then
        dropped (a lost line must not keep the job's outcome from being reported). Every try
        carries the chunk's id (its place in the output file, or the notice's text), so the
        copies a retry makes — and those nats-py re-sends after a reconnect — are stored once."""
        assert self.bus is not None
        seq, offset = (chunk.seq, chunk.offset) if chunk is not None else (None, None)
        end = chunk.end if chunk is not None else "\n"
        msg_id = log_chunk_id(self.spec.cluster, job_id, self.rank, stream, seq, offset, line)
        for attempt in range(LOG_ATTEMPTS):
            try:
                await self.bus.publish_log(self.spec.cluster, job_id, self.rank, line, stream_name=stream,
                                           seq=seq, offset=offset, msg_id=msg_id, timeout=LOG_PUBLISH_TIMEOUT_S,
                                           end=end)
                return
            except Exception as exc:
                if attempt == LOG_ATTEMPTS - 1:
                    log.warning("dropped an output line of job %s: %s", job_id, exc)
                    return
                await asyncio.sleep(LOG_RETRY_DELAYS_S[attempt])

    async def _agent_line(self, job_id: int, text: str) -> None:
        log.warning("%s", text)
        try:
            await self._log_line(job_id, f"[spz agent, node {self.rank}] {text}", "agent")
        except Exception:
            pass

    def _redactor(self, job_id: int) -> Callable[[str], str]:
        prepared = self._prepared.get(job_id)
        values = sorted((v for v in (prepared.secrets.values() if prepared else ()) if len(v) >= MIN_REDACT_LENGTH),
                        key=len, reverse=True)
        if not values:
            return lambda line: line

        def redact(line: str) -> str:
            for v in values:
                line = line.replace(v, REDACTED)
            return line

        return redact

    async def _heartbeats(self) -> None:
        assert self.bus is not None
        subject = naming.heartbeat_subject(self.spec.stage, self.spec.cluster, self.rank)
        while True:
            running = min(self.local.running, default=None)  # the oldest job's; `jobs` lists them all
            beat = {"cluster": self.spec.cluster, "rank": self.rank, "instance_id": self.spec.instance_id,
                    "agent_id": self.agent_id, "pid": os.getpid(), "ts": self.clock.now().isoformat(),
                    "job_id": running[0] if running else None, "phase": running[1] if running else None,
                    "jobs": [[j, p] for j, p in sorted(self.local.running)]}
            try:
                await self.bus.nc.publish(subject, json.dumps(beat).encode())
            except Exception as exc:
                log.debug("heartbeat not sent: %s", exc)
            await asyncio.sleep(self.heartbeat_s)

    def _busy_gpus(self, expected: int) -> list[int]:
        """The GPU indices the jobs running on this node hold (all of them for a job that asked
        for GPUs without indices recorded)."""
        held: set[int] = set()
        for job_id in self.local.jobs():
            job = self.view.jobs.get(job_id)
            if job is None:
                continue
            if job.gpu_indices is not None:
                held.update(i for i in job.gpu_indices if i >= 0)
            elif self.view.demand(job).accelerator_count > 0:
                held.update(range(expected))
        return sorted(held)

    async def _samples(self) -> None:
        """A node sample every `sample_s` on core NATS (events/nodesample.py): fire and forget,
        never on the log. A sample that cannot be taken or sent is skipped, never fatal."""
        assert self.bus is not None
        # Imported here, not at the top: node samples (and events/nodesample.py's models) are not
        # needed before NodeReady, and most agents never take one (issue 21).
        from . import sampling

        sampler = sampling.Sampler(self.home, xid_source=self.xid_source, gpu_source=self.gpu_source,
                                   timeout_s=self.tool_timeout_s)
        subject = naming.sample_subject(self.spec.stage, self.spec.cluster, self.rank)
        while True:
            try:
                expected = int(sum(self.view.capacity().accelerators.values()))
                sample = await asyncio.to_thread(
                    sampler.sample, self.spec.cluster, self.rank, self.spec.instance_id,
                    self.clock.now().isoformat(), expected_gpus=expected, busy_gpus=self._busy_gpus(expected))
                await self.bus.nc.publish(subject, sample.model_dump_json(exclude_defaults=True).encode())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("node sample not sent: %s", exc)
            await asyncio.sleep(self.sample_s)

    def _ip(self) -> str:
        if self.spec.node_ips and self.rank < len(self.spec.node_ips):
            return self.spec.node_ips[self.rank]
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"
