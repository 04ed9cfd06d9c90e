"""What the web console reads that the CLI's verbs had no endpoint for (docs/console.md).

- `GET /api/v1/clusters/{name}/events`: the cluster's events timeline (its subject of the log),
  newest last, at most `limit`; `read` on the cluster's owner.
- `GET /api/v1/jobs/{id}/history`: a managed job's recovery history: each status change (each
  preemption, each relaunch) and each cluster it was placed on, with where and at what price;
  `read` on the job's owner; `at=` rebuilds it from the log as it stood then (timetravel.py).
- `GET /api/v1/users/{name}/tokens` and `DELETE /api/v1/users/{name}/tokens/{token_id}`: a
  user's live tokens (ids only: the log holds no token) and revoking one; admins only.

Each timeline entry is the event's scalar fields only (`summary`): what a person reads in a row,
never a whole task (a JobQueued carries one) or a secret's key.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query

from skypurza.events import naming
from skypurza.events.bus import Stored
from skypurza.events.cluster_events import ClusterProvisioned

from . import directory_io, timetravel
from .deps import ApiDeps, ClusterName
from .identity import Principal, authorize
from .problems import forbidden, not_found, unavailable
from .routes_clusters import cluster_or_404, managed_row_or_404
from .routes_identity import Name
from .routes_jobs import ManagedJobId

log = logging.getLogger("skypurza.api")

MAX_TIMELINE = 1000  # events of one cluster a timeline request may ask for
MAX_SUMMARY_FIELDS = 16
MAX_SUMMARY_CHARS = 200
TokenId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$",
                              description="A token's id (GET /api/v1/users/{name}/tokens).")]


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """An event's fields a timeline row shows (pure): the scalars, bounded; lists, maps and nested
    models (a task, a candidate) are left out."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if len(out) >= MAX_SUMMARY_FIELDS or key.endswith("secrets_key"):
            continue
        if isinstance(value, str):
            out[key] = value[:MAX_SUMMARY_CHARS]
        elif value is None or isinstance(value, (bool, int, float)):
            out[key] = value
    return out


def timeline_entry(s: Stored) -> dict[str, Any]:
    env = s.envelope
    return {"seq": s.seq, "time": (env.time if env else s.timestamp).isoformat(),
            "type": env.event_name if env else s.subject.rsplit(".", 1)[-1],
            "summary": summary(s.event.model_dump(mode="json")) if s.event is not None else {"unreadable": s.status}}


def placement(provisioned: ClusterProvisioned) -> dict[str, Any]:
    """Where a cluster ran and at what price (pure): what a managed job's history shows per launch."""
    c = provisioned.candidate
    nodes = max(1, len(provisioned.nodes) or int(c.num_nodes or 1))
    price = provisioned.hourly_price_micros * nodes  # the event's price is one node's, as the meter reads it
    return {"cluster": provisioned.cluster, "infra": c.infra, "region": c.region, "zone": c.zone,
            "instance_type": c.instance_type, "market": c.market, "num_nodes": nodes,
            "hourly_price_micros": price, "hourly_price_usd": f"{price / 1_000_000:.6f}"}


def router(deps: ApiDeps) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["console"])
    caller = Depends(deps.principal)

    @r.get("/clusters/{name}/events", summary="The cluster's events timeline (newest last)")
    async def cluster_events(name: ClusterName, who: Principal = caller,
                             limit: int = Query(200, ge=1, le=MAX_TIMELINE, description="The newest N events."),
                             at: str | None = Query(None, max_length=timetravel.MAX_AT_CHARS,
                                                    description=timetravel.AT_DESCRIPTION),
                             ) -> dict[str, Any]:
        when = timetravel.checked_at(at)
        if when is None:
            view = await cluster_or_404(deps, name)
            owner = view.owner
        else:  # the owner as the log told it then (a later cluster of the name may be another's)
            try:
                past = await timetravel.cluster_at(deps.bus(), name, when)
                owner = await timetravel.owner_of(deps.bus(), past)
            except Exception as exc:
                log.warning("rebuilding cluster %s at %s failed: %s: %s", name, when, type(exc).__name__, exc)
                raise unavailable("the server cannot read the log just now; try again shortly", 2)
            if past.fold().status is None:
                raise not_found(f"no cluster {name} at {when.isoformat()}")
        decision = authorize(who, "read", owner[0], owner[1])
        if not decision.allowed:
            raise forbidden(decision.reason)
        b = deps.bus()
        entries: list[dict[str, Any]] = []
        try:
            async for s in b.replay(filter_subject=naming.aggregate_subjects(b.stage, "cluster", name),
                                    until_time=when):
                entries.append(timeline_entry(s))
                if len(entries) > limit:
                    entries.pop(0)
        except Exception as exc:
            log.warning("reading cluster %s's events failed: %s: %s", name, type(exc).__name__, exc)
            raise unavailable("the server cannot read the log just now; try again shortly", 2)
        return {"cluster": name, "events": entries, **({"at": when.isoformat()} if when else {})}

    @r.get("/jobs/{job_id}/history", summary="A managed job's recovery history: status changes and placements")
    async def job_history(job_id: ManagedJobId, who: Principal = caller,
                          at: str | None = Query(None, max_length=timetravel.MAX_AT_CHARS,
                                                 description=timetravel.AT_DESCRIPTION)) -> dict[str, Any]:
        when = timetravel.checked_at(at)
        b = deps.bus()
        row: dict[str, Any] | None = None
        if when is None:  # now: the status projection's row, authorized before the log is read
            row = await managed_row_or_404(deps, job_id)
            decision = authorize(who, "read", row.get("user") or "", row.get("team"))
            if not decision.allowed:
                raise forbidden(decision.reason)
        try:
            past = await timetravel.managed_job_at(b, job_id, when)
            placements = []
            for cluster in past.clusters[:100]:
                stored = await timetravel.provisioned_at(b, cluster, when)
                if stored is not None and isinstance(stored.event, ClusterProvisioned):
                    placements.append({**placement(stored.event), "seq": stored.seq})
        except Exception as exc:
            log.warning("reading managed job %s's history failed: %s: %s", job_id, type(exc).__name__, exc)
            raise unavailable("the server cannot read the log just now; try again shortly", 2)
        if row is None:  # a past moment: who and what the log said then
            assert when is not None
            if past.submitted is None:
                raise not_found(f"no managed job {job_id} at {when.isoformat()}")
            row = past.row()
            decision = authorize(who, "read", row.get("user") or "", row.get("team"))
            if not decision.allowed:
                raise forbidden(decision.reason)
        changes = [{**c, "reason": c["reason"][:MAX_SUMMARY_CHARS]} for c in past.changes]
        return {"job_id": job_id, "name": row.get("name"), "status": row.get("status"), "user": row.get("user"),
                "team": row.get("team"), "preemptions": sum(1 for c in changes if c["kind"] == "preempted"),
                "changes": changes, "placements": placements, **({"at": when.isoformat()} if when else {})}


    async def admin(who: Principal = caller) -> Principal:
        decision = authorize(who, "manage")
        if not decision.allowed:
            raise forbidden(decision.reason)
        return who

    only_admin = Depends(admin)

    @r.get("/users/{name}/tokens", summary="A user's live tokens: ids only, never a token")
    async def tokens(name: Name, who: Principal = only_admin) -> dict[str, Any]:
        d = await directory_io.load_directory(deps.bus())
        if name not in d.users:
            raise not_found(f"no user {name} (GET /api/v1/users lists them)")
        return {"name": name, "tokens": [{"token_id": t.token_id, "service_account": t.service_account}
                                         for t in sorted(d.users[name].tokens.values(), key=lambda t: t.token_id)]}

    @r.delete("/users/{name}/tokens/{token_id}", summary="Revoke one of a user's tokens")
    async def revoke(name: Name, token_id: TokenId, who: Principal = only_admin) -> dict[str, Any]:
        try:
            await directory_io.revoke_token(deps.bus(), name, token_id, by=who.user)
        except directory_io.IdentityError as exc:
            raise not_found(str(exc))
        return {"name": name, "token_id": token_id, "revoked": True}

    return r
