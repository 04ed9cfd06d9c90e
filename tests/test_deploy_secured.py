"""`spz api start --deploy` secures its bus: real processes end to end.

The `spz` CLI starts the stage's supervisor, a nats-server with the generated authorization
block, every service (`spz serve`'s whole set: the open ones and the platform's ledger, dispatch,
observability, alerts ...) each as its own bus user, the API server as its user and local node
agents as theirs. A member's job runs through the API; an anonymous client is refused; the
public user reads the job's CloudEvent; and nats-server logs not one permission violation.
Broken credentials are one line, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import nats
import pytest
from leftovers import kill_stage
from nats_fixtures import kill_processes_using

from skypurza.cli.busauth import deployment_contracts
from skypurza.events import naming
from skypurza.events.natscreds import CREDS_ENV
from skypurza.events.natsserver import free_port
from skypurza.services.mirror.cloudevent import CONTENT_TYPE

STAGE = "secdeploy"
VIOLATIONS = ("Publish Violation", "Subscription Violation")


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "SKYPURZA_HOME": str(home), "SKYPURZA_STAGE": STAGE, "SKYPURZA_USER": "osuser",
           "SKYPURZA_AGENT_KILL_GRACE_S": "1", "COLUMNS": "200", **extra}
    for var in ("SKYPURZA_NATS_URL", "SKYPURZA_NATS_PORT", "SKYPURZA_API_SERVER", "SKYPURZA_API_TOKEN",
                "SKYPILOT_API_SERVER_ENDPOINT", "SKYPILOT_API_SERVER_LOCAL_PORT", CREDS_ENV):
        if var not in extra:
            env.pop(var, None)
    return env


def spz(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def serve(env: dict[str, str], url: str, creds_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.serve", "--nats", url, "--stage", STAGE,
                           "--services", "optimizer", "--nats-creds-dir", str(creds_dir)],
                          env=env, capture_output=True, text=True, timeout=30)


@pytest.fixture
def home(tmp_path: Path):
    h = tmp_path / "home"
    yield h
    spz(_env(h), "api", "stop", timeout=90)
    sd = h / STAGE
    kill_stage(h, STAGE)  # whatever a failure left
    try:  # local node agents (their own sessions) name the bus they were given
        kill_processes_using(f"nats://127.0.0.1:{(sd / 'nats.port').read_text().strip()}")
    except (OSError, ValueError):
        pass


async def _public_reads_the_job(nats_url: str, public: dict, api: str, member: str) -> tuple[dict, str]:
    """Subscribe as the public user, submit a job through the API as `member`; the job's end as
    a CloudEvent (and its content type)."""
    seen: list[tuple[dict, str]] = []

    async def on_public(msg) -> None:
        seen.append((json.loads(msg.data), (msg.headers or {}).get("Content-Type", "")))

    nc = await nats.connect(nats_url, user=public["user"], password=public["password"],
                            inbox_prefix=naming.inbox_prefix(public["user"]), allow_reconnect=False, connect_timeout=5)
    try:
        await nc.subscribe(naming.public_filter(STAGE), cb=on_public)
        await nc.flush()
        async with httpx.AsyncClient(base_url=api, headers={"Authorization": f"Bearer {member}"}, timeout=20) as c:
            r = await c.post("/api/v1/tasks", json={"task": {"resources": {"infra": "local"},
                                                               "run": "echo secured-hello"},
                                                      "cluster": "sec1", "down": True})
            assert r.status_code == 202, r.text
        deadline = time.monotonic() + 40
        while True:
            done = [x for x in seen if x[0]["type"].startswith("io.skypurza.job_succeeded")]
            if done:
                return done[0]
            assert time.monotonic() < deadline, [c["type"] for c, _ in seen]
            await asyncio.sleep(0.1)
    finally:
        await nc.close()


def test_a_deployment_secures_its_bus_and_a_members_job_runs_through_it(home: Path) -> None:
    env = _env(home)
    port, nats_port = free_port(), free_port()
    started = spz(env, "api", "start", "--deploy", "--host", "127.0.0.1", "--port", str(port),
                  "--nats-port", str(nats_port), "-o", "json")
    assert started.returncode == 0, started.stderr
    st = json.loads(started.stdout)
    assert st["bus_secured"] is True and st["api_deploy"] is True
    nats_url, api = st["nats_url"], st["api_url"]
    admin = st["admin"]["token"]

    # One 0600 file per user (every service's contract, control, public); no password elsewhere.
    sd = home / STAGE
    files = {f.stem: f for f in (sd / "bus-users").glob("*.json")}
    assert set(files) == {c.name for c in deployment_contracts()} | {naming.BUS_CONTROL_USER, naming.BUS_PUBLIC_USER}
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files.values())
    assert stat.S_IMODE((sd / "nats-auth.conf").stat().st_mode) == 0o600
    passwords = {name: json.loads(f.read_text())["password"] for name, f in files.items()}
    status = spz(env, "api", "status", "-o", "json")
    assert status.returncode == 0 and json.loads(status.stdout)["bus_secured"] is True
    assert "secured" in spz(env, "api", "status").stdout
    shown = started.stdout + started.stderr + status.stdout + (sd / "jetstream" / "nats.conf").read_text()
    assert not [n for n, p in passwords.items() if p in shown]

    async def anonymous() -> None:
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(nats_url, allow_reconnect=False, connect_timeout=5)

    asyncio.run(anonymous())
    # The CLI on the server host is the deployment's operator (the control user's 0600 file);
    # the admin adds a member through the API server, as from a laptop.
    team = spz(env, "teams", "add", "research")
    assert team.returncode == 0, team.stderr
    made = httpx.post(f"{api}/api/v1/users", json={"name": "alice", "team": "research", "role": "member"},
                      headers={"Authorization": f"Bearer {admin}"}, timeout=20)
    assert made.status_code == 201, made.text
    member = made.json()["token"]

    ce, content_type = asyncio.run(_public_reads_the_job(nats_url, json.loads(files["public"].read_text()), api,
                                                         member))
    assert content_type == CONTENT_TYPE and ce["specversion"] == "1.0"
    assert ce["data"]["cluster"] == "sec1" and (ce["spzuser"], ce["spzteam"]) == ("alice", "research")
    # Its output came back through the API (the API server's user reads the logs stream).
    logs = httpx.get(f"{api}/api/v1/clusters/sec1/jobs/1/logs", params={"follow": "false"},
                     headers={"Authorization": f"Bearer {member}"}, timeout=20)
    assert logs.status_code == 200 and "secured-hello" in logs.text, logs.text[:500]
    # Observability's scrape lists the consumers and the dead letters (its grants): every source up.
    metrics_url = json.loads(spz(env, "api", "status", "-o", "json").stdout)["metrics_url"]
    scrape = httpx.get(metrics_url, timeout=20)
    assert scrape.status_code == 200, scrape.text[-800:]
    assert "consumer_pending_messages" in scrape.text and naming.consumer(STAGE, "optimizer") in scrape.text

    # Bad credentials: one line saying which file and what is wrong (or that the bus refused it).
    bad = home / "bad-creds"
    gone = serve(env, nats_url, bad)
    assert gone.returncode == 2 and str(bad / "optimizer.json") in gone.stderr and "Traceback" not in gone.stderr
    bad.mkdir()
    (bad / "optimizer.json").write_text("{not json")
    broken = serve(env, nats_url, bad)
    assert broken.returncode == 2 and "not JSON" in broken.stderr and "Traceback" not in broken.stderr
    (bad / "optimizer.json").write_text(json.dumps({"user": "optimizer", "password": "guess"}))
    wrong = serve(env, nats_url, bad)
    assert wrong.returncode == 2 and "refused user optimizer" in wrong.stderr and "Traceback" not in wrong.stderr
    cli = spz(_env(home, **{CREDS_ENV: str(bad / "missing.json")}), "status")
    assert cli.returncode == 1 and "missing.json" in cli.stderr and "Traceback" not in cli.stderr

    # Not one refusal of what the services, the API server or the agent did; no password logged.
    log = (sd / "logs" / "nats-server.log").read_text(errors="replace")
    assert "Server is ready" in log  # the log read is the server's own
    refused = [line for line in log.splitlines() if any(v in line for v in VIOLATIONS)]
    assert not refused, refused[:10]
    for f in (sd / "logs").glob("*.log"):
        text = f.read_text(errors="replace")
        assert not [n for n, p in passwords.items() if p in text], f
