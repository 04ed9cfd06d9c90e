"""Job output exactly once, through crashes: a real agent printing while the nats-server is
SIGKILLed and started again on the same port and store, an agent that re-sends what it had
published, and a reader that sees a copy JetStream could not drop. `spz logs` (a real CLI
process) must print the job's own output file, byte for byte."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_harness import job_end, job_lines, provision, terminate, wait_lines
from nats_fixtures import kill_processes_using

from skypurza.events import naming
from skypurza.events.bus import LOGS_DUPLICATE_WINDOW_S, Bus, log_chunk_id
from skypurza.events.jobqueue import queue_job
from skypurza.events.natsserver import NatsServer, free_port
from skypurza.services.agent import agent as agent_module
from skypurza.services.provisioner.adapter import ClusterRef
from skypurza.services.provisioner.local import LocalAdapter

REPO = Path(__file__).resolve().parent.parent
LINES = 800
# Lines of many lengths and some non-ASCII: a chunk cut, re-sent or re-encoded wrongly shows.
CHATTY = (
    "python3 -c \"\n"
    "import time\n"
    f"for i in range({LINES}):\n"
    "    print(f'line {i} ünïcødé ' + 'x' * (i % 97), flush=True)\n"
    "    time.sleep(0.02)\n"
    "\""
)


class Plane:
    """A nats-server that can crash and come back on the same port and store."""

    def __init__(self, tmp: Path):
        self.port = free_port()
        self.store = tmp / "js"
        self.log = tmp / "nats.log"
        self.server = self._new().start()

    def _new(self) -> NatsServer:
        return NatsServer(store_dir=self.store, port=self.port, log_file=self.log)

    @property
    def url(self) -> str:
        return self.server.url

    def crash_and_restart(self, down_s: float = 0.5) -> None:
        self.server.kill()
        time.sleep(down_s)
        self.server = self._new().start()

    def close(self) -> None:
        self.server.stop()


@pytest.fixture
def plane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SKYPURZA_AGENT_KILL_GRACE_S", "1")
    monkeypatch.setenv("SKYPURZA_AGENT_HEARTBEAT_S", "0.5")
    p = Plane(tmp_path)
    procs: list[subprocess.Popen] = []
    p.procs = procs  # type: ignore[attr-defined]
    yield p
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    p.close()
    kill_processes_using(p.url)  # the agents, whatever happened


def spz_env(url: str, tmp: Path) -> dict[str, str]:
    env = {**os.environ, "SKYPURZA_NATS_URL": url, "SKYPURZA_STAGE": "test", "SKYPURZA_HOME": str(tmp / "spzhome"),
           "PYTHONIOENCODING": "utf-8", "COLUMNS": "200"}
    return env


def spz(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, cwd=REPO,
                          capture_output=True, timeout=timeout)


def run_log(tmp: Path, cluster: str, job_id: int, rank: int = 0, phase: str = "run") -> bytes:
    return (tmp / "state" / "clusters" / cluster / f"node-{rank}" / agent_module.STATE_DIRNAME / "jobs"
            / str(job_id) / f"{phase}.log").read_bytes()


def _kill_agent(adapter: LocalAdapter, cluster: str) -> None:
    """SIGKILL the node's agent and wait until it is gone (reaped): a start before that would
    find it still alive and start nothing."""
    from skypurza.events.processes import pid_alive

    pid = adapter.agents(cluster)[0]["pid"]
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(pid):
        child = adapter._children.get(pid)  # noqa: SLF001 (the adapter's own Popen reaps it)
        if child is not None:
            child.poll()
        assert time.monotonic() < deadline, "the agent did not die"
        time.sleep(0.02)


def test_logs_exactly_once_across_nats_sigkills(plane: Plane, tmp_path: Path) -> None:
    """Short crashes (nats-py re-sends what it buffered) and one longer than a publish's
    timeout (the agent retries a chunk the server may already hold): each chunk stored once."""
    env = spz_env(plane.url, tmp_path)
    follow_env = {**env, "SKYPURZA_CLI_RECONNECT_GRACE_S": "30"}  # this follower waits out the crashes

    async def main():
        bus = await Bus.connect(plane.url, "test", source="/tests")
        adapter = LocalAdapter(plane.url, "test", tmp_path / "state")
        try:
            await provision(bus, adapter, "chatty", 1)
            job, _ = await queue_job(bus, cluster="chatty", task_id="t1", task={"run": CHATTY})
            await wait_lines(bus, "chatty", job.job_id, lambda ls: len(ls) >= 10, timeout=30)
            follower = subprocess.Popen([sys.executable, "-m", "skypurza.cli.main", "logs", "chatty",
                                         str(job.job_id)], env=follow_env, cwd=REPO, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE)
            plane.procs.append(follower)  # type: ignore[attr-defined]
            await asyncio.sleep(1.0)
            for down_s in (0.5, 7.0, 0.5):  # while the job prints, the follower follows, the agent retries
                plane.crash_and_restart(down_s)
                await asyncio.sleep(1.0)
            end = await job_end(bus, "chatty", job.job_id, timeout=90)
            stored = await job_lines(bus, "chatty", job.job_id)
            own = run_log(tmp_path, "chatty", job.job_id)
            out, err = await asyncio.to_thread(follower.communicate, timeout=60)
            r = await asyncio.to_thread(spz, env, "logs", "chatty", str(job.job_id), "--no-follow")
            return job, end, stored, own, follower.returncode, out, err, r
        finally:
            await terminate(adapter, "chatty")
            await bus.close()

    job, end, stored, own, follow_rc, follow_out, follow_err, r = asyncio.run(main())
    assert end.EVENT_NAME == "job_succeeded"
    assert own.count(b"\n") == LINES
    # The store itself holds every chunk once: JetStream dropped the re-sent copies.
    offsets = [c["offset"] for c in stored]
    assert len(offsets) == len(set(offsets)) == LINES, f"{len(offsets)} chunks stored for {LINES} lines"
    assert [c["seq"] for c in stored] == list(range(LINES))
    # `spz logs` prints the job's own output, byte for byte: the one that followed through the
    # crashes and one run afterwards.
    assert follow_rc == 0, follow_err.decode()
    assert follow_out == own
    assert b"Traceback" not in follow_err
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == own


def test_an_agent_that_sends_again_what_it_had_published_is_stored_once(plane: Plane, tmp_path: Path) -> None:
    """A crash between publishing chunks and recording how far it got: the next agent re-sends
    from the recorded offset. The chunks' ids are the same, so JetStream keeps one copy."""
    script = "for i in $(seq 1 40); do echo line $i; sleep 0.05; done; sleep 2"

    async def main():
        bus = await Bus.connect(plane.url, "test", source="/tests")
        adapter = LocalAdapter(plane.url, "test", tmp_path / "state")
        ref = ClusterRef(stage="test", cluster="resend", infra="local")
        try:
            await provision(bus, adapter, "resend", 1)
            job, _ = await queue_job(bus, cluster="resend", task_id="t1", task={"run": script})
            await wait_lines(bus, "resend", job.job_id, lambda ls: len(ls) >= 40, timeout=30)
            _kill_agent(adapter, "resend")  # the job's own session survives
            offset_file = (tmp_path / "state" / "clusters" / "resend" / "node-0" / agent_module.STATE_DIRNAME
                           / "jobs" / str(job.job_id) / "run.offset")
            offset_file.write_text("0 0")  # as if it died before recording any progress
            await adapter.start(ref)
            end = await job_end(bus, "resend", job.job_id, timeout=30)
            own = run_log(tmp_path, "resend", job.job_id)
            r = await asyncio.to_thread(spz, spz_env(plane.url, tmp_path), "logs", "resend", str(job.job_id),
                                        "--no-follow")
            return job, end, await job_lines(bus, "resend", job.job_id), own, r
        finally:
            await terminate(adapter, "resend")
            await bus.close()

    job, end, stored, own, r = asyncio.run(main())
    assert end.EVENT_NAME == "job_succeeded"
    assert [c["line"] for c in stored if c["stream"] == "run"] == [f"line {i}" for i in range(1, 41)]
    assert r.returncode == 0 and r.stdout == own


def test_the_reader_drops_a_copy_that_jetstream_could_not(plane: Plane, tmp_path: Path) -> None:
    """A copy re-sent after the duplicate window (an agent that came back much later) has the
    same id but is stored again: `spz logs` prints each (rank, phase, offset) once."""
    from skypurza.events.models import Candidate, ClusterProvisioned, NodeInfo
    from skypurza.events.envelope import utcnow

    lines = [("run", 0, 0, "first"), ("run", 1, 6, "second"), ("setup", 0, 0, "set up"),
             ("run", 0, 0, "first"), ("run", 1, 6, "second"), ("run", 2, 13, "third")]

    async def main():
        bus = await Bus.connect(plane.url, "test", source="/tests")
        try:
            await bus.publish(ClusterProvisioned(
                cluster="late", task_id="t", placement_id="p", candidate=Candidate(infra="local", num_nodes=1),
                nodes=[NodeInfo(rank=0, instance_id="i", private_ip="127.0.0.1")], hourly_price_micros=0,
                launched_at=utcnow()))
            job, _ = await queue_job(bus, cluster="late", task_id="t1", task={"run": "x", "setup": "y"})
            for n, (phase, seq, offset, text) in enumerate(lines):
                # a different Nats-Msg-Id for the late copies: the window no longer knows them
                await bus.publish_log("late", job.job_id, 0, text, stream_name=phase, seq=seq, offset=offset,
                                      msg_id=f"late-{n}")
            return job, await job_lines(bus, "late", job.job_id)
        finally:
            await bus.close()

    job, stored = asyncio.run(main())
    assert len(stored) == len(lines)  # the copies really are in the stream
    r = spz(spz_env(plane.url, tmp_path), "logs", "late", str(job.job_id), "--no-follow")
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().splitlines() == ["first", "second", "(setup) set up", "third"]


def test_chunk_ids_and_the_duplicate_window_cover_the_agents_retries() -> None:
    a = log_chunk_id("c", 3, 1, "run", 7, 120)
    assert a == log_chunk_id("c", 3, 1, "run", 7, 120)  # a restarted agent derives the same id
    others = {log_chunk_id("c", 3, 1, "run", 7, 121), log_chunk_id("c", 3, 0, "run", 7, 120),
              log_chunk_id("c", 4, 1, "run", 7, 120), log_chunk_id("c", 3, 1, "setup", 7, 120),
              log_chunk_id("d", 3, 1, "run", 7, 120)}
    assert a not in others and len(others) == 5
    # Every retry of one chunk by a running agent happens inside the logs stream's window.
    assert agent_module.log_retry_horizon_s() < LOGS_DUPLICATE_WINDOW_S


def test_the_logs_stream_gets_the_duplicate_window(plane: Plane) -> None:
    async def main():
        nc_bus = await Bus.connect(plane.url, "test", source="/tests", ensure=False)
        try:
            # A stream made by an older version, with the server's default (2 minutes) window.
            from nats.js import api

            await nc_bus.js.add_stream(api.StreamConfig(name=naming.logs_stream("test"),
                                                        subjects=[naming.all_logs_subject("test")],
                                                        storage=api.StorageType.FILE))
            await nc_bus.ensure_streams()
            info = await nc_bus.js.stream_info(naming.logs_stream("test"))
            return info.config.duplicate_window
        finally:
            await nc_bus.close()

    assert asyncio.run(main()) == LOGS_DUPLICATE_WINDOW_S
