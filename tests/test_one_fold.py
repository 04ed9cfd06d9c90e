"""One fold: every reader of a cluster's events reports the same cluster and job states.

Generated histories of one cluster (launches, jobs that start, set up, run, succeed, fail in
each phase, are cancelled; stops, starts, lost nodes, teardowns, a new cluster under the old
name, redelivered reports) and the golden log's clusters go to every reader:
- the CLI's fold (`cli/clusterlog.py`, what `spz logs`, `spz exec`, `spz cancel` decide on);
- the node agent's view (`services/agent/view.py`, what the agents act on);
- the provisioner's state (`services/provisioner/state.py`, newest lifecycle events only);
- the status service: its real projector writing a real DuckDB file, read back with the queries
  that answer `spz status` and `spz queue`;
- recovery's state machine, for the managed-job status a job's end gives;
and each must say what `events/fold.py` `fold_cluster` says.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from skypurza.cli import clusterlog
from skypurza.events import fold
from skypurza.events.bus import Stored
from skypurza.events.envelope import Envelope, decode, make_envelope
from skypurza.events.models import (
    AutostopSet, CancelRequested, ClusterProvisioned, ClusterStarted, ClusterStopped, ClusterTerminated,
    DownRequested, JobCancelled, JobFailed, JobNodeFinished, JobQueued, JobStarted, JobSucceeded, NodeLost,
    NodeReady, SpotPreempted,
)
from skypurza.events.projection.pipeline import Projector
from skypurza.events.types import Candidate, NodeInfo
from skypurza.services.agent.view import ClusterView
from skypurza.services.provisioner.state import cluster_state, fold_live
from skypurza.services.recovery import machine
from skypurza.services.status import queries
from skypurza.services.status.projector import PROJECTION

NS = uuid.UUID("5b0c1f0e-6a8e-4d0b-9d35-0a4c3e1f7b21")
T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
GOLDEN = Path(__file__).parent / "golden" / "events.jsonl"
LIFECYCLE = (ClusterProvisioned, ClusterTerminated, ClusterStopped, ClusterStarted)


# ---------------------------------------------------------------------------------- histories


@dataclass
class Script:
    """Turns generated steps into one cluster's events with envelopes, as the log would hold them."""

    cluster: str
    envs: list[Envelope] = field(default_factory=list)
    t: datetime = T0
    next_job: int = 1
    reports: dict[tuple[int, int, str], Envelope] = field(default_factory=dict)
    ends: dict[int, Envelope] = field(default_factory=dict)

    def add(self, event: Any, id: str | None = None) -> Envelope:
        env = make_envelope(event, source="/tests/one-fold", time=self.t,
                            id=id or str(uuid.uuid5(NS, f"{self.cluster}-{len(self.envs)}")))
        self.envs.append(env)
        self.t += timedelta(seconds=7)
        return env

    def job(self, pick: int) -> int:
        # Mostly a job that exists; now and then one that never was (a foreign or stale event).
        return pick % (self.next_job - 1) + 1 if self.next_job > 1 and pick < 9 else 99

    def step(self, kind: str, a: int, b: int, c: int) -> None:
        name, t = self.cluster, self.t
        if kind == "provision":
            n = a % 3 + 1
            self.add(ClusterProvisioned(
                cluster=name, task_id=f"t-{len(self.envs)}", placement_id=f"p-{len(self.envs)}",
                candidate=Candidate(infra="aws", region="us-east-1", instance_type="m6i.large", num_nodes=n,
                                    hourly_price_micros=96_000),
                nodes=[NodeInfo(rank=r, instance_id=f"i-{len(self.envs)}-{r}") for r in range(n)],
                hourly_price_micros=96_000, launched_at=t, user="alice"))
        elif kind == "start":
            self.add(ClusterStarted(cluster=name, started_at=t))
        elif kind == "stop":
            self.add(ClusterStopped(cluster=name, stopped_at=t))
        elif kind == "terminate":
            self.add(ClusterTerminated(cluster=name, terminated_at=t))
        elif kind == "preempt":
            self.add(SpotPreempted(cluster=name, rank=a % 3, instance_id="i-x", detected_at=t))
        elif kind == "lost":
            self.add(NodeLost(cluster=name, rank=a % 3, detected_at=t))
        elif kind == "ready":
            self.add(NodeReady(cluster=name, rank=a % 3))
        elif kind == "autostop":
            self.add(AutostopSet(cluster=name, idle_minutes=a % 60 or None, down=bool(b % 2)))
        elif kind == "down":
            self.add(DownRequested(cluster=name))
        elif kind == "queue":
            task: dict[str, Any] = {"run": "python x.py"}
            if a % 4:
                task["num_nodes"] = a % 4
            if b % 3:
                task["setup"] = "pip install x"
            self.add(JobQueued(cluster=name, job_id=self.next_job, task_id=f"t-{self.next_job}", task=task,
                               run_setup=bool(c % 3), user="alice"))
            self.next_job += 1
        elif kind == "job_started":
            self.add(JobStarted(cluster=name, job_id=self.job(a), started_at=t))
        elif kind == "node_finished":
            job, rank, phase = self.job(a), b % 3, ("setup", "run")[c % 2]
            key = (job, rank, phase)
            if key in self.reports:
                # A report sent again (a restarted agent): the same event, the same derived id.
                self.envs.append(self.reports[key])
                return
            code = (0, 0, 1, -1)[(a + b + c) % 4]
            self.reports[key] = self.add(JobNodeFinished(cluster=name, job_id=job, rank=rank, phase=phase,
                                                         exit_code=code),
                                         id=str(uuid.uuid5(NS, f"{name}-{job}-{rank}-{phase}")))
        elif kind == "cancel_requested":
            self.add(CancelRequested(cluster=name, job_id=self.job(a)))
        elif kind in ("succeeded", "failed", "cancelled"):
            job = self.job(a)
            if kind == "succeeded":
                ev: Any = JobSucceeded(cluster=name, job_id=job, ended_at=t)
            elif kind == "cancelled":
                ev = JobCancelled(cluster=name, job_id=job, ended_at=t)
            else:
                ev = JobFailed(cluster=name, job_id=job, ended_at=t, phase=("setup", "run", "agent")[b % 3],
                               exit_code=(None, 1, 3)[c % 3], failed_rank=b % 2, reason="failed")
            # The head decides once (one key for every outcome), so a second end has the same id.
            end = self.add(ev, id=str(uuid.uuid5(NS, f"{name}-{job}-outcome")))
            if job in self.ends:
                self.envs[-1] = self.ends[job]
            else:
                self.ends[job] = end


KINDS = ["provision", "start", "stop", "terminate", "preempt", "lost", "ready", "autostop", "down",
         "queue", "queue", "job_started", "job_started", "node_finished", "node_finished", "node_finished",
         "cancel_requested", "succeeded", "failed", "failed", "cancelled"]
STEP = st.tuples(st.sampled_from(KINDS), st.integers(0, 11), st.integers(0, 11), st.integers(0, 11))


def history(cluster: str, steps: list[tuple[str, int, int, int]], provision_first: bool) -> list[Envelope]:
    s = Script(cluster)
    if provision_first:
        s.step("provision", 1, 0, 0)
    for kind, a, b, c in steps:
        s.step(kind, a, b, c)
    return s.envs


# ---------------------------------------------------------------------------------- readers


def events_of(envs: list[Envelope]) -> list[Any]:
    return [decode(e.to_json()).event for e in envs]


def cli_reader(cluster: str, envs: list[Envelope]) -> clusterlog.Cluster:
    return clusterlog.fold(cluster, [(decode(e.to_json()).event, e.time, i + 1) for i, e in enumerate(envs)])


def agent_reader(cluster: str, envs: list[Envelope]) -> ClusterView:
    view = ClusterView(cluster, 1)
    for i, e in enumerate(envs):
        view.apply_all_or_nothing(decode(e.to_json()).event, e.id, e.time, i + 1)  # type: ignore[arg-type]
    return view


def stored(envs: list[Envelope]) -> list[Stored]:
    return [Stored(i + 1, f"x.{e.event_name}", e.time, e, decode(e.to_json()).event, "ok")
            for i, e in enumerate(envs)]


def provisioner_reader(cluster: str, envs: list[Envelope]) -> tuple[bool, bool, bool]:
    """(live, stopped, in the live set): from the newest event of each lifecycle type, as
    `load_cluster_state` reads them with `bus.last_event`, and from `fold_live`."""
    newest: dict[type, Stored] = {}
    for s in stored(envs):
        if type(s.event) in LIFECYCLE:
            newest[type(s.event)] = s
    state = cluster_state(cluster, *(newest.get(t) for t in LIFECYCLE))
    return state.live, state.stopped, cluster in fold_live(stored(envs))


def status_reader(path: Path, envs: list[Envelope], clusters: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Clusters by name and jobs by (cluster, job_id), from a real DuckDB file written by the
    status service's projector and read with the queries behind `spz status -a` and `spz queue`."""
    proj = Projector(path, PROJECTION)
    try:
        changes, err = proj.apply_raw([(i + 1, 0, e.to_json()) for i, e in enumerate(envs)])
        assert err is None
        proj.write(changes)
        cur = proj.con.cursor()
        status = {c["name"]: c for c in queries.status(cur, {"all": True, "clusters": clusters})}
        jobs = {(j["cluster"], j["job_id"]): j for j in queries.queue(cur, {"clusters": clusters})}
        unfinished = {(j["cluster"], j["job_id"]) for j in queries.queue(cur, {"clusters": clusters,
                                                                               "skip_finished": True})}
    finally:
        proj.close()
    for key, j in jobs.items():
        j["unfinished"] = key in unfinished
    return status, jobs


def recovery_status(end: Any) -> str:
    """The managed-job status recovery's machine gives when its current cluster's job ends with
    `end` (a job with no restarts on errors), the fact built as the recovery service builds it."""
    from skypurza.events.managed_events import ManagedJobSubmitted

    s = machine.apply(None, ManagedJobSubmitted(managed_job_id=7, name="train", tasks=[{"run": "x"}]), seq=1, at=T0)
    assert s is not None
    for make in (lambda c: machine.Kick(), machine.JobStartedF, lambda c: _end_fact(c, end)):
        t = machine.decide(s, make(s.cluster))
        assert t is not None
        nxt = machine.apply(s, t.event(s.job_id), seq=s.last_seq + 1, at=T0)
        assert nxt is not None
        s = nxt
    assert s.terminal
    return s.status


def _end_fact(cluster: str, end: Any) -> Any:
    if isinstance(end, JobSucceeded):
        return machine.JobSucceededF(cluster)
    if isinstance(end, JobCancelled):
        return machine.JobCancelledF(cluster)
    return machine.JobFailedF(cluster, end.phase, end.exit_code, end.reason)


# ---------------------------------------------------------------------------------- agreement


def check_agreement(cluster: str, envs: list[Envelope], projected: tuple[dict[str, Any], dict[str, Any]]) -> None:
    events = events_of(envs)
    want = fold.fold_cluster(cluster, events)
    status, status_jobs = projected

    # the cluster's status
    cli = cli_reader(cluster, envs)
    agent = agent_reader(cluster, envs)
    live, stopped, in_live_set = provisioner_reader(cluster, envs)
    assert cli.status == want.status, "CLI"
    assert agent.status == want.status and agent.stopped == (want.status == "STOPPED"), "agent"
    assert agent.terminated == (want.status == "TERMINATED"), "agent"
    assert live == (want.status in fold.CLUSTER_LIVE) == in_live_set, "provisioner"
    assert stopped == (want.status == "STOPPED"), "provisioner"
    if cluster in status:
        assert status[cluster]["status"] == want.status, "status"
    else:  # the status service keeps no record of a cluster that never came up (as SkyPilot)
        assert want.status in (None, "TERMINATED") and not any(isinstance(e, ClusterProvisioned) for e in events)

    # every job's status, final or not, exit code, and what `spz logs --status` exits with
    assert set(cli.jobs) == set(want.current_jobs()), "CLI jobs"
    assert set(agent.jobs) == set(want.jobs), "agent jobs"
    assert {j for (c, j) in status_jobs if c == cluster} == set(want.jobs), "status jobs"
    ends = {}
    for e, ev in zip(envs, events):
        if isinstance(ev, (JobSucceeded, JobFailed, JobCancelled)) and ev.job_id not in ends:
            ends[ev.job_id] = ev
    for job_id, job in want.jobs.items():
        row = status_jobs[(cluster, job_id)]
        assert row["status"] == job.status, f"status job {job_id}"
        assert row["unfinished"] == (not job.terminal), f"status skip_finished, job {job_id}"
        assert (row["exit_code"], row["failed_rank"], row["num_nodes"]) == (job.exit_code, job.failed_rank,
                                                                            job.num_nodes), f"status job {job_id}"
        view = agent.jobs[job_id]
        assert view.terminal == job.terminal and view.num_nodes == job.num_nodes, f"agent job {job_id}"
        assert view.status == (job.status if job.terminal else None), f"agent job {job_id}"
        if job_id in cli.jobs:
            shown = cli.jobs[job_id]
            assert (shown.status, shown.exit_code, shown.num_nodes) == (job.status, job.exit_code, job.num_nodes)
            assert clusterlog.exit_code_of(shown.status) == fold.exit_code_of(job.status)
        if job.terminal:
            end = ends[job_id]
            assert fold.status_on_end(end) == job.status
            assert recovery_status(end) == fold.managed_status_of_job(job.status), f"recovery, job {job_id}"


def _ends_in(phase: int) -> list[tuple[str, int, int, int]]:
    return [("queue", 0, 0, 1), ("job_started", 0, 0, 0), ("failed", 0, phase, 1)]


# Setup on both nodes of a 2-node cluster, then the run, then success (SETTING_UP → RUNNING).
_SET_UP = [("provision", 1, 0, 0), ("queue", 0, 1, 1), ("job_started", 0, 0, 0), ("node_finished", 0, 0, 0),
           ("node_finished", 0, 1, 0), ("node_finished", 0, 0, 1), ("succeeded", 0, 0, 0)]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEP, min_size=8, max_size=40), provision_first=st.booleans())
@example(steps=_ends_in(0), provision_first=True)  # setup → FAILED_SETUP
@example(steps=_ends_in(1), provision_first=True)  # run → FAILED
@example(steps=_ends_in(2), provision_first=True)  # agent → FAILED_DRIVER (recovery: FAILED_CONTROLLER)
@example(steps=_SET_UP, provision_first=False)
@example(steps=_SET_UP[:5], provision_first=False)  # one node of two set up: still SETTING_UP
@example(steps=[("queue", 0, 0, 1), ("preempt", 0, 0, 0), ("start", 0, 0, 0), ("terminate", 0, 0, 0),
                ("stop", 0, 0, 0), ("provision", 2, 0, 0), ("queue", 0, 0, 1)], provision_first=True)
@example(steps=[("stop", 0, 0, 0), ("terminate", 0, 0, 0), ("start", 0, 0, 0), ("queue", 0, 0, 1)],
         provision_first=False)  # torn down before it came up
def test_every_reader_reports_the_fold_of_generated_histories(tmp_path_factory, steps, provision_first):
    envs = history("c1", steps, provision_first)
    path = tmp_path_factory.mktemp("fold") / "status.duckdb"
    check_agreement("c1", envs, status_reader(path, envs, ["c1"]))


def test_every_reader_reports_the_fold_of_the_golden_log(tmp_path):
    lines = [line for line in GOLDEN.read_bytes().splitlines() if line.strip()]
    envs: list[Envelope] = []
    seen: set[str] = set()
    for line in lines:
        try:
            d = decode(line)
        except Exception:
            continue  # the golden log's poison lines
        # The log as our bus stores it: the envelope id is the Nats-Msg-Id, so a second event
        # with an id already stored is dropped (the golden log stores one usage interval twice).
        if d.event is not None and d.envelope is not None and d.envelope.id not in seen:
            seen.add(d.envelope.id)
            envs.append(d.envelope)
    by_cluster: dict[str, list[Envelope]] = defaultdict(list)
    for e in envs:
        if e.subject.startswith("cluster/") and e.event_name != "usage_recorded":
            by_cluster[e.subject.split("/", 1)[1]].append(e)
    # The status service reads the whole log (task and managed-job events too), as it does live.
    status, jobs = status_reader(tmp_path / "golden.duckdb", envs, sorted(by_cluster))
    checked = 0
    for cluster, cenvs in sorted(by_cluster.items()):
        if cluster == "?":
            continue  # the orphan sweep's events belong to no cluster
        check_agreement(cluster, cenvs, (status, jobs))
        checked += 1
    assert checked >= 3
    assert {c: status[c]["status"] for c in ("c1", "c5", "mj-1")} == {
        "c1": "TERMINATED", "c5": "INIT", "mj-1": "TERMINATED"}
    assert [jobs[("c1", j)]["status"] for j in (1, 2, 3, 4)] == ["SUCCEEDED", "CANCELLED", "FAILED_SETUP", "FAILED"]


def test_the_vocabulary_is_skypilots_and_written_once():
    # A JobFailed in each phase: one status for every reader (issue 13: the agent phase was
    # FAILED_DRIVER in the CLI, FAILED in the ledger and FAILED_SETUP in recovery).
    assert [fold.job_status_of_failure(p) for p in ("setup", "run", "agent")] == [
        "FAILED_SETUP", "FAILED", "FAILED_DRIVER"]
    assert [fold.managed_status_of_job(s) for s in ("FAILED_SETUP", "FAILED", "FAILED_DRIVER")] == [
        "FAILED_SETUP", "FAILED", "FAILED_CONTROLLER"]
    assert fold.JOB_TERMINAL == {"SUCCEEDED", "FAILED", "FAILED_SETUP", "FAILED_DRIVER", "CANCELLED"}
    assert set(clusterlog.TERMINAL_JOB) == fold.JOB_TERMINAL and set(queries._JOB_TERMINAL) == fold.JOB_TERMINAL
    assert [fold.exit_code_of(s) for s in ("SUCCEEDED", "FAILED_DRIVER", "SETTING_UP", "CANCELLED", None,
                                           "FAILED_NO_RESOURCE", "RECOVERING")] == [0, 100, 101, 103, 102, 100, 101]
    assert fold.LEGACY_JOB_STATUS["SETUP"] == "SETTING_UP"
    assert json.dumps(fold.JOB_STATUSES)  # plain strings, as every table and JSON output shows them
