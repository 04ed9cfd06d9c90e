"""The agent on EC2 nodes (the fake AWS over HTTP), started exactly as the user-data starts it.

The optimizer and provisioner services run in this process and launch a 2-node gang on the fake
EC2 with the user-data they render. For every instance the harness reads the instance's own
user-data back from EC2 (DescribeInstanceAttribute), answers the questions the script asks the
metadata service (AMI launch index = rank, instance id, zone), and runs the agent command the
script would run (`userdata.agent_argv`). The job then sees EC2's private IPs, AWS's cluster
info, and ends; DownRequested terminates the instances and the agents leave on their own.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agent_harness import ENV_DUMP, job_end, job_lines, of, parse_env_dump, rank_lines, wait_events
from aws_fixtures import FakeAws
from nats_fixtures import connect_bus
from provisioner_fixtures import aws_env

from skypurza.cli.serve import serve
from skypurza.events import naming
from skypurza.events.bus import stored_from_msg
from skypurza.events.models import ClusterProvisioned, DownRequested, TaskSubmitted
from skypurza.services.provisioner import userdata

TASK = {"name": "ec2", "num_nodes": 2, "resources": {"infra": "aws/us-east-1", "instance_type": "m5.large"},
        "envs": {"MY_ENV": "on ec2"}, "secrets": {"MY_SECRET": None},
        "setup": "echo setup rank $SKYPILOT_SETUP_NODE_RANK", "run": ENV_DUMP}


def boot_nodes(aws: FakeAws, ev: ClusterProvisioned, root: Path, zones: list[str]) -> list[subprocess.Popen]:
    """What EC2 and the user-data script do at boot, for every instance of the gang."""
    region = ev.candidate.region or "us-east-1"
    ec2 = aws.client(region)
    procs = []
    for node in ev.nodes:
        inst = ec2.describe_instances(InstanceIds=[node.instance_id])["Reservations"][0]["Instances"][0]
        raw = ec2.describe_instance_attribute(InstanceId=node.instance_id, Attribute="userData")["UserData"]["Value"]
        home = root / node.instance_id
        home.mkdir(parents=True)
        zones.append(inst["Placement"]["AvailabilityZone"])
        argv = userdata.agent_argv(raw, rank=inst["AmiLaunchIndex"], instance_id=node.instance_id,
                                   zone=inst["Placement"]["AvailabilityZone"], home=str(home), python=sys.executable)
        env = {**os.environ, **aws.env, "HOME": str(home), "PYTHONUNBUFFERED": "1"}
        with open(home / "agent.log", "ab") as log:
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
    return procs


def test_agents_started_by_the_user_data_run_a_two_node_job(nats_server, fake_aws: FakeAws, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in aws_env(fake_aws, SKYPURZA_HOME=str(tmp_path / "spz"), SKYPURZA_ENABLED_INFRAS="aws",
                              SKYPURZA_LIVE_SPOT_PRICES="0", SKYPURZA_AGENT_NATS_URL=nats_server.url).items():
        monkeypatch.setenv(key, value)
    procs: list[subprocess.Popen] = []
    zones: list[str] = []

    async def main():
        bus = await connect_bus(nats_server)
        stop, ready = asyncio.Event(), asyncio.Event()
        services = asyncio.create_task(serve(nats_server.url, "test", ["optimizer", "provisioner"], stop, ready))
        await asyncio.wait_for(ready.wait(), 30)
        try:
            await bus.put_secrets("ec2-task", {"MY_SECRET": "ec2-secret-value"})
            await bus.publish(TaskSubmitted(task_id="ec2-task", cluster="ec2c", task=TASK, num_nodes=2, user="dana",
                                            secrets_key="ec2-task"))
            subject = naming.event_filter("test", "cluster", ClusterProvisioned.EVENT_NAME)
            async for msg in bus.follow(filter_subject=subject, start_seq=1):
                provisioned = stored_from_msg(msg).event
                break
            procs.extend(await asyncio.to_thread(boot_nodes, fake_aws, provisioned, tmp_path / "nodes", zones))
            evs = await wait_events(bus, "ec2c", lambda evs: len(of(evs, "job_queued")) == 1, timeout=30)
            job = of(evs, "job_queued")[0]
            end = await job_end(bus, "ec2c", job.job_id, timeout=60)
            lines = await job_lines(bus, "ec2c", job.job_id)
            await bus.publish(DownRequested(cluster="ec2c", requested_by="test"))
            await wait_events(bus, "ec2c", lambda evs: len(of(evs, "cluster_terminated")) == 1, timeout=60)
            # the agents stop by themselves once their cluster is terminated
            for p in procs:
                await asyncio.to_thread(p.wait, 20)
            evs = [s.event async for s in bus.replay(
                filter_subject=naming.aggregate_subjects("test", "cluster", "ec2c")) if s.event is not None]
            return provisioned, end, lines, evs
        finally:
            stop.set()
            await asyncio.wait_for(services, 30)
            await bus.close()

    try:
        provisioned, end, lines, evs = asyncio.run(main())
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert end.EVENT_NAME == "job_succeeded", end
    nodes = sorted(provisioned.nodes, key=lambda n: n.rank)
    ips = [n.private_ip for n in nodes]
    assert len(set(ips)) == 2 and all(ips), ips
    # the zone's name as the node's metadata service gives it (the candidate may hold a zone id)
    assert len(set(zones)) == 1 and zones[0].startswith("us-east-1")
    zone = zones[0]
    task_id = None
    for rank in (0, 1):
        env = parse_env_dump(rank_lines(lines, rank))
        task_id = task_id or env["SKYPILOT_TASK_ID"]
        assert {k: v for k, v in env.items() if k.startswith("SKYPILOT_")} == {
            "SKYPILOT_NODE_RANK": str(rank),
            "SKYPILOT_NODE_IPS": "\n".join(ips),
            "SKYPILOT_NUM_NODES": "2",
            "SKYPILOT_NUM_GPUS_PER_NODE": "0",
            "SKYPILOT_TASK_ID": task_id,
            "SKYPILOT_CLUSTER_INFO": f'{{"cluster_name": "ec2c", "cloud": "AWS", "region": "us-east-1", '
                                     f'"zone": "{zone}"}}',
            "SKYPILOT_USER": "dana",
            "SKYPILOT_INTERNAL_JOB_ID": "1",
        }
        assert env["SKYPURZA_NODE_RANK"] == str(rank) and env["MY_ENV"] == "on ec2"
        assert env["MY_SECRET_SHA256"] == hashlib.sha256(b"ec2-secret-value").hexdigest()
        home = tmp_path / "nodes" / nodes[rank].instance_id
        assert env["HOME"] == str(home) and env["CWD"] == str(home / "sky_workdir")
        assert rank_lines(lines, rank, "setup") == [f"setup rank {rank}"]
    ready = of(evs, "node_ready")
    assert sorted(e.rank for e in ready) == [0, 1]
    assert of(evs, "cluster_terminated")
