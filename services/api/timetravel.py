"""Time travel: the clusters as the log told them at a past moment (`?at=TIME` on the listings the
console's overview and cluster pages read; docs/console.md, *Time travel*).

A managed job's recovery history is read from its subject the same way, now or up to `at`
(`managed_job_at`): who submitted it, each status change, each cluster it was placed on.

The status service answers "now" only; a past moment is rebuilt here from the log itself: every
event of the `cluster` aggregate stored up to `at`, folded by the one fold (events/fold.py), so a
cluster downed later shows as it was (UP) before its down. Owners come from each launch's
TaskSubmitted stamp, as for "now" (clusterview.py). What only the ledger knows (cost so far) is
not rebuilt: it is null at a past moment.

`parse_at` is the edge: an ISO 8601 time, at most 40 characters, between 2000 and now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from skypurza.events import naming
from skypurza.events.bus import Bus, Stored
from skypurza.events.cluster_events import ClusterProvisioned, NodeReady
from skypurza.events.fold import JOB_TERMINAL, ClusterFold, fold_cluster
from skypurza.events.job_events import JobQueued
from skypurza.events.managed_events import ManagedJobStatusChanged, ManagedJobSubmitted
from skypurza.events.principal import principal_of

from .clusterview import Owner, task_owner
from .problems import Problem

__all__ = ["JOB_TERMINAL", "checked_at", "cluster_at", "clusters_at", "job_rows", "listing_at", "managed_job_at",
           "parse_at", "provisioned_at", "row"]

MAX_AT_CHARS = 40
EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc)
MAX_CLUSTERS = 10_000  # clusters a past listing rebuilds; the rest are left out, and it says so
MAX_CLUSTER_EVENTS = 100_000  # events of one cluster a past cluster page folds
MAX_JOB_CHANGES = 10_000  # status changes of one managed job a history keeps (the newest)


class BadTime(ValueError):
    pass


def parse_at(text: str, now: datetime) -> datetime:
    """`at` as a UTC time (pure): ISO 8601 (`2026-12-01T10:00:00Z`, an offset, or none: UTC);
    never after `now` (the log has nothing yet) nor before 2000 (a typo)."""
    if len(text) > MAX_AT_CHARS:
        raise BadTime(f"at: at most {MAX_AT_CHARS} characters (an ISO 8601 time: 2026-12-01T10:00:00Z)")
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadTime(f"at: {text[:MAX_AT_CHARS]!r} is not an ISO 8601 time (2026-12-01T10:00:00Z)") from None
    at = at.replace(tzinfo=timezone.utc) if at.tzinfo is None else at.astimezone(timezone.utc)
    if at > now:
        raise BadTime(f"at: {at.isoformat()} is in the future; the log has nothing after now ({now.isoformat()})")
    if at < EARLIEST:
        raise BadTime(f"at: {at.isoformat()} is before 2000; nothing of this broker is that old")
    return at


@dataclass
class PastCluster:
    """One cluster's subject up to a moment: the fold, its launch and its jobs' queueing."""

    name: str
    events: list[Any] = field(default_factory=list)
    provisioned: Stored | None = None
    queued: dict[int, JobQueued] = field(default_factory=dict)
    queued_at: dict[int, datetime] = field(default_factory=dict)
    ready: dict[int, tuple[str, datetime]] = field(default_factory=dict)  # rank -> (host, when)
    timeline: list[Stored] = field(default_factory=list)

    def add(self, s: Stored, keep_timeline: bool = False) -> None:
        ev = s.event
        if keep_timeline:
            self.timeline.append(s)
        if ev is None:
            return
        self.events.append(ev)
        if isinstance(ev, ClusterProvisioned):
            self.provisioned, self.ready = s, {}
        elif isinstance(ev, JobQueued):
            self.queued.setdefault(ev.job_id, ev)
            self.queued_at.setdefault(ev.job_id, s.timestamp)
        elif isinstance(ev, NodeReady):
            self.ready[ev.rank] = (ev.host, s.timestamp)

    def fold(self) -> ClusterFold:
        return fold_cluster(self.name, self.events)


def row(past: PastCluster, fold: ClusterFold, owner: Owner) -> dict[str, Any]:
    """A cluster's row as `spz status` would have shown it then (pure); cost so far is the
    ledger's and null here."""
    out: dict[str, Any] = {"name": past.name, "status": fold.status, "user": owner[0], "team": owner[1],
                           "num_nodes": fold.num_nodes, "cost_usd": None}
    if past.provisioned is not None and isinstance(past.provisioned.event, ClusterProvisioned):
        p, c = past.provisioned.event, past.provisioned.event.candidate
        out.update(infra=c.infra, region=c.region, zone=c.zone, instance_type=c.instance_type, market=c.market,
                   hourly_price_micros=p.hourly_price_micros, launched_at=p.launched_at.isoformat(),
                   autostop=p.idle_minutes, autodown=p.down_when_idle,
                   nodes=[{**n.model_dump(mode="json"), "status": "READY" if n.rank in past.ready else "STARTING",
                           "host": past.ready.get(n.rank, ("", None))[0] or None,
                           "ready_at": past.ready[n.rank][1].isoformat() if n.rank in past.ready else None}
                          for n in p.nodes])
    return out


def job_rows(past: PastCluster, fold: ClusterFold, owner: Owner) -> list[dict[str, Any]]:
    """The jobs of the cluster then under the name, newest first, as `spz queue` shows them (pure)."""
    out = []
    for job_id, job in sorted(fold.current_jobs().items(), reverse=True):
        q = past.queued.get(job_id)
        out.append({"job_id": job_id, "name": q.name if q else None, "status": job.status,
                    "user": (q.user if q and q.user else owner[0]), "team": owner[1],
                    "submitted_at": past.queued_at[job_id].isoformat() if job_id in past.queued_at else None,
                    "exit_code": job.exit_code})
    return out


async def owner_of(bus: Bus, past: PastCluster) -> Owner:
    if past.provisioned is None or not isinstance(past.provisioned.event, ClusterProvisioned):
        return ("", None)
    p = past.provisioned.event
    return await task_owner(bus, p.task_id, (p.user, p.team))


async def clusters_at(bus: Bus, at: datetime) -> tuple[list[tuple[PastCluster, ClusterFold, Owner]], bool]:
    """Every cluster the log knew at `at`, folded; True when more than MAX_CLUSTERS were left out."""
    clusters: dict[str, PastCluster] = {}
    truncated = False
    async for s in bus.replay(filter_subject=naming.aggregate_events_subject(bus.stage, "cluster"), until_time=at):
        name = getattr(s.event, "cluster", None)
        if not isinstance(name, str):
            continue
        if name not in clusters:
            if len(clusters) >= MAX_CLUSTERS:
                truncated = True
                continue
            clusters[name] = PastCluster(name)
        clusters[name].add(s)
    out = []
    for past in clusters.values():
        fold = past.fold()
        if fold.status is not None:
            out.append((past, fold, await owner_of(bus, past)))
    return out, truncated


async def cluster_at(bus: Bus, name: str, at: datetime) -> PastCluster:
    """One cluster's subject up to `at` (its timeline kept: the events page at that moment)."""
    past = PastCluster(name)
    async for s in bus.replay(filter_subject=naming.aggregate_subjects(bus.stage, "cluster", name), until_time=at):
        if len(past.timeline) >= MAX_CLUSTER_EVENTS:
            break
        past.add(s, keep_timeline=True)
    return past


@dataclass
class PastManagedJob:
    """A managed job's subject up to a moment: its submission and each status change."""

    job_id: int
    submitted: Stored | None = None
    changes: list[dict[str, Any]] = field(default_factory=list)
    clusters: list[str] = field(default_factory=list)  # each it was placed on, in order

    def add(self, s: Stored) -> None:
        ev = s.event
        if isinstance(ev, ManagedJobSubmitted):
            self.submitted = self.submitted or s
        elif isinstance(ev, ManagedJobStatusChanged):
            self.changes.append({"seq": s.seq, "time": (s.envelope.time if s.envelope else s.timestamp).isoformat(),
                                 "status": ev.status, "kind": ev.kind, "cluster": ev.cluster,
                                 "task_index": ev.task_index, "recoveries": ev.recoveries, "reason": ev.reason})
            if len(self.changes) > MAX_JOB_CHANGES:
                self.changes.pop(0)
            if ev.cluster and ev.cluster not in self.clusters:
                self.clusters.append(ev.cluster)

    def row(self) -> dict[str, Any]:
        """Its row as `spz jobs queue` would have shown it then (pure): PENDING until a change."""
        ev = self.submitted.event if self.submitted is not None else None
        user, team = principal_of(self.submitted.envelope if self.submitted else None, ev)
        return {"job_id": self.job_id, "name": getattr(ev, "name", None), "user": user, "team": team,
                "status": self.changes[-1]["status"] if self.changes else "PENDING"}


async def managed_job_at(bus: Bus, job_id: int, at: datetime | None) -> PastManagedJob:
    """A managed job's subject up to `at` (None: all of it, now)."""
    past = PastManagedJob(job_id)
    async for s in bus.replay(filter_subject=naming.aggregate_subjects(bus.stage, "mjob", str(job_id)), until_time=at):
        past.add(s)
    return past


async def provisioned_at(bus: Bus, cluster: str, at: datetime | None) -> Stored | None:
    """The cluster's last ClusterProvisioned stored up to `at` (None: now)."""
    subject = naming.event_subject(bus.stage, "cluster", cluster, ClusterProvisioned.EVENT_NAME)
    if at is None:
        return await bus.last_event(subject)
    last = None
    async for s in bus.replay(filter_subject=subject, until_time=at):
        last = s
    return last


AT_DESCRIPTION = ("A past moment (ISO 8601, UTC when no offset is given): the answer rebuilt from the log as it "
                  "stood then (time travel; docs/console.md).")


def checked_at(text: str | None) -> datetime | None:
    """The request's `at`, checked at the edge: None for now, else a 422 that says what is accepted."""
    if text is None:
        return None
    try:
        return parse_at(text, datetime.now(timezone.utc))
    except BadTime as exc:
        raise Problem(422, "invalid-request", "Invalid request", str(exc), errors=[{"field": "at",
                                                                                     "message": str(exc)}])


async def listing_at(bus: Bus, at: datetime, include_terminated: bool) -> tuple[list[dict[str, Any]], bool]:
    """The rows `GET /api/v1/clusters` would have answered at `at`."""
    found, truncated = await clusters_at(bus, at)
    rows = [row(p, f, o) for p, f, o in found if include_terminated or f.status != "TERMINATED"]
    return sorted(rows, key=lambda r: r["name"]), truncated
