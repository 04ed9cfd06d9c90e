"""A per-cluster verb reads as much of the log for a month-old cluster as for a new one (issue 21).

`exec`, `logs`, `logs --status`, `cancel`, `down`, `launch` on an existing cluster all read the
cluster's own events (cli/clusterlog.py `read_cluster`); its subject also holds a UsageRecorded
per node per metering tick. The read asks the server for the cluster's state events only, so
the messages it reads (counted here, not timed) stay the same however many ticks pile up.
Real parts: a nats-server, our bus, the log."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, AsyncIterator

from skypurza.cli.clusterlog import read_cluster
from skypurza.events.bus import Bus
from skypurza.events.envelope import utcnow
from skypurza.events.models import (
    Candidate,
    ClusterProvisioned,
    JobQueued,
    JobStarted,
    JobSucceeded,
    NodeInfo,
    NodeReady,
    UsageRecorded,
)


class CountingBus(Bus):
    """Our bus, counting the messages its replays hand out."""

    read = 0

    async def replay_raw(self, **kwargs: Any) -> AsyncIterator[Any]:
        async for msg in super().replay_raw(**kwargs):
            self.read += 1
            yield msg


def _history(cluster: str) -> list[Any]:
    t = utcnow() - timedelta(days=30)
    return [ClusterProvisioned(cluster=cluster, task_id="t", placement_id="p",
                               candidate=Candidate(infra="aws", region="us-east-1", zone="us-east-1a",
                                                   instance_type="m6i.large", hourly_price_micros=96_000, num_nodes=1),
                               nodes=[NodeInfo(rank=0, instance_id="i-1")], hourly_price_micros=96_000,
                               launched_at=t, user="ana"),
            NodeReady(cluster=cluster, rank=0),
            JobQueued(cluster=cluster, job_id=1, task_id="t", task={"run": "echo hi"}),
            JobStarted(cluster=cluster, job_id=1, started_at=t),
            JobSucceeded(cluster=cluster, job_id=1, ended_at=t)]


def _ticks(cluster: str, n: int) -> list[Any]:
    t = utcnow() - timedelta(days=30)
    return [UsageRecorded(cluster=cluster, rank=0, instance_id="i-1", start=t + timedelta(minutes=i),
                          end=t + timedelta(minutes=i + 1), instance_type="m6i.large", hourly_price_micros=96_000,
                          cost_micros=1_600, user="ana") for i in range(n)]


def test_reading_a_cluster_does_not_grow_with_its_usage_ticks(nats_server) -> None:
    async def main() -> None:
        bus = await CountingBus.connect(nats_server.url, "reads", source="/tests")
        try:
            await bus.publish_many(_history("young"))
            await bus.publish_many(_history("old") + _ticks("old", 3000))
            await bus.publish(NodeReady(cluster="old", rank=0))  # a state event after the ticks
            bus.read = 0
            young = await read_cluster(bus, "young")
            young_read, bus.read = bus.read, 0
            old = await read_cluster(bus, "old")
            old_read = bus.read
            assert young.status == old.status == "UP"
            assert [(j.job_id, j.status) for j in old.jobs.values()] == [(1, "SUCCEEDED")]
            assert old.last_seq == await bus.last_seq()  # the state event after the ticks was read
            assert young_read == 5 and old_read == 6, (young_read, old_read)  # not 3,006
        finally:
            await bus.close()

    asyncio.run(main())
