"""Every bound of `skypurza.events.limits`, at its limit and one past it: in task YAML (through
`spz check-yaml` and `spz launch --dryrun`) and on the command line (a usage error, exit 2, naming
the flag). Plus the loader's own defences: alias bombs, named pipes, huge files, dates and huge
integers as positioned problems, and the local backend's O(N) node-IP file.

The CLI runs in-process through typer's CliRunner on the real `spz` app, and as a real process
where blocking is what is tested (a named pipe).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from skypurza.cli import bounds
from skypurza.cli.main import app
from skypurza.events import limits as L
from skypurza.events.agentspec import AgentSpec

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # launch --dryrun reads the config: keep it away from the user's own.
    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SKYPURZA_STAGE", "bounds")
    monkeypatch.delenv("SKYPURZA_NATS_URL", raising=False)
    return tmp_path / "home"


def spz(*args: str) -> tuple[int, str]:
    """Exit code and output (stdout and stderr), with rich's boxes and wrapping taken out."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "4000"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.exit_code, flat(result.output)


def flat(text: str) -> str:
    for ch in "│╭╮╰╯─":
        text = text.replace(ch, " ")
    return "\n".join(" ".join(line.split()) for line in text.splitlines() if line.strip())


def check(tmp_path: Path, text: str, name: str = "task.yaml") -> dict[str, Any]:
    path = tmp_path / name
    path.write_text(text)
    code, out = spz("check-yaml", "-o", "json", str(path))
    doc = json.loads(out.splitlines()[-1])
    assert code == (0 if doc["valid"] else 1)
    return doc


def yaml_list(items: list[Any]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def mapping(prefix: str, n: int, value: str) -> str:
    return "".join(f"  {prefix}{i}: {value}\n" for i in range(n))


# (name, YAML at the limit, YAML one past it, the key path of the problem, words of the message)
CASES: list[tuple[str, str, str, str, str]] = [
    ("num_nodes", f"num_nodes: {L.MAX_NODES}\n", f"num_nodes: {L.MAX_NODES + 1}\n", "num_nodes",
     f"at most {L.MAX_NODES}"),
    ("autostop minutes", f"resources:\n  autostop: {L.MAX_IDLE_MINUTES}\n",
     f"resources:\n  autostop: {L.MAX_IDLE_MINUTES + 1}\n", "resources.autostop", "at most 525,600 idle minutes"),
    ("autostop duration", "resources:\n  autostop: 365d\n", "resources:\n  autostop: 366d\n",
     "resources.autostop", "at most 525,600 idle minutes"),
    ("autostop idle_minutes", f"resources:\n  autostop:\n    idle_minutes: {L.MAX_IDLE_MINUTES}\n",
     f"resources:\n  autostop:\n    idle_minutes: {L.MAX_IDLE_MINUTES + 1}\n", "resources.autostop.idle_minutes",
     "<= 525600"),
    ("hook_timeout", f"resources:\n  autostop:\n    hook_timeout: {L.MAX_TIMEOUT_S}\n",
     f"resources:\n  autostop:\n    hook_timeout: {L.MAX_TIMEOUT_S + 1}\n", "resources.autostop.hook_timeout",
     "<= 86400"),
    ("disk_size", f"resources:\n  disk_size: {L.MAX_DISK_GB}\n", f"resources:\n  disk_size: {L.MAX_DISK_GB + 1}\n",
     "resources.disk_size", "at most 65,536 GB"),
    ("disk_size unit", "resources:\n  disk_size: 64TB\n", "resources:\n  disk_size: 65TB\n",
     "resources.disk_size", "at most 65,536 GB"),
    ("extra volume", f"resources:\n  volumes:\n    - disk_size: {L.MAX_DISK_GB}\n",
     f"resources:\n  volumes:\n    - disk_size: {L.MAX_DISK_GB + 1}\n", "resources.volumes.0.disk_size",
     "at most 65,536 GB"),
    ("local_disk", f"resources:\n  local_disk: nvme:{L.MAX_DISK_GB}\n",
     f"resources:\n  local_disk: nvme:{L.MAX_DISK_GB + 1}\n", "resources.local_disk", "at most 65,536 GB"),
    ("cpus", f"resources:\n  cpus: {L.MAX_CPUS}+\n", f"resources:\n  cpus: {L.MAX_CPUS + 1}+\n",
     "resources.cpus", f"at most {L.MAX_CPUS}"),
    ("memory", f"resources:\n  memory: {L.MAX_MEMORY_GIB}\n", f"resources:\n  memory: {L.MAX_MEMORY_GIB + 1}\n",
     "resources.memory", "at most 65,536 GiB"),
    ("memory ratio", f"resources:\n  memory: {L.MAX_MEMORY_RATIO}x\n",
     f"resources:\n  memory: {L.MAX_MEMORY_RATIO + 1}x\n", "resources.memory", "at most 1024x"),
    ("accelerator count", f"resources:\n  accelerators: A100:{L.MAX_ACCELERATOR_COUNT}\n",
     f"resources:\n  accelerators: A100:{L.MAX_ACCELERATOR_COUNT + 1}\n", "resources.accelerators",
     "at most 1024 per node"),
    ("accelerator mapping", f"resources:\n  accelerators: {{A100: {L.MAX_ACCELERATOR_COUNT}}}\n",
     f"resources:\n  accelerators: {{A100: {L.MAX_ACCELERATOR_COUNT + 1}}}\n", "resources.accelerators.A100",
     "at most 1024 per node"),
    ("accelerator choices", f"resources:\n  accelerators: {yaml_list([f'G{i}:1' for i in range(L.MAX_RESOURCE_ALTERNATIVES)])}\n",
     f"resources:\n  accelerators: {yaml_list([f'G{i}:1' for i in range(L.MAX_RESOURCE_ALTERNATIVES + 1)])}\n",
     "resources.accelerators", "at most 64 accelerator choices"),
    ("any_of", "resources:\n  any_of:\n" + "    - cpus: 2\n" * L.MAX_RESOURCE_ALTERNATIVES,
     "resources:\n  any_of:\n" + "    - cpus: 2\n" * (L.MAX_RESOURCE_ALTERNATIVES + 1), "resources.any_of",
     "at most 64 entries"),
    ("ports", f"resources:\n  ports: {yaml_list(list(range(8000, 8000 + L.MAX_PORT_ENTRIES)))}\n",
     f"resources:\n  ports: {yaml_list(list(range(8000, 8001 + L.MAX_PORT_ENTRIES)))}\n", "resources.ports",
     "at most 100 ports"),
    ("labels", "resources:\n  labels:\n" + "".join(f"    k{i}: v\n" for i in range(L.MAX_LABELS)),
     "resources:\n  labels:\n" + "".join(f"    k{i}: v\n" for i in range(L.MAX_LABELS + 1)), "resources.labels",
     "at most 64 entries"),
    ("max_restarts_on_errors", f"resources:\n  job_recovery:\n    max_restarts_on_errors: {L.MAX_RESTARTS}\n",
     f"resources:\n  job_recovery:\n    max_restarts_on_errors: {L.MAX_RESTARTS + 1}\n",
     "resources.job_recovery.max_restarts_on_errors", "<= 1000"),
    ("max_hourly_cost", f"resources:\n  max_hourly_cost: {L.MAX_HOURLY_COST}\n",
     f"resources:\n  max_hourly_cost: {L.MAX_HOURLY_COST + 1}\n", "resources.max_hourly_cost", "<= 1000000"),
    ("envs count", "envs:\n" + mapping("E", L.MAX_ENV_VARS, "x"), "envs:\n" + mapping("E", L.MAX_ENV_VARS + 1, "x"),
     "envs", "at most 1000 entries"),
    ("env name", f"envs:\n  {'N' * L.MAX_ENV_NAME_CHARS}: x\n", f"envs:\n  {'N' * (L.MAX_ENV_NAME_CHARS + 1)}: x\n",
     "envs." + "N" * (L.MAX_ENV_NAME_CHARS + 1), "at most 256"),
    ("env value", f"envs:\n  V: {'v' * L.MAX_ENV_VALUE_BYTES}\n", f"envs:\n  V: {'v' * (L.MAX_ENV_VALUE_BYTES + 1)}\n",
     "envs.V", "at most 65,536"),
    ("env value in bytes", f"envs:\n  V: {'é' * (L.MAX_ENV_VALUE_BYTES // 2)}\n",
     f"envs:\n  V: {'é' * (L.MAX_ENV_VALUE_BYTES // 2)}x\n", "envs.V", "65,537 bytes"),
    ("secrets count", f"secrets: {yaml_list([f'S{i}' for i in range(L.MAX_ENV_VARS)])}\n",
     f"secrets: {yaml_list([f'S{i}' for i in range(L.MAX_ENV_VARS + 1)])}\n", "secrets", "at most 1000 secrets"),
    ("secret value", f"secrets:\n  S: {'s' * L.MAX_ENV_VALUE_BYTES}\n",
     f"secrets:\n  S: {'s' * (L.MAX_ENV_VALUE_BYTES + 1)}\n", "secrets.S", "at most 65,536"),
    ("setup size", f"setup: {'x' * L.MAX_SCRIPT_BYTES}\n", f"setup: {'x' * (L.MAX_SCRIPT_BYTES + 1)}\n", "setup",
     "at most 1,048,576"),
    ("run size", f"run: {'x' * L.MAX_SCRIPT_BYTES}\n", f"run: {'x' * (L.MAX_SCRIPT_BYTES + 1)}\n", "run",
     "at most 1,048,576"),
    ("file_mounts", "file_mounts:\n" + "".join(f"  /m{i}: s3://b/k\n" for i in range(L.MAX_MOUNTS)),
     "file_mounts:\n" + "".join(f"  /m{i}: s3://b/k\n" for i in range(L.MAX_MOUNTS + 1)), "file_mounts",
     "at most 256 entries"),
    ("volumes", "volumes:\n" + "".join(f"  /v{i}: vol\n" for i in range(L.MAX_MOUNTS)),
     "volumes:\n" + "".join(f"  /v{i}: vol\n" for i in range(L.MAX_MOUNTS + 1)), "volumes", "at most 256 entries"),
    ("managed_secrets", f"managed_secrets: {yaml_list([f'm{i}' for i in range(L.MAX_MOUNTS)])}\n",
     f"managed_secrets: {yaml_list([f'm{i}' for i in range(L.MAX_MOUNTS + 1)])}\n", "managed_secrets",
     "at most 256 entries"),
    ("task name", f"name: {'n' * L.MAX_TASK_NAME_CHARS}\n", f"name: {'n' * (L.MAX_TASK_NAME_CHARS + 1)}\n", "name",
     "at most 128"),
    ("termination_delay", f"name: g\nexecution: parallel\ntermination_delay: {L.MAX_TIMEOUT_S}\n---\nname: a\nrun: x\n",
     f"name: g\nexecution: parallel\ntermination_delay: {L.MAX_TIMEOUT_S + 1}\n---\nname: a\nrun: x\n",
     "termination_delay", "86,400 seconds"),
]


def _env_total(total: int) -> str:
    """envs whose names and values add up to exactly `total` bytes (name + value + 2 each)."""
    entries, left, i = [], total, 0
    while left:
        name = f"T{i:02d}"
        size = min(L.MAX_ENV_VALUE_BYTES, left - len(name) - 2)
        entries.append(f"  {name}: {'t' * size}\n")
        left -= len(name) + size + 2
        i += 1
    return "envs:\n" + "".join(entries)


def task(text: str) -> str:
    """A whole task file around a case (which may be a whole file already)."""
    return text if text.startswith(("run:", "name: g\nexecution")) else "run: echo hi\n" + text


CASES.append(("envs total", _env_total(L.MAX_ENV_TOTAL_BYTES), _env_total(L.MAX_ENV_TOTAL_BYTES + 1), "envs",
              "at most 1,048,576"))


@pytest.mark.parametrize(("at_limit", "past", "path", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_yaml_bound_at_its_limit_and_one_past(tmp_path: Path, at_limit: str, past: str, path: str,
                                                   words: str) -> None:
    ok = check(tmp_path, task(at_limit))
    assert ok["valid"], ok["errors"]
    bad = check(tmp_path, task(past))
    assert not bad["valid"]
    (problem,) = bad["errors"]
    assert problem["path"] == path and words in problem["message"], problem
    assert problem["line"] is not None and problem["column"] is not None


@pytest.mark.parametrize("name", ["num_nodes", "cpus", "disk_size", "envs count", "any_of"])
def test_yaml_bounds_through_launch_dryrun(tmp_path: Path, name: str) -> None:
    _, at_limit, past, path, words = next(c for c in CASES if c[0] == name)
    good = tmp_path / "good.yaml"
    good.write_text(task(at_limit))
    code, out = spz("launch", "--dryrun", "-o", "json", str(good))
    assert "invalid task" not in out and code in (0, 1), out  # 1: valid, but nothing this big is offered
    bad = tmp_path / "bad.yaml"
    bad.write_text(task(past))
    code, out = spz("launch", "--dryrun", str(bad))
    assert code == 1 and "invalid task" in out and f"{bad}:" in out and words in " ".join(out.split()), out


# ------------------------------------------------------------------------------- CLI flags

FLAG_CASES = [
    ("--num-nodes", str(L.MAX_NODES), str(L.MAX_NODES + 1)),
    ("-i", str(L.MAX_IDLE_MINUTES), str(L.MAX_IDLE_MINUTES + 1)),
    ("--disk-size", str(L.MAX_DISK_GB), str(L.MAX_DISK_GB + 1)),
    ("--cpus", f"{L.MAX_CPUS}+", f"{L.MAX_CPUS + 1}+"),
    ("--memory", f"{L.MAX_MEMORY_GIB}+", f"{L.MAX_MEMORY_GIB + 1}+"),
    ("--gpus", f"A100:{L.MAX_ACCELERATOR_COUNT}", f"A100:{L.MAX_ACCELERATOR_COUNT + 1}"),
    ("-c", "c" * L.MAX_CLUSTER_NAME_CHARS, "c" * (L.MAX_CLUSTER_NAME_CHARS + 1)),
    ("-n", "n" * L.MAX_TASK_NAME_CHARS, "n" * (L.MAX_TASK_NAME_CHARS + 1)),
]


@pytest.mark.parametrize(("flag", "at_limit", "past"), FLAG_CASES, ids=[c[0] for c in FLAG_CASES])
def test_each_flag_bound_at_its_limit_and_one_past(flag: str, at_limit: str, past: str) -> None:
    code, out = spz("launch", "--dryrun", "-o", "json", flag, at_limit, "echo hi")
    assert code in (0, 1) and "invalid" not in out.lower(), out
    code, out = spz("launch", "--dryrun", flag, past, "echo hi")
    assert code == 2, out
    text = " ".join(out.split())
    assert flag in text and ("at most" in text or "must be from" in text), out


@pytest.mark.parametrize("value", ["1e20", "99999999999999999999", "9" * 100_000, "-1", "0x10", "1.5"])
def test_number_flags_refuse_what_is_not_a_bounded_integer(value: str) -> None:
    for flag in ("--num-nodes", "-i", "--disk-size"):
        code, out = spz("launch", "--dryrun", flag, value, "echo hi")
        assert code == 2 and flag in out and ("expected a whole number" in out or "must be from" in out), out
        assert len(out) < 2000  # the value is shortened, not echoed whole


def test_empty_cluster_name_is_refused_not_invented() -> None:
    code, out = spz("launch", "--dryrun", "-c", "", "echo hi")
    assert code == 2 and "cluster name is empty" in out
    code, out = spz("launch", "-y", "--async", "-c", "", "echo hi")  # refused before any control plane
    assert code == 2 and "cluster name is empty" in out
    for verb in (["exec", "", "echo hi"], ["logs", ""], ["cancel", "", "1"]):
        code, out = spz(*verb)
        assert code == 2 and "empty" in out, (verb, out)


def test_job_ids_tail_and_days_are_bounded_before_anything_is_asked() -> None:
    # Past the bound: a usage error at once (no control plane is started for it).
    for args in (["logs", "c", str(L.MAX_JOB_ID + 1)], ["logs", "c", "0"], ["cancel", "c", "1", "0"],
                 ["jobs", "logs", str(L.MAX_JOB_ID + 1)], ["jobs", "cancel", "99999999999999999999"],
                 ["logs", "c", "--tail", str(L.MAX_TAIL_LINES + 1)], ["api", "logs", "--tail", "-1"],
                 ["cost-report", "--days", str(L.MAX_DAYS + 1)]):
        code, out = spz(*args)
        assert code == 2 and ("must be from" in out or "expected a whole number" in out), (args, out)
    # At the bound: the same parsers accept.
    assert bounds.JOB_ID(str(L.MAX_JOB_ID)) == L.MAX_JOB_ID and bounds.JOB_ID("1") == 1
    assert bounds.TAIL_LINES(str(L.MAX_TAIL_LINES)) == L.MAX_TAIL_LINES and bounds.DAYS(str(L.MAX_DAYS)) == L.MAX_DAYS


def test_env_and_secret_flags_are_bounded() -> None:
    many = [a for i in range(L.MAX_ENV_VARS) for a in ("--env", f"E{i}=x")]
    code, out = spz("launch", "--dryrun", "-o", "json", *many, "echo hi")
    assert code in (0, 1) and "invalid" not in out.lower(), out[-500:]
    code, out = spz("launch", "--dryrun", *many, "--env", "ONE_MORE=x", "echo hi")
    assert code == 2 and "--env" in out and "at most 1000" in out, out[-500:]
    code, out = spz("launch", "--dryrun", "--secret", f"S={'s' * L.MAX_ENV_VALUE_BYTES}", "echo hi")
    assert code in (0, 1), out[-500:]
    code, out = spz("launch", "--dryrun", "--secret", f"S={'s' * (L.MAX_ENV_VALUE_BYTES + 1)}", "echo hi")
    assert code == 2 and "--secret" in out and "at most 65,536" in " ".join(out.split()), out[-500:]


# ------------------------------------------------------------------------------- the loader

def billion_laughs(depth: int, width: int = 10) -> str:
    lines = ["run: echo hi", "_metadata:", "  l0: &l0 [lol]"]
    for d in range(1, depth + 1):
        lines.append(f"  l{d}: &l{d} [" + ", ".join([f"*l{d - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("depth", range(7, 13))
def test_billion_laughs_is_refused_at_once_at_any_depth(tmp_path: Path, depth: int) -> None:
    path = tmp_path / f"bomb{depth}.yaml"
    path.write_text(billion_laughs(depth))
    start = time.perf_counter()
    doc = check(tmp_path, path.read_text(), path.name)
    took = time.perf_counter() - start
    assert not doc["valid"] and took < 0.5, took  # the goal is 100 ms: bench/yaml_bounds.py measures it
    (problem,) = doc["errors"]
    assert "too many aliases" in problem["message"] and problem["line"] == 8 and problem["column"] is not None
    start = time.perf_counter()
    code, out = spz("launch", "--dryrun", str(path))
    assert time.perf_counter() - start < 0.5 + 2.0  # CLI start and config on top of the check
    assert code == 1 and "too many aliases" in out and f"{path}:8:" in out


def test_node_count_and_nesting_at_their_limits(tmp_path: Path) -> None:
    # 8 nodes of frame + 1,000 per copy of &a (199 of them) + 2 for pad's key and list + pad.
    def nodes(pad: int) -> str:
        return ("run: x\n_metadata:\n  base: &a [" + "1, " * 998 + "1]\n  refs: [" + ", ".join(["*a"] * 198)
                + "]\n  pad: [" + ", ".join(["2"] * pad) + "]\n")
    pad = L.MAX_YAML_NODES - 8 - 199 * 1000 - 2
    assert check(tmp_path, nodes(pad))["valid"]
    (problem,) = check(tmp_path, nodes(pad + 1))["errors"]
    assert "too many YAML nodes" in problem["message"] and problem["path"].startswith("_metadata.pad")

    def nested(depth: int) -> str:  # the root mapping is level 1, _metadata's mapping 2, the lists 3...
        return "run: x\n_metadata: {a: " + "[" * (depth - 2) + "]" * (depth - 2) + "}\n"
    assert check(tmp_path, nested(L.MAX_YAML_DEPTH))["valid"]
    (problem,) = check(tmp_path, nested(L.MAX_YAML_DEPTH + 1))["errors"]
    assert "nested too deeply" in problem["message"] and problem["line"] == 2


def test_file_size_at_its_limit_and_one_past(tmp_path: Path) -> None:
    head = "run: echo hi\n"
    filler = L.MAX_YAML_FILE_BYTES - len(head) - 2
    assert check(tmp_path, head + "#" + "x" * filler + "\n")["valid"]
    (problem,) = check(tmp_path, head + "#" + "x" * (filler + 1) + "\n")["errors"]
    assert "at most 4,194,304" in problem["message"]


def test_named_pipe_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "task.yaml"
    os.mkfifo(fifo)
    env = {**os.environ, "SKYPURZA_HOME": str(tmp_path / "home"), "COLUMNS": "4000"}
    for args in (["check-yaml", str(fifo)], ["launch", "--dryrun", str(fifo)]):
        r = subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], capture_output=True, text=True,
                           timeout=60, env=env, cwd=REPO.parent)
        assert r.returncode == 1 and "not a regular file (a named pipe)" in flat(r.stdout + r.stderr), r
        assert "Traceback" not in r.stderr
    code, out = spz("check-yaml", str(tmp_path))
    assert code == 1 and "not a regular file (a directory)" in out


@pytest.mark.parametrize(("text", "line", "column", "path", "words"), [
    ("run: echo hi\nsetup: 2026-13-45\n", 2, 8, "setup", "'2026-13-45' reads as a date but is not a valid one"),
    ("run: echo hi\nsetup: 2026-01-02\n", 2, 8, "setup", "expected a string, found a date (2026-01-02)"),
    ("run: echo hi\nnum_nodes: " + "1" * 100_000 + "\n", 2, 12, "num_nodes", "is too large"),
    ("run: echo hi\n_metadata:\n  big: 0x" + "f" * 5000 + "\n", 3, 8, "_metadata.big", "is too large"),
    ("run: echo hi\nnum_nodes: 1.0e+20\n", 2, 12, "num_nodes", "expected an integer, found 1e+20"),
    ("run: echo hi\nnum_nodes: 1e20\n", 2, 12, "num_nodes", "expected an integer, found '1e20'"),
    ("run: echo hi\nresources:\n  autostop: 99999999999999999999\n", 3, 13, "resources.autostop", "is too large"),
    ("run: echo hi\nresources:\n  disk_size: " + "9" * 5000 + "GB\n", 3, 14, "resources.disk_size", "at most 65,536"),
    ("run: echo hi\nresources:\n  ports: '" + "9" * 5000 + "'\n", 3, 10, "resources.ports", "expected a port"),
])
def test_scalars_yaml_cannot_build_are_positioned(tmp_path: Path, text: str, line: int, column: int, path: str,
                                                  words: str) -> None:
    (problem,) = check(tmp_path, text)["errors"]
    assert (problem["line"], problem["column"], problem["path"]) == (line, column, path), problem
    assert words in problem["message"] and len(problem["message"]) < 400, problem
    bad = tmp_path / "dry.yaml"
    bad.write_text(text)
    code, out = spz("launch", "--dryrun", str(bad))
    assert code == 1 and f"{bad}:{line}:{column}:" in out


# ------------------------------------------------------------------- docs and the local backend

def test_every_bound_is_documented() -> None:
    docs = (REPO / "docs" / "task-yaml.md").read_text() + (REPO / "docs" / "cli.md").read_text()
    for b in L.bounds():
        assert f"| {b.what} | {b.limit} | {b.why} |" in docs, b


def test_local_gang_shares_one_node_ip_file(tmp_path: Path) -> None:
    from skypurza.services.provisioner.adapter import LaunchSpec
    from skypurza.services.provisioner.local import LocalAdapter

    adapter = LocalAdapter("nats://127.0.0.1:1", "bounds", tmp_path)
    spec = LaunchSpec(stage="bounds", cluster="big", launch_token="t", instance_type="local", region="local",
                      num_nodes=512, infra="local", labels={"start_seq": "1"})
    record = adapter._new_record(spec)
    argvs = [n["argv"] for n in record["nodes"]]
    # Each rank's command line is the same size whatever N is: the IPs are in one file.
    assert max(len(" ".join(a)) for a in argvs) < 600
    assert all("--node-ips" not in a for a in argvs)
    agent = AgentSpec.from_argv(argvs[7][3:])
    assert agent.rank == 7 and agent.node_ips == ("127.0.0.1",) * 512
    # The old form still parses (agents started by an older provisioner keep working).
    old = AgentSpec.from_argv(["--nats", "n", "--stage", "s", "--cluster", "c", "--rank", "1", "--num-nodes", "2",
                               "--node-ips", "10.0.0.1,10.0.0.2"])
    assert old.node_ips == ("10.0.0.1", "10.0.0.2") and old.to_argv()[old.to_argv().index("--node-ips") + 1] == \
        "10.0.0.1,10.0.0.2"


def test_memory_bench_shows_linear_growth() -> None:
    r = subprocess.run([sys.executable, str(REPO / "bench" / "local_nodes_memory.py"), "--nodes", "64", "512"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = {(int(line.split()[0]), line.split()[1]): line for line in r.stdout.splitlines()
            if line.split() and line.split()[0].isdigit()}
    kb = {k: float(v.split()[-2].rstrip("KB")) for k, v in rows.items()}  # cluster.json size
    assert kb[(512, "new")] / kb[(64, "new")] < 8 * 1.2  # linear: 8x the nodes, ~8x the bytes
    assert kb[(512, "old")] / kb[(64, "old")] > 20  # the old form grew with the square
