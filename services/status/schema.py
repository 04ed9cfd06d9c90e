"""The tables of the status service's DuckDB file (`naming.status_db_file`): DDL and keys.

Clusters, nodes and placements are the open fleet tables (events/projection/fleet.py), shared
with the ledger's private copy; jobs, managed jobs, launch attempts and node runs are this
service's. All times are UTC TIMESTAMPs; prices are BIGINT micro-dollars; docs/status.md
describes every column.
"""

from __future__ import annotations

from skypurza.events.projection.fleet import CLUSTERS, NODES, PLACEMENTS, RUN_COLUMNS, RUN_KEY
from skypurza.events.projection.tables import APPLIED, BOOL, CHECKPOINT, SKIPPED, TS, B, I, Table, V, table

SCHEMA_VERSION = 1
PROJECTION = "status"

JOBS = table(
    "jobs", ("cluster", "job_id"),
    ("cluster", V), ("job_id", B), ("name", V), ("task_id", V), ("user", V), ("num_nodes", I), ("status", V),
    ("submitted_at", TS), ("started_at", TS), ("ended_at", TS), ("exit_code", I), ("failed_rank", I),
    ("failed_phase", V), ("reason", V), ("managed_job_id", B), ("skypilot_task_id", V),
    ("has_setup", BOOL), ("setup_done_ranks", I), ("cancel_requested", BOOL), ("last_event_seq", B),
    # appended (events/projection/tables.py adds it to an older file; NULL for its older rows)
    ("resources", V),
)

MANAGED_JOBS = table(
    "managed_jobs", ("job_id",),
    ("job_id", B), ("name", V), ("user", V), ("team", V), ("project", V), ("status", V),
    ("num_tasks", I), ("task_index", I), ("cluster", V), ("recoveries", I), ("restarts_on_errors", I),
    ("submitted_at", TS), ("started_at", TS), ("ended_at", TS), ("cancel_requested", BOOL),
    ("reason", V), ("last_event_seq", B),
)

# One row per launch attempt (PlacementChosen) and what came of it.
ATTEMPTS = table(
    "attempts", ("task_id", "attempt"),
    ("task_id", V), ("attempt", I), ("placement_id", V), ("cluster", V), ("infra", V), ("region", V),
    ("zone", V), ("instance_type", V), ("market", V), ("hourly_price_micros", B), ("num_nodes", I),
    ("chosen_at", TS), ("outcome", V), ("error_class", V), ("error_code", V), ("error_message", V),
    ("ended_at", TS), ("last_event_seq", B),
)

# One row per node run (events/projection/fleet.py): when each node ran, at what price, and how
# far the meter's usage reached — a cluster's cost so far in `status`.
NODE_RUNS = table("node_runs", RUN_KEY, *RUN_COLUMNS)

TABLES: tuple[Table, ...] = (
    CHECKPOINT, APPLIED, SKIPPED, CLUSTERS, NODES, JOBS, MANAGED_JOBS, PLACEMENTS, ATTEMPTS, NODE_RUNS,
)
BY_NAME = {t.name: t for t in TABLES}
