"""Exactly one control plane per stage, whatever the concurrency (issue 11 §1).

Real `spz` processes started at once on a fresh SKYPURZA_HOME; the processes of the stage are
counted from /proc by their command lines (cli/planeprocs.py), so a second, unrecorded
nats-server or services process would be seen.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from leftovers import kill_stage
from local_cli import agent_pids

from skypurza.cli import planeprocs
from skypurza.cli.supervisor import api_ready
from skypurza.events import naming

ROUNDS = 20
# First-use launches start the same lock path as `api start` (the test above runs it ROUNDS times)
# and eight CLI processes besides: fewer rounds keep the suite's time (about 9 s a round on 2 cores).
FIRST_USE_ROUNDS = 10
STARTERS = 8
# One control plane: its supervisor and the four processes it supervises (the CLI worker too).
ONE_OF_EACH = Counter({"supervisor": 1, "nats-server": 1, "services": 1, "api-server": 1, "cli-worker": 1})


def _env(home: Path, stage: str) -> dict[str, str]:
    env = {**os.environ, "SKYPURZA_HOME": str(home), "SKYPURZA_STAGE": stage, "SKYPURZA_AGENT_KILL_GRACE_S": "1"}
    env.pop("SKYPURZA_NATS_URL", None)
    env.pop("SKYPURZA_NATS_PORT", None)
    return env


def _spawn(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "skypurza.cli.main", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _roles(home: Path, stage: str) -> Counter:
    sd = home / stage
    return Counter(p.role for p in planeprocs.find(sd, sd / "jetstream" / "nats.conf", stage))


def _stop(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", "api", "stop", "-o", "json"], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def homes(tmp_path: Path):
    made: list[tuple[Path, str]] = []

    def new(i: int) -> tuple[Path, dict[str, str]]:
        home, stage = tmp_path / f"home{i}", "locktest"
        made.append((home, stage))
        return home, _env(home, stage)

    yield new
    for home, stage in made:  # whatever a failing round left behind
        for pid in agent_pids(home):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        kill_stage(home, stage)


def test_classify_recognises_only_control_plane_processes():
    sd, conf = "/h/dev", "/h/dev/jetstream/nats.conf"
    assert planeprocs.classify(["/bin/nats-server", "-c", conf], sd, conf, "dev", None) == "nats-server"
    assert planeprocs.classify(["/bin/nats-server", "-c", "/h/other/jetstream/nats.conf"], sd, conf, "dev", None) is None
    assert planeprocs.classify(["python", "-m", "skypurza.cli.supervisor", "--stage", "dev", "--control-plane", sd],
                               sd, conf, "dev", None) == "supervisor"
    assert planeprocs.classify(["python", "-m", "skypurza.cli.serve", "--nats", "nats://x:1", "--stage", "dev",
                                "--control-plane", sd], sd, conf, "dev", None) == "services"
    # An older services process has no marker: recognised by stage and the recorded URL only.
    old = ["python", "-m", "skypurza.cli.serve", "--nats", "nats://x:1", "--stage", "dev"]
    assert planeprocs.classify(old, sd, conf, "dev", "nats://x:1") == "services"
    assert planeprocs.classify(old, sd, conf, "dev", "nats://x:2") is None
    assert planeprocs.classify(["python", "-m", "skypurza.services.api", "--nats", "nats://x:1", "--control-plane", sd],
                               sd, conf, "dev", None) == "api-server"
    assert planeprocs.classify(["python", "-m", "skypurza.services.api", "--nats", "nats://x:1"],
                               sd, conf, "dev", None) is None, "an API server of no stage's control plane"
    # A node agent's home is under the state directory: it is a node, never the control plane.
    agent = ["python", "-m", "skypurza.services.agent", "--stage", "dev", "--home", sd + "/clusters/c/node-0"]
    assert planeprocs.classify(agent, sd, conf, "dev", None) is None


def test_concurrent_api_starts_make_one_control_plane_and_stop_leaves_nothing(homes):
    for i in range(ROUNDS):
        home, env = homes(i)
        procs = [_spawn(env, "api", "start", "-o", "json") for _ in range(STARTERS)]
        outs = [p.communicate(timeout=180) for p in procs]
        assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
        started = [json.loads(o[0]) for o in outs]
        assert sum(not s["already_running"] for s in started) == 1, f"round {i}: more than one starter started"
        assert len({s["nats_url"] for s in started}) == 1, f"round {i}: starters saw different servers"
        assert len({s["api_url"] for s in started}) == 1 and started[0]["api_url"], f"round {i}: API servers"
        assert all(next(p for p in s["processes"] if p["name"] == "api-server")["ready"] for s in started), \
            f"round {i}: a starter returned before the API server answered /api/v1/health"
        assert api_ready(started[0]["api_url"], timeout=5), f"round {i}"
        assert _roles(home, "locktest") == ONE_OF_EACH, f"round {i}"
        port = int((home / "locktest" / "nats.port").read_text())
        assert started[0]["nats_url"].endswith(f":{port}")
        stopped = _stop(env)
        assert stopped.returncode == 0, stopped.stderr
        assert {p["name"] for p in json.loads(stopped.stdout)["stopped"]} == set(ONE_OF_EACH)
        assert _roles(home, "locktest") == Counter(), f"round {i}: api stop left a process behind"


def test_concurrent_first_use_launches_share_one_control_plane(homes, tmp_path):
    task = tmp_path / "hi.yaml"
    task.write_text("run: echo hi\n")
    for i in range(FIRST_USE_ROUNDS):
        home, env = homes(100 + i)
        procs = [_spawn(env, "launch", "--async", "-y", "-c", f"c{n}", "--infra", "local", str(task))
                 for n in range(STARTERS)]
        outs = [p.communicate(timeout=180) for p in procs]
        assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
        assert _roles(home, "locktest") == ONE_OF_EACH, f"round {i}"
        assert _stop(env).returncode == 0
        assert _roles(home, "locktest") == Counter(), f"round {i}: api stop left a process behind"
        for pid in agent_pids(home):  # the clusters are not the control plane's: tidy them here
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def test_the_supervisor_restarts_a_dead_child_on_the_same_port_and_takes_its_children_when_killed(homes):
    home, env = homes(999)
    first = subprocess.run([sys.executable, "-m", "skypurza.cli.main", "api", "start", "-o", "json"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    state_file = naming.state_dir("locktest", home) / "api.json"
    before = json.loads(state_file.read_text())
    os.kill(before["processes"]["nats-server"]["pid"], signal.SIGKILL)
    os.kill(before["processes"]["services"]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    after = before
    while time.monotonic() < deadline:
        after = json.loads(state_file.read_text())
        if after["processes"]["services"].get("ready") and after["processes"]["nats-server"]["restarts"] >= 1 \
                and after["processes"]["services"]["restarts"] >= 1:
            break
        time.sleep(0.1)
    assert after["processes"]["nats-server"]["restarts"] == 1 and after["processes"]["services"]["restarts"] == 1
    assert after["processes"]["nats-server"]["last_exit"] == -signal.SIGKILL
    assert after["nats_url"] == before["nats_url"], "a restarted server must keep the stage's port"
    assert _roles(home, "locktest") == ONE_OF_EACH
    # A CLI call while the supervisor lives uses it (no second control plane).
    again = json.loads(subprocess.run([sys.executable, "-m", "skypurza.cli.main", "api", "start", "-o", "json"],
                                      env=env, capture_output=True, text=True, timeout=120).stdout)
    assert again["already_running"] is True
    # SIGKILL the supervisor: its children go with it (PR_SET_PDEATHSIG), nothing is orphaned.
    os.kill(before["supervisor"]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 20
    while _roles(home, "locktest") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _roles(home, "locktest") == Counter()
    restarted = subprocess.run([sys.executable, "-m", "skypurza.cli.main", "api", "start", "-o", "json"], env=env,
                               capture_output=True, text=True, timeout=120)
    assert restarted.returncode == 0 and json.loads(restarted.stdout)["nats_url"] == before["nats_url"]
    assert _stop(env).returncode == 0
    assert _roles(home, "locktest") == Counter()


def test_api_stop_finds_unrecorded_processes_of_the_stage(homes):
    """A control plane whose api.json was lost (a crash between spawn and write): stop still
    finds every process by its command line, and a start never opens the store beside it."""
    home, env = homes(998)
    assert subprocess.run([sys.executable, "-m", "skypurza.cli.main", "api", "start"], env=env,
                          capture_output=True, timeout=120).returncode == 0
    (home / "locktest" / "api.json").unlink()
    assert _roles(home, "locktest") == ONE_OF_EACH
    start = subprocess.run([sys.executable, "-m", "skypurza.cli.main", "api", "start", "-o", "json"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert start.returncode == 0, start.stderr
    assert _roles(home, "locktest") == ONE_OF_EACH
    (home / "locktest" / "api.json").unlink()
    stopped = _stop(env)
    assert stopped.returncode == 0
    assert len(json.loads(stopped.stdout)["stopped"]) == len(ONE_OF_EACH)
    assert _roles(home, "locktest") == Counter()


def test_down_all_right_after_launches_leaves_no_cluster_and_no_agent(homes, tmp_path):
    """`spz down -a` racing launches still in flight (INIT) reaches them too: nothing the user
    launched is left running after it."""
    home, env = homes(997)
    task = tmp_path / "hi.yaml"
    task.write_text("run: echo hi\n")
    procs = [_spawn(env, "launch", "--async", "-y", "-c", f"r{n}", "--infra", "local", str(task)) for n in range(4)]
    assert all(p.wait(180) == 0 for p in procs)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # every launch placed (INIT) or up
        out = subprocess.run([sys.executable, "-m", "skypurza.cli.main", "status", "-o", "json"], env=env,
                             capture_output=True, text=True, timeout=120)
        if out.returncode == 0 and len(json.loads(out.stdout)) == 4:
            break
        time.sleep(0.1)
    down = subprocess.run([sys.executable, "-m", "skypurza.cli.main", "down", "-a", "-y"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert down.returncode == 0, down.stderr
    assert all(f"Cluster r{n}: TERMINATED" in down.stdout + down.stderr for n in range(4)), down.stdout + down.stderr
    status = subprocess.run([sys.executable, "-m", "skypurza.cli.main", "status", "-o", "json"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert json.loads(status.stdout) == []
    deadline = time.monotonic() + 20
    while any(_alive_pid(p) for p in agent_pids(home)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in agent_pids(home) if _alive_pid(p)], "an agent outlived spz down -a"
    assert _stop(env).returncode == 0


def _alive_pid(pid: int) -> bool:
    from skypurza.events.processes import pid_alive

    return pid_alive(pid)


def test_a_start_whose_services_cannot_start_says_why_and_leaves_nothing(homes):
    """The services process dies before it is ready (here a setting that is not a number): `spz
    api start` exits 1 with the error, not a traceback, and no supervisor is left restarting it."""
    home, env = homes(996)
    bad = {**env, "SKYPURZA_PROVISIONER_CONCURRENCY": "not-a-number"}
    t0 = time.monotonic()
    start = subprocess.run([sys.executable, "-m", "skypurza.cli.main", "api", "start"], env=bad,
                           capture_output=True, text=True, timeout=120)
    assert start.returncode == 1
    assert "keeps exiting before it is ready" in start.stderr and "not-a-number" in start.stderr, start.stderr
    assert time.monotonic() - t0 < 60
    assert _roles(home, "locktest") == Counter(), "a failed start left its control plane running"
    # The same stage starts once the setting is fixed.
    good = subprocess.run([sys.executable, "-m", "skypurza.cli.main", "api", "start"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr
    assert _stop(env).returncode == 0


def test_a_child_between_fork_and_exec_is_not_a_second_process(tmp_path):
    """The services process forking a node agent shows its own command line in the child until
    the exec: counted once (a chaos round once saw 'two services' that way)."""
    sd = tmp_path / "st"
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(30)\nelse:\n    time.sleep(30)\n"
    parent = subprocess.Popen([sys.executable, "-c", code, "-m", "skypurza.cli.serve", "--control-plane", str(sd)],
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        seen = []
        while time.monotonic() < deadline:
            children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
            seen = planeprocs.find(sd, sd / "jetstream" / "nats.conf", "locktest")
            if children:
                break
            time.sleep(0.05)
        assert children, "the fork did not happen"
        assert [(p.pid, p.role) for p in seen] == [(parent.pid, "services")]
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # its own session: the forked child goes too
        parent.wait(10)


def test_the_first_command_finds_the_projections_answering(homes):
    """A projection's query (`spz cost-report`, `spz audit`) as the very first command of a fresh
    home: it starts the control plane and must find the ledger and status services answering,
    not "is not running" (the services said ready before their queries were served)."""
    for i in range(2):
        home, env = homes(200 + i)
        first = subprocess.run([sys.executable, "-m", "skypurza.cli.main", "cost-report", "-o", "json"], env=env,
                               capture_output=True, text=True, timeout=180)
        assert first.returncode == 0, first.stderr
        assert "not running" not in first.stderr
        assert _stop(env).returncode == 0
