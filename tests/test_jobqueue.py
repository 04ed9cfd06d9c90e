"""Job ids allocated by the log: concurrent writers never share an id; a repeated id is idempotent."""

from __future__ import annotations

import asyncio

from nats_fixtures import connect_bus

from skypurza.events.jobqueue import queue_job


def test_concurrent_queueing_gives_distinct_consecutive_ids(nats_server):
    async def main():
        buses = [await connect_bus(nats_server, source=f"/w{i}") for i in range(4)]
        jobs = await asyncio.gather(*[
            queue_job(buses[i % 4], cluster="c1", task_id=f"t{i}", task={"run": "true"}) for i in range(20)])
        assert sorted(j.job_id for j, _ in jobs) == list(range(1, 21))
        other, _ = await queue_job(buses[0], cluster="c2", task_id="x", task={})
        assert other.job_id == 1
        first, env = await queue_job(buses[0], cluster="c3", id="fixed-id", task_id="a", task={})
        await queue_job(buses[0], cluster="c3", task_id="b", task={})
        again, env2 = await queue_job(buses[1], cluster="c3", id="fixed-id", task_id="a", task={})
        assert (again.job_id, env2.id) == (first.job_id, env.id) == (1, "fixed-id")
        for b in buses:
            await b.close()

    asyncio.run(main())
