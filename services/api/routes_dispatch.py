"""Dispatch and alerts over HTTP (`spz dispatch queue|policy show|apply`, `spz budgets`, `spz alerts
list`); docs/team.md lists who may call each.

- `GET /api/v1/dispatch/queue`: the pending tasks with why each waits, in the order they are
  decided, and each queue's quota, used against nominal per flavor and resource; rows the caller
  may read (identity.visible with all users).
- `GET /api/v1/dispatch/share`: the fairshare tree (`spz dispatch share`): each team's and user's
  shares, decayed usage and FairShare factor; the pending rows of `/dispatch/queue` carry each
  task's weighted priority factors (`spz dispatch prio`).
- `GET /api/v1/dispatch/policy`: the active policy, as YAML (what the console's editor shows) and
  as JSON, with who applied it, from where, and its log sequence.
- `PUT /api/v1/dispatch/policy` (admins): a policy YAML, validated by dispatch's own loader; every
  problem with its line, column and key (problem+json 422, nothing published), else published as
  DispatchPolicyApplied stamped with the caller. `DELETE` removes the policy (every held task is
  admitted), the same event with no policy.
- `GET /api/v1/budgets`: every budget of the policy, spent this period against its limit (a
  member's or viewer's: their team's).
- `GET /api/v1/alerts`: the alerts raised and not resolved (AlertRaised, AlertResolved folded from
  the log: events/alert_events.py); viewers, who read only their own team's, see none.

Dispatch is platform code. The queue, the tree and the budgets are the dispatch service's answer
over the bus (events/dispatch_queries.py), from the state it keeps current, so a read costs the
same however long the log is; with no dispatch service answering, the server folds the log itself
through services/api/dispatch_reads.py (the same fold and loader the CLI uses), the same answer.
Without dispatch installed the dispatch routes are a 404 that says so.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import yaml
from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from skypurza.events import dispatch_queries, naming
from skypurza.events.alert_events import AlertRaised, AlertResolved
from skypurza.events.dispatch_events import POLICY_ID, DispatchPolicyApplied
from skypurza.events.principal import stamp

from . import dispatch_reads
from .deps import ApiDeps
from .identity import Principal, authorize, visible
from .problems import Problem, forbidden, not_found, unavailable

log = logging.getLogger("skypurza.api")

MAX_POLICY_CHARS = 1 << 20  # the loader's own bound (1 MiB), checked here before any parse
MAX_PROBLEMS = 100
MAX_ALERTS = 1000
SOURCE_CHARS = 200
PRIO_FACTORS = ("age", "fairshare", "jobsize", "qos")
MAX_SHARE_ROWS = 10_000  # rows of the fairshare tree an answer holds (teams and users)
ASK_TIMEOUT_S = 10.0  # the dispatch service's answer (it waits at most 5 s to catch up with the log)


class PolicyBody(BaseModel):
    """A dispatch policy file's text (docs/dispatch.md, *Policy*)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    yaml: str = Field(max_length=MAX_POLICY_CHARS, description="The policy YAML.")
    source: str = Field("console", min_length=1, max_length=SOURCE_CHARS,
                        description="Where it came from, for `spz dispatch policy show`.")


def policy_yaml(policy: Any) -> str:
    """The policy as the editor shows it (pure): what `spz dispatch policy show` prints."""
    return yaml.safe_dump(policy.model_dump(mode="json", exclude_defaults=True), sort_keys=False)


def pending_row(p: dict[str, Any]) -> dict[str, Any]:
    """One pending task of the dispatch service's `queue` view as the route gives it (pure)."""
    return {"task_id": p["task_id"], "cluster": p["cluster"], "team": p["team"], "user": p["user"],
            "position": p["position"], "priority": p["priority"], "submitted_seq": p["submitted_seq"],
            "request": p["request"], "factors": {k: round(float(p["weighted"].get(k, 0.0)), 3) for k in PRIO_FACTORS},
            "tres": {k: round(float(v), 3) for k, v in p["tres"].items()}, "nice": p["nice"], "kind": p["kind"],
            "reason": p["reason"]}


def queue_quotas(policy: Any, usage: dict[str, dict[tuple[str, str], float]]) -> list[dict[str, Any]]:
    """Each queue's quota, per flavor and resource in the policy's order, with what admitted work
    uses of it now (pure)."""
    out = []
    for q in policy.queues:
        used = usage.get(q.name, {})
        rows = [{"flavor": fq.flavor, "resource": res, "nominal": rq.nominal, "used": round(used.get((fq.flavor, res), 0.0), 6),
                 "borrowing_limit": rq.borrowing_limit, "lending_limit": rq.lending_limit}
                for fq in q.quotas for res, rq in fq.resources.items()]
        out.append({"name": q.name, "team": q.team, "cohort": q.cohort, "strategy": q.strategy, "quotas": rows})
    return out


class OpenAlerts:
    """The alerts raised and not yet resolved (pure fold): a resolve ends the occurrence it names;
    a later raise of the same key is a new one. Kept one entry per key, so bounded by the
    conditions, not by the log's length."""

    def __init__(self) -> None:
        self.open: dict[str, dict[str, Any]] = {}

    def apply(self, ev: Any) -> None:
        if isinstance(ev, AlertRaised):
            self.open[ev.key] = {"key": ev.key, "kind": ev.kind, "subject": ev.subject, "severity": ev.severity,
                                 "summary": ev.summary, "occurrence": ev.occurrence,
                                 "raised_at": ev.raised_at.isoformat()}
        elif isinstance(ev, AlertResolved) and ev.key in self.open and self.open[ev.key]["occurrence"] <= ev.occurrence:
            del self.open[ev.key]

    def rows(self) -> list[dict[str, Any]]:
        """Newest first, at most MAX_ALERTS."""
        return sorted(self.open.values(), key=lambda a: a["raised_at"], reverse=True)[:MAX_ALERTS]


def router(deps: ApiDeps) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["dispatch"])
    caller = Depends(deps.principal)
    reads = dispatch_reads.load()

    def need_dispatch() -> dispatch_reads.DispatchReads:
        if reads is None:
            raise not_found("dispatch is not installed on this server (the platform's dispatch package); "
                            "every submission is admitted at once")
        return reads

    async def answer(query: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The dispatch service's view, current to the log's end; None when none answers (the
        caller folds the log)."""
        b = deps.bus()
        try:
            return await dispatch_queries.ask(b, query, params, min_seq=await b.last_seq(), timeout=ASK_TIMEOUT_S)
        except Exception as exc:  # no responders, a timeout, a service behind: the fold answers the same
            log.debug("dispatch %s query: %s: %s; folding the log", query, type(exc).__name__, exc)
            return None

    async def state() -> Any:
        d = need_dispatch()
        try:
            return await d.load_state(deps.bus())
        except Exception as exc:
            log.warning("reading dispatch's fold failed: %s: %s", type(exc).__name__, exc)
            raise unavailable("the server cannot read the log just now; try again shortly", 2)

    @r.get("/dispatch/queue", summary="Pending tasks with why each waits, and each queue's quota in use")
    async def queue(who: Principal = caller) -> dict[str, Any]:
        need_dispatch()
        view = await answer("queue")
        if view is not None:
            return {"policy": view["policy"], "pending": visible(who, [pending_row(p) for p in view["pending"]], True),
                    "queues": view["queues"], "note": "ordered as dispatch decides them"}
        st = await state()
        # dispatch's admission order (multifactor priority, then submission), as `spz dispatch queue`
        ranked = st.ranked(datetime.now(timezone.utc))
        rows = [{"task_id": p.task_id, "cluster": p.cluster, "team": p.team, "user": p.user, "position": i,
                 "priority": r.priority, "submitted_seq": p.seq, "request": p.request,
                 # what the priority is made of, weighted (`spz dispatch prio`'s columns)
                 "factors": {k: round(float(r.weighted.get(k, 0.0)), 3) for k in PRIO_FACTORS},
                 "tres": {k: round(float(v), 3) for k, v in r.weighted_tres.items()}, "nice": r.nice,
                 "kind": st.held.get(p.task_id, ("", ""))[0],
                 "reason": st.held.get(p.task_id, ("", "not decided yet"))[1]}
                for i, (r, p) in enumerate(((r, st.pending[r.task_id]) for r in ranked), 1)]
        return {"policy": st.policy is not None, "pending": visible(who, rows, True),
                "queues": queue_quotas(st.policy, st.usage) if st.policy is not None else [],
                "note": "ordered as dispatch decides them"}

    @r.get("/dispatch/share", summary="The fairshare tree (root, teams, users): shares, usage, FairShare")
    async def share(who: Principal = caller) -> dict[str, Any]:
        d = need_dispatch()
        if d.share_rows is None:
            raise not_found("this dispatch gives no fairshare tree (an older dispatch package); "
                            "`spz dispatch share` prints it")
        view = await answer("share")
        if view is not None:
            return {"policy": view["policy"], "algorithm": view.get("algorithm"),
                    "rows": list(view.get("rows") or [])[:MAX_SHARE_ROWS]}
        st = await state()
        tree = d.share_rows(st, datetime.now(timezone.utc))
        rows = list(tree.get("rows") or [])[:MAX_SHARE_ROWS]
        return {"policy": st.policy is not None, "algorithm": tree.get("algorithm"), "rows": rows}

    async def last_policy() -> Any:
        b = deps.bus()
        try:
            return await b.last_event(naming.event_subject(b.stage, DispatchPolicyApplied.AGGREGATE, POLICY_ID,
                                                           DispatchPolicyApplied.EVENT_NAME))
        except Exception as exc:
            log.warning("reading the dispatch policy failed: %s: %s", type(exc).__name__, exc)
            raise unavailable("the server cannot read the log just now; try again shortly", 2)

    @r.get("/dispatch/policy", summary="The active dispatch policy (YAML and JSON), who applied it, from where")
    async def get_policy(who: Principal = caller) -> dict[str, Any]:
        need_dispatch()
        last = await last_policy()
        ev = last.event if last is not None and isinstance(last.event, DispatchPolicyApplied) else None
        policy = ev.policy if ev is not None else None
        return {"policy": policy.model_dump(mode="json", exclude_defaults=True) if policy else None,
                "yaml": policy_yaml(policy) if policy else None, "source": ev.source if ev else None,
                "applied_by": ev.applied_by if ev else None, "seq": last.seq if last is not None else None,
                "time": last.timestamp.isoformat() if last is not None else None}

    def admin(who: Principal) -> None:
        decision = authorize(who, "manage")
        if not decision.allowed:
            raise forbidden("changing the dispatch policy (quotas, budgets) is for admins")

    async def publish(event: DispatchPolicyApplied, who: Principal) -> int:
        b = deps.bus()
        ack = await b.publish(stamp(b.envelope(event), who.user, who.team))
        log.info("dispatch policy %s by %s (log sequence %s)", "applied" if event.policy else "removed", who.user,
                 ack.seq)
        return int(ack.seq)

    @r.put("/dispatch/policy", summary="Apply a dispatch policy (admins): validated, then published")
    async def put_policy(body: PolicyBody, who: Principal = caller) -> dict[str, Any]:
        admin(who)
        d = need_dispatch()
        try:
            policy = d.load_policy(body.yaml, body.source)
        except d.policy_error as exc:
            found = list(getattr(exc, "problems", []))[:MAX_PROBLEMS]
            first = str(found[0]) if found else str(exc)
            raise Problem(422, "invalid-policy", "Invalid policy", f"nothing was applied: {first}"[:1000],
                          problems=[{"line": p.line, "column": p.column, "key": p.key, "message": p.message}
                                    for p in found])
        seq = await publish(DispatchPolicyApplied(policy=policy, source=body.source, applied_by=who.user), who)
        return {"applied": True, "seq": seq, "source": body.source, "applied_by": who.user}

    @r.delete("/dispatch/policy", summary="Remove the dispatch policy (admins): every held task is admitted")
    async def clear_policy(who: Principal = caller) -> dict[str, Any]:
        admin(who)
        need_dispatch()
        seq = await publish(DispatchPolicyApplied(policy=None, source="console", applied_by=who.user), who)
        return {"applied": True, "seq": seq, "policy": None}

    @r.get("/budgets", summary="Every budget: spent this period, the limit, its state and forecast")
    async def budget_list(who: Principal = caller) -> dict[str, Any]:
        d = need_dispatch()
        view = await answer("budgets")
        if view is not None:
            return {"budgets": [r for r in view["budgets"] if who.is_admin or r["team"] in who.in_teams]}
        st = await state()
        now = datetime.now(timezone.utc)
        rows = []
        for b in (st.policy.budgets if st.policy else []):
            if not who.is_admin and b.team not in who.in_teams:
                continue
            s = d.budget_status(b, st.spend, now)
            rows.append({"team": s.team, "user": s.user, "period": s.period, "period_key": s.period_key,
                         "spent_usd": s.spent_usd, "limit_usd": s.limit_usd, "fraction": s.fraction,
                         "state": s.state, "hard": s.hard, "on_limit": b.on_limit, "resets_at": s.resets_at.isoformat(),
                         "runs_out_at": s.runs_out_at.isoformat() if s.runs_out_at else None})
        return {"budgets": rows}

    @r.get("/alerts", summary="The alerts raised and not yet resolved, newest first")
    async def alerts(who: Principal = caller) -> dict[str, Any]:
        if who.role_in(None) == "viewer":  # a viewer in every team of theirs
            return {"alerts": [], "note": "viewers read their own team's clusters only; fleet alerts are for members"}
        b = deps.bus()
        board = OpenAlerts()
        try:
            async for s in b.replay(filter_subjects=[naming.event_filter(b.stage, c.AGGREGATE, c.EVENT_NAME)
                                                     for c in (AlertRaised, AlertResolved)]):
                board.apply(s.event)
        except Exception as exc:
            log.warning("reading alerts failed: %s: %s", type(exc).__name__, exc)
            raise unavailable("the server cannot read the log just now; try again shortly", 2)
        return {"alerts": board.rows()}

    return r
