"""A cold `spz check-yaml` without typer (cli/fastpath.py, issue 21): the same bytes on stdout and
stderr and the same exit code as typer's parse of the same arguments, for a wide set of them;
the shortcut's options are the typer command's; and its lines printed without rich are rich's."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skypurza.cli import checkyaml, fastpath, plainout

CORPUS = Path(__file__).parent / "taskspec_corpus"
GOOD = "name: hi\nresources:\n  cpus: 1+\nrun: echo hi\n"

# Each run records, at exit, whether typer's app was built (cli/lazyapp.py): which path really ran.
_HOOK = ("import atexit, json, os, sys; "
         "atexit.register(lambda: open(os.environ['FASTPATH_PROBE'], 'w')"
         ".write(json.dumps('skypurza.cli.lazyapp' in sys.modules))); "
         "sys.argv = ['spz', *sys.argv[1:]]; ")
SCRIPT = _HOOK + "from skypurza.cli.script import main; main()"  # the `spz` script
MODULE = _HOOK + "import runpy; runpy.run_module('skypurza.cli.main', run_name='__main__')"  # python -m
TYPER = _HOOK + "from skypurza.cli.main import app; app()"  # typer's parse, always


def _run(launcher: str, args: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str, str, bool]:
    probe = cwd / "probe.json"
    r = subprocess.run([sys.executable, "-c", launcher, *args], capture_output=True, timeout=120, cwd=cwd,
                       env={**env, "FASTPATH_PROBE": str(probe)})
    typer_app = json.loads(probe.read_text())
    probe.unlink()
    return r.returncode, r.stdout.decode(), r.stderr.decode(), typer_app


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fastpath")
    (d / "good.yaml").write_text(GOOD)
    (d / "bad.yaml").write_text("name: x\nresources:\n  cpus: [1\nrun: 1\n")
    (d / "bad2.yaml").write_text("name: x\nresources:\n  cpuz: 2\n  accelerators: {V100: x}\nrun: 1\n")
    (d / "needs.yaml").write_text("envs:\n  FOO: null\nsecrets:\n  TOKEN: null\nrun: echo $FOO\n")
    (d / "pipeline.yaml").write_text("name: p\n---\nname: a\nrun: echo a\n---\nname: b\nrun: echo b\n")
    (d / "big.yaml").write_text("resources:\n  cpus: 4+\n  memory: 16+\n  accelerators: A100:1\nnum_nodes: 2\n"
                                "run: echo hi\n")
    (d / "anyof.yaml").write_text("name: a\nresources:\n  any_of:\n    - cpus: 2+\n    - cpus: 4+\nrun: echo hi\n")
    (d / "misspelt.yaml").write_text("resources:\n  accelerators: A10O:1\nrun: echo hi\n")
    (d / "zero.yaml").write_text("name: z\nresources:\n  cpus: 0\nrun: echo hi\n")
    (d / "sub").mkdir()
    (d / "sub" / "x.yaml").write_text(GOOD)
    for odd in ("a:smile:.yaml", "[bold]x.yaml", "café.yaml", "x:100:.yaml", "a\\b.yaml"):
        (d / odd).write_text(GOOD)
    return d


def _base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR", "SKYPURZA_DEBUG") and not k.endswith("_COMPLETE")}
    env.update(SKYPURZA_HOME=str(home), SKYPURZA_STAGE="fastpath", FOO="from-env", COLUMNS="80")
    env.pop("SKYPURZA_NATS_URL", None)
    return env


# (arguments after `spz`, extra environment, whether the shortcut takes it)
CASES = [
    (["check-yaml", "good.yaml"], {}, True),
    (["check-yaml", "good.yaml", "bad.yaml", "bad2.yaml", "missing.yaml", "sub"], {}, True),
    (["check-yaml", "-o", "json", "good.yaml", "bad2.yaml", "missing.yaml"], {}, True),
    (["check-yaml", "good.yaml", "--output", "json", "bad.yaml"], {}, True),
    (["check-yaml", "-o", "json", "-o", "table", "good.yaml"], {}, True),
    (["check-yaml", "./good.yaml", "sub//x.yaml", "sub/../good.yaml"], {}, True),
    (["check-yaml", "a:smile:.yaml", "[bold]x.yaml", "café.yaml", "x:100:.yaml", "a\\b.yaml"], {}, True),
    (["check-yaml", "needs.yaml"], {}, True),
    (["check-yaml", "big.yaml", "misspelt.yaml", "anyof.yaml", "zero.yaml"], {}, True),  # plain and the models'
    (["check-yaml", "-o", "json", "good.yaml", "misspelt.yaml", "zero.yaml"], {}, True),
    (["check-yaml", "needs.yaml", "--env", "FOO=1", "--secret", "TOKEN=abc"], {}, True),
    (["check-yaml", "-e", "FOO", "--secret", "TOKEN", "needs.yaml"], {"TOKEN": "t"}, True),
    (["check-yaml", "-e", "1BAD=x", "good.yaml"], {}, True),
    (["check-yaml", "-o", "json", "-e", "NOPE_UNSET", "good.yaml"], {}, True),
    (["check-yaml", "good.yaml"], {"SKYPURZA_STAGE": ""}, True),
    (["check-yaml", "good.yaml", "bad2.yaml"], {"FORCE_COLOR": "1"}, True),  # rich prints it, in colour
    (["check-yaml", "good.yaml", "bad2.yaml"], {"TTY_COMPATIBLE": "1", "NO_COLOR": "1"}, True),
    (["check-yaml", "good.yaml"], {"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"}, True),
    # typer's own parse: errors, help, and anything not of the plain shape
    (["check-yaml"], {}, False),
    (["check-yaml", "--help"], {}, False),
    (["check-yaml", "good.yaml", "-h"], {}, False),
    (["check-yaml", "-o", "yaml", "good.yaml"], {}, False),
    (["check-yaml", "good.yaml", "-o"], {}, False),
    (["check-yaml", "--bogus", "good.yaml"], {}, False),
    (["check-yaml", "--env=FOO=1", "needs.yaml"], {}, False),
    (["check-yaml", "-eFOO=1", "needs.yaml"], {}, False),
    (["check-yaml", "-e", "-x", "good.yaml"], {}, False),
    (["check-yaml", "--", "good.yaml"], {}, False),
    (["check-yaml", "-", "good.yaml"], {}, False),
    (["check-yaml", "", "good.yaml"], {}, False),
    (["check-yaml", "good.yaml", "--config", "c.yaml"], {}, False),
    (["check-yaml", "good.yaml"], {"SKYPURZA_STAGE": "Not A Stage!"}, False),
    (["check-yaml", "good.yaml"], {"_SPZ_COMPLETE": "bash_complete", "COMP_WORDS": "spz check", "COMP_CWORD": "1"},
     False),
    (["--stage", "x", "check-yaml", "good.yaml"], {}, False),
    (["check-yml", "good.yaml"], {}, False),
    # launch --dryrun: only -o and the entrypoint beside it
    (["launch", "--dryrun", "-o", "json", "good.yaml"], {}, True),
    (["launch", "--dryrun", "good.yaml"], {}, True),
    (["launch", "good.yaml", "--output", "json", "--dryrun"], {}, True),
    (["launch", "--dryrun", "-o", "json", "echo", "hi"], {}, True),
    (["launch", "--dryrun", "bad2.yaml"], {}, True),
    (["launch", "--dryrun", "-o", "json", "missing.yaml"], {}, True),
    (["launch", "--dryrun", "needs.yaml"], {}, True),
    (["launch", "--dryrun", "pipeline.yaml"], {}, True),
    (["launch", "--dryrun", "-o", "json", "big.yaml"], {}, True),
    (["launch", "--dryrun", "-o", "json", "anyof.yaml"], {}, True),  # not a plain task: the models load it
    (["launch", "--dryrun", "zero.yaml"], {}, True),  # plain keys, a value refused: the models' error
    (["launch", "--dryrun", "-o", "json", "good.yaml"], {"SKYPURZA_STAGE": "Not A Stage!"}, False),
    (["launch", "--dryrun"], {}, False),
    (["launch", "--dryrun", "-o", "yaml", "good.yaml"], {}, False),
    (["launch", "--dryrun", "--gpus", "A100:1", "good.yaml"], {}, False),
    (["launch", "--dryrun", "--env", "FOO=1", "needs.yaml"], {}, False),
    (["launch", "--dryrun", "-i", "5", "good.yaml"], {}, False),
    (["launch", "--dryrun", "-c", "x", "-o", "json", "good.yaml"], {}, False),
    (["launch", "--dryrun", "--dryrun", "-d", "good.yaml"], {}, False),
    (["launch", "--help"], {}, False),
]


@pytest.mark.parametrize("args,extra,fast", CASES, ids=[" ".join(c[0]) + (f" {c[1]}" if c[1] else "") for c in CASES])
def test_the_shortcut_prints_what_typer_prints(files: Path, tmp_path: Path, args, extra, fast) -> None:
    env = {**_base_env(tmp_path), **extra}
    ours = _run(SCRIPT, args, files, env)
    theirs = _run(TYPER, args, files, env)
    assert ours[:3] == theirs[:3], (args, ours, theirs)
    assert theirs[3] is True  # the typer run really parsed it with typer
    assert ours[3] is (not fast), f"{args} {'should' if fast else 'should not'} take the shortcut"
    assert "Traceback" not in ours[2]


def test_python_dash_m_takes_the_shortcut_too(files: Path, tmp_path: Path) -> None:
    env = _base_env(tmp_path)
    args = ["check-yaml", "good.yaml", "bad2.yaml"]
    ours, theirs = _run(MODULE, args, files, env), _run(TYPER, args, files, env)
    assert ours[:3] == theirs[:3] and ours[0] == 1 and "✓" in ours[1] and "cpuz" in ours[1]
    assert ours[3] is False


def test_the_whole_corpus_prints_the_same_both_ways(tmp_path: Path) -> None:
    every = [str(p) for p in sorted(CORPUS.glob("*/*.yaml"))]
    env = _base_env(tmp_path)
    for output in ("table", "json"):
        args = ["check-yaml", "-o", output, *every]
        ours, theirs = _run(SCRIPT, args, tmp_path, env), _run(TYPER, args, tmp_path, env)
        assert ours[:3] == theirs[:3] and ours[0] == 1 and ours[3] is False
        assert ours[1].count("\n") >= len(every)


def test_the_shape_is_the_typer_commands() -> None:
    """Every option of the typer command is in the shape with the same flags, list-ness and
    default, none reads the environment, and the positional is the command's one argument."""
    from skypurza.cli.main import catalog

    command = catalog.build("check-yaml")
    assert command is not None
    shape = fastpath.SHAPES["check-yaml"]
    flags: dict[str, str] = {}
    arguments = []
    for param in command.params:
        if param.param_type_name == "argument":
            arguments.append(param)
            continue
        assert param.envvar is None, param.name
        for flag in (*param.opts, *param.secondary_opts):
            flags[flag] = param.name
        assert (param.name in shape.multiple) is bool(param.multiple), param.name
        assert list(param.default or ()) == list(shape.defaults[param.name]) if param.multiple \
            else param.default == shape.defaults[param.name], param.name
        assert not param.is_flag and param.nargs == 1, param.name  # each option takes one value
    assert flags == dict(shape.options)
    assert [(a.name, a.nargs, a.required) for a in arguments] == [(shape.argument, -1, True)]
    assert shape.choices == {"output": checkyaml.FORMATS}


def test_the_launch_shape_is_the_typer_commands_and_the_rest_is_at_rest() -> None:
    """-o, --dryrun and the entrypoint are launch's; every other option of launch reads no
    environment variable and defaults to nothing given, and those defaults make the overrides
    the shortcut passes (cli/options.py overrides_of, of the flag sets' defaults)."""
    from skypurza.cli import options
    from skypurza.cli.main import catalog
    from skypurza.events.taskspec.overrides import CliOverrides

    command = catalog.build("launch")
    assert command is not None
    shape = fastpath.SHAPES["launch"]
    by_name = {p.name: p for p in command.params}
    output, dryrun, entrypoint = by_name["output"], by_name["dryrun"], by_name["entrypoint"]
    assert set(output.opts + output.secondary_opts) == set(shape.options) and output.default == "table"
    assert output.envvar is None and not output.multiple
    assert dryrun.is_flag and dryrun.opts == list(shape.flags) and dryrun.default is False and not dryrun.secondary_opts
    assert entrypoint.param_type_name == "argument" and entrypoint.nargs == -1 and shape.argument == "entrypoint"
    rest = {n: p for n, p in by_name.items() if n not in ("output", "dryrun", "entrypoint")}
    assert len(rest) > 30
    for name, param in rest.items():
        assert param.envvar is None, name
        assert param.default in (None, False, (), []), (name, param.default)
    # what typer passes the command for `launch --dryrun FILE`: its parse, defaults converted
    with command.make_context("launch", ["--dryrun", "f.yaml"]) as ctx:
        defaults = dict(ctx.params)
    assert defaults["dryrun"] is True and list(defaults["entrypoint"]) == ["f.yaml"] and defaults["output"] == "table"
    res = options.ResourceFlags(**{f: defaults[f] for f in options.ResourceFlags.__dataclass_fields__})
    task = options.TaskFlags(**{f: defaults[f] for f in options.TaskFlags.__dataclass_fields__})
    assert options.overrides_of(res, task, name=defaults["name"], priority=defaults["priority"]) == CliOverrides()
    assert options.workspace_of(defaults["workspace"]) is None


@pytest.mark.parametrize("args", [[], ["-o"], ["--help", "f"], ["-h", "f"], ["--", "f"], ["-", "f"], ["", "f"],
                                  ["-ejson", "f"], ["--env=A", "f"], ["-e", "--x", "f"], ["-e", "", "f"],
                                  ["-o", "yaml", "f"], ["-o", "json"], ["--config", "c", "f"]])
def test_parse_leaves_the_unusual_to_typer(args) -> None:
    assert fastpath.parse(fastpath.SHAPES["check-yaml"], args) is None


def test_parse_reads_options_anywhere_and_the_last_single_value() -> None:
    got = fastpath.parse(fastpath.SHAPES["check-yaml"], ["a", "-e", "X=1", "b", "--env", "Y", "-o", "json",
                                                        "--secret", "S", "--output", "table", "c"])
    assert got == {"files": ["a", "b", "c"], "env": ["X=1", "Y"], "secret": ["S"], "output": "table"}


def test_the_environment_typer_acts_on_first_is_left_to_typer() -> None:
    assert fastpath.eligible({"SKYPURZA_STAGE": "dev"}) and fastpath.eligible({})
    assert not fastpath.eligible({"SKYPURZA_STAGE": "No Stage"})
    assert not fastpath.eligible({"_SPZ_COMPLETE": "zsh_complete"})


# ------------------------------------------------------------------ lines without rich are rich's

PIECES = ["t.yaml", "dir/a b.yaml", "x:smile:y", "x:100:", "3:5:", "a:b", ":+1:", ":thumbs_up:", "::", "a::b",
          ":smile-emoji:", "[red]x", "a]b", "a\\b", "trailing\\", "é", "漢字", "tab\there", "cr\rx", "bell\x07",
          "esc\x1b[31mred", "  spaced  ", "x" * 300, "", "found 'x'", "expected a mapping, found null",
          "unknown key 'cpuz'. Did you mean 'cpus'?", "<task>", "resources.accelerators.V100"]


def _both(monkeypatch, write) -> tuple[str, str]:
    """What `write(lines)` prints with the plain path allowed, and with rich printing every line."""
    for k in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(k, raising=False)
    outs = []
    for plain in (True, False):
        monkeypatch.setattr(plainout, "rich_is_plain", lambda stream, environ=None, p=plain: p)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            write(plainout.Lines())
        outs.append(buf.getvalue())
    return outs[0], outs[1]


def test_plain_lines_are_the_bytes_rich_prints(monkeypatch) -> None:
    def write(lines: plainout.Lines) -> None:
        for raw in PIECES:
            piece = plainout.escape(raw)
            lines.print(f"[bold green]✓[/bold green] {piece}: valid (1 task)", piece)
            lines.print(f"  {piece}: [cyan]{piece}[/cyan]: [red]error:[/red] {piece}", piece, piece, piece)
            lines.print(f"[red]error[/red] {piece}: {piece}", piece, piece)

    plain, rich = _both(monkeypatch, write)
    assert plain == rich
    assert "✓ t.yaml: valid (1 task)\n" in plain


def test_check_yaml_over_the_corpus_prints_rich_bytes(monkeypatch, tmp_path: Path) -> None:
    every = [Path(p) for p in sorted(CORPUS.glob("*/*.yaml"))] + [tmp_path / "missing: a:b:.yaml"]
    codes = []

    def write(_lines: plainout.Lines) -> None:
        codes.append(checkyaml.check_yaml(every, ["1BAD=1"], [], "table"))
        codes.append(checkyaml.check_yaml(every, [], [], "table"))

    plain, rich = _both(monkeypatch, write)
    assert plain == rich and codes == [1, 1, 1, 1]
    assert "error" in plain and "warning" in plain and "✗" in plain and "✓" in plain


def test_a_plain_line_is_written_only_where_rich_writes_no_styles(monkeypatch) -> None:
    for k in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(k, raising=False)
    assert plainout.rich_is_plain(io.StringIO(), {})
    assert not plainout.rich_is_plain(io.StringIO(), {"FORCE_COLOR": ""})
    assert not plainout.rich_is_plain(io.StringIO(), {"TTY_COMPATIBLE": "1"})
    assert plainout.rich_is_plain(io.StringIO(), {"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"})
    buf, lines = io.StringIO(), plainout.Lines()
    with contextlib.redirect_stdout(buf):
        lines.print("[bold red]✗[/bold red] t.yaml: 1 problem", "t.yaml")
    assert lines._console is None and buf.getvalue() == "✗ t.yaml: 1 problem\n"  # rich stayed out of it
    master, slave = os.openpty()
    try:
        with os.fdopen(os.dup(slave), "w") as tty:
            assert not plainout.rich_is_plain(tty, {})
    finally:
        os.close(master)
        os.close(slave)


# ---------------------------------------------------------------- pydantic plug-ins stay honoured

PLUGIN = '''
import os
class Plugin:
    def new_schema_validator(self, schema, schema_type, schema_type_path, schema_kind, config, plugin_settings):
        with open(os.environ["PLUGIN_SAW"], "a") as f:
            f.write(schema_type_path.name + "\\n")
        return None, None, None
plugin = Plugin()
'''


def _plugin_site(root: Path) -> Path:
    site = root / "site"
    dist = site / "spzprobe-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: spzprobe\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[console_scripts]\nx = y:z\n\n[pydantic]\nprobe = spzprobe:plugin\n")
    (site / "spzprobe.py").write_text(PLUGIN)
    return site


def test_the_plugin_scan_agrees_with_importlib_metadata(tmp_path: Path) -> None:
    from importlib.metadata import entry_points

    from skypurza.cli import pydplugins

    assert pydplugins.declared(sys.path) in (None, bool(list(entry_points(group="pydantic"))))
    bare = tmp_path / "bare" / "x-1.dist-info"
    bare.mkdir(parents=True)
    (bare / "entry_points.txt").write_text("[console_scripts]\npydantic = a:b\n")
    assert pydplugins.declared([str(tmp_path / "bare"), str(tmp_path / "missing")]) is False
    assert pydplugins.declared([str(_plugin_site(tmp_path))]) is True
    (tmp_path / "lib.zip").write_bytes(b"PK\x05\x06" + b"\0" * 18)
    assert pydplugins.declared([str(tmp_path / "bare"), str(tmp_path / "lib.zip")]) is None  # a zip: cannot tell


def test_the_stand_in_hands_every_other_name_to_the_real_loader() -> None:
    probe = ("import sys, json; from skypurza.cli import pydplugins; ok = pydplugins.install(); "
             "import pydantic.plugin._loader as l; stand_in = type(l).__name__; none = list(l.get_plugins()); "
             "group = l.PYDANTIC_ENTRY_POINT_GROUP; import pydantic.plugin._loader as real; "
             "print(json.dumps([ok, stand_in, none, group, type(real).__name__, 'importlib.metadata' in sys.modules]))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert json.loads(r.stdout) == [True, "_StandIn", [], "pydantic", "module", True], r.stderr


def test_an_installed_pydantic_plugin_still_sees_check_yamls_models(files: Path, tmp_path: Path) -> None:
    """The shortcut skips pydantic's plug-in lookup, and reads a plain task without the models,
    only where no plug-in is installed: one that is installed is loaded and sees the task model's
    validator, as on typer's path."""
    site = _plugin_site(tmp_path)
    env = {**_base_env(tmp_path), "PYTHONPATH": str(site)}
    seen = []
    for args in (["check-yaml", "good.yaml"], ["launch", "--dryrun", "-o", "json", "good.yaml"]):
        for launcher in (SCRIPT, TYPER):
            saw = tmp_path / "saw.txt"
            code, out, err, typer_app = _run(launcher, args, files, {**env, "PLUGIN_SAW": str(saw)})
            assert code == 0 and ("valid" in out or '"chosen"' in out), err
            # a plain task too: where a plug-in is installed, the models read every task
            seen.append((typer_app, "Task" in saw.read_text().split()))
            saw.unlink()
    assert seen == [(False, True), (True, True)] * 2
