"""compose.yaml runs a secured bus: real `spz api compose-secrets`, compose.yaml rendered by the
real Compose binary, its NATS nodes' rendered configs and commands (`spz api bus-node`) run as a
real 3-node cluster on loopback.

- the command draws every user's 0600 credentials file, their bcrypt hashes and the stage, keeps
  passwords on a second run, and two runs at once write one consistent set;
- each SkyPurza container is handed exactly its own user's file (and SKYPURZA_NATS_CREDS naming
  it), the nodes only the users' hashes and the agents' volume (read-only; the provisioner writes
  it), and the set-up runs before every service;
- every service `spz api serve` knows (cli/serve.py's and the `skypurza.services` entry points)
  runs in a container of its own, and only the API server's port leaves the host's loopback;
- on the cluster made of the rendered configs (only ports and paths moved to loopback, the
  authorization block and its include exactly as rendered): an anonymous client and a wrong
  password are refused, a service user cannot create a stream, the rendered set-up refuses a
  stage the secrets were not drawn for and then makes the R3 streams as `control`, the
  optimizer's user reads the event log but may not publish an event type it does not emit, and
  the public user publishes nothing;
- a remote cluster's agent user, minted into the agents' directory as compose's provisioner
  does, is taken by every node within seconds, may publish its own cluster's events and not
  another's, and is refused by every node once it is removed; a node refuses a stage its users
  were not drawn for.
"""

from __future__ import annotations

import asyncio
import json
import os
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
from skypurza.cli.busnode import read_node_users
from skypurza.events.agentusers import AGENT_USERS_ENV, PER_CLUSTER, AgentUserStore, check_password
from skypurza.events.natscluster import (COMPOSE_AGENTS_DIR, COMPOSE_CLIENT_PORT, COMPOSE_CONFIG_FILE,
                                          COMPOSE_HTTP_PORT, COMPOSE_NODE_USERS_FILE, COMPOSE_ROUTE_PORT,
                                          COMPOSE_STORE_DIR, compose_auth_include, compose_config, compose_nodes)
from skypurza.events.natscreds import CREDS_ENV, credentials_file, read_credentials
from skypurza.events.natsserver import free_port
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
    assert stat.S_IMODE(naming.compose_node_users_file(secrets).stat().st_mode) == 0o600
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    assert naming.compose_stage_file(secrets).read_text().strip() == STAGE
    # The nodes' file: every user's bcrypt hash, of exactly the password drawn; no password itself.
    node_users = read_node_users(naming.compose_node_users_file(secrets))
    assert node_users.stage == STAGE and set(node_users.hashes) == users
    assert all(check_password(first[u], h) for u, h in node_users.hashes.items())
    assert not [p for p in first.values() if p in naming.compose_node_users_file(secrets).read_text()]

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
    hashes = read_node_users(naming.compose_node_users_file(fresh)).hashes
    assert all(check_password(p, hashes[u]) for u, p in drawn.items())

    # A directory it cannot write: one line, no traceback.
    blocked = tmp_path / "file"
    blocked.write_text("")
    bad = spz(home, "api", "compose-secrets", str(blocked / "sub"))
    assert bad.returncode == 1 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    # The image's user owns what its containers read (Compose mounts the host file as it is).
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"--uid {COMPOSE_CONTAINER_UID} skypurza" in dockerfile
    # ...and the directories named volumes are mounted on, so a new volume is the user's too
    made = dockerfile[dockerfile.index("install -d -o skypurza"):].split("\n", 1)[0].split()
    assert {"/home/skypurza/.skypurza", COMPOSE_STORE_DIR, COMPOSE_AGENTS_DIR} <= set(made)


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
        assert naming.compose_node_users_file(secrets) not in mounted.values(), name
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
        agents_volume = [v for v in service.get("volumes") or [] if v.get("source") == "bus-agents"]
        if name == "provisioner":  # it mints each remote cluster's agent user into the nodes' volume
            assert [(v["target"], v.get("read_only", False)) for v in agents_volume] == [(COMPOSE_AGENTS_DIR, False)]
            env = service["environment"]
            assert env[AGENT_USERS_ENV] == PER_CLUSTER and env[naming.BUS_AGENTS_DIR_ENV] == COMPOSE_AGENTS_DIR
            assert env["SKYPURZA_AGENT_NATS_URL_REQUIRED"] == "1" and env["SKYPURZA_AGENT_NATS_URL"] == ""
            # its key (every agent password derives from it) outlives the container
            assert any(v["target"] == "/home/skypurza/.skypurza" and v["type"] == "volume"
                       for v in service["volumes"])
        else:
            assert agents_volume == [], name
    # Observability's /metrics reaches the host: it listens where its published port leads.
    metrics = MetricsSettings.load(env=services["observability"]["environment"], config={})
    assert [(p["host_ip"], int(p["published"]), p["target"]) for p in services["observability"]["ports"]] == [
        ("127.0.0.1", DEFAULT_PORT, metrics.port)] and metrics.host == "0.0.0.0"
    for node in NODES:
        service = services[node]
        assert _mounted(doc, service) == {COMPOSE_NODE_USERS_FILE: naming.compose_node_users_file(secrets)}
        assert service["configs"][0]["target"] == COMPOSE_CONFIG_FILE
        command = service["command"]
        assert command[:2] == ["api", "bus-node"] and service["image"] == services["api"]["image"]
        assert {command[command.index(f) + 1] for f in ("--nats-config", "--users", "--agents")} == {
            COMPOSE_CONFIG_FILE, COMPOSE_NODE_USERS_FILE, COMPOSE_AGENTS_DIR}
        assert [(v["source"], v["target"], v.get("read_only", False)) for v in service["volumes"]
                if v["source"] == "bus-agents"] == [("bus-agents", COMPOSE_AGENTS_DIR, True)]
        assert service["environment"]["SKYPURZA_STAGE"] == STAGE
        assert {p.get("host_ip") for p in service["ports"]} == {"127.0.0.1"}  # loopback unless SKYPURZA_BUS_BIND
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


def _node_argv(doc: dict[str, Any], node: str, conf: Path, agents: Path) -> list[str]:
    """The rendered node's command, run here: its config, users file and agents' volume at their
    host paths (the rest of the command as rendered)."""
    service = doc["services"][node]
    where = {COMPOSE_CONFIG_FILE: str(conf), COMPOSE_AGENTS_DIR: str(agents),
             **{t: str(p) for t, p in _mounted(doc, service).items()}}
    return [sys.executable, "-m", "skypurza.cli.main", *(where.get(a, a) for a in service["command"])]


@pytest.fixture
def agents_dir(tmp_path: Path) -> Path:
    """The `bus-agents` volume: the provisioner writes it, every node reads it."""
    d = tmp_path / "bus-agents"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def cluster(tmp_path: Path, secrets: Path, agents_dir: Path):
    """The rendered nodes, each its rendered command (`spz api bus-node`: the keeper, which runs
    nats-server) on its rendered config moved to loopback, with its own home: three processes."""
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
            logs.append(tmp_path / f"{node}.log")
            env = {**_env(tmp_path / f"{node}-home", STAGE), **doc["services"][node]["environment"]}
            procs.append(subprocess.Popen(_node_argv(doc, node, conf, agents_dir), stdout=open(logs[-1], "ab"),
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env))
        _wait_cluster(ports, procs, logs)
        yield doc, ",".join(f"nats://127.0.0.1:{c}" for c, _, _ in ports), logs
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()  # the keeper hands it to nats-server and exits with it
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
    doc, url, _ = cluster
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


def test_a_remote_clusters_agent_user_is_taken_by_every_node_and_dropped_when_removed(
        cluster, tmp_path: Path, secrets: Path, agents_dir: Path, monkeypatch) -> None:
    """As compose's provisioner does (SKYPURZA_BUS_AGENTS_DIR on the shared volume): a cluster's
    user minted there is live on each node within seconds (each node's keeper reloads its own),
    narrowed to its cluster; removed, each node refuses it at connect."""
    doc, url, logs = cluster
    assert _set_up(doc, url, STAGE, tmp_path / "home").returncode == 0
    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path / "provisioner-home"))
    monkeypatch.setenv(naming.BUS_AGENTS_DIR_ENV, str(agents_dir))
    store = AgentUserStore(STAGE)
    assert store.directory == agents_dir
    creds = store.mint("gpu-a", "placement-1", "t-a")
    servers = url.split(",")

    async def connects(server: str) -> bool:
        try:
            nc = await nats.connect(server, user=creds.user, password=creds.password, allow_reconnect=False,
                                    connect_timeout=2)
        except (nats.errors.Error, OSError):  # refused: the -ERR line, or the reset the server sends after it
            return False
        await nc.close()
        return True

    async def until(want: bool) -> float:
        t0 = time.monotonic()
        while True:
            states = [await connects(s) for s in servers]
            if all(x == want for x in states):
                return time.monotonic() - t0
            assert time.monotonic() - t0 < 15, (states, [log.read_text(errors="replace")[-1500:] for log in logs])
            await asyncio.sleep(0.1)

    async def main() -> None:
        took = await until(True)
        assert took < 15
        own = naming.event_subject(STAGE, "cluster", "gpu-a", "node_ready")
        other = naming.event_subject(STAGE, "cluster", "gpu-b", "node_ready")
        assert not await refused(url, creds, lambda nc: nc.publish(own, b"{}"))
        assert await refused(url, creds, lambda nc: nc.publish(other, b"{}"))
        store.remove("gpu-a")
        await until(False)

    asyncio.run(main())
    assert all("bus users reloaded: 1 cluster agent user(s)" in log.read_text() for log in logs)
    assert all("bus users reloaded: 0 cluster agent user(s)" in log.read_text() for log in logs)


def test_a_node_refuses_a_stage_its_users_were_not_drawn_for(tmp_path: Path, secrets: Path, agents_dir: Path) -> None:
    doc = render(secrets, tmp_path)
    conf = tmp_path / "nats.conf"
    conf.write_text(doc["configs"]["nats-1"]["content"])
    env = {**_env(tmp_path / "home", STAGE), "SKYPURZA_STAGE": "otherstage"}
    res = subprocess.run(_node_argv(doc, "nats-1", conf, agents_dir), env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"'{STAGE}'" in res.stderr and "'otherstage'" in res.stderr and "Traceback" not in res.stderr
