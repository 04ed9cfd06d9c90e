"""Which module defines each event model, so a decoder imports only the models it meets.

Importing every `*_events.py` module (events/models.py) builds every model class and pulls in
what they import (the dispatch policy, the task payloads ...): ~45% of the envelope's import,
paid by every `spz` command though most decode a handful of types (issue 21). `model_for` imports
the one module of a type on its first decode; the registry stays what `register` fills.

The table is data, not derived at import (that would import every model): tests/test_envelope_lazy.py
checks it against the real registry, both ways, so a new or moved event type fails there first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .registry import REGISTRY

if TYPE_CHECKING:
    from .registry import Event

# event name -> (module under skypurza.events that registers it, its aggregate)
MODEL_MODULES: dict[str, tuple[str, str]] = {
    "alert_delivered": ("alert_events", "alert"),
    "alert_delivery_claimed": ("alert_events", "alert"),
    "alert_raised": ("alert_events", "alert"),
    "alert_resolved": ("alert_events", "alert"),
    "autostop_set": ("cluster_events", "cluster"),
    "cleanup_failed": ("cluster_events", "cluster"),
    "cluster_idle": ("cluster_events", "cluster"),
    "cluster_provisioned": ("cluster_events", "cluster"),
    "cluster_started": ("cluster_events", "cluster"),
    "cluster_stopped": ("cluster_events", "cluster"),
    "cluster_terminated": ("cluster_events", "cluster"),
    "down_requested": ("cluster_events", "cluster"),
    "node_lost": ("cluster_events", "cluster"),
    "node_ready": ("cluster_events", "cluster"),
    "orphan_found": ("cluster_events", "cluster"),
    "slurm_allocation_accounted": ("cluster_events", "cluster"),
    "spot_preempted": ("cluster_events", "cluster"),
    "start_requested": ("cluster_events", "cluster"),
    "stop_requested": ("cluster_events", "cluster"),
    "usage_recorded": ("cluster_events", "cluster"),
    "budget_threshold_crossed": ("dispatch_events", "budget"),
    "dispatch_policy_applied": ("dispatch_events", "dispatch"),
    "task_admitted": ("dispatch_events", "task"),
    "task_budget_stopped": ("dispatch_events", "task"),
    "task_held": ("dispatch_events", "task"),
    "task_preempted": ("dispatch_events", "task"),
    "gpu_unhealthy": ("health_events", "cluster"),
    "team_added": ("identity_events", "team"),
    "team_removed": ("identity_events", "team"),
    "team_updated": ("identity_events", "team"),
    "token_issued": ("identity_events", "user"),
    "token_revoked": ("identity_events", "user"),
    "user_added": ("identity_events", "user"),
    "user_joined_team": ("identity_events", "user"),
    "user_left_team": ("identity_events", "user"),
    "user_removed": ("identity_events", "user"),
    "user_team_role_set": ("identity_events", "user"),
    "cancel_requested": ("job_events", "cluster"),
    "job_cancelled": ("job_events", "cluster"),
    "job_failed": ("job_events", "cluster"),
    "job_node_finished": ("job_events", "cluster"),
    "job_queued": ("job_events", "cluster"),
    "job_started": ("job_events", "cluster"),
    "job_succeeded": ("job_events", "cluster"),
    "compensation_recorded": ("ledger_events", "ledger"),
    "period_settled": ("ledger_events", "ledger"),
    "managed_job_cancel_requested": ("managed_events", "mjob"),
    "managed_job_status_changed": ("managed_events", "mjob"),
    "managed_job_submitted": ("managed_events", "mjob"),
    "capacity_error": ("task_events", "task"),
    "placement_chosen": ("task_events", "task"),
    "placement_failed": ("task_events", "task"),
    "provision_failed": ("task_events", "task"),
    "task_submitted": ("task_events", "task"),
}

_PACKAGE = __name__.rpartition(".")[0]


def model_for(name: str) -> "type[Event] | None":
    """The registered model of event `name`, importing its module the first time; None when no
    module here defines it (a type of a newer writer, or a name that is not ours)."""
    cls = REGISTRY.get(name)
    if cls is None:
        entry = MODEL_MODULES.get(name)
        if entry is not None:
            importlib.import_module(f"{_PACKAGE}.{entry[0]}")  # registers its models and upcasters
            cls = REGISTRY.get(name)
    return cls


def names_of_aggregate(aggregate: str) -> list[str]:
    """Every event name of `aggregate` known here (the table's, and any registered since), sorted,
    without importing a model."""
    names = {n for n, (_, agg) in MODEL_MODULES.items() if agg == aggregate}
    names.update(n for n, cls in REGISTRY.items() if cls.AGGREGATE == aggregate)
    return sorted(names)


def load_all() -> None:
    """Import every event model (what a caller that lists them all needs)."""
    from . import models  # noqa: F401
