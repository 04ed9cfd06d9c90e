"""Client side of the provisioner's query (NATS request-reply): a reconciliation pass now.

The provisioner service answers on `naming.query_subject(stage, "provisioner", "reconcile")`
with the report `spz reconcile -o json` prints (services/provisioner/reconcile.py
`ReconcileReport.to_dict`): what the clouds hold with this stage's tags beside the live clusters
of the log, the orphans it recorded (OrphanFound) and the clusters whose instances vanished.
The API server asks it for `spz status -r` (services/api/routes_reconcile.py); on the embedded
bus the CLI runs the same pass itself.
"""

from __future__ import annotations

from typing import Any

from .bus import Bus

SERVICE = "provisioner"
RECONCILE_TIMEOUT_S = 50.0  # a pass lists every region of every infra; the API's client waits 60 s


async def reconcile(bus: Bus, terminate_orphans: bool = False, timeout: float = RECONCILE_TIMEOUT_S) -> dict[str, Any]:
    """One reconciliation pass by the provisioner; `terminate_orphans` also terminates them."""
    return await bus.request(SERVICE, "reconcile", {"terminate": bool(terminate_orphans)}, timeout=timeout)
