"""`spz events export`: the log as JSON Lines or Parquet, for auditors and outside tools.

JSON Lines: one CloudEvents 1.0 event (structured mode, exactly as stored) per line, with the
stream sequence added as the `sequence` extension attribute (a string, as CloudEvents wants).
Parquet: one row per event: sequence, id, source, type, subject, time, stored_at (the server's
timestamp) and data (the payload as JSON text).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from skypurza.events.projection.logreader import LogReader

FORMATS = ("jsonl", "parquet")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_PARQUET = pa.schema([
    ("sequence", pa.int64()), ("id", pa.string()), ("source", pa.string()), ("type", pa.string()),
    ("subject", pa.string()), ("time", pa.string()), ("stored_at", pa.timestamp("us", tz="UTC")),
    ("data", pa.string()),
])


def _doc(seq: int, data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        doc = None
    if not isinstance(doc, dict):
        return {"sequence": str(seq), "unreadable": data.decode("utf-8", errors="replace")}
    doc["sequence"] = str(seq)
    return doc


async def export(bus: Any, format: str, file: Path | str, *, since_seq: int | None = None,
                 since_time: datetime | None = None, until_seq: int | None = None,
                 until_time: datetime | None = None) -> dict[str, Any]:
    if format not in FORMATS:
        raise ValueError(f"format {format!r}; accepted: {', '.join(FORMATS)}")
    path = Path(file)
    reader = LogReader(bus, start_seq=since_seq or 1, start_time=since_time, until_seq=until_seq,
                       until_time=until_time)
    n, first, last = 0, None, None
    tmp = path.with_name(path.name + ".part")
    if format == "jsonl":
        with open(tmp, "w", encoding="utf-8") as out:
            async for batch in reader.batches():
                for seq, _ts, data in batch:
                    out.write(json.dumps(_doc(seq, data), separators=(",", ":")) + "\n")
                    first = first if first is not None else seq
                    last, n = seq, n + 1
    else:
        writer = pq.ParquetWriter(tmp, _PARQUET)
        try:
            async for batch in reader.batches():
                cols: dict[str, list[Any]] = {f.name: [] for f in _PARQUET}
                for seq, ts, data in batch:
                    doc = _doc(seq, data)
                    cols["sequence"].append(seq)
                    for k in ("id", "source", "type", "subject", "time"):
                        v = doc.get(k)
                        cols[k].append(None if v is None else str(v))
                    cols["stored_at"].append(_EPOCH + timedelta(microseconds=ts // 1000))
                    payload = doc.get("data", doc.get("unreadable"))
                    cols["data"].append(json.dumps(payload, sort_keys=True, separators=(",", ":")))
                    first = first if first is not None else seq
                    last, n = seq, n + 1
                writer.write_table(pa.Table.from_pydict(cols, schema=_PARQUET))
        finally:
            writer.close()
    tmp.replace(path)
    return {"file": str(path), "format": format, "events": n, "first_seq": first, "last_seq": last}
