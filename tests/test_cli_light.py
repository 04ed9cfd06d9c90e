"""`spz --help` stays light (issue 21): it imports neither the bus client (nats-py, which pulls in
aiohttp and builds an SSL context), nor DuckDB, nor the pydantic event and task-spec models. Each
command imports what it needs inside itself; this checks a real `spz --help` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HEAVY = ("nats", "duckdb", "pydantic", "aiohttp", "skypurza.events.taskspec", "skypurza.events.registry",
         "skypurza.events.models", "skypurza.events.bus", "httpx",  # httpx: only once an API server is configured
         # asyncio (and the ssl it loads): only commands that talk to the bus; rich's markdown and
         # traceback (markdown_it, pygments, attrs): typer's help renderer never uses them (cli/richlight.py)
         "asyncio", "ssl", "markdown_it", "pygments", "attr", "rich.markdown", "rich.traceback", "yaml")
# What reading a task file needs is the task-spec models and YAML: never the bus, the event
# models, DuckDB, asyncio or the optimizer's event-driven half (`launch --dryrun` places in-process
# with the pure placement: services/optimizer/placement.py, not decide.py).
OFFLINE_HEAVY = ("nats", "duckdb", "aiohttp", "httpx", "asyncio", "ssl", "markdown_it", "pygments",
                 "skypurza.events.registry", "skypurza.events.models", "skypurza.events.envelope",
                 "skypurza.events.bus", "skypurza.services.optimizer.decide", "skypurza.services.optimizer.service")
TASK = "name: hi\nresources:\n  cpus: 1+\nrun: echo hi\n"

PROBE = """
import json, runpy, sys
sys.argv = ["spz", *sys.argv[1:]] if len(sys.argv) > 1 else ["spz", "--help"]
try:
    runpy.run_module("skypurza.cli.main", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def test_help_imports_no_bus_no_duckdb_no_models(tmp_path) -> None:
    # A fresh home: no cached help (cli/helpcache.py), so typer renders it.
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "SKYPURZA_HOME": str(tmp_path)})
    report = json.loads(r.stderr.strip().splitlines()[-1])
    assert report["code"] in (0, None) and "launch" in r.stdout and "check-yaml" in r.stdout, r.stdout
    modules = report["modules"]
    assert "skypurza.cli.lazyapp" in modules and "typer" in modules  # the probe really ran the CLI
    heavy = sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], f"spz --help imported {heavy}"


def _heavy(args: list[str], heavy: tuple[str, ...], tmp_path) -> tuple[subprocess.CompletedProcess, list[str]]:
    env = {**os.environ, "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_STAGE": "light"}
    env.pop("SKYPURZA_NATS_URL", None)
    r = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60,
                       env=env, cwd=tmp_path)
    modules = json.loads(r.stderr.strip().splitlines()[-1])["modules"]
    return r, sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in heavy))


def test_check_yaml_and_dryrun_import_no_bus_no_event_models(tmp_path) -> None:
    task = tmp_path / "hi.yaml"
    task.write_text(TASK)
    # check-yaml of plain arguments runs without typer, and prints plain lines without rich (cli/fastpath.py)
    r, heavy = _heavy(["check-yaml", str(task)], OFFLINE_HEAVY + ("skypurza.services.optimizer", "typer", "rich",
                                                                  "click"), tmp_path)
    assert "valid" in r.stdout and heavy == [], (r.stdout, r.stderr[-500:], heavy)
    # without a ~/.slurm/config, not even Slurm's config parser (events/slurmpath.py answers "is there one")
    os.environ["SKYPURZA_SLURM_CONFIG"] = str(tmp_path / "no-slurm-config")
    try:
        r, heavy = _heavy(["launch", "--dryrun", "-o", "json", str(task)],
                          OFFLINE_HEAVY + ("typer", "rich", "click", "skypurza.events.slurm_config"), tmp_path)
    finally:
        del os.environ["SKYPURZA_SLURM_CONFIG"]
    assert json.loads(r.stdout[:r.stdout.rindex("}") + 1])["chosen"] is not None, r.stdout
    assert heavy == [], f"spz launch --dryrun imported {heavy}"


def test_typer_help_renderer_gets_the_real_rich_classes_when_it_uses_them() -> None:
    """cli/richlight.py: the stand-ins typer's renderer holds build the real Markdown and
    Traceback the first time one is used, and the real modules stay importable by anyone."""
    probe = ("import sys, json; from skypurza.cli import richlight; richlight.install(); import typer.rich_utils as r; "
             "before = ['rich.markdown' in sys.modules, 'markdown_it' in sys.modules]; "
             "md = r.Markdown('# x'); import rich.markdown, rich.traceback; "
             "tb = r.Traceback.from_exception(ValueError, ValueError('x'), None); "
             "print(json.dumps(before + [isinstance(md, rich.markdown.Markdown), "
             "isinstance(tb, rich.traceback.Traceback), rich.markdown.Markdown is not r.Markdown]))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert json.loads(r.stdout) == [False, False, True, True, True], r.stderr


def test_the_bus_client_loads_without_aiohttp_which_stays_importable() -> None:
    """events/natslight.py: nats-py's websocket transport (the only user of aiohttp in it) is left
    out, 100+ ms of every command that talks to the bus; aiohttp itself still imports after
    (aiobotocore needs it), and the bus still talks to a real server (tests/test_bus.py)."""
    probe = ("import sys, json; import skypurza.events.bus; before = 'aiohttp' in sys.modules; "
             "import aiohttp, nats.aio.transport as t; "
             "print(json.dumps([before, t.aiohttp is None, bool(aiohttp.ClientSession)]))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert json.loads(r.stdout) == [False, True, True], r.stderr


def test_the_api_client_loads_without_trio_which_stays_importable() -> None:
    """cli/httplight.py: httpcore's trio probe and httpx's own command line are left out (about
    0.5 s of every command through an API server); trio still imports after, and the client
    still talks to a real server (tests/test_cli_transport.py)."""
    probe = ("import sys, json; import skypurza.cli.apitransport as a; "
             "before = ['trio' in sys.modules, 'httpx._main' in sys.modules]; "
             "c = a.httpx.Client(); import importlib.util, httpcore._synchronization as s; "
             # where trio is installed (it is not a dependency of ours) it must still import after
             "trio_ok = importlib.util.find_spec('trio') is None or bool(__import__('trio').run); "
             "print(json.dumps([*before, s.trio is None, trio_ok]))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert json.loads(r.stdout) == [False, False, True, True], r.stderr


# A new node's agent imports, before NodeReady, only what connecting and announcing need (issue
# 21: PlacementChosen -> NodeReady). Uploads (workdir archives, pathspec), node samples, the task
# spec, YAML, DuckDB, the cloud SDKs and the CLI's renderers come later, where a job needs them.
AGENT_HEAVY = ("aiohttp", "duckdb", "yaml", "boto3", "botocore", "aiobotocore", "httpx", "rich", "typer",
               "pathspec", "skypurza.events.taskspec", "skypurza.events.nodesample", "skypurza.events.uploads",
               "skypurza.events.workdir_archive", "skypurza.services.agent.sampling", "skypurza.services.agent.fetch",
               "skypurza.services.agent.syncignore")
AGENT_PROBE = """
import json, sys
import skypurza.services.agent.__main__ as entry
assert callable(entry.main)
print(json.dumps(sorted(sys.modules)))
"""


def test_a_new_agent_imports_only_what_it_needs_before_node_ready() -> None:
    r = subprocess.run([sys.executable, "-c", AGENT_PROBE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-800:]
    modules = json.loads(r.stdout.strip().splitlines()[-1])
    assert "skypurza.services.agent.agent" in modules and "skypurza.events.bus" in modules  # it really loaded
    heavy = sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in AGENT_HEAVY))
    assert heavy == [], f"the agent imports {heavy} before NodeReady"


# Event modules `spz exec` never decodes nor publishes: their models are not built in its process
# (events/modeltable.py), nor the contract machinery (cli/cliemits.py checks its publishes).
EXEC_NEVER = ("skypurza.events.models", "skypurza.events.dispatch_events", "skypurza.events.dispatch_policy",
              "skypurza.events.ledger_events", "skypurza.events.alert_events", "skypurza.events.health_events",
              "skypurza.events.task_events", "skypurza.events.contract", "skypurza.events.service",
              "skypurza.cli.contracts", "skypurza.cli.helpcache", "aiohttp")


def test_exec_builds_only_the_models_it_reads(nats_server, tmp_path) -> None:
    env = {**os.environ, "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_STAGE": "light",
           "SKYPURZA_NATS_URL": nats_server.url}
    r = subprocess.run([sys.executable, "-c", PROBE, "exec", "nosuch", "echo hi"], capture_output=True, text=True,
                       timeout=60, env=env, cwd=tmp_path)
    report = json.loads(r.stderr.strip().splitlines()[-1])
    assert report["code"] == 1 and "nosuch does not exist" in r.stderr, r.stderr[-1500:]
    modules = report["modules"]
    assert "skypurza.events.bus" in modules and "skypurza.events.cluster_events" in modules  # it read the bus
    heavy = sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in EXEC_NEVER))
    assert heavy == [], f"spz exec imported {heavy}"


def test_the_clis_publish_check_names_what_its_contract_declares() -> None:
    from skypurza.cli.cliemits import CLI_EMITS
    from skypurza.cli.contracts import CLI

    assert CLI_EMITS == frozenset(c.EVENT_NAME for c in CLI.emits)
