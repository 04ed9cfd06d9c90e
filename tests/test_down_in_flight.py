"""`spz down` finds launches still in flight from the log itself (issue 11 §1): a ledger that is
busy or behind must not hide a cluster that is about to come up."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from nats_fixtures import connect_bus
from provisioner_fixtures import candidate, place, submit

from skypurza.cli.cmd_lifecycle import _in_flight_from_log, _launching_clusters
from skypurza.events.models import ClusterProvisioned, ClusterTerminated, NodeInfo, ProvisionFailed


def test_submissions_without_an_outcome_are_in_flight(nats_server) -> None:
    async def main() -> None:
        bus = await connect_bus(nats_server)
        try:
            await submit(bus, "t-wait", "waiting", num_nodes=1)  # not even placed yet
            placed = await place(bus, "t-wait", "waiting", candidate(num_nodes=1))
            await submit(bus, "t-fail", "failed", num_nodes=1)
            pc = await place(bus, "t-fail", "failed", candidate(num_nodes=1))
            await bus.publish(ProvisionFailed(task_id="t-fail", cluster="failed", placement_id=pc.id,
                                              candidate=candidate(num_nodes=1), error_class="auth", code="x"))
            await submit(bus, "t-up", "up", num_nodes=1)
            pu = await place(bus, "t-up", "up", candidate(num_nodes=1))
            await bus.publish(ClusterProvisioned(cluster="up", task_id="t-up", placement_id=pu.id,
                                                 candidate=candidate(num_nodes=1),
                                                 nodes=[NodeInfo(rank=0, instance_id="i-1")], hourly_price_micros=1,
                                                 launched_at=datetime.now(UTC)))
            await submit(bus, "t-old", "ended", num_nodes=1)
            po = await place(bus, "t-old", "ended", candidate(num_nodes=1))
            await bus.publish(ClusterProvisioned(cluster="ended", task_id="t-old", placement_id=po.id,
                                                 candidate=candidate(num_nodes=1),
                                                 nodes=[NodeInfo(rank=0, instance_id="i-2")], hourly_price_micros=1,
                                                 launched_at=datetime.now(UTC)))
            await bus.publish(ClusterTerminated(cluster="ended", terminated_at=datetime.now(UTC), reason="user"))
            assert set(await _in_flight_from_log(bus)) == {"waiting"}
            # No ledger runs here: the log alone finds the launch in flight.
            found = await _launching_clusters(bus)
            assert [(c.name, c.status) for c in found] == [("waiting", "INIT")]
            assert placed.id
        finally:
            await bus.close()

    asyncio.run(main())
