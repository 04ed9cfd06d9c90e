"""The read side every projection shares: rows as JSON-able dicts with ISO 8601 UTC times. Each projection's queries (services/status/queries.py,
services/ledger/queries.py) are built on these, so the same file gives the same bytes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

_TS_FMT = "%Y-%m-%dT%H:%M:%S.%fZ"


def iso(t: datetime | None) -> str | None:
    if t is None:
        return None
    t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    return t.strftime(_TS_FMT)


def dicts(cur: Any, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    res = cur.execute(sql, params or [])
    names = [d[0] for d in res.description]
    out = []
    for row in res.fetchall():
        out.append({k: iso(v) if isinstance(v, datetime) else v for k, v in zip(names, row)})
    return out

