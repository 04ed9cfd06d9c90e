"""The control plane's logs stay bounded (cli/logrotate.py): a file past its limit is copied to
`<log>.1` and cut in place, while the process writing it goes on writing to it.

Real processes: a child appending to its log as the supervisor's children do (opened for
appending, by the parent), and `spz api start` with a 1 MiB limit whose services' log is pushed
past it; `spz api logs -f` keeps following across the cut.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from leftovers import kill_stage

from skypurza.cli.logrotate import max_bytes, older, rotate_if_large
from skypurza.events.settings import SettingsError

STAGE = "logcut"


def test_the_limit_is_read_and_checked_at_the_edge() -> None:
    assert max_bytes({}, {}) == 64 << 20
    assert max_bytes({"SKYPURZA_LOG_MAX_MB": "3"}, {}) == 3 << 20
    assert max_bytes({}, {"logs": {"max_mb": 5}}) == 5 << 20
    for bad in ("0", "-1", "lots", "100001"):
        with pytest.raises(SettingsError, match="SKYPURZA_LOG_MAX_MB"):
            max_bytes({"SKYPURZA_LOG_MAX_MB": bad}, {})


def test_a_writer_keeps_writing_to_the_start_of_the_cut_file(tmp_path: Path) -> None:
    log = tmp_path / "services.log"
    writer = ("import sys, time\n"
              "for i in range(400):\n"
              "    sys.stdout.write(f'line {i:04d} ' + 'x' * 90 + '\\n'); sys.stdout.flush(); time.sleep(0.002)\n")
    with open(log, "ab") as out:  # as Child.spawn hands a child its log
        child = subprocess.Popen([sys.executable, "-c", writer], stdout=out, stderr=subprocess.STDOUT)
    cuts = 0
    while child.poll() is None:
        cuts += rotate_if_large(log, 4096)
        time.sleep(0.01)
    cuts += rotate_if_large(log, 4096)
    assert child.returncode == 0 and cuts >= 3
    kept = log.read_bytes()
    assert len(kept) <= 4096 + 100 * 10  # cut within a look: no hole of NULs where the old end was
    assert b"\0" not in kept and kept.startswith(b"line ")
    assert kept.rstrip().endswith(b"line 0399 " + b"x" * 90)  # the last line, after every cut
    assert older(log).read_bytes().startswith(b"line ") and b"\0" not in older(log).read_bytes()
    assert not rotate_if_large(tmp_path / "absent.log", 1)


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "SKYPURZA_HOME": str(home), "SKYPURZA_STAGE": STAGE, "SKYPURZA_USER": "osuser", **extra}
    for var in ("SKYPURZA_NATS_URL", "SKYPURZA_NATS_PORT", "SKYPURZA_API_SERVER", "SKYPURZA_API_TOKEN",
                "SKYPILOT_API_SERVER_ENDPOINT"):
        env.pop(var, None)
    return env


@pytest.fixture
def home(tmp_path: Path):
    h = tmp_path / "home"
    yield h
    subprocess.run([sys.executable, "-m", "skypurza.cli.main", "api", "stop"], env=_env(h), capture_output=True,
                   timeout=90)
    kill_stage(h, STAGE)  # whatever a failure left


def test_the_supervisor_cuts_a_log_past_its_limit_and_logs_f_follows_on(home: Path) -> None:
    env = _env(home, SKYPURZA_LOG_MAX_MB="1", SKYPURZA_NATS_PORT=str(_free_port()))
    started = subprocess.run([sys.executable, "-m", "skypurza.cli.main", "api", "start"], env=env,
                             capture_output=True, text=True, timeout=150)
    assert started.returncode == 0, started.stdout + started.stderr
    log = home / STAGE / "logs" / "services.log"
    follow = subprocess.Popen([sys.executable, "-m", "skypurza.cli.main", "api", "logs", "-f", "--tail", "1"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        time.sleep(1.5)  # the follower is at the end of the file
        with open(log, "ab") as f:  # as if the services had written 2 MiB
            f.write((b"y" * 1023 + b"\n") * 2048)
        deadline = time.monotonic() + 20
        while not older(log).exists() or log.stat().st_size > 1 << 20:
            assert time.monotonic() < deadline, "the supervisor did not cut the services' log"
            time.sleep(0.2)
        assert older(log).stat().st_size > 1 << 20
        with open(log, "ab") as f:  # the next line, written after the cut
            f.write(b"after the cut\n")
        out = b""
        deadline = time.monotonic() + 20
        os.set_blocking(follow.stdout.fileno(), False)
        while b"after the cut" not in out:
            assert time.monotonic() < deadline and follow.poll() is None, out[-500:]
            out += follow.stdout.read() or b""
            time.sleep(0.1)
        supervisor = (home / STAGE / "logs" / "supervisor.log").read_text()
        assert "services's log passed 1 MiB" in supervisor
    finally:
        follow.kill()
        follow.wait(10)


def _free_port() -> int:
    from skypurza.events.natsserver import free_port

    return free_port()
