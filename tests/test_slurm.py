"""The Slurm backend: its pure parts line by line, then against a real Slurm 22.05 over SSH.

The rig (tests/support/slurm_rig.py) is one per session: munge on a private socket, slurmctld,
two slurmd "nodes" with two fake H100s each (char devices, so GRES is real), an sshd login node.
Jobs run through real node agents on a real nats-server, as srun steps of the allocation.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from agent_harness import job_end, job_lines, wait_lines
from nats_fixtures import connect_bus
from slurm_rig import CLUSTER, GPU_PARTITION, SlurmRig

from skypurza.events import naming
from skypurza.events.jobqueue import queue_job
from skypurza.events.models import CancelRequested, Candidate, ClusterProvisioned, NodeInfo as EventNode
from skypurza.events.envelope import utcnow
from skypurza.services.agent import slurmexec
from skypurza.events import slurm_config
from skypurza.events import slurm_discovery
from skypurza.services.provisioner import slurm_errors, slurm_sbatch
from skypurza.services.provisioner.adapter import (CapacityError, ClusterRef, FailureKind, FailureScope,
                                                   FatalProvisionError, LaunchSpec)
from skypurza.services.provisioner.slurm import SlurmAdapter

# ------------------------------------------------------------------------------ ~/.slurm/config

SKYPILOT_STYLE = """\
# the same file SkyPilot reads
Host mycluster
    HostName login.example.org
    User alice
    IdentityFile ~/.ssh/slurm_key
Host other gpu-*
  HostName=10.1.2.3
  Port = 2222
Host *
    User fallback
    IdentityFile ~/.ssh/id_ed25519
    StrictHostKeyChecking no
"""


def test_slurm_config_is_read_as_ssh_reads_it() -> None:
    blocks = slurm_config.parse_ssh_config(SKYPILOT_STYLE)
    assert slurm_config.cluster_names(blocks) == ["mycluster", "other"]
    mine = slurm_config.lookup(blocks, "mycluster")
    assert (mine.hostname, mine.port, mine.user) == ("login.example.org", 22, "alice")
    assert mine.identity_files == ("~/.ssh/slurm_key", "~/.ssh/id_ed25519")  # IdentityFile accumulates
    assert mine.strict_host_key_checking is False
    other = slurm_config.lookup(blocks, "other")
    assert (other.hostname, other.port, other.user) == ("10.1.2.3", 2222, "fallback")
    # a glob host matches names without being a cluster of its own
    assert slurm_config.lookup(blocks, "gpu-7").hostname == "10.1.2.3"
    with pytest.raises(slurm_config.SlurmConfigError, match=r"Port 'x' is not a number"):
        slurm_config.lookup(slurm_config.parse_ssh_config("Host a\n Port x\n"), "a")
    with pytest.raises(slurm_config.SlurmConfigError, match=r":2: port has no value"):
        slurm_config.parse_ssh_config("Host a\n Port\n")


def test_slurm_user_config_pricing_and_errors_name_their_key() -> None:
    cfg = slurm_config.parse_user_config({
        "allowed_clusters": ["a"],
        "pricing": {"cpu": 0.1, "memory": 0.01, "accelerators": {"V100": 2.5}},
        "cluster_configs": {"a": {"gres": {"A100": "a100_80g"}, "gpu_directive": "gpus-per-node",
                                  "sbatch_options": {"account": "ml"},
                                  "partitions": {"big": {"pricing": {"cpu": 1.0}}}}},
    })
    assert cfg.allowed(["a", "b"]) == ["a"]
    a = cfg.cluster("a")
    assert a.pricing.hourly_micros(4, 16, "V100", 2) == round((0.4 + 0.16 + 5.0) * 1e6)
    assert a.for_partition("big").pricing.hourly_micros(4, 16, None, 0) == 4_000_000
    assert a.gres == {"A100": "a100_80g"} and a.gpu_directive == "gpus-per-node"
    assert slurm_config.parse_user_config(None).cluster("x").pricing.hourly_micros(8, 64, "H100", 8) == 0  # $0.00
    for bad, where in [({"pricing": {"cpu": "cheap"}}, "slurm.pricing.cpu"),
                       ({"cluster_configs": {"a": {"gpu_directive": "gpus"}}}, "slurm.cluster_configs.a.gpu_directive"),
                       ({"cluster_configs": {"a": {"partitions": {"p": {"bogus": 1}}}}},
                        "slurm.cluster_configs.a.partitions.p.bogus"),
                       ({"allowed_clusters": "a"}, "slurm.allowed_clusters")]:
        with pytest.raises(slurm_config.SlurmConfigError) as err:
            slurm_config.parse_user_config(bad)
        assert str(err.value).startswith(where + ":"), err.value


# ------------------------------------------------------------------------------ sbatch

def test_the_generated_sbatch_script() -> None:
    req = slurm_sbatch.SbatchRequest(
        job_name=naming.slurm_job_name("dev", "My.Cluster"), output=".o/alloc-%j.out", nodes=2, cpus_per_task=4,
        mem_mib=8192, accelerator="A100", accelerator_count=2, gres={}, partition="gpu", max_time="1-00:00:00",
        options=slurm_sbatch.sbatch_options({"account": "ml", "exclusive": True, "begin": None, "hold": False}))
    lines = slurm_sbatch.script(req).splitlines()
    assert lines[0] == "#!/bin/bash"
    assert [x for x in lines if x.startswith("#SBATCH")] == [
        "#SBATCH --job-name=skypurza-dev-slurm-my.cluster", "#SBATCH --output=.o/alloc-%j.out",
        "#SBATCH --error=.o/alloc-%j.out", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=4", "#SBATCH --mem=8192M", "#SBATCH --wait-all-nodes=1", "#SBATCH --no-requeue",
        "#SBATCH --partition=gpu", "#SBATCH --gres=gpu:a100:2", "#SBATCH --time=1-00:00:00",
        "#SBATCH --account=ml", "#SBATCH --exclusive"]
    assert lines[-1] == "exec sleep infinity"
    # the site's GRES type and --gpus-per-node; no --time on an unlimited partition; a task's own --time wins
    site = slurm_sbatch.SbatchRequest(job_name="j", output="o", accelerator="A100", accelerator_count=1,
                                      gres={"A100": "a100_80g"}, gpu_directive="gpus-per-node", max_time="UNLIMITED",
                                      options=slurm_sbatch.sbatch_options({"time": "00:30:00"}))
    got = slurm_sbatch.directives(site)
    assert "--gpus-per-node=a100_80g:1" in got and "--time=00:30:00" in got
    assert [d for d in got if d.startswith("--time")] == ["--time=00:30:00"]
    assert not any(d.startswith("--time") for d in slurm_sbatch.directives(
        slurm_sbatch.SbatchRequest(job_name="j", output="o", max_time="INFINITE")))
    # no memory given: a bounded default per CPU, never "the whole node"
    assert "--mem=2048M" in slurm_sbatch.directives(slurm_sbatch.SbatchRequest(job_name="j", output="o",
                                                                                cpus_per_task=2))


@pytest.mark.parametrize("options, message", [
    ({"job_name": "mine"}, "slurm.sbatch_options.job_name: --job-name is generated by SkyPurza"),
    ({"gres": "gpu:8"}, "slurm.sbatch_options.gres: --gres is generated"),
    ({"Partition": "x"}, "slurm.sbatch_options.Partition: --partition is generated"),
    ({"comment": "a\nb"}, "slurm.sbatch_options.comment: the value holds a newline"),
    ({"A": "acct"}, "slurm.sbatch_options.A: not an sbatch option name"),
    ({"constraint": ["a"]}, "slurm.sbatch_options.constraint: expected a string"),
])
def test_sbatch_options_refused_with_where_they_were_set(options, message) -> None:
    with pytest.raises(slurm_sbatch.SbatchOptionError) as err:
        slurm_sbatch.sbatch_options(options)
    assert str(err.value).startswith(message), err.value


def test_sbatch_options_pass_through_as_skypilot_passes_them() -> None:
    assert slurm_sbatch.sbatch_options({"mail_type": "END", "exclusive": True, "x11": False, "begin": None,
                                        "nice": 10}) == (("mail-type", "END"), ("exclusive", None), ("nice", "10"))


def test_node_shape_travels_as_the_instance_type() -> None:
    shape = slurm_sbatch.Shape(4, 8192, "H100", 2)
    assert shape.name == "4cpu-8192mb-H100x2" and slurm_sbatch.parse_shape(shape.name) == shape
    assert slurm_sbatch.parse_shape("1cpu-512mb") == slurm_sbatch.Shape(1, 512)
    with pytest.raises(ValueError):
        slurm_sbatch.parse_shape("p3.2xlarge")


# ------------------------------------------------------------------------------ discovery and errors

PARTITIONS = (
    "PartitionName=debug AllowGroups=ALL Default=YES DefaultTime=NONE MaxTime=UNLIMITED Nodes=n[1-2] State=UP "
    "TotalCPUs=4\n"
    "PartitionName=gpu Default=NO MaxTime=04:00:00 Nodes=n[1-2],g[08-10] State=UP "
    "TRESBillingWeights=CPU=1.0,Mem=0.25G,GRES/gpu=2.0\n"
    "PartitionName=old MaxTime=1:00:00 Nodes=n1 State=DOWN\n")
NODES = (
    "NodeName=n1 Arch=x86_64 CPUTot=2 CPUEfctv=2 Gres=gpu:h100:2 NodeAddr=10.0.0.1 OS=Linux 6.1 #1 SMP "
    "RealMemory=4000 State=IDLE Partitions=debug,gpu\n"
    "NodeName=n2 CPUTot=8 Gres=gpu:h100:4(S:0-1),shard:2 NodeAddr=10.0.0.2 RealMemory=64000 State=MIXED "
    "Partitions=debug,gpu\n"
    "NodeName=g08 CPUTot=8 Gres=gpu:a100:4 NodeAddr=10.0.0.8 RealMemory=64000 State=IDLE+DRAIN Partitions=gpu\n")


def test_discovery_parses_scontrol_into_zones() -> None:
    assert slurm_discovery.expand_hostlist("n[1-2],g[08-10],login") == ["n1", "n2", "g08", "g09", "g10", "login"]
    assert slurm_discovery.parse_gres("gpu:h100:4(S:0-1),shard:2,gpu:2") == {"h100": 4, "": 2}
    nodes = slurm_discovery.parse_nodes(NODES)
    assert nodes[0].addr == "10.0.0.1" and nodes[0].cpus == 2 and nodes[0].memory_mib == 4000
    assert not nodes[2].usable  # drained
    offers = slurm_discovery.zone_offers("c", slurm_discovery.parse_partitions(PARTITIONS), nodes)
    by = {o.partition: o for o in offers}
    assert sorted(by) == ["debug", "gpu"]  # a DOWN partition is no zone
    assert by["gpu"].nodes == 2 and by["gpu"].gpus == {"h100": 2} and by["gpu"].cpus == 2  # the smallest node
    assert by["gpu"].max_time == "04:00:00" and by["gpu"].billing_weights == "CPU=1.0,Mem=0.25G,GRES/gpu=2.0"
    assert by["debug"].default and by["debug"].max_time == "UNLIMITED"
    assert slurm_discovery.accelerator_name("h100", {}) == "H100"
    assert slurm_discovery.accelerator_name("a100_80g", {"A100-80GB": "a100_80g"}) == "A100-80GB"


@pytest.mark.parametrize("text, kind, scope, code", [
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available",
     FailureKind.CAPACITY, FailureScope.ZONE, "SlurmNodeConfigUnavailable"),
    ("sbatch: error: Batch job submission failed: Invalid partition name specified", FailureKind.UNSUPPORTED,
     FailureScope.ZONE, "SlurmInvalidPartition"),
    ("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's "
     "size and/or time limits)", FailureKind.QUOTA, FailureScope.REGION, "SlurmPolicyLimit"),
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
     FailureKind.AUTH, FailureScope.REGION, "SlurmInvalidAccount"),
    ("sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)",
     FailureKind.UNSUPPORTED, FailureScope.ZONE, "SlurmTimeLimitInvalid"),
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
     FailureKind.TRANSIENT, FailureScope.REQUEST, "SlurmControllerBusy"),
    ("cannot reach the login node of c (root@10.0.0.1:22): [Errno 111] Connection refused", FailureKind.CAPACITY,
     FailureScope.REGION, "SlurmUnreachable"),
    ("sbatch: unrecognized option '--bogus'", FailureKind.INVALID, FailureScope.REQUEST, "SlurmInvalidOption"),
    ("something nobody has seen", FailureKind.UNKNOWN, FailureScope.REQUEST, "SlurmError"),
])
def test_slurm_errors_are_classified(text, kind, scope, code) -> None:
    f = slurm_errors.classify(text)
    assert (f.kind, f.scope, f.code) == (kind, scope, code)
    assert f.message and len(f.message) <= 2000


def test_the_executor_script_is_valid_bash() -> None:
    body = slurmexec.executor_script("echo hi\nexit 3\n", ["A", "CUDA_VISIBLE_DEVICES"], config="/c", host="h",
                                     job="12", node="n1", step_name="1-run", remote_dir=".skypurza/t/slurm/c",
                                     marker="MARK")
    assert subprocess.run(["bash", "-n"], input=body, text=True).returncode == 0
    remote = slurmexec.remote_command(job="12", node="n1", step_name="1-run", remote_dir="d", marker="MARK")
    assert subprocess.run(["bash", "-n"], input=remote, text=True).returncode == 0
    assert "for k in A;" in body  # Slurm sets CUDA_VISIBLE_DEVICES from the allocation's GRES
    assert "--jobid=12 --overlap" in remote and "--nodelist=n1" in remote


# ------------------------------------------------------------------------------ against a real Slurm

@pytest.fixture
def adapter(slurm_rig, nats_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SKYPURZA_AGENT_KILL_GRACE_S", "1")
    monkeypatch.setenv("SKYPURZA_AGENT_HEARTBEAT_S", "0.5")
    config = tmp_path / "slurm-config"
    config.write_text(slurm_rig.slurm_config())
    user = slurm_config.parse_user_config({"cluster_configs": {CLUSTER: {"sbatch_options": {"comment": "from-spz"}}}})
    return SlurmAdapter(nats_server.url, "test", tmp_path / "state", config_path=config, user_config=user,
                        pending_timeout_s=5)


def _spec(cluster: str, shape: str, num_nodes: int = 1, start_seq: int = 1, partition: str = GPU_PARTITION):
    return LaunchSpec(stage="test", cluster=cluster, launch_token=f"tok-{cluster}", instance_type=shape,
                      region=CLUSTER, zone=partition, num_nodes=num_nodes, infra="slurm",
                      labels={"start_seq": str(start_seq)})


async def _provision(bus, adapter: SlurmAdapter, cluster: str, shape: str, num_nodes: int = 1):
    start_seq = await bus.last_seq() + 1
    nodes = await adapter.launch(_spec(cluster, shape, num_nodes, start_seq))
    await bus.publish(ClusterProvisioned(
        cluster=cluster, task_id=f"task-{cluster}", placement_id=f"p-{cluster}",
        candidate=Candidate(infra="slurm", region=CLUSTER, zone=GPU_PARTITION, instance_type=shape,
                            num_nodes=num_nodes),
        nodes=[EventNode(rank=n.rank or 0, instance_id=n.instance_id, private_ip=n.private_ip) for n in nodes],
        hourly_price_micros=0, launched_at=utcnow()))
    return nodes


def _squeue(rig: SlurmRig, *args: str) -> str:
    return subprocess.run(["squeue", "-h", *args], env=rig.env, capture_output=True, text=True, timeout=10).stdout


def test_discovery_over_ssh_of_the_real_cluster(adapter: SlurmAdapter) -> None:
    async def main():
        try:
            return await adapter.discover(CLUSTER)
        finally:
            await adapter.close()

    by = {o.partition: o for o in asyncio.run(main())}
    assert sorted(by) == ["debug", "gpu"]
    assert by["gpu"].nodes == 2 and by["gpu"].gpus == {"h100": 2} and by["gpu"].max_time == "04:00:00"
    assert by["gpu"].cpus == 2 and by["gpu"].memory_mib == 4000 and by["debug"].default


def test_a_gpu_job_runs_as_an_srun_step_with_logs_exit_codes_and_cancel(adapter, slurm_rig, nats_server) -> None:
    async def main():
        bus = await connect_bus(nats_server)
        try:
            nodes = await _provision(bus, adapter, "g1", "1cpu-1000mb-H100x1")
            record = adapter._read("g1")
            job_id = record["slurm_job_id"]
            info = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=slurm_rig.env, capture_output=True,
                                  text=True, timeout=10).stdout
            task = {"name": "gpu", "run": "echo cvd=$CUDA_VISIBLE_DEVICES rank=$SKYPILOT_NODE_RANK "
                                          "node=$SLURMD_NODENAME step=$SLURM_STEP_ID\necho secret=$MY_SECRET"}
            await bus.put_secrets("t-gpu", {"MY_SECRET": "sup3r-s3cret-v4lue"})
            job, _ = await queue_job(bus, cluster="g1", task_id="t-gpu", task={**task, "secrets": {"MY_SECRET": None}},
                                     user="alice", secrets_key="t-gpu")
            end = await job_end(bus, "g1", job.job_id, timeout=30)
            lines = [x["line"] for x in await job_lines(bus, "g1", job.job_id)]
            failing, _ = await queue_job(bus, cluster="g1", task_id="t-fail", task={"run": "echo before; exit 3"},
                                         user="alice")
            failed = await job_end(bus, "g1", failing.job_id, timeout=30)
            long, _ = await queue_job(bus, cluster="g1", task_id="t-long", task={"run": "echo started; sleep 300"},
                                      user="alice")
            await wait_lines(bus, "g1", long.job_id, lambda ls: any(x["line"] == "started" for x in ls), timeout=30)
            steps_running = _squeue(slurm_rig, "-s", "-j", job_id, "-o", "%i %j")
            await bus.publish(CancelRequested(cluster="g1", job_id=long.job_id, requested_by="alice"))
            cancelled = await job_end(bus, "g1", long.job_id, timeout=30)
            await asyncio.sleep(0)  # the step ends when the SSH session does: poll squeue below
            steps_after = ""
            for _ in range(100):
                steps_after = _squeue(slurm_rig, "-s", "-j", job_id, "-o", "%i %j")
                if f"{long.job_id}-run" not in steps_after:
                    break
                await asyncio.sleep(0.1)
            await adapter.terminate(ClusterRef(stage="test", cluster="g1", infra="slurm"))
            gone = _squeue(slurm_rig, "-j", job_id, "-o", "%i")
            return nodes, info, end, lines, failed, steps_running, cancelled, steps_after, gone, job_id
        finally:
            await adapter.close()
            await bus.close()

    nodes, info, end, lines, failed, running, cancelled, after, gone, job_id = asyncio.run(main())
    assert [n.private_ip for n in nodes] == ["127.0.0.1"]
    assert f"JobName={naming.slurm_job_name('test', 'g1')}" in info and "Comment=from-spz" in info
    assert "TresPerNode=gres:gpu:h100:1" in info and "Partition=gpu" in info
    assert end.EVENT_NAME == "job_succeeded", lines
    assert any(x.startswith("cvd=0 rank=0 node=n1 step=") for x in lines), lines
    assert "secret=<redacted>" in lines and not any("sup3r-s3cret-v4lue" in x for x in lines)
    assert failed.EVENT_NAME == "job_failed" and failed.exit_code == 3
    assert "-run" in running  # the long job ran as a step of the allocation
    assert cancelled.EVENT_NAME == "job_cancelled"
    assert "-run" not in after, after  # cancel ended the srun step
    assert gone.strip() == "", gone  # terminate is scancel


def test_two_nodes_get_ranks_0_and_1_and_the_workdir(adapter, slurm_rig, nats_server, tmp_path: Path) -> None:
    workdir = tmp_path / "proj"
    workdir.mkdir()
    (workdir / "data.txt").write_text("from-the-workdir\n")
    cfg = tmp_path / "cfg.txt"
    cfg.write_text("lr=0.1\n")

    async def main():
        bus = await connect_bus(nats_server)
        try:
            await _provision(bus, adapter, "duo", "1cpu-500mb", num_nodes=2)
            job, _ = await queue_job(bus, cluster="duo", task_id="t-duo", user="alice", task={
                "num_nodes": 2, "workdir": str(workdir), "file_mounts": {"~/spz-duo/cfg.txt": str(cfg)},
                "run": "echo rank=$SKYPILOT_NODE_RANK of=$SKYPILOT_NUM_NODES on=$SLURMD_NODENAME "
                       "ips=$(echo $SKYPILOT_NODE_IPS)\necho wd=$(cat data.txt) cfg=$(cat ~/spz-duo/cfg.txt) "
                       "cwd=$PWD"})
            end = await job_end(bus, "duo", job.job_id, timeout=30)
            lines = await job_lines(bus, "duo", job.job_id)
            await adapter.terminate(ClusterRef(stage="test", cluster="duo", infra="slurm"))
            return end, lines
        finally:
            await adapter.close()
            await bus.close()

    end, lines = asyncio.run(main())
    assert end.EVENT_NAME == "job_succeeded"
    got = sorted((x["rank"], x["line"]) for x in lines if x["stream"] == "run")
    cwd = slurm_rig.login_home / naming.slurm_dir("test", "duo") / "sky_workdir"
    where = f"wd=from-the-workdir cfg=lr=0.1 cwd={cwd}"
    assert got == [(0, "rank=0 of=2 on=n1 ips=127.0.0.1 127.0.0.1"), (0, where),
                   (1, "rank=1 of=2 on=n2 ips=127.0.0.1 127.0.0.1"), (1, where)], got
    # copied once (the second node found the content's mark under the lock), on the cluster's side only
    assert len(list((slurm_rig.login_home / naming.slurm_dir("test", "duo")).glob(".synced-*"))) == 1


def test_more_gpus_than_a_node_has_is_a_capacity_error_of_the_partition(adapter, slurm_rig) -> None:
    async def main():
        try:
            with pytest.raises(CapacityError) as err:
                await adapter.launch(_spec("big", "1cpu-500mb-H100x3"))
            return err.value
        finally:
            await adapter.close()

    err = asyncio.run(main())
    assert err.code == "SlurmNodeConfigUnavailable" and err.scope is FailureScope.ZONE
    assert err.region == CLUSTER and err.zone == GPU_PARTITION
    assert _squeue(slurm_rig, "-n", naming.slurm_job_name("test", "big"), "-o", "%i").strip() == ""


def test_a_protected_sbatch_option_is_refused_before_anything_is_submitted(slurm_rig, nats_server, tmp_path) -> None:
    config = tmp_path / "slurm-config"
    config.write_text(slurm_rig.slurm_config())
    user = slurm_config.parse_user_config({"cluster_configs": {CLUSTER: {"sbatch_options": {"job_name": "mine"}}}})
    a = SlurmAdapter(nats_server.url, "test", tmp_path / "state", config_path=config, user_config=user)

    async def main():
        try:
            with pytest.raises(FatalProvisionError) as err:
                await a.launch(_spec("prot", "1cpu-500mb"))
            return err.value
        finally:
            await a.close()

    err = asyncio.run(main())
    assert f"slurm.cluster_configs.{CLUSTER}.sbatch_options.job_name: --job-name is generated" in str(err)
    assert _squeue(slurm_rig, "-n", "mine", "-o", "%i").strip() == ""


# ------------------------------------------------------------------------------ placement

def _world_clusters(pricing=None):
    from skypurza.events.slurm_discovery import SlurmCluster, ZoneOffer

    cfg = slurm_config.parse_user_config(pricing or {}).cluster("c")
    offers = (ZoneOffer("c", "debug", 2, 2, 4000, {"h100": 2}, "UNLIMITED", True, ""),
              ZoneOffer("c", "gpu", 2, 2, 4000, {"h100": 2}, "04:00:00", False, ""))
    return (SlurmCluster("c", offers, config=cfg), SlurmCluster("down", error="ssh down: Connection refused"))


def test_placement_offers_each_partition_and_fails_over_to_aws() -> None:
    from skypurza.events.taskspec.request import ResourceRequest as R
    from skypurza.services.optimizer.catalog import load_catalog
    from skypurza.services.optimizer.placement import Block, place

    cat = load_catalog()
    clusters = _world_clusters()
    both = frozenset({"slurm", "aws"})
    plan = place([R(accelerator="H100", accelerator_count=1)], 1, cat, (), both, slurm=clusters)
    first = plan.candidates[0]
    assert (first.infra, first.region, first.zone, first.instance_type) == ("slurm", "c", "debug", "1cpu-1024mb-H100x1")
    assert first.hourly_price_micros == 0  # no pricing: $0.00, as sky
    assert [c.infra for c in plan.candidates[:2]] == ["slurm", "slurm"] and plan.candidates[2].infra == "aws"
    # a partition that refused (CapacityError, scope zone) is blocked; the next is tried, then AWS
    blocked = place([R(accelerator="H100", accelerator_count=1)], 1, cat,
                    [Block("zone", "slurm", "c", "debug"), Block("zone", "slurm", "c", "gpu")], both, slurm=clusters)
    assert blocked.candidates[0].infra == "aws"
    # more GPUs per node, or more nodes, than any partition has: straight to AWS when it is allowed
    big = place([R(accelerator="H100", accelerator_count=8)], 1, cat, (), both, slurm=clusters)
    assert big.feasible and all(c.infra == "aws" for c in big.candidates)
    three = place([R(accelerator="H100", accelerator_count=1)], 3, cat, (), frozenset({"slurm"}), slurm=clusters)
    assert not three.feasible and "debug: 2 usable nodes, the task needs 3" in three.reason
    assert "down: not reachable" in three.reason
    # --infra slurm/c/gpu; a partition that does not exist says which do
    only = place([R(cloud="slurm", region="c", zone="gpu", accelerator="H100", accelerator_count=2)], 2, cat,
                 (), both, slurm=clusters)
    assert [(c.zone, c.num_nodes) for c in only.candidates] == [("gpu", 2)]
    none = place([R(cloud="slurm", region="c", zone="nope")], 1, cat, (), both, slurm=clusters)
    assert "no partition 'nope' (partitions: debug, gpu)" in none.reason
    # priced by slurm.pricing: the partition's over the cluster's
    priced = _world_clusters({"pricing": {"accelerators": {"H100": 2.0}, "cpu": 0.5},
                              "cluster_configs": {"c": {"partitions": {"gpu": {"pricing": {"accelerators":
                                                                                           {"H100": 1.0}}}}}}})
    got = place([R(cloud="slurm", accelerator="H100", accelerator_count=2)], 1, cat, (), both, slurm=priced)
    assert [(c.zone, c.hourly_price_micros) for c in got.candidates] == [("gpu", 2_000_000), ("debug", 4_500_000)]


# ------------------------------------------------------------------------------ spz, end to end

def test_spz_launch_logs_exec_cancel_down_check_and_gpus_on_slurm(slurm_rig, tmp_path: Path) -> None:
    from local_cli import local_cli, spz

    config = tmp_path / "slurm-config"
    config.write_text(slurm_rig.slurm_config())
    with local_cli(tmp_path, "slurme2e") as env:
        env.update(SKYPURZA_SLURM_CONFIG=str(config), SKYPURZA_ENABLED_INFRAS="slurm", SKYPURZA_NO_PLUGINS="1")
        r = spz(env, "launch", "-c", "sl", "--infra", f"slurm/{CLUSTER}", "--gpus", "H100:1", "-y",
                "echo cvd=$CUDA_VISIBLE_DEVICES rank=$SKYPILOT_NODE_RANK")
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"slurm/{CLUSTER}/debug 1cpu-1024mb-H100x1" in r.stderr and "cvd=0 rank=0" in r.stdout, r.stderr
        logs = spz(env, "logs", "sl", "1")
        assert "cvd=0 rank=0" in logs.stdout, logs.stdout + logs.stderr
        alloc = _squeue(slurm_rig, "-n", naming.slurm_job_name("slurme2e", "sl"), "-o", "%i").strip()
        assert alloc.isdigit(), alloc
        ex = spz(env, "exec", "sl", "-d", "echo started; sleep 300")
        assert ex.returncode == 0, ex.stdout + ex.stderr
        steps = ""
        for _ in range(100):
            steps = _squeue(slurm_rig, "-s", "-j", alloc, "-o", "%i %j")
            if "2-run" in steps:
                break
            subprocess.run(["sleep", "0.1"])
        assert f"{alloc}." in steps and "2-run" in steps, steps  # exec added a job step
        cancel = spz(env, "cancel", "sl", "2", "-y")
        assert "CANCELLED" in cancel.stdout, cancel.stdout + cancel.stderr
        for _ in range(100):
            steps = _squeue(slurm_rig, "-s", "-j", alloc, "-o", "%i %j")
            if "2-run" not in steps:
                break
            subprocess.run(["sleep", "0.1"])
        assert "2-run" not in steps, steps
        check = spz(env, "check", "slurm", "-o", "json")
        assert f'"slurm/{CLUSTER}"' in check.stdout and '"enabled": true' in check.stdout.replace("\n", " ") \
            .replace("  ", " "), check.stdout
        gpus = spz(env, "gpus", "list", "--infra", "slurm", "-o", "json")
        assert '"accelerator": "H100"' in gpus.stdout and '"per_node": 2' in gpus.stdout, gpus.stdout
        down = spz(env, "down", "sl", "-y")
        assert down.returncode == 0, down.stdout + down.stderr
        assert _squeue(slurm_rig, "-j", alloc, "-o", "%i").strip() == ""  # down is scancel
        # a task this cluster cannot take goes to AWS when AWS is allowed
        env["SKYPURZA_ENABLED_INFRAS"] = "slurm,aws"
        dry = spz(env, "launch", "--dryrun", "-o", "json", "--gpus", "H100:8", "x")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert '"infra": "aws"' in dry.stdout and '"infra": "slurm"' not in dry.stdout


def test_an_allocation_no_record_knows_is_found_and_cancelled(adapter, slurm_rig) -> None:
    from skypurza.services.provisioner.adapter import find_orphans

    held = "#!/bin/bash\n#SBATCH --job-name={}\n#SBATCH --output=/dev/null\n#SBATCH --mem=100M\nexec sleep 600\n"
    lost = slurm_rig.ssh("sbatch --parsable", stdin=held.format(naming.slurm_job_name("test", "lost"))).stdout.strip()
    other = slurm_rig.ssh("sbatch --parsable", stdin=held.format("someone-elses-job")).stdout.strip()
    assert lost.isdigit() and other.isdigit()

    async def main():
        try:
            owned = await adapter.list_owned("test")
            orphans, _ = find_orphans(owned, {})
            return orphans, await adapter.terminate_nodes("test", orphans)
        finally:
            await adapter.close()

    orphans, done = asyncio.run(main())
    assert [(o.instance_id, o.cluster, o.region) for o in orphans] == [(f"{lost}.0", "lost", CLUSTER)]
    assert done == [f"{lost}.0"]
    for _ in range(100):
        if not _squeue(slurm_rig, "-j", lost, "-o", "%i").strip():
            break
        subprocess.run(["sleep", "0.1"])
    assert _squeue(slurm_rig, "-j", lost, "-o", "%i").strip() == ""
    assert _squeue(slurm_rig, "-j", other, "-o", "%i").strip() == other  # not ours: left alone
    subprocess.run(["scancel", other], env=slurm_rig.env, timeout=10)


def test_submit_as_user_runs_the_allocation_and_its_steps_as_the_mapped_unix_account(
        slurm_rig, nats_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    unix = f"spzu{os.getpid() % 100000}"
    home = slurm_rig.add_user(unix)
    monkeypatch.setenv("SKYPURZA_AGENT_KILL_GRACE_S", "1")
    config = tmp_path / "slurm-config"
    config.write_text(slurm_rig.slurm_config())
    user = slurm_config.parse_user_config({"cluster_configs": {CLUSTER: {"submit_as_user": {"alice": unix}}}})
    adapter = SlurmAdapter(nats_server.url, "test", tmp_path / "state", config_path=config, user_config=user,
                           pending_timeout_s=5)
    workdir = tmp_path / "proj"
    workdir.mkdir()
    (workdir / "data.txt").write_text("from-the-workdir\n")
    cfg = tmp_path / "cfg.txt"
    cfg.write_text("lr=0.2\n")

    async def main():
        bus = await connect_bus(nats_server)
        try:
            start_seq = await bus.last_seq() + 1
            spec = _spec("ua", "1cpu-1000mb", start_seq=start_seq, partition="debug")
            nodes = await adapter.launch(LaunchSpec(**{**spec.__dict__, "user": "alice"}))
            await bus.publish(ClusterProvisioned(
                cluster="ua", task_id="task-ua", placement_id="p-ua",
                candidate=Candidate(infra="slurm", region=CLUSTER, zone="debug", instance_type="1cpu-1000mb"),
                nodes=[EventNode(rank=0, instance_id=n.instance_id, private_ip=n.private_ip) for n in nodes],
                hourly_price_micros=0, launched_at=utcnow()))
            job_id = adapter._read("ua")["slurm_job_id"]
            owner = _squeue(slurm_rig, "-j", job_id, "-o", "%u").strip()
            job, _ = await queue_job(bus, cluster="ua", task_id="t-ua", user="alice",
                                     task={"run": "echo who=$(id -un) home=$HOME wd=$(cat data.txt) "
                                                  "cfg=$(cat ~/spz-ua/cfg.txt); touch mine",
                                           "workdir": str(workdir), "file_mounts": {"~/spz-ua/cfg.txt": str(cfg)}})
            end = await job_end(bus, "ua", job.job_id, timeout=30)
            lines = [x["line"] for x in await job_lines(bus, "ua", job.job_id)]
            await adapter.terminate(ClusterRef(stage="test", cluster="ua", infra="slurm"))
            return owner, end, lines
        finally:
            await adapter.close()
            await bus.close()

    owner, end, lines = asyncio.run(main())
    assert owner == unix  # sbatch --uid: Slurm's accounting and limits see the user
    assert end.EVENT_NAME == "job_succeeded", lines
    # srun as the account, in its home, where the workdir and the mounts were put, as its own
    assert f"who={unix} home={home} wd=from-the-workdir cfg=lr=0.2" in lines, lines
    wd = home / naming.slurm_dir("test", "ua") / "sky_workdir"
    for path in (wd / "mine", wd / "data.txt", wd, home / "spz-ua" / "cfg.txt"):
        assert path.exists() and path.owner() == unix, path


def test_the_optimizer_reads_the_partitions_again_once_they_are_older_than_the_ttl(
        slurm_rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from skypurza.events.clock import ManualClock
    from skypurza.services.optimizer import service as optimizer
    from skypurza.services.optimizer.world import load_world

    config = tmp_path / "slurm-config"
    config.write_text(slurm_rig.slurm_config())
    monkeypatch.setenv("SKYPURZA_SLURM_CONFIG", str(config))
    clock = ManualClock()
    svc = optimizer.OptimizerService(enabled=frozenset({"slurm"}), clock=clock)
    svc.world = load_world(svc.settings, enabled=frozenset({"slurm"}))

    def partitions() -> set[str]:
        assert svc.world is not None
        return {o.partition for c in svc.world.slurm for o in c.offers}

    def scontrol(state: str) -> None:
        subprocess.run(["scontrol", "update", f"partitionname={GPU_PARTITION}", f"state={state}"], env=slurm_rig.env,
                       check=True, capture_output=True, timeout=10)

    assert partitions() == {"debug", GPU_PARTITION}
    scontrol("down")  # an admin takes a partition away
    try:
        asyncio.run(svc._refresh_slurm())
        assert partitions() == {"debug", GPU_PARTITION}  # within the TTL: the reading stands
        clock.advance(optimizer.SLURM_REFRESH_TTL_S + 1)
        asyncio.run(svc._refresh_slurm())
        assert partitions() == {"debug"}  # read again: the down partition is no zone any more
    finally:
        scontrol("up")


def test_an_allocations_end_is_read_as_recovery_reads_a_lost_node() -> None:
    from skypurza.events.slurm_accounting import allocation_end
    from skypurza.services.recovery.ec2watch import Target
    from skypurza.services.recovery.slurmwatch import findings, look_command

    assert allocation_end("RUNNING") is None and allocation_end("PENDING") is None
    assert allocation_end("PREEMPTED") == "preempted"
    for state in ("NODE_FAIL", "CANCELLED by 0", "TIMEOUT", "COMPLETING", None):
        assert allocation_end(state) == "node_lost", state
    assert "sacct -X -n -P -j 3,7 -o JobIDRaw,State" in look_command([7, 3, 7])
    ts = [Target("a", 0, "3.0", "hpc"), Target("b", 0, "7.0", "hpc"), Target("c", 0, "9.0", "hpc"),
          Target("d", 0, "11.0", "hpc")]
    text = "3|RUNNING\n9|NODE_FAIL\n#spz-sacct\n7|PREEMPTED\n"
    found = {t.cluster: f for t, f in findings(ts, text)}
    assert set(found) == {"b", "c", "d"}  # 3 runs; 7 gone (sacct: preempted); 9 failed; 11 gone, no word why
    assert found["b"].kind == "preempted" and found["c"].kind == "node_lost" and found["d"].kind == "node_lost"
    assert found["b"].evidence["state"] == "Slurm allocation 7 PREEMPTED"
    assert findings(ts, "3|RUNNING\n") == []  # the command did not run to its end: no word on anything


def test_submit_as_user_settings_are_checked_at_the_edge() -> None:
    from skypurza.services.provisioner.slurm import submit_command

    cfg = slurm_config.parse_user_config({"cluster_configs": {"hpc": {
        "submit_as_user": {"alice": "alice_unix"}, "submit_mode": "ssh_keys",
        "user_keys": {"alice_unix": "~/.ssh/alice"}}}}).cluster("hpc")
    assert cfg.unix_user("alice") == "alice_unix" and cfg.unix_user("bob") is None and cfg.unix_user("") is None
    assert cfg.submit_mode == "ssh_keys" and cfg.for_partition("gpu").user_keys == {"alice_unix": "~/.ssh/alice"}
    for bad, message in (
            ({"submit_as_user": {"alice": "Root;rm"}}, "submit_as_user.alice: 'Root;rm' is not a Unix account"),
            ({"submit_mode": "sudo"}, "submit_mode: 'sudo'; expected one of uid, ssh_keys")):
        with pytest.raises(slurm_config.SlurmConfigError, match=message.replace("(", r"\(")):
            slurm_config.parse_user_config({"cluster_configs": {"hpc": bad}})
    assert submit_command(".skypurza-slurm/t/c", None) == "mkdir -p .skypurza-slurm/t/c && sbatch --parsable"
    as_user = submit_command(".skypurza-slurm/t/c", "alice_unix")
    assert "sbatch --parsable --uid=alice_unix --gid=" in as_user and "chown -R alice_unix: .skypurza-slurm" in as_user


def test_a_rigs_teardown_leaves_no_process_of_it_behind(tmp_path: Path) -> None:
    """A batch step's slurmstepd outlives its slurmd and ignores SIGTERM: the rig's stop ends the
    jobs first, then the daemons, then kills what is left of its own (found in /proc, never by name)."""
    import os
    import tempfile

    def of_rig(root: Path) -> list[tuple[int, str]]:
        conf = f"SLURM_CONF={root}/etc/slurm.conf".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                zombie = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
            except OSError:
                continue
            if not zombie and (conf in env or str(root).encode() in cmd):
                found.append((int(entry), cmd.replace(b"\0", b" ").decode(errors="replace")))
        return found

    root = Path(tempfile.mkdtemp(prefix="spz-slurm-"))
    root.chmod(0o755)
    rig = SlurmRig(root).start()
    try:
        job = subprocess.run(["sbatch", "--parsable", "-o", os.devnull, "--wrap", "exec sleep infinity"],
                             env=rig.env, capture_output=True, text=True, timeout=20, cwd=rig.login_home)
        assert job.returncode == 0, job.stderr
        for _ in range(100):
            if any("slurmstepd" in cmd for _, cmd in of_rig(root)):
                break
            subprocess.run(["sleep", "0.1"])
        assert any("slurmstepd" in cmd for _, cmd in of_rig(root)), of_rig(root)  # a step to leak
    finally:
        rig.stop()
    left = []
    for _ in range(50):  # a killed process leaves /proc at once; a moment for its parent to reap it
        left = of_rig(root)
        if not left:
            break
        subprocess.run(["sleep", "0.1"])
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    assert left == [], left
