"""The flags SkyPilot users type (issue 12 §7): which of `sky` 0.14.1's flags each `spz` command
accepts, read from the real click commands (every option name, hidden ones included), against
the list in tests/fixtures/sky-cli-flags.txt (a copy of `sky <cmd> --help`'s options).

`--config` is left out of the count: sky gives it to every command (a client config file), spz
reads its settings from ~/.skypurza/config.yaml; docs/cli.md says so.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main
from typer.core import TyperGroup, TyperOption

from skypurza.cli.main import app

FIXTURE = Path(__file__).parent / "fixtures" / "sky-cli-flags.txt"
CORE = ("launch", "exec", "status", "queue", "logs", "cancel", "stop", "start", "autostop", "down", "cost-report",
        "check", "gpus list", "jobs launch", "jobs queue", "jobs cancel", "jobs logs", "api start", "api stop",
        "api status", "api logs")
NOT_COUNTED = {"--config"}


def sky_flags() -> dict[str, list[str]]:
    """command -> its flags as the fixture writes them (`--detach-run/-d/-no-d` is one flag)."""
    lines = FIXTURE.read_text().splitlines()
    out: dict[str, list[str]] = {}
    for i, line in enumerate(lines):
        if not line.startswith("sky "):
            continue
        words = line[4:].split()
        command = " ".join(w for w in words if re.fullmatch(r"[a-z][a-z-]*", w))
        flags = [f.strip() for f in (lines[i + 1] if i + 1 < len(lines) else "").split(",") if f.strip()]
        out[command] = [f for f in flags if f not in NOT_COUNTED]
    return out


def spz_command(path: str) -> object:
    """The command typer builds for `spz <path>` (typer's own click), as the shell reaches it."""
    cmd: object = typer.main.get_command(app)
    for word in path.split():
        assert isinstance(cmd, TyperGroup), f"spz {path}: {word} is not under a group"
        found = cmd.get_command(None, word)  # type: ignore[arg-type]
        assert found is not None, f"spz has no command {path!r}"
        cmd = found
    return cmd


def accepted_names(cmd: object) -> set[str]:
    names: set[str] = set()
    for p in getattr(cmd, "params"):
        if isinstance(p, TyperOption):
            names.update(p.opts)
            names.update(p.secondary_opts)
    return names


def missing_flags() -> dict[str, list[str]]:
    """command -> the sky flags spz does not accept (a flag counts when all its names are accepted)."""
    sky = sky_flags()
    out: dict[str, list[str]] = {}
    for command in CORE:
        names = accepted_names(spz_command(command))
        out[command] = [flag for flag in sky[command] if not set(flag.split("/")) <= names]
    return out


def test_the_fixture_is_sky_0_14_1s_list() -> None:
    sky = sky_flags()
    assert set(CORE) <= set(sky)
    assert sum(len(sky[c]) for c in CORE) == 209  # the count issue 12 was written against


def test_spz_accepts_at_least_90_percent_of_skys_flags() -> None:
    sky = sky_flags()
    missing = missing_flags()
    total = sum(len(sky[c]) for c in CORE)
    accepted = total - sum(len(m) for m in missing.values())
    report = "; ".join(f"{c}: {', '.join(m)}" for c, m in missing.items() if m)
    assert accepted / total >= 0.90, f"spz accepts {accepted} of {total} sky flags; missing: {report}"


@pytest.mark.parametrize("command", CORE)
def test_help_shows_no_bool_on_flags(command: str) -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, [*command.split(), "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output
    assert "--help" in result.output


def test_every_sky_flag_of_the_core_commands_is_accepted() -> None:
    """The ratchet above 90%: today none is missing, and a command that loses one fails here."""
    assert {c: m for c, m in missing_flags().items() if m} == {}


# ------------------------------------------------------------------------ the flags, decided at the edge

def test_dotenv_files_read_as_python_dotenv_does(tmp_path: Path) -> None:
    from skypurza.cli.dotenv import DotenvError, parse_dotenv, read_dotenv

    text = ("# a comment\n\nexport A=1\nB = two words  # trailing comment\nC='single # kept'\n"
            'D="line\\nbreak \\"quoted\\""\nNOVALUE\nA=again\n')
    assert parse_dotenv(text, "f") == {"A": "again", "B": "two words", "C": "single # kept",
                                       "D": 'line\nbreak "quoted"'}
    with pytest.raises(DotenvError, match=r"f:2: expected KEY=VALUE"):
        parse_dotenv("OK=1\n=nokey\n", "f")
    with pytest.raises(DotenvError, match="no such file"):
        read_dotenv(str(tmp_path / "missing.env"), "--env-file")
    big = tmp_path / "big.env"
    big.write_text("X=" + "y" * (1024 * 1024 + 10))
    with pytest.raises(DotenvError, match="at most"):
        read_dotenv(str(big), "--env-file")


def test_new_overrides_land_in_the_task_as_sky_sets_them() -> None:
    from skypurza.events.taskspec import CliOverrides
    from skypurza.events.taskspec.overrides import override_dict

    data = {"run": "x", "secrets": {"TOKEN": None, "OTHER": None}, "workdir": {"url": "https://g/r", "ref": "old"},
            "resources": {"disk_tier": "high", "priority_class": "batch",
                          "any_of": [{"infra": "aws", "ports": [1]}, {"infra": "local"}]}}
    out = override_dict(data, CliOverrides(disk_tier="none", network_tier="best", ports=("8080", "9000-9001"),
                                           priority="7", git_ref="main", local_disk="nvme:100+",
                                           env_file_secrets={"TOKEN": "from-file", "NOT_DECLARED": "x"},
                                           secrets={"OTHER": "from-flag"}))
    res = out["resources"]
    assert "disk_tier" not in res and res["network_tier"] == "best" and res["local_disk"] == "nvme:100+"
    assert res["ports"] == ["8080", "9000-9001"] and res["any_of"][0] == {"infra": "aws"}
    assert res["priority"] == 7 and "priority_class" not in res
    assert out["workdir"] == {"url": "https://g/r", "ref": "main"}
    assert out["secrets"] == {"TOKEN": "from-file", "OTHER": "from-flag"}  # env-file fills declared ones only
    named = override_dict({"run": "x"}, CliOverrides(priority="high-prio", git_url="https://g/x"))
    assert named["resources"] == {"priority_class": "high-prio"} and named["workdir"] == {"url": "https://g/x"}


def test_cloud_region_zone_are_the_deprecated_spelling_of_infra() -> None:
    from skypurza.cli.options import ResourceFlags

    assert ResourceFlags(cloud="aws", region="us-east-1").infra_of() == "aws/us-east-1"
    assert ResourceFlags(cloud="aws", zone="us-east-1a").infra_of() == "aws/*/us-east-1a"
    assert ResourceFlags(region="us-west-2").infra_of() == "*/us-west-2"
    assert ResourceFlags(infra="local").infra_of() == "local"


@pytest.mark.parametrize("args, flag, says", [
    (["--ports", "8080,99999"], "--ports", "65535"),
    (["--ports", "9000-8000"], "--ports", "backwards"),
    (["--disk-tier", "fastest"], "--disk-tier", "low, medium, high, ultra, best, none"),
    (["--network-tier", "fast"], "--network-tier", "standard, best"),
    (["--wait-for", "ssh"], "--wait-for", "jobs_and_ssh, jobs, none"),
    (["--priority", "5000"], "--priority", "-1000 to 1000"),
    (["--infra", "aws", "--cloud", "aws"], "--infra", "not both"),
    (["--local-disk", "tape:5"], "--local-disk", "nvme"),
    (["--clone-disk-from", "other"], "--clone-disk-from", "not supported"),
    (["--resize"], "--resize", "not supported"),
    (["--wait-for", "jobs"], "--wait-for", "goes with -i"),
])
def test_a_bad_flag_value_is_a_usage_error_naming_the_flag(args: list[str], flag: str, says: str,
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["launch", "--dryrun", "-y", *args, "echo hi"], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert flag in result.output and says in result.output, result.output
    assert "Traceback" not in result.output


def test_env_and_secret_files_feed_the_dryrun_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--env over --env-file, --secret over --secret-file, as the task the optimizer is given."""
    from skypurza.cli.options import ResourceFlags, TaskFlags, overrides_of

    env_file, secret_file = tmp_path / "e.env", tmp_path / "s.env"
    env_file.write_text("A=file\nB=file\n")
    secret_file.write_text("S=file\nT=file\n")
    monkeypatch.setenv("FROM_SHELL", "shell")
    o = overrides_of(ResourceFlags(), TaskFlags(env=["B=flag", "FROM_SHELL"], env_file=str(env_file),
                                                secret=["T=flag"], secret_file=str(secret_file)))
    assert dict(o.envs) == {"A": "file", "B": "flag", "FROM_SHELL": "shell"}
    assert dict(o.secrets) == {"S": "file", "T": "flag"}
    assert dict(o.env_file_secrets) == {"A": "file", "B": "file"}


def test_wait_for_none_is_a_hard_limit_and_jobs_wait_otherwise() -> None:
    from datetime import datetime, timedelta, timezone

    from skypurza.events.models import AutostopSet, Candidate, ClusterProvisioned, JobQueued, NodeInfo
    from skypurza.services.agent.decide import idle_due
    from skypurza.services.agent.view import ClusterView

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def view(wait_for: str) -> ClusterView:
        v = ClusterView("c", 1)
        v.apply(ClusterProvisioned(cluster="c", task_id="t", placement_id="p", candidate=Candidate(infra="local"),
                                   nodes=[NodeInfo(rank=0, instance_id="i0")], hourly_price_micros=0,
                                   launched_at=t0), "e1", t0, 1)
        v.apply(AutostopSet(cluster="c", idle_minutes=10, wait_for=wait_for), "e2", t0, 2)
        # a job queued five minutes in, still running
        v.apply(JobQueued(cluster="c", job_id=1, task_id="t", task={"run": "sleep 1d"}), "e3",
                t0 + timedelta(minutes=5), 3)
        return v

    later = t0 + timedelta(minutes=11)
    hard = idle_due(view("none"), later)
    assert hard is not None and hard.idle_since == t0, "none: ten minutes after the setting, whatever runs"
    assert idle_due(view("jobs"), later) is None and idle_due(view("jobs_and_ssh"), later) is None


def test_launch_retries_only_when_no_place_had_capacity() -> None:
    from skypurza.cli.cmd_launch import retry_delay_s
    from skypurza.cli.jobwatch import out_of_capacity
    from skypurza.events.models import Attempt, Candidate, PlacementFailed

    def failed(*classes: str) -> PlacementFailed:
        return PlacementFailed(task_id="t", cluster="c", reason="r", attempts=[
            Attempt(candidate=Candidate(infra="aws"), error_class=c, code="X", message="m") for c in classes])

    assert out_of_capacity(failed("capacity", "spot_capacity", "quota"))
    assert not out_of_capacity(failed("capacity", "auth")), "bad credentials do not get better by waiting"
    assert not out_of_capacity(failed()), "no candidate at all: the task asks for what nothing has"
    assert [retry_delay_s(n) for n in (1, 2, 3, 6, 50)] == [10, 20, 40, 300, 300]


def test_api_start_refuses_to_listen_beyond_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --deploy the API server has no authentication: beyond loopback only with --deploy."""
    from typer.testing import CliRunner

    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path))
    for args in (["--host", "0.0.0.0"], ["--host", "::"]):
        result = CliRunner().invoke(app, ["api", "start", *args])
        assert result.exit_code == 2 and "needs --deploy" in result.output, result.output
    result = CliRunner().invoke(app, ["api", "start", "--enable-basic-auth"])
    assert result.exit_code == 2 and "--deploy" in result.output, result.output
    result = CliRunner().invoke(app, ["api", "start", "--host", "example.com"])
    assert result.exit_code == 2 and "0.0.0.0" in result.output, result.output
    assert not (tmp_path / "dev" / "api.json").exists(), "nothing was started"


def test_gpus_list_cloud_and_region_are_infra(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    runner = CliRunner()
    by_infra = runner.invoke(app, ["gpus", "list", "--infra", "aws/us-east-1", "-o", "json"])
    by_cloud = runner.invoke(app, ["gpus", "list", "--cloud", "aws", "--region", "us-east-1", "-o", "json"])
    assert by_infra.exit_code == by_cloud.exit_code == 0, by_cloud.output
    assert json.loads(by_cloud.stdout)["rows"] == json.loads(by_infra.stdout)["rows"] != []
    wide = {"COLUMNS": "400"}
    short = runner.invoke(app, ["gpus", "list"], env=wide).output
    full = runner.invoke(app, ["gpus", "list", "-v"], env=wide).output
    assert "types)" in short and "types)" not in full and "g5.xlarge" in full


def test_check_v_shows_the_account(fake_aws, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    for k, v in fake_aws.env.items():
        monkeypatch.setenv(k, v)
    wide = {"COLUMNS": "300"}
    plain = CliRunner().invoke(app, ["check", "aws"], env=wide)
    verbose = CliRunner().invoke(app, ["check", "aws", "-v"], env=wide)
    assert plain.exit_code == verbose.exit_code == 0, verbose.output
    assert fake_aws.account_id in verbose.output and fake_aws.account_id not in plain.output


def test_skys_config_flag_is_taken_out_and_said_so() -> None:
    import subprocess
    import sys

    from skypurza.cli.options import strip_sky_config

    assert strip_sky_config(["launch", "--config", "a.b=1", "-c", "x", "--config=f.yaml", "--", "run", "--config",
                             "k"]) == (["launch", "-c", "x", "--", "run", "--config", "k"], ["a.b=1", "f.yaml"])
    r = subprocess.run([sys.executable, "-m", "skypurza.cli.main", "gpus", "list", "--config", "x=y", "--infra",
                        "local", "-o", "json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "note: --config changes nothing" in r.stderr and '"rows"' in r.stdout


def test_sky_serve_verbs_say_skyserve_is_not_supported_and_the_runner_moved(tmp_path):
    import subprocess
    import sys

    env = {**__import__("os").environ, "SKYPURZA_HOME": str(tmp_path)}
    for args in (["serve", "up", "svc.yaml"], ["serve", "status"], ["serve", "down", "-y", "svc"], ["serve"]):
        out = subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, capture_output=True,
                             text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert out.returncode == 1, (args, out.stderr)
        assert "SkyServe" in out.stderr and "spz api serve" in out.stderr and "Traceback" not in out.stderr
    helped = subprocess.run([sys.executable, "-m", "skypurza.cli.main", "api", "serve", "--help"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "--services" in helped.stdout
