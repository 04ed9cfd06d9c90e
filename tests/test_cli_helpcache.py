"""A cold top-level `spz --help` without typer (cli/helpcache.py, issue 21): the first run renders
it with typer and records it; later runs print the recorded text, byte for byte what typer
prints, and render again whenever anything the text depends on changes (width, colour, version)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from skypurza.cli.helpcache import help_key

SPZ = str(Path(sys.executable).parent / "spz")  # the installed script, as a user runs it
# typer's own rendering, with no cache anywhere near it (cli.main's app called directly).
TYPER = """
import sys
from skypurza.cli import main
sys.argv[0] = "spz"
main.app()
"""


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "NO_COLOR", "SKYPURZA_DEBUG")}
    env.update(SKYPURZA_HOME=str(home), **extra)
    return env


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)


def _imported(stderr: str) -> set[str]:
    """Module names from `python -X importtime` lines."""
    return {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def _cached(home: Path) -> list[Path]:
    return sorted((home / "cache").glob("help-*.json"))


@pytest.mark.parametrize("args", [["--help"], [], ["-h"]], ids=["--help", "no-args", "-h"])
def test_the_cached_help_is_what_typer_prints_and_needs_no_typer(tmp_path, args: list[str]) -> None:
    env = _env(tmp_path, COLUMNS="100")
    typer_ = _run([sys.executable, "-c", TYPER, *args], env)
    assert "check-yaml" in typer_.stdout and typer_.returncode in (0, 2)
    first = _run([SPZ, *args], env)  # renders with typer, records
    assert len(_cached(tmp_path)) == 1
    second = _run([sys.executable, "-X", "importtime", SPZ, *args], env)
    for r in (first, second):
        assert (r.returncode, r.stdout) == (typer_.returncode, typer_.stdout)
    assert first.stderr == typer_.stderr
    imported = _imported(second.stderr)
    assert "skypurza.cli.helpcache" in imported  # the probe really ran our script
    assert not {m for m in imported if m.split(".")[0] in ("typer", "click", "rich", "pydantic", "nats")}, \
        sorted(imported)
    assert "\n".join(l for l in second.stderr.splitlines() if not l.startswith("import time:")) == typer_.stderr


def test_a_width_or_colour_change_renders_again(tmp_path) -> None:
    outs = {}
    for name, extra in (("100", {"COLUMNS": "100"}), ("60", {"COLUMNS": "60"}),
                        ("colour", {"COLUMNS": "100", "FORCE_COLOR": "1"})):
        env = _env(tmp_path, **extra)
        _run([SPZ, "--help"], env)
        cached = _run([SPZ, "--help"], env)
        assert cached.stdout == _run([sys.executable, "-c", TYPER, "--help"], env).stdout, name
        outs[name] = cached.stdout
    assert len(_cached(tmp_path)) == 3 and len(set(outs.values())) == 3
    assert max(len(line) for line in outs["60"].splitlines()) == 60
    assert "\x1b[" in outs["colour"] and "\x1b[" not in outs["100"]


def test_a_bad_cache_file_is_rendered_again_and_replaced(tmp_path) -> None:
    env = _env(tmp_path, COLUMNS="90")
    good = _run([SPZ, "--help"], env).stdout
    (path,) = _cached(tmp_path)
    for junk in (b"\xff\xfenot json", b'{"out": 3, "err": "", "code": 0}', b"[]"):
        path.write_bytes(junk)
        r = _run([SPZ, "--help"], env)
        assert (r.returncode, r.stdout, r.stderr) == (0, good, "")
        assert _run([SPZ, "--help"], env).stdout == good  # the file was written again
        assert path.read_bytes() != junk


def test_the_key_moves_with_version_width_colour_and_plugins_but_not_with_the_rest() -> None:
    base = {"COLUMNS": "100", "HOME": "/h", "PATH": "/bin"}
    key = help_key("0.1.0", base, ["facts"])
    assert help_key("0.1.0", {**base, "PATH": "/usr/bin", "OLDPWD": "/x"}, ["facts"]) == key
    for changed in (help_key("0.1.1", base, ["facts"]), help_key("0.1.0", {**base, "COLUMNS": "120"}, ["facts"]),
                    help_key("0.1.0", {**base, "NO_COLOR": "1"}, ["facts"]),
                    help_key("0.1.0", {**base, "TERM": "dumb"}, ["facts"]),
                    help_key("0.1.0", {**base, "SKYPURZA_NO_PLUGINS": "1"}, ["facts"]),
                    help_key("0.1.0", base, ["other facts"])):
        assert changed != key


def test_other_commands_never_touch_the_cache(tmp_path) -> None:
    env = _env(tmp_path, COLUMNS="100")
    r = _run([SPZ, "--version"], env)
    assert r.returncode == 0 and r.stdout.startswith("spz ")
    assert _cached(tmp_path) == []


def test_a_changed_module_file_renders_again(tmp_path) -> None:
    """The cached text lists the files that rendered it: one whose mtime or size moved (an edited
    help, an upgraded typer) is rendered by typer again, not served stale."""
    import json

    env = _env(tmp_path, COLUMNS="100")
    good = _run([SPZ, "--help"], env).stdout
    (path,) = _cached(tmp_path)
    doc = json.loads(path.read_text())
    ours = [f for f in doc["files"] if f[0].endswith("commandtable.py")]
    assert ours, "the table of commands is among the files that rendered the help"
    ours[0][1] -= 1  # as if cli/commandtable.py had been edited since
    doc["out"] = "stale\n"
    path.write_text(json.dumps(doc))
    r = _run([SPZ, "--help"], env)
    assert r.stdout == good
    assert json.loads(path.read_text())["out"] == good  # recorded again, with the real mtimes


def test_the_scripts_help_args_are_the_caches() -> None:
    from skypurza.cli import script
    from skypurza.cli.helpcache import HELP_ARGS

    assert script.HELP_ARGS == HELP_ARGS


def test_python_dash_m_serves_the_cache_too(tmp_path) -> None:
    """`python -m skypurza.cli.main` (how bench/latency.py runs spz) takes the same light path
    for each help form, under its own program name."""
    env = _env(tmp_path, COLUMNS="100")
    for args in ([], ["--help"], ["-h"]):
        want = _run([sys.executable, "-m", "skypurza.cli.main", *args], env)
        assert "Usage: python -m skypurza.cli.main" in want.stdout
        again = _run([sys.executable, "-X", "importtime", "-m", "skypurza.cli.main", *args], env)
        assert (again.returncode, again.stdout) == (want.returncode, want.stdout)
        assert "typer" not in _imported(again.stderr), args
    assert len(_cached(tmp_path)) == 3  # one per form: `spz` alone exits 2, `--help` 0
    assert [_run([sys.executable, "-m", "skypurza.cli.main", *a], env).returncode for a in ([], ["-h"])] == [2, 0]


def _into_a_closed_pipe(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before a byte is written: `spz --help | true`
    try:
        return subprocess.run([SPZ, "--help"], stdout=write, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    finally:
        os.close(write)


def test_a_broken_pipe_is_exit_1_without_a_traceback_and_is_not_recorded(tmp_path) -> None:
    env = _env(tmp_path, COLUMNS="100")
    r = _into_a_closed_pipe(env)
    assert (r.returncode, r.stderr) == (1, "")  # what typer does
    assert _cached(tmp_path) == []  # the cut-short text was not kept
    good = _run([SPZ, "--help"], env)
    assert good.returncode == 0 and len(_cached(tmp_path)) == 1
    r = _into_a_closed_pipe(env)  # served from the cache now
    assert (r.returncode, r.stderr) == (1, "")
    assert _run([SPZ, "--help"], env).stdout == good.stdout
