"""compose.yaml runs a secured bus: real `spz api compose-secrets`, compose.yaml rendered by the
real Compose binary, its NATS nodes' rendered configs run as a real 3-node cluster on loopback.

- the command draws every user's 0600 credentials file, the authorization block and the stage,
  keeps passwords on a second run, and two runs at once write one consistent set;
- each SkyPurza container is handed exactly its own user's file (and SKYPURZA_NATS_CREDS naming
  it), the nodes the block beside their config, and the set-up runs before every service;
- every service `spz api serve` knows (cli/serve.py's and the `skypurza.services` entry points)
  runs in a container of its own, and only the API server's port leaves the host's loopback;
- on the cluster made of the rendered configs (only ports and paths moved to loopback, the
  authorization block and its include exactly as rendered): an anonymous client and a wrong
  password are refused, a service user cannot create a stream, the rendered set-up refuses a
  stage the secrets were not drawn for and then makes the R3 streams as `control`, the
  optimizer's user reads the event log but may not publish an event type it does not emit, and
  the public user publishes nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import nats
import pytest
from compose_bin import compose_binary
from bus_refusal import refused
from nats_fixtures import kill_processes_using
from served_services import every_service

from skypurza.cli.busauth import COMPOSE_CONTAINER_UID, deployment_contracts
from skypurza.cli.serve import SERVICES, load_service
from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.bussettings import BusSettings
from skypurza.events.models import Candidate, PlacementChosen
from skypurza.events.natscluster import (COMPOSE_AUTH_FILE, COMPOSE_CLIENT_PORT, COMPOSE_CONFIG_FILE,
                                          COMPOSE_HTTP_PORT, COMPOSE_ROUTE_PORT, COMPOSE_STORE_DIR,
                                          compose_auth_include, compose_config, compose_nodes)
from skypurza.events.natscreds import CREDS_ENV, credentials_file, read_credentials
from skypurza.events.natsserver import free_port, nats_server_binary
from skypurza.services.observability.settings import DEFAULT_PORT, MetricsSettings

REPO = Path(__file__).resolve().parent.parent
STAGE = "composesec"
NODES = ("nats-1", "nats-2", "nats-3")


def spz(home: Path, *args: str, stage: str = STAGE) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=_env(home, stage),
                          capture_output=True, text=True, timeout=120)


def _env(home: Path, stage: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (CREDS_ENV, "SKYPURZA_NATS_URL", "SKYPURZA_BUS_SECRETS")}
    return {**env, "SKYPURZA_HOME": str(home), "SKYPURZA_STAGE": stage, "COLUMNS": "200"}


def render(secrets: Path, tmp_path: Path) -> dict[str, Any]:
    """compose.yaml as the real Compose binary reads it for STAGE and these secrets."""
    empty = tmp_path / "empty.env"  # not the checkout's .env, should a developer have one
    empty.write_text("")
    env = {**_env(tmp_path / "home", STAGE), "SKYPURZA_BUS_SECRETS": str(secrets)}
    res = subprocess.run([compose_binary(), "--env-file", str(empty), "-f", str(REPO / "compose.yaml"), "config",
                          "--format", "json"], capture_output=True, text=True, cwd=REPO, env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _user_of(name: str, service: dict[str, Any]) -> str:
    """Whose bus user a SkyPurza container should be: the set-up's `control`, the API server's
    `api`, a service's contract name (`spz api serve --services X`)."""
    if name == "bus-setup":
        return naming.BUS_CONTROL_USER
    if name == "api":
        return "api"
    command = service["command"]
    return load_service(command[command.index("--services") + 1]).contract.name


def _mounted(doc: dict[str, Any], service: dict[str, Any]) -> dict[str, Path]:
    """Target in the container -> the host file Compose mounts there."""
    out = {}
    for s in service.get("secrets") or []:
        target = s.get("target") or s["source"]
        out[target if target.startswith("/") else f"/run/secrets/{target}"] = Path(doc["secrets"][s["source"]]["file"])
    return out


@pytest.fixture
def secrets(tmp_path: Path) -> Path:
    root = tmp_path / naming.COMPOSE_SECRETS_DIR
    made = spz(tmp_path / "home", "api", "compose-secrets", str(root), "-o", "json")
    assert made.returncode == 0, made.stderr
    return root


def _passwords(root: Path) -> dict[str, str]:
    return {f.stem: json.loads(f.read_text())["password"] for f in naming.compose_credentials_dir(root).glob("*.json")}


# ------------------------------------------------------------------ the command

def test_the_command_draws_every_users_file_and_keeps_them_when_run_again(tmp_path: Path, secrets: Path) -> None:
    home = tmp_path / "home"
    users = {c.name for c in deployment_contracts()} | {naming.BUS_CONTROL_USER, naming.BUS_PUBLIC_USER}
    first = _passwords(secrets)
    assert set(first) == users and len(set(first.values())) == len(users)
    files = list(naming.compose_credentials_dir(secrets).glob("*.json"))
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert stat.S_IMODE(naming.compose_auth_file(secrets).stat().st_mode) == 0o600
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    assert naming.compose_stage_file(secrets).read_text().strip() == STAGE
    block = naming.compose_auth_file(secrets).read_text()
    assert block.startswith("authorization {") and all(json.dumps(p) in block for p in first.values())
    assert f"{naming.subject_prefix(STAGE)}." in block and "no_auth_user" not in block

    again = spz(home, "api", "compose-secrets", str(secrets), "-o", "json")
    assert again.returncode == 0, again.stderr
    shown = json.loads(again.stdout)
    assert shown["stage"] == STAGE and shown["container_uid"] == COMPOSE_CONTAINER_UID
    # Only the containers' own uid can read 0600 files as mounted (they do not run as root): any
    # other owner, root included, is told to chown.
    assert shown["readable_by_containers"] == (os.getuid() == COMPOSE_CONTAINER_UID)
    assert (f"sudo chown -R {COMPOSE_CONTAINER_UID}" in again.stderr) == (os.getuid() != COMPOSE_CONTAINER_UID)
    assert shown["users"]["optimizer"] == str(credentials_file(naming.compose_credentials_dir(secrets), "optimizer"))
    assert _passwords(secrets) == first  # kept
    assert not [p for p in first.values() if p in again.stdout + again.stderr]  # never printed

    # Two at once into a fresh directory: one set of passwords, the block holding exactly those.
    fresh = tmp_path / "fresh"
    runs = [subprocess.Popen([sys.executable, "-m", "skypurza.cli.main", "api", "compose-secrets", str(fresh)],
                             env=_env(home, STAGE), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    for run in runs:
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
    drawn = _passwords(fresh)
    assert set(drawn) == users
    assert all(json.dumps(p) in naming.compose_auth_file(fresh).read_text() for p in drawn.values())

    # A directory it cannot write: one line, no traceback.
    blocked = tmp_path / "file"
    blocked.write_text("")
    bad = spz(home, "api", "compose-secrets", str(blocked / "sub"))
    assert bad.returncode == 1 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    # The image's user owns what its containers read (Compose mounts the host file as it is).
    assert f"--uid {COMPOSE_CONTAINER_UID} skypurza" in (REPO / "Dockerfile").read_text()


# ------------------------------------------------------------------ the rendered compose file

def test_each_container_gets_only_its_own_users_credentials_and_waits_for_the_set_up(
        tmp_path: Path, secrets: Path) -> None:
    doc = render(secrets, tmp_path)
    services = doc["services"]
    creds_dir = naming.compose_credentials_dir(secrets)
    every_creds_file = {credentials_file(creds_dir, u) for u in _passwords(secrets)}
    skypurza = {n for n in services if n not in NODES}
    assert {"bus-setup", "api", "optimizer", "provisioner", "recovery", "status", "mirror", "ledger", "dispatch",
            "observability", "gpuhealth", "alerts"} == skypurza
    for name in skypurza:
        service = services[name]
        user = _user_of(name, service)
        mounted = _mounted(doc, service)
        own = credentials_file(creds_dir, user)
        assert [p for p in mounted.values() if p in every_creds_file] == [own], name  # its own, no other's
        target = next(t for t, p in mounted.items() if p == own)
        assert service["environment"][CREDS_ENV] == target, name
        assert service["environment"]["SKYPURZA_STAGE"] == STAGE
        assert naming.compose_auth_file(secrets) not in mounted.values(), name
        assert not any(str(creds_dir) in str(v) for v in (service.get("volumes") or [])), name
        if name == "bus-setup":
            assert set(mounted.values()) == {own, naming.compose_stage_file(secrets)}
            assert service["restart"] == "no"
            assert {n: d["condition"] for n, d in service["depends_on"].items()} == {
                n: "service_healthy" for n in NODES}
        else:
            assert set(mounted.values()) == {own}, name
            assert service["depends_on"]["bus-setup"]["condition"] == "service_completed_successfully", name
            assert service["command"][:2] != ["api", "compose-setup"]
        if name != "api":  # the API server's port is the deployment's front door; the rest stay on loopback
            assert {p.get("host_ip") for p in service.get("ports") or []} <= {"127.0.0.1"}, name
    # Observability's /metrics reaches the host: it listens where its published port leads.
    metrics = MetricsSettings.load(env=services["observability"]["environment"], config={})
    assert [(p["host_ip"], int(p["published"]), p["target"]) for p in services["observability"]["ports"]] == [
        ("127.0.0.1", DEFAULT_PORT, metrics.port)] and metrics.host == "0.0.0.0"
    for node in NODES:
        service = services[node]
        assert _mounted(doc, service) == {COMPOSE_AUTH_FILE: naming.compose_auth_file(secrets)}
        assert service["configs"][0]["target"] == COMPOSE_CONFIG_FILE and COMPOSE_CONFIG_FILE in service["command"]
        assert Path(COMPOSE_AUTH_FILE).parent == Path(COMPOSE_CONFIG_FILE).parent  # a relative include finds it
        assert {p.get("host_ip") for p in service["ports"]} == {"127.0.0.1"}  # the host's loopback only
        text = doc["configs"][node]["content"]
        assert text == compose_config(STAGE, NODES.index(node) + 1) and text.endswith(compose_auth_include())


def _served(doc: dict[str, Any]) -> dict[str, str]:
    """Container -> the one service its `spz api serve --services X` runs."""
    out = {}
    for name, service in doc["services"].items():
        command = service.get("command") or []
        if "--services" in command:
            out[name] = command[command.index("--services") + 1]
    return out


def test_every_service_spz_api_serve_knows_runs_in_a_container_of_its_own(tmp_path: Path, secrets: Path) -> None:
    """A service added to cli/serve.py or to the entry points cannot be forgotten here: without a
    container, what it alone emits (dispatch's TaskAdmitted, say) never comes, and the optimizer
    waits for it for ever once a dispatch policy is applied."""
    served = _served(render(secrets, tmp_path))
    assert sorted(served.values()) == sorted(every_service())  # each one, once
    for name, service in served.items():
        assert service == name and service in SERVICES  # one service per container, never `all` or a list


# ------------------------------------------------------------------ the rendered nodes, run

def _loopback(text: str, i: int, ports: list[tuple[int, int, int]], store: Path) -> str:
    """Node i's rendered config on loopback: only its listen addresses, its store and the routes
    move; the rest (the include of the authorization block above all) stays as rendered."""
    moves = [(f"listen: 0.0.0.0:{COMPOSE_CLIENT_PORT}\n", f"listen: 127.0.0.1:{ports[i][0]}\n"),
             (f"http: 0.0.0.0:{COMPOSE_HTTP_PORT}\n", f"http: 127.0.0.1:{ports[i][1]}\n"),
             (f'store_dir: "{COMPOSE_STORE_DIR}"', f'store_dir: "{store}"'),
             (f"listen: 0.0.0.0:{COMPOSE_ROUTE_PORT}\n", f"listen: 127.0.0.1:{ports[i][2]}\n")]
    moves += [(n.route_url, f"nats-route://127.0.0.1:{ports[j][2]}") for j, n in enumerate(compose_nodes(STAGE))]
    for old, new in moves:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return json.loads(resp.read() or b"null")


def _wait_cluster(ports: list[tuple[int, int, int]], procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
    deadline = time.monotonic() + 40
    while True:
        assert all(p.poll() is None for p in procs), [log.read_text(errors="replace")[-2000:] for log in logs]
        try:
            healthy = all(_get(f"http://127.0.0.1:{h}/healthz").get("status") == "ok" for _, h, _ in ports)
            leaders = {(_get(f"http://127.0.0.1:{h}/jsz").get("meta_cluster") or {}).get("leader") or ""
                       for _, h, _ in ports}
            if healthy and len(leaders) == 1 and "" not in leaders:
                return
        except (OSError, urllib.error.URLError, ValueError):
            pass
        assert time.monotonic() < deadline, [log.read_text(errors="replace")[-2000:] for log in logs]
        time.sleep(0.1)


@pytest.fixture
def cluster(tmp_path: Path, secrets: Path):
    """The rendered nodes' configs, each in its own directory beside the block Compose mounts
    there, run as three nats-server processes on free loopback ports."""
    doc = render(secrets, tmp_path)
    ports: list[tuple[int, int, int]] = []
    while len({p for t in ports for p in t}) < 9:
        ports = [(free_port(), free_port(), free_port()) for _ in NODES]
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    try:
        for i, node in enumerate(NODES):
            conf_dir = tmp_path / node
            conf_dir.mkdir()
            conf = conf_dir / Path(COMPOSE_CONFIG_FILE).name
            conf.write_text(_loopback(doc["configs"][node]["content"], i, ports, tmp_path / "js" / node))
            for target, source in _mounted(doc, doc["services"][node]).items():
                shutil.copyfile(source, conf_dir / Path(target).relative_to(Path(COMPOSE_CONFIG_FILE).parent))
            logs.append(tmp_path / f"{node}.log")
            procs.append(subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=open(logs[-1], "ab"),
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        _wait_cluster(ports, procs, logs)
        yield doc, ",".join(f"nats://127.0.0.1:{c}" for c, _, _ in ports)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        for c, _, _ in ports:
            kill_processes_using(f"nats://127.0.0.1:{c}")


def _set_up(doc: dict[str, Any], url: str, stage: str, home: Path) -> subprocess.CompletedProcess[str]:
    """The rendered set-up container's command, run here: its environment (the bus URL moved to
    loopback) and its mounted files at their host paths."""
    service = doc["services"]["bus-setup"]
    mounted = {t: str(p) for t, p in _mounted(doc, service).items()}
    env = {**_env(home, stage), **service["environment"], "SKYPURZA_NATS_URL": url,
           "SKYPURZA_STAGE": stage}
    env[CREDS_ENV] = mounted[env[CREDS_ENV]]
    argv = [mounted.get(a, a) for a in service["command"]]
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *argv], env=env, capture_output=True,
                          text=True, timeout=150)


def test_the_rendered_nodes_refuse_strangers_and_grant_each_user_its_own(cluster, tmp_path: Path,
                                                                        secrets: Path) -> None:
    doc, url = cluster
    home = tmp_path / "home"
    drawn = naming.compose_credentials_dir(secrets)
    optimizer = read_credentials(credentials_file(drawn, "optimizer"))
    public = read_credentials(credentials_file(drawn, naming.BUS_PUBLIC_USER))
    events = naming.events_stream(STAGE)

    async def strangers() -> None:
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(url.split(","), allow_reconnect=False, connect_timeout=3)
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(url.split(","), user=optimizer.user, password="guess", allow_reconnect=False, connect_timeout=3)
        # A service's user may not make the log (the set-up's job).
        assert await refused(url, optimizer, lambda nc: nc.jetstream().add_stream(
            name=events, subjects=[naming.all_events_subject(STAGE)]))

    asyncio.run(strangers())

    # Secrets drawn for another stage: the set-up refuses, loudly, and makes nothing.
    other = _set_up(doc, url, "otherstage", home)
    assert other.returncode == 2, other.stdout + other.stderr
    assert f"'{STAGE}'" in other.stderr and "'otherstage'" in other.stderr and "Traceback" not in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1

    made = _set_up(doc, url, STAGE, home)
    assert made.returncode == 0, made.stdout + made.stderr
    # From here on, each as its container is given it.
    mounted_to = {name: _mounted(doc, doc["services"][name]) for name in ("optimizer", "bus-setup")}
    optimizer = read_credentials(mounted_to["optimizer"][doc["services"]["optimizer"]["environment"][CREDS_ENV]])
    control = read_credentials(mounted_to["bus-setup"][doc["services"]["bus-setup"]["environment"][CREDS_ENV]])

    async def granted() -> None:
        admin = await Bus.connect(url, STAGE, source="/tests/control", credentials=control)
        info = await admin.js.stream_info(events)
        assert info.config.num_replicas == 3  # SKYPURZA_REPLICAS of the rendered environment
        opt = await Bus.connect(url, STAGE, source="/tests/optimizer", credentials=optimizer,
                                settings=BusSettings(replicas=3))
        ack = await opt.publish(PlacementChosen(task_id="t1", cluster="c1", attempt=1,
                                                candidate=Candidate(infra="local")))
        assert ack.seq >= 1
        assert [s.event for s in [x async for x in opt.replay()] if isinstance(s.event, PlacementChosen)]
        last = await admin.last_seq()
        job = naming.event_subject(STAGE, "cluster", "c1", "job_succeeded")  # the agent's, not the optimizer's
        assert await refused(url, optimizer, lambda nc: nc.publish(job, b"{}"))
        assert await refused(url, optimizer, lambda nc: nc.jetstream().delete_stream(events))
        assert await refused(url, optimizer, lambda nc: nc.jetstream().add_stream(
            name="another", subjects=["another.>"]))
        assert await refused(url, public, lambda nc: nc.publish(naming.public_subject(STAGE, "cluster", "c", "x"),
                                                                 b"{}"))
        assert await refused(url, public, lambda nc: nc.publish(job, b"{}"))
        assert not await refused(url, public, lambda nc: nc.subscribe(naming.public_filter(STAGE)))
        assert await admin.last_seq() == last  # nothing refused was stored
        await opt.close()
        await admin.close()

    asyncio.run(granted())
