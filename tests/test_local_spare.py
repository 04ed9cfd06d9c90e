"""A new local node without a cold start (issue 21: PlacementChosen -> NodeReady ≤ 0.2 s).

The local backend keeps one pre-started agent (services/agent/spare.py) and hands it the next
node; every agent it starts tells it "ready" on a pipe (or closes it by exiting), so nothing on
the way polls. Real nats-server, real agent processes, real jobs; the last tests read the code
for the sleeps that were removed, so one coming back fails here.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from agent_harness import events, job_end, job_lines, of, provision, rank_lines, terminate, wait_events
from nats_fixtures import connect_bus

from skypurza.events.jobqueue import queue_job
from skypurza.services.agent import agent as agent_module
from skypurza.services.agent.procs import ExitWatch
from skypurza.services.agent.spare import parse_handoff
from skypurza.services.provisioner import local as local_module
from skypurza.services.provisioner.adapter import ProvisionError
from skypurza.services.provisioner.local import LocalAdapter


@pytest.fixture
def fast_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYPURZA_AGENT_KILL_GRACE_S", "1")
    monkeypatch.setenv("SKYPURZA_AGENT_HEARTBEAT_S", "0.5")


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


def test_the_spare_becomes_the_next_node_and_runs_its_job(nats_server, tmp_path: Path, fast_agents) -> None:
    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        try:
            assert adapter.spare_pid() is None  # none before the first launch: it starts cold
            await provision(bus, adapter, "first", 1)
            spare = adapter.spare_pid()
            assert spare is not None and _cmdline(spare)[1:3] == ["-m", local_module.SPARE_MODULE]
            await provision(bus, adapter, "second", 1)
            node = adapter.agents("second")[0]
            job, _ = await queue_job(bus, cluster="second", task_id="t", task={"run": "echo from-the-spare; pwd"})
            end = await job_end(bus, "second", job.job_id)
            lines = rank_lines(await job_lines(bus, "second", job.job_id), 0)
            ready = of([s.event for s in await events(bus, "second")], "node_ready")
            next_spare = adapter.spare_pid()
            log_text = Path(node["home"], local_module.AGENT_LOG).read_text()
            await terminate(adapter, "first")
            await terminate(adapter, "second")
        finally:
            await adapter.close()
            await bus.close()
        return spare, node, end, lines, ready, next_spare, log_text

    spare, node, end, lines, ready, next_spare, log_text = asyncio.run(main())
    assert node["pid"] == spare and [e.pid for e in ready] == [spare], "the second node is the spare"
    assert end.EVENT_NAME == "job_succeeded"
    assert lines[0] == "from-the-spare" and lines[1].endswith("sky_workdir"), lines  # in the node's home
    assert log_text.count("job 1: run started") == 1  # its output went to the node's log
    assert next_spare not in (None, spare)  # another was made for the next node
    assert _gone(next_spare), "close() ends the unused spare"


def test_a_spare_made_under_another_environment_is_not_used(nats_server, tmp_path: Path, fast_agents,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state")
        try:
            await provision(bus, adapter, "a", 1)
            stale = adapter.spare_pid()
            monkeypatch.setenv("SKYPURZA_AGENT_HEARTBEAT_S", "0.7")  # the next agent must see it
            await provision(bus, adapter, "b", 1)
            node = adapter.agents("b")[0]
            env = Path(f"/proc/{node['pid']}/environ").read_bytes().split(b"\0")
            await terminate(adapter, "a")
            await terminate(adapter, "b")
        finally:
            await adapter.close()
            await bus.close()
        return stale, node, env

    stale, node, env = asyncio.run(main())
    assert stale is not None and node["pid"] != stale
    assert b"SKYPURZA_AGENT_HEARTBEAT_S=0.7" in env
    assert _gone(stale), "the stale spare ends (end of its input) without running anything"


@pytest.mark.parametrize("via_spare", [False, True])
def test_an_agent_that_exits_before_ready_fails_the_launch_at_once(nats_server, tmp_path: Path, fast_agents,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   via_spare: bool) -> None:
    """Its ready pipe closes when it exits: the launch fails then, not at the 60 s ready timeout."""
    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state", ready_timeout_s=60)
        try:
            monkeypatch.setenv("SKYPURZA_AGENT_HEARTBEAT_S", "soon")  # the agent refuses it: exit 2
            if via_spare:
                adapter.warm()
                assert adapter.spare_pid() is not None
            t0 = time.monotonic()
            with pytest.raises(ProvisionError) as err:
                await provision(bus, adapter, "bad", 1)
            took = time.monotonic() - t0
            return str(err.value), took, adapter.agents("bad")
        finally:
            await adapter.close()
            await bus.close()

    message, took, nodes = asyncio.run(main())
    assert "exited with 2" in message and "SKYPURZA_AGENT_HEARTBEAT_S" in message, message
    assert took < 30, f"waited {took:.1f} s for an agent that had exited"
    assert nodes == []  # the failed gang is removed


def test_exit_watch_wakes_at_the_exit_not_at_the_bound() -> None:
    async def main():
        proc = subprocess.Popen(["sleep", "0.2"])
        watch = ExitWatch(proc.pid)
        t0 = time.monotonic()
        await watch.wait(60)
        took = time.monotonic() - t0
        watch.close()
        return proc.wait(5), took

    code, took = asyncio.run(main())
    assert code == 0 and took < 30


@pytest.mark.parametrize("line, error", [
    (b"not json", "Expecting value"),
    (b"[1, 2]", "not an object"),
    (b'{"argv": "--nats x", "home": "/h", "log": "/h/l"}', "argv"),
    (b'{"argv": ["--nats", "x"], "home": "", "log": "/h/l"}', "home and log"),
    (b"{" + b" " * (1 << 20) + b"}", "longer than"),
])
def test_the_spare_refuses_a_handoff_it_cannot_read(line: bytes, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_handoff(line)
    assert parse_handoff(b'{"argv": ["--rank", "0"], "home": "/h", "log": "/h/agent.log"}') == (
        ["--rank", "0"], "/h", "/h/agent.log")


def test_a_spare_whose_backend_goes_away_exits_without_running_anything(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", local_module.SPARE_MODULE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    out, err = proc.communicate(b"", timeout=60)
    assert proc.returncode == 0 and out == b"" and err == b"", err


def _sleeps(fn) -> list[str]:
    """The sleep calls in a function's source (asyncio.sleep, time.sleep): fixed waits."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == "sleep"]


@pytest.mark.parametrize("fn", [LocalAdapter._ensure_running, LocalAdapter._await_ready, LocalAdapter._spawn,
                                agent_module.Agent._watch_phase, agent_module.Agent.run])
def test_no_fixed_sleep_on_a_new_nodes_path(fn) -> None:
    """Removed in issue 21: the 50 ms look at the ready file (the ready pipe reacts), the 100 ms
    pause between looks at a running phase (its exit wakes the watcher: procs.ExitWatch)."""
    assert _sleeps(fn) == [], f"{fn.__qualname__} sleeps: react to the event instead"


def test_a_local_nodes_first_job_does_not_wait_for_its_user_environment(nats_server, tmp_path: Path,
                                                                         fast_agents) -> None:
    """The node's ~/sky-user-env is made right after NodeReady, before any job arrives."""
    async def main():
        bus = await connect_bus(nats_server)
        adapter = LocalAdapter(nats_server.url, "test", tmp_path / "state", spare=False)
        try:
            await provision(bus, adapter, "env", 1)
            home = Path(adapter.agents("env")[0]["home"])
            deadline = time.monotonic() + 30
            while not (home / "sky-user-env").is_dir() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            made_before_any_job = (home / "sky-user-env").is_dir()
            job, _ = await queue_job(bus, cluster="env", task_id="t", task={"run": "command -v pip"})
            end = await job_end(bus, "env", job.job_id)
            lines = rank_lines(await job_lines(bus, "env", job.job_id), 0)
            evs = await wait_events(bus, "env", lambda evs: bool(of(evs, "job_succeeded")))
            await terminate(adapter, "env")
        finally:
            await adapter.close()
            await bus.close()
        return made_before_any_job, end, lines, evs

    made, end, lines, evs = asyncio.run(main())
    assert made and end.EVENT_NAME == "job_succeeded"
    assert lines and lines[0].endswith("sky-user-env/bin/pip"), lines  # the job runs in it
    assert len(of(evs, "job_succeeded")) == 1


def test_the_spare_can_be_turned_off(tmp_path: Path) -> None:
    from skypurza.events.settings import SettingsError
    from skypurza.services.provisioner.backends import Backends
    from skypurza.services.provisioner.settings import ProvisionerSettings

    assert ProvisionerSettings.load(env={}, config={}).local_spare is True
    off = ProvisionerSettings.load(env={"SKYPURZA_LOCAL_SPARE": "0", "SKYPURZA_LOCAL_ROOT": str(tmp_path)}, config={})
    assert off.local_spare is False
    adapter = Backends(off, stage="test", nats_url="nats://127.0.0.1:1").get("local")
    assert adapter.spare is False
    adapter.warm()
    assert adapter.spare_pid() is None  # turned off: never started
    with pytest.raises(SettingsError, match="SKYPURZA_LOCAL_SPARE"):
        ProvisionerSettings.load(env={"SKYPURZA_LOCAL_SPARE": "sometimes"}, config={})


def test_the_spare_has_done_what_a_new_agent_would_import_later() -> None:
    """What a cold agent imports after NodeReady and at its first job is in the spare already."""
    probe = "import json, sys; import skypurza.services.agent.spare; print(json.dumps(sorted(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-800:]
    modules = set(__import__("json").loads(r.stdout))
    for later in ("skypurza.events.taskspec.task", "skypurza.services.agent.sampling", "venv",
                  "skypurza.services.agent.agent", "skypurza.events.bus"):
        assert later in modules, later
