"""A scripted event history for the ledger tests: every event type, deterministic ids and times."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from skypurza.events import naming
from skypurza.events.envelope import Envelope, Event, make_envelope
from skypurza.events.models import (
    AutostopSet, CancelRequested, CapacityError, CleanupFailed, ClusterIdle, ClusterProvisioned, ClusterStarted,
    ClusterStopped, ClusterTerminated, CompensationRecorded, DownRequested, JobCancelled, JobFailed,
    JobNodeFinished, JobQueued, JobStarted, JobSucceeded, ManagedJobCancelRequested,
    ManagedJobStatusChanged, ManagedJobSubmitted, NodeLost, NodeReady, OrphanFound, PeriodSettled,
    PlacementChosen, PlacementFailed, ProvisionFailed, SlurmAllocationAccounted, SpotPreempted, StartRequested,
    StopRequested, TaskSubmitted, UsageRecorded,
)
from skypurza.events.types import Attempt, Candidate, NodeInfo

NS = uuid.UUID("0f5e8a3c-4b1d-4c2e-9a7f-1e2d3c4b5a69")
T0 = datetime(2026, 10, 30, 22, 0, tzinfo=UTC)


class History:
    def __init__(self, t0: datetime = T0, source: str = "/tests/history", prefix: str = "event"):
        self.envs: list[Envelope] = []
        self.t = t0
        self.source = source
        self.prefix = prefix
        self.named = 0

    def add(self, event: Event, *, at: datetime | None = None, advance: timedelta = timedelta(seconds=1),
            name: str | None = None) -> Envelope:
        """`name` gives an event added to an existing history an id of its own, so that the
        numbered ids of the events after it (and the golden log's bytes) do not move."""
        if at is not None:
            self.t = at
        key = f"{self.prefix}-{name}" if name else f"{self.prefix}-{len(self.envs) - self.named}"
        self.named += 1 if name else 0
        env = make_envelope(event, source=self.source, id=str(uuid.uuid5(NS, key)), time=self.t)
        self.envs.append(env)
        self.t = self.t + advance
        return env

    def lines(self) -> list[bytes]:
        return [e.to_json() for e in self.envs]


def cand(**kw: Any) -> Candidate:
    base = dict(infra="aws", region="us-east-1", zone="us-east-1a", instance_type="g5.xlarge",
                accelerators={"A10G": 1}, use_spot=False, vcpus=4, memory_gib=16, hourly_price_micros=1_006_000,
                num_nodes=1)
    base.update(kw)
    return Candidate(**base)


def scripted() -> History:
    """A small history that touches every table and every event type."""
    h = History()
    task = {"name": "train", "setup": "pip install x", "run": "python train.py",
            "resources": {"labels": {"team": "ml", "project": "llm"}}}
    # --- c1: capacity error, failover, provisioned, jobs, stop/start, terminated
    h.add(TaskSubmitted(task_id="t1", cluster="c1", task=task, num_nodes=2, user="alice"))
    pc1 = h.add(PlacementChosen(task_id="t1", cluster="c1", attempt=1, candidate=cand(num_nodes=2), num_nodes=2))
    h.add(CapacityError(task_id="t1", cluster="c1", placement_id=pc1.id, attempt=1, candidate=cand(num_nodes=2),
                        error_class="capacity", code="InsufficientInstanceCapacity", message="no capacity"))
    c2 = cand(region="us-east-2", zone="us-east-2b", hourly_price_micros=1_100_000, num_nodes=2)
    pc2 = h.add(PlacementChosen(task_id="t1", cluster="c1", attempt=2, candidate=c2, num_nodes=2))
    launched = h.t
    h.add(ClusterProvisioned(cluster="c1", task_id="t1", placement_id=pc2.id, candidate=c2,
                             nodes=[NodeInfo(rank=0, instance_id="i-0", private_ip="10.0.0.1", zone="us-east-2b"),
                                    NodeInfo(rank=1, instance_id="i-1", private_ip="10.0.0.2", zone="us-east-2b")],
                             hourly_price_micros=1_100_000, launched_at=launched, user="alice", idle_minutes=30))
    h.add(NodeReady(cluster="c1", rank=0, host="h0", agent_id="a0"))
    h.add(NodeReady(cluster="c1", rank=1, host="h1", agent_id="a1"))
    h.add(JobQueued(cluster="c1", job_id=1, task_id="t1", task=task, name="train", user="alice"))
    h.add(JobStarted(cluster="c1", job_id=1, started_at=h.t))
    h.add(JobNodeFinished(cluster="c1", job_id=1, rank=0, phase="setup", exit_code=0))
    h.add(JobNodeFinished(cluster="c1", job_id=1, rank=1, phase="setup", exit_code=0))
    h.add(JobNodeFinished(cluster="c1", job_id=1, rank=0, phase="run", exit_code=0))
    h.add(JobSucceeded(cluster="c1", job_id=1, ended_at=h.t))
    h.add(JobQueued(cluster="c1", job_id=2, task_id="t1b", task={"run": "sleep 100"}, user="bob"))
    h.add(JobStarted(cluster="c1", job_id=2, started_at=h.t))
    h.add(CancelRequested(cluster="c1", job_id=2, requested_by="bob"))
    h.add(JobCancelled(cluster="c1", job_id=2, ended_at=h.t))
    h.add(JobQueued(cluster="c1", job_id=3, task_id="t1c", task={"setup": "false", "run": "x"}, user="alice"))
    h.add(JobStarted(cluster="c1", job_id=3, started_at=h.t))
    h.add(JobFailed(cluster="c1", job_id=3, ended_at=h.t, phase="setup", exit_code=1, failed_rank=1, reason="setup failed"))
    h.add(JobQueued(cluster="c1", job_id=4, task_id="t1d", task={"run": "exit 3"}, user="alice"))
    h.add(JobStarted(cluster="c1", job_id=4, started_at=h.t))
    h.add(JobFailed(cluster="c1", job_id=4, ended_at=h.t, phase="run", exit_code=3, failed_rank=0, reason="exit 3"))
    h.add(AutostopSet(cluster="c1", idle_minutes=10, down=True))
    h.add(ClusterIdle(cluster="c1", idle_since=h.t, idle_minutes=10, down=False))
    h.add(StopRequested(cluster="c1", reason="autostop"))
    stop_at = launched + timedelta(minutes=30, seconds=15)
    h.add(ClusterStopped(cluster="c1", stopped_at=stop_at), at=stop_at)
    h.add(StartRequested(cluster="c1"))
    start2 = stop_at + timedelta(hours=2)
    h.add(ClusterStarted(cluster="c1", started_at=start2,
                         nodes=[NodeInfo(rank=0, instance_id="i-0", zone="us-east-2b"),
                                NodeInfo(rank=1, instance_id="i-1", zone="us-east-2b")]), at=start2)
    h.add(DownRequested(cluster="c1", reason="user", requested_by="alice"))
    end = start2 + timedelta(minutes=45, seconds=30, microseconds=250_000)
    # A teardown's warning comes before its ClusterTerminated and changes nothing billed.
    h.add(CleanupFailed(cluster="c1", region="us-east-2", resource_type="placement-group",
                        resource=naming.placement_group("dev", "c1"), code="NotImplemented", message="not implemented here",
                        will_retry=False, failed_at=end), at=end, name="c1-cleanup-warning")
    h.add(ClusterTerminated(cluster="c1", terminated_at=end, reason="user", instance_ids=["i-0", "i-1"]), at=end)
    # --- t2: no placement at all; t3: fatal provisioning error
    h.add(TaskSubmitted(task_id="t2", cluster="c2", task={"run": "x"}, user="bob", team="infra"))
    h.add(PlacementFailed(task_id="t2", cluster="c2", reason="no candidate has capacity",
                          attempts=[Attempt(candidate=cand(), error_class="capacity", code="ICE", message="none")]))
    h.add(TaskSubmitted(task_id="t3", cluster="c3", task={"run": "x"}, user="bob", team="infra"))
    pc3 = h.add(PlacementChosen(task_id="t3", cluster="c3", attempt=1, candidate=cand()))
    h.add(ProvisionFailed(task_id="t3", cluster="c3", placement_id=pc3.id, candidate=cand(), error_class="auth",
                          code="UnauthorizedOperation", message="not allowed"))
    # --- a managed job on spot: preempted, recovered, cancelled
    h.add(ManagedJobSubmitted(managed_job_id=1, name="mj", tasks=[{"run": "x"}], user="carol", team="research",
                              project="p1"))
    h.add(TaskSubmitted(task_id="t4", cluster="mj-1", kind="managed", task={"run": "x"}, user="carol",
                        team="research", project="p1", managed_job_id=1))
    sc = cand(use_spot=True, hourly_price_micros=400_000, zone="us-east-1c")
    pc4 = h.add(PlacementChosen(task_id="t4", cluster="mj-1", attempt=1, candidate=sc))
    h.add(ManagedJobStatusChanged(managed_job_id=1, status="STARTING", kind="launch", cluster="mj-1"))
    la = h.t
    h.add(ClusterProvisioned(cluster="mj-1", task_id="t4", placement_id=pc4.id, candidate=sc,
                             nodes=[NodeInfo(rank=0, instance_id="i-9", zone="us-east-1c")],
                             hourly_price_micros=400_000, launched_at=la, user="carol", team="research",
                             project="p1", managed_job_id=1, tres={"cpu": 4, "mem": 16384, "node": 1,
                                                                   "gres/gpu": 1, "gres/gpu:a10g": 1}))
    h.add(ManagedJobStatusChanged(managed_job_id=1, status="RUNNING", kind="started", cluster="mj-1"))
    pre = la + timedelta(minutes=70)
    h.add(SpotPreempted(cluster="mj-1", rank=0, instance_id="i-9", detected_at=pre, evidence={"imds": "terminate"}), at=pre)
    h.add(ManagedJobStatusChanged(managed_job_id=1, status="RECOVERING", kind="preempted", cluster="mj-1"))
    h.add(ClusterTerminated(cluster="mj-1", terminated_at=pre + timedelta(seconds=30), reason="recovery"))
    h.add(ManagedJobStatusChanged(managed_job_id=1, status="RUNNING", kind="started", cluster="mj-1", recoveries=1))
    h.add(ManagedJobCancelRequested(managed_job_id=1, requested_by="carol"))
    h.add(ManagedJobStatusChanged(managed_job_id=1, status="CANCELLING", kind="cancelling", cluster="mj-1", recoveries=1))
    h.add(ManagedJobStatusChanged(managed_job_id=1, status="CANCELLED", kind="cancelled", cluster="mj-1", recoveries=1))
    h.add(ManagedJobStatusChanged(managed_job_id=1, status="RUNNING", kind="started", cluster="mj-1", recoveries=2))  # ignored: ended
    # --- a cluster that loses a node, and an orphan
    h.add(TaskSubmitted(task_id="t5", cluster="c5", task={"run": "x"}, user="dave"))
    pc5 = h.add(PlacementChosen(task_id="t5", cluster="c5", attempt=1, candidate=cand(instance_type="m6i.large",
                                                                                      accelerators=None, vcpus=2, memory_gib=8,
                                                                                      hourly_price_micros=96_000)))
    h.add(ClusterProvisioned(cluster="c5", task_id="t5", placement_id=pc5.id,
                             candidate=cand(instance_type="m6i.large", accelerators=None, vcpus=2, memory_gib=8,
                                            hourly_price_micros=96_000),
                             nodes=[NodeInfo(rank=0, instance_id="i-5")], hourly_price_micros=96_000,
                             launched_at=h.t, user="dave"))
    h.add(NodeLost(cluster="c5", rank=0, instance_id="i-5", detected_at=h.t))
    h.add(OrphanFound(cluster="?", instance_id="i-orphan", region="us-east-1", action="reported"))
    # --- a Slurm allocation: its ticks carry money, sacct's accounting its billing-seconds
    slc = cand(infra="slurm", region="hpc", zone="gpu", instance_type="2cpu-4096mb-H100x1", accelerators={"H100": 1},
               vcpus=2, memory_gib=4, hourly_price_micros=2_500_000)
    h.add(TaskSubmitted(task_id="t6", cluster="sl6", task={"run": "x"}, user="erin", team="hpc"), name="sl6-submit")
    pc6 = h.add(PlacementChosen(task_id="t6", cluster="sl6", attempt=1, candidate=slc), name="sl6-placed")
    sl_start = h.t
    h.add(ClusterProvisioned(cluster="sl6", task_id="t6", placement_id=pc6.id, candidate=slc,
                             nodes=[NodeInfo(rank=0, instance_id="77.0", zone="gpu")], hourly_price_micros=2_500_000,
                             launched_at=sl_start, user="erin", team="hpc"), name="sl6-provisioned")
    sl_end = sl_start + timedelta(minutes=12, seconds=5)
    h.add(SlurmAllocationAccounted(
        cluster="sl6", slurm_cluster="hpc", slurm_job_id=77, partition="gpu", state="CANCELLED",
        alloc_tres={"cpu": 2, "mem": 4096, "node": 1, "gres/gpu": 1, "gres/gpu:h100": 1}, slurm_billing=4,
        elapsed_s=723, start=sl_start + timedelta(seconds=1), end=sl_end - timedelta(seconds=1),
        billing_weights="CPU=1.0,Mem=0.25G,GRES/gpu=2.0,GRES/gpu:h100=4.0", priority_flags="MAX_TRES",
        instance_ids=["77.0"]), at=sl_end, name="sl6-accounted")
    h.add(ClusterTerminated(cluster="sl6", terminated_at=sl_end, reason="user", instance_ids=["77.0"]), at=sl_end,
          name="sl6-terminated")
    return h


def usage(cluster: str, rank: int, start: datetime, end: datetime, cost: int, *, team: str | None = "ml",
          user: str = "alice", billing_seconds: int = 0, lifetime_id: str = "", **kw: Any) -> UsageRecorded:
    return UsageRecorded(cluster=cluster, rank=rank, instance_id=f"i-{rank}", start=start, end=end,
                         instance_type="g5.xlarge", region="us-east-2", zone="us-east-2b",
                         hourly_price_micros=1_100_000, cost_micros=cost, tres={"cpu": 4, "node": 1},
                         billing_seconds=billing_seconds, user=user, team=team, project="llm",
                         lifetime_id=lifetime_id, **kw)


def settlement_tail(h: History, offset: int = 0) -> None:
    """Usage in October, the settlement of October, then a late October interval.

    `offset`: how many events the log holds before `h`'s (the settlement's through_seq is the
    sequence of the event just before it)."""
    oct31 = datetime(2026, 10, 31, 23, 0, tzinfo=UTC)
    h.add(usage("c9", 0, oct31, oct31 + timedelta(minutes=1), 18_333, billing_seconds=240))
    h.add(usage("c9", 0, oct31 + timedelta(minutes=1), oct31 + timedelta(minutes=2), 18_334, billing_seconds=240))
    h.add(usage("c9", 1, oct31, oct31 + timedelta(minutes=1), 18_333, team=None, user="zed"))
    settled = h.add(PeriodSettled(period="2026-10", settled_at=datetime(2026, 11, 1, 1, tzinfo=UTC),
                                  totals_micros={"ml": 36_667, "(none)": 18_333},
                                  billing_seconds={"ml": 480, "(none)": 0}, through_seq=offset + len(h.envs)))
    late = h.add(usage("c9", 0, oct31 + timedelta(minutes=2), oct31 + timedelta(minutes=3), 18_333, billing_seconds=240))
    h.add(usage("c9", 0, datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 1, 0, 1, tzinfo=UTC), 18_333))
    h.add(CompensationRecorded(period="2026-11", for_period="2026-10", team="ml", amount_micros=18_333,
                               usage_event_id=late.id))
    del settled


def unknown_and_poison() -> list[bytes]:
    future = {"specversion": "1.0", "id": str(uuid.uuid5(NS, "future")), "source": "/tests", "type":
              "io.skypurza.future_thing.v1", "time": "2026-11-02T00:00:00Z", "subject": "task/x", "data": {}}
    poison = {"specversion": "1.0", "id": str(uuid.uuid5(NS, "poison")), "source": "/tests", "type":
              "io.skypurza.job_started.v1", "time": "2026-11-02T00:00:00Z", "subject": "cluster/c1",
              "data": {"cluster": "c1"}}
    return [json.dumps(future).encode(), json.dumps(poison).encode()]


# ---------------------------------------------------------------- running the ledger in tests


async def publish_all(bus: Any, envs: list[Envelope], extra_raw: list[bytes] = ()) -> int:
    """Publish the envelopes (each with its Nats-Msg-Id), then raw payloads; returns the last seq."""
    await bus.publish_many(envs)
    for raw in extra_raw:
        await bus.js.publish(f"{bus.subject_of(envs[0]).rsplit('.evt.', 1)[0]}.evt.task.x.raw", raw)
    return await bus.last_seq()


async def table_rows(con: Any, table: str) -> list[tuple]:
    from skypurza.services.ledger.schema import BY_NAME

    t = BY_NAME[table]
    return con.execute(f'SELECT * FROM "{table}" ORDER BY {t.order_by}').fetchall()
