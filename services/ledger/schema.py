"""The tables of the ledger's DuckDB file: DDL, keys and a deterministic order.

The ledger's file is its own: accounting (meters, usage, settlements, compensations) and the
private copy of what metering needs of the fleet (clusters, nodes, placements: prices, labels,
attribution, node lifetimes), kept by the open reducers of events/projection/fleet.py. What
`spz status` shows is the status service's file (docs/status.md), not this one.

Money is BIGINT micro-dollars; billing is BIGINT billing-seconds (Slurm's stored integer billing
× seconds). docs/ledger.md describes every column.
"""

from __future__ import annotations

from skypurza.events.projection.fleet import CLUSTERS, NODES, PLACEMENTS, RUN_KEY
from skypurza.events.projection.tables import APPLIED, BOOL, CHECKPOINT, SKIPPED, TS, B, I, Table, V, table

SCHEMA_VERSION = 1
PROJECTION = "ledger"

__all__ = ["APPLIED", "CHECKPOINT", "CLUSTERS", "NODES", "PLACEMENTS", "SKIPPED", "Table"]

# One row per node run (lifetime): what the meter needs to continue where the log ends.
METERS = table(
    "meters", RUN_KEY,
    ("cluster", V), ("rank", I), ("lifetime_id", V), ("instance_id", V), ("instance_type", V),
    ("infra", V), ("region", V), ("zone", V), ("market", V), ("hourly_price_micros", B), ("tres", V),
    ("user", V), ("team", V), ("project", V), ("lifetime_start", TS), ("stop_at", TS),
    ("metered_until", TS), ("finalized", BOOL), ("created_seq", B), ("last_event_seq", B),
)

USAGE = table(
    "usage", ("event_id",),
    ("event_id", V), ("seq", B), ("cluster", V), ("rank", I), ("lifetime_id", V), ("instance_id", V),
    ("start_at", TS), ("end_at", TS), ("instance_type", V), ("infra", V), ("region", V), ("zone", V),
    ("market", V), ("hourly_price_micros", B), ("cost_micros", B), ("billing_seconds", B), ("tres", V),
    ("user", V), ("team", V), ("project", V), ("period", V), ("booked_period", V),
    ("final", BOOL), ("correction", BOOL),
)

SETTLEMENTS = table(
    "settlements", ("period",),
    ("period", V), ("settled_at", TS), ("through_seq", B), ("event_id", V), ("seq", B),
    ("total_micros", B), ("billing_seconds", B),
)

SETTLEMENT_TOTALS = table(
    "settlement_totals", ("period", "team"),
    ("period", V), ("team", V), ("total_micros", B), ("billing_seconds", B),
)

COMPENSATIONS = table(
    "compensations", ("usage_event_id",),
    ("usage_event_id", V), ("period", V), ("for_period", V), ("team", V), ("amount_micros", B),
    ("event_id", V), ("seq", B),
)

# One row per Slurm allocation of ours that ended (SlurmAllocationAccounted): what Slurm says it
# used, its billing under the partition's weights, and whether that billing is in `usage` yet.
SLURM_ALLOCATIONS = table(
    "slurm_allocations", ("cluster", "slurm_job_id"),
    ("cluster", V), ("slurm_job_id", B), ("slurm_cluster", V), ("partition", V), ("state", V), ("source", V),
    ("alloc_tres", V), ("elapsed_s", B), ("start_at", TS), ("end_at", TS), ("billing_weights", V),
    ("priority_flags", V), ("billing_int", B), ("slurm_billing", B), ("billing_seconds", B), ("error", V),
    ("usage_event_id", V), ("billed", BOOL), ("event_id", V), ("seq", B),
)

TABLES: tuple[Table, ...] = (
    CHECKPOINT, APPLIED, SKIPPED, CLUSTERS, NODES, PLACEMENTS, METERS,
    USAGE, SETTLEMENTS, SETTLEMENT_TOTALS, COMPENSATIONS, SLURM_ALLOCATIONS,
)
BY_NAME = {t.name: t for t in TABLES}
