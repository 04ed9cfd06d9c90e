"""What dispatch answers about its state, pure: the views `spz dispatch queue|share|prio`,
`spz budgets` and the API's dispatch routes print, computed from one DispatchState at `now`.

The dispatch service answers them over the bus from the state it keeps current (its `queue`,
`share` and `budgets` queries, services/dispatch/service.py); without a service the CLI and the
API fold the log and compute the same view here (services/dispatch/ask.py), so both paths print
the same thing. Each view is JSON as it goes over the bus (plain dicts, lists, numbers, strings).
`share_rows` is also the `skypurza.dispatch_reads` entry point an older API server reads.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable

from skypurza.events.dispatch_policy import PriorityConfig

from . import budgets, order
from .state import DispatchState
from .whatif import share_rows as _rows

PRIO_FACTORS = ("age", "fairshare", "jobsize", "qos")


def share_rows(state: DispatchState, now: datetime, algorithm: str | None = None) -> dict[str, Any]:
    """The fairshare tree (root -> team -> user) at `now`, as `spz dispatch share -o json` rows,
    and the algorithm it was computed with (`algorithm`, else the policy's; fair_tree without a
    priority section)."""
    cfg = (state.policy.priority if state.policy is not None else None) or PriorityConfig()
    usage = state.fs_usage.at(now.timestamp())
    algo = algorithm or cfg.algorithm
    return {"algorithm": algo, "rows": _rows(order.share_tree(cfg, state.members, usage), algo)}


def queue_quotas(state: DispatchState) -> list[dict[str, Any]]:
    """Each queue's quota, per flavor and resource in the policy's order, with what admitted work
    uses of it now."""
    if state.policy is None:
        return []
    out = []
    for q in state.policy.queues:
        used = state.usage.get(q.name, {})
        rows = [{"flavor": fq.flavor, "resource": res, "nominal": rq.nominal, "used": round(used.get((fq.flavor, res), 0.0), 6),
                 "borrowing_limit": rq.borrowing_limit, "lending_limit": rq.lending_limit}
                for fq in q.quotas for res, rq in fq.resources.items()]
        out.append({"name": q.name, "team": q.team, "cohort": q.cohort, "strategy": q.strategy, "quotas": rows})
    return out


def queue_view(state: DispatchState, now: datetime) -> dict[str, Any]:
    """The pending tasks in the order they are decided (priority, then submission), each with why
    it waits and what its priority is made of (unweighted factors too), and each queue's quota in use."""
    pending = []
    for i, r in enumerate(state.ranked(now), 1):
        p = state.pending[r.task_id]
        kind, reason = state.held.get(p.task_id, ("", "not decided yet"))
        pending.append({"task_id": p.task_id, "cluster": p.cluster, "team": p.team, "user": p.user, "position": i,
                        "priority": r.priority, "submitted_seq": p.seq, "request": dict(p.request),
                        "kind": kind, "reason": reason,
                        "weighted": {k: float(r.weighted.get(k, 0.0)) for k in PRIO_FACTORS},
                        "tres": {k: float(v) for k, v in r.weighted_tres.items()}, "nice": r.nice,
                        "factors": dict(r.factors)})
    return {"policy": state.policy is not None,
            "priority": state.policy is not None and state.policy.priority is not None,
            "pending": pending, "queues": queue_quotas(state)}


def budgets_view(state: DispatchState, now: datetime) -> dict[str, Any]:
    """Every budget of the policy: spent this period against its limit, its state and forecast."""
    rows = []
    for b in (state.policy.budgets if state.policy else []):
        st = budgets.status(b, state.spend, now)
        rows.append({"team": st.team, "user": st.user, "period": st.period, "period_key": st.period_key,
                     "spent_usd": st.spent_usd, "limit_usd": st.limit_usd, "fraction": st.fraction,
                     "state": st.state, "hard": st.hard, "on_limit": b.on_limit,
                     "resets_at": st.resets_at.isoformat(),
                     "runs_out_at": st.runs_out_at.isoformat() if st.runs_out_at else None})
    return {"budgets": rows}


ALGORITHM_CHARS = 40  # a query's `algorithm`, checked before it reaches the tree


def _share(state: DispatchState, now: datetime, params: dict[str, Any]) -> dict[str, Any]:
    algo = params.get("algorithm")
    if algo is not None and (not isinstance(algo, str) or not algo or len(algo) > ALGORITHM_CHARS):
        raise ValueError("algorithm: a short name (classic or fair_tree)")
    return {"policy": state.policy is not None, **share_rows(state, now, algo)}


# query name -> (state, now, params) -> its view: what the service answers and the fold computes
VIEWS: dict[str, Callable[[DispatchState, datetime, dict[str, Any]], dict[str, Any]]] = {
    "queue": lambda state, now, params: queue_view(state, now),
    "share": _share,
    "budgets": lambda state, now, params: budgets_view(state, now),
}


def view(state: DispatchState, query: str, now: datetime, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """One view by its query name (the `skypurza.dispatch_reads` `view` entry point)."""
    if query not in VIEWS:
        raise ValueError(f"no dispatch view {query!r} (one of {', '.join(VIEWS)})")
    return VIEWS[query](state, now, params or {})
