"""End to end through the bus: optimizer and provisioner services in one process, fake AWS.

A 2-node spot task whose two first choices (the cheapest zones) have no spot capacity lands on
the third, with exactly two instances running at the end and every attempt in the event log.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aws_fixtures import FakeAws
from nats_fixtures import connect_bus
from provisioner_fixtures import aws_env, events_on, subject, wait_for

from skypurza.cli.serve import serve
from skypurza.events.models import CapacityError, TaskSubmitted
from skypurza.services.optimizer import decide
from skypurza.services.optimizer.catalog import load_catalog

TASK = {"name": "e2e", "run": "echo hi", "num_nodes": 2,
        "resources": {"infra": "aws", "instance_type": "m5.large", "use_spot": True}}


def expected_attempts(submitted: TaskSubmitted) -> list:
    """The optimizer's own first three choices when the first two fail for spot capacity."""
    world = decide.World(load_catalog(), frozenset({"aws"}), None)
    chosen = [decide.first_placement(submitted, world)]
    errors: list[CapacityError] = []
    for n in (1, 2):
        errors.append(CapacityError(task_id=submitted.task_id, cluster=submitted.cluster, placement_id=f"p{n}",
                                    attempt=n, candidate=chosen[-1].candidate, error_class="spot_capacity",
                                    code="InsufficientInstanceCapacity", message=""))
        chosen.append(decide.after_capacity_error(submitted, errors, world))
    return [c.candidate for c in chosen]


def test_spot_gang_fails_over_twice_and_lands_on_the_third_choice(
        nats_server, fake_aws: FakeAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in aws_env(fake_aws, SKYPURZA_HOME=str(tmp_path / "home"), SKYPURZA_ENABLED_INFRAS="aws",
                              SKYPURZA_LIVE_SPOT_PRICES="0").items():
        monkeypatch.setenv(key, value)
    submitted = TaskSubmitted(task_id="e2e-1", cluster="spotty", task=TASK, num_nodes=2, user="alice")
    first, second, third = expected_attempts(submitted)
    assert first.use_spot and len({(c.region, c.zone) for c in (first, second, third)}) == 3

    def zone_name(region: str, zone: str) -> str:
        zones = fake_aws.client(region).describe_availability_zones()["AvailabilityZones"]
        return next(z["ZoneName"] for z in zones if zone in (z["ZoneName"], z["ZoneId"]))

    for c in (first, second):
        fake_aws.add_fault("InsufficientInstanceCapacity", region=c.region, zone=zone_name(c.region, c.zone),
                           instance_type="m5.large", market="spot")

    async def main():
        bus = await connect_bus(nats_server)
        stop, ready = asyncio.Event(), asyncio.Event()
        services = asyncio.create_task(serve(nats_server.url, "test", ["optimizer", "provisioner"], stop, ready))
        try:
            await asyncio.wait_for(ready.wait(), 30)
            await bus.publish(submitted)
            prov = await wait_for(bus, subject("cluster", "spotty", "cluster_provisioned"), timeout=40)
        finally:
            stop.set()
            await asyncio.wait_for(services, 20)
        chosen = [s.event for s in await events_on(bus, subject("task", "e2e-1", "placement_chosen"))]
        errors = [s.event for s in await events_on(bus, subject("task", "e2e-1", "capacity_error"))]
        assert [p.attempt for p in chosen] == [1, 2, 3]
        assert [(p.candidate.region, p.candidate.zone) for p in chosen] == [
            (c.region, c.zone) for c in (first, second, third)]
        assert [(e.attempt, e.error_class, e.code) for e in errors] == [
            (1, "spot_capacity", "InsufficientInstanceCapacity"), (2, "spot_capacity", "InsufficientInstanceCapacity")]
        assert [e.candidate.zone for e in errors] == [first.zone, second.zone]
        ev = prov.event
        assert ev.placement_id == (await bus.last_event(subject("task", "e2e-1", "placement_chosen"))).envelope.id
        assert (ev.candidate.region, ev.candidate.zone) == (third.region, third.zone) and len(ev.nodes) == 2
        assert await events_on(bus, subject("task", "e2e-1", "placement_failed")) == []
        await bus.close()
        return ev

    ev = asyncio.run(main())
    # Exactly two instances run anywhere, both in the third choice's zone, both spot.
    regions = {first.region, second.region, third.region}
    running = [i for r in regions for res in fake_aws.client(r).describe_instances(Filters=[
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])["Reservations"]
        for i in res["Instances"]]
    assert sorted(i["InstanceId"] for i in running) == sorted(n.instance_id for n in ev.nodes)
    assert {i["Placement"]["AvailabilityZone"] for i in running} == {zone_name(third.region, third.zone)}
    assert {i.get("InstanceLifecycle") for i in running} == {"spot"}
    # Every attempt reached AWS exactly once.
    calls = fake_aws.requests("RunInstances")
    assert [(c["region"], c["zone"], c["status"]) for c in calls] == [
        (first.region, zone_name(first.region, first.zone), 500),
        (second.region, zone_name(second.region, second.zone), 500),
        (third.region, zone_name(third.region, third.zone), 200)]
