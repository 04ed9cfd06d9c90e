"""The provisioner service on a real nats-server and the fault-injecting fake AWS."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aws_fixtures import FakeAws
from nats_fixtures import connect_bus
from provisioner_fixtures import (
    REGION,
    STAGE,
    candidate,
    events_on,
    launch,
    running,
    service,
    subject,
    submit,
    place,
    wait_for,
)

from skypurza.events import naming
from skypurza.events.envelope import derive_id
from skypurza.events.service import ServiceRunner
from skypurza.events.models import (
    CapacityError,
    ClusterIdle,
    ClusterProvisioned,
    DownRequested,
    JobQueued,
    ProvisionFailed,
    StartRequested,
    StopRequested,
)
from skypurza.services.provisioner import userdata


def tags_of(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def instances(aws: FakeAws, states: tuple[str, ...] = ("pending", "running")) -> list[dict[str, Any]]:
    reply = aws.client(REGION).describe_instances(Filters=[{"Name": "instance-state-name", "Values": list(states)}])
    return [i for r in reply["Reservations"] for i in r["Instances"]]


def test_placement_becomes_a_tagged_gang_then_job_one(nats_server, fake_aws: FakeAws) -> None:
    async def main() -> None:
        bus = await connect_bus(nats_server)
        task = {"name": "train", "run": "python train.py", "num_nodes": 2,
                "resources": {"infra": "aws", "instance_type": "m5.large", "use_spot": True,
                              "labels": {"team": "ml"}}}
        svc = service(fake_aws)
        async with running(bus, svc):
            placed = await launch(bus, "t1", "train", candidate(), task=task, down=True)
            prov = await wait_for(bus, subject("cluster", "train", "cluster_provisioned"))
            job = await wait_for(bus, subject("cluster", "train", "job_queued"))
        assert isinstance(prov.event, ClusterProvisioned) and isinstance(job.event, JobQueued)
        pc_seq = (await bus.last_event(subject("task", "t1", "placement_chosen"))).seq
        # Ids derived from the placement; ClusterProvisioned before the job.
        assert prov.envelope.id == derive_id(placed.id, "provisioner", "cluster_provisioned")
        assert job.envelope.id == derive_id(placed.id, "provisioner", "job")
        assert prov.seq < job.seq
        ev = prov.event
        assert ev.placement_id == placed.id and ev.task_id == "t1" and len(ev.nodes) == 2
        assert [n.rank for n in ev.nodes] == [0, 1] and all(n.private_ip for n in ev.nodes)
        assert ev.hourly_price_micros == 35_000 and ev.user == "alice" and ev.team == "ml"
        assert ev.tres == {"node": 1, "cpu": 2, "mem": 8192} and ev.down_after_job
        assert (job.event.job_id, job.event.task_id, job.event.down_after, job.event.run_setup) == (1, "t1", True, True)
        assert job.event.secrets_key == "t1" and job.event.name == "train"

        found = {i["InstanceId"]: i for i in instances(fake_aws)}
        assert sorted(found) == sorted(n.instance_id for n in ev.nodes)
        for node in ev.nodes:
            inst = found[node.instance_id]
            tags = tags_of(inst)
            assert tags[naming.TAG_PROJECT] == naming.PROJECT and tags[naming.TAG_STAGE] == STAGE
            assert tags[naming.TAG_CLUSTER] == "train" and tags[naming.TAG_RANK] == str(node.rank)
            assert tags[naming.TAG_NAME] == naming.instance_name(STAGE, "train", node.rank)
            assert tags[naming.TAG_LAUNCH_TOKEN] == placed.id and tags[naming.TAG_JOB] == "1"
            assert tags["team"] == "ml"  # the task's labels
            assert inst["InstanceLifecycle"] == "spot" and inst["Placement"]["AvailabilityZone"] == "us-east-1a"
            # The node's user-data starts the agent for this cluster, reading from the placement on.
            raw = fake_aws.client(REGION).describe_instance_attribute(
                InstanceId=node.instance_id, Attribute="userData")["UserData"]["Value"]
            spec = userdata.agent_spec(raw, rank=int(inst["AmiLaunchIndex"]), instance_id=node.instance_id,
                                       zone="us-east-1a")
            assert (spec.cluster, spec.stage, spec.rank, spec.num_nodes) == ("train", STAGE, node.rank, 2)
            assert spec.nats_url == "nats://broker.example:4222" and spec.infra == "aws"
            assert spec.extra == {"start_seq": str(pc_seq)} and spec.instance_id == node.instance_id

        # The same placement delivered again (a redelivery, a restart) changes nothing.
        svc2 = service(fake_aws)
        runner2 = ServiceRunner(bus, svc2)
        await svc2.start(runner2.out)
        stored = await bus.last_event(subject("task", "t1", "placement_chosen"))
        assert await runner2.handle(stored) == []  # nothing published, by a reaction or through the context
        await svc2.close()
        assert fake_aws.request_count("RunInstances") == 1 and len(instances(fake_aws)) == 2
        assert len(await events_on(bus, subject("cluster", "train", "job_queued"))) == 1
        assert len(await events_on(bus, subject("cluster", "train", "cluster_provisioned"))) == 1
        await bus.close()

    asyncio.run(main())


def test_failures_become_capacity_errors_or_provision_failed(nats_server, fake_aws: FakeAws) -> None:
    """Five placements at once, each failing its own way (faults matched by instance type)."""
    cases = {
        # instance type: (AWS code, spot, expected event, error class)
        "m5.large": ("InsufficientInstanceCapacity", False, CapacityError, "capacity"),
        "m5.xlarge": ("InsufficientInstanceCapacity", True, CapacityError, "spot_capacity"),
        "c5.large": ("VcpuLimitExceeded", False, CapacityError, "quota"),
        "r5.large": ("Unsupported", False, CapacityError, "unsupported"),
        "t3.large": ("UnauthorizedOperation", False, ProvisionFailed, "auth"),
        "c5.xlarge": ("InternalError", False, CapacityError, "transient"),  # retries ran out
    }
    for itype, (code, _, _, _) in cases.items():
        fake_aws.add_fault(code, instance_type=itype)

    async def main() -> None:
        bus = await connect_bus(nats_server)
        placed = {}
        async with running(bus, service(fake_aws)):
            for n, (itype, (_, spot, _, _)) in enumerate(cases.items()):
                placed[itype] = await launch(bus, f"t{n}", f"c{n}", candidate(instance_type=itype, use_spot=spot))
            for n, (itype, (code, spot, kind, cls)) in enumerate(cases.items()):
                got = await wait_for(bus, subject("task", f"t{n}", kind.EVENT_NAME))
                ev = got.event
                assert isinstance(ev, kind) and ev.error_class == cls, (itype, ev)
                assert ev.code == code and ev.placement_id == placed[itype].id and ev.message
                assert ev.candidate.instance_type == itype
                assert got.envelope.id == derive_id(placed[itype].id, "provisioner", kind.EVENT_NAME)
                if cls == "auth":
                    assert "decode-authorization-message" in ev.message
        assert await events_on(bus, naming.event_filter(STAGE, "cluster", "cluster_provisioned")) == []
        # Capacity-class errors reach AWS once (no botocore retry); the transient one was
        # retried by botocore (3 attempts) on each of the provisioner's 2 tries.
        counts = {t: sum(1 for r in fake_aws.requests("RunInstances") if r["params"]["InstanceType"] == t)
                  for t in cases}
        assert counts == {"m5.large": 1, "m5.xlarge": 1, "c5.large": 1, "r5.large": 1, "t3.large": 1, "c5.xlarge": 6}
        assert instances(fake_aws, ("pending", "running", "stopped")) == []
        await bus.close()

    asyncio.run(main())


def test_gang_with_a_node_that_dies_is_rolled_back(nats_server, fake_aws: FakeAws) -> None:
    fake_aws.add_launch_failure(index=2)

    async def main() -> None:
        bus = await connect_bus(nats_server)
        async with running(bus, service(fake_aws)):
            placed = await launch(bus, "t1", "gang", candidate(num_nodes=4, use_spot=False))
            err = (await wait_for(bus, subject("task", "t1", "capacity_error"))).event
        assert err.error_class == "capacity" and err.code == "Server.InsufficientInstanceCapacity"
        assert err.placement_id == placed.id and err.attempt == 1
        assert fake_aws.request_count("RunInstances") == 1
        assert instances(fake_aws, ("pending", "running", "stopping", "stopped")) == []
        assert await events_on(bus, subject("cluster", "gang", "cluster_provisioned")) == []
        await bus.close()

    asyncio.run(main())


def test_stop_start_idle_and_down(nats_server, fake_aws: FakeAws) -> None:
    async def main() -> None:
        bus = await connect_bus(nats_server)
        async with running(bus, service(fake_aws)):
            await launch(bus, "t1", "od", candidate(use_spot=False))
            prov = (await wait_for(bus, subject("cluster", "od", "cluster_provisioned"))).event
            ids = sorted(n.instance_id for n in prov.nodes)

            await bus.publish(StopRequested(cluster="od"))
            await wait_for(bus, subject("cluster", "od", "cluster_stopped"))
            assert {i["State"]["Name"] for i in instances(fake_aws, ("stopped", "running"))} == {"stopped"}
            await bus.publish(StartRequested(cluster="od"))
            started = (await wait_for(bus, subject("cluster", "od", "cluster_started"))).event
            assert sorted(n.instance_id for n in started.nodes) == ids
            assert len(instances(fake_aws, ("running",))) == 2

            # Idle with down: terminated (reason autostop); a later DownRequested does nothing.
            from datetime import datetime, timezone
            await bus.publish(ClusterIdle(cluster="od", idle_since=datetime.now(timezone.utc), idle_minutes=5,
                                          down=True))
            gone = await wait_for(bus, subject("cluster", "od", "cluster_terminated"))
            await bus.publish(DownRequested(cluster="od"))
            await launch(bus, "t2", "other", candidate(num_nodes=1))  # proves the down was handled
            await wait_for(bus, subject("cluster", "other", "cluster_provisioned"))
            await bus.publish(DownRequested(cluster="other", reason="job_done"))
            other = (await wait_for(bus, subject("cluster", "other", "cluster_terminated"))).event
        assert gone.event.reason == "autostop" and gone.event.instance_ids == ids
        assert other.reason == "job_done" and len(other.instance_ids) == 1
        assert len(await events_on(bus, subject("cluster", "od", "cluster_terminated"))) == 1
        assert instances(fake_aws, ("pending", "running", "stopping", "stopped")) == []
        # The stage's shared security group and key pair went with the last cluster.
        groups = fake_aws.client(REGION).describe_security_groups()["SecurityGroups"]
        assert [g["GroupName"] for g in groups] == ["default"]
        await bus.close()

    asyncio.run(main())


def test_a_slow_launch_does_not_hold_up_another_task(nats_server, fake_aws: FakeAws) -> None:
    """`slow` fails transiently (botocore's 3 attempts all throttled... by InternalError), waits
    out the provisioner's back-off and then launches; `fast`, placed later, is up meanwhile."""
    fake_aws.add_fault("InternalError", instance_type="m5.xlarge", count=3)

    async def main() -> None:
        bus = await connect_bus(nats_server)
        async with running(bus, service(fake_aws, transient_backoff_s=2.5)):
            await launch(bus, "t1", "slow", candidate(num_nodes=1, instance_type="m5.xlarge"))
            await asyncio.sleep(0.3)
            await launch(bus, "t2", "fast", candidate(num_nodes=1))
            await wait_for(bus, subject("cluster", "fast", "cluster_provisioned"), timeout=15)
            assert await bus.last_event(subject("cluster", "slow", "cluster_provisioned")) is None
            slow = await wait_for(bus, subject("cluster", "slow", "cluster_provisioned"), timeout=15)
        assert len(slow.event.nodes) == 1
        assert [r["status"] for r in fake_aws.requests("RunInstances")
                if r["params"]["InstanceType"] == "m5.xlarge"] == [500, 500, 500, 200]
        await bus.close()

    asyncio.run(main())


def test_local_placement_starts_agents_that_run_job_one(nats_server, tmp_path, monkeypatch) -> None:
    """The `local` backend through the service: agents start reading at the placement, run the
    first job, and go away with the cluster."""
    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path / "home"))
    from skypurza.events.types import Candidate

    async def main() -> None:
        bus = await connect_bus(nats_server)
        svc = service_local(tmp_path / "local")
        local = Candidate(infra="local", instance_type="local", num_nodes=1)
        async with running(bus, svc):
            await submit(bus, "tl", "here", num_nodes=1, task={"name": "hello", "run": "echo hello from $SKYPILOT_NODE_RANK"})
            placed = await place(bus, "tl", "here", local)
            prov = (await wait_for(bus, subject("cluster", "here", "cluster_provisioned"), timeout=60)).event
            done = await wait_for(bus, subject("cluster", "here", "job_succeeded"), timeout=60)
            record = json.loads((tmp_path / "local" / "clusters" / "here" / "cluster.json").read_text())
            await bus.publish(DownRequested(cluster="here"))
            gone = (await wait_for(bus, subject("cluster", "here", "cluster_terminated"), timeout=30)).event
        assert prov.placement_id == placed.id and prov.candidate.infra == "local" and len(prov.nodes) == 1
        assert done.event.job_id == 1 and gone.instance_ids == [prov.nodes[0].instance_id]
        pc_seq = (await bus.last_event(subject("task", "tl", "placement_chosen"))).seq
        ready = await wait_for(bus, subject("cluster", "here", "node_ready"))
        assert ready.seq > pc_seq
        assert f"start_seq={pc_seq}" in record["nodes"][0]["argv"]
        await bus.close()

    asyncio.run(main())


def service_local(root):
    from dataclasses import replace

    from provisioner_fixtures import SETTINGS

    from skypurza.services.provisioner.service import ProvisionerService

    return ProvisionerService(replace(SETTINGS, local_root=str(root)))


def test_idle_is_ignored_when_a_job_came_after_it_across_a_restart(nats_server, fake_aws: FakeAws) -> None:
    """State comes from the log: a provisioner started after the events knows the cluster, sees
    that a job was queued after the agent declared it idle, and does not stop it."""
    from datetime import datetime, timezone

    from skypurza.events.jobqueue import queue_job

    async def main() -> None:
        bus = await connect_bus(nats_server)
        async with running(bus, service(fake_aws)):
            await launch(bus, "t1", "od", candidate(use_spot=False, num_nodes=1))
            await wait_for(bus, subject("cluster", "od", "job_queued"))
        # While no provisioner runs: the agent says idle, then the user queues job 2.
        await bus.publish(ClusterIdle(cluster="od", idle_since=datetime.now(timezone.utc), idle_minutes=1))
        await queue_job(bus, cluster="od", task_id="t2", task={"run": "true"})
        async with running(bus, service(fake_aws)) as runner:
            for _ in range(100):
                if runner.stats.handled >= 1:
                    break
                await asyncio.sleep(0.05)
            assert runner.stats.handled == 1 and runner.stats.published == 0
            assert await bus.last_event(subject("cluster", "od", "cluster_stopped")) is None
            # Idle again after job 2: now it stops (on-demand, down=False).
            await bus.publish(ClusterIdle(cluster="od", idle_since=datetime.now(timezone.utc), idle_minutes=1))
            await wait_for(bus, subject("cluster", "od", "cluster_stopped"))
            await bus.publish(StopRequested(cluster="od"))  # already stopped: nothing to do
            for _ in range(100):
                if runner.stats.handled >= 3:
                    break
                await asyncio.sleep(0.05)
        assert len(await events_on(bus, subject("cluster", "od", "cluster_stopped"))) == 1
        assert [i["State"]["Name"] for i in instances(fake_aws, ("running", "stopped"))] == ["stopped"]
        assert fake_aws.request_count("StopInstances") == 1
        await bus.close()

    asyncio.run(main())


def test_a_down_requested_before_the_placement_is_served_cancels_the_launch(nats_server, fake_aws: FakeAws) -> None:
    """`spz down -a` racing a launch: the DownRequested is in the log before the provisioner
    reaches the PlacementChosen. Nothing is launched, the cluster ends, the launch fails with why."""
    from skypurza.events.models import ClusterTerminated

    async def main() -> None:
        bus = await connect_bus(nats_server)
        await submit(bus, "t-race", "racer", num_nodes=1)
        await bus.publish(DownRequested(cluster="racer", reason="user", requested_by="alice"))
        placed = await place(bus, "t-race", "racer", candidate(num_nodes=1))
        svc = service(fake_aws)
        async with running(bus, svc):
            failed = await wait_for(bus, subject("task", "t-race", "provision_failed"))
            ended = await wait_for(bus, subject("cluster", "racer", "cluster_terminated"))
        assert isinstance(failed.event, ProvisionFailed) and failed.event.code == "DownRequested"
        assert failed.event.placement_id == placed.id and "before it came up" in failed.event.message
        assert isinstance(ended.event, ClusterTerminated) and ended.event.instance_ids == []
        assert await bus.last_event(subject("cluster", "racer", "cluster_provisioned")) is None
        assert instances(fake_aws, ("pending", "running", "stopped")) == []
        # A later launch under the same name (submitted after the down) is launched as usual.
        await submit(bus, "t-again", "racer", num_nodes=1)
        await place(bus, "t-again", "racer", candidate(num_nodes=1))
        async with running(bus, service(fake_aws)):
            prov = await wait_for(bus, subject("cluster", "racer", "cluster_provisioned"))
        assert prov.event.task_id == "t-again" and len(instances(fake_aws)) == 1
        await bus.close()

    asyncio.run(main())
