"""`spz check-yaml` and `spz schema task`, on a throwaway Typer app with `register` applied
(the lead wires `register` into cli/main.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from skypurza.cli.cmd_taskspec import register

CORPUS = Path(__file__).parent / "taskspec_corpus"


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """spz"""

    register(app)
    return app


def run(app: typer.Typer, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_all_valid_files_exit_zero(app: typer.Typer) -> None:
    files = [str(p) for p in sorted((CORPUS / "valid").glob("*.yaml"))]
    code, out = run(app, "check-yaml", *files)
    assert code == 0, out
    assert out.count("✓") == len(files)
    # deprecation notes are shown but do not fail the check
    assert "resources.cloud" in out and "warning" in out


def test_any_invalid_file_exits_one_with_positions(app: typer.Typer) -> None:
    bad = CORPUS / "invalid" / "i38_unknown_resource_key.yaml"
    code, out = run(app, "check-yaml", str(CORPUS / "valid" / "01_minimal.yaml"), str(bad))
    assert code == 1
    assert f"{bad}:2:3:" in out and "resources.accelerator" in out and "Did you mean 'accelerators'?" in out
    assert f"{bad}:3:3:" in out and "Did you mean 'instance_type'?" in out
    # rich markup in messages is printed literally, not interpreted
    quoted = CORPUS / "invalid" / "i06_quoted_accelerator_set.yaml"
    assert "[A100:8, H100:8]" in run(app, "check-yaml", str(quoted))[1]


def test_json_output_is_one_object_per_file(app: typer.Typer) -> None:
    good = CORPUS / "valid" / "14_legacy_cloud_region_zone.yaml"
    bad = CORPUS / "invalid" / "i35_many_problems.yaml"
    code, out = run(app, "check-yaml", "-o", "json", str(good), str(bad))
    assert code == 1
    first, second = (json.loads(line) for line in out.splitlines())
    assert first["file"] == str(good) and first["valid"] is True and first["errors"] == []
    assert first["warnings"][0]["path"] == "resources.cloud"
    expected = json.loads(bad.with_suffix(".expected.json").read_text())["errors"]
    assert second == {"file": str(bad), "valid": False, "errors": expected, "warnings": []}


def test_env_flag_supplies_required_values(app: typer.Typer) -> None:
    path = str(CORPUS / "invalid" / "i04_null_env.yaml")
    assert run(app, "check-yaml", path)[0] == 1
    assert run(app, "check-yaml", path, "--env", "HF_TOKEN=abc")[0] == 0
    assert run(app, "check-yaml", path, "--secret", "X=1", "-e", "HF_TOKEN=")[0] == 0


def test_missing_file_and_bad_flags(app: typer.Typer, tmp_path: Path) -> None:
    code, out = run(app, "check-yaml", str(tmp_path / "nope.yaml"))
    assert code == 1 and "file not found" in out
    code, out = run(app, "check-yaml", str(CORPUS / "valid" / "01_minimal.yaml"), "-o", "xml")
    assert code != 0 and "xml" in out


def test_schema_task_to_stdout_and_file(app: typer.Typer, tmp_path: Path) -> None:
    code, out = run(app, "schema", "task")
    assert code == 0
    schema = json.loads(out)
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert {"name", "resources", "run", "envs", "file_mounts", "service"} <= set(schema["properties"])
    target = tmp_path / "task.schema.json"
    assert run(app, "schema", "task", "-o", str(target))[0] == 0
    assert json.loads(target.read_text()) == schema


def test_cli_module_imports_lazily() -> None:
    """Importing the command module must not build the task models (CLI cold start)."""
    code = ("import sys, skypurza.cli.cmd_taskspec as m; "
            "bad = [n for n in sys.modules if n.startswith('skypurza.events.taskspec.') or n == 'rich'];"
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
