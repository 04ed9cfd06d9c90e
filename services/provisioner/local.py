"""The `local` backend: this machine as a cluster of N nodes, each node one agent process.

A gang of N nodes is N agent processes (`python -m skypurza.services.agent ...`), each in a
session of its own (so they outlive the control plane that started them) and each with its
own home, `<root>/clusters/<cluster>/node-<rank>`: the workdir, file mounts and job files of
that node live there. Every node's IP is 127.0.0.1.

What each agent runs is the command EC2's user-data would run: when the LaunchSpec carries a
user-data script, the agent command is read from it (`userdata.agent_spec`), with this node's
rank, id and home; otherwise it is built from the LaunchSpec, with `labels["start_seq"]`.

- launch is idempotent per launch token (the same token finds the same gang); a new token for
  a cluster name that still exists replaces the old gang;
- stop terminates the agents and their jobs but keeps the homes; start spawns the agents again
  from the recorded commands;
- terminate kills the agents and every job process group they recorded, and removes the homes.

The agents record the process groups of running jobs in `<home>/.spz-agent/run/*.pgid`
(docs/agent.md); that file layout is the only thing shared with the agent.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from skypurza.events import naming
from skypurza.events.agentspec import READY_FD_VAR, READY_LINE, AgentSpec
from skypurza.events.processes import group_alive, pid_alive

from .adapter import (
    ClusterRef,
    Failure,
    FailureKind,
    FailureScope,
    LaunchSpec,
    NodeInfo,
    NodeState,
    ProvisionError,
    ReleaseReport,
)

LOCAL_IP = "127.0.0.1"
RECORD = "cluster.json"
# Every node's IP, one a line, written once per gang: the agents read it (AgentSpec.node_ips_file)
# so that what the provisioner builds and records for N nodes stays O(N), not N command lines of
# N IPs each.
NODE_IPS = "node_ips"
START_SEQ = "start_seq"
# The agent's own directory in its home, and what it writes there (see docs/agent.md).
AGENT_STATE = ".spz-agent"
AGENT_READY = "ready"
AGENT_LOG = "agent.log"
# The agent's entry point (AgentSpec.command) and the spare that becomes one (services/agent/spare.py).
AGENT_MODULE = "skypurza.services.agent"
SPARE_MODULE = "skypurza.services.agent.spare"


@dataclass
class _Spare:
    """An agent process that has done its imports and waits on stdin for the node it will run."""

    proc: subprocess.Popen
    ready_r: int  # the read end of its ready pipe (agentspec.READY_FD_VAR)
    environ: dict[str, str]  # what it was started with: a changed environment makes it stale


class LocalAdapter:
    infra = "local"

    def __init__(self, nats_url: str, stage: str, root: Path | None = None, *,
                 ready_timeout_s: float = 60.0, kill_grace_s: float = 5.0, spare: bool = True) -> None:
        self.nats_url = nats_url
        self.stage = naming.check_stage(stage)
        self.root = Path(root) if root is not None else naming.state_dir(stage)
        self.ready_timeout_s = ready_timeout_s
        self.kill_grace_s = kill_grace_s
        self._children: dict[int, subprocess.Popen] = {}
        # One pre-started agent (issue 21): a cold agent spends ~0.35 s importing before it can
        # announce NodeReady, and its first job imports the task spec; the spare has done both.
        # Made after a launch, so the first launch of a provisioner starts its agents cold.
        self.spare = spare
        self._spare: _Spare | None = None
        # One lock per cluster: nothing is shared between local clusters, so tearing down (or
        # launching) seventeen of them runs side by side, not one after another.
        self._locks: dict[str, asyncio.Lock] = {}

    # ------------------------------------------------------------------ paths and records

    def cluster_dir(self, cluster: str) -> Path:
        return self.root / "clusters" / naming.subject_token(cluster)

    def node_home(self, cluster: str, rank: int) -> Path:
        return self.cluster_dir(cluster) / f"node-{rank}"

    def _read(self, cluster: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.cluster_dir(cluster) / RECORD).read_text())
        except (OSError, ValueError):
            return None

    def _write(self, cluster: str, record: dict[str, Any]) -> None:
        path = self.cluster_dir(cluster) / RECORD
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(path)

    def agents(self, cluster: str) -> list[dict[str, Any]]:
        """The cluster's nodes as recorded: rank, instance_id, home, argv and the agent's pid."""
        record = self._read(cluster)
        return [dict(n) for n in record["nodes"]] if record is not None else []

    # ------------------------------------------------------------------ the backend interface

    def _lock(self, cluster: str) -> asyncio.Lock:
        return self._locks.setdefault(cluster, asyncio.Lock())

    async def launch(self, spec: LaunchSpec) -> list[NodeInfo]:
        async with self._lock(spec.cluster):
            record = self._read(spec.cluster)
            if record is not None and record.get("launch_token") == spec.launch_token:
                if record.get("state") == "stopped":
                    return self._nodes(record)
                await self._ensure_running(record)
                return self._nodes(record)
            if record is not None:
                await self._kill_all(record)
                shutil.rmtree(self.cluster_dir(spec.cluster), ignore_errors=True)
            record = self._new_record(spec)
            self._write(spec.cluster, record)
            try:
                await self._ensure_running(record)
            except ProvisionError:
                await self._kill_all(record)
                shutil.rmtree(self.cluster_dir(spec.cluster), ignore_errors=True)
                raise
            return self._nodes(record)

    async def describe(self, ref: ClusterRef) -> list[NodeInfo]:
        record = self._read(ref.cluster)
        return self._nodes(record) if record is not None else []

    async def stop(self, ref: ClusterRef) -> list[NodeInfo]:
        async with self._lock(ref.cluster):
            record = self._read(ref.cluster)
            if record is None:
                return []
            await self._kill_all(record)
            record["state"] = "stopped"
            record["stopped_at"] = datetime.now(timezone.utc).isoformat()
            self._write(ref.cluster, record)
            return self._nodes(record)

    async def start(self, ref: ClusterRef) -> list[NodeInfo]:
        async with self._lock(ref.cluster):
            record = self._read(ref.cluster)
            if record is None:
                return []
            record["state"] = "running"
            self._write(ref.cluster, record)
            await self._ensure_running(record)
            return self._nodes(record)

    async def terminate(self, ref: ClusterRef, *, release: bool = True) -> list[str]:
        # Nothing is shared between local clusters: `release` has nothing to do here.
        async with self._lock(ref.cluster):
            record = self._read(ref.cluster)
            if record is None:
                shutil.rmtree(self.cluster_dir(ref.cluster), ignore_errors=True)
                return []
            await self._kill_all(record)
            shutil.rmtree(self.cluster_dir(ref.cluster), ignore_errors=True)
            return [n["instance_id"] for n in record["nodes"]]

    async def release_unused(self, stage: str, regions: Iterable[str], *,
                             skip: Collection[str] = ()) -> ReleaseReport:
        return ReleaseReport()  # a local cluster's home goes with it: no resources beside the nodes

    async def list_owned(self, stage: str, regions: Sequence[str] | None = None) -> list[NodeInfo]:
        if stage != self.stage:
            return []
        out: list[NodeInfo] = []
        base = self.root / "clusters"
        if not base.is_dir():
            return out
        for d in sorted(base.iterdir()):
            try:
                record = json.loads((d / RECORD).read_text())
            except (OSError, ValueError):
                continue
            if record.get("stage") == stage:
                out.extend(self._nodes(record))
        return out

    async def terminate_nodes(self, stage: str, nodes: Sequence[NodeInfo]) -> list[str]:
        if stage != self.stage:
            return []
        done: list[str] = []
        for cluster in sorted({n.cluster for n in nodes if n.cluster}):
            record = self._read(cluster)
            if record is None or record.get("stage") != stage:
                continue
            ids = {n.instance_id for n in nodes if n.cluster == cluster}
            async with self._lock(cluster):
                for node in record["nodes"]:
                    if node["instance_id"] in ids:
                        await self._kill_node(node)
                        shutil.rmtree(node["home"], ignore_errors=True)
                        done.append(node["instance_id"])
                record["nodes"] = [n for n in record["nodes"] if n["instance_id"] not in ids]
                if record["nodes"]:
                    self._write(cluster, record)
                else:
                    shutil.rmtree(self.cluster_dir(cluster), ignore_errors=True)
        return done

    def spare_pid(self) -> int | None:
        """The pre-started agent waiting for the next node, if one runs."""
        spare = self._spare
        return spare.proc.pid if spare is not None and spare.proc.poll() is None else None

    async def drop_spare(self) -> None:
        """End the pre-started agent, if any (the next node starts cold unless one is made again)."""
        spare, self._spare = self._spare, None
        if spare is not None:
            self._end_spare(spare)
            os.close(spare.ready_r)
            try:
                await asyncio.to_thread(spare.proc.wait, self.kill_grace_s)
            except subprocess.TimeoutExpired:
                spare.proc.kill()
                await asyncio.to_thread(spare.proc.wait, self.kill_grace_s)

    async def close(self) -> None:
        await self.drop_spare()  # the spare is ours, not a node's: end of its input ends it
        # Agents outlive the provisioner on purpose; only reap the ones that already exited.
        for pid, proc in list(self._children.items()):
            if proc.poll() is not None:
                self._children.pop(pid, None)

    # ------------------------------------------------------------------ gangs

    def _new_record(self, spec: LaunchSpec) -> dict[str, Any]:
        now = datetime.now(timezone.utc).isoformat()
        ips_file = self.cluster_dir(spec.cluster) / NODE_IPS
        ips_file.parent.mkdir(parents=True, exist_ok=True)
        ips_file.write_text("".join(f"{LOCAL_IP}\n" for _ in range(spec.num_nodes)))
        nodes = []
        for rank in range(spec.num_nodes):
            home = self.node_home(spec.cluster, rank)
            agent = self.agent_spec(spec, rank, home)
            nodes.append({"rank": rank, "instance_id": agent.instance_id, "home": str(home),
                          "argv": agent.command(), "pid": None})
        return {"cluster": spec.cluster, "stage": spec.stage, "launch_token": spec.launch_token,
                "num_nodes": spec.num_nodes, "region": spec.region, "zone": spec.zone,
                "instance_type": spec.instance_type, "job_id": spec.job_id, "launched_at": now,
                "state": "running", "nodes": nodes}

    def agent_spec(self, spec: LaunchSpec, rank: int, home: Path) -> AgentSpec:
        """What node `rank` runs: the user-data's agent command when there is one, else one built here."""
        instance_id = naming.instance_name(spec.stage, spec.cluster, rank)
        ips_file = str(self.cluster_dir(spec.cluster) / NODE_IPS)  # written by _new_record
        if spec.user_data:
            from .userdata import agent_spec as from_user_data

            agent = from_user_data(spec.user_data, rank=rank, instance_id=instance_id, zone=spec.zone,
                                   home=str(home))
            if agent.node_ips or agent.node_ips_file:
                return replace(agent, infra="local")
            return replace(agent, node_ips_file=ips_file, infra="local")
        extra = {START_SEQ: str(spec.labels[START_SEQ])} if spec.labels.get(START_SEQ) else {}
        return AgentSpec(nats_url=self.nats_url, stage=spec.stage, cluster=spec.cluster, rank=rank,
                         num_nodes=spec.num_nodes, node_ips_file=ips_file, instance_id=instance_id, infra="local",
                         region=spec.region if spec.region != "local" else None, zone=spec.zone,
                         home=str(home), extra=extra)

    async def _ensure_running(self, record: dict[str, Any]) -> None:
        """Spawn every node whose agent does not run, then wait until each says it is ready."""
        spawned: list[tuple[dict[str, Any], subprocess.Popen, int]] = []
        try:
            for node in record["nodes"]:
                if pid_alive(node.get("pid")):
                    continue
                home = Path(node["home"])
                (home / AGENT_STATE).mkdir(parents=True, exist_ok=True)
                (home / AGENT_STATE / AGENT_READY).unlink(missing_ok=True)
                proc, ready_r = self._spawn(node, home)
                self._children[proc.pid] = proc
                node["pid"] = proc.pid
                spawned.append((node, proc, ready_r))
        except BaseException:
            for _, _, fd in spawned:
                os.close(fd)
            raise
        self._write(record["cluster"], record)
        deadline = time.monotonic() + self.ready_timeout_s
        waits = [asyncio.ensure_future(self._await_ready(node, proc, fd, deadline)) for node, proc, fd in spawned]
        if not waits:
            return
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_EXCEPTION)
        for w in pending:
            w.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for w in waits:
            if w.done() and not w.cancelled() and w.exception() is not None:
                raise w.exception()  # type: ignore[misc]
        self.warm()

    def _spawn(self, node: dict[str, Any], home: Path) -> tuple[subprocess.Popen, int]:
        """Node `node`'s agent: the spare, handed its argv, when there is one; else a cold start.
        Returns the process and the read end of its ready pipe."""
        argv = list(node["argv"])
        argv[0] = sys.executable if not Path(argv[0]).exists() else argv[0]
        spare = self._take_spare(argv)
        if spare is not None:
            handoff = {"argv": argv[3:], "home": str(home), "log": str(home / AGENT_LOG)}
            try:
                assert spare.proc.stdin is not None
                spare.proc.stdin.write(json.dumps(handoff).encode() + b"\n")
                spare.proc.stdin.close()
                return spare.proc, spare.ready_r
            except OSError:  # it died while it waited: start this node cold
                self._end_spare(spare)
                os.close(spare.ready_r)
        ready_r, ready_w = os.pipe()
        try:
            with open(home / AGENT_LOG, "ab") as out:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, cwd=str(home), pass_fds=(ready_w,),
                                        env={**os.environ, "PYTHONUNBUFFERED": "1", READY_FD_VAR: str(ready_w)})
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            os.close(ready_w)
        return proc, ready_r

    def _take_spare(self, argv: list[str]) -> _Spare | None:
        """The spare, if it can be this agent: the same Python, the agent's module, the same
        environment as a cold start would get now, and still alive."""
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        if argv[:3] == [sys.executable, "-m", AGENT_MODULE] and spare.environ == dict(os.environ) \
                and spare.proc.poll() is None:
            return spare
        self._end_spare(spare)
        os.close(spare.ready_r)
        return None

    def warm(self) -> None:
        """Start the spare agent now if there is none (it is made after each launch otherwise)."""
        if not self.spare or (self._spare is not None and self._spare.proc.poll() is None):
            return
        ready_r, ready_w = os.pipe()
        environ = dict(os.environ)
        try:
            proc = subprocess.Popen([sys.executable, "-m", SPARE_MODULE], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                    pass_fds=(ready_w,),
                                    env={**environ, "PYTHONUNBUFFERED": "1", READY_FD_VAR: str(ready_w)})
        except OSError:  # no spare: the next node starts cold
            os.close(ready_r)
            return
        finally:
            os.close(ready_w)
        self._spare = _Spare(proc, ready_r, environ)

    def _end_spare(self, spare: _Spare) -> None:
        try:
            if spare.proc.stdin is not None:
                spare.proc.stdin.close()  # end of input: it exits without running anything
        except OSError:
            pass
        if spare.proc.poll() is None:
            self._children[spare.proc.pid] = spare.proc  # reaped with the others

    async def _await_ready(self, node: dict[str, Any], proc: subprocess.Popen, fd: int, deadline: float) -> None:
        """Until the agent writes to its ready pipe (ready) or closes it unready (it exited)."""
        loop = asyncio.get_running_loop()
        said: asyncio.Future[bytes] = loop.create_future()

        def readable() -> None:
            try:
                data = os.read(fd, len(READY_LINE))
            except OSError:
                data = b""
            if not said.done():
                said.set_result(data)

        loop.add_reader(fd, readable)
        try:
            data = await asyncio.wait_for(said, max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise self._failed(node, f"the agent of node {node['rank']} was not ready within "
                                     f"{self.ready_timeout_s:.0f}s") from None
        finally:
            loop.remove_reader(fd)
            os.close(fd)
        if data == READY_LINE or (Path(node["home"]) / AGENT_STATE / AGENT_READY).exists():
            return
        try:  # the pipe closed unready: the agent is exiting, its status follows at once
            code = await asyncio.to_thread(proc.wait, self.kill_grace_s)
        except subprocess.TimeoutExpired:
            raise self._failed(node, f"the agent of node {node['rank']} closed its ready pipe unready") from None
        raise self._failed(node, f"the agent of node {node['rank']} exited with {code}")

    def _failed(self, node: dict[str, Any], message: str) -> ProvisionError:
        log_file = Path(node["home"]) / AGENT_LOG
        try:
            tail = log_file.read_text(errors="replace")[-1500:]
        except OSError:
            tail = ""
        failure = Failure(FailureKind.UNKNOWN, FailureScope.REQUEST, "LocalAgentFailed",
                          message + (f"; its log ends:\n{tail}" if tail else ""),
                          hint=f"see {log_file}")
        return ProvisionError(failure, infra="local", region=None)

    async def _kill_all(self, record: dict[str, Any]) -> None:
        await asyncio.gather(*(self._kill_node(n) for n in record["nodes"]))
        for node in record["nodes"]:
            node["pid"] = None

    async def _kill_node(self, node: dict[str, Any]) -> None:
        """The node's agent, then every job process group it recorded: a stopped machine runs nothing."""
        pid = node.get("pid")
        if pid_alive(pid):
            await self._terminate(pid, group=True)
        run_dir = Path(node["home"]) / AGENT_STATE / "run"
        if run_dir.is_dir():
            for f in run_dir.glob("*.pgid"):
                try:
                    pgid = int(f.read_text().strip())
                except (OSError, ValueError):
                    continue
                if group_alive(pgid):
                    await self._terminate(pgid, group=True)
        proc = self._children.pop(pid, None) if pid else None
        if proc is not None:
            proc.poll()

    async def _terminate(self, pid: int, *, group: bool) -> None:
        send = os.killpg if group else os.kill
        try:
            send(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + self.kill_grace_s
        while time.monotonic() < deadline:
            proc = self._children.get(pid)
            if proc is not None:
                proc.poll()
            alive = group_alive(pid) if group else pid_alive(pid)
            if not alive:
                return
            await asyncio.sleep(0.05)
        try:
            send(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _nodes(self, record: dict[str, Any]) -> list[NodeInfo]:
        launched = datetime.fromisoformat(record["launched_at"]) if record.get("launched_at") else None
        out = []
        for node in record["nodes"]:
            if record.get("state") == "stopped":
                state = NodeState.STOPPED
            else:
                state = NodeState.RUNNING if pid_alive(node.get("pid")) else NodeState.STOPPED
            out.append(NodeInfo(
                instance_id=node["instance_id"], rank=node["rank"], state=state, region=record.get("region"),
                zone=record.get("zone"), instance_type=record.get("instance_type"), use_spot=False,
                private_ip=LOCAL_IP, public_ip=LOCAL_IP, stage=record.get("stage"), cluster=record["cluster"],
                job_id=record.get("job_id"), launch_token=record.get("launch_token"), launched_at=launched,
            ))
        return out
