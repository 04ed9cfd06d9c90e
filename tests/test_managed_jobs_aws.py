"""Managed jobs end to end on the fake AWS: the real optimizer (a three-zone catalog), the real
provisioner and AWS adapter, the real recovery service, and real agent processes started the
way EC2's user-data starts them (tests/support/ec2_agents.py). A spot instance is preempted
with fake_aws.preempt (terminated, Server.SpotInstanceTermination)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace

import pytest
from ec2_agents import Ec2Agents
from managed_fixtures import statuses, until, wait_status
from nats_fixtures import connect_bus

from skypurza.events import naming
from skypurza.events.models import SpotPreempted, TaskSubmitted
from skypurza.events.service import ServiceRunner
from skypurza.services.optimizer.catalog.model import Catalog, InstanceType, Offering, ZoneOffer
from skypurza.services.optimizer.service import OptimizerService
from skypurza.services.provisioner.aws import AwsAdapter
from skypurza.services.provisioner.aws_retry import RetryOptions
from skypurza.services.provisioner.service import ProvisionerService
from skypurza.services.provisioner.settings import ProvisionerSettings
from skypurza.services.recovery.service import RecoveryService
from skypurza.services.recovery.settings import RecoverySettings
from skypurza.services.recovery.submit import submit_managed_job

STAGE = "test"
REGIONS = ("us-east-1", "us-west-2")

# us-east-1a is the cheapest spot zone, then us-east-1b, then us-west-2a.
CATALOG = Catalog.from_parts(
    cloud="aws", built_at="2026-11-30T00:00:00Z", source="test",
    types=[InstanceType("m5.large", 2, 8, None, 0, None, "x86_64")],
    offerings=[Offering("m5.large", "us-east-1", 96_000, (ZoneOffer("us-east-1a", 30_000),
                                                          ZoneOffer("us-east-1b", 31_000))),
               Offering("m5.large", "us-west-2", 96_000, (ZoneOffer("us-west-2a", 35_000),))],
)

# Resumes from the checkpoint bucket: the first run saves step 1 and keeps running (until its
# node is preempted); a run that finds the checkpoint finishes.
RUN = """
echo "task id: $SKYPILOT_TASK_ID managed job: $SKYPILOT_MANAGED_JOB_ID node: $SKYPILOT_NODE_RANK"
if [ "$SKYPILOT_NODE_RANK" = 0 ]; then
  echo "$SKYPILOT_TASK_ID $(echo $SKYPILOT_CLUSTER_INFO | tr -d ' ')" >> ~/ckpt/runs.log
fi
if [ -f ~/ckpt/step ]; then
  echo "resumed from step $(cat ~/ckpt/step)"
  exit 0
fi
if [ "$SKYPILOT_NODE_RANK" = 0 ]; then echo 1 > ~/ckpt/step; fi
sleep 120
"""


def task(strategy: str | None, num_nodes: int = 1) -> dict:
    resources = {"infra": "aws", "instance_type": "m5.large", "use_spot": True}
    if strategy:
        resources["job_recovery"] = strategy
    return {"name": "train", "num_nodes": num_nodes, "resources": resources, "run": RUN,
            "file_mounts": {"~/ckpt": {"name": f"ckpt-{(strategy or 'default').lower().replace('_', '-')}",
                                       "store": "s3", "mode": "MOUNT"}}}


@contextlib.asynccontextmanager
async def control_plane(nats_server, fake_aws, tmp_path, monkeypatch):
    for k, v in {**fake_aws.env, "SKYPURZA_CHECKPOINT_SYNC_S": "0.2"}.items():
        monkeypatch.setenv(k, v)
    bus = await connect_bus(nats_server)
    adapter = AwsAdapter(session=fake_aws.session(), endpoint_url=fake_aws.endpoint_url, regions=REGIONS,
                         poll_interval=0.05, retry=RetryOptions(max_attempts=3, base_delay=0.01, max_delay=0.05))
    prov = ProvisionerService(replace(ProvisionerSettings(), aws_regions=REGIONS, aws_poll_s=0.05, concurrency=8,
                                      ack_wait_s=5.0, reconcile_interval_s=0, transient_attempts=2,
                                      transient_backoff_s=0.05), backends={"aws": adapter})
    rec = RecoveryService(RecoverySettings(ec2_poll_s=0.3, heartbeat_timeout_s=0, reconcile_s=5),
                          aws_session=fake_aws.session(), endpoint_url=fake_aws.endpoint_url, bucket_store="s3")
    services = [OptimizerService(catalog=CATALOG, enabled=frozenset({"aws"})), prov, rec]
    runners = [ServiceRunner(bus, s) for s in services]
    tasks = [asyncio.create_task(r.run()) for r in runners]
    agents = await Ec2Agents(bus, nats_server.url, tmp_path / "nodes", fake_aws).start()
    try:
        yield bus, agents
    finally:
        await agents.stop()
        for r in runners:
            r.stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
        await rec.close()
        await prov.close()
        await bus.close()


async def managed_clusters(bus, job_id: int) -> list[TaskSubmitted]:
    subject = naming.event_filter(STAGE, "task", "task_submitted")
    return [s.event async for s in bus.replay(filter_subject=subject)
            if isinstance(s.event, TaskSubmitted) and s.event.managed_job_id == job_id]


async def run_preemption(bus, agents: Ec2Agents, fake_aws, strategy: str | None, num_nodes: int = 1) -> dict:
    job = await submit_managed_job(bus, name="train", tasks=[task(strategy, num_nodes)], user="alice")
    await wait_status(bus, job.managed_job_id, "RUNNING", timeout=30)
    bucket = task(strategy)["file_mounts"]["~/ckpt"]["name"]
    s3 = fake_aws.client(service="s3")

    def saved() -> bool:
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
        return "step" in keys

    await until(saved, timeout=20, what="the first run's checkpoint in S3")
    first = next(n for n in agents.nodes.values() if n.cluster == "train-1-1" and n.rank == 0)
    seen: list[set[str]] = []
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            seen.append(await asyncio.to_thread(agents.running_clusters, list(REGIONS)))
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())
    assert fake_aws.preempt(first.instance_id, region=first.region) in ("terminated", "shutting-down")
    await wait_status(bus, job.managed_job_id, "RECOVERING", timeout=20)
    final = await wait_status(bus, job.managed_job_id, "SUCCEEDED", timeout=60)
    await until(lambda: not agents.running_clusters(list(REGIONS)), timeout=20, what="every cluster gone")
    stop.set()
    await sampler
    runs = s3.get_object(Bucket=bucket, Key="runs.log")["Body"].read().decode().split("\n")
    return {"job": job, "first": first, "statuses": final, "seen": seen, "runs": [r for r in runs if r],
            "launches": await managed_clusters(bus, job.managed_job_id)}


@pytest.mark.timeout(150)
def test_failover_preempted_spot_node_recovers_in_another_zone_and_resumes(nats_server, fake_aws, tmp_path,
                                                                         monkeypatch, spz_home):
    async def main():
        async with control_plane(nats_server, fake_aws, tmp_path, monkeypatch) as (bus, agents):
            got = await run_preemption(bus, agents, fake_aws, "FAILOVER", num_nodes=2)
            job = got["job"]
            assert [e.status for e in got["statuses"]] == ["STARTING", "RUNNING", "RECOVERING", "RUNNING", "SUCCEEDED"]
            first, second = got["launches"]
            assert (first.cluster, second.cluster) == ("train-1-1", "train-1-2")
            # Same region first, another zone: the preempted zone's spot market is blocked.
            assert second.task.resources.infra == "aws/us-east-1"
            assert [(b.scope, b.zone) for b in second.initial_blocks] == [("spot_market", "us-east-1a")]
            assert '"zone":"us-east-1b"' in got["runs"][1] and '"zone":"us-east-1a"' in got["runs"][0]
            # The same SKYPILOT_TASK_ID in both runs, and the second run saw the first one's checkpoint.
            ids = {line.split()[0] for line in got["runs"]}
            assert len(got["runs"]) == 2 and ids == {job.skypilot_task_ids[0]}
            preempted = await bus.last_event(naming.event_subject(STAGE, "cluster", "train-1-1", "spot_preempted"))
            assert isinstance(preempted.event, SpotPreempted)
            assert preempted.event.instance_id == got["first"].instance_id
            assert preempted.event.evidence["state_reason_code"] == "Server.SpotInstanceTermination"
            # Never two clusters at once; the preempted one was gone before the new one ran.
            # The surviving node of the old cluster runs until its teardown; only then the new one.
            seen = [sorted(s) for s in got["seen"]]
            assert max(len(s) for s in seen) <= 1, seen
            assert ["train-1-1"] in seen and ["train-1-2"] in seen
            assert seen.index(["train-1-1"]) < seen.index(["train-1-2"])
            assert len(agents.nodes) == 4 and got["statuses"][-1].recoveries == 1
            logs = [m.data.decode() async for m in bus.replay_raw(
                filter_subject=naming.logs_subject_filter(STAGE, "train-1-2"), stream=bus.logs_stream)]
            assert any("resumed from step 1" in line for line in logs)

    asyncio.run(main())


@pytest.mark.timeout(150)
def test_eager_next_region_by_default_lands_in_another_region(nats_server, fake_aws, tmp_path, monkeypatch,
                                                              spz_home):
    async def main():
        async with control_plane(nats_server, fake_aws, tmp_path, monkeypatch) as (bus, agents):
            got = await run_preemption(bus, agents, fake_aws, None)
            first, second = got["launches"]
            assert second.task == first.task  # no pin: the region is blocked instead
            assert [(b.scope, b.region) for b in second.initial_blocks] == [("region", "us-east-1")]
            assert '"region":"us-east-1"' in got["runs"][0] and '"region":"us-west-2"' in got["runs"][1]
            assert max(len(s) for s in got["seen"]) <= 1
            assert got["statuses"][-1].recoveries == 1

    asyncio.run(main())


@pytest.mark.timeout(120)
def test_no_capacity_anywhere_is_failed_no_resource_with_every_attempt(nats_server, fake_aws, tmp_path,
                                                                       monkeypatch, spz_home):
    async def main():
        fake_aws.add_fault("InsufficientInstanceCapacity")
        async with control_plane(nats_server, fake_aws, tmp_path, monkeypatch) as (bus, agents):
            job = await submit_managed_job(bus, name="train", tasks=[task(None)])
            got = await wait_status(bus, job.managed_job_id, "FAILED_NO_RESOURCE", timeout=30)
            reason = got[-1].reason
            for i, zone in enumerate(["us-east-1a", "us-east-1b", "us-west-2a"], 1):
                assert f"{i}) aws/{zone[:-1]}/{zone} m5.large spot" in reason, reason
            assert "3)" in reason and "InsufficientInstanceCapacity" in reason
            assert [e.status for e in await statuses(bus, job.managed_job_id)] == ["STARTING", "FAILED_NO_RESOURCE"]
            assert not agents.nodes

    asyncio.run(main())
