"""`POST /api/v1/reconcile`: what `spz status -r` asks through the server.

The embedded CLI runs a reconciliation pass itself (cli/cmd_provision.py); through the server the
provisioner service runs the same pass (its `reconcile` query, events/provisioner_queries.py):
what the clouds hold with this stage's tags beside the live clusters, orphans recorded as
OrphanFound, clusters whose instances vanished ended. The answer is the report and the refreshed
view: the clusters as the status service holds them once it has applied everything the pass
published (`min_seq`), filtered as `GET /api/v1/clusters` filters them.

Who may: members and admins (a pass records what it finds: a viewer reads only);
`terminate_orphans` terminates instances no live cluster owns, so it is for admins.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict

from skypurza.events import provisioner_queries, status_queries

from .deps import STATUS_TIMEOUT_S, ApiDeps
from .identity import Principal, authorize, visible
from .problems import Problem, forbidden, unavailable

log = logging.getLogger("skypurza.api")


class ReconcileRequest(BaseModel):
    """`spz status -r`'s options: `terminate_orphans` (--terminate-orphans), and the listing's
    `all_users` (-u) and `include_terminated` (-a)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    terminate_orphans: bool = False
    all_users: bool = False
    include_terminated: bool = False


def may_reconcile(who: Principal, terminate: bool) -> str | None:
    """Why `who` may not ask this pass, or None."""
    # It belongs to no team: the caller's highest role decides (a member of any team may ask it).
    role = who.role_in(None)
    if not authorize(who, "submit", who.user, None).allowed:
        return f"{who.user} is a {role}: a reconciliation records what it finds, so it is for members and admins"
    if terminate and not who.is_admin:
        return ("--terminate-orphans terminates instances no live cluster owns (anyone's): it is for admins "
                f"(you are {who.user}, {role}); spz status -r without it reports them")
    return None


def router(deps: ApiDeps) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["clusters"])
    caller = Depends(deps.principal)

    @r.post("/reconcile", summary="Reconcile with the clouds, then the clusters (spz status -r)")
    async def reconcile(body: ReconcileRequest, who: Principal = caller) -> dict[str, Any]:
        refusal = may_reconcile(who, body.terminate_orphans)
        if refusal:
            raise forbidden(refusal)
        b = deps.bus()
        try:
            report = await provisioner_queries.reconcile(b, body.terminate_orphans)
        except RuntimeError as exc:  # the provisioner answered with its error
            raise Problem(502, "reconcile-failed", "Bad Gateway", f"reconciliation failed: {exc}"[:2000])
        except Exception as exc:  # no provisioner (no responders), or none within the bound
            log.warning("reconcile query failed: %s: %s", type(exc).__name__, exc)
            raise unavailable(f"the provisioner is not answering (waited at most "
                              f"{provisioner_queries.RECONCILE_TIMEOUT_S:.0f} s); is the control plane's provisioner "
                              "running? (`spz api status`)")
        log.info("reconciliation asked by %s (terminate orphans: %s): %d orphan(s)", who.user,
                 body.terminate_orphans, len(report.get("orphans") or []))
        try:
            seq = await b.last_seq()
            rows = await status_queries.status(b, all=body.include_terminated, min_seq=seq, timeout=STATUS_TIMEOUT_S)
        except Exception as exc:
            log.warning("status query failed: %s: %s", type(exc).__name__, exc)
            raise unavailable(f"the status service did not answer in {STATUS_TIMEOUT_S:.0f} s; is the control plane "
                              "running (spz api status)?")
        return {"report": report, "clusters": visible(who, rows, body.all_users), "all_users": body.all_users,
                "seq": seq}

    return r
