"""`spz` as a user runs it, end to end on the `local` infra: the embedded control plane (real
nats-server, optimizer, provisioner, ledger), real agents, real processes.

launch (2 nodes, every env value checked) → logs → queue → status → exec (a distributed job,
a failing one, a relaunch that skips unchanged setup) → Ctrl-C detaches → cancel → down, and the
logs still readable after the cluster is gone and the control plane restarted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from local_cli import agent_pids
from agent_harness import ENV_DUMP, parse_env_dump

from skypurza.events.natsserver import free_port

REPO = Path(__file__).resolve().parent.parent
ENV_TASK = f"""\
name: envdump
num_nodes: 2
envs:
  MY_ENV: null
secrets:
  MY_SECRET: null
setup: |
  echo setup on $SKYPILOT_SETUP_NODE_RANK
run: |
{chr(10).join('  ' + line for line in ENV_DUMP.splitlines())}
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[-1].split()[0] != "Z"


@pytest.fixture
def cli_env(tmp_path: Path):
    home = tmp_path / "home"
    env = {**os.environ, "SKYPURZA_HOME": str(home), "SKYPURZA_STAGE": "clitest", "SKYPURZA_USER": "carol",
           "SKYPURZA_AGENT_KILL_GRACE_S": "1", "SKYPURZA_NATS_PORT": str(free_port()), "COLUMNS": "200"}
    env.pop("SKYPURZA_NATS_URL", None)
    yield env
    # Leave nothing behind, even when the test failed half-way.
    for pid in agent_pids(home):
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
    subprocess.run([sys.executable, "-m", "skypurza.cli.main", "api", "stop"], env=env, capture_output=True,
                   timeout=60)


def assert_not_stored(env: dict[str, str], needle: bytes) -> None:
    """Read every message of every stream of the stage, raw, and look for `needle`: only the
    secrets KV bucket (outside the immutable log, with a TTL) may hold it."""
    import asyncio

    import nats

    url = json.loads(spz(env, "api", "status", "-o", "json").stdout)["nats_url"]

    async def scan() -> int:
        nc = await nats.connect(url)
        js = nc.jetstream()
        seen = 0
        for stream in await js.streams_info():
            if stream.config.name.startswith("KV_") and "secrets" in stream.config.name:
                continue
            for seq in range(stream.state.first_seq, stream.state.last_seq + 1):
                try:
                    msg = await js.get_msg(stream.config.name, seq)
                except Exception:
                    continue
                seen += 1
                assert needle not in (msg.data or b""), f"secret value stored in {stream.config.name} seq {seq}"
                assert needle not in repr(msg.headers or {}).encode()
        await nc.close()
        return seen

    assert asyncio.run(scan()) > 10  # the event log and the logs stream were really read


def spz(env: dict[str, str], *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def ranked(stdout: str) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        m = re.match(r"^\((?:head|worker\d+), rank=(\d+)\) (.*)$", line)
        if m:
            out.setdefault(int(m[1]), []).append(m[2])
    return out


def test_launch_logs_queue_exec_cancel_down_on_local(cli_env, tmp_path: Path) -> None:
    task = tmp_path / "envdump.yaml"
    task.write_text(ENV_TASK)
    # ------------------------------------------------------------------ launch a 2-node cluster
    r = spz(cli_env, "launch", "-y", "-c", "dist", str(task), "--env", "MY_ENV=from the command line",
            "--secret", "MY_SECRET=hunter2-hunter2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Placement (attempt 1): local" in r.stderr and "Cluster dist is up (2 node(s))" in r.stderr
    assert "(setup, head, rank=0) setup on 0" in r.stdout and "(setup, worker1, rank=1) setup on 1" in r.stdout
    by_rank = ranked(r.stdout)
    envs = {rank: parse_env_dump(lines) for rank, lines in by_rank.items()}
    task_id = envs[0]["SKYPILOT_TASK_ID"]
    assert re.fullmatch(r"sky-\d{4}(-\d{2}){5}-\d{6}_dist_1", task_id), task_id
    homes = [tmp_path / "home" / "clitest" / "clusters" / "dist" / f"node-{r}" for r in (0, 1)]
    for rank in (0, 1):
        env = envs[rank]
        assert {k: v for k, v in env.items() if k.startswith("SKYPILOT_")} == {
            "SKYPILOT_NODE_RANK": str(rank),
            "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1",
            "SKYPILOT_NUM_NODES": "2",
            "SKYPILOT_NUM_GPUS_PER_NODE": "0",
            "SKYPILOT_TASK_ID": task_id,
            "SKYPILOT_CLUSTER_INFO": '{"cluster_name": "dist", "cloud": "Local", "region": null, "zone": null}',
            "SKYPILOT_USER": "carol",
            "SKYPILOT_INTERNAL_JOB_ID": "1",
        }
        for k, v in env.items():
            if k.startswith("SKYPILOT_"):
                assert env["SKYPURZA_" + k[9:]] == v
        assert env["MY_ENV"] == "from the command line"
        assert env["MY_SECRET_SHA256"] == hashlib.sha256(b"hunter2-hunter2").hexdigest()
        assert env["HOME"] == str(homes[rank]) and env["CWD"] == str(homes[rank] / "sky_workdir")

    # ------------------------------------------------------------------ the secret is nowhere in the streams
    assert_not_stored(cli_env, b"hunter2-hunter2")

    # ------------------------------------------------------------------ logs, queue, status
    r = spz(cli_env, "logs", "dist", "1", "--no-follow")
    assert r.returncode == 0 and ranked(r.stdout) == by_rank, r.stderr
    assert spz(cli_env, "logs", "dist", "1", "--status").returncode == 0
    assert spz(cli_env, "logs", "dist", "9", "--status").returncode == 102
    r = spz(cli_env, "status", "-o", "json")
    clusters = json.loads(r.stdout)
    assert [(c["name"], c["status"], c["infra"], c["num_nodes"]) for c in clusters] == [("dist", "UP", "local", 2)]
    assert {"region", "zone", "instance_type", "hourly_price"} <= set(clusters[0])
    assert "dist" in spz(cli_env, "status").stdout

    # ------------------------------------------------------------------ exec: a distributed job, a failing job
    port = free_port()
    r = spz(cli_env, "exec", "dist", "examples/distributed.yaml", "--env", f"MASTER_PORT={port}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(head, rank=0) sum of 1..1,000,000 over 2 nodes = 500000500000" in r.stdout
    assert "(worker1, rank=1) rank 1 sent its partial sum 250000500000" in r.stdout
    assert "setup" not in r.stdout, "exec never runs setup"
    r = spz(cli_env, "exec", "dist", "echo about to fail; exit 4")
    assert r.returncode == 100 and "about to fail" in r.stdout
    assert "run failed on node 0 with exit code 4" in r.stderr
    # relaunch on the cluster: the setup is unchanged, so it is skipped
    r = spz(cli_env, "launch", "-y", "-c", "dist", str(task), "--env", "MY_ENV=x", "--secret", "MY_SECRET=y")
    assert r.returncode == 0 and "setup unchanged, skipped" in r.stderr and "setup on" not in r.stdout
    jobs = json.loads(spz(cli_env, "queue", "dist", "-o", "json").stdout)
    assert [(j["job_id"], j["status"]) for j in sorted(jobs, key=lambda j: j["job_id"])] == [
        (1, "SUCCEEDED"), (2, "SUCCEEDED"), (3, "FAILED"), (4, "SUCCEEDED")]

    # ------------------------------------------------------------------ Ctrl-C detaches, cancel kills
    proc = subprocess.Popen([sys.executable, "-m", "skypurza.cli.main", "exec", "dist", "echo started; sleep 300"],
                            env=cli_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        from procdiag import process_report

        report = process_report(proc.pid)
        proc.kill()
        raise AssertionError(f"exec did not detach on Ctrl-C: {report}") from None
    assert proc.returncode == 130 and "nothing was cancelled" in err
    time.sleep(0.5)
    jobs = json.loads(spz(cli_env, "queue", "dist", "-o", "json").stdout)
    assert {j["job_id"]: j["status"] for j in jobs}[5] == "RUNNING", "Ctrl-C must not cancel the job"
    r = spz(cli_env, "cancel", "-y", "dist", "5")
    assert r.returncode == 0 and "Job 5: CANCELLED" in r.stdout, r.stdout + r.stderr
    assert spz(cli_env, "logs", "dist", "5", "--status").returncode == 103

    # ------------------------------------------------------------------ down; logs outlive the cluster
    agents = agent_pids(tmp_path / "home")
    assert len(agents) == 2
    r = spz(cli_env, "down", "-y", "dist")
    assert r.returncode == 0 and "TERMINATED" in r.stderr, r.stdout + r.stderr
    assert not any(_alive(p) for p in agents) and not homes[0].exists()
    assert json.loads(spz(cli_env, "status", "-o", "json").stdout) == []
    assert spz(cli_env, "down", "-y", "dist").returncode == 1
    assert spz(cli_env, "api", "stop").returncode == 0
    r = spz(cli_env, "logs", "dist", "2")  # starts the control plane again; the job is long over
    assert r.returncode == 0 and "500000500000" in r.stdout


def test_bad_input_is_explained(cli_env, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: echo hi\nnum_nodes: 0\n")
    r = spz(cli_env, "launch", "-y", str(bad))
    assert r.returncode == 1 and "num_nodes" in r.stderr and "Traceback" not in r.stderr
    r = spz(cli_env, "launch", "-y", "--workdir", str(tmp_path / "missing"), "echo hi")
    assert r.returncode == 1 and "does not exist" in r.stderr
    r = spz(cli_env, "launch", "-y", "-c", "-bad", "echo hi")
    assert r.returncode == 2 and "invalid cluster name" in r.stderr  # a usage error, before anything runs
    r = spz(cli_env, "exec", "nosuch", "echo hi")
    assert r.returncode == 1 and "cluster nosuch does not exist" in r.stderr
    r = spz(cli_env, "autostop", "nosuch")
    assert r.returncode == 1 and "-i MINUTES" in r.stderr
    r = spz(cli_env, "launch", "--dryrun", "-o", "json", "echo hi")
    assert r.returncode == 0 and json.loads(r.stdout)


def test_the_examples_run_as_the_readme_says(cli_env) -> None:
    r = spz(cli_env, "launch", "-y", "examples/hello.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(setup) Running setup (nothing heavy to install)." in r.stdout
    assert "Hello from node 0 of 1" in r.stdout and "9592 primes below 100,000" in r.stdout
    name = json.loads(spz(cli_env, "status", "-o", "json").stdout)[0]["name"]
    assert name.startswith("spz-") and name.endswith("-carol")
    r = spz(cli_env, "stop", "-y", name)
    assert r.returncode == 0 and f"Cluster {name}: STOPPED." in r.stderr, r.stdout + r.stderr
    assert json.loads(spz(cli_env, "status", "-o", "json").stdout)[0]["status"] == "STOPPED"
    # launching on a stopped cluster starts it again, as sky launch does
    r = spz(cli_env, "launch", "-y", "-c", name, "examples/envs_and_mounts.yaml", "--env", "GREETING=Bonjour")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"Cluster {name} is up again." in r.stderr
    assert "(setup) setup sees GREETING=Bonjour" in r.stdout
    assert re.search(r"^Bonjour from .*/node-0/sky_workdir \(2/2\)$", r.stdout, re.MULTILINE)
    assert "29 words, 17 distinct; most common:" in r.stdout and "  the: 8" in r.stdout
    assert spz(cli_env, "down", "-a", "-y").returncode == 0



LATE_LINES_TASK = """\
num_nodes: 2
run: |
  if [ "$SKYPILOT_NODE_RANK" = 0 ]; then
    sleep 1.5; echo head fails; exit 3
  fi
  i=0
  while true; do echo "tick $i"; i=$((i+1)); sleep 0.05; done
"""


def test_a_neighbours_last_lines_after_the_failure_are_shown(cli_env, tmp_path: Path) -> None:
    """The head decides the job failed while rank 1 is still printing; rank 1 goes on until its
    agent stops it, and its last lines are stored after the JobFailed. The CLI waits for rank 1's
    report (an agent stores a phase's output before it reports it), not a fixed drain: what it
    printed is every line the logs stream holds, up to rank 1's last."""
    task = tmp_path / "late.yaml"
    task.write_text(LATE_LINES_TASK)
    r = spz(cli_env, "launch", "-y", "-c", "late", str(task))
    assert r.returncode == 100, r.stdout + r.stderr
    shown = ranked(r.stdout)
    assert shown[0] == ["head fails"], r.stdout
    stored = ranked(spz(cli_env, "logs", "late", "1", "--no-follow").stdout)
    assert len(stored[1]) >= 10 and shown[1] == stored[1], (shown[1][-3:], stored[1][-3:])
    assert spz(cli_env, "down", "-y", "late").returncode == 0
