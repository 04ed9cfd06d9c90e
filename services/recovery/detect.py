"""Telling a lost node from a live one: pure readings of EC2 descriptions and heartbeat ages.

EC2 (DescribeInstances): a spot instance that AWS reclaims goes `shutting-down` -> `terminated`
(or `stopped` with the stop interruption behaviour) with StateReason code
`Server.SpotInstanceTermination` (or `Server.SpotInstanceShutdown`). Any other way out of
`running` for a node of a live managed cluster is a lost node. DescribeInstanceStatus adds
scheduled events (retirement, maintenance) and impaired status checks, kept as evidence.

Heartbeats: an agent beats every few seconds on core NATS. A node is lost when it has beaten
at least once (so slow boots are never mistaken for deaths) and then stayed silent longer
than the timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

SPOT_REASON_PREFIX = "Server.SpotInstance"
ALIVE = frozenset({"pending", "running"})


@dataclass(frozen=True)
class Finding:
    kind: str  # "preempted" | "node_lost"
    instance_id: str
    evidence: dict[str, Any] = field(default_factory=dict)


def classify_instance(instance: Mapping[str, Any], status: Mapping[str, Any] | None = None) -> Finding | None:
    """A finding for one DescribeInstances entry (and its DescribeInstanceStatus entry), or None
    while the node is alive."""
    state = str((instance.get("State") or {}).get("Name") or "")
    if state in ALIVE:
        return None
    reason = instance.get("StateReason") or {}
    code = str(reason.get("Code") or "")
    evidence: dict[str, Any] = {
        "source": "ec2:DescribeInstances",
        "state": state,
        "state_reason_code": code or None,
        "state_reason_message": reason.get("Message"),
        "state_transition_reason": instance.get("StateTransitionReason") or None,
        "instance_lifecycle": instance.get("InstanceLifecycle") or "on-demand",
        "zone": (instance.get("Placement") or {}).get("AvailabilityZone"),
        "instance_type": instance.get("InstanceType"),
    }
    if status:
        evidence["status"] = status_evidence(status)
    kind = "preempted" if code.startswith(SPOT_REASON_PREFIX) else "node_lost"
    return Finding(kind, str(instance.get("InstanceId")), evidence)


def status_evidence(status: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a DescribeInstanceStatus entry worth keeping: status checks, events."""
    return {
        "instance_status": (status.get("InstanceStatus") or {}).get("Status"),
        "system_status": (status.get("SystemStatus") or {}).get("Status"),
        "events": [{"code": e.get("Code"), "description": e.get("Description"),
                    "not_before": str(e.get("NotBefore")) if e.get("NotBefore") else None}
                   for e in status.get("Events") or []],
    }


def missing_finding(instance_id: str, polls: int) -> Finding:
    return Finding("node_lost", instance_id, {"source": "ec2:DescribeInstances", "state": "missing",
                                              "missing_polls": polls})


@dataclass(frozen=True)
class Silence:
    cluster: str
    rank: int
    instance_id: str | None
    seconds: float


def silent_nodes(last_beat: Mapping[tuple[str, int], float], watched: Iterable[tuple[str, int, str | None]],
                 now: float, timeout: float) -> list[Silence]:
    """Nodes of `watched` (cluster, rank, instance id) whose last beat (monotonic seconds) is
    older than `timeout`. Nodes never heard from are not judged."""
    out = []
    for cluster, rank, instance_id in watched:
        seen = last_beat.get((cluster, rank))
        if seen is not None and now - seen > timeout:
            out.append(Silence(cluster, rank, instance_id, now - seen))
    return out


def parse_heartbeat_subject(subject: str, prefix: str) -> tuple[str, int] | None:
    """(cluster, rank) from `<prefix>.hb.<cluster token>.<rank>` (tokens escape as %XX)."""
    head = f"{prefix}.hb."
    if not subject.startswith(head):
        return None
    token, _, rank = subject[len(head):].rpartition(".")
    if not token or not rank.isdigit():
        return None
    return unescape_token(token), int(rank)


def unescape_token(token: str) -> str:
    out, i = [], 0
    while i < len(token):
        if token[i] == "%" and _is_hex(token[i + 1:i + 3]):
            out.append(chr(int(token[i + 1:i + 3], 16)))
            i += 3
        else:
            out.append(token[i])
            i += 1
    return "".join(out)


def _is_hex(text: str) -> bool:
    return len(text) == 2 and all(c in "0123456789abcdefABCDEF" for c in text)
