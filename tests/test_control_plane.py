"""`spz api start|status|stop` as a user runs them: real processes, nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from skypurza.cli.control import pid_alive


def spz(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_api_start_status_stop_leaves_nothing_behind(tmp_path):
    env = {**os.environ, "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_STAGE": "cptest"}
    env.pop("SKYPURZA_NATS_URL", None)
    first = spz("api", "start", "-o", "json", env=env)
    assert first.returncode == 0, first.stderr
    started = json.loads(first.stdout)
    assert started["running"] and not started["already_running"]
    assert started["nats_url"].startswith("nats://127.0.0.1:")
    pids = [p["pid"] for p in started["processes"]]
    assert [p["name"] for p in started["processes"]] == ["supervisor", "nats-server", "services", "api-server",
                                                         "cli-worker"]
    assert all(pid_alive(p) for p in pids)
    assert started["state_dir"] == str(tmp_path / "home" / "cptest")

    again = json.loads(spz("api", "start", "-o", "json", env=env).stdout)
    assert again["already_running"] is True
    assert [p["pid"] for p in again["processes"]] == pids, "a second start must not start anything"

    status = spz("api", "status", "-o", "json", env=env)
    assert status.returncode == 0
    st = json.loads(status.stdout)
    assert st["nats_url"] == started["nats_url"] and all(p["alive"] for p in st["processes"])

    stopped = spz("api", "stop", "-o", "json", env=env)
    assert stopped.returncode == 0
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in pids), "api stop left a process behind"
    after = spz("api", "status", "-o", "json", env=env)
    assert after.returncode == 1 and json.loads(after.stdout)["running"] is False
