"""`spz` imports only the command that runs (cli/lazyapp.py, issue 21), and nothing a user sees
changes for it: the table `spz --help` lists from (cli/commandtable.py) is checked against the
real commands, the lazy `spz --help` against the one built from every module, byte for byte,
and a real `spz` process of each kind against the modules it may import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from skypurza.cli.commandtable import COMMANDS

# Every command built from its module, as the old eager CLI built them: the table's facts.
REAL = """
import inspect, json, sys, typer, typer.main
from skypurza.cli import main
main.load_all()
root = typer.main.get_command(main.app)
out = []
for name in root.list_commands(None):
    c = root.get_command(None, name)
    info = next((i for i in main.app.registered_groups if i.name == name), None)
    module = (info.typer_instance.registered_commands or [None])[0] if info else None
    callback = module.callback if module else c.callback
    out.append({"name": name, "group": info is not None, "hidden": c.hidden, "deprecated": c.deprecated,
                "panel": getattr(c, "rich_help_panel", None) or None,
                "help": inspect.cleandoc(c.short_help or c.help or "").split("\\n\\n")[0],
                "module": callback.__module__.rsplit(".", 1)[-1]})
print(json.dumps(out))
"""

# `spz ARGS` as the `spz` script runs it, and with every command module and plugin loaded first:
# what the eager CLI printed.
LAZY = """
import sys
from skypurza.cli import main
sys.argv[0] = "spz"
main.app()
"""
EAGER = LAZY.replace("sys.argv[0]", "main.load_all()\nsys.argv[0]")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SKYPURZA_NO_PLUGINS", "SKYPURZA_DEBUG", "COLUMNS")}
    env.update(extra)
    return env


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def test_the_table_is_what_every_command_module_registers() -> None:
    r = _run([sys.executable, "-c", REAL], _env(SKYPURZA_NO_PLUGINS="1"))
    assert r.returncode == 0, r.stderr[-2000:]
    real = [c for c in json.loads(r.stdout) if c["module"] != "plugins"]  # "not installed" stand-ins
    assert [c["name"] for c in real] == [e.name for e in COMMANDS], "cli/commandtable.py: names or order"
    for entry, command in zip(COMMANDS, real):
        assert (entry.group, entry.hidden, entry.help) == (command["group"], command["hidden"], command["help"]), \
            f"cli/commandtable.py: {entry.name} differs from the command"
        assert not command["deprecated"] and command["panel"] is None, f"{entry.name}: the table has no such field"
        # a group: the module of its first command
        assert command["module"] == entry.module, (entry.name, command["module"])


def test_each_module_registers_exactly_the_commands_the_table_gives_it() -> None:
    probe = ("import importlib, json, typer\n"
             "out = {}\n"
             f"for module in {sorted({e.module for e in COMMANDS})!r}:\n"
             "    app = typer.Typer()\n"
             "    importlib.import_module('skypurza.cli.' + module).register(app)\n"
             "    out[module] = sorted([c.name for c in app.registered_commands] + [g.name for g in app.registered_groups])\n"
             "print(json.dumps(out))\n")
    r = _run([sys.executable, "-c", probe], _env())
    assert r.returncode == 0, r.stderr[-2000:]
    by_module: dict[str, list[str]] = {}
    for e in COMMANDS:
        by_module.setdefault(e.module, []).append(e.name)
    assert json.loads(r.stdout) == {m: sorted(names) for m, names in by_module.items()}


@pytest.mark.parametrize("args", [["--help"], [], ["events", "--help"], ["statu"], ["launch", "--nope"]])
@pytest.mark.parametrize("env", [{"COLUMNS": "80"}, {"COLUMNS": "213", "FORCE_COLOR": "1"},
                                 {"COLUMNS": "100", "SKYPURZA_NO_PLUGINS": "1"}], ids=["80", "colour", "noplugins"])
def test_the_lazy_cli_prints_what_the_eager_one_did(args: list[str], env: dict[str, str]) -> None:
    lazy = _run([sys.executable, "-c", LAZY, *args], _env(**env))
    eager = _run([sys.executable, "-c", EAGER, *args], _env(**env))
    assert (lazy.returncode, lazy.stdout, lazy.stderr) == (eager.returncode, eager.stdout, eager.stderr)
    if args in (["--help"], []):
        assert "check-yaml" in lazy.stdout and "teams" in lazy.stdout  # the listing really is there
        assert ("cost-report" in lazy.stdout) == ("SKYPURZA_NO_PLUGINS" not in env)


# What a command's process may import of the CLI's command modules and the platform plugins.
LISTED = """
import json, runpy, sys
sys.argv = ["spz", *sys.argv[1:]]
try:
    runpy.run_module("skypurza.cli.main", run_name="__main__")
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("skypurza.cli.cmd_", "skypurza.services.", "importlib.metadata")))), file=sys.stderr)
"""
PLUGIN_MODULES = ("skypurza.services.ledger", "skypurza.services.dispatch", "skypurza.services.observability")


@pytest.mark.parametrize("args, allowed", [
    # plain check-yaml and launch --dryrun run without typer, so without their command modules (cli/fastpath.py)
    (["check-yaml", "{task}"], set()),
    (["launch", "--dryrun", "-o", "json", "{task}"], set()),
    (["check-yaml", "-o=json", "{task}"], {"skypurza.cli.cmd_taskspec"}),  # not the plain shape: typer's parse
    (["launch", "--dryrun", "--gpus", "A100:1", "-o", "json", "{task}"], {"skypurza.cli.cmd_launch"}),
    (["exec", "--help"], {"skypurza.cli.cmd_launch"}),
    (["status", "--help"], {"skypurza.cli.cmd_inspect"}),
    (["down", "--help"], {"skypurza.cli.cmd_lifecycle"}),
    (["jobs", "queue", "--help"], {"skypurza.cli.cmd_jobs"}),
    (["api", "--help"], {"skypurza.cli.cmd_api", "skypurza.cli.cmd_apilogin"}),
])
def test_a_command_imports_its_own_module_and_no_plugin(tmp_path, args: list[str], allowed: set[str]) -> None:
    task = tmp_path / "hi.yaml"
    task.write_text("name: hi\nresources:\n  cpus: 1+\nrun: echo hi\n")
    argv = [a.format(task=task) for a in args]
    r = subprocess.run([sys.executable, "-c", LISTED, *argv], capture_output=True, text=True, timeout=120,
                       env=_env(SKYPURZA_HOME=str(tmp_path / "home"), SKYPURZA_STAGE="lazy"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-1500:]
    modules = set(json.loads(r.stderr.strip().splitlines()[-1]))
    commands = {m for m in modules if m.startswith("skypurza.cli.cmd_")}
    assert commands == allowed, f"spz {' '.join(args)} imported the command modules {sorted(commands)}"
    plugins = sorted(m for m in modules if m.startswith(PLUGIN_MODULES))
    assert plugins == [], f"spz {' '.join(args)} loaded the platform plugins: {plugins}"


def test_help_loads_the_plugins_it_lists_but_no_open_command_module_but_those_they_extend(tmp_path) -> None:
    # A fresh home: no cached help (cli/helpcache.py), so typer renders it.
    r = subprocess.run([sys.executable, "-c", LISTED, "--help"], capture_output=True, text=True, timeout=120,
                       env=_env(SKYPURZA_HOME=str(tmp_path)))
    modules = set(json.loads(r.stderr.strip().splitlines()[-1]))
    assert "cost-report" in r.stdout and "skypurza.services.ledger.cli" in modules
    # cmd_events and cmd_audit: the ledger plugin adds `events export` and its part of `audit`
    assert {m for m in modules if m.startswith("skypurza.cli.cmd_")} == {"skypurza.cli.cmd_events",
                                                                         "skypurza.cli.cmd_audit"}


def test_without_plugins_help_scans_no_entry_points(tmp_path) -> None:
    """SKYPURZA_NO_PLUGINS: nothing looks the plugins up (importlib.metadata's scan of every
    installed distribution is ~20-40 ms), and the listing has no platform command."""
    r = subprocess.run([sys.executable, "-c", LISTED, "--help"], capture_output=True, text=True, timeout=120,
                       env=_env(SKYPURZA_NO_PLUGINS="1", SKYPURZA_HOME=str(tmp_path)))
    modules = set(json.loads(r.stderr.strip().splitlines()[-1]))
    assert "launch" in r.stdout and "cost-report" not in r.stdout
    assert not {m for m in modules if m.startswith(("importlib.metadata",) + PLUGIN_MODULES)}, sorted(modules)
