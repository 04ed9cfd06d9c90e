"""The golden event log: every event type replayed into DuckDB — the ledger's file and the status
service's — and compared with committed results.

Any change to a reducer, an upcaster or the decoder that alters what a historical log projects to
fails here. Regenerate on purpose only:
    SKYPURZA_REGEN_GOLDEN=1 pytest tests/test_ledger_golden.py   # expected_tables.json, expected_status_tables.json
    SKYPURZA_REGEN_GOLDEN_EVENTS=1 pytest tests/test_ledger_golden.py   # events.jsonl (rarely)
"""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
from ledger_history import History, scripted, settlement_tail, unknown_and_poison
from nats_fixtures import connect_bus

from skypurza.events import naming
from skypurza.events.envelope import make_envelope, split_type
from skypurza.events.models import all_event_types
from skypurza.services.ledger.ledgerconfig import parse_ledger_config
from skypurza.services.ledger.meter import due_usage
from skypurza.services.ledger.pipeline import Projector
from skypurza.events.projection.replay import replay_into as status_replay_into
from skypurza.services.ledger.replay import replay_into
from skypurza.services.ledger.schema import TABLES
from skypurza.services.status.projector import PROJECTION as STATUS

GOLDEN = Path(__file__).parent / "golden"
EVENTS = GOLDEN / "events.jsonl"
EXPECTED = GOLDEN / "expected_tables.json"
EXPECTED_STATUS = GOLDEN / "expected_status_tables.json"


def build_events(tmp: Path) -> list[bytes]:
    """The scripted history, the meter's usage for it (one interval stored twice), settlement."""
    h = scripted()
    lines = h.lines()
    proj = Projector(tmp / "gen.duckdb")
    proj.apply_raw([(i + 1, 0, line) for i, line in enumerate(lines)])
    cfg = parse_ledger_config({"billing": {"weights": {"default": "CPU=1.0,Mem=0.25G,GRES/gpu=2.0",
                                                       "teams": {"research": "CPU=0.5,GRES/gpu:a10g=4"}},
                                           "flags": "MAX_TRES"}})
    usage = due_usage(proj.state, datetime(2026, 10, 31, 2, tzinfo=UTC), timedelta(minutes=10), cfg, {})
    proj.close()
    t = datetime(2026, 10, 31, 2, tzinfo=UTC)
    meter = [make_envelope(ev, source="/skypurza/test/ledger", id=eid, time=t).to_json() for eid, ev in usage]
    tail = History(t0=t, source="/tests/settlement", prefix="tail")
    settlement_tail(tail, offset=len(lines) + len(meter) + 1)
    return lines + meter + meter[:1] + tail.lines() + unknown_and_poison()


def _subject(line: bytes) -> str:
    try:
        doc = json.loads(line)
        agg, _, agg_id = doc["subject"].partition("/")
        return naming.event_subject("test", agg, agg_id or "x", doc["type"].split(".")[2])
    except (ValueError, KeyError, IndexError):
        return naming.event_subject("test", "unknown", "x", "unreadable")


def _jsonable(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat()
    return v


def dump(path: Path, tables: tuple[Any, ...] = TABLES) -> dict[str, Any]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        out = {}
        for t in tables:
            res = con.execute(f'SELECT * FROM "{t.name}" ORDER BY {t.order_by}')
            out[t.name] = {"columns": [d[0] for d in res.description],
                           "rows": [[_jsonable(v) for v in row] for row in res.fetchall()]}
        return out
    finally:
        con.close()


def test_golden_log_replays_to_the_committed_tables(nats_server, tmp_path):
    if os.environ.get("SKYPURZA_REGEN_GOLDEN_EVENTS"):
        EVENTS.write_bytes(b"\n".join(build_events(tmp_path)) + b"\n")
    lines = [line for line in EVENTS.read_bytes().splitlines() if line.strip()]

    async def main():
        bus = await connect_bus(nats_server)
        # Every line is stored as it is, in order (a repeated id included: a late re-publish).
        for i, line in enumerate(lines):
            await bus.js.publish(_subject(line), line, headers={"Nats-Msg-Id": f"golden-{i}"})
        res = await replay_into(bus, tmp_path / "golden.duckdb")
        status = await status_replay_into(bus, tmp_path / "status.duckdb", STATUS)
        await bus.close()
        return res, status

    res, status = asyncio.run(main())
    assert res["records"] == status["records"] == len(lines)
    got = dump(tmp_path / "golden.duckdb")
    got_status = dump(tmp_path / "status.duckdb", STATUS.tables)
    if os.environ.get("SKYPURZA_REGEN_GOLDEN"):
        EXPECTED.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        EXPECTED_STATUS.write_text(json.dumps(got_status, indent=1, sort_keys=True) + "\n")
    for have, path in ((got, EXPECTED), (got_status, EXPECTED_STATUS)):
        expected = json.loads(path.read_text())
        for table in expected:
            assert have[table] == expected[table], f"table {table} differs from tests/golden/{path.name}"
        assert set(have) == set(expected)
    # The fleet tables both keep (the ledger's private copy for its meter) are the same rows.
    for table in ("clusters", "nodes", "placements", "applied_events", "skipped"):
        assert got[table] == got_status[table], table
    # One usage row per distinct usage event id (the golden log stores one interval twice).
    usage_ids = {json.loads(line)["id"] for line in lines if b"usage_recorded" in line}
    assert len(got["usage"]["rows"]) == len(usage_ids) < sum(1 for line in lines if b"usage_recorded" in line)


def test_golden_log_has_every_event_type():
    # The golden log is history: an event stored at an older version counts (it reaches the current
    # one through its upcasters, which decoding runs; managed_job_status_changed is stored at v1).
    stored = {split_type(json.loads(line)["type"]) for line in EVENTS.read_bytes().splitlines() if line.strip()}
    missing = {cls.type_name() for cls in all_event_types()
               if not any(name == cls.EVENT_NAME and 0 < v <= cls.VERSION for name, v in stored)}
    assert not missing, f"add these to the golden log (SKYPURZA_REGEN_GOLDEN_EVENTS=1): {sorted(missing)}"

