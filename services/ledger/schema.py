"""The projection tables of the ledger's DuckDB file: DDL, keys and a deterministic order.

All times are UTC, stored as TIMESTAMP (no time zone: nothing depends on a session setting).
Money is BIGINT micro-dollars; billing is BIGINT billing-seconds (Slurm's stored integer billing
× seconds). JSON-valued columns (tres, labels, accelerators) are VARCHAR holding JSON with
sorted keys, so equal values are equal strings. docs/ledger.md describes every column.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = 1
PROJECTION = "ledger"


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...]
    # Keys are kept by the projector (one row per key; a changed row is replaced by DELETE +
    # INSERT; usage is de-duplicated before it is written), so no table needs an index: an ART
    # index costs several µs per inserted row, a third of the replay budget.
    indexed: bool = False

    @property
    def column_names(self) -> list[str]:
        return [c for c, _ in self.columns]

    def ddl(self, schema: str = "main") -> str:
        cols = ",\n  ".join(f'"{c}" {t}' for c, t in self.columns)
        key = ", ".join(f'"{k}"' for k in self.key)
        pk = f",\n  PRIMARY KEY ({key})" if self.indexed else ""
        return f'CREATE TABLE IF NOT EXISTS {schema}."{self.name}" (\n  {cols}{pk}\n)'

    @property
    def order_by(self) -> str:
        return ", ".join(f'"{k}"' for k in self.key)


def _t(name: str, key: tuple[str, ...], *columns: tuple[str, str], indexed: bool = False) -> Table:
    return Table(name, tuple(columns), key, indexed)


TS = "TIMESTAMP"
V = "VARCHAR"
I = "INTEGER"
B = "BIGINT"
BOOL = "BOOLEAN"

CHECKPOINT = _t(
    "checkpoint", ("projection",),
    ("projection", V), ("last_seq", B), ("records", B), ("schema_version", I), indexed=True,
)

# Ids of the control events applied (usage events are de-duplicated by usage.event_id).
APPLIED = _t("applied_events", ("event_id",), ("event_id", V), ("seq", B), ("type", V))

# Events the projection could not use: unknown types and unreadable payloads.
SKIPPED = _t("skipped", ("seq",), ("seq", B), ("event_id", V), ("type", V), ("status", V), ("reason", V))

CLUSTERS = _t(
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

NODES = _t(
    "nodes", ("cluster", "rank"),
    ("cluster", V), ("rank", I), ("instance_id", V), ("private_ip", V), ("public_ip", V), ("zone", V),
    ("status", V), ("ready_at", TS), ("host", V), ("agent_id", V), ("last_event_seq", B),
)

JOBS = _t(
    "jobs", ("cluster", "job_id"),
    ("cluster", V), ("job_id", B), ("name", V), ("task_id", V), ("user", V), ("num_nodes", I), ("status", V),
    ("submitted_at", TS), ("started_at", TS), ("ended_at", TS), ("exit_code", I), ("failed_rank", I),
    ("failed_phase", V), ("reason", V), ("managed_job_id", B), ("skypilot_task_id", V),
    ("has_setup", BOOL), ("setup_done_ranks", I), ("cancel_requested", BOOL), ("last_event_seq", B),
)

MANAGED_JOBS = _t(
    "managed_jobs", ("job_id",),
    ("job_id", B), ("name", V), ("user", V), ("team", V), ("project", V), ("status", V),
    ("num_tasks", I), ("task_index", I), ("cluster", V), ("recoveries", I), ("restarts_on_errors", I),
    ("submitted_at", TS), ("started_at", TS), ("ended_at", TS), ("cancel_requested", BOOL),
    ("reason", V), ("last_event_seq", B),
)

# One row per task submission: where its placement stands.
PLACEMENTS = _t(
    "placements", ("task_id",),
    ("task_id", V), ("kind", V), ("cluster", V), ("user", V), ("team", V), ("project", V),
    ("labels", V), ("managed_job_id", B), ("task_index", I), ("num_nodes", I), ("submitted_at", TS),
    ("status", V), ("attempts", I), ("infra", V), ("region", V), ("zone", V), ("instance_type", V),
    ("market", V), ("hourly_price_micros", B), ("reason", V), ("last_event_seq", B),
)

# One row per launch attempt (PlacementChosen) and what came of it.
ATTEMPTS = _t(
    "attempts", ("task_id", "attempt"),
    ("task_id", V), ("attempt", I), ("placement_id", V), ("cluster", V), ("infra", V), ("region", V),
    ("zone", V), ("instance_type", V), ("market", V), ("hourly_price_micros", B), ("num_nodes", I),
    ("chosen_at", TS), ("outcome", V), ("error_class", V), ("error_code", V), ("error_message", V),
    ("ended_at", TS), ("last_event_seq", B),
)

# One row per node run (lifetime): what the meter needs to continue where the log ends.
METERS = _t(
    "meters", ("cluster", "rank", "lifetime_id"),
    ("cluster", V), ("rank", I), ("lifetime_id", V), ("instance_id", V), ("instance_type", V),
    ("infra", V), ("region", V), ("zone", V), ("market", V), ("hourly_price_micros", B), ("tres", V),
    ("user", V), ("team", V), ("project", V), ("lifetime_start", TS), ("stop_at", TS),
    ("metered_until", TS), ("finalized", BOOL), ("created_seq", B), ("last_event_seq", B),
)

USAGE = _t(
    "usage", ("event_id",),
    ("event_id", V), ("seq", B), ("cluster", V), ("rank", I), ("lifetime_id", V), ("instance_id", V),
    ("start_at", TS), ("end_at", TS), ("instance_type", V), ("infra", V), ("region", V), ("zone", V),
    ("market", V), ("hourly_price_micros", B), ("cost_micros", B), ("billing_seconds", B), ("tres", V),
    ("user", V), ("team", V), ("project", V), ("period", V), ("booked_period", V),
    ("final", BOOL), ("correction", BOOL),
)

SETTLEMENTS = _t(
    "settlements", ("period",),
    ("period", V), ("settled_at", TS), ("through_seq", B), ("event_id", V), ("seq", B),
    ("total_micros", B), ("billing_seconds", B),
)

SETTLEMENT_TOTALS = _t(
    "settlement_totals", ("period", "team"),
    ("period", V), ("team", V), ("total_micros", B), ("billing_seconds", B),
)

COMPENSATIONS = _t(
    "compensations", ("usage_event_id",),
    ("usage_event_id", V), ("period", V), ("for_period", V), ("team", V), ("amount_micros", B),
    ("event_id", V), ("seq", B),
)

TABLES: tuple[Table, ...] = (
    CHECKPOINT, APPLIED, SKIPPED, CLUSTERS, NODES, JOBS, MANAGED_JOBS, PLACEMENTS, ATTEMPTS, METERS,
    USAGE, SETTLEMENTS, SETTLEMENT_TOTALS, COMPENSATIONS,
)
BY_NAME = {t.name: t for t in TABLES}


def create_all(con, schema: str = "main") -> None:  # noqa: ANN001 (a duckdb connection)
    for table in TABLES:
        con.execute(table.ddl(schema))
