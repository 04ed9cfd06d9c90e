"""The EC2 requests of the AWS adapter, built as plain data (pure functions, no I/O)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from skypurza.events import naming

from .adapter import LaunchSpec

# Instance types that support EFA, and how many EFA interfaces (network cards) to attach for
# full bandwidth (AWS EC2 User Guide, "Supported instance types" for EFA).
EFA_INTERFACES: dict[str, int] = {
    "p5.48xlarge": 32, "p5e.48xlarge": 32, "p5en.48xlarge": 16,
    "p4d.24xlarge": 4, "p4de.24xlarge": 4, "p3dn.24xlarge": 1,
    "g6e.8xlarge": 1, "g6e.12xlarge": 1, "g6e.16xlarge": 1, "g6e.24xlarge": 2, "g6e.48xlarge": 4,
    "g6.8xlarge": 1, "g6.12xlarge": 1, "g6.16xlarge": 1, "g6.24xlarge": 1, "g6.48xlarge": 1,
    "g5.8xlarge": 1, "g5.12xlarge": 1, "g5.16xlarge": 1, "g5.24xlarge": 1, "g5.48xlarge": 1,
    "g4dn.8xlarge": 1, "g4dn.12xlarge": 1, "g4dn.16xlarge": 1, "g4dn.metal": 1,
    "c6i.32xlarge": 1, "c6i.metal": 1, "m6i.32xlarge": 1, "m6i.metal": 1,
    "r6i.32xlarge": 1, "r6i.metal": 1, "c5n.18xlarge": 1, "c5n.metal": 1,
}

# disk_tier -> root volume settings (gp3 baseline is 3000 IOPS / 125 MB/s).
DISK_TIERS: dict[str, dict[str, Any]] = {
    "low": {"VolumeType": "gp3"},
    "medium": {"VolumeType": "gp3", "Iops": 6000, "Throughput": 250},
    "high": {"VolumeType": "gp3", "Iops": 16000, "Throughput": 1000},
}


def client_token(launch_token: str) -> str:
    """EC2 ClientToken: at most 64 ASCII characters; longer tokens are hashed."""
    if len(launch_token) <= 64 and launch_token.isascii():
        return launch_token
    return hashlib.sha256(launch_token.encode()).hexdigest()


def run_instances_params(
    spec: LaunchSpec,
    *,
    zone: str | None,
    image_id: str,
    root_device: str,
    security_group_id: str,
    key_name: str | None,
    placement_group: str | None,
    subnet_id: str | None,
) -> dict[str, Any]:
    """The RunInstances request for one gang (pure, so its shape is easy to check)."""
    common = {**spec.labels, **naming.base_tags(spec.stage), naming.TAG_CLUSTER: spec.cluster,
              naming.TAG_LAUNCH_TOKEN: spec.launch_token}
    if spec.job_id is not None:
        common[naming.TAG_JOB] = str(spec.job_id)
    params: dict[str, Any] = {
        "ImageId": image_id,
        "InstanceType": spec.instance_type,
        "MinCount": spec.num_nodes,
        "MaxCount": spec.num_nodes,
        "ClientToken": client_token(spec.launch_token),
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": aws_tags(common)},
            {"ResourceType": "volume", "Tags": aws_tags(common)},
        ],
        # IMDSv2 only; hop limit 2 so containers on the node can reach it.
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 2},
    }
    if key_name:
        params["KeyName"] = key_name
    if spec.user_data:
        params["UserData"] = spec.user_data
    placement: dict[str, Any] = {}
    if zone:
        placement["AvailabilityZone"] = zone
    if placement_group:
        placement["GroupName"] = placement_group
    if placement:
        params["Placement"] = placement
    if spec.reservation_id and spec.reservation_kind in ("aws", "aws_capacity_block"):
        # Only this reservation: a full one fails the launch (a capacity error) rather than
        # spilling into on-demand capacity charged as if it were reserved.
        params["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": spec.reservation_id}}
        if spec.reservation_kind == "aws_capacity_block":
            params["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    elif spec.use_spot:
        params["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    if spec.disk_size_gb or spec.disk_tier:
        ebs: dict[str, Any] = {"DeleteOnTermination": True, **disk_tier_settings(spec.disk_tier, spec.disk_size_gb)}
        if spec.disk_size_gb:
            ebs["VolumeSize"] = spec.disk_size_gb
        params["BlockDeviceMappings"] = [{"DeviceName": root_device, "Ebs": ebs}]
    efa = EFA_INTERFACES.get(spec.instance_type, 0) if spec.network_tier == "best" else 0
    if efa:
        # EFA needs explicit interfaces (one per network card); the security group moves onto
        # them. AWS assigns no public IP to an instance with more than one interface.
        params["NetworkInterfaces"] = [
            {
                "DeviceIndex": 0 if card == 0 else 1,
                "NetworkCardIndex": card,
                "InterfaceType": "efa",
                "Groups": [security_group_id],
                "DeleteOnTermination": True,
                **({"SubnetId": subnet_id} if subnet_id else {}),
                **({"AssociatePublicIpAddress": True} if efa == 1 else {}),
            }
            for card in range(efa)
        ]
    else:
        params["SecurityGroupIds"] = [security_group_id]
        if subnet_id:
            params["SubnetId"] = subnet_id
    return params


def disk_tier_settings(tier: str | None, size_gb: int | None) -> dict[str, Any]:
    if tier in (None, "low", "medium", "high"):
        return dict(DISK_TIERS.get(tier or "low", {}))
    if tier in ("ultra", "best"):
        return {"VolumeType": "io2", "Iops": min(64000, 500 * (size_gb or 100))}
    raise ValueError(f"unknown disk_tier {tier!r}")


def port_permissions(ports: Iterable[str]) -> list[dict[str, Any]]:
    out = []
    for port in ports:
        low, _, high = str(port).partition("-")
        first, last = int(low), int(high or low)
        if not (0 < first <= last <= 65535):
            raise ValueError(f"invalid port range {port!r}")
        out.append({"IpProtocol": "tcp", "FromPort": first, "ToPort": last,
                    "IpRanges": [{"CidrIp": "0.0.0.0/0"}]})
    return out


def aws_tags(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": str(v)} for k, v in tags.items()]


def tag_filters(tags: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()]
