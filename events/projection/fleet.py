"""The reducers both projections keep: placements, clusters, nodes and node runs.

The status service shows these (`spz status`); the ledger keeps its own copy in its own file,
because metering needs what they hold (a run's price, labels, attribution and lifetime). Each
projection's state is a `FleetState` naming its node-run table (`RUNS`: the status service's
`node_runs`, the ledger's `meters`, which adds TRES and attribution through `run_extra`).

A **node run** starts with ClusterProvisioned (at `launched_at`) or ClusterStarted (at
`started_at`), its id (`lifetime_id`) being that event's id, and ends at ClusterStopped,
ClusterTerminated or — for that node — SpotPreempted; the meter's usage advances it
(`advance_run`). Cluster states are the one fold's (events/fold.py).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, ClassVar

from skypurza.events import fold
from skypurza.events.models import (
    AutostopSet, ClusterIdle, ClusterProvisioned, ClusterStarted, ClusterStopped, ClusterTerminated, NodeLost,
    NodeReady, PlacementChosen, PlacementFailed, ProvisionFailed, SpotPreempted, TaskSubmitted, UsageRecorded,
)
from skypurza.events.types import Candidate

from .records import Record
from .state import Reducer, State, json_text, new_row, utc
from .tables import BOOL, TS, B, I, Table, V, table

CLUSTERS = table(
    "clusters", ("name",),
    ("name", V), ("status", V), ("infra", V), ("region", V), ("zone", V), ("instance_type", V),
    ("market", V), ("accelerators", V), ("num_nodes", I), ("hourly_price_micros", B),
    ("task_id", V), ("placement_id", V), ("provisioned_event_id", V),
    ("launched_at", TS), ("started_at", TS), ("stopped_at", TS), ("terminated_at", TS),
    ("termination_reason", V), ("status_reason", V),
    ("user", V), ("team", V), ("project", V), ("managed_job_id", B),
    ("autostop_minutes", I), ("autostop_down", BOOL), ("down_after_job", BOOL), ("idle_since", TS),
    ("created_seq", B), ("last_event_seq", B), ("last_event_at", TS),
)

NODES = table(
    "nodes", ("cluster", "rank"),
    ("cluster", V), ("rank", I), ("instance_id", V), ("private_ip", V), ("public_ip", V), ("zone", V),
    ("status", V), ("ready_at", TS), ("host", V), ("agent_id", V), ("last_event_seq", B),
)

# One row per task submission: where its placement stands.
PLACEMENTS = table(
    "placements", ("task_id",),
    ("task_id", V), ("kind", V), ("cluster", V), ("user", V), ("team", V), ("project", V),
    ("labels", V), ("managed_job_id", B), ("task_index", I), ("num_nodes", I), ("submitted_at", TS),
    ("status", V), ("attempts", I), ("infra", V), ("region", V), ("zone", V), ("instance_type", V),
    ("market", V), ("hourly_price_micros", B), ("reason", V), ("last_event_seq", B),
)

# The columns every node-run table has (keyed by cluster, rank, lifetime_id).
RUN_KEY = ("cluster", "rank", "lifetime_id")
RUN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("cluster", V), ("rank", I), ("lifetime_id", V), ("instance_id", V), ("zone", V), ("hourly_price_micros", B),
    ("lifetime_start", TS), ("stop_at", TS), ("metered_until", TS), ("finalized", BOOL), ("created_seq", B),
    ("last_event_seq", B),
)


class FleetState(State):
    """A state with clusters, nodes, placements and a node-run table (`RUNS`)."""

    RUNS: ClassVar[Table]

    def __init__(self) -> None:
        super().__init__()
        self.cluster_ranks: dict[str, set[int]] = {}
        self.run_lifetimes: dict[tuple[str, int], list[str]] = {}
        self.run_ranks: dict[str, set[int]] = {}
        self.unfinalized: set[tuple[str, int, str]] = set()
        self.runs_changed = False  # the batch stopped or started node runs

    def run_extra(self, cluster: dict[str, Any], ev: ClusterProvisioned | ClusterStarted) -> dict[str, Any]:
        """Columns of the runs a start begins beyond RUN_COLUMNS (the ledger's attribution, TRES)."""
        return {}

    # ------------------------------------------------------------ indexes

    def on_put(self, table: str, key: Any, row: dict[str, Any]) -> None:
        if table == "nodes":
            self.cluster_ranks.setdefault(key[0], set()).add(key[1])
        elif table == self.RUNS.name:
            lst = self.run_lifetimes.setdefault((key[0], key[1]), [])
            if key[2] not in lst:
                lst.append(key[2])
            self.run_ranks.setdefault(key[0], set()).add(key[1])
            self.on_touch(table, key)

    def on_touch(self, table: str, key: Any) -> None:
        if table == self.RUNS.name:
            if self.rows[table][key]["finalized"]:
                self.unfinalized.discard(key)
            else:
                self.unfinalized.add(key)

    def on_delete(self, table: str, key: Any) -> None:
        if table == "nodes":
            self.cluster_ranks.get(key[0], set()).discard(key[1])

    def index(self) -> None:
        self.cluster_ranks.clear()
        self.run_lifetimes.clear()
        self.run_ranks.clear()
        self.unfinalized.clear()
        for c, r in self.rows["nodes"]:
            self.cluster_ranks.setdefault(c, set()).add(r)
        # A node's runs in the order the log began them (what an uninterrupted run appended).
        for key, m in sorted(self.rows[self.RUNS.name].items(), key=lambda kv: (kv[1]["created_seq"], kv[0])):
            self.run_lifetimes.setdefault((key[0], key[1]), []).append(key[2])
            self.run_ranks.setdefault(key[0], set()).add(key[1])
            if not m["finalized"]:
                self.unfinalized.add(key)

    def start_batch(self) -> None:
        super().start_batch()
        self.runs_changed = False

    def nodes_of(self, cluster: str) -> list[dict[str, Any]]:
        return [self.rows["nodes"][(cluster, r)] for r in sorted(self.cluster_ranks.get(cluster, ()))
                if (cluster, r) in self.rows["nodes"]]

    def current_runs(self, cluster: str) -> list[dict[str, Any]]:
        """The latest run of each node of `cluster`."""
        runs = self.rows[self.RUNS.name]
        out = []
        for rank in sorted(self.run_ranks.get(cluster, ())):
            lifetimes = self.run_lifetimes[(cluster, rank)]
            out.append(runs[(cluster, rank, lifetimes[-1])])
        return out


# ---------------------------------------------------------------- node runs and usage


def is_repeat(m: dict[str, Any], ev: UsageRecorded, end: datetime) -> bool:
    """Whether a meter interval of this node run is already recorded.

    The meter derives an interval's id from (node run, rank, start, kind) and records a run's
    intervals in order, so `metered_until` and `finalized` say which ids the run already has:
    a repeated id is recognised without an index over the usage table.
    """
    if m["finalized"]:
        return True
    if ev.correction or m["metered_until"] is None:
        return False
    until = m["metered_until"]
    return end < until or (end == until and not ev.final)


def advance_run(m: dict[str, Any], ev: UsageRecorded, start: datetime, end: datetime, seq: int) -> None:
    """A run's metering position after one (new) usage interval of it."""
    if ev.correction:
        m["metered_until"] = start
        m["finalized"] = True
    else:
        if m["metered_until"] is None or end > m["metered_until"]:
            m["metered_until"] = end
        if ev.final:
            m["finalized"] = True
    m["last_event_seq"] = seq


def usage_times(ev: UsageRecorded) -> tuple[datetime, datetime]:
    start, end = ev.start, ev.end
    if start.utcoffset() or end.utcoffset() or start.tzinfo is None or end.tzinfo is None:
        start, end = utc(start), utc(end)  # type: ignore[assignment]
    return start, end


def _start_runs(state: FleetState, rec: Record, cluster: dict[str, Any], nodes: list[tuple[int, str, str | None]],
                start: datetime, ev: ClusterProvisioned | ClusterStarted) -> None:
    extra = state.run_extra(cluster, ev)
    for rank, instance_id, zone in nodes:
        state.put(state.RUNS.name, (cluster["name"], rank, rec.id), new_row(
            state.RUNS, cluster=cluster["name"], rank=rank, lifetime_id=rec.id, instance_id=instance_id,
            zone=zone or cluster["zone"], hourly_price_micros=cluster["hourly_price_micros"], lifetime_start=start,
            stop_at=None, metered_until=None, finalized=False, created_seq=rec.seq, last_event_seq=rec.seq,
            **extra))
    state.runs_changed = True


def _stop_runs(state: FleetState, rec: Record, cluster: str, at: datetime, ranks: set[int] | None = None) -> None:
    for m in state.current_runs(cluster):
        if (ranks is None or m["rank"] in ranks) and m["stop_at"] is None and not m["finalized"]:
            m["stop_at"] = max(at, m["lifetime_start"])
            m["last_event_seq"] = rec.seq
            state.touch(state.RUNS.name, (m["cluster"], m["rank"], m["lifetime_id"]))
            state.runs_changed = True


# ---------------------------------------------------------------- placements


def candidate_fields(c: Candidate) -> dict[str, Any]:
    return {"infra": c.infra, "region": c.region, "zone": c.zone, "instance_type": c.instance_type,
            "market": c.market, "hourly_price_micros": c.hourly_price_micros}


def _task_submitted(state: FleetState, rec: Record, ev: TaskSubmitted) -> None:
    if state.get("placements", ev.task_id) is not None:
        return
    labels = ev.task.labels()
    # The API server's stamp is who submitted it; a task's labels name a team only on the
    # embedded bus (one person's plane, where the CLI chose the team the same way).
    user, team = rec.principal or (ev.user, ev.team or labels.get("team"))
    state.put("placements", ev.task_id, new_row(
        PLACEMENTS, task_id=ev.task_id, kind=ev.kind, cluster=ev.cluster, user=user,
        team=team, project=ev.project or labels.get("project"),
        labels=json_text(labels) if labels else None, managed_job_id=ev.managed_job_id,
        task_index=ev.task_index, num_nodes=ev.num_nodes, submitted_at=utc(rec.time),
        status="SUBMITTED", attempts=0, last_event_seq=rec.seq))


def _placement_chosen(state: FleetState, rec: Record, ev: PlacementChosen) -> None:
    p = state.get("placements", ev.task_id)
    if p is not None and p["status"] not in ("PROVISIONED", "FAILED"):
        p.update(status="PLACING", attempts=max(p["attempts"] or 0, ev.attempt), last_event_seq=rec.seq,
                 **candidate_fields(ev.candidate))
        state.touch("placements", ev.task_id)
    c = state.get("clusters", ev.cluster)
    if c is None or c["status"] == "TERMINATED":
        owner = p or {}
        state.put("clusters", ev.cluster, new_row(
            CLUSTERS, name=ev.cluster, status="INIT", num_nodes=ev.num_nodes, task_id=ev.task_id,
            placement_id=rec.id, accelerators=json_text(ev.candidate.accelerators),
            user=owner.get("user") or "", team=owner.get("team"), project=owner.get("project"),
            managed_job_id=owner.get("managed_job_id"), created_seq=rec.seq, last_event_seq=rec.seq,
            last_event_at=utc(rec.time), **candidate_fields(ev.candidate)))
        for rank in list(state.cluster_ranks.get(ev.cluster, ())):
            state.delete("nodes", (ev.cluster, rank))


def _drop_unlaunched_cluster(state: FleetState, cluster: str, task_id: str) -> None:
    """A cluster record that never came up goes away with its failed launch (as in SkyPilot)."""
    c = state.get("clusters", cluster)
    if c is not None and c["status"] == "INIT" and c["provisioned_event_id"] is None and c["task_id"] == task_id:
        state.delete("clusters", cluster)


def _fail_placement(state: FleetState, rec: Record, task_id: str, reason: str) -> None:
    p = state.get("placements", task_id)
    if p is not None and p["status"] != "PROVISIONED":
        p.update(status="FAILED", reason=reason, last_event_seq=rec.seq)
        state.touch("placements", task_id)


def _provision_failed(state: FleetState, rec: Record, ev: ProvisionFailed) -> None:
    _fail_placement(state, rec, ev.task_id, ev.message or ev.code or ev.error_class)
    _drop_unlaunched_cluster(state, ev.cluster, ev.task_id)


def _placement_failed(state: FleetState, rec: Record, ev: PlacementFailed) -> None:
    _fail_placement(state, rec, ev.task_id, ev.reason)
    _drop_unlaunched_cluster(state, ev.cluster, ev.task_id)


# ---------------------------------------------------------------- clusters and nodes


def _cluster_row(state: FleetState, rec: Record, name: str) -> dict[str, Any] | None:
    c = state.get("clusters", name)
    if c is not None:
        c["last_event_seq"] = rec.seq
        c["last_event_at"] = utc(rec.time)
        state.touch("clusters", name)
    return c


def _cluster_provisioned(state: FleetState, rec: Record, ev: ClusterProvisioned) -> None:
    p = state.get("placements", ev.task_id) or {}
    labels = json.loads(p["labels"]) if p.get("labels") else {}
    old = state.get("clusters", ev.cluster)
    launched = utc(ev.launched_at)
    assert launched is not None
    if old is not None:
        _stop_runs(state, rec, ev.cluster, launched)  # a run we never saw end
    c = state.put("clusters", ev.cluster, new_row(
        CLUSTERS, name=ev.cluster, status="UP", accelerators=json_text(ev.candidate.accelerators),
        num_nodes=len(ev.nodes) or ev.candidate.num_nodes, hourly_price_micros=ev.hourly_price_micros,
        task_id=ev.task_id, placement_id=ev.placement_id, provisioned_event_id=rec.id,
        launched_at=launched, started_at=launched, user=p.get("user") or ev.user or "",
        team=p.get("team") or ev.team or labels.get("team"),
        project=ev.project or p.get("project") or labels.get("project"),
        managed_job_id=ev.managed_job_id if ev.managed_job_id is not None else p.get("managed_job_id"),
        autostop_minutes=ev.idle_minutes, autostop_down=ev.down_when_idle, down_after_job=ev.down_after_job,
        created_seq=old["created_seq"] if old is not None and old["status"] != "TERMINATED" else rec.seq,
        last_event_seq=rec.seq, last_event_at=utc(rec.time),
        **{k: v for k, v in candidate_fields(ev.candidate).items() if k != "hourly_price_micros"}))
    ranks = {n.rank for n in ev.nodes}
    for rank in list(state.cluster_ranks.get(ev.cluster, ())):
        if rank not in ranks:
            state.delete("nodes", (ev.cluster, rank))
    for n in ev.nodes:
        state.put("nodes", (ev.cluster, n.rank), new_row(
            NODES, cluster=ev.cluster, rank=n.rank, instance_id=n.instance_id, private_ip=n.private_ip,
            public_ip=n.public_ip, zone=n.zone or ev.candidate.zone, status="UP", last_event_seq=rec.seq))
    _start_runs(state, rec, c, [(n.rank, n.instance_id, n.zone) for n in sorted(ev.nodes, key=lambda n: n.rank)],
                launched, ev)
    if p:
        p.update(status="PROVISIONED", last_event_seq=rec.seq, reason=None)
        state.touch("placements", ev.task_id)


def _node_ready(state: FleetState, rec: Record, ev: NodeReady) -> None:
    n = state.get("nodes", (ev.cluster, ev.rank))
    if n is None or n["status"] in ("STOPPED", "TERMINATED"):
        return
    n.update(status="READY", ready_at=utc(rec.time), host=ev.host or None, agent_id=ev.agent_id or None,
             last_event_seq=rec.seq)
    state.touch("nodes", (ev.cluster, ev.rank))


def _set_nodes(state: FleetState, rec: Record, cluster: str, status: str, ranks: set[int] | None = None) -> None:
    for n in state.nodes_of(cluster):
        if ranks is None or n["rank"] in ranks:
            n.update(status=status, last_event_seq=rec.seq)
            state.touch("nodes", (cluster, n["rank"]))


def _cluster_stopped(state: FleetState, rec: Record, ev: ClusterStopped) -> None:
    c = _cluster_row(state, rec, ev.cluster)
    if c is None or c["status"] == "TERMINATED":
        return
    at = utc(ev.stopped_at)
    c.update(status=fold.cluster_after(c["status"], ev), stopped_at=at, status_reason=None)
    _set_nodes(state, rec, ev.cluster, "STOPPED")
    _stop_runs(state, rec, ev.cluster, at)  # type: ignore[arg-type]


def _cluster_started(state: FleetState, rec: Record, ev: ClusterStarted) -> None:
    c = _cluster_row(state, rec, ev.cluster)
    if c is None or c["status"] == "TERMINATED":
        return
    if any(m["stop_at"] is None and not m["finalized"] for m in state.current_runs(ev.cluster)):
        # Already running: a start we have seen in effect (its runs are not started twice);
        # its status is still the one fold's (a cluster that lost a node is UP again).
        if c["status"] != fold.cluster_after(c["status"], ev):
            c.update(status=fold.cluster_after(c["status"], ev), status_reason=None)
        return
    at = utc(ev.started_at)
    c.update(status=fold.cluster_after(c["status"], ev), started_at=at, stopped_at=None, status_reason=None,
             idle_since=None)
    if ev.nodes:
        for rank in list(state.cluster_ranks.get(ev.cluster, ())):
            state.delete("nodes", (ev.cluster, rank))
        for n in ev.nodes:
            state.put("nodes", (ev.cluster, n.rank), new_row(
                NODES, cluster=ev.cluster, rank=n.rank, instance_id=n.instance_id, private_ip=n.private_ip,
                public_ip=n.public_ip, zone=n.zone or c["zone"], status="UP", last_event_seq=rec.seq))
    else:
        _set_nodes(state, rec, ev.cluster, "UP")
    nodes = state.nodes_of(ev.cluster)
    runs = [(n["rank"], n["instance_id"], n["zone"]) for n in nodes]
    _start_runs(state, rec, c, runs, at, ev)  # type: ignore[arg-type]


def _cluster_terminated(state: FleetState, rec: Record, ev: ClusterTerminated) -> None:
    c = _cluster_row(state, rec, ev.cluster)
    if c is None or c["status"] == "TERMINATED":
        return
    at = utc(ev.terminated_at)
    c.update(status=fold.cluster_after(c["status"], ev), terminated_at=at, termination_reason=ev.reason)
    _set_nodes(state, rec, ev.cluster, "TERMINATED")
    _stop_runs(state, rec, ev.cluster, at)  # type: ignore[arg-type]


def _autostop_set(state: FleetState, rec: Record, ev: AutostopSet) -> None:
    c = _cluster_row(state, rec, ev.cluster)
    if c is not None:
        c.update(autostop_minutes=ev.idle_minutes, autostop_down=ev.down if ev.idle_minutes is not None else False)


def _cluster_idle(state: FleetState, rec: Record, ev: ClusterIdle) -> None:
    c = _cluster_row(state, rec, ev.cluster)
    if c is not None and c["status"] == "UP":
        c["idle_since"] = utc(ev.idle_since)


def _spot_preempted(state: FleetState, rec: Record, ev: SpotPreempted) -> None:
    c = _cluster_row(state, rec, ev.cluster)
    if c is None or c["status"] in ("TERMINATED", "STOPPED"):
        return
    ranks = {ev.rank} if ev.rank is not None else {
        n["rank"] for n in state.nodes_of(ev.cluster) if n["instance_id"] == ev.instance_id} or None
    # SkyPilot shows a cluster with lost nodes as INIT (abnormal) until it is recovered or torn down.
    c.update(status=fold.cluster_after(c["status"], ev), status_reason="spot preempted")
    _set_nodes(state, rec, ev.cluster, "PREEMPTED", ranks)
    # A reclaimed spot instance is no longer billed.
    _stop_runs(state, rec, ev.cluster, utc(ev.detected_at), ranks)  # type: ignore[arg-type]


def _node_lost(state: FleetState, rec: Record, ev: NodeLost) -> None:
    c = _cluster_row(state, rec, ev.cluster)
    if c is None or c["status"] in ("TERMINATED", "STOPPED"):
        return
    c.update(status=fold.cluster_after(c["status"], ev), status_reason=f"node {ev.rank} lost")
    _set_nodes(state, rec, ev.cluster, "LOST", {ev.rank})


HANDLERS: dict[str, Reducer] = {
    "task_submitted": _task_submitted,
    "placement_chosen": _placement_chosen,
    "placement_failed": _placement_failed,
    "provision_failed": _provision_failed,
    "cluster_provisioned": _cluster_provisioned,
    "node_ready": _node_ready,
    "cluster_stopped": _cluster_stopped,
    "cluster_started": _cluster_started,
    "cluster_terminated": _cluster_terminated,
    "autostop_set": _autostop_set,
    "cluster_idle": _cluster_idle,
    "spot_preempted": _spot_preempted,
    "node_lost": _node_lost,
}
