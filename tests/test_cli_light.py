"""`spz --help` stays light (issue 21): it imports neither the bus client (nats-py, which pulls in
aiohttp and builds an SSL context), nor DuckDB, nor the pydantic event and task-spec models. Each
command imports what it needs inside itself; this checks a real `spz --help` process."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("nats", "duckdb", "pydantic", "aiohttp", "skypurza.events.taskspec", "skypurza.events.registry",
         "skypurza.events.models", "skypurza.events.bus", "httpx")  # httpx: only once an API server is configured

PROBE = """
import json, runpy, sys
sys.argv = ["spz", "--help"]
try:
    runpy.run_module("skypurza.cli.main", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def test_help_imports_no_bus_no_duckdb_no_models() -> None:
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    report = json.loads(r.stderr.strip().splitlines()[-1])
    assert report["code"] in (0, None) and "launch" in r.stdout and "check-yaml" in r.stdout, r.stdout
    modules = report["modules"]
    assert "skypurza.cli.cmd_jobs" in modules and "typer" in modules  # the probe really ran the CLI
    heavy = sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], f"spz --help imported {heavy}"


def test_the_bus_client_loads_without_aiohttp_which_stays_importable() -> None:
    """events/natslight.py: nats-py's websocket transport (the only user of aiohttp in it) is left
    out, 100+ ms of every command that talks to the bus; aiohttp itself still imports after
    (aiobotocore needs it), and the bus still talks to a real server (tests/test_bus.py)."""
    probe = ("import sys, json; import skypurza.events.bus; before = 'aiohttp' in sys.modules; "
             "import aiohttp, nats.aio.transport as t; "
             "print(json.dumps([before, t.aiohttp is None, bool(aiohttp.ClientSession)]))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert json.loads(r.stdout) == [False, True, True], r.stderr
