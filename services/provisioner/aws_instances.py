"""Reading EC2 instances (DescribeInstances output) into the adapter's terms (pure functions)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from skypurza.events import naming

from . import aws_errors
from .adapter import Failure, FailureKind, FailureScope, NodeInfo, NodeState

STATES: dict[str, NodeState] = {
    "pending": NodeState.PENDING,
    "running": NodeState.RUNNING,
    "stopping": NodeState.STOPPING,
    "stopped": NodeState.STOPPED,
    "shutting-down": NodeState.TERMINATING,
    "terminated": NodeState.TERMINATED,
}


def tag_value(instance: Mapping[str, Any] | None, key: str) -> str | None:
    for tag in (instance or {}).get("Tags", []) or []:
        if tag.get("Key") == key:
            return str(tag.get("Value"))
    return None


def by_id(instances: Iterable[Mapping[str, Any]], iid: str) -> Mapping[str, Any] | None:
    return next((i for i in instances if i["InstanceId"] == iid), None)


def assign_ranks(instances: Iterable[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """Ranks 0..N-1: an existing rank tag first, else EC2's launch index, else the id."""
    def key(i: Mapping[str, Any]) -> tuple[int, int, str]:
        tagged = tag_value(i, naming.TAG_RANK)
        return (int(tagged) if tagged and tagged.isdigit() else 1 << 30, int(i.get("AmiLaunchIndex", 0)), i["InstanceId"])

    return [(i["InstanceId"], rank) for rank, i in enumerate(sorted(instances, key=key))]


def node_info(instance: Mapping[str, Any], region: str, rank: int | None = None) -> NodeInfo:
    tagged = tag_value(instance, naming.TAG_RANK)
    reason = instance.get("StateReason") or {}
    return NodeInfo(
        instance_id=instance["InstanceId"],
        rank=rank if rank is not None else (int(tagged) if tagged and tagged.isdigit() else None),
        state=STATES.get(instance.get("State", {}).get("Name", ""), NodeState.UNKNOWN),
        region=region,
        zone=instance.get("Placement", {}).get("AvailabilityZone"),
        instance_type=instance.get("InstanceType"),
        use_spot=instance.get("InstanceLifecycle") == "spot",
        private_ip=instance.get("PrivateIpAddress"),
        public_ip=instance.get("PublicIpAddress"),
        stage=tag_value(instance, naming.TAG_STAGE),
        cluster=tag_value(instance, naming.TAG_CLUSTER),
        job_id=tag_value(instance, naming.TAG_JOB),
        launch_token=tag_value(instance, naming.TAG_LAUNCH_TOKEN),
        state_reason_code=reason.get("Code") or None,
        state_reason_message=reason.get("Message") or None,
        launched_at=instance.get("LaunchTime"),
    )


def death_failure(dead: Iterable[Mapping[str, Any]], use_spot: bool) -> Failure | None:
    """Why nodes died by themselves, from the first state reason that says so."""
    for instance in dead:
        reason = instance.get("StateReason") or {}
        failure = aws_errors.classify_state_reason(reason.get("Code"), reason.get("Message", ""), use_spot=use_spot)
        if failure is not None:
            return failure
    return None


def encode_failure(failure: Failure) -> str:
    return f"{failure.kind}|{failure.scope}|{failure.code}|{failure.message}"[:256]


def stored_failure(instance: Mapping[str, Any]) -> Failure | None:
    value = tag_value(instance, naming.TAG_LAUNCH_FAILURE)
    if not value:
        return None
    parts = value.split("|", 3)
    if len(parts) != 4:
        return Failure(FailureKind.UNKNOWN, FailureScope.REQUEST, "LaunchFailed", value)
    kind, scope, code, message = parts
    try:
        return Failure(FailureKind(kind), FailureScope(scope), code, message)
    except ValueError:
        return Failure(FailureKind.UNKNOWN, FailureScope.REQUEST, code, message)
