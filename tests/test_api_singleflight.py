"""SingleFlight (services/api/singleflight.py): concurrent identical reads share one query, and
nothing outlives it: the next read after an answer asks again; a failure reaches every waiter;
a waiter that leaves does not cancel the query the others wait for."""

from __future__ import annotations

import asyncio

import pytest

from skypurza.services.api.singleflight import SingleFlight


def test_concurrent_reads_share_one_query_and_nothing_outlives_it() -> None:
    async def main() -> None:
        sf, calls = SingleFlight(), []
        gate = asyncio.Event()

        async def query() -> list[int]:
            calls.append(1)
            await gate.wait()
            return [len(calls)]

        waiters = [asyncio.create_task(sf.run("k", query)) for _ in range(50)]
        other = asyncio.create_task(sf.run("other", query))
        await asyncio.sleep(0.01)
        assert len(calls) == 2 and len(sf) == 2  # one per key
        waiters[0].cancel()  # a client gone: the others still get the answer
        gate.set()
        answers = await asyncio.gather(*waiters[1:], other)
        assert all(a == answers[0] for a in answers[:-1]) and len(sf) == 0
        assert await sf.run("k", query) == [3]  # a read after the answer asks again

        async def broken() -> None:
            await asyncio.sleep(0.01)
            raise TimeoutError("status service did not answer")

        results = await asyncio.gather(*(sf.run("b", broken) for _ in range(5)), return_exceptions=True)
        assert all(isinstance(r, TimeoutError) for r in results) and len(sf) == 0
        with pytest.raises(TimeoutError):
            await sf.run("b", broken)

    asyncio.run(main())


def test_encoded_rows_answer_what_the_json_of_the_shown_rows_is() -> None:
    import json
    from datetime import datetime, timezone

    from skypurza.services.api.singleflight import EncodedRows

    rows = [{"name": "a", "at": datetime(2026, 1, 1, tzinfo=timezone.utc), "n": None}, {"name": "b.é", "jobs": [1]}]
    listing = EncodedRows(rows)
    for shown, extra in (([rows[1]], {"all_users": True}), (rows, {"all_users": False}), ([], {})):
        res = listing.response(shown, extra)
        assert res.media_type == "application/json"
        assert json.loads(res.body) == json.loads(json.dumps({"clusters": shown, **extra}, default=str).replace(
            "2026-01-01 00:00:00+00:00", "2026-01-01T00:00:00+00:00"))
