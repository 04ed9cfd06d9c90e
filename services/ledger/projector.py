"""The projection reducers: `apply(state, record)` for every event type, pure and in memory.

`State` holds the current rows of the small, mutable tables (clusters, nodes, jobs, managed jobs,
placements, attempts, meters, settlements, compensations) plus what a batch changed: the keys it
touched, the usage rows it appended (in log order, split around settlements) and the event ids
it applied. `store.py` turns that into one DuckDB transaction with the checkpoint; nothing here
does I/O, so the same events give the same rows however they are batched.

Idempotent per event id: a control event whose id was applied before is ignored (the ids live in
`applied_events`). A usage event of our meter is recognised as a repeat from its node run's
metering position (its id is derived from the run, rank and interval start: see `_is_repeat`);
usage from other writers is checked against the set of their ids. No index is needed on the
usage table, which keeps bulk inserts fast. State transitions also refuse to go back from a
final state (a job that ended stays ended).

Every event's rows are checked against their columns as it is applied (`_check_touched`): event
models are lenient, so an event can carry an integer no column holds (an autostop of 10**20
minutes). It raises OverflowError *at that event*, whatever the batching — a later event of the
same batch cannot hide it by overwriting the row — so the pipeline skips exactly that event, in
a live batch as in a replay (pipeline.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Callable

from skypurza.events.models import (
    AutostopSet, CancelRequested, CapacityError, ClusterIdle, ClusterProvisioned, ClusterStarted,
    ClusterStopped, ClusterTerminated, CompensationRecorded, JobCancelled, JobFailed, JobNodeFinished,
    JobQueued, JobStarted, JobSucceeded, ManagedJobCancelRequested, ManagedJobStatusChanged,
    ManagedJobSubmitted, NodeLost, NodeReady, PeriodSettled, PlacementChosen, PlacementFailed,
    ProvisionFailed, SpotPreempted, TaskSubmitted, UsageRecorded,
)
from skypurza.events import fold
from skypurza.events.managed_events import TERMINAL_STATUSES as MANAGED_TERMINAL
from skypurza.events.types import Candidate

from . import schema as sc
from .decoding import Record
from .metering import instance_tres
from .showback import next_period

JOB_TERMINAL = fold.JOB_TERMINAL
MUTABLE = (sc.CLUSTERS, sc.NODES, sc.JOBS, sc.MANAGED_JOBS, sc.PLACEMENTS, sc.ATTEMPTS, sc.METERS,
           sc.SETTLEMENTS, sc.SETTLEMENT_TOTALS, sc.COMPENSATIONS)


class NewerEventError(Exception):
    """An event of a known type in a version newer than this code: stop, do not skip it."""


_INT_RANGES = {"INTEGER": (-(2**31), 2**31 - 1), "BIGINT": (-(2**63), 2**63 - 1)}
_INT_COLUMNS: dict[str, tuple[tuple[str, str, int, int], ...]] = {
    t.name: tuple((c, ty, *_INT_RANGES[ty]) for c, ty in t.columns if ty in _INT_RANGES) for t in MUTABLE}
_USAGE_INTS = tuple((i, c, ty, *_INT_RANGES[ty]) for i, (c, ty) in enumerate(sc.USAGE.columns) if ty in _INT_RANGES)
_I32_LO, _I32_HI = _INT_RANGES["INTEGER"]
_I64_LO, _I64_HI = _INT_RANGES["BIGINT"]
_RANK, _PRICE, _COST, _BILLING = (sc.USAGE.column_names.index(c) for c in
                                  ("rank", "hourly_price_micros", "cost_micros", "billing_seconds"))


def _out_of_range(where: str, column: str, kind: str, value: Any) -> OverflowError:
    return OverflowError(f"{where}.{column} = {value} does not fit its {kind} column")


def _check_touched(state: "State") -> None:
    """The integers of the rows the current event wrote fit their columns (else OverflowError)."""
    for table, key in state.touched:
        row = state.rows[table].get(key)
        if row is None:
            continue
        for col, kind, lo, hi in _INT_COLUMNS[table]:
            v = row[col]
            if v is not None and not lo <= v <= hi:
                raise _out_of_range(table, col, kind, v)


def _check_usage_row(row: tuple[Any, ...]) -> None:
    # The hot path of a replay: the integers the event brought, unrolled; the detail only on failure.
    if (_I32_LO <= row[_RANK] <= _I32_HI and _I64_LO <= row[_PRICE] <= _I64_HI
            and _I64_LO <= row[_COST] <= _I64_HI and _I64_LO <= row[_BILLING] <= _I64_HI):
        return
    for i, col, kind, lo, hi in _USAGE_INTS:
        v = row[i]
        if v is not None and not lo <= v <= hi:
            raise _out_of_range("usage", col, kind, v)


def utc(t: datetime | None) -> datetime | None:
    if t is None:
        return None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


_TRES_JSON: dict[tuple[tuple[str, int], ...], str] = {}


def tres_json(tres: dict[str, int]) -> str:
    key = tuple(tres.items())
    text = _TRES_JSON.get(key)
    if text is None:
        text = json.dumps(dict(sorted(tres.items())), separators=(",", ":"))
        if len(_TRES_JSON) < 10_000:
            _TRES_JSON[key] = text
    return text


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


class UsageColumns:
    """Usage rows of one batch as tuples in column order (turned into columns at snapshot)."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.append = self.rows.append

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def cols(self) -> dict[str, list[Any]]:
        columns = list(zip(*self.rows)) if self.rows else [()] * len(sc.USAGE.column_names)
        return {c: list(v) for c, v in zip(sc.USAGE.column_names, columns)}


@dataclass
class Rebook:
    """Usage booked in a period that has just been settled, after its through_seq, moves on."""

    period: str
    through_seq: int
    to_period: str


@dataclass
class State:
    rows: dict[str, dict[Any, dict[str, Any]]] = field(default_factory=lambda: {t.name: {} for t in MUTABLE})
    applied: set[str] = field(default_factory=set)
    foreign_usage: set[str] = field(default_factory=set)  # ids of usage not from our meter
    settled: dict[str, int] = field(default_factory=dict)  # period -> through_seq
    last_seq: int = 0
    records: int = 0  # records at or below last_seq that were read (applied or not)
    # indexes over rows
    cluster_ranks: dict[str, set[int]] = field(default_factory=dict)
    node_lifetimes: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    meter_ranks: dict[str, set[int]] = field(default_factory=dict)
    unfinalized: set[tuple[str, int, str]] = field(default_factory=set)
    task_attempts: dict[str, set[int]] = field(default_factory=dict)
    # what the current batch changed
    dirty: dict[str, set[Any]] = field(default_factory=lambda: {t.name: set() for t in MUTABLE})
    ops: list[UsageColumns | Rebook] = field(default_factory=list)
    new_applied: list[tuple[str, int, str]] = field(default_factory=list)
    new_skipped: list[tuple[int, str, str, str, str]] = field(default_factory=list)
    touched: list[tuple[str, Any]] = field(default_factory=list)  # rows the current event wrote
    late_usage: bool = False  # the batch booked usage late or settled a period
    meter_changed: bool = False  # the batch stopped or started node runs

    # ------------------------------------------------------------ row helpers

    def get(self, table: str, key: Any) -> dict[str, Any] | None:
        return self.rows[table].get(key)

    def put(self, table: str, key: Any, row: dict[str, Any]) -> dict[str, Any]:
        self.rows[table][key] = row
        self.dirty[table].add(key)
        self.touched.append((table, key))
        if table == "nodes":
            self.cluster_ranks.setdefault(key[0], set()).add(key[1])
        elif table == "meters":
            lst = self.node_lifetimes.setdefault((key[0], key[1]), [])
            if key[2] not in lst:
                lst.append(key[2])
            self.meter_ranks.setdefault(key[0], set()).add(key[1])
            if row["finalized"]:
                self.unfinalized.discard(key)
            else:
                self.unfinalized.add(key)
        elif table == "attempts":
            self.task_attempts.setdefault(key[0], set()).add(key[1])
        return row

    def touch(self, table: str, key: Any) -> None:
        self.dirty[table].add(key)
        self.touched.append((table, key))
        if table == "meters":
            row = self.rows[table][key]
            if row["finalized"]:
                self.unfinalized.discard(key)
            else:
                self.unfinalized.add(key)

    def delete(self, table: str, key: Any) -> None:
        if self.rows[table].pop(key, None) is not None:
            self.dirty[table].add(key)
            if table == "nodes":
                self.cluster_ranks.get(key[0], set()).discard(key[1])

    def nodes_of(self, cluster: str) -> list[dict[str, Any]]:
        return [self.rows["nodes"][(cluster, r)] for r in sorted(self.cluster_ranks.get(cluster, ()))
                if (cluster, r) in self.rows["nodes"]]

    def current_meters(self, cluster: str) -> list[dict[str, Any]]:
        """The latest run of each node of `cluster`."""
        out = []
        for rank in sorted(self.meter_ranks.get(cluster, ())):
            lifetimes = self.node_lifetimes[(cluster, rank)]
            out.append(self.rows["meters"][(cluster, rank, lifetimes[-1])])
        return out

    def usage_buffer(self) -> UsageColumns:
        if not self.ops or not isinstance(self.ops[-1], UsageColumns):
            self.ops.append(UsageColumns())
        return self.ops[-1]  # type: ignore[return-value]

    def index(self) -> None:
        """Rebuild the indexes after loading rows from the database."""
        self.cluster_ranks.clear()
        self.node_lifetimes.clear()
        self.meter_ranks.clear()
        self.unfinalized.clear()
        self.task_attempts.clear()
        for c, r in self.rows["nodes"]:
            self.cluster_ranks.setdefault(c, set()).add(r)
        # A node's runs in the order the log began them (what an uninterrupted run appended).
        for key, m in sorted(self.rows["meters"].items(), key=lambda kv: (kv[1]["created_seq"], kv[0])):
            self.node_lifetimes.setdefault((key[0], key[1]), []).append(key[2])
            self.meter_ranks.setdefault(key[0], set()).add(key[1])
            if not m["finalized"]:
                self.unfinalized.add(key)
        for t, a in self.rows["attempts"]:
            self.task_attempts.setdefault(t, set()).add(a)
        self.settled = {p: row["through_seq"] for p, row in self.rows["settlements"].items()}

    def start_batch(self) -> None:
        for s in self.dirty.values():
            s.clear()
        self.ops = []
        self.new_applied = []
        self.new_skipped = []
        self.touched = []
        self.late_usage = False
        self.meter_changed = False


def new_row(table: sc.Table, **values: Any) -> dict[str, Any]:
    row = dict.fromkeys(table.column_names)
    row.update(values)
    return row


# ---------------------------------------------------------------- dispatch


def apply(state: State, rec: Record) -> None:
    """Apply one record (in stream order; records at or below the checkpoint are ignored)."""
    if rec.seq <= state.last_seq:
        return
    if rec.status == "newer":
        raise NewerEventError(f"seq {rec.seq}: {rec.reason}")
    state.last_seq = rec.seq
    state.records += 1
    if rec.status != "ok" or rec.event is None:
        state.new_skipped.append((rec.seq, rec.id, rec.type, rec.status, rec.reason[:500]))
        return
    if rec.name == "usage_recorded":
        # Its row is checked in _usage; the meter row it touches only gains times and a seq.
        _usage(state, rec, rec.event)  # type: ignore[arg-type]
        return
    if rec.id in state.applied:
        return
    state.applied.add(rec.id)
    state.new_applied.append((rec.id, rec.seq, rec.name))
    handler = HANDLERS.get(rec.name)
    if handler is not None:
        state.touched.clear()
        handler(state, rec, rec.event)
        if state.touched:
            _check_touched(state)


# ---------------------------------------------------------------- tasks and placements


def _labels(task: dict[str, Any]) -> dict[str, str]:
    res = task.get("resources") if isinstance(task, dict) else None
    labels = res.get("labels") if isinstance(res, dict) else None
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def _task_submitted(state: State, rec: Record, ev: TaskSubmitted) -> None:
    if state.get("placements", ev.task_id) is not None:
        return
    labels = _labels(ev.task)
    state.put("placements", ev.task_id, new_row(
        sc.PLACEMENTS, task_id=ev.task_id, kind=ev.kind, cluster=ev.cluster, user=ev.user,
        team=ev.team or labels.get("team"), project=ev.project or labels.get("project"),
        labels=_json(labels) if labels else None, managed_job_id=ev.managed_job_id,
        task_index=ev.task_index, num_nodes=ev.num_nodes, submitted_at=utc(rec.time),
        status="SUBMITTED", attempts=0, last_event_seq=rec.seq))


def _candidate_fields(c: Candidate) -> dict[str, Any]:
    return {"infra": c.infra, "region": c.region, "zone": c.zone, "instance_type": c.instance_type,
            "market": c.market, "hourly_price_micros": c.hourly_price_micros}


def _placement_chosen(state: State, rec: Record, ev: PlacementChosen) -> None:
    key = (ev.task_id, ev.attempt)
    if state.get("attempts", key) is None:
        state.put("attempts", key, new_row(
            sc.ATTEMPTS, task_id=ev.task_id, attempt=ev.attempt, placement_id=rec.id, cluster=ev.cluster,
            num_nodes=ev.num_nodes, chosen_at=utc(rec.time), outcome="chosen", last_event_seq=rec.seq,
            **_candidate_fields(ev.candidate)))
    p = state.get("placements", ev.task_id)
    if p is not None and p["status"] not in ("PROVISIONED", "FAILED"):
        p.update(status="PLACING", attempts=max(p["attempts"] or 0, ev.attempt), last_event_seq=rec.seq,
                 **_candidate_fields(ev.candidate))
        state.touch("placements", ev.task_id)
    c = state.get("clusters", ev.cluster)
    if c is None or c["status"] == "TERMINATED":
        owner = p or {}
        state.put("clusters", ev.cluster, new_row(
            sc.CLUSTERS, name=ev.cluster, status="INIT", num_nodes=ev.num_nodes, task_id=ev.task_id,
            placement_id=rec.id, accelerators=_json(ev.candidate.accelerators),
            user=owner.get("user") or "", team=owner.get("team"), project=owner.get("project"),
            managed_job_id=owner.get("managed_job_id"), created_seq=rec.seq, last_event_seq=rec.seq,
            last_event_at=utc(rec.time), **_candidate_fields(ev.candidate)))
        for rank in list(state.cluster_ranks.get(ev.cluster, ())):
            state.delete("nodes", (ev.cluster, rank))


def _attempt_by_placement(state: State, task_id: str, placement_id: str) -> dict[str, Any] | None:
    for a in sorted(state.task_attempts.get(task_id, ())):
        row = state.rows["attempts"][(task_id, a)]
        if row["placement_id"] == placement_id:
            return row
    return None


def _attempt_failed(state: State, rec: Record, task_id: str, placement_id: str, attempt: int | None,
                    candidate: Candidate | None, outcome: str, error_class: str, code: str, message: str,
                    cluster: str) -> None:
    row = _attempt_by_placement(state, task_id, placement_id)
    if row is None and attempt is not None:
        row = state.get("attempts", (task_id, attempt))
    if row is None:
        n = attempt if attempt is not None else max(state.task_attempts.get(task_id, {0}), default=0) + 1
        row = state.put("attempts", (task_id, n), new_row(
            sc.ATTEMPTS, task_id=task_id, attempt=n, placement_id=placement_id, cluster=cluster,
            outcome="chosen", **(_candidate_fields(candidate) if candidate else {})))
    if row["outcome"] in ("chosen",):
        row.update(outcome=outcome, error_class=error_class, error_code=code, error_message=message,
                   ended_at=utc(rec.time), last_event_seq=rec.seq)
        state.touch("attempts", (row["task_id"], row["attempt"]))


def _capacity_error(state: State, rec: Record, ev: CapacityError) -> None:
    _attempt_failed(state, rec, ev.task_id, ev.placement_id, ev.attempt, ev.candidate, "capacity_error",
                    ev.error_class, ev.code, ev.message, ev.cluster)


def _drop_unlaunched_cluster(state: State, rec: Record, cluster: str, task_id: str) -> None:
    """A cluster record that never came up goes away with its failed launch (as in SkyPilot)."""
    c = state.get("clusters", cluster)
    if c is not None and c["status"] == "INIT" and c["provisioned_event_id"] is None and c["task_id"] == task_id:
        state.delete("clusters", cluster)


def _provision_failed(state: State, rec: Record, ev: ProvisionFailed) -> None:
    _attempt_failed(state, rec, ev.task_id, ev.placement_id, None, ev.candidate, "provision_failed",
                    ev.error_class, ev.code, ev.message, ev.cluster)
    _fail_placement(state, rec, ev.task_id, ev.message or ev.code or ev.error_class)
    _drop_unlaunched_cluster(state, rec, ev.cluster, ev.task_id)


def _fail_placement(state: State, rec: Record, task_id: str, reason: str) -> None:
    p = state.get("placements", task_id)
    if p is not None and p["status"] != "PROVISIONED":
        p.update(status="FAILED", reason=reason, last_event_seq=rec.seq)
        state.touch("placements", task_id)


def _placement_failed(state: State, rec: Record, ev: PlacementFailed) -> None:
    _fail_placement(state, rec, ev.task_id, ev.reason)
    _drop_unlaunched_cluster(state, rec, ev.cluster, ev.task_id)


# ---------------------------------------------------------------- clusters, nodes, meters


def _cluster_row(state: State, rec: Record, name: str) -> dict[str, Any] | None:
    c = state.get("clusters", name)
    if c is not None:
        c["last_event_seq"] = rec.seq
        c["last_event_at"] = utc(rec.time)
        state.touch("clusters", name)
    return c


def _node_tres(ev: ClusterProvisioned) -> dict[str, int]:
    if ev.tres:
        return dict(ev.tres)
    c = ev.candidate
    if c.vcpus and c.memory_gib is not None:
        model, count = None, 0
        if c.accelerators:
            model, count = sorted(c.accelerators.items())[0]
        try:
            return instance_tres(c.vcpus, c.memory_gib, model, int(count))
        except ValueError:
            pass
    return {"node": 1}


def _start_lifetimes(state: State, rec: Record, cluster: dict[str, Any], nodes: list[tuple[int, str, str | None]],
                     start: datetime, tres: str) -> None:
    for rank, instance_id, zone in nodes:
        state.put("meters", (cluster["name"], rank, rec.id), new_row(
            sc.METERS, cluster=cluster["name"], rank=rank, lifetime_id=rec.id, instance_id=instance_id,
            instance_type=cluster["instance_type"], infra=cluster["infra"], region=cluster["region"],
            zone=zone or cluster["zone"], market=cluster["market"],
            hourly_price_micros=cluster["hourly_price_micros"], tres=tres, user=cluster["user"] or "",
            team=cluster["team"], project=cluster["project"], lifetime_start=start, stop_at=None,
            metered_until=None, finalized=False, created_seq=rec.seq, last_event_seq=rec.seq))
    state.meter_changed = True


def _stop_lifetimes(state: State, rec: Record, cluster: str, at: datetime,
                    ranks: set[int] | None = None) -> None:
    for m in state.current_meters(cluster):
        if (ranks is None or m["rank"] in ranks) and m["stop_at"] is None and not m["finalized"]:
            m["stop_at"] = max(at, m["lifetime_start"])
            m["last_event_seq"] = rec.seq
            state.touch("meters", (m["cluster"], m["rank"], m["lifetime_id"]))
            state.meter_changed = True


def _cluster_provisioned(state: State, rec: Record, ev: ClusterProvisioned) -> None:
    p = state.get("placements", ev.task_id) or {}
    labels = json.loads(p["labels"]) if p.get("labels") else {}
    old = state.get("clusters", ev.cluster)
    launched = utc(ev.launched_at)
    assert launched is not None
    if old is not None:
        _stop_lifetimes(state, rec, ev.cluster, launched)  # a run we never saw end
    c = state.put("clusters", ev.cluster, new_row(
        sc.CLUSTERS, name=ev.cluster, status="UP", accelerators=_json(ev.candidate.accelerators),
        num_nodes=len(ev.nodes) or ev.candidate.num_nodes, hourly_price_micros=ev.hourly_price_micros,
        task_id=ev.task_id, placement_id=ev.placement_id, provisioned_event_id=rec.id,
        launched_at=launched, started_at=launched, user=ev.user or p.get("user") or "",
        team=ev.team or p.get("team") or labels.get("team"),
        project=ev.project or p.get("project") or labels.get("project"),
        managed_job_id=ev.managed_job_id if ev.managed_job_id is not None else p.get("managed_job_id"),
        autostop_minutes=ev.idle_minutes, autostop_down=ev.down_when_idle, down_after_job=ev.down_after_job,
        created_seq=old["created_seq"] if old is not None and old["status"] != "TERMINATED" else rec.seq,
        last_event_seq=rec.seq, last_event_at=utc(rec.time),
        **{k: v for k, v in _candidate_fields(ev.candidate).items() if k != "hourly_price_micros"}))
    ranks = {n.rank for n in ev.nodes}
    for rank in list(state.cluster_ranks.get(ev.cluster, ())):
        if rank not in ranks:
            state.delete("nodes", (ev.cluster, rank))
    for n in ev.nodes:
        state.put("nodes", (ev.cluster, n.rank), new_row(
            sc.NODES, cluster=ev.cluster, rank=n.rank, instance_id=n.instance_id, private_ip=n.private_ip,
            public_ip=n.public_ip, zone=n.zone or ev.candidate.zone, status="UP", last_event_seq=rec.seq))
    _start_lifetimes(state, rec, c, [(n.rank, n.instance_id, n.zone) for n in sorted(ev.nodes, key=lambda n: n.rank)],
                     launched, tres_json(_node_tres(ev)))
    a = _attempt_by_placement(state, ev.task_id, ev.placement_id)
    if a is not None and a["outcome"] == "chosen":
        a.update(outcome="provisioned", ended_at=launched, last_event_seq=rec.seq)
        state.touch("attempts", (a["task_id"], a["attempt"]))
    if p:
        p.update(status="PROVISIONED", last_event_seq=rec.seq, reason=None)
        state.touch("placements", ev.task_id)


def _node_ready(state: State, rec: Record, ev: NodeReady) -> None:
    n = state.get("nodes", (ev.cluster, ev.rank))
    if n is None or n["status"] in ("STOPPED", "TERMINATED"):
        return
    n.update(status="READY", ready_at=utc(rec.time), host=ev.host or None, agent_id=ev.agent_id or None,
             last_event_seq=rec.seq)
    state.touch("nodes", (ev.cluster, ev.rank))


def _set_nodes(state: State, rec: Record, cluster: str, status: str, ranks: set[int] | None = None) -> None:
    for n in state.nodes_of(cluster):
        if ranks is None or n["rank"] in ranks:
            n.update(status=status, last_event_seq=rec.seq)
            state.touch("nodes", (cluster, n["rank"]))


def _cluster_stopped(state: State, rec: Record, ev: ClusterStopped) -> None:
    c = _cluster_row(state, rec, ev.cluster)
    if c is None or c["status"] == "TERMINATED":
        return
    at = utc(ev.stopped_at)
    c.update(status=fold.cluster_after(c["status"], ev), stopped_at=at, status_reason=None)
    _set_nodes(state, rec, ev.cluster, "STOPPED")
    _stop_lifetimes(state, rec, ev.cluster, at)  # type: ignore[arg-type]


def _cluster_started(state: State, rec: Record, ev: ClusterStarted) -> None:
    c = _cluster_row(state, rec, ev.cluster)
    if c is None or c["status"] == "TERMINATED":
        return
    if any(m["stop_at"] is None and not m["finalized"] for m in state.current_meters(ev.cluster)):
        # Already running: a start we have seen in effect (its meters are not started twice);
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
                sc.NODES, cluster=ev.cluster, rank=n.rank, instance_id=n.instance_id, private_ip=n.private_ip,
                public_ip=n.public_ip, zone=n.zone or c["zone"], status="UP", last_event_seq=rec.seq))
    else:
        _set_nodes(state, rec, ev.cluster, "UP")
    nodes = state.nodes_of(ev.cluster)
    previous = {m["rank"]: m["tres"] for m in state.current_meters(ev.cluster)}
    tres = next(iter(previous.values()), tres_json({"node": 1}))
    _start_lifetimes(state, rec, c, [(n["rank"], n["instance_id"], n["zone"]) for n in nodes], at, tres)  # type: ignore[arg-type]


def _cluster_terminated(state: State, rec: Record, ev: ClusterTerminated) -> None:
    c = _cluster_row(state, rec, ev.cluster)
    if c is None or c["status"] == "TERMINATED":
        return
    at = utc(ev.terminated_at)
    c.update(status=fold.cluster_after(c["status"], ev), terminated_at=at, termination_reason=ev.reason)
    _set_nodes(state, rec, ev.cluster, "TERMINATED")
    _stop_lifetimes(state, rec, ev.cluster, at)  # type: ignore[arg-type]


def _autostop_set(state: State, rec: Record, ev: AutostopSet) -> None:
    c = _cluster_row(state, rec, ev.cluster)
    if c is not None:
        c.update(autostop_minutes=ev.idle_minutes, autostop_down=ev.down if ev.idle_minutes is not None else False)


def _cluster_idle(state: State, rec: Record, ev: ClusterIdle) -> None:
    c = _cluster_row(state, rec, ev.cluster)
    if c is not None and c["status"] == "UP":
        c["idle_since"] = utc(ev.idle_since)


def _spot_preempted(state: State, rec: Record, ev: SpotPreempted) -> None:
    c = _cluster_row(state, rec, ev.cluster)
    if c is None or c["status"] in ("TERMINATED", "STOPPED"):
        return
    ranks = {ev.rank} if ev.rank is not None else {
        n["rank"] for n in state.nodes_of(ev.cluster) if n["instance_id"] == ev.instance_id} or None
    # SkyPilot shows a cluster with lost nodes as INIT (abnormal) until it is recovered or torn down.
    c.update(status=fold.cluster_after(c["status"], ev), status_reason="spot preempted")
    _set_nodes(state, rec, ev.cluster, "PREEMPTED", ranks)
    # A reclaimed spot instance is no longer billed.
    _stop_lifetimes(state, rec, ev.cluster, utc(ev.detected_at), ranks)  # type: ignore[arg-type]


def _node_lost(state: State, rec: Record, ev: NodeLost) -> None:
    c = _cluster_row(state, rec, ev.cluster)
    if c is None or c["status"] in ("TERMINATED", "STOPPED"):
        return
    c.update(status=fold.cluster_after(c["status"], ev), status_reason=f"node {ev.rank} lost")
    _set_nodes(state, rec, ev.cluster, "LOST", {ev.rank})


# ---------------------------------------------------------------- usage


def _is_repeat(m: dict[str, Any], ev: UsageRecorded, end: datetime) -> bool:
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


_PERIODS: dict[tuple[int, int], str] = {}


def _period(t: datetime) -> str:
    key = (t.year, t.month)
    p = _PERIODS.get(key)
    if p is None:
        p = _PERIODS[key] = f"{t.year:04d}-{t.month:02d}"
    return p


def _usage(state: State, rec: Record, ev: UsageRecorded) -> None:
    start, end = ev.start, ev.end
    if start.utcoffset() or end.utcoffset() or start.tzinfo is None or end.tzinfo is None:
        start, end = utc(start), utc(end)  # type: ignore[assignment]
    m = state.rows["meters"].get((ev.cluster, ev.rank, ev.lifetime_id)) if ev.lifetime_id else None
    if m is not None:
        if _is_repeat(m, ev, end):
            return
    else:
        # Usage from another writer (no node run of ours): de-duplicated by id.
        if rec.id in state.foreign_usage:
            return
        state.foreign_usage.add(rec.id)
    period = _period(start)
    booked = period
    if period in state.settled:
        booked = open_period_after(period, state.settled)
        state.late_usage = True
    row = (
        rec.id, rec.seq, ev.cluster, ev.rank, ev.lifetime_id or None, ev.instance_id, start, end,
        ev.instance_type, ev.infra, ev.region, ev.zone, ev.market, ev.hourly_price_micros, ev.cost_micros,
        ev.billing_seconds, tres_json(ev.tres), ev.user, ev.team, ev.project, period, booked, ev.final,
        ev.correction)
    _check_usage_row(row)
    state.usage_buffer().append(row)
    if m is None:
        return
    if ev.correction:
        m["metered_until"] = start
        m["finalized"] = True
    else:
        if m["metered_until"] is None or end > m["metered_until"]:
            m["metered_until"] = end
        if ev.final:
            m["finalized"] = True
    m["last_event_seq"] = rec.seq
    state.touch("meters", (m["cluster"], m["rank"], m["lifetime_id"]))


def open_period_after(period: str, settled: dict[str, int] | set[str]) -> str:
    """The first period after `period` that is not settled (where late usage is booked)."""
    p = next_period(period)
    while p in settled:
        p = next_period(p)
    return p


# ---------------------------------------------------------------- jobs


def _job(state: State, rec: Record, cluster: str, job_id: int) -> dict[str, Any] | None:
    j = state.get("jobs", (cluster, job_id))
    if j is None or j["status"] in JOB_TERMINAL:
        return None
    j["last_event_seq"] = rec.seq
    state.touch("jobs", (cluster, job_id))
    return j


def _job_queued(state: State, rec: Record, ev: JobQueued) -> None:
    if state.get("jobs", (ev.cluster, ev.job_id)) is not None:
        return
    task = ev.task if isinstance(ev.task, dict) else {}
    job = fold.job_queued(ev)
    state.put("jobs", (ev.cluster, ev.job_id), new_row(
        sc.JOBS, cluster=ev.cluster, job_id=ev.job_id, name=ev.name or task.get("name"), task_id=ev.task_id,
        user=ev.user, num_nodes=job.num_nodes, status=job.status, submitted_at=utc(rec.time),
        managed_job_id=ev.managed_job_id, skypilot_task_id=ev.skypilot_task_id or None, has_setup=job.has_setup,
        setup_done_ranks=0, cancel_requested=False, last_event_seq=rec.seq))


def _job_status(j: dict[str, Any]) -> str:
    return fold.LEGACY_JOB_STATUS.get(j["status"], j["status"])


def _job_started(state: State, rec: Record, ev: JobStarted) -> None:
    j = _job(state, rec, ev.cluster, ev.job_id)
    if j is not None and j["status"] == "PENDING":
        j.update(status=fold.status_on_start(j["status"], j["has_setup"]), started_at=utc(ev.started_at))


def _job_node_finished(state: State, rec: Record, ev: JobNodeFinished) -> None:
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


def _job_succeeded(state: State, rec: Record, ev: JobSucceeded) -> None:
    j = _job(state, rec, ev.cluster, ev.job_id)
    if j is not None:
        j.update(status=fold.status_on_end(ev), ended_at=utc(ev.ended_at), exit_code=0)


def _job_failed(state: State, rec: Record, ev: JobFailed) -> None:
    j = _job(state, rec, ev.cluster, ev.job_id)
    if j is not None:
        j.update(status=fold.status_on_end(ev), ended_at=utc(ev.ended_at),
                 exit_code=ev.exit_code, failed_rank=ev.failed_rank, failed_phase=ev.phase,
                 reason=ev.reason or None)


def _cancel_requested(state: State, rec: Record, ev: CancelRequested) -> None:
    j = _job(state, rec, ev.cluster, ev.job_id)
    if j is not None:
        j["cancel_requested"] = True


def _job_cancelled(state: State, rec: Record, ev: JobCancelled) -> None:
    j = _job(state, rec, ev.cluster, ev.job_id)
    if j is not None:
        j.update(status=fold.status_on_end(ev), ended_at=utc(ev.ended_at))


# ---------------------------------------------------------------- managed jobs


def _managed_submitted(state: State, rec: Record, ev: ManagedJobSubmitted) -> None:
    if state.get("managed_jobs", ev.managed_job_id) is not None:
        return
    state.put("managed_jobs", ev.managed_job_id, new_row(
        sc.MANAGED_JOBS, job_id=ev.managed_job_id, name=ev.name, user=ev.user, team=ev.team, project=ev.project,
        status="PENDING", num_tasks=len(ev.tasks), task_index=0, recoveries=0, restarts_on_errors=0,
        submitted_at=utc(rec.time), cancel_requested=False, last_event_seq=rec.seq))


def _managed_status(state: State, rec: Record, ev: ManagedJobStatusChanged) -> None:
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


def _managed_cancel(state: State, rec: Record, ev: ManagedJobCancelRequested) -> None:
    j = state.get("managed_jobs", ev.managed_job_id)
    if j is not None and j["status"] not in MANAGED_TERMINAL:
        j.update(cancel_requested=True, last_event_seq=rec.seq)
        state.touch("managed_jobs", ev.managed_job_id)


# ---------------------------------------------------------------- settlement


def _period_settled(state: State, rec: Record, ev: PeriodSettled) -> None:
    if ev.period in state.settled:
        return  # the first settlement of a period is the one that counts
    state.settled[ev.period] = ev.through_seq
    state.put("settlements", ev.period, new_row(
        sc.SETTLEMENTS, period=ev.period, settled_at=utc(ev.settled_at), through_seq=ev.through_seq,
        event_id=rec.id, seq=rec.seq, total_micros=sum(ev.totals_micros.values()),
        billing_seconds=sum(ev.billing_seconds.values())))
    for team in sorted(set(ev.totals_micros) | set(ev.billing_seconds)):
        state.put("settlement_totals", (ev.period, team), new_row(
            sc.SETTLEMENT_TOTALS, period=ev.period, team=team, total_micros=ev.totals_micros.get(team, 0),
            billing_seconds=ev.billing_seconds.get(team, 0)))
    # Usage booked in the period after the settlement's position arrived too late for it.
    state.ops.append(Rebook(ev.period, ev.through_seq, open_period_after(ev.period, state.settled)))
    state.late_usage = True


def _compensation(state: State, rec: Record, ev: CompensationRecorded) -> None:
    if state.get("compensations", ev.usage_event_id) is not None:
        return
    state.put("compensations", ev.usage_event_id, new_row(
        sc.COMPENSATIONS, usage_event_id=ev.usage_event_id, period=ev.period, for_period=ev.for_period,
        team=ev.team, amount_micros=ev.amount_micros, event_id=rec.id, seq=rec.seq))


HANDLERS: dict[str, Callable[[State, Record, Any], None]] = {
    "task_submitted": _task_submitted,
    "placement_chosen": _placement_chosen,
    "placement_failed": _placement_failed,
    "capacity_error": _capacity_error,
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
    "period_settled": _period_settled,
    "compensation_recorded": _compensation,
    # DownRequested, StopRequested, StartRequested, OrphanFound: requests and reports that change
    # no read model here (their outcome arrives as its own event); they are still recorded as applied.
}
