"""Asking EC2 about the nodes of managed clusters (DescribeInstances, DescribeInstanceStatus).

The recovery service calls `look(targets)` every poll with the nodes it expects alive, grouped
by region; what comes back are findings (detect.py) for nodes that are not. One
DescribeInstances per region per poll (filtered by instance id, which tolerates EC2's
eventual consistency), and a DescribeInstanceStatus only for the nodes found lost, to keep
their status checks and scheduled events as evidence.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Iterable

from . import detect

log = logging.getLogger("skypurza.recovery.ec2")

_FILTER_LIMIT = 199


@dataclass(frozen=True)
class Target:
    cluster: str
    rank: int
    instance_id: str
    region: str


class Ec2Watch:
    def __init__(self, *, session: Any = None, endpoint_url: str | None = None, missing_polls: int = 2):
        self._session = session
        self._endpoint_url = endpoint_url
        self._missing_polls = missing_polls
        self._stack = AsyncExitStack()
        self._clients: dict[str, Any] = {}
        self._missing: dict[str, int] = defaultdict(int)

    async def _client(self, region: str) -> Any:
        client = self._clients.get(region)
        if client is None:
            if self._session is None:
                import aioboto3

                self._session = aioboto3.Session()
            kwargs: dict[str, Any] = {"region_name": region}
            if self._endpoint_url:
                kwargs["endpoint_url"] = self._endpoint_url
            client = await self._stack.enter_async_context(self._session.client("ec2", **kwargs))
            self._clients[region] = client
        return client

    async def close(self) -> None:
        self._clients.clear()
        await self._stack.aclose()

    async def look(self, targets: Iterable[Target]) -> list[tuple[Target, detect.Finding]]:
        by_region: dict[str, list[Target]] = defaultdict(list)
        for t in targets:
            by_region[t.region].append(t)
        found: list[tuple[Target, detect.Finding]] = []
        for region, group in by_region.items():
            try:
                found += await self._look_region(region, group)
            except Exception as exc:  # one region's trouble must not blind the others
                log.warning("EC2 %s: cannot describe %d node(s): %s", region, len(group), exc)
        return found

    async def _look_region(self, region: str, group: list[Target]) -> list[tuple[Target, detect.Finding]]:
        client = await self._client(region)
        by_id = {t.instance_id: t for t in group}
        seen: dict[str, dict[str, Any]] = {}
        ids = list(by_id)
        for i in range(0, len(ids), _FILTER_LIMIT):
            chunk = ids[i:i + _FILTER_LIMIT]
            token = None
            while True:
                params: dict[str, Any] = {"Filters": [{"Name": "instance-id", "Values": chunk}]}
                if token:
                    params["NextToken"] = token
                page = await client.describe_instances(**params)
                for r in page.get("Reservations", []):
                    for inst in r.get("Instances", []):
                        seen[inst["InstanceId"]] = inst
                token = page.get("NextToken")
                if not token:
                    break
        out: list[tuple[Target, detect.Finding]] = []
        lost: list[str] = []
        for iid, target in by_id.items():
            inst = seen.get(iid)
            if inst is None:
                self._missing[iid] += 1
                if self._missing[iid] >= self._missing_polls:
                    out.append((target, detect.missing_finding(iid, self._missing[iid])))
                continue
            self._missing.pop(iid, None)
            finding = detect.classify_instance(inst)
            if finding is not None:
                lost.append(iid)
                out.append((target, finding))
        if lost:
            statuses = await self._statuses(client, lost)
            out = [(t, detect.Finding(f.kind, f.instance_id, {**f.evidence, "status": detect.status_evidence(
                statuses[t.instance_id])}) if t.instance_id in statuses else f) for t, f in out]
        return out

    async def _statuses(self, client: Any, ids: list[str]) -> dict[str, dict[str, Any]]:
        try:
            reply = await client.describe_instance_status(InstanceIds=ids, IncludeAllInstances=True)
        except Exception as exc:  # evidence only: never fail a detection for it
            log.debug("DescribeInstanceStatus failed: %s", exc)
            return {}
        return {s["InstanceId"]: s for s in reply.get("InstanceStatuses", [])}
