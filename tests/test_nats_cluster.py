"""The clustered log: a real 3-node JetStream cluster on loopback (tests/support/nats_cluster.py),
real services (`python -m skypurza.cli.serve`), real agents on the `local` infra, the real CLI.

- the config each node gets, the bus settings (pure);
- R3 streams made on a cluster just started (its meta leader not yet elected: err 10005
  retried), and a clear error when the cluster can never place them;
- jobs run while the stream leader is SIGKILLed: no acknowledged event is lost, the services
  and a CLI command streaming a job's output carry on, the restarted node catches up;
- two replicas of the optimizer share its durable consumer: each TaskSubmitted is delivered
  once, except those a killed replica held, delivered once more; one PlacementChosen per task.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from nats_cluster import NatsCluster, make_cluster, nats_cluster  # noqa: F401  (the fixture)
from nats_fixtures import kill_processes_using

from skypurza.events import naming
from skypurza.events.bus import Bus, StreamPlacementError
from skypurza.events.bussettings import BusSettings, parse_servers
from skypurza.events.models import PlacementChosen, PlacementFailed, TaskSubmitted
from skypurza.events.natscluster import (COMPOSE_STAGE, client_urls, compose_config, compose_file_config,
                                          compose_nodes, loopback_nodes, node_config)
from skypurza.events.settings import SettingsError

REPO = Path(__file__).resolve().parent.parent
LOCAL_TASK = {"resources": {"infra": "local"}, "run": "true"}
# Nothing on this machine has eight H100s: the optimizer decides PlacementFailed, nothing launches.
UNPLACEABLE = {"resources": {"infra": "local", "accelerators": "H100:8"}, "run": "true"}


# ------------------------------------------------------------------ pure: config and settings

def test_each_node_config_names_itself_syncs_always_and_routes_to_every_node(tmp_path: Path) -> None:
    nodes = loopback_nodes("test", [(4001, 4002, 4003), (4011, 4012, 4013), (4021, 4022, 4023)], tmp_path)
    text = node_config(nodes[1], nodes, cluster_name=naming.nats_cluster_name("test"))
    assert f'server_name: "{naming.nats_server_name("test", 2)}"' in text
    assert "listen: 127.0.0.1:4011" in text and "http: 127.0.0.1:4012" in text
    assert "sync_interval: always" in text and f'store_dir: "{tmp_path / "n2"}"' in text
    assert "listen: 127.0.0.1:4013" in text
    for port in (4003, 4013, 4023):
        assert f"nats-route://127.0.0.1:{port}" in text
    assert "no_advertise" not in text
    assert client_urls(nodes) == "nats://127.0.0.1:4001,nats://127.0.0.1:4011,nats://127.0.0.1:4021"
    with pytest.raises(ValueError):
        loopback_nodes("test", [(1, 2, 3), (4, 5, 6)], tmp_path)  # two nodes cannot lose one
    with pytest.raises(ValueError):
        loopback_nodes("test", [(1, 2, 3), (4, 5, 6), (7, 8, 3)], tmp_path)  # a port twice
    with pytest.raises(ValueError):
        node_config(nodes[0], nodes, cluster_name='bad"name')
    compose = compose_config("dev", 3)
    assert "listen: 0.0.0.0:4222" in compose and "no_advertise: true" in compose
    assert all(f"nats-route://{n.host}:6222" in compose for n in compose_nodes("dev"))


def test_compose_carries_the_generated_config_of_each_node() -> None:
    import yaml

    doc = yaml.safe_load((REPO / "compose.yaml").read_text())
    for i in (1, 2, 3):
        assert doc["configs"][f"nats-{i}"]["content"] == compose_file_config(i), f"regenerate nats-{i}"
        service = doc["services"][f"nats-{i}"]
        assert service["configs"][0]["source"] == f"nats-{i}"
        # Whatever stage Compose puts in, the text is the config naming gives that stage
        # (tests/test_packaging.py renders it with the real Compose binary).
        for stage in ("dev", "prod"):
            assert compose_file_config(i).replace(COMPOSE_STAGE, stage) == compose_config(stage, i)
    env = doc["x-service"]["environment"]
    assert env["SKYPURZA_REPLICAS"] == "3"
    assert env["SKYPURZA_STAGE"] == COMPOSE_STAGE  # the nodes' names and the services' stage: one variable
    assert parse_servers(env["SKYPURZA_NATS_URL"]) == [n.client_url for n in compose_nodes("dev")]


def test_server_urls_and_replicas_are_checked_at_the_edge() -> None:
    assert parse_servers("nats://a:1, nats://b:2") == ["nats://a:1", "nats://b:2"]
    assert parse_servers(["127.0.0.1"]) == ["nats://127.0.0.1:4222"]
    for bad in ("", "http://a:1", "nats://a:1,nats://a:1", "nats://a:99999", "nats://a:1/x", ",".join(["nats://a"] * 17)):
        with pytest.raises(SettingsError):
            parse_servers(bad)
    assert BusSettings.load(env={}, config={}).replicas == 1
    assert BusSettings.load(env={"SKYPURZA_REPLICAS": "3"}, config={}).replicas == 3
    assert BusSettings.load(env={}, config={"nats": {"replicas": 5}}).replicas == 5
    with pytest.raises(SettingsError, match="SKYPURZA_REPLICAS"):
        BusSettings.load(env={"SKYPURZA_REPLICAS": "6"}, config={})


# ------------------------------------------------------------------ real cluster: streams

def test_r3_streams_on_a_cluster_just_started_and_a_clear_error_when_never_placeable(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path / "c")
    cluster.root.mkdir(parents=True)
    # Started without waiting for the meta leader: creation itself must wait it out (err 10005).
    cluster.servers = [cluster._server(i).start() for i in range(3)]
    try:
        async def main() -> None:
            bus = await Bus.connect(cluster.url, "test", source="/tests", settings=BusSettings(replicas=3))
            for stream in (bus.events_stream, bus.logs_stream, bus.dlq_stream):
                info = await bus.js.stream_info(stream)
                assert info.config.num_replicas == 3 and info.cluster and len(info.cluster.replicas or []) == 2
            began = time.monotonic()
            with pytest.raises(StreamPlacementError, match="5 replicas within 1 s"):
                await Bus.connect(cluster.url, "wide", source="/tests",
                                  settings=BusSettings(replicas=5, placement_wait_s=1.0))
            assert time.monotonic() - began < 10
            await bus.close()

        asyncio.run(main())
    finally:
        cluster.stop()


# ------------------------------------------------------------------ real cluster: a leader killed

def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, env=env, cwd=REPO, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _serve(url: str, stage: str, services: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    proc = _spawn([sys.executable, "-m", "skypurza.cli.serve", "--nats", url, "--stage", stage,
                   "--services", services], env, log)
    deadline = time.monotonic() + 60
    while "services ready" not in log.read_text(errors="replace"):
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.1)
    return proc


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


class Publisher:
    """Publishes unplaceable tasks through the cluster from a thread of its own, all the while a
    node is killed, and keeps the id of every event whose publish was acknowledged."""

    def __init__(self, url: str, stage: str):
        self.url, self.stage = url, stage
        self.acked: list[str] = []
        self.failed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        bus = await Bus.connect(self.url, self.stage, source="/tests/publisher", settings=BusSettings(replicas=3))
        n = 0
        while not self._stop.is_set():
            n += 1
            env = bus.envelope(TaskSubmitted(task_id=f"mark-{n}", cluster=f"mark-{n}", task=UNPLACEABLE))
            try:
                await bus.publish(env)
                self.acked.append(env.id)
            except Exception as exc:  # not acknowledged: nothing is promised about it
                self.failed += 1
                self.errors.append(repr(exc))
            await asyncio.sleep(0.05)
        await bus.close()

    def start(self) -> "Publisher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def _wait(what: str, pred, timeout: float, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


@pytest.mark.timeout(180)
def test_jobs_run_through_a_stream_leader_killed_and_nothing_acknowledged_is_lost(
        nats_cluster: NatsCluster, tmp_path: Path) -> None:  # noqa: F811
    stage = "clus"
    env = {**os.environ, "SKYPURZA_NATS_URL": nats_cluster.url, "SKYPURZA_STAGE": stage, "SKYPURZA_REPLICAS": "3",
           "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_ENABLED_INFRAS": "local",
           "SKYPURZA_AGENT_KILL_GRACE_S": "1", "SKYPURZA_NO_PLUGINS": "1", "COLUMNS": "200",
           "PYTHONIOENCODING": "utf-8"}

    def spz(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    services = _serve(nats_cluster.url, stage, "optimizer,provisioner,status", env, tmp_path / "services.log")
    streaming: subprocess.Popen | None = None
    publisher = Publisher(nats_cluster.url, stage)
    try:
        r = spz("launch", "-y", "-c", "ha", "echo first-job")
        assert r.returncode == 0 and "first-job" in r.stdout, r.stdout + r.stderr
        publisher.start()
        # A job that runs across the kill, its output followed by the CLI the whole time.
        out = tmp_path / "exec.out"
        streaming = _spawn([sys.executable, "-m", "skypurza.cli.main", "exec", "ha",
                            "for i in $(seq 1 40); do echo tick-$i; sleep 0.25; done"], env, out)
        _wait("the job's first output", lambda: "tick-1" in out.read_text(errors="replace"), 60)

        stream = naming.events_stream(stage)

        def leader(ask: int) -> str:
            """The stream's leader as node `ask` sees it ("" while there is none)."""
            try:
                return ((nats_cluster.stream_state(ask, stream) or {}).get("cluster") or {}).get("leader") or ""
            except OSError:
                return ""

        killed_name = leader(0)
        assert killed_name, "the stream has a leader"
        killed = nats_cluster.index_of(killed_name)
        nats_cluster.kill(killed)
        survivor = (killed + 1) % 3
        new_leader = _wait("a new stream leader", lambda: (lambda n: n if n and n != killed_name else None)(
            leader(survivor)), 30)
        assert new_leader != killed_name

        # The CLI command that was streaming carries on to the end of its job.
        assert streaming.wait(90) == 0, out.read_text(errors="replace")[-3000:]
        ticks = [line for line in out.read_text(errors="replace").splitlines() if line.startswith("tick-")]
        assert ticks == [f"tick-{i}" for i in range(1, 41)], ticks

        # The services resume: a new job through the optimizer's placement, the provisioner's queue,
        # the agent, and the status service's answer.
        r = spz("exec", "ha", "echo after-the-kill")
        assert r.returncode == 0 and "after-the-kill" in r.stdout, r.stdout + r.stderr
        queue = _wait("the status service's queue", lambda: (lambda q: q if q and all(
            j["status"] == "SUCCEEDED" for j in q) and len(q) == 3 else None)(_queue(spz)), 30)
        assert sorted(j["job_id"] for j in queue) == [1, 2, 3]

        # The killed node restarts and catches up with the leader's copy of the log.
        nats_cluster.restart(killed)
        publisher.stop()

        def caught_up() -> bool:
            mine = nats_cluster.stream_state(killed, stream)
            theirs = nats_cluster.stream_state(nats_cluster.index_of(new_leader), stream)
            return bool(mine and theirs and mine["state"]["last_seq"] == theirs["state"]["last_seq"] > 0)

        _wait("the restarted node to catch up", caught_up, 30)

        async def check_log() -> None:
            bus = await Bus.connect(nats_cluster.url, stage, source="/tests", ensure=False)
            try:
                ids, decisions = set(), {}
                async for s in bus.replay():
                    if s.envelope is not None:
                        ids.add(s.envelope.id)
                    if isinstance(s.event, (PlacementChosen, PlacementFailed)):
                        decisions.setdefault(s.event.task_id, []).append(type(s.event).__name__)
                missing = [i for i in publisher.acked if i not in ids]
                assert not missing, f"{len(missing)} acknowledged events lost of {len(publisher.acked)}"
                assert len(publisher.acked) > 20
                marks = {k: v for k, v in decisions.items() if k.startswith("mark-")}
                # Every acknowledged task got exactly one decision, through the kill.
                assert len(marks) >= len(publisher.acked)
                assert all(v == ["PlacementFailed"] for v in marks.values()), marks
            finally:
                await bus.close()

        # A publish during the election waits it out (events/bus.py ELECTION_WAIT_S): none failed.
        assert publisher.errors == [], publisher.errors
        asyncio.run(check_log())
        r = spz("down", "-y", "ha")
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        publisher.stop()
        if streaming is not None:
            _kill_group(streaming)
        _kill_group(services)
        for node in nats_cluster.nodes:
            kill_processes_using(node.client_url)


def _queue(spz) -> list[dict] | None:
    r = spz("queue", "ha", "-o", "json", timeout=60)
    if r.returncode != 0:
        return None
    try:
        return json.loads(r.stdout)
    except ValueError:
        return None


# ------------------------------------------------------------------ two replicas of one service

@pytest.mark.timeout(150)
def test_two_optimizer_replicas_share_one_durable_and_handle_each_task_once(nats_server, tmp_path: Path) -> None:
    stage = "reps"
    env = {**os.environ, "SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": stage,
           "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_ENABLED_INFRAS": "local", "SKYPURZA_NO_PLUGINS": "1"}
    durable = naming.consumer(stage, "optimizer")
    procs: list[subprocess.Popen] = []

    async def main() -> None:
        bus = await Bus.connect(nats_server.url, stage, source="/tests")

        async def consumer():
            return await bus.js.consumer_info(bus.events_stream, durable)

        async def until(what: str, pred, timeout: float):
            deadline = time.monotonic() + timeout
            while True:
                try:
                    got = await pred()
                except Exception:  # not made yet
                    got = None
                if got:
                    return got
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                await asyncio.sleep(0.05)

        async def placements() -> dict[str, int]:
            counts: dict[str, int] = {}
            async for s in bus.replay(filter_subject=naming.event_filter(stage, "task", "placement_chosen")):
                counts[s.event.task_id] = counts.get(s.event.task_id, 0) + 1
            return counts

        async def submit(prefix: str, n: int) -> list[str]:
            ids = [f"{prefix}-{i}" for i in range(n)]
            await bus.publish_many([TaskSubmitted(task_id=t, cluster=t, task=LOCAL_TASK) for t in ids])
            return ids

        # Replica A, frozen while its pull request waits: the server hands it a burst it never acks.
        a = _serve(nats_server.url, stage, "optimizer", env, tmp_path / "a.log")
        procs.append(a)
        tasks: list[str] = []
        held = 0
        for attempt in range(5):
            await until("replica A's pull", lambda: _waiting(consumer, 1), 15)
            os.kill(a.pid, signal.SIGSTOP)
            tasks += await submit(f"burst{attempt}", 10)
            await asyncio.sleep(0.3)
            held = (await consumer()).num_ack_pending
            if held:
                break
            os.kill(a.pid, signal.SIGCONT)  # its pull had just expired: let it place those, try again
            await until("A to place them", lambda: _all_placed(placements, tasks), 20)
        assert held, "replica A never held a burst"
        # Replica B shares the durable: it handles everything A does not hold.
        b = _serve(nats_server.url, stage, "optimizer", env, tmp_path / "b.log")
        procs.append(b)
        tasks += await submit("later", 10)
        placed = await until("B to place what A does not hold",
                             lambda: _placed_count(placements, tasks, len(tasks) - held), 30)
        assert placed
        names = [c.name async for c in _consumers(bus)]
        assert names.count(durable) == 1 and not any("optimizer" in n and n != durable for n in names)
        # A dies holding its burst: after the ack wait it is redelivered to B.
        os.kill(a.pid, signal.SIGKILL)
        await until("the held burst placed by B", lambda: _all_placed(placements, tasks), 60)
        counts = await placements()
        assert {t: counts.get(t) for t in tasks} == {t: 1 for t in tasks}
        info = await until("every delivery acked", lambda: _settled_info(consumer), 10)
        # Every task delivered once, and only those A held a second time.
        assert info.delivered.consumer_seq == len(tasks) + held, (info.delivered, held)
        await bus.close()

    try:
        asyncio.run(main())
    finally:
        for p in procs:
            try:
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            _kill_group(p)


async def _waiting(consumer, n: int) -> bool:
    return (await consumer()).num_waiting >= n


async def _all_placed(placements, tasks: list[str]) -> bool:
    counts = await placements()
    return all(t in counts for t in tasks)


async def _placed_count(placements, tasks: list[str], want: int) -> bool:
    counts = await placements()
    return sum(1 for t in tasks if t in counts) >= want


async def _settled_info(consumer):
    info = await consumer()
    return info if info.num_ack_pending == 0 and info.num_pending == 0 else None


async def _consumers(bus: Bus):
    for c in await bus.js.consumers_info(bus.events_stream):
        yield c
