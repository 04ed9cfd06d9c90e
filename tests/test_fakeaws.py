"""The fault-injecting fake AWS itself: real botocore error parsing, preemption, accounts."""

from __future__ import annotations

import pytest
from aws_fixtures import FakeAws
from botocore.config import Config
from botocore.exceptions import ClientError

IMAGE = "ami-dca37ea5"  # one of moto's default AMIs (present in every region and account)
NO_RETRY = Config(retries={"mode": "standard", "total_max_attempts": 1})


def run(aws: FakeAws, region: str = "us-east-1", zone: str = "us-east-1a", count: int = 1,
        instance_type: str = "m5.large", spot: bool = False, client_config: Config = NO_RETRY) -> list[dict]:
    kwargs: dict = {}
    if spot:
        kwargs["InstanceMarketOptions"] = {"MarketType": "spot"}
    reply = aws.client(region, config=client_config).run_instances(
        ImageId=IMAGE, InstanceType=instance_type, MinCount=count, MaxCount=count,
        Placement={"AvailabilityZone": zone}, **kwargs)
    return reply["Instances"]


@pytest.mark.parametrize(("code", "status"), [
    ("InsufficientInstanceCapacity", 500),
    ("InsufficientCapacity", 500),
    ("SpotMaxPriceTooLow", 400),
    ("VcpuLimitExceeded", 400),
    ("MaxSpotInstanceCountExceeded", 400),
    ("Unsupported", 400),
    ("RequestLimitExceeded", 503),
    ("UnauthorizedOperation", 403),
    ("InternalError", 500),
])
def test_fault_is_real_aws_error_xml(fake_aws: FakeAws, code: str, status: int) -> None:
    fake_aws.add_fault(code, zone="us-east-1a", instance_type="m5.large")
    with pytest.raises(ClientError) as info:
        run(fake_aws)
    err = info.value.response
    assert err["Error"]["Code"] == code
    assert err["ResponseMetadata"]["HTTPStatusCode"] == status
    assert err["Error"]["Message"]
    assert fake_aws.count_instances() == 0


def test_default_message_names_type_and_zone(fake_aws: FakeAws) -> None:
    fake_aws.add_fault("InsufficientInstanceCapacity", zone="us-east-1b")
    with pytest.raises(ClientError) as info:
        run(fake_aws, zone="us-east-1b", instance_type="c6i.xlarge")
    assert "c6i.xlarge" in info.value.response["Error"]["Message"]
    assert "us-east-1b" in info.value.response["Error"]["Message"]


def test_rules_match_zone_market_type_region_and_count(fake_aws: FakeAws) -> None:
    fake_aws.add_fault("InsufficientInstanceCapacity", region="us-east-1", zone="us-east-1a",
                       instance_type="m5.large", market="spot", count=1)
    assert run(fake_aws, zone="us-east-1b", spot=True)  # other zone
    assert run(fake_aws, zone="us-east-1a", spot=False)  # on-demand
    assert run(fake_aws, zone="us-east-1a", spot=True, instance_type="m5.xlarge")  # other type
    assert run(fake_aws, region="us-west-2", zone="us-west-2a", spot=True)  # other region
    with pytest.raises(ClientError):
        run(fake_aws, zone="us-east-1a", spot=True)
    assert run(fake_aws, zone="us-east-1a", spot=True)  # count=1: spent
    assert [r["fired"] for r in fake_aws.rules()] == [1]


def test_after_lets_calls_through_first(fake_aws: FakeAws) -> None:
    fake_aws.add_fault("InsufficientInstanceCapacity", after=2, count=1)
    run(fake_aws)
    run(fake_aws)
    with pytest.raises(ClientError):
        run(fake_aws)
    run(fake_aws)
    assert fake_aws.count_instances() == 3


def test_any_action_can_fail(fake_aws: FakeAws) -> None:
    fake_aws.add_fault("UnauthorizedOperation", action="DescribeInstances", count=1)
    ec2 = fake_aws.client(config=NO_RETRY)
    with pytest.raises(ClientError) as info:
        ec2.describe_instances()
    assert info.value.response["Error"]["Code"] == "UnauthorizedOperation"
    assert "ec2:DescribeInstances" in info.value.response["Error"]["Message"]
    assert ec2.describe_instances()["Reservations"] == []


def test_botocore_standard_mode_retries_capacity_errors(fake_aws: FakeAws) -> None:
    """The problem the adapter's retry policy solves: AWS sends InsufficientInstanceCapacity
    with HTTP 500, and botocore resends it."""
    fake_aws.add_fault("InsufficientInstanceCapacity")
    with pytest.raises(ClientError):
        run(fake_aws, client_config=Config(retries={"mode": "standard", "total_max_attempts": 2}))
    assert fake_aws.request_count("RunInstances") == 2


def test_preempt_marks_a_spot_interruption(fake_aws: FakeAws) -> None:
    first, second = run(fake_aws, count=2, spot=True)
    assert fake_aws.preempt(first["InstanceId"]) == "terminated"
    ec2 = fake_aws.client()
    found = {i["InstanceId"]: i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}
    assert found[first["InstanceId"]]["State"]["Name"] == "terminated"
    assert found[first["InstanceId"]]["StateReason"]["Code"] == "Server.SpotInstanceTermination"
    assert found[second["InstanceId"]]["State"]["Name"] == "running"
    by_reason = ec2.describe_instances(Filters=[
        {"Name": "state-reason-code", "Values": ["Server.SpotInstanceTermination"]}])["Reservations"]
    assert [i["InstanceId"] for r in by_reason for i in r["Instances"]] == [first["InstanceId"]]


def test_launch_failure_kills_one_node_after_success(fake_aws: FakeAws) -> None:
    fake_aws.add_launch_failure(index=1)
    launched = run(fake_aws, count=3)
    assert [i["AmiLaunchIndex"] for i in launched] == [0, 1, 2]
    found = {i["InstanceId"]: i for r in fake_aws.client().describe_instances()["Reservations"] for i in r["Instances"]}
    states = [found[i["InstanceId"]]["State"]["Name"] for i in launched]
    assert states == ["running", "terminated", "running"]
    assert found[launched[1]["InstanceId"]]["StateReason"]["Code"] == "Server.InsufficientInstanceCapacity"
    assert len(run(fake_aws, count=2)) == 2 and fake_aws.count_instances() == 4  # count=1: spent


def test_accounts_are_isolated(fake_aws: FakeAws) -> None:
    other = FakeAws(fake_aws.server, account_id="999988887777")
    run(fake_aws, count=2)
    assert fake_aws.count_instances() == 2
    assert other.count_instances() == 0
    fake_aws.add_fault("InsufficientInstanceCapacity")
    run(other)  # a rule belongs to the account that added it
    assert other.count_instances() == 1
    other.clear_faults()
    other.clear_requests()


def test_instance_type_validation_is_on(fake_aws: FakeAws) -> None:
    with pytest.raises(ClientError) as info:
        run(fake_aws, instance_type="p9.48xlarge")
    assert info.value.response["Error"]["Code"].startswith("InvalidInstanceType")


def test_request_log_counts_what_reached_aws(fake_aws: FakeAws) -> None:
    fake_aws.add_fault("RequestLimitExceeded", count=1)
    with pytest.raises(ClientError):
        run(fake_aws)
    run(fake_aws, spot=True, zone="us-east-1c")
    calls = fake_aws.requests("RunInstances")
    assert [c["status"] for c in calls] == [503, 200]
    assert [c["fault"] for c in calls] == ["RequestLimitExceeded", None]
    assert calls[1]["market"] == "spot" and calls[1]["zone"] == "us-east-1c"
    assert calls[1]["params"]["InstanceType"] == "m5.large"


def test_placement_groups(fake_aws: FakeAws) -> None:
    ec2 = fake_aws.client(config=NO_RETRY)
    ec2.create_placement_group(GroupName="pg1", Strategy="cluster", TagSpecifications=[
        {"ResourceType": "placement-group", "Tags": [{"Key": "Stage", "Value": "a"}]}])
    ec2.create_placement_group(GroupName="pg2", Strategy="cluster")
    with pytest.raises(ClientError) as dup:
        ec2.create_placement_group(GroupName="pg1", Strategy="cluster")
    assert dup.value.response["Error"]["Code"] == "InvalidPlacementGroup.Duplicate"
    tagged = ec2.describe_placement_groups(Filters=[{"Name": "tag:Stage", "Values": ["a"]}])["PlacementGroups"]
    assert [(g["GroupName"], g["Strategy"], g["Tags"]) for g in tagged] == [("pg1", "cluster", [{"Key": "Stage", "Value": "a"}])]
    assert len(ec2.describe_placement_groups()["PlacementGroups"]) == 2
    instance = ec2.run_instances(ImageId=IMAGE, InstanceType="m5.large", MinCount=1, MaxCount=1,
                                 Placement={"AvailabilityZone": "us-east-1a", "GroupName": "pg1"})["Instances"][0]
    with pytest.raises(ClientError) as in_use:
        ec2.delete_placement_group(GroupName="pg1")
    assert in_use.value.response["Error"]["Code"] == "InvalidPlacementGroup.InUse"
    ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
    ec2.delete_placement_group(GroupName="pg1")
    with pytest.raises(ClientError) as unknown:
        ec2.describe_placement_groups(GroupNames=["pg1"])
    assert unknown.value.response["Error"]["Code"] == "InvalidPlacementGroup.Unknown"
