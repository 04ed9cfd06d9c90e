"""Decoding imports only the models it meets (events/modeltable.py, issue 21): the table of
which module defines each event type is the real registry's, both ways, and a fresh process that
decodes one type builds no other module's models."""

from __future__ import annotations

import json
import subprocess
import sys

from datetime import datetime, timezone

from skypurza.events.envelope import make_envelope
from skypurza.events.modeltable import MODEL_MODULES, names_of_aggregate
from skypurza.events.models import REGISTRY, AlertResolved, DownRequested


def test_the_table_is_the_registry() -> None:
    real = {name: (cls.__module__.rsplit(".", 1)[-1], cls.AGGREGATE) for name, cls in REGISTRY.items()
            if cls.__module__.startswith("skypurza.events.")}
    assert MODEL_MODULES == real
    assert names_of_aggregate("cluster") == sorted(n for n, c in REGISTRY.items() if c.AGGREGATE == "cluster")


DECODE = """
import json, sys
from skypurza.events.envelope import decode
got = [decode(bytes.fromhex(a)) for a in sys.argv[1:]]
print(json.dumps({"status": [d.status for d in got], "types": [type(d.event).__name__ for d in got],
                  "modules": sorted(m for m in sys.modules if m.startswith("skypurza.events."))}))
"""


def _decoded_in_a_fresh_process(*events: object) -> dict:
    payloads = [make_envelope(e, source="/t").to_json().hex() for e in events]
    r = subprocess.run([sys.executable, "-c", DECODE, *payloads], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_a_decode_builds_only_the_models_of_its_type() -> None:
    out = _decoded_in_a_fresh_process(DownRequested(cluster="c"),
                                      AlertResolved(key="k", kind="orphan", subject="n", occurrence=1,
                                                    reason="r", resolved_at=datetime(2026, 12, 1, tzinfo=timezone.utc)))
    assert out["status"] == ["ok", "ok"] and out["types"] == ["DownRequested", "AlertResolved"]
    modules = {m.rsplit(".", 1)[-1] for m in out["modules"]}
    assert {m for m in modules if m.endswith("_events")} == {"cluster_events", "alert_events"}, sorted(modules)
    assert "models" not in modules and "dispatch_policy" not in modules


def test_an_envelope_alone_imports_no_model() -> None:
    out = _decoded_in_a_fresh_process()
    assert not [m for m in out["modules"] if m.endswith(("_events", ".models"))], out["modules"]
