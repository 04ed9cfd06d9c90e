"""Decoding imports only the models it meets (events/modeltable.py, issue 21): the table of
which module defines each event type is the real registry's, both ways, and a fresh process that
decodes one type builds no other module's models."""

from __future__ import annotations

import json
import subprocess
import sys

from skypurza.events.modeltable import MODEL_MODULES, names_of_aggregate
from skypurza.events.models import REGISTRY


def test_the_table_is_the_registry() -> None:
    real = {name: (cls.__module__.rsplit(".", 1)[-1], cls.AGGREGATE) for name, cls in REGISTRY.items()
            if cls.__module__.startswith("skypurza.events.")}
    assert MODEL_MODULES == real
    assert names_of_aggregate("cluster") == sorted(n for n, c in REGISTRY.items() if c.AGGREGATE == "cluster")


DECODE_ONE = """
import json, sys
from skypurza.events.envelope import decode, make_envelope
from skypurza.events.job_events import JobQueued
before = sorted(m for m in sys.modules if m.startswith("skypurza.events."))
env = make_envelope(JobQueued(cluster="c", job_id=1, run="echo hi", task_id="t"), source="/t")
got = decode(env.to_json())
# a type whose module nothing imported yet: decoded by importing that one module
alert = b'{"specversion":"1.0","id":"1","source":"/t","type":"io.skypurza.alert_resolved.v1",' \\
        b'"time":"2026-12-01T00:00:00Z","subject":"alert/a","data":{"rule":"r","key":"k"}}'
other = decode(alert)
print(json.dumps({"before": before, "status": [got.status, other.status],
                  "types": [type(got.event).__name__, type(other.event).__name__],
                  "after": sorted(m for m in sys.modules if m.startswith("skypurza.events."))}))
"""


def test_a_decode_builds_only_the_models_of_its_type() -> None:
    r = subprocess.run([sys.executable, "-c", DECODE_ONE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["status"] == ["ok", "ok"] and out["types"] == ["JobQueued", "AlertResolved"]
    modules = {m.rsplit(".", 1)[-1] for m in out["after"]}
    models = {m for m in modules if m.endswith("_events")}
    assert models == {"job_events", "alert_events"}, sorted(models)
    assert "models" not in modules and "dispatch_policy" not in modules
    assert "alert_events" not in {m.rsplit(".", 1)[-1] for m in out["before"]}
