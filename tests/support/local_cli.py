"""`spz` as a user runs it on the `local` infra, for end-to-end tests: an environment of its own
(home, stage, NATS port) and a teardown that leaves nothing running, on failure too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from skypurza.events.natsserver import free_port

REPO = Path(__file__).resolve().parent.parent.parent


def agent_pids(home: Path) -> list[int]:
    """The node agents of every local cluster under `home`, as their records name them."""
    pids = []
    for record in home.glob("*/clusters/*/cluster.json"):
        try:
            nodes = json.loads(record.read_text()).get("nodes", [])
        except (OSError, ValueError):
            continue
        pids += [n["pid"] for n in nodes if isinstance(n, dict) and n.get("pid")]
    return pids


@contextmanager
def local_cli(tmp_path: Path, stage: str) -> Iterator[dict[str, str]]:
    home = tmp_path / "home"
    env = {**os.environ, "SKYPURZA_HOME": str(home), "SKYPURZA_STAGE": stage, "SKYPURZA_AGENT_KILL_GRACE_S": "1",
           "SKYPURZA_NATS_PORT": str(free_port()), "COLUMNS": "200",
           "SKYPURZA_METRICS_PORT": str(free_port())}  # not the default 9464: a developer's own plane may hold it
    env.pop("SKYPURZA_NATS_URL", None)
    try:
        yield env
    finally:
        for pid in agent_pids(home):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        subprocess.run([sys.executable, "-m", "skypurza.cli.main", "api", "stop"], env=env, capture_output=True,
                       timeout=60)


def spz(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
