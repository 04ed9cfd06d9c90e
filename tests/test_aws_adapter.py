"""The AWS adapter against the real fake-AWS process (moto over HTTP, faults injected)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aws_fixtures import FakeAws

from skypurza.events import naming
from skypurza.services.provisioner.adapter import (
    CapacityError,
    ClusterRef,
    ComputeBackend,
    FailureKind,
    FailureScope,
    FatalProvisionError,
    LaunchSpec,
    NodeInfo,
    NodeState,
    TransientProvisionError,
    find_orphans,
)
from skypurza.services.provisioner.aws import AwsAdapter
from skypurza.services.provisioner.aws_params import client_token, run_instances_params
from skypurza.services.provisioner.aws_retry import RetryOptions

T = TypeVar("T")
STAGE = "test"
REGION = "us-east-1"
FAST_RETRY = RetryOptions(max_attempts=4, base_delay=0.01, max_delay=0.05)


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path / "home"))  # key files land here
    return tmp_path / "home"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def adapter(aws: FakeAws, **kwargs: Any) -> AwsAdapter:
    return AwsAdapter(session=aws.session(), endpoint_url=aws.endpoint_url, regions=(REGION,),
                      poll_interval=0.02, retry=kwargs.pop("retry", FAST_RETRY), **kwargs)


def spec(**kwargs: Any) -> LaunchSpec:
    base: dict[str, Any] = dict(stage=STAGE, cluster="train", launch_token="placement-1",
                                instance_type="m5.large", region=REGION, zone="us-east-1a",
                                num_nodes=2, use_spot=True, job_id="7")
    return LaunchSpec(**{**base, **kwargs})


async def with_adapter(aws: FakeAws, fn: Any, **kwargs: Any) -> Any:
    async with adapter(aws, **kwargs) as backend:
        return await fn(backend)


def tags_of(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def instances(aws: FakeAws, region: str = REGION) -> dict[str, dict[str, Any]]:
    reply = aws.client(region).describe_instances()
    return {i["InstanceId"]: i for r in reply["Reservations"] for i in r["Instances"]}


def test_adapter_is_a_compute_backend(fake_aws: FakeAws) -> None:
    assert isinstance(adapter(fake_aws), ComputeBackend)


def test_launch_two_node_spot_gang(fake_aws: FakeAws, _home: Path) -> None:
    nodes = run(with_adapter(fake_aws, lambda b: b.launch(spec(disk_size_gb=120))))
    assert [n.rank for n in nodes] == [0, 1]
    assert all(n.state is NodeState.RUNNING and n.use_spot and n.zone == "us-east-1a" for n in nodes)
    assert all(n.private_ip for n in nodes)
    found = instances(fake_aws)
    assert set(found) == {n.instance_id for n in nodes}
    for node in nodes:
        tags = tags_of(found[node.instance_id])
        assert tags[naming.TAG_PROJECT] == naming.PROJECT and tags[naming.TAG_STAGE] == STAGE
        assert tags[naming.TAG_CLUSTER] == "train" and tags[naming.TAG_JOB] == "7"
        assert tags[naming.TAG_RANK] == str(node.rank)
        assert tags[naming.TAG_NAME] == naming.instance_name(STAGE, "train", node.rank or 0)
        assert tags[naming.TAG_LAUNCH_TOKEN] == "placement-1"
        assert found[node.instance_id]["KeyName"] == naming.key_pair(STAGE)
        assert [g["GroupName"] for g in found[node.instance_id]["SecurityGroups"]] == [naming.security_group(STAGE)]
    (call,) = fake_aws.requests("RunInstances")
    p = call["params"]
    assert (p["MinCount"], p["MaxCount"], p["ClientToken"]) == ("2", "2", "placement-1")
    assert p["InstanceMarketOptions.MarketType"] == "spot" and call["zone"] == "us-east-1a"
    assert p["BlockDeviceMapping.1.Ebs.VolumeSize"] == "120"
    assert p["MetadataOptions.HttpTokens"] == "required"
    assert (_home / STAGE / "keys").is_dir() and naming.ssh_key_file(STAGE, REGION).stat().st_mode & 0o077 == 0


def test_zone_id_is_mapped_to_this_accounts_zone_name(fake_aws: FakeAws) -> None:
    zones = fake_aws.client().describe_availability_zones()["AvailabilityZones"]
    target = zones[2]
    nodes = run(with_adapter(fake_aws, lambda b: b.launch(spec(zone=target["ZoneId"], num_nodes=1))))
    assert nodes[0].zone == target["ZoneName"]
    assert fake_aws.requests("RunInstances")[0]["params"]["Placement.AvailabilityZone"] == target["ZoneName"]


def test_unknown_zone_is_unsupported_for_that_zone(fake_aws: FakeAws) -> None:
    with pytest.raises(CapacityError) as info:
        run(with_adapter(fake_aws, lambda b: b.launch(spec(zone="use1-az99"))))
    assert info.value.kind is FailureKind.UNSUPPORTED and info.value.scope is FailureScope.ZONE
    assert fake_aws.request_count("RunInstances") == 0


def test_relaunch_with_same_token_returns_same_instances(fake_aws: FakeAws) -> None:
    async def twice(backend: AwsAdapter) -> tuple[list[NodeInfo], list[NodeInfo]]:
        return await backend.launch(spec()), await backend.launch(spec())

    first, second = run(with_adapter(fake_aws, twice))
    # A new process (a restarted provisioner) finds them too.
    third = run(with_adapter(fake_aws, lambda b: b.launch(spec())))
    assert [n.instance_id for n in first] == [n.instance_id for n in second] == [n.instance_id for n in third]
    assert fake_aws.request_count("RunInstances") == 1
    assert fake_aws.count_instances() == 2


def test_crash_after_run_instances_then_restart_adopts(fake_aws: FakeAws) -> None:
    """The provisioner dies after AWS launched the gang but before it finished: tagging fails
    for good (as if the process were gone). The nodes stay; the restarted launch adopts them."""
    fake_aws.add_fault("InternalError", action="CreateTags")
    with pytest.raises(TransientProvisionError):
        run(with_adapter(fake_aws, lambda b: b.launch(spec())))
    assert fake_aws.request_count("RunInstances") == 1
    assert fake_aws.count_instances() == 2
    fake_aws.clear_faults()
    nodes = run(with_adapter(fake_aws, lambda b: b.launch(spec())))
    assert fake_aws.request_count("RunInstances") == 1
    assert fake_aws.count_instances() == 2
    found = instances(fake_aws)
    assert sorted(found) == sorted(n.instance_id for n in nodes)
    assert sorted(tags_of(found[n.instance_id])[naming.TAG_RANK] for n in nodes) == ["0", "1"]


def test_gang_rolls_back_when_a_node_dies_at_launch(fake_aws: FakeAws) -> None:
    fake_aws.add_launch_failure(index=2, count=1)
    with pytest.raises(CapacityError) as info:
        run(with_adapter(fake_aws, lambda b: b.launch(spec(num_nodes=4))))
    err = info.value
    assert err.kind is FailureKind.SPOT_CAPACITY and err.scope is FailureScope.ZONE
    assert err.code == "Server.InsufficientInstanceCapacity" and err.zone == "us-east-1a"
    assert fake_aws.count_instances(states=("pending", "running", "stopping", "stopped")) == 0
    # The same attempt again (a redelivered event) raises the same failure, launches nothing.
    with pytest.raises(CapacityError) as again:
        run(with_adapter(fake_aws, lambda b: b.launch(spec(num_nodes=4))))
    assert again.value.code == err.code and again.value.kind is err.kind
    assert fake_aws.request_count("RunInstances") == 1
    # A new attempt (new token) is not blocked by it.
    nodes = run(with_adapter(fake_aws, lambda b: b.launch(spec(num_nodes=4, launch_token="placement-2"))))
    assert [n.rank for n in nodes] == [0, 1, 2, 3] and fake_aws.count_instances() == 4


def test_adopting_a_partial_gang_rolls_it_back(fake_aws: FakeAws) -> None:
    nodes = run(with_adapter(fake_aws, lambda b: b.launch(spec(num_nodes=3))))
    fake_aws.preempt(nodes[1].instance_id)
    with pytest.raises(CapacityError) as info:
        run(with_adapter(fake_aws, lambda b: b.launch(spec(num_nodes=3))))
    assert info.value.code == "Server.SpotInstanceTermination"
    assert fake_aws.count_instances() == 0 and fake_aws.request_count("RunInstances") == 1


@pytest.mark.parametrize(("code", "use_spot", "kind", "scope"), [
    ("InsufficientInstanceCapacity", False, FailureKind.CAPACITY, FailureScope.ZONE),
    ("InsufficientInstanceCapacity", True, FailureKind.SPOT_CAPACITY, FailureScope.ZONE),
    ("InsufficientCapacity", False, FailureKind.CAPACITY, FailureScope.ZONE),
    ("SpotMaxPriceTooLow", True, FailureKind.SPOT_CAPACITY, FailureScope.ZONE),
    ("VcpuLimitExceeded", False, FailureKind.QUOTA, FailureScope.REGION),
    ("MaxSpotInstanceCountExceeded", True, FailureKind.QUOTA, FailureScope.REGION),
    ("Unsupported", False, FailureKind.UNSUPPORTED, FailureScope.ZONE),
])
def test_capacity_class_errors_surface_at_once(fake_aws: FakeAws, code: str, use_spot: bool,
                                               kind: FailureKind, scope: FailureScope) -> None:
    fake_aws.add_fault(code, zone="us-east-1a")
    with pytest.raises(CapacityError) as info:
        run(with_adapter(fake_aws, lambda b: b.launch(spec(use_spot=use_spot))))
    err = info.value
    assert (err.kind, err.scope, err.code) == (kind, scope, code)
    assert err.failure.message and err.region == REGION and err.zone == "us-east-1a"
    assert err.instance_type == "m5.large" and err.use_spot is use_spot
    assert fake_aws.request_count("RunInstances") == 1  # no retry, even for HTTP 500
    assert fake_aws.count_instances() == 0


def test_capacity_error_in_one_zone_next_zone_works(fake_aws: FakeAws) -> None:
    fake_aws.add_fault("InsufficientInstanceCapacity", zone="us-east-1a")
    fake_aws.add_fault("InsufficientInstanceCapacity", zone="us-east-1b")

    async def failover(backend: AwsAdapter) -> tuple[list[str], list[NodeInfo]]:
        errors = []
        for n, zone in enumerate(["us-east-1a", "us-east-1b", "us-east-1c"]):
            try:
                return errors, await backend.launch(spec(zone=zone, launch_token=f"attempt-{n}"))
            except CapacityError as err:
                errors.append(f"{err.zone}:{err.code}")
        raise AssertionError("no zone worked")

    errors, nodes = run(with_adapter(fake_aws, failover))
    assert errors == ["us-east-1a:InsufficientInstanceCapacity", "us-east-1b:InsufficientInstanceCapacity"]
    assert {n.zone for n in nodes} == {"us-east-1c"}
    assert fake_aws.request_count("RunInstances") == 3 and fake_aws.count_instances() == 2


def test_throttling_is_retried(fake_aws: FakeAws) -> None:
    fake_aws.add_fault("RequestLimitExceeded", count=2)
    nodes = run(with_adapter(fake_aws, lambda b: b.launch(spec())))
    assert len(nodes) == 2
    assert [c["status"] for c in fake_aws.requests("RunInstances")] == [503, 503, 200]
    assert fake_aws.count_instances() == 2


def test_transient_errors_give_up_after_max_attempts(fake_aws: FakeAws) -> None:
    fake_aws.add_fault("InternalError")
    with pytest.raises(TransientProvisionError) as info:
        run(with_adapter(fake_aws, lambda b: b.launch(spec()),
                         retry=RetryOptions(max_attempts=3, base_delay=0.01)))
    assert info.value.code == "InternalError" and info.value.failure.retryable
    assert fake_aws.request_count("RunInstances") == 3


def test_permission_error_is_fatal_and_actionable(fake_aws: FakeAws) -> None:
    fake_aws.add_fault("UnauthorizedOperation")
    with pytest.raises(FatalProvisionError) as info:
        run(with_adapter(fake_aws, lambda b: b.launch(spec())))
    assert info.value.kind is FailureKind.AUTH and info.value.scope is FailureScope.CLOUD
    assert "decode-authorization-message" in str(info.value)
    assert fake_aws.request_count("RunInstances") == 1


def test_missing_credentials_are_fatal_not_transient(fake_aws: FakeAws, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import aioboto3

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    backend = AwsAdapter(session=aioboto3.Session(), endpoint_url=fake_aws.endpoint_url, regions=(REGION,),
                         poll_interval=0.02, retry=FAST_RETRY)

    async def go() -> None:
        try:
            await backend.launch(spec())
        finally:
            await backend.close()

    with pytest.raises(FatalProvisionError) as info:
        run(go())
    assert info.value.kind is FailureKind.AUTH and "AWS_ACCESS_KEY_ID" in str(info.value)
    assert fake_aws.request_count("RunInstances") == 0


def test_instance_type_not_offered_is_unsupported(fake_aws: FakeAws) -> None:
    with pytest.raises(CapacityError) as info:
        run(with_adapter(fake_aws, lambda b: b.launch(spec(instance_type="p9.48xlarge"))))
    assert info.value.kind is FailureKind.UNSUPPORTED and info.value.scope is FailureScope.REGION


def test_images_per_region_and_default(fake_aws: FakeAws) -> None:
    other = fake_aws.client().describe_images(Owners=["amazon"], Filters=[
        {"Name": "name", "Values": ["amzn2-ami-hvm-*"]}])["Images"][0]["ImageId"]

    async def go(backend: AwsAdapter) -> None:
        await backend.launch(spec(num_nodes=1, launch_token="a", image_id={REGION: other}))
        await backend.launch(spec(num_nodes=1, launch_token="b", image_id="docker:python:3.11"))
        with pytest.raises(CapacityError) as info:
            await backend.launch(spec(num_nodes=1, launch_token="c", image_id={"eu-west-1": other}))
        assert info.value.scope is FailureScope.REGION
        with pytest.raises(CapacityError) as missing:
            await backend.launch(spec(num_nodes=1, launch_token="d", image_id="ami-0000000000000dead"))
        assert missing.value.code == "InvalidAMIID.NotFound"

    run(with_adapter(fake_aws, go))
    images = [c["params"]["ImageId"] for c in fake_aws.requests("RunInstances")]
    assert images == [other, "ami-dca37ea5"]  # docker: runs on the default Deep Learning AMI


def test_efa_and_placement_group_for_best_network(fake_aws: FakeAws) -> None:
    gang = spec(instance_type="p4d.24xlarge", network_tier="best", placement_group=True, num_nodes=2)
    nodes = run(with_adapter(fake_aws, lambda b: b.launch(gang)))
    assert len(nodes) == 2
    p = fake_aws.requests("RunInstances")[0]["params"]
    assert p["Placement.GroupName"] == naming.placement_group(STAGE, "train")
    cards = sorted(int(v) for k, v in p.items() if k.endswith(".NetworkCardIndex"))
    assert cards == [0, 1, 2, 3]
    assert {v for k, v in p.items() if k.endswith(".InterfaceType")} == {"efa"}
    assert "SecurityGroupId.1" not in p  # the groups moved onto the interfaces
    groups = fake_aws.client().describe_placement_groups()["PlacementGroups"]
    assert [(g["GroupName"], g["Strategy"]) for g in groups] == [(naming.placement_group(STAGE, "train"), "cluster")]


def test_terminate_releases_resources_after_last_cluster(fake_aws: FakeAws, _home: Path) -> None:
    ec2 = fake_aws.client()

    async def go(backend: AwsAdapter) -> None:
        a = await backend.launch(spec(cluster="a", launch_token="ta", placement_group=True))
        await backend.launch(spec(cluster="b", launch_token="tb"))
        web = await backend.launch(spec(cluster="web", launch_token="tw", ports=("8080", "9000-9010"), num_nodes=1))
        ours = {g["GroupName"] for g in ec2.describe_security_groups(
            Filters=[{"Name": "tag:Stage", "Values": [STAGE]}])["SecurityGroups"]}
        assert ours == {naming.security_group(STAGE), naming.security_group(STAGE, "web")}
        # web's own group has its ports open.
        (web_group,) = ec2.describe_security_groups(GroupNames=[naming.security_group(STAGE, "web")])["SecurityGroups"]
        assert {(r.get("FromPort"), r.get("ToPort")) for r in web_group["IpPermissions"]} >= {(8080, 8080), (9000, 9010)}

        gone = await backend.terminate(ClusterRef(stage=STAGE, cluster="a", region=REGION))
        assert gone == sorted(n.instance_id for n in a)
        assert ec2.describe_placement_groups()["PlacementGroups"] == []  # a's own group
        names = {g["GroupName"] for g in ec2.describe_security_groups()["SecurityGroups"]}
        assert naming.security_group(STAGE) in names  # b still uses the shared group
        assert ec2.describe_key_pairs()["KeyPairs"]

        await backend.terminate(ClusterRef(stage=STAGE, cluster="web", region=REGION, instance_ids=(web[0].instance_id,)))
        names = {g["GroupName"] for g in ec2.describe_security_groups()["SecurityGroups"]}
        assert naming.security_group(STAGE, "web") not in names and naming.security_group(STAGE) in names

        await backend.terminate(ClusterRef(stage=STAGE, cluster="b", region=REGION))
        names = {g["GroupName"] for g in ec2.describe_security_groups()["SecurityGroups"]}
        assert names == {"default"}
        assert ec2.describe_key_pairs()["KeyPairs"] == []
        assert not naming.ssh_key_file(STAGE, REGION).exists()
        # Terminating again is a no-op.
        assert await backend.terminate(ClusterRef(stage=STAGE, cluster="b", region=REGION)) == []

    run(with_adapter(fake_aws, go))
    assert fake_aws.count_instances(states=("pending", "running", "stopping", "stopped", "shutting-down")) == 0


def test_stop_and_start_on_demand(fake_aws: FakeAws) -> None:
    ref = ClusterRef(stage=STAGE, cluster="train", region=REGION)

    async def go(backend: AwsAdapter) -> None:
        launched = await backend.launch(spec(use_spot=False))
        stopped = await backend.stop(ref)
        assert [(n.rank, n.state) for n in stopped] == [(0, NodeState.STOPPED), (1, NodeState.STOPPED)]
        started = await backend.start(ref)
        assert [(n.rank, n.state) for n in started] == [(0, NodeState.RUNNING), (1, NodeState.RUNNING)]
        assert [n.instance_id for n in started] == [n.instance_id for n in launched]
        await backend.launch(spec(cluster="spotty", launch_token="s"))
        with pytest.raises(FatalProvisionError) as info:
            await backend.stop(ClusterRef(stage=STAGE, cluster="spotty", region=REGION))
        assert info.value.kind is FailureKind.UNSUPPORTED

    run(with_adapter(fake_aws, go))


def test_start_without_capacity_is_a_capacity_error(fake_aws: FakeAws) -> None:
    ref = ClusterRef(stage=STAGE, cluster="train", region=REGION)
    run(with_adapter(fake_aws, lambda b: b.launch(spec(use_spot=False))))
    run(with_adapter(fake_aws, lambda b: b.stop(ref)))
    fake_aws.add_fault("InsufficientInstanceCapacity", action="StartInstances")
    with pytest.raises(CapacityError) as info:
        run(with_adapter(fake_aws, lambda b: b.start(ref)))
    assert info.value.kind is FailureKind.CAPACITY
    assert fake_aws.request_count("StartInstances") == 1


def test_preemption_is_visible_through_describe(fake_aws: FakeAws) -> None:
    ref = ClusterRef(stage=STAGE, cluster="train", region=REGION)
    nodes = run(with_adapter(fake_aws, lambda b: b.launch(spec())))
    fake_aws.preempt(nodes[1].instance_id)
    seen = run(with_adapter(fake_aws, lambda b: b.describe(ref)))
    assert [(n.rank, n.state) for n in seen] == [(0, NodeState.RUNNING), (1, NodeState.TERMINATED)]
    assert seen[1].state_reason_code == "Server.SpotInstanceTermination"
    owned = run(with_adapter(fake_aws, lambda b: b.list_owned(STAGE)))
    assert [n.instance_id for n in owned] == [nodes[0].instance_id]
    orphans, vanished = find_orphans(owned, {"train": [n.instance_id for n in nodes]})
    assert orphans == [] and vanished == {"train": (nodes[1].instance_id,)}


def test_orphans_with_our_tags_are_found_others_untouched(fake_aws: FakeAws) -> None:
    ec2 = fake_aws.client()

    def behind_our_back(stage: str, cluster: str) -> str:
        tags = [{"Key": k, "Value": v} for k, v in {**naming.base_tags(stage), naming.TAG_CLUSTER: cluster}.items()]
        reply = ec2.run_instances(ImageId="ami-dca37ea5", InstanceType="m5.large", MinCount=1, MaxCount=1,
                                  TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
        return str(reply["Instances"][0]["InstanceId"])

    nodes = run(with_adapter(fake_aws, lambda b: b.launch(spec())))
    ghost = behind_our_back(STAGE, "ghost")
    foreign = behind_our_back("other", "ghost")
    untagged = ec2.run_instances(ImageId="ami-dca37ea5", InstanceType="m5.large", MinCount=1, MaxCount=1)

    async def go(backend: AwsAdapter) -> tuple[list[NodeInfo], list[str], list[str]]:
        owned = await backend.list_owned(STAGE, [REGION, "us-west-2"])
        orphans, vanished = find_orphans(owned, {"train": [n.instance_id for n in nodes]})
        assert vanished == {}
        # Asking to terminate the other stage's instance through this stage does nothing.
        foreign_node = replace(orphans[0], instance_id=foreign)
        assert await backend.terminate_nodes(STAGE, [foreign_node]) == []
        return owned, [o.instance_id for o in orphans], await backend.terminate_nodes(STAGE, orphans)

    owned, orphan_ids, terminated = run(with_adapter(fake_aws, go))
    assert sorted(n.instance_id for n in owned) == sorted([ghost, *(n.instance_id for n in nodes)])
    assert orphan_ids == [ghost] and terminated == [ghost]
    states = {iid: i["State"]["Name"] for iid, i in instances(fake_aws).items()}
    assert states[ghost] == "terminated"
    assert states[foreign] == "running" and states[untagged["Instances"][0]["InstanceId"]] == "running"
    assert all(states[n.instance_id] == "running" for n in nodes)


# ---------------------------------------------------------------------- pure parts


def _node(iid: str, cluster: str | None, state: NodeState = NodeState.RUNNING) -> NodeInfo:
    return NodeInfo(instance_id=iid, rank=0, state=state, region=REGION, cluster=cluster)


def test_find_orphans_rules() -> None:
    owned = [
        _node("i-1", "a"), _node("i-2", "a"),  # a: both known
        _node("i-3", "a"),  # a leftover of an earlier attempt for a live cluster
        _node("i-4", "b"),  # b is launching (ids not known yet): accepted
        _node("i-5", "dead"),  # no live cluster
        _node("i-6", None),  # no cluster tag at all
        _node("i-7", "dead", NodeState.TERMINATING),  # already going away
    ]
    orphans, vanished = find_orphans(owned, {"a": ["i-1", "i-2"], "b": [], "c": ["i-9"]})
    assert [o.instance_id for o in orphans] == ["i-6", "i-3", "i-5"]
    assert vanished == {"c": ("i-9",)}
    orphans, vanished = find_orphans(owned, ["a", "b"])
    assert sorted(o.instance_id for o in orphans) == ["i-5", "i-6"] and vanished == {}


def test_run_instances_params_shapes() -> None:
    base = dict(zone="us-east-1a", image_id="ami-1", root_device="/dev/xvda", security_group_id="sg-1",
                key_name="k", placement_group=None, subnet_id="subnet-1")
    plain = run_instances_params(spec(use_spot=False, labels={"team": "ml", naming.TAG_STAGE: "spoofed"}), **base)
    assert plain["SecurityGroupIds"] == ["sg-1"] and plain["SubnetId"] == "subnet-1"
    assert "NetworkInterfaces" not in plain and "InstanceMarketOptions" not in plain
    assert "BlockDeviceMappings" not in plain
    tags = {t["Key"]: t["Value"] for t in plain["TagSpecifications"][0]["Tags"]}
    assert tags["team"] == "ml" and tags[naming.TAG_STAGE] == STAGE  # labels cannot override ours
    # best network on a type without EFA: plain networking.
    assert "NetworkInterfaces" not in run_instances_params(spec(network_tier="best"), **base)
    one_efa = run_instances_params(spec(instance_type="g5.48xlarge", network_tier="best"), **base)
    assert one_efa["NetworkInterfaces"] == [{
        "DeviceIndex": 0, "NetworkCardIndex": 0, "InterfaceType": "efa", "Groups": ["sg-1"],
        "DeleteOnTermination": True, "SubnetId": "subnet-1", "AssociatePublicIpAddress": True,
    }]
    disk = run_instances_params(spec(disk_size_gb=500, disk_tier="best"), **base)["BlockDeviceMappings"]
    assert disk == [{"DeviceName": "/dev/xvda", "Ebs": {"DeleteOnTermination": True, "VolumeType": "io2",
                                                         "Iops": 64000, "VolumeSize": 500}}]


def test_client_token_fits_ec2_limits() -> None:
    assert client_token("abc") == "abc"
    long = client_token("x" * 100)
    assert len(long) == 64 and long == client_token("x" * 100) and long != client_token("x" * 101)
    assert len(client_token("zoné")) == 64


def test_launch_spec_validation() -> None:
    with pytest.raises(ValueError):
        spec(num_nodes=0)
    with pytest.raises(ValueError):
        spec(launch_token="")


def test_endpoint_and_credentials_from_the_environment(fake_aws: FakeAws, monkeypatch: pytest.MonkeyPatch) -> None:
    """A provisioner process configured only by environment (AWS_ENDPOINT_URL and friends)."""
    for key, value in fake_aws.env.items():
        monkeypatch.setenv(key, value)

    async def go() -> list[NodeInfo]:
        async with AwsAdapter(regions=(REGION,), poll_interval=0.02, retry=FAST_RETRY) as backend:
            return await backend.launch(spec(num_nodes=1))

    nodes = run(go())
    assert fake_aws.count_instances() == 1 and nodes[0].instance_id in instances(fake_aws)
