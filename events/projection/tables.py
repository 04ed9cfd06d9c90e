"""Table definitions of a projection file, and the three tables every projection file has.

All times are UTC, stored as TIMESTAMP (no time zone: nothing depends on a session setting).
JSON-valued columns are VARCHAR holding JSON with sorted keys, so equal values are equal strings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...]
    # Keys are kept by the reducers (one row per key; a changed row is replaced by DELETE +
    # INSERT), so no table needs an index: an ART index costs several µs per inserted row, a
    # third of the ledger's replay budget.
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


def table(name: str, key: tuple[str, ...], *columns: tuple[str, str], indexed: bool = False) -> Table:
    return Table(name, tuple(columns), key, indexed)


TS = "TIMESTAMP"
V = "VARCHAR"
I = "INTEGER"  # noqa: E741
B = "BIGINT"
BOOL = "BOOLEAN"

CHECKPOINT = table(
    "checkpoint", ("projection",),
    ("projection", V), ("last_seq", B), ("records", B), ("schema_version", I), indexed=True,
)

# Ids of the control events applied (events a projection de-duplicates by position, like the
# meter's usage, are not listed).
APPLIED = table("applied_events", ("event_id",), ("event_id", V), ("seq", B), ("type", V))

# Events the projection could not use: unknown types, unreadable payloads, events that failed.
SKIPPED = table("skipped", ("seq",), ("seq", B), ("event_id", V), ("type", V), ("status", V), ("reason", V))

COMMON: tuple[Table, ...] = (CHECKPOINT, APPLIED, SKIPPED)


def create_all(con, tables: tuple[Table, ...], schema: str = "main") -> None:  # noqa: ANN001 (duckdb)
    for t in tables:
        con.execute(t.ddl(schema))
        _add_trailing_columns(con, t, schema)


def _add_trailing_columns(con, t: Table, schema: str) -> None:  # noqa: ANN001 (duckdb)
    """Columns appended to a table since the file was made are added to it (NULL in the rows it
    has): a new column at the end of a table is an upgrade without a rebuild. Any other change
    of a table's columns needs a new schema version (the inserts are positional)."""
    have = [r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = ? AND table_name = ? "
        "ORDER BY ordinal_position", [schema, t.name]).fetchall()]
    names = t.column_names
    if not have or have == names or have != names[:len(have)]:
        return
    for c, typ in t.columns[len(have):]:
        con.execute(f'ALTER TABLE {schema}."{t.name}" ADD COLUMN "{c}" {typ}')
