"""The `slurm` backend: a cluster is one Slurm allocation, reached over SSH; its agents run here.

No daemon goes onto the cluster and its compute nodes never reach our bus. A launch:
1. `sbatch --parsable` on the login node with the generated script (slurm_sbatch.py): the batch
   script holds the allocation (`exec sleep infinity`) until `scancel`;
2. waits (bounded) until squeue says RUNNING and reads its nodes (`scontrol show node`);
3. starts one node agent per allocated node *on this machine* (as the local backend does, whose
   process handling this class inherits), with `--infra slurm` and where its node is: the agent
   runs each job phase as `ssh <login> srun --jobid=<alloc> --overlap -w <node> ...`
   (services/agent/slurmexec.py), so output, exit codes and cancels go through the SSH session.

terminate = `scancel` + the agents; stop is not offered by Slurm (an allocation cannot be
suspended and resumed on the same nodes from the outside), so stop terminates the allocation and
keeps the record, and start submits again. sbatch errors are classified by slurm_errors.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import time
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from skypurza.events import naming
from skypurza.events.agentspec import AgentSpec

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
    provision_error,
)
from .local import RECORD, START_SEQ, LocalAdapter
from skypurza.events.slurm_config import SlurmUserConfig, SshTarget, read_targets
from skypurza.events.slurmpath import slurm_config_path
from skypurza.events.slurm_discovery import (SlurmNode, ZoneOffer, expand_hostlist, parse_nodes, parse_partitions,
                                             zone_offers)
from . import slurm_account
from .slurm_errors import classify
from .slurm_sbatch import SbatchRequest, parse_shape, reservation_name, sbatch_options, script, with_account
from .slurm_ssh import SlurmSsh, SlurmSshError

log = logging.getLogger(__name__)

# Extra keys of the agents' spec (read by services/agent/slurmexec.py).
X_CONFIG, X_HOST, X_JOB, X_NODE, X_UID = "slurm_config", "slurm_host", "slurm_job", "slurm_node", "slurm_uid"
_PENDING_FATAL = ("PartitionNodeLimit", "PartitionTimeLimit", "AssocMaxJobsLimit", "QOSMaxJobsPerUserLimit",
                  "ReqNodeNotAvail", "BadConstraints", "InvalidAccount", "InvalidQOS")


def _error(failure: Failure, spec_or_ref: Any) -> ProvisionError:
    return provision_error(failure, infra="slurm", region=getattr(spec_or_ref, "region", None),
                           zone=getattr(spec_or_ref, "zone", None),
                           instance_type=getattr(spec_or_ref, "instance_type", None))


class SlurmAdapter(LocalAdapter):
    infra = "slurm"

    def __init__(self, nats_url: str, stage: str, root: Path | None = None, *, config_path: Path | None = None,
                 user_config: SlurmUserConfig | None = None, poll_s: float = 0.2, launch_timeout_s: float = 300.0,
                 pending_timeout_s: float = 60.0, ssh_factory: Callable[[SshTarget], SlurmSsh] = SlurmSsh,
                 ready_timeout_s: float = 60.0, account_wait_s: float = 10.0) -> None:
        super().__init__(nats_url, stage, root, ready_timeout_s=ready_timeout_s)
        self.config_path = config_path or slurm_config_path()
        self.user_config = user_config or SlurmUserConfig()
        self.poll_s = poll_s
        self.launch_timeout_s = launch_timeout_s
        self.pending_timeout_s = pending_timeout_s
        self._ssh_factory = ssh_factory
        self._ssh: dict[str, SlurmSsh] = {}
        self.account_wait_s = account_wait_s

    # ------------------------------------------------------------------ where things are

    def cluster_dir(self, cluster: str) -> Path:
        return self.root / "slurm" / naming.subject_token(cluster)

    def targets(self) -> dict[str, SshTarget]:
        found = read_targets(self.config_path)
        return {c: found[c] for c in self.user_config.allowed(list(found))}

    def ssh(self, slurm_cluster: str) -> SlurmSsh:
        conn = self._ssh.get(slurm_cluster)
        if conn is None:
            target = self.targets().get(slurm_cluster)
            if target is None:
                raise _error(Failure(FailureKind.UNSUPPORTED, FailureScope.REGION, "SlurmUnknownCluster",
                                     f"no Host {slurm_cluster} in {self.config_path} (or not in "
                                     "slurm.allowed_clusters)", f"add it to {self.config_path}"), None)
            conn = self._ssh[slurm_cluster] = self._ssh_factory(target)
        return conn

    async def _run(self, slurm_cluster: str, command: str, *, input: str | None = None,
                   timeout: float | None = None, where: Any = None):
        try:
            return await self.ssh(slurm_cluster).run(command, input=input, timeout=timeout)
        except SlurmSshError as exc:
            raise _error(classify(str(exc)), where) from None

    # ------------------------------------------------------------------ discovery

    async def discover(self, slurm_cluster: str) -> list[ZoneOffer]:
        """The cluster's partitions as zones (scontrol over SSH)."""
        res = await self._run(slurm_cluster, "scontrol show partition -o && echo '#nodes' && scontrol show node -o")
        if not res.ok:
            raise _error(classify(res.stderr or res.stdout), None)
        parts, _, nodes = res.stdout.partition("#nodes")
        return zone_offers(slurm_cluster, parse_partitions(parts), parse_nodes(nodes))

    # ------------------------------------------------------------------ the backend interface

    async def launch(self, spec: LaunchSpec) -> list[NodeInfo]:
        async with self._lock(spec.cluster):
            record = self._read(spec.cluster)
            if record is not None and record.get("launch_token") == spec.launch_token:
                state, _ = await self._job_state(record)
                if state in ("RUNNING", "CONFIGURING", "COMPLETING"):
                    await self._ensure_running(record)
                    return self._nodes(record)
            if record is not None:  # an earlier allocation under this name: ended and billed first
                await self._teardown(record, account=True)
            alloc = await self._allocate(spec)
            record = self._slurm_record(spec, alloc)
            self._write(spec.cluster, record)
            try:
                await self._ensure_running(record)
            except ProvisionError:
                await self._teardown(record)
                raise
            return self._nodes(record)

    async def describe(self, ref: ClusterRef) -> list[NodeInfo]:
        record = self._read(ref.cluster)
        if record is None:
            return []
        state, _ = await self._job_state(record)
        if state is None:  # the allocation is gone (scancel from outside, time limit, node failure)
            return [self._node_info(record, n, NodeState.TERMINATED) for n in record["nodes"]]
        return self._nodes(record)

    async def stop(self, ref: ClusterRef) -> list[NodeInfo]:
        # An allocation cannot be given back and taken again on the same nodes: stopping ends it
        # (the record stays, so start submits the same shape again).
        async with self._lock(ref.cluster):
            record = self._read(ref.cluster)
            if record is None:
                return []
            await self._cancel(record)
            await self._account(record)
            await self._kill_all(record)
            record["state"] = "stopped"
            self._write(ref.cluster, record)
            return self._nodes(record)

    async def start(self, ref: ClusterRef) -> list[NodeInfo]:
        record = self._read(ref.cluster)
        if record is None:
            return []
        spec = LaunchSpec(**record["spec"])
        async with self._lock(ref.cluster):
            alloc = await self._allocate(spec)
            fresh = self._slurm_record(spec, alloc)
            self._write(ref.cluster, fresh)
            await self._ensure_running(fresh)
            return self._nodes(fresh)

    async def terminate(self, ref: ClusterRef, *, release: bool = True) -> list[str]:
        async with self._lock(ref.cluster):
            record = self._read(ref.cluster)
            if record is None:
                return []
            await self._teardown(record, account=True)
            return [n["instance_id"] for n in record["nodes"]]

    async def release_unused(self, stage: str, regions: Iterable[str], *,
                             skip: Collection[str] = ()) -> ReleaseReport:
        return ReleaseReport()  # an allocation holds nothing beside itself

    async def list_owned(self, stage: str, regions: Sequence[str] | None = None) -> list[NodeInfo]:
        """Our records' nodes, and every allocation Slurm holds under this stage's job names that
        no record knows (a lost record must not leave an allocation running for ever): those are
        listed by job id, with the cluster their name says."""
        if stage != self.stage:
            return []
        out: list[NodeInfo] = []
        known: set[str] = set()
        base = self.root / "slurm"
        for d in sorted(base.iterdir()) if base.is_dir() else ():
            try:
                record = json.loads((d / RECORD).read_text())
            except (OSError, ValueError):
                continue
            if record.get("stage") == stage and (regions is None or record.get("region") in regions):
                out.extend(self._nodes(record))
                known.add(str(record.get("slurm_job_id")))
        prefix = naming.slurm_job_name(stage, "x")[:-1]
        for slurm_cluster in self.targets():
            if regions is not None and slurm_cluster not in regions:
                continue
            try:
                res = await self._run(slurm_cluster, "squeue -h -o '%i|%j|%T'")
            except ProvisionError as exc:  # one cluster that does not answer hides nothing of the others
                log.warning("slurm %s: cannot list allocations: %s", slurm_cluster, exc)
                continue
            for line in res.stdout.splitlines():
                job_id, _, rest = line.strip().partition("|")
                name, _, state = rest.partition("|")
                if name.startswith(prefix) and job_id not in known and state not in ("COMPLETING", "CANCELLED"):
                    out.append(NodeInfo(instance_id=f"{job_id}.0", rank=0, state=NodeState.RUNNING,
                                        region=slurm_cluster, stage=stage, cluster=name[len(prefix):]))
        return out

    async def terminate_nodes(self, stage: str, nodes: Sequence[NodeInfo]) -> list[str]:
        # One node of an allocation cannot be given back alone: the whole allocation goes.
        done: list[str] = []
        for node in nodes:
            if node.instance_id in done:
                continue
            record = self._read(node.cluster) if node.cluster else None
            if record is not None and record.get("stage") == stage and \
                    node.instance_id.split(".")[0] == str(record.get("slurm_job_id")):
                done += await self.terminate(ClusterRef(stage=stage, cluster=node.cluster or "", infra="slurm"))
                continue
            job_id = node.instance_id.split(".")[0]
            if job_id.isdigit() and node.region and node.stage == stage:  # an allocation no record knows
                res = await self._run(node.region, f"squeue -h -j {job_id} -o %j")
                if res.stdout.strip().startswith(naming.slurm_job_name(stage, "x")[:-1]):  # still ours
                    await self._run(node.region, f"scancel {job_id}")
                    done.append(node.instance_id)
        return done

    async def close(self) -> None:
        await super().close()
        for conn in list(self._ssh.values()):
            await conn.close()
        self._ssh.clear()

    # ------------------------------------------------------------------ allocations

    def sbatch_request(self, spec: LaunchSpec, max_time: str | None) -> SbatchRequest:
        shape = parse_shape(spec.instance_type)
        cfg = self.user_config.cluster(spec.region).for_partition(spec.zone)
        where = f"slurm.cluster_configs.{spec.region}.sbatch_options"
        out_dir = naming.slurm_dir(spec.stage, spec.cluster)
        return SbatchRequest(
            job_name=naming.slurm_job_name(spec.stage, spec.cluster), output=f"{out_dir}/alloc-%j.out",
            nodes=spec.num_nodes, cpus_per_task=shape.cpus, mem_mib=shape.mem_mib, accelerator=shape.accelerator,
            accelerator_count=shape.accelerator_count, gres=cfg.gres, gpu_directive=cfg.gpu_directive,
            partition=spec.zone, max_time=max_time,
            options=with_account(sbatch_options(cfg.sbatch_options, where), spec.slurm_account),
            reservation=reservation_name(spec.reservation_id) if spec.reservation_kind == "slurm" else None)

    async def _allocate(self, spec: LaunchSpec) -> dict[str, Any]:
        """sbatch, then wait until the allocation runs: its job id and nodes (name, address) by rank."""
        max_time = None
        if spec.zone:
            res = await self._run(spec.region, f"scontrol show partition -o {shlex.quote(spec.zone)}", where=spec)
            parts = parse_partitions(res.stdout) if res.ok else []
            if not parts:
                raise _error(classify(res.stderr or f"Invalid partition name specified: {spec.zone}"), spec)
            max_time = parts[0].max_time
        try:
            body = script(self.sbatch_request(spec, max_time))
        except ValueError as exc:
            raise _error(Failure(FailureKind.INVALID, FailureScope.REQUEST, "SlurmInvalidOptions", str(exc)),
                         spec) from None
        uid = self._unix_user(spec)
        res = await self._run(spec.region, submit_command(naming.slurm_dir(spec.stage, spec.cluster), uid),
                              input=body, where=spec)
        if not res.ok:
            raise _error(classify(res.stderr or res.stdout), spec)
        job_id = res.stdout.strip().split(";")[0].strip()
        if not job_id.isdigit():
            raise _error(classify(f"sbatch answered no job id: {res.stdout!r} {res.stderr!r}"), spec)
        try:
            nodes = await self._wait_running(spec, job_id)
        except BaseException:
            await self._run(spec.region, f"scancel {job_id}", where=spec)
            raise
        async def run(command: str):
            return await self._run(spec.region, command, where=spec)

        return {"job_id": job_id, "nodes": [{"name": n.name, "addr": n.addr} for n in nodes],
                "accounting": await slurm_account.facts(run, job_id), "uid": uid}

    def _unix_user(self, spec: LaunchSpec) -> str | None:
        """The Unix account submit_as_user names for the submission's user (None: the login's own)."""
        cfg = self.user_config.cluster(spec.region)
        unix = cfg.unix_user(spec.user)
        if unix and cfg.submit_mode != "uid":
            raise _error(Failure(FailureKind.UNSUPPORTED, FailureScope.REGION, "SlurmSubmitMode",
                                 f"slurm.cluster_configs.{spec.region}.submit_mode: {cfg.submit_mode} is not "
                                 "offered yet", "use submit_mode: uid from a login identity Slurm allows"), spec)
        return unix

    async def _wait_running(self, spec: LaunchSpec, job_id: str) -> list[SlurmNode]:
        started = time.monotonic()
        while True:
            res = await self._run(spec.region, f"squeue -h -j {job_id} -o '%T|%N|%r'", where=spec)
            state, _, rest = res.stdout.strip().partition("|")
            nodelist, _, reason = rest.partition("|")
            if state == "RUNNING" and nodelist:
                names = expand_hostlist(nodelist)
                shown = await self._run(spec.region, f"scontrol show node -o {shlex.quote(nodelist)}", where=spec)
                by_name = {n.name: n for n in parse_nodes(shown.stdout)}
                return [by_name.get(n) or SlurmNode(n, n, 0, 0) for n in names]
            waited = time.monotonic() - started
            if state in ("", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY",
                         "COMPLETED", "PREEMPTED", "DEADLINE"):
                raise _error(Failure(FailureKind.CAPACITY, FailureScope.ZONE, "SlurmAllocationEnded",
                                     f"allocation {job_id} ended before it ran ({state or 'gone'} {reason})"), spec)
            if state == "PENDING" and (any(r in reason for r in _PENDING_FATAL) or waited > self.pending_timeout_s):
                raise _error(Failure(FailureKind.CAPACITY, FailureScope.ZONE, "SlurmPending",
                                     f"allocation {job_id} still pending after {waited:.0f}s ({reason})",
                                     "the partition is full; another placement may have room"), spec)
            if waited > self.launch_timeout_s:
                raise _error(Failure(FailureKind.CAPACITY, FailureScope.ZONE, "SlurmLaunchTimeout",
                                     f"allocation {job_id} not running after {waited:.0f}s ({state})"), spec)
            await asyncio.sleep(self.poll_s)

    async def _job_state(self, record: dict[str, Any]) -> tuple[str | None, str]:
        job_id = record.get("slurm_job_id")
        if not job_id:
            return None, ""
        try:
            res = await self._run(record["region"], f"squeue -h -j {job_id} -o '%T|%N'")
        except ProvisionError as exc:
            return "UNKNOWN", str(exc)  # the login node does not answer: not proof the allocation is gone
        state = res.stdout.strip().partition("|")[0]
        return (state or None), res.stderr

    async def _cancel(self, record: dict[str, Any]) -> None:
        job_id = record.get("slurm_job_id")
        if job_id:
            res = await self._run(record["region"], f"scancel {job_id}")
            if not res.ok and "Invalid job id" not in res.stderr:
                raise _error(classify(res.stderr), None)

    async def _teardown(self, record: dict[str, Any], *, account: bool = False) -> None:
        if account and record.get("state") == "running" and not record.get("ending"):
            # On disk before the scancel: a provisioner that dies between the scancel and the
            # accounting finds the record at its next start (settle_accounts).
            record["ending"] = True
            self._write(record["cluster"], record)
        await self._cancel(record)
        if account:
            await self._account(record)
        await self._kill_all(record)
        import shutil

        shutil.rmtree(self.cluster_dir(record["cluster"]), ignore_errors=True)

    async def _account(self, record: dict[str, Any]) -> None:
        """Read what the allocation used (sacct, bounded) once, and keep it on disk until the
        provisioner has published it (take_accounts, forget_accounts)."""
        if record.get("state") != "running" or record.get("accounted"):
            return  # a stopped cluster's allocation was accounted when it stopped
        record["accounted"] = True

        async def run(command: str):
            return await self._run(record["region"], command)

        ev = await slurm_account.account(run, record, record["cluster"], datetime.now(timezone.utc),
                                         wait_s=self.account_wait_s, poll_s=min(0.5, max(0.05, self.poll_s)))
        if ev is not None:
            slurm_account.keep(self._accounts_dir(), ev)

    def _accounts_dir(self) -> Path:
        return self.root / "slurm-accounts"

    def take_accounts(self, cluster: str) -> list[Any]:
        """The SlurmAllocationAccounted of the cluster's ended allocations not yet published."""
        return [ev for ev in slurm_account.kept(self._accounts_dir()) if ev.cluster == cluster]

    def forget_accounts(self, events: Iterable[Any]) -> None:
        """The provisioner published these: nothing to publish again after a restart."""
        slurm_account.forget(self._accounts_dir(), events)

    async def settle_accounts(self) -> list[Any]:
        """At the provisioner's start: every accounting not yet published, including that of an
        allocation whose teardown a dead provisioner began (scancel, then no accounting): that
        one is ended again (scancel is idempotent) and read from sacct now."""
        base = self.root / "slurm"
        for d in sorted(base.iterdir()) if base.is_dir() else ():
            try:
                record = json.loads((d / RECORD).read_text())
            except (OSError, ValueError):
                continue
            if record.get("stage") != self.stage or not record.get("ending"):
                continue
            async with self._lock(record["cluster"]):
                again = self._read(record["cluster"])
                if again is not None and again.get("ending"):
                    try:
                        await self._teardown(again, account=True)
                    except ProvisionError as exc:  # the login node away: the next start tries again
                        log.warning("slurm %s: cannot settle allocation %s: %s", again.get("region"),
                                    again.get("slurm_job_id"), exc)
        return slurm_account.kept(self._accounts_dir())

    def _slurm_record(self, spec: LaunchSpec, alloc: dict[str, Any]) -> dict[str, Any]:
        ips = [n["addr"] for n in alloc["nodes"]]
        nodes = []
        for rank, node in enumerate(alloc["nodes"]):
            home = self.node_home(spec.cluster, rank)
            instance_id = f"{alloc['job_id']}.{rank}"
            extra = {X_CONFIG: str(self.config_path), X_HOST: spec.region, X_JOB: alloc["job_id"],
                     X_NODE: node["name"]}
            if spec.labels.get(START_SEQ):
                extra[START_SEQ] = str(spec.labels[START_SEQ])
            if alloc.get("uid"):
                extra[X_UID] = alloc["uid"]
            agent = AgentSpec(nats_url=self.nats_url, stage=spec.stage, cluster=spec.cluster, rank=rank,
                              num_nodes=spec.num_nodes, node_ips=tuple(ips), instance_id=instance_id, infra="slurm",
                              region=spec.region, zone=spec.zone, home=str(home), extra=extra)
            nodes.append({"rank": rank, "instance_id": instance_id, "home": str(home), "argv": agent.command(),
                          "pid": None, "slurm_node": node["name"], "addr": node["addr"]})
        spec_record = {k: getattr(spec, k) for k in ("stage", "cluster", "launch_token", "instance_type", "region",
                                                      "zone", "num_nodes", "infra", "task_id", "job_id", "user",
                                                      "slurm_account")}  # start charges the same account
        spec_record["labels"] = dict(spec.labels)
        return {"cluster": spec.cluster, "stage": spec.stage, "launch_token": spec.launch_token,
                "num_nodes": spec.num_nodes, "region": spec.region, "zone": spec.zone,
                "instance_type": spec.instance_type, "job_id": spec.job_id, "slurm_job_id": alloc["job_id"],
                "accounting": alloc.get("accounting", {}), "unix_user": alloc.get("uid"),
                "launched_at": datetime.now(timezone.utc).isoformat(), "state": "running", "nodes": nodes,
                "spec": spec_record}

    def _node_info(self, record: dict[str, Any], node: dict[str, Any], state: NodeState) -> NodeInfo:
        launched = datetime.fromisoformat(record["launched_at"]) if record.get("launched_at") else None
        return NodeInfo(
            instance_id=node["instance_id"], rank=node["rank"], state=state, region=record.get("region"),
            zone=record.get("zone"), instance_type=record.get("instance_type"), use_spot=False,
            private_ip=node.get("addr"), public_ip=None, stage=record.get("stage"), cluster=record["cluster"],
            job_id=record.get("job_id"), launch_token=record.get("launch_token"), launched_at=launched)

    def _nodes(self, record: dict[str, Any]) -> list[NodeInfo]:
        from skypurza.events.processes import pid_alive

        out = []
        for node in record["nodes"]:
            if record.get("state") == "stopped":
                state = NodeState.STOPPED
            else:
                state = NodeState.RUNNING if pid_alive(node.get("pid")) else NodeState.PENDING
            out.append(self._node_info(record, node, state))
        return out


def submit_command(out_dir: str, uid: str | None) -> str:
    """The login node's side of a submission (the script comes on stdin). With `uid`, sbatch
    submits as that account (root or SlurmUser only) from its own home, where the allocation's
    output directory is made and given to it: the job opens its output as that account."""
    if not uid:
        return f"mkdir -p {shlex.quote(out_dir)} && sbatch --parsable"
    u, top = shlex.quote(uid), shlex.quote(out_dir.split("/")[0])
    return (f'h=$(getent passwd {u} | cut -d: -f6); [ -n "$h" ] || {{ echo "sbatch: error: Invalid user id: "{u} >&2; '
            f'exit 1; }}; cd "$h" && mkdir -p {shlex.quote(out_dir)} && chown -R {u}: {top} && '
            f'sbatch --parsable --uid={u} --gid="$(id -g {u})"')
