"""Teardown that never hangs and never lies, against a bare `moto_server` and the fault proxy.

- down on a bare moto_server (no placement groups there) ends with ClusterTerminated: `spz down`
  exits 0, `spz status` no longer says UP and the cost stops accruing;
- an operation moto does not implement is classified NotImplemented and asked once;
- a placement group that cannot be deleted is a CleanupFailed warning published before
  ClusterTerminated, retried in the background (bounded, with back-off) until it is gone;
- `spz down` of a request the provisioner parks exits 1 with the reason, within a bound; with no
  provisioner at all it gives up after `--timeout`;
- reconciliation that finds every node of a cluster gone publishes ClusterTerminated, once;
- a region where every launch failed is left clean after `spz down -a` and after
  `spz reconcile --terminate-orphans`; another stage's resources survive both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aws_fixtures import BareMoto, FakeAws
from nats_fixtures import connect_bus
from provisioner_fixtures import (
    REGION,
    STAGE,
    adapter,
    candidate,
    events_on,
    launch,
    running,
    service,
    subject,
    wait_for,
)

from skypurza.events import naming
from skypurza.events.models import CleanupFailed, ClusterTerminated, DownRequested
from skypurza.events.types import Candidate
from skypurza.services.provisioner import aws_errors
from skypurza.services.provisioner.adapter import FailureKind, ProvisionError
from skypurza.services.provisioner.aws import _Where
from skypurza.services.provisioner.state import live_clusters

REPO = Path(__file__).resolve().parent.parent
WEST = "us-west-2"
GANG_TASK = {"name": "gang", "run": "echo hi", "num_nodes": 2,
             "resources": {"infra": "aws", "instance_type": "p4d.24xlarge", "network_tier": "best"}}


@pytest.fixture(params=["fault_proxy", "bare_moto"])
def any_aws(request: pytest.FixtureRequest) -> FakeAws:
    """The same test against the fault proxy and against a bare moto_server."""
    return request.getfixturevalue("fake_aws" if request.param == "fault_proxy" else "bare_moto")


def base_env(aws: FakeAws, tmp_path: Path, nats_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKYPURZA_", "AWS_"))}
    env.update(aws.env)
    env.update({"SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_NATS_URL": nats_url, "SKYPURZA_STAGE": STAGE,
                "SKYPURZA_AWS_REGIONS": REGION, "SKYPURZA_AWS_POLL_S": "0.02", "SKYPURZA_AWS_RETRY_BASE_S": "0.01",
                "SKYPURZA_AWS_MAX_ATTEMPTS": "3", "SKYPURZA_PROVISIONER_ACK_WAIT_S": "5",
                "SKYPURZA_RECONCILE_INTERVAL_S": "0", "SKYPURZA_RECONCILE_GRACE_S": "0",
                "SKYPURZA_PROVISIONER_TRANSIENT_BACKOFF_S": "0.05", "SKYPURZA_USER": "alice", "COLUMNS": "200"})
    env.update(extra)
    return env


@contextlib.contextmanager
def services(nats_url: str, env: dict[str, str], log: Path, names: str) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m skypurza.cli.serve` as its own process; killed at the end, on failure too."""
    proc = subprocess.Popen([sys.executable, "-m", "skypurza.cli.serve", "--nats", nats_url, "--stage", STAGE,
                             "--services", names], env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def spz(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def stage_resources(aws: FakeAws, stage: str, region: str) -> dict[str, list[str]]:
    """This stage's security groups, key pairs and placement groups in `region`, by name."""
    ec2 = aws.client(region)
    prefix = f"{naming.PROJECT}-{stage}-"
    groups = [g["GroupName"] for g in ec2.describe_security_groups()["SecurityGroups"]
              if g["GroupName"].startswith(prefix)]
    keys = [k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"] if k["KeyName"].startswith(prefix)]
    try:
        pgs = [p["GroupName"] for p in ec2.describe_placement_groups()["PlacementGroups"]
               if p["GroupName"].startswith(prefix)]
    except Exception:  # a bare moto_server has no placement groups at all
        pgs = []
    return {"security-groups": sorted(groups), "key-pairs": sorted(keys), "placement-groups": sorted(pgs)}


def other_stage_resources(aws: FakeAws, region: str) -> None:
    """What another stage holds in `region`: its shared security group and key pair."""
    ec2 = aws.client(region)
    vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    tags = [{"Key": k, "Value": v} for k, v in naming.base_tags("other").items()]
    ec2.create_security_group(GroupName=naming.security_group("other"), Description="other stage", VpcId=vpc,
                              TagSpecifications=[{"ResourceType": "security-group", "Tags": tags}])
    ec2.create_key_pair(KeyName=naming.key_pair("other"), TagSpecifications=[{"ResourceType": "key-pair", "Tags": tags}])


def west(zone: str = "us-west-2a", **kw: Any) -> Candidate:
    return Candidate(infra="aws", region=WEST, zone=zone, instance_type=kw.pop("instance_type", "m5.large"),
                     use_spot=False, num_nodes=kw.pop("num_nodes", 1), hourly_price_micros=96_000, vcpus=2,
                     memory_gib=8, **kw)


def alive(aws: FakeAws, region: str = REGION) -> int:
    return aws.count_instances(region, states=("pending", "running", "stopping", "stopped", "shutting-down"))


async def eventually(check: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.1)


# ------------------------------------------------------------------------------------------------


def test_down_on_bare_moto_ends_the_cluster_status_and_cost(nats_server, bare_moto: BareMoto, tmp_path: Path) -> None:
    env = base_env(bare_moto, tmp_path, nats_server.url, SKYPURZA_METERING_TICK_S="1")

    def cost() -> int:
        r = spz(env, "cost-report", "-o", "json")
        assert r.returncode == 0, r.stderr
        return int(json.loads(r.stdout)["total"]["cost_micros"])

    with services(nats_server.url, env, tmp_path / "services.log", "provisioner,ledger"):
        async def up() -> list[str]:
            bus = await connect_bus(nats_server)
            await launch(bus, "t1", "train", candidate(use_spot=False, price=3_600_000_000))
            prov = await wait_for(bus, subject("cluster", "train", "cluster_provisioned"), timeout=60)
            await bus.close()
            return [n.instance_id for n in prov.event.nodes]

        ids = asyncio.run(up())
        assert stage_resources(bare_moto, STAGE, REGION)["security-groups"]  # created on first use
        deadline = time.monotonic() + 30
        while cost() == 0:  # $1000/h per node: a second of it is visible
            assert time.monotonic() < deadline, "no cost accrued while the cluster was up"
            time.sleep(0.5)
        status = json.loads(spz(env, "status", "-o", "json").stdout)
        assert [(c["name"], c["status"]) for c in status] == [("train", "UP")]

        started = time.monotonic()
        r = spz(env, "down", "train", "-y", "--timeout", "60")
        took = time.monotonic() - started
        assert r.returncode == 0, r.stdout + r.stderr
        assert took < 30 and "TERMINATED" in r.stdout + r.stderr and "Traceback" not in r.stderr

        async def ended() -> tuple[ClusterTerminated, list[CleanupFailed]]:
            bus = await connect_bus(nats_server)
            term = (await wait_for(bus, subject("cluster", "train", "cluster_terminated"))).event
            warnings = [s.event for s in await events_on(bus, naming.event_filter(STAGE, "cluster", "cleanup_failed"))]
            await bus.close()
            return term, warnings  # type: ignore[return-value]

        term, warnings = asyncio.run(ended())
        assert term.reason == "user" and sorted(term.instance_ids) == sorted(ids)
        # moto has no placement groups: nothing of that kind can exist, so no warning either.
        assert warnings == []
        assert alive(bare_moto) == 0
        assert stage_resources(bare_moto, STAGE, REGION) == {"security-groups": [], "key-pairs": [],
                                                             "placement-groups": []}
        deadline = time.monotonic() + 20
        while True:  # the ledger applies ClusterTerminated: nothing UP any more
            rows = json.loads(spz(env, "status", "-o", "json").stdout)
            if all(c["status"] != "UP" for c in rows):
                break
            assert time.monotonic() < deadline, rows
            time.sleep(0.3)
        first = cost()
        time.sleep(3)  # three more meter ticks
        assert cost() == first > 0  # metering stopped at terminated_at


def test_an_operation_moto_lacks_is_not_implemented_and_asked_once(bare_moto: BareMoto, tmp_path: Path) -> None:
    log = tmp_path / "moto_server.log"

    async def go() -> ProvisionError:
        async with adapter(bare_moto) as backend:
            before = log.read_text().count('" 500 ')
            with pytest.raises(ProvisionError) as caught:
                await backend._call(_Where(REGION), "describe_placement_groups")
            assert log.read_text().count('" 500 ') == before + 1  # one request: never retried
            # Releasing does not fail on it: no placement group can exist where none can be made.
            report = await backend.release_unused(STAGE, [REGION])
            assert report.failures == []
            return caught.value

    err = asyncio.run(go())
    assert err.code == aws_errors.NOT_IMPLEMENTED and err.kind is FailureKind.UNSUPPORTED
    assert "DescribePlacementGroups" in str(err) and "emulator" in str(err)


def test_placement_group_not_deleted_is_a_warning_retried_in_the_background(nats_server, fake_aws: FakeAws) -> None:
    # Every botocore try of the teardown's own attempt fails (FAST_RETRY: 3); the next works.
    fake_aws.add_fault("InternalError", action="DeletePlacementGroup", count=3)
    svc = service(fake_aws, cleanup_interval_s=0.2, cleanup_backoff_s=0.5, cleanup_attempts=4)
    pg = naming.placement_group(STAGE, "gang")

    async def main() -> None:
        bus = await connect_bus(nats_server)
        async with running(bus, svc):
            await launch(bus, "t1", "gang", candidate(instance_type="p4d.24xlarge", use_spot=False), task=GANG_TASK)
            await wait_for(bus, subject("cluster", "gang", "cluster_provisioned"))
            assert [g["GroupName"] for g in fake_aws.client().describe_placement_groups()["PlacementGroups"]] == [pg]
            await bus.publish(DownRequested(cluster="gang"))
            term = await wait_for(bus, subject("cluster", "gang", "cluster_terminated"))
            warned = await events_on(bus, subject("cluster", "gang", "cleanup_failed"))
            # The warning came first (a waiting `spz down` sees it) and did not hold the cluster up.
            assert len(warned) == 1 and warned[0].seq < term.seq
            w = warned[0].event
            assert isinstance(w, CleanupFailed)
            assert (w.resource_type, w.resource, w.region, w.code, w.attempt, w.will_retry) == (
                "placement-group", pg, REGION, "InternalError", 1, True)
            assert alive(fake_aws) == 0
            # The security group and key pair were released at teardown all the same.
            left = stage_resources(fake_aws, STAGE, REGION)
            assert left["security-groups"] == [] and left["key-pairs"] == [] and left["placement-groups"] == [pg]
            # The background sweep retries after the back-off, and the group goes.
            await eventually(lambda: not fake_aws.client().describe_placement_groups()["PlacementGroups"],
                             what="the placement group deleted in the background")
            await asyncio.sleep(1.0)  # more sweeps: nothing left to try
        assert fake_aws.request_count("DeletePlacementGroup") == 4
        assert len(await events_on(bus, naming.event_filter(STAGE, "cluster", "cleanup_failed"))) == 1
        await bus.close()

    asyncio.run(main())


def test_cleanup_retries_are_bounded(nats_server, fake_aws: FakeAws) -> None:
    fake_aws.add_fault("InternalError", action="DeletePlacementGroup")  # never works
    svc = service(fake_aws, cleanup_interval_s=0.1, cleanup_backoff_s=0.1, cleanup_attempts=3)

    async def main() -> None:
        bus = await connect_bus(nats_server)
        async with running(bus, svc):
            await launch(bus, "t1", "gang", candidate(instance_type="p4d.24xlarge", use_spot=False), task=GANG_TASK)
            await wait_for(bus, subject("cluster", "gang", "cluster_provisioned"))
            await bus.publish(DownRequested(cluster="gang"))
            await wait_for(bus, subject("cluster", "gang", "cluster_terminated"))
            failures = naming.event_filter(STAGE, "cluster", "cleanup_failed")
            await wait_for(bus, failures, lambda s: getattr(s.event, "will_retry", True) is False, timeout=20)
            asked = fake_aws.request_count("DeletePlacementGroup")
            await asyncio.sleep(1.5)  # many sweeps later: given up, never asked again
            assert fake_aws.request_count("DeletePlacementGroup") == asked == 3 * 3
            found = [s.event for s in await events_on(bus, failures)]
        assert [(f.attempt, f.will_retry) for f in found] == [(1, True), (2, True), (3, False)]
        await bus.close()

    asyncio.run(main())


def test_down_of_a_parked_request_exits_with_the_reason(nats_server, fake_aws: FakeAws, tmp_path: Path) -> None:
    fake_aws.add_fault("UnauthorizedOperation", action="TerminateInstances")
    env = base_env(fake_aws, tmp_path, nats_server.url)
    with services(nats_server.url, env, tmp_path / "services.log", "provisioner"):
        async def up() -> None:
            bus = await connect_bus(nats_server)
            await launch(bus, "t1", "train", candidate(use_spot=False))
            await wait_for(bus, subject("cluster", "train", "cluster_provisioned"), timeout=60)
            await bus.close()

        asyncio.run(up())
        started = time.monotonic()
        r = spz(env, "down", "train", "-y", "--timeout", "120")
        took = time.monotonic() - started
    assert r.returncode == 1, r.stdout + r.stderr
    assert "down failed" in r.stderr and "parked" in r.stderr and "UnauthorizedOperation" in r.stderr
    assert "Traceback" not in r.stderr and took < 60  # parked after 5 tries, not the 120 s bound
    # No provisioner at all: the wait still ends, at --timeout, saying so.
    started = time.monotonic()
    r = spz(env, "down", "train", "-y", "--timeout", "2")
    assert r.returncode == 1 and "not confirmed within 2s" in r.stderr, r.stderr
    assert time.monotonic() - started < 30


def test_reconciliation_ends_a_cluster_whose_nodes_are_all_gone(nats_server, any_aws: FakeAws) -> None:
    svc = service(any_aws)

    async def main() -> None:
        bus = await connect_bus(nats_server)
        async with running(bus, svc):
            await launch(bus, "t1", "train", candidate(use_spot=False))
            prov = (await wait_for(bus, subject("cluster", "train", "cluster_provisioned"))).event
            ids = [n.instance_id for n in prov.nodes]
            # One node gone: a lost node, reported; the cluster still runs.
            any_aws.client().terminate_instances(InstanceIds=ids[:1])
            report = await svc.reconcile()
            assert report.vanished == {"train": tuple(ids[:1])} and report.ended == []
            assert await events_on(bus, subject("cluster", "train", "cluster_terminated")) == []
            # Every node gone behind our back: nothing bills, the cluster is over.
            any_aws.client().terminate_instances(InstanceIds=ids)
            first, second = await svc.reconcile(), await svc.reconcile()
        assert first.ended == ["train"] and second.ended == [] and second.vanished == {}
        ended = await events_on(bus, subject("cluster", "train", "cluster_terminated"))
        assert len(ended) == 1
        assert ended[0].event.reason == "vanished" and sorted(ended[0].event.instance_ids) == sorted(ids)
        assert "train" not in await live_clusters(bus)
        await bus.close()

    asyncio.run(main())


def fail_launches_in_west(aws: FakeAws) -> tuple[Candidate, dict[str, Any]]:
    """A placement in us-west-2 that fails after the stage's security group and key pair exist
    there: a capacity fault on the proxy; on a bare moto_server, the placement group it lacks."""
    if isinstance(aws, BareMoto):
        return west(zone="us-west-2a", instance_type="p4d.24xlarge", num_nodes=2), GANG_TASK
    aws.add_fault("InsufficientInstanceCapacity", region=WEST)
    return west(), {"name": "w", "run": "echo hi"}


def test_a_region_where_every_launch_failed_is_clean_after_down_all(nats_server, any_aws: FakeAws,
                                                                    tmp_path: Path) -> None:
    for region in (REGION, WEST):
        other_stage_resources(any_aws, region)
    failing, task = fail_launches_in_west(any_aws)
    env = base_env(any_aws, tmp_path, nats_server.url, SKYPURZA_AWS_REGIONS=f"{REGION},{WEST}",
                   SKYPURZA_CLEANUP_INTERVAL_S="3600")  # only the teardown's own sweep runs

    with services(nats_server.url, env, tmp_path / "services.log", "provisioner"):
        async def setup() -> str:
            bus = await connect_bus(nats_server)
            await launch(bus, "t-west", "west", failing, task=task)
            err = await wait_for(bus, subject("task", "t-west", "capacity_error"), timeout=60)
            await launch(bus, "t-east", "east", candidate(use_spot=False))
            await wait_for(bus, subject("cluster", "east", "cluster_provisioned"), timeout=60)
            await bus.close()
            return str(err.event.code)

        code = asyncio.run(setup())
        assert code == ("NotImplemented" if isinstance(any_aws, BareMoto) else "InsufficientInstanceCapacity")
        leaked = stage_resources(any_aws, STAGE, WEST)
        assert leaked["security-groups"] and leaked["key-pairs"]  # what a failed launch leaves
        r = spz(env, "down", "-a", "-y", "--timeout", "60")
        assert r.returncode == 0, r.stdout + r.stderr

        empty = {"security-groups": [], "key-pairs": [], "placement-groups": []}
        asyncio.run(eventually(lambda: all(stage_resources(any_aws, STAGE, rg) == empty for rg in (REGION, WEST)),
                               what="no resource of the stage left in any region it touched"))
    assert alive(any_aws, REGION) == 0 and alive(any_aws, WEST) == 0
    for region in (REGION, WEST):  # the other stage keeps what it had
        assert stage_resources(any_aws, "other", region)["security-groups"] == [naming.security_group("other")]
        assert stage_resources(any_aws, "other", region)["key-pairs"] == [naming.key_pair("other")]


def test_terminate_orphans_sweeps_a_region_where_every_launch_failed(nats_server, any_aws: FakeAws,
                                                                     tmp_path: Path) -> None:
    other_stage_resources(any_aws, WEST)
    failing, task = fail_launches_in_west(any_aws)
    svc = service(any_aws)

    async def fail_once() -> None:
        bus = await connect_bus(nats_server)
        async with running(bus, svc):
            await launch(bus, "t-west", "west", failing, task=task)
            await wait_for(bus, subject("task", "t-west", "capacity_error"), timeout=60)
        await bus.close()

    asyncio.run(fail_once())
    assert stage_resources(any_aws, STAGE, WEST)["security-groups"]
    env = base_env(any_aws, tmp_path, nats_server.url, SKYPURZA_AWS_REGIONS=REGION)
    r = spz(env, "reconcile", "--terminate-orphans", "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["cleanup_failed"] == [] and report["live_clusters"] == []
    assert stage_resources(any_aws, STAGE, WEST) == {"security-groups": [], "key-pairs": [], "placement-groups": []}
    assert stage_resources(any_aws, "other", WEST)["security-groups"] == [naming.security_group("other")]
    assert stage_resources(any_aws, "other", WEST)["key-pairs"] == [naming.key_pair("other")]
    assert not re.search(r"Traceback", r.stderr)
