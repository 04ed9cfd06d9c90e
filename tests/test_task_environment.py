"""A task's setup and run start from the node user's login environment, never the agent's
(issue 12 §1; services/agent/userenv.py): ~/.bashrc sourced as SkyPilot does, our runtime taken
out, the task's variables winning, and on the local infra a user environment of its own, so a
task's `pip install` cannot change the agent that runs it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from local_cli import spz, local_cli

from skypurza.services.agent import userenv

# ---------------------------------------------------------------- the pure parts


def test_base_environment_takes_our_runtime_out():
    runtime = userenv.Runtime(venv_bin="/opt/spz/venv/bin")
    agent_env = {"PATH": "/opt/spz/venv/bin:/usr/local/bin:/usr/bin:/opt/spz/venv/bin/", "HOME": "/home/u",
                 "VIRTUAL_ENV": "/opt/spz/venv", "PYTHONPATH": "/opt/spz/src", "PYTHONHOME": "/opt/x",
                 "SKYPURZA_NATS_URL": "nats://x", "SKYPURZA_AGENT_KILL_GRACE_S": "1", "LANG": "C.UTF-8",
                 "CUDA_HOME": "/usr/local/cuda"}
    env = userenv.base_environment(agent_env, runtime)
    assert env["PATH"] == "/usr/local/bin:/usr/bin"
    assert {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "SKYPURZA_NATS_URL", "SKYPURZA_AGENT_KILL_GRACE_S"}.isdisjoint(env)
    assert env["HOME"] == "/home/u" and env["LANG"] == "C.UTF-8" and env["CUDA_HOME"] == "/usr/local/cuda"
    # Not in a virtualenv: PATH is the user's as it is (never strip the system's bin directories).
    assert userenv.base_environment(agent_env, userenv.Runtime(venv_bin=None))["PATH"] == agent_env["PATH"]


def _run_phase(tmp_path: Path, user_script: str, job_env: dict[str, str], bashrc: str | None) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    workdir = home / "sky_workdir"
    workdir.mkdir(parents=True, exist_ok=True)
    if bashrc is not None:
        (home / ".bashrc").write_text(bashrc)
    script = tmp_path / "phase.sh"
    script.write_text(userenv.phase_script(user_script, workdir, job_env))
    env = userenv.job_process_environment({"PATH": os.environ["PATH"]}, userenv.Runtime(None), job_env, home=home)
    return subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)


def test_the_phase_sources_bashrc_and_the_task_values_win(tmp_path: Path):
    bashrc = "export FROM_BASHRC=yes\nexport MY_ENV=overridden-by-bashrc\nmyfn() { echo fn-from-bashrc; }\ncd /\n"
    job_env = {"MY_ENV": "it's \"quoted\"\nand two lines", "SKYPILOT_NODE_RANK": "0"}
    out = _run_phase(tmp_path, 'echo "rc=$FROM_BASHRC"; printf "%s|" "$MY_ENV"; echo; myfn; pwd; '
                               'echo "keys=${SKYPURZA_JOB_ENV_KEYS-unset}"; echo "unbuf=$PYTHONUNBUFFERED"; exit 3',
                     job_env, bashrc)
    assert out.returncode == 3, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "rc=yes"
    assert lines[1:3] == ["it's \"quoted\"", "and two lines|"]
    assert lines[3] == "fn-from-bashrc"  # functions of ~/.bashrc (conda's `activate`) reach the script
    assert lines[4] == str(tmp_path / "home" / "sky_workdir")  # the prelude cds after ~/.bashrc
    assert lines[5:] == ["keys=unset", "unbuf=1"]


def test_a_phase_without_bashrc_runs(tmp_path: Path):
    out = _run_phase(tmp_path, "echo ok", {"A": "1"}, None)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr


# ---------------------------------------------------------------- on the local infra, end to end


def _fake_pydantic_wheel(where: Path) -> Path:
    """A wheel of a 'pydantic' 1.0 that no agent could run on (no BaseModel)."""
    files = {"pydantic/__init__.py": "VERSION = '1.0.task'\n",
             "pydantic-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: pydantic\nVersion: 1.0\n",
             "pydantic-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                             "Tag: py3-none-any\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append("pydantic-1.0.dist-info/RECORD,,")
    wheel = where / "pydantic-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("pydantic-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


@pytest.fixture
def cli_env(tmp_path: Path):
    with local_cli(tmp_path, "envtest") as env:
        yield env


def test_a_task_runs_in_the_users_environment_and_only_on_a_cluster_it_fits(cli_env, tmp_path: Path):
    wheel = _fake_pydantic_wheel(tmp_path)
    # SkyPilot's examples/env_check.yaml pattern, then a pip install of an old pydantic, guarded: it
    # only runs once the job is seen to be in the node's own user environment (were isolation
    # broken, the install must not reach this machine's Python).
    task = tmp_path / "env_check.yaml"
    task.write_text(f"""\
name: env-check
resources:
  infra: local
setup: |
  echo 'export TEST_VAR=from-bashrc' >> ~/.bashrc
run: |
  if [ -z "$TEST_VAR" ]; then echo "TEST_VAR is not set"; exit 1; fi
  echo "TEST_VAR=$TEST_VAR"
  echo "VENV=$VIRTUAL_ENV"
  echo "PYTHONPATH=${{PYTHONPATH-}}"
  env | grep -c '^SKYPURZA_NATS_URL=' || true
  case "$(python -c 'import sys; print(sys.prefix)')" in
    "$HOME"/sky-user-env) python -m pip install --quiet --no-index --no-deps {wheel} ;;
    *) echo "NOT IN THE USER ENVIRONMENT"; exit 7 ;;
  esac
  python -c "import pydantic; print('task pydantic', pydantic.VERSION)"
""")
    out = spz(cli_env, "launch", "-y", "-c", "envc", str(task), timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "TEST_VAR=from-bashrc" in out.stdout
    lines = out.stdout.splitlines()
    venv = next(line for line in lines if line.startswith("VENV="))
    assert venv.startswith(f"VENV={tmp_path / 'home'}") and venv.endswith("/sky-user-env"), venv
    assert "PYTHONPATH=" in lines and "0" in lines  # none of ours: no PYTHONPATH, no SKYPURZA_NATS_URL
    assert "task pydantic 1.0.task" in out.stdout
    # This machine's Python (the one spz and its agents run on) still has the real one.
    real = subprocess.run([sys.executable, "-c", "import pydantic; print(pydantic.VERSION)"],
                          capture_output=True, text=True, timeout=60)
    assert real.stdout.startswith("2."), real
    # A second job on the same cluster runs, and so do freshly started agents (stop, start).
    again = spz(cli_env, "exec", "envc", "python -c \"import pydantic; print('still', pydantic.VERSION)\"")
    assert again.returncode == 0 and "still 1.0.task" in again.stdout, again.stdout + again.stderr
    assert spz(cli_env, "stop", "-y", "envc").returncode == 0
    started = spz(cli_env, "start", "-y", "envc", timeout=180)
    assert started.returncode == 0, started.stdout + started.stderr
    after = spz(cli_env, "exec", "envc", "echo agent-fine")
    assert after.returncode == 0 and "agent-fine" in after.stdout, after.stdout + after.stderr
    # An existing cluster takes only a task it fits (issue 12 §2; cli/clusterfit.py): refused with
    # what was asked and what the cluster has, nothing queued.
    for verb, flags, asked in (("launch", ["--gpus", "H100:8"], "H100:8 per node"),
                               ("launch", ["--infra", "aws"], "infra aws"),
                               ("exec", ["--cpus", "4096"], "4096 CPUs per node"),
                               ("exec", ["--gpus", "A100:1"], "A100:1 per node")):
        args = ([verb, *flags, "envc", "echo should-not-run"] if verb == "exec"
                else [verb, "-y", "-c", "envc", *flags, "echo should-not-run"])
        refused = spz(cli_env, *args)
        assert refused.returncode == 1, (args, refused.stdout, refused.stderr)
        assert f"the task asks for {asked}; cluster envc has" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr and "should-not-run" not in refused.stdout
    queue = json.loads(spz(cli_env, "queue", "envc", "-o", "json").stdout)
    assert len(queue) == 3, queue  # the launch, the exec before stop and the one after: nothing else
    # A local node never writes outside its own home without consent (issue 12 §4).
    outside = Path("/tmp") / f"spz-outside-{os.getpid()}-{tmp_path.name}"
    (tmp_path / "m.txt").write_text("x")
    mount = tmp_path / "mount.yaml"
    mount.write_text(f"resources: {{infra: local}}\nfile_mounts:\n  {outside}: {tmp_path / 'm.txt'}\n"
                     f"run: echo mounted\n")
    refused = spz(cli_env, "launch", "-y", "-c", "envc", str(mount))
    assert refused.returncode == 100, refused.stdout + refused.stderr
    assert f"file mount {outside}: on the local infra this would write into this machine's own file system" \
        in refused.stdout + refused.stderr
    assert not outside.exists() and "mounted" not in refused.stdout
    assert spz(cli_env, "down", "-y", "envc").returncode == 0
