"""The sky flags that do something, as a user types them, end to end on the `local` infra: the
embedded control plane (real nats-server and services), real node agents, real processes.

One cluster goes through launch (--env-file, --secret-file, --ports, -i), exec --git-url/--git-ref, status --ip /
--endpoints / --endpoint / -v, exec -c, exec --async, logs -w / --sync-down / --provision /
--autostop, stop, start -i --down, down --graceful; a managed job through jobs logs --tail /
--controller and jobs queue --since / --before / --status / -l. `down --purge` is tried on a
cluster nothing answers for (a NATS with no services), and `api start --nats-port / --foreground`
on a control plane of their own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from local_cli import agent_pids

from skypurza.events.natsserver import free_port

REPO = Path(__file__).resolve().parent.parent

TASK = """\
name: flags
envs:
  FROM_FILE: null
  OVERRIDDEN: yaml
secrets:
  TOKEN: null
  FILLED: null
run: |
  echo "FROM_FILE=$FROM_FILE OVERRIDDEN=$OVERRIDDEN"
  test "$TOKEN" = s3cret-from-file && echo TOKEN_OK
  test "$FILLED" = filled-from-env-file && echo FILLED_OK
"""


def spz(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli_env(tmp_path: Path):
    home = tmp_path / "home"
    env = {**os.environ, "SKYPURZA_HOME": str(home), "SKYPURZA_STAGE": "flagtest", "SKYPURZA_USER": "dana",
           "SKYPURZA_AGENT_KILL_GRACE_S": "1", "SKYPURZA_NATS_PORT": str(free_port()), "COLUMNS": "250",
           "HOME": str(tmp_path)}  # --sync-down writes under ~/sky_logs
    env.pop("SKYPURZA_NATS_URL", None)
    yield env
    for pid in agent_pids(home):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    spz(env, "api", "stop", timeout=60)


def _status(env: dict[str, str], name: str) -> dict | None:
    r = spz(env, "status", "-o", "json", "--refresh")
    assert r.returncode == 0, r.stdout + r.stderr
    return next((c for c in json.loads(r.stdout) if c["name"] == name), None)


def test_the_flags_that_do_something_on_local(cli_env: dict[str, str], tmp_path: Path) -> None:
    env = cli_env
    task = tmp_path / "task.yaml"
    task.write_text(TASK)
    (tmp_path / "vars.env").write_text("FROM_FILE=from-the-file\nOVERRIDDEN=file\nFILLED=filled-from-env-file\n")
    (tmp_path / "secrets.env").write_text("TOKEN=s3cret-from-file\n")

    # ------------------------------------------------------------------ launch with the new flags
    r = spz(env, "launch", "-y", "-c", "fl", str(task), "--env-file", str(tmp_path / "vars.env"),
            "--env", "OVERRIDDEN=flag", "--secret-file", str(tmp_path / "secrets.env"),
            "--ports", "8080", "--ports", "9000-9001", "-i", "30")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FROM_FILE=from-the-file OVERRIDDEN=flag" in r.stdout  # --env over --env-file
    assert "TOKEN_OK" in r.stdout and "FILLED_OK" in r.stdout  # --secret-file; env-file fills declared secrets

    # ------------------------------------------------------------------ status --ip / --endpoints / -v
    ip = spz(env, "status", "--ip", "fl")
    assert ip.returncode == 0 and ip.stdout.strip() == "127.0.0.1", ip.stdout + ip.stderr
    ends = spz(env, "status", "--endpoints", "fl")
    assert ends.stdout.splitlines() == ["8080: 127.0.0.1:8080", "9000: 127.0.0.1:9000", "9001: 127.0.0.1:9001"]
    one = spz(env, "status", "--endpoint", "9001", "fl")
    assert one.returncode == 0 and one.stdout.strip() == "127.0.0.1:9001"
    closed = spz(env, "status", "--endpoint", "7777", "fl")
    assert closed.returncode == 1 and "not open" in closed.stderr
    assert spz(env, "status", "--ip").returncode == 2  # exactly one cluster
    verbose = spz(env, "status", "-v")
    assert "HEAD IP" in verbose.stdout and "8080,9000-9001" in verbose.stdout and "dana" in verbose.stdout
    assert _status(env, "fl")["autostop"] == 30

    # ------------------------------------------------------------------ exec -c, exec --async
    r = spz(env, "exec", "-c", "fl", "echo", "via-dash-c")
    assert r.returncode == 0 and "via-dash-c" in r.stdout, r.stdout + r.stderr
    repo = tmp_path / "repo"  # --git-url/--git-ref: the workdir is this repository at that ref
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@e", "-C", str(repo)]
    repo.mkdir()
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "hello.txt").write_text("from-main\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    subprocess.run([*git, "checkout", "-q", "-b", "feature"], check=True)
    (repo / "hello.txt").write_text("from-feature\n")
    subprocess.run([*git, "commit", "-q", "-am", "two"], check=True)
    subprocess.run([*git, "checkout", "-q", "main"], check=True)
    r = spz(env, "exec", "fl", "--git-url", f"file://{repo}", "--git-ref", "feature", "cat hello.txt")
    assert r.returncode == 0 and "from-feature" in r.stdout, r.stdout + r.stderr
    started = time.monotonic()
    r = spz(env, "exec", "fl", "--async", "sleep 600")
    assert r.returncode == 0, r.stdout + r.stderr
    assert time.monotonic() - started < 30 and "Job 4 queued" in r.stderr  # returned without waiting for it

    # ------------------------------------------------------------------ logs -w, --sync-down, --provision
    r = spz(env, "logs", "fl", "1", "--no-follow", "-w", "0")
    assert "TOKEN_OK" in r.stdout, r.stdout + r.stderr
    assert spz(env, "logs", "fl", "1", "-w", "3").returncode == 1  # a one-node job has no worker 3
    r = spz(env, "logs", "fl", "1", "--sync-down")
    assert r.returncode == 0, r.stdout + r.stderr
    synced = tmp_path / "sky_logs" / "fl" / "1" / "rank-0.log"
    assert "FROM_FILE=from-the-file OVERRIDDEN=flag" in synced.read_text() and str(synced) in r.stdout
    prov = spz(env, "logs", "fl", "--provision")
    assert prov.returncode == 0 and "task_submitted" in prov.stdout and "cluster_provisioned" in prov.stdout
    assert "node_ready" in prov.stdout
    auto = spz(env, "logs", "fl", "--autostop")
    assert auto.returncode == 0
    assert spz(env, "logs", "fl", "--hook", "setup").returncode == 2

    # ------------------------------------------------------------------ stop --graceful, start -i --down
    r = spz(env, "stop", "-y", "fl", "--graceful", "--graceful-timeout", "60")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cancelling job(s) 4 first" in r.stdout
    q = json.loads(spz(env, "queue", "fl", "-o", "json").stdout)
    assert {j["job_id"]: j["status"] for j in q}[4] == "CANCELLED", q
    r = spz(env, "start", "fl", "-i", "45", "--down")
    assert r.returncode == 0, r.stdout + r.stderr
    c = _status(env, "fl")
    assert c["status"] == "UP" and c["autostop"] == 45 and c["autodown"] is True, c
    assert spz(env, "start", "fl", "--down").returncode == 2  # --down needs -i

    # ------------------------------------------------------------------ autostop --wait-for
    r = spz(env, "autostop", "fl", "-i", "600", "--wait-for", "none")
    assert r.returncode == 0 and "whatever runs" in r.stdout, r.stdout + r.stderr

    # ------------------------------------------------------------------ managed jobs: --tail, --controller, queue
    r = spz(env, "jobs", "launch", "-y", "-n", "counter", "for i in $(seq 1 12); do echo line-$i; done")
    assert r.returncode == 0, r.stdout + r.stderr
    jobs = json.loads(spz(env, "jobs", "queue", "-o", "json").stdout)
    job_id = str(jobs[0]["id"])
    tail = spz(env, "jobs", "logs", job_id, "--no-follow", "--tail", "3")
    assert tail.stdout.splitlines() == ["line-10", "line-11", "line-12"], tail.stdout + tail.stderr
    ctl = spz(env, "jobs", "logs", job_id, "--controller")
    assert "managed_job_submitted" in ctl.stdout and "SUCCEEDED" in ctl.stdout, ctl.stdout + ctl.stderr
    assert len(json.loads(spz(env, "jobs", "queue", "-o", "json", "--since", "1h").stdout)) == 1
    assert json.loads(spz(env, "jobs", "queue", "-o", "json", "--before", "2000-01-01").stdout) == []
    assert json.loads(spz(env, "jobs", "queue", "-o", "json", "--status", "FAILED").stdout) == []
    assert len(json.loads(spz(env, "jobs", "queue", "-o", "json", "--status", "SUCCEEDED", "-l", "1").stdout)) == 1
    assert json.loads(spz(env, "jobs", "queue", "-o", "json", "--infra", "aws").stdout) == []
    bad = spz(env, "jobs", "queue", "--status", "DONE")
    assert bad.returncode == 2 and "SUCCEEDED" in bad.stderr

    # ------------------------------------------------------------------ status shows managed jobs in progress
    r = spz(env, "jobs", "launch", "-y", "-d", "-n", "sleeper", "sleep 600")
    assert r.returncode == 0, r.stdout + r.stderr
    sleeper = str(json.loads(spz(env, "jobs", "queue", "-o", "json", "-s").stdout)[0]["id"])
    shown = spz(env, "status")
    assert "Managed jobs in progress" in shown.stdout and "sleeper" in shown.stdout, shown.stdout
    assert "Managed jobs in progress" not in spz(env, "status", "--no-show-managed-jobs").stdout
    r = spz(env, "jobs", "cancel", "-y", sleeper, "--graceful", "--graceful-timeout", "120")
    assert r.returncode == 0 and "CANCELLED" in r.stdout and "note: --graceful changes nothing" in r.stderr, \
        r.stdout + r.stderr
    assert spz(env, "jobs", "cancel", "-y", sleeper, "--task", "2").returncode == 2

    # ------------------------------------------------------------------ -r retries only for want of capacity
    started = time.monotonic()
    r = spz(env, "launch", "-y", "-c", "nowhere", "-r", "--infra", "local", "--gpus", "H100:8", "echo x")
    assert r.returncode == 1 and "no placement" in r.stderr, r.stdout + r.stderr
    assert "submitting again" not in r.stderr and time.monotonic() - started < 60

    r = spz(env, "launch", "-y", "-c", "later", "--async", "-i", "5", "--wait-for", "jobs", "echo x")
    assert r.returncode == 2 and "spz autostop later -i 5 --wait-for jobs" in r.stderr, r.stdout + r.stderr
    assert _status(env, "later") is None, "nothing was submitted"

    # ------------------------------------------------------------------ cost-report -a: every cluster, all time
    r = spz(env, "cost-report", "-a")
    assert r.returncode == 0 and "Cost by cluster" in r.stdout, r.stdout + r.stderr
    assert spz(env, "cost-report", "-a", "--days", "3").returncode == 2

    # ------------------------------------------------------------------ flags that change nothing say so
    r = spz(env, "queue", "fl", "-u")
    assert r.returncode == 0 and "note: -u/--all-users changes nothing" in r.stderr

    # ------------------------------------------------------------------ down --graceful
    r = spz(env, "down", "-y", "fl", "--graceful")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _status(env, "fl") is None


def test_down_purge_drops_a_cluster_nothing_tears_down(nats_server, tmp_path: Path) -> None:
    """A cluster whose teardown no provisioner confirms (here: a NATS with no services at all):
    without --purge down gives up and the cluster stays; with it, the cluster leaves the records."""
    import asyncio
    from datetime import datetime, timezone

    from nats_fixtures import connect_bus

    from skypurza.events.models import Candidate, ClusterProvisioned, NodeInfo

    async def provisioned() -> None:
        bus = await connect_bus(nats_server, "purgetest")
        try:
            await bus.publish(ClusterProvisioned(
                cluster="broken", task_id="t1", placement_id="p1", candidate=Candidate(infra="local"),
                nodes=[NodeInfo(rank=0, instance_id="gone", private_ip="127.0.0.1")], hourly_price_micros=0,
                launched_at=datetime.now(timezone.utc)))
        finally:
            await bus.close()

    asyncio.run(provisioned())
    env = {**os.environ, "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_STAGE": "purgetest",
           "SKYPURZA_NATS_URL": nats_server.url, "COLUMNS": "200"}

    def listed() -> list[str]:
        r = spz(env, "status", "-o", "json")
        assert r.returncode == 0, r.stdout + r.stderr
        return [c["name"] for c in json.loads(r.stdout)]

    assert listed() == ["broken"]
    r = spz(env, "down", "-y", "broken", "--timeout", "2")
    assert r.returncode == 1 and "not confirmed" in r.stderr, r.stdout + r.stderr
    assert listed() == ["broken"]
    r = spz(env, "down", "-y", "broken", "--timeout", "2", "--purge")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "purged" in r.stderr and "may still run" in r.stderr
    assert listed() == []


def test_api_start_port_and_foreground(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_STAGE": "apitest", "COLUMNS": "200"}
    env.pop("SKYPURZA_NATS_URL", None)
    env.pop("SKYPURZA_NATS_PORT", None)
    try:
        r = spz(env, "api", "start", "--nats-port", str(port))
        assert r.returncode == 0, r.stdout + r.stderr
        st = json.loads(spz(env, "api", "status", "-o", "json").stdout)
        assert st["nats_url"].endswith(f":{port}"), st
        clash = spz(env, "api", "start", "--nats-port", str(free_port()))
        assert clash.returncode == 1 and "already runs" in clash.stderr
    finally:
        spz(env, "api", "stop", timeout=60)
    # --foreground: the supervisor in the command's own process, until it is told to stop
    proc = subprocess.Popen([sys.executable, "-m", "skypurza.cli.main", "api", "start", "--foreground"], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            st = json.loads(spz(env, "api", "status", "-o", "json").stdout)
            if st["running"] and st["services"] and all(s["state"] == "running" for s in st["services"]):
                break
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.5)
        else:
            pytest.fail("the foreground control plane did not come up")
        supervisor = next(p for p in st["processes"] if p["name"] == "supervisor")
        assert supervisor["pid"] == proc.pid, "the command itself is the supervisor"
        assert st["nats_url"].endswith(f":{port}"), "--nats-port is kept for the stage's next starts"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert not json.loads(spz(env, "api", "status", "-o", "json").stdout)["running"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        spz(env, "api", "stop", timeout=60)
