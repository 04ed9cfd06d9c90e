"""The status service's reducers: what `spz status`, `queue` and `jobs queue` show, pure and in memory.

Clusters, nodes, placements and node runs are the open fleet reducers (events/projection/fleet.py,
which the ledger's private copy runs too); this module adds launch attempts, jobs and managed
jobs, and follows the meter's usage along the node runs (a cluster's cost so far). Cluster and
job states are the one fold's (events/fold.py). Idempotent per event id and checked per event
against the columns (events/projection/state.py); nothing here does I/O.
"""

from __future__ import annotations

from typing import Any

from skypurza.events import fold
from skypurza.events.jobdemand import describe_task
from skypurza.events.managed_events import TERMINAL_STATUSES as MANAGED_TERMINAL
from skypurza.events.models import (
    CancelRequested, CapacityError, ClusterProvisioned, JobCancelled, JobFailed, JobNodeFinished, JobQueued,
    JobStarted, JobSucceeded, ManagedJobCancelRequested, ManagedJobStatusChanged, ManagedJobSubmitted,
    PlacementChosen, ProvisionFailed, UsageRecorded,
)
from skypurza.events.projection import store as ps
from skypurza.events.projection.fleet import HANDLERS as FLEET_HANDLERS
from skypurza.events.projection.fleet import FleetState, advance_run, candidate_fields, is_repeat, usage_times
from skypurza.events.projection.records import Record
from skypurza.events.projection.state import Fold, Reducer, compose, new_row, utc
from skypurza.events.types import Candidate

from . import schema as sc

JOB_TERMINAL = fold.JOB_TERMINAL
MUTABLE = (sc.CLUSTERS, sc.NODES, sc.JOBS, sc.MANAGED_JOBS, sc.PLACEMENTS, sc.ATTEMPTS, sc.NODE_RUNS)


class StatusState(FleetState):
    MUTABLE = MUTABLE
    RUNS = sc.NODE_RUNS

    def __init__(self) -> None:
        super().__init__()
        self.task_attempts: dict[str, set[int]] = {}

    def on_put(self, table: str, key: Any, row: dict[str, Any]) -> None:
        super().on_put(table, key, row)
        if table == "attempts":
            self.task_attempts.setdefault(key[0], set()).add(key[1])

    def index(self) -> None:
        super().index()
        self.task_attempts.clear()
        for t, a in self.rows["attempts"]:
            self.task_attempts.setdefault(t, set()).add(a)


# ---------------------------------------------------------------- launch attempts


def _attempt_chosen(state: StatusState, rec: Record, ev: PlacementChosen) -> None:
    key = (ev.task_id, ev.attempt)
    if state.get("attempts", key) is None:
        state.put("attempts", key, new_row(
            sc.ATTEMPTS, task_id=ev.task_id, attempt=ev.attempt, placement_id=rec.id, cluster=ev.cluster,
            num_nodes=ev.num_nodes, chosen_at=utc(rec.time), outcome="chosen", last_event_seq=rec.seq,
            **candidate_fields(ev.candidate)))


def _attempt_by_placement(state: StatusState, task_id: str, placement_id: str) -> dict[str, Any] | None:
    for a in sorted(state.task_attempts.get(task_id, ())):
        row = state.rows["attempts"][(task_id, a)]
        if row["placement_id"] == placement_id:
            return row
    return None


def _attempt_failed(state: StatusState, rec: Record, task_id: str, placement_id: str, attempt: int | None,
                    candidate: Candidate | None, outcome: str, error_class: str, code: str, message: str,
                    cluster: str) -> None:
    row = _attempt_by_placement(state, task_id, placement_id)
    if row is None and attempt is not None:
        row = state.get("attempts", (task_id, attempt))
    if row is None:
        n = attempt if attempt is not None else max(state.task_attempts.get(task_id, {0}), default=0) + 1
        row = state.put("attempts", (task_id, n), new_row(
            sc.ATTEMPTS, task_id=task_id, attempt=n, placement_id=placement_id, cluster=cluster,
            outcome="chosen", **(candidate_fields(candidate) if candidate else {})))
    if row["outcome"] in ("chosen",):
        row.update(outcome=outcome, error_class=error_class, error_code=code, error_message=message,
                   ended_at=utc(rec.time), last_event_seq=rec.seq)
        state.touch("attempts", (row["task_id"], row["attempt"]))


def _capacity_error(state: StatusState, rec: Record, ev: CapacityError) -> None:
    _attempt_failed(state, rec, ev.task_id, ev.placement_id, ev.attempt, ev.candidate, "capacity_error",
                    ev.error_class, ev.code, ev.message, ev.cluster)


def _attempt_provision_failed(state: StatusState, rec: Record, ev: ProvisionFailed) -> None:
    _attempt_failed(state, rec, ev.task_id, ev.placement_id, None, ev.candidate, "provision_failed",
                    ev.error_class, ev.code, ev.message, ev.cluster)


def _attempt_provisioned(state: StatusState, rec: Record, ev: ClusterProvisioned) -> None:
    a = _attempt_by_placement(state, ev.task_id, ev.placement_id)
    if a is not None and a["outcome"] == "chosen":
        a.update(outcome="provisioned", ended_at=utc(ev.launched_at), last_event_seq=rec.seq)
        state.touch("attempts", (a["task_id"], a["attempt"]))


# ---------------------------------------------------------------- node runs: the meter's usage


def _usage(state: StatusState, rec: Record, ev: UsageRecorded) -> None:
    """How far the meter reached along a node run (the ledger's own rule, `fleet.is_repeat`)."""
    if not ev.lifetime_id:
        return
    m = state.rows["node_runs"].get((ev.cluster, ev.rank, ev.lifetime_id))
    if m is None:
        return
    start, end = usage_times(ev)
    if is_repeat(m, ev, end):
        return
    advance_run(m, ev, start, end, rec.seq)
    state.touch("node_runs", (m["cluster"], m["rank"], m["lifetime_id"]))


# ---------------------------------------------------------------- jobs


def _job(state: StatusState, rec: Record, cluster: str, job_id: int) -> dict[str, Any] | None:
    j = state.get("jobs", (cluster, job_id))
    if j is None or j["status"] in JOB_TERMINAL:
        return None
    j["last_event_seq"] = rec.seq
    state.touch("jobs", (cluster, job_id))
    return j


def _job_queued(state: StatusState, rec: Record, ev: JobQueued) -> None:
    if state.get("jobs", (ev.cluster, ev.job_id)) is not None:
        return
    job = fold.job_queued(ev)
    state.put("jobs", (ev.cluster, ev.job_id), new_row(
        sc.JOBS, cluster=ev.cluster, job_id=ev.job_id, name=ev.name or ev.task.name, task_id=ev.task_id,
        user=ev.user, num_nodes=job.num_nodes, status=job.status, submitted_at=utc(rec.time),
        managed_job_id=ev.managed_job_id, skypilot_task_id=ev.skypilot_task_id or None, has_setup=job.has_setup,
        setup_done_ranks=0, cancel_requested=False, last_event_seq=rec.seq, resources=describe_task(ev.task)))


def _job_status(j: dict[str, Any]) -> str:
    return fold.LEGACY_JOB_STATUS.get(j["status"], j["status"])


def _job_started(state: StatusState, rec: Record, ev: JobStarted) -> None:
    j = _job(state, rec, ev.cluster, ev.job_id)
    if j is not None and j["status"] == "PENDING":
        j.update(status=fold.status_on_start(j["status"], j["has_setup"]), started_at=utc(ev.started_at))


def _job_node_finished(state: StatusState, rec: Record, ev: JobNodeFinished) -> None:
    j = _job(state, rec, ev.cluster, ev.job_id)
    if j is None:
        return
    # A rank is counted once: an agent's report has an id derived from (job, rank, phase), and
    # an id applied before is not applied again.
    if ev.phase == "setup" and ev.exit_code != 0:
        return
    if ev.phase == "setup":
        j["setup_done_ranks"] = (j["setup_done_ranks"] or 0) + 1
    c = state.get("clusters", ev.cluster) or {}
    j["status"] = fold.status_on_node_finished(_job_status(j), ev.phase, j["setup_done_ranks"] or 0,
                                               c.get("num_nodes") or 1)


def _job_succeeded(state: StatusState, rec: Record, ev: JobSucceeded) -> None:
    j = _job(state, rec, ev.cluster, ev.job_id)
    if j is not None:
        j.update(status=fold.status_on_end(ev), ended_at=utc(ev.ended_at), exit_code=0)


def _job_failed(state: StatusState, rec: Record, ev: JobFailed) -> None:
    j = _job(state, rec, ev.cluster, ev.job_id)
    if j is not None:
        j.update(status=fold.status_on_end(ev), ended_at=utc(ev.ended_at),
                 exit_code=ev.exit_code, failed_rank=ev.failed_rank, failed_phase=ev.phase,
                 reason=ev.reason or None)


def _cancel_requested(state: StatusState, rec: Record, ev: CancelRequested) -> None:
    j = _job(state, rec, ev.cluster, ev.job_id)
    if j is not None:
        j["cancel_requested"] = True


def _job_cancelled(state: StatusState, rec: Record, ev: JobCancelled) -> None:
    j = _job(state, rec, ev.cluster, ev.job_id)
    if j is not None:
        j.update(status=fold.status_on_end(ev), ended_at=utc(ev.ended_at))


# ---------------------------------------------------------------- managed jobs


def _managed_submitted(state: StatusState, rec: Record, ev: ManagedJobSubmitted) -> None:
    if state.get("managed_jobs", ev.managed_job_id) is not None:
        return
    state.put("managed_jobs", ev.managed_job_id, new_row(
        sc.MANAGED_JOBS, job_id=ev.managed_job_id, name=ev.name, user=ev.user, team=ev.team, project=ev.project,
        status="PENDING", num_tasks=len(ev.tasks), task_index=0, recoveries=0, restarts_on_errors=0,
        submitted_at=utc(rec.time), cancel_requested=False, last_event_seq=rec.seq))


def _managed_status(state: StatusState, rec: Record, ev: ManagedJobStatusChanged) -> None:
    j = state.get("managed_jobs", ev.managed_job_id)
    if j is None or j["status"] in MANAGED_TERMINAL:
        return
    j.update(status=ev.status, task_index=ev.task_index, recoveries=ev.recoveries,
             restarts_on_errors=ev.restarts_on_errors, last_event_seq=rec.seq,
             reason=ev.reason or j["reason"])
    if ev.cluster is not None:
        j["cluster"] = ev.cluster
    if ev.status == "RUNNING" and j["started_at"] is None:
        j["started_at"] = utc(rec.time)
    if ev.status in MANAGED_TERMINAL:
        j["ended_at"] = utc(rec.time)
    state.touch("managed_jobs", ev.managed_job_id)


def _managed_cancel(state: StatusState, rec: Record, ev: ManagedJobCancelRequested) -> None:
    j = state.get("managed_jobs", ev.managed_job_id)
    if j is not None and j["status"] not in MANAGED_TERMINAL:
        j.update(cancel_requested=True, last_event_seq=rec.seq)
        state.touch("managed_jobs", ev.managed_job_id)


OWN: dict[str, Reducer] = {
    "placement_chosen": _attempt_chosen,
    "capacity_error": _capacity_error,
    "provision_failed": _attempt_provision_failed,
    "cluster_provisioned": _attempt_provisioned,
    "job_queued": _job_queued,
    "job_started": _job_started,
    "job_node_finished": _job_node_finished,
    "job_succeeded": _job_succeeded,
    "job_failed": _job_failed,
    "cancel_requested": _cancel_requested,
    "job_cancelled": _job_cancelled,
    "managed_job_submitted": _managed_submitted,
    "managed_job_status_changed": _managed_status,
    "managed_job_cancel_requested": _managed_cancel,
    # DownRequested, StopRequested, StartRequested, OrphanFound, the ledger's settlements: requests
    # and reports that change no table here (their outcome arrives as its own event); they are
    # still recorded as applied.
}
FOLD = Fold(compose(FLEET_HANDLERS, OWN), positional={"usage_recorded": _usage})

PROJECTION = ps.Projection(
    name=sc.PROJECTION, version=sc.SCHEMA_VERSION, tables=sc.TABLES, new_state=StatusState, fold=FOLD,
    rebuild_hint="remove it (and its .wal): the status service rebuilds it from the log",
)
