"""Reservations as flavors (docs/dispatch.md, *Reservations*): an ODCR, a capacity block or a
Slurm reservation named by a flavor is tried in the queue's order, holds its capacity in
nodes, and confines placement; the launch targets it (RunInstances'
CapacityReservationSpecification, sbatch's --reservation).

Pure: the policy's positioned errors, flavor order, a full reservation falling through to
on-demand, the optimizer's placement restricted to the reservation, the EC2 request and the
sbatch script. Live: the real dispatch service, optimizer and provisioner on a real
nats-server and the fake AWS (moto behind tests/support/fakeaws.py, which emulates the
capacity reservations moto lacks): a reservation created with boto3 takes the first task and
the second, once it is full, goes on demand."""

from __future__ import annotations

import asyncio
import subprocess
from datetime import datetime, timezone

import pytest
from nats_fixtures import connect_bus
from provisioner_fixtures import service as provisioner_service

from skypurza.events import naming
from skypurza.events.dispatch_events import DispatchPolicyApplied, TaskAdmitted
from skypurza.events.models import PlacementChosen, PlacementFailed, TaskSubmitted
from skypurza.events.service import ServiceRunner
from skypurza.events.types import ReservationRef
from skypurza.services.dispatch import admit
from skypurza.services.dispatch.demand import Pending, pending_of
from skypurza.services.dispatch.policy import PolicyError, load_policy
from skypurza.services.dispatch.service import DispatchService
from skypurza.services.optimizer import decide
from skypurza.services.optimizer.catalog.model import Catalog, InstanceType, Offering, ZoneOffer
from skypurza.services.optimizer.service import OptimizerService
from skypurza.services.provisioner.adapter import LaunchSpec
from skypurza.services.provisioner.aws_params import run_instances_params
from skypurza.services.provisioner.slurm_sbatch import (
    SbatchOptionError, SbatchRequest, directives, reservation_name, sbatch_options,
)

CR = "cr-0123456789abcdef0"
NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)

# m5.large is the cheapest place for a 2-CPU task; the reservation is of m5.xlarge in us-east-1b.
CATALOG = Catalog.from_parts(
    cloud="aws", built_at="2026-11-30T00:00:00Z", source="test",
    types=[InstanceType("m5.large", 2, 8, None, 0, None, "x86_64"),
           InstanceType("m5.xlarge", 4, 16, None, 0, None, "x86_64")],
    offerings=[Offering("m5.large", "us-east-1", 96_000, (ZoneOffer("us-east-1a", 30_000),)),
               Offering("m5.xlarge", "us-east-1", 192_000, (ZoneOffer("us-east-1a", 60_000),))],
)


def policy_text(cr: str = CR, count: int = 2, order: tuple[str, ...] = ("odcr", "ondemand")) -> str:
    quotas = {"odcr": "      - flavor: odcr\n",
              "ondemand": "      - flavor: ondemand\n        resources: {cpu: {nominal: 64}}\n"}
    return (f"""flavors:
  - name: odcr
    reservation:
      aws: {{id: {cr}, region: us-east-1, zone: us-east-1b, instance_type: m5.xlarge, count: {count}}}
  - name: ondemand
    infra: aws
queues:
  - name: team-a
    team: team-a
    quotas:
""" + "".join(quotas[f] for f in order))


def pending(i: int, nodes: int = 1, **kw) -> Pending:
    return Pending(f"t{i}", f"c{i}", i, "team-a", "alice", {"cpu": 2.0 * nodes}, nodes=nodes, **kw)


# ---------------------------------------------------------------- policy

@pytest.mark.parametrize("flavor, where, text", [
    ("{name: r, reservation: {}}", "2:28: flavors[0].reservation", "name exactly one of"),
    ("{name: r, reservation: {aws: {id: " + CR + ", region: us-east-1, zone: us-east-1a, instance_type: m5.large, "
     "count: 1}, slurm: {cluster: c1, name: maint}}}", "flavors[0].reservation", "found aws, slurm"),
    ("{name: r, infra: local, reservation: {slurm: {cluster: c1, name: maint}}}", "flavors[0].reservation.slurm",
     "on infra slurm, but the flavor says infra 'local'"),
    ("{name: r, market: spot, reservation: {slurm: {cluster: c1, name: maint}}}", "flavors[0].reservation.slurm",
     "not a spot market"),
    ("{name: r, reservation: {aws: {id: " + CR + ", region: us-east-1, zone: eu-west-1a, instance_type: m5.large, "
     "count: 1}}}", "flavors[0].reservation.aws.zone", "not in region 'us-east-1'"),
    ("{name: r, reservation: {aws_capacity_block: {id: cr-nothex, region: us-east-1, zone: us-east-1a, "
     "instance_type: m5.large, count: 1}}}", "flavors[0].reservation.aws_capacity_block.id", "pattern"),
    ("{name: r, reservation: {aws: {id: " + CR + ", region: us-east-1, zone: us-east-1a, instance_type: m5.large, "
     "count: 0}}}", "flavors[0].reservation.aws.count", "greater than or equal to 1"),
    ("{name: r, reservation: {slurm: {cluster: c1, name: maint, nodez: 2}}}", "flavors[0].reservation.slurm.nodez",
     "unknown key; accepted here: cluster, name, nodes"),
])
def test_reservation_policy_errors_are_positioned(flavor, where, text):
    with pytest.raises(PolicyError) as exc:
        load_policy(f"flavors:\n  - {flavor}\n", "p.yaml")
    msg = str(exc.value)
    assert msg.startswith("p.yaml:2:") and where in msg and text in msg, msg


# ---------------------------------------------------------------- admission (pure)

def test_reservation_first_then_on_demand_when_full():
    pol = load_policy(policy_text(count=2))
    got = admit.decide(pol, [pending(0), pending(1), pending(2)], {}, {}, {}, NOW)
    assert [(d.flavor, d.infra) for d in got] == [("odcr", "aws"), ("odcr", "aws"), ("ondemand", "aws")]
    assert got[0].reservation == ReservationRef(kind="aws", id=CR, region="us-east-1", zone="us-east-1b",
                                                instance_type="m5.xlarge")
    assert got[2].reservation is None


def test_reservation_capacity_is_nodes_over_every_admission():
    pol = load_policy(policy_text(count=3))
    # Two nodes held already (a task admitted earlier): a 2-node task no longer fits, a 1-node one does.
    usage = {"team-a": {("odcr", "nodes"): 2.0, ("odcr", "cpu"): 4.0}}
    two, one = admit.decide(pol, [pending(5, nodes=2), pending(6)], usage, {}, {}, NOW)
    assert (two.flavor, one.flavor) == ("ondemand", "odcr")


def test_flavor_order_decides_and_a_full_reservation_with_no_fallback_holds():
    on_demand_first = load_policy(policy_text(order=("ondemand", "odcr")))
    (d,) = admit.decide(on_demand_first, [pending(0)], {}, {}, {}, NOW)
    assert d.flavor == "ondemand" and d.reservation is None
    only = load_policy(policy_text(count=1, order=("odcr",)))
    first, second = admit.decide(only, [pending(0), pending(1)], {}, {}, {}, NOW)
    assert first.flavor == "odcr"
    assert isinstance(second, admit.Hold) and second.kind == "quota"
    assert second.reason == f"team-a: reservation {CR} (flavor odcr): 1/1 nodes in use; needs 1"


def test_tasks_a_reservation_cannot_take_skip_it():
    pol = load_policy(policy_text())
    spot, other_type, other_region, local = admit.decide(pol, [
        pending(0, spot=True), pending(1, instance_type="m5.large"), pending(2, region="eu-west-1"),
        pending(3, infra="local")], {}, {}, {}, NOW)
    assert spot.flavor is None or spot.flavor != "odcr"
    assert (other_type.flavor, other_region.flavor) == ("ondemand", "ondemand")
    assert isinstance(local, admit.Hold) and local.kind == "no_flavor"


def test_pending_reads_the_pinned_region_and_type():
    ev = TaskSubmitted(task_id="t", cluster="c", user="u", team="team-a",
                       task={"run": "x", "resources": {"infra": "aws/eu-west-1", "instance_type": "m5.large"}})
    p = pending_of(ev, 1, "u", "team-a")
    assert (p.infra, p.region, p.instance_type) == ("aws", "eu-west-1", "m5.large")


# ---------------------------------------------------------------- placement (pure)

def submitted(task_id: str = "t1", cpus: str = "2+") -> TaskSubmitted:
    return TaskSubmitted(task_id=task_id, cluster=f"c-{task_id}", user="alice", team="team-a",
                         task={"run": "echo hi", "resources": {"infra": "aws", "cpus": cpus}})


REF = ReservationRef(kind="aws", id=CR, region="us-east-1", zone="us-east-1b", instance_type="m5.xlarge")


def test_placement_is_restricted_to_the_reservation():
    world = decide.World(catalog=CATALOG, enabled_infras=frozenset({"aws"}))
    free = decide.first_placement(submitted(), world)
    assert isinstance(free, PlacementChosen) and free.candidate.instance_type == "m5.large"
    assert free.candidate.reservation is None and "reservation" not in free.candidate.model_dump()
    got = decide.first_placement(submitted(), decide.admitted_world(world, "aws"), reservation=REF)
    assert isinstance(got, PlacementChosen)
    c = got.candidate
    assert (c.infra, c.region, c.zone, c.zones, c.instance_type, c.use_spot) == \
        ("aws", "us-east-1", "us-east-1b", ["us-east-1b"], "m5.xlarge", False)
    assert c.reservation == REF and all(r.reservation == REF and r.instance_type == "m5.xlarge" for r in got.remaining)


def test_a_task_the_reservation_cannot_hold_fails_with_the_reason():
    world = decide.World(catalog=CATALOG, enabled_infras=frozenset({"aws"}))
    got = decide.first_placement(submitted(cpus="8+"), world, reservation=REF)
    assert isinstance(got, PlacementFailed)
    assert got.reason.startswith(f"admitted to reservation {CR} (m5.xlarge in us-east-1b), but no placement")


# ---------------------------------------------------------------- the launch requests (pure)

def spec(kind: str | None, rid: str | None, spot: bool = False) -> LaunchSpec:
    return LaunchSpec(stage="test", cluster="c", launch_token="tok", instance_type="m5.xlarge", region="us-east-1",
                      zone="us-east-1b", use_spot=spot, reservation_kind=kind, reservation_id=rid)


def params(s: LaunchSpec) -> dict:
    return run_instances_params(s, zone=s.zone, image_id="ami-1", root_device="/dev/xvda", security_group_id="sg-1",
                                key_name=None, placement_group=None, subnet_id=None)


def test_run_instances_targets_the_reservation():
    target = {"CapacityReservationTarget": {"CapacityReservationId": CR}}
    odcr = params(spec("aws", CR))
    assert odcr["CapacityReservationSpecification"] == target and "InstanceMarketOptions" not in odcr
    block = params(spec("aws_capacity_block", CR))
    assert block["CapacityReservationSpecification"] == target
    assert block["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    plain = params(spec(None, None))
    assert "CapacityReservationSpecification" not in plain
    assert "CapacityReservationSpecification" not in params(spec("slurm", "maint"))


def test_sbatch_reservation_is_generated_and_protected():
    req = SbatchRequest(job_name="j", output="o", partition="debug", reservation="maint_1")
    lines = directives(req)
    assert "--reservation=maint_1" in lines and lines.index("--reservation=maint_1") == lines.index("--partition=debug") + 1
    assert not any(d.startswith("--reservation") for d in directives(SbatchRequest(job_name="j", output="o")))
    with pytest.raises(SbatchOptionError, match="--reservation is generated by SkyPurza"):
        sbatch_options({"reservation": "other"})
    with pytest.raises(SbatchOptionError, match="not a Slurm reservation name"):
        reservation_name("maint\n#SBATCH --uid=0")
    assert reservation_name("maint.a-1") == "maint.a-1"


# ---------------------------------------------------------------- live: fake AWS

TARGET = "CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId"


async def _until(check, timeout: float = 30.0, what: str = ""):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = await check()
        if got:
            return got
        assert asyncio.get_running_loop().time() < deadline, f"waited for {what}"
        await asyncio.sleep(0.05)


async def _events(bus, cls, task_id):
    return [s.event async for s in bus.replay(filter_subject=naming.aggregate_subjects("test", "task", task_id))
            if isinstance(s.event, cls)]


def test_dispatched_task_launches_into_a_capacity_reservation(nats_server, fake_aws):
    ec2 = fake_aws.client()
    cr = ec2.create_capacity_reservation(InstanceType="m5.xlarge", InstancePlatform="Linux/UNIX",
                                         AvailabilityZone="us-east-1b", InstanceCount=1)["CapacityReservation"]
    cr_id = cr["CapacityReservationId"]
    policy = load_policy(policy_text(cr=cr_id, count=1))

    async def main():
        bus = await connect_bus(nats_server)
        prov = provisioner_service(fake_aws)
        services = [OptimizerService(catalog=CATALOG, enabled=frozenset({"aws"})), DispatchService(), prov]
        runners = [ServiceRunner(bus, s) for s in services]
        jobs = [asyncio.create_task(r.run()) for r in runners]
        try:
            await bus.publish(DispatchPolicyApplied(policy=policy, source="test"))
            for tid in ("r1", "r2"):
                await bus.publish(TaskSubmitted(task_id=tid, cluster=f"c-{tid}", user="alice", team="team-a",
                                                secrets_key=tid, task={"run": "echo hi",
                                                                       "resources": {"infra": "aws", "cpus": "2+"}}))
                await _until(lambda: _events(bus, TaskAdmitted, tid), what=f"{tid} admitted")
            (a1,), (a2,) = await _events(bus, TaskAdmitted, "r1"), await _events(bus, TaskAdmitted, "r2")
            assert (a1.flavor, a1.reservation.id if a1.reservation else None) == ("odcr", cr_id)
            assert (a2.flavor, a2.reservation) == ("ondemand", None)  # the reservation holds one node

            async def two_launches():
                got = [r for r in fake_aws.requests("RunInstances") if r["status"] == 200]
                return got if len(got) >= 2 else None
            reqs = await _until(two_launches, what="both RunInstances")
            by_type = {r["params"]["InstanceType"]: r for r in reqs}
            reserved, plain = by_type["m5.xlarge"], by_type["m5.large"]
            assert reserved["params"][TARGET] == cr_id and reserved["zone"] == "us-east-1b"
            assert TARGET not in plain["params"]
            # Read back from "AWS": the reservation's one instance is taken.
            (after,) = ec2.describe_capacity_reservations(CapacityReservationIds=[cr_id])["CapacityReservations"]
            assert after["AvailableInstanceCount"] == 0 and after["TotalInstanceCount"] == 1
            (placed,) = await _events(bus, PlacementChosen, "r1")
            assert placed.candidate.reservation is not None and placed.candidate.reservation.id == cr_id
        finally:
            for r in runners:
                r.stop()
            await asyncio.wait_for(asyncio.gather(*jobs, return_exceptions=True), 20)
            await prov.close()
            await bus.close()

    asyncio.run(main())


# ---------------------------------------------------------------- live: a real Slurm

def test_slurm_allocation_runs_in_the_reservation(slurm_rig, nats_server, tmp_path):
    from slurm_rig import CLUSTER, NODES, PARTITION

    from skypurza.events import slurm_config
    from skypurza.services.provisioner.adapter import ClusterRef
    from skypurza.services.provisioner.slurm import SlurmAdapter

    def scontrol(*args: str) -> str:
        res = subprocess.run(["scontrol", *args], env=slurm_rig.env, capture_output=True, text=True, timeout=20)
        assert res.returncode == 0, res.stderr
        return res.stdout

    name = "spz-maint"
    # IGNORE_JOBS: the session's rig may still run another test's allocation on the node.
    scontrol("create", "reservation", f"ReservationName={name}", "Users=root", f"Nodes={NODES[0]}",
             "StartTime=now", "Duration=30", "Flags=IGNORE_JOBS")
    config = tmp_path / "slurm-config"
    config.write_text(slurm_rig.slurm_config())
    adapter = SlurmAdapter(nats_server.url, "test", tmp_path / "state", config_path=config,
                           user_config=slurm_config.parse_user_config({}), pending_timeout_s=10)
    spec = LaunchSpec(stage="test", cluster="resv", launch_token="tok-resv", instance_type="1cpu-1000mb",
                      region=CLUSTER, zone=PARTITION, infra="slurm", labels={"start_seq": "1"},
                      reservation_kind="slurm", reservation_id=name)

    async def main():
        try:
            await adapter.launch(spec)
            job_id = adapter._read("resv")["slurm_job_id"]
            info = scontrol("show", "job", "-o", str(job_id))
            await adapter.terminate(ClusterRef(stage="test", cluster="resv", infra="slurm"))
            return info
        finally:
            await adapter.close()

    try:
        info = asyncio.run(main())
    finally:
        scontrol("delete", f"ReservationName={name}")
    assert f"Reservation={name}" in info, info
    assert f"NodeList={NODES[0]}" in info, info
