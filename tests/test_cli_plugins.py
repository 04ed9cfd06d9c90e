"""Platform commands join `spz` through the `skypurza.cli_plugins` entry point (cli/plugins.py):
the open CLI runs without them, says a missing one is not installed, does not hide a plugin
that fails to load, and never skips an open command module that fails to import.

Each case runs `spz` in its own Python process (`python -m skypurza.cli.main`), as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Runs the CLI with the platform package made unimportable, as where it is not installed.
WITHOUT_LEDGER = textwrap.dedent("""
    import sys
    from importlib.abc import MetaPathFinder

    class NotInstalled(MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "skypurza.services.ledger" or name.startswith("skypurza.services.ledger."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    sys.argv[0] = "spz"
    from skypurza.cli.main import app
    try:
        app()
    finally:
        assert not [m for m in sys.modules if m.startswith("skypurza.services.ledger")]
""")


def spz(*args: str, env: dict[str, str] | None = None, script: str | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k not in ("SKYPURZA_NO_PLUGINS", "SKYPURZA_DEBUG")}
    full_env.update(env or {})
    argv = [sys.executable, "-c", script, *args] if script else [sys.executable, "-m", "skypurza.cli.main", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=full_env, timeout=120)


NO_PLUGINS = {"SKYPURZA_NO_PLUGINS": "1"}


def test_the_open_cli_runs_without_the_platform_package():
    res = spz("--help", env=NO_PLUGINS, script=WITHOUT_LEDGER)
    assert res.returncode == 0, res.stderr
    assert "launch" in res.stdout and "events" in res.stdout
    assert "cost-report" not in res.stdout and "ledger" not in res.stdout.split()
    events = spz("events", "--help", env=NO_PLUGINS, script=WITHOUT_LEDGER)
    assert events.returncode == 0, events.stderr
    assert "Follow the log live" in events.stdout and "Export the event log" not in events.stdout


@pytest.mark.parametrize("args, command", [
    (["cost-report", "--by", "team"], "cost-report"),
    (["cost-report", "--help"], "cost-report"),
    (["ledger", "billing", "--tres", "cpu=1"], "ledger"),
    (["events", "export", "out.jsonl"], "events export"),
    (["events", "replay", "--into", "out.duckdb"], "events replay --into"),
])
def test_a_platform_command_says_it_is_not_installed(tmp_path, args, command):
    res = subprocess.run([sys.executable, "-c", WITHOUT_LEDGER, *args], capture_output=True, text=True,
                         env={**os.environ, **NO_PLUGINS}, cwd=tmp_path, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"`spz {command}` is part of SkyPurza's accounting platform, which is not installed" in res.stderr
    assert "Traceback" not in res.stderr
    assert list(tmp_path.iterdir()) == []  # nothing was written


def test_with_the_plugin_the_platform_commands_are_there():
    top = spz("--help")
    assert top.returncode == 0, top.stderr
    assert "cost-report" in top.stdout and "audit" in top.stdout and "ledger" in top.stdout
    assert "Export the event log" in spz("events", "--help").stdout
    res = spz("ledger", "billing", "--tres", "cpu=4,gres/gpu=2", "--weights", "CPU=1.0,GRES/gpu=2.0", "-o", "json")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == '{"billing": 8.0, "billing_int": 8}'


def _broken_plugin(tmp_path: Path) -> dict[str, str]:
    """A second distribution on the path whose plugin cannot be imported."""
    dist = tmp_path / "site" / "broken_spz_plugin-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-spz-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[skypurza.cli_plugins]\nbroken = no_such_module_for_spz:register\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}


def test_a_plugin_that_fails_to_load_is_named_not_hidden(tmp_path):
    env = _broken_plugin(tmp_path)
    res = spz("ledger", "billing", "--tres", "cpu=2", "-o", "json", env=env)
    assert res.returncode == 0, res.stderr  # the other plugins and the open CLI go on
    assert res.stdout.strip() == '{"billing": 2.0, "billing_int": 2}'
    assert "warning: the spz plugin 'broken' (no_such_module_for_spz:register) failed to load: " \
           "ModuleNotFoundError: No module named 'no_such_module_for_spz'" in res.stderr
    debug = spz("--help", env={**env, "SKYPURZA_DEBUG": "1"})
    assert debug.returncode != 0
    assert "Traceback" in debug.stderr and "ModuleNotFoundError" in debug.stderr


def test_an_open_command_module_that_fails_to_import_is_an_error():
    """cli/main.py used to skip a command module that raised ModuleNotFoundError for itself. Now
    a module is imported when its command runs (cli/lazyapp.py): that command fails, naming the
    module, never "No such command"; SKYPURZA_DEBUG=1 shows where."""
    script = textwrap.dedent("""
        import sys
        from importlib.abc import MetaPathFinder

        class Gone(MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "skypurza.cli.cmd_jobs":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, Gone())
        sys.argv[0] = "spz"
        from skypurza.cli.main import app
        app()
    """)
    res = spz("jobs", "queue", script=script)
    assert res.returncode == 1
    assert "No module named 'skypurza.cli.cmd_jobs'" in res.stderr and "No such command" not in res.stderr
    assert "Traceback" not in res.stderr
    debug = spz("jobs", "queue", script=script, env={"SKYPURZA_DEBUG": "1"})
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr and "cmd_jobs" in debug.stderr.splitlines()[-1]
    assert debug.stderr.splitlines()[-1].startswith("ModuleNotFoundError")
