"""The answers kept for `GET /api/v1/clusters` (services/api/listing.py) and by the status service
(services/status/answers.py), against a real nats-server, the status service and the API server
as real processes (and the status service in this process, to count its reads).

What is checked: a cluster launched after an answer was kept is in the next GET (no read staler
than the log); a member never gets another member's kept view, and an admin's all-users view is
not a member's; If-None-Match gives 304 exactly when the body would be byte for byte the same
(an event that changes someone else's view still gives 304, one that changes yours never does);
the status service reads once per projection position, answers a new position anew, answers a
query while another waits for its min_seq, and with `strict` refuses rather than answer older
than min_seq. A client that accepts gzip gets the kept body compressed, which decodes to the very
bytes another client gets uncompressed, with a weak ETag either form of which gives a 304; a
client that refuses gzip (q=0) never gets it. Requests arriving together share one read of the
log's position (services/api/logposition.py), and each gets a position read after it asked."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest
from api_harness import Api
from ledger_history import cand
from nats_fixtures import connect_bus

from skypurza.events import status_queries as sq
from skypurza.events.cluster_events import ClusterProvisioned
from skypurza.events.types import NodeInfo
from skypurza.services.api.directory_io import add_team, add_user
from skypurza.services.api.listing import (GZIP_MIN_BYTES, GZIP_OFF_LOOP_BYTES, Listing, accepts_gzip, etag_of,
                                           make_listing)
from skypurza.services.api.logposition import SharedReads
from skypurza.services.status.answers import AnswerCache, answer_key
from skypurza.services.status.service import StatusService

STAGE = "test"


def _provisioned(cluster: str, user: str, team: str = "ml") -> ClusterProvisioned:
    return ClusterProvisioned(cluster=cluster, task_id=f"t-{cluster}", placement_id=f"p-{cluster}", candidate=cand(),
                              nodes=[NodeInfo(rank=0, instance_id=f"i-{cluster}", private_ip="10.0.0.1")],
                              hourly_price_micros=1_000_000, launched_at=datetime.now(timezone.utc), user=user,
                              team=team)


def _publish(server, *events) -> int:
    async def main() -> int:
        bus = await connect_bus(server)
        try:
            for e in events:
                await bus.publish(e)
            return await bus.last_seq()
        finally:
            await bus.close()

    return asyncio.run(main())


def _tokens(server) -> dict[str, str]:
    async def main() -> dict[str, str]:
        bus = await connect_bus(server)
        try:
            await add_team(bus, "ml", [], {})
            return {name: (await add_user(bus, name, "ml", role)).token
                    for name, role in (("alice", "member"), ("bob", "member"), ("root", "admin"))}
        finally:
            await bus.close()

    return asyncio.run(main())


@pytest.fixture
def plane(nats_server, tmp_path):
    status = subprocess.Popen([sys.executable, "-m", "skypurza.services.status.service", "--nats", nats_server.url,
                               "--stage", STAGE, "--db", str(tmp_path / "status.duckdb")],
                              stdout=subprocess.DEVNULL, stderr=(tmp_path / "status.log").open("wb"),
                              env={**os.environ, "SKYPURZA_NO_PLUGINS": "1"})
    api = Api(nats_server, tmp_path)

    async def answering() -> None:  # the status service subscribed (else the first GET is a fair 503)
        bus = await connect_bus(nats_server)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    await sq.position(bus, timeout=1)
                    return
                except Exception:
                    assert time.monotonic() < deadline and status.poll() is None, "the status service did not start"
                    await asyncio.sleep(0.1)
        finally:
            await bus.close()

    try:
        asyncio.run(answering())
        yield api
    finally:
        api.close()
        status.terminate()
        try:
            status.wait(10)
        except subprocess.TimeoutExpired:
            status.kill()


def test_a_kept_listing_is_never_staler_than_the_log_nor_anyone_elses(nats_server, plane):
    tok = _tokens(nats_server)
    _publish(nats_server, _provisioned("ca", "alice"), _provisioned("cb", "bob"))
    api = plane

    def get(who: str, etag: str | None = None, **params: str):
        headers = {**api.as_(tok[who]), **({"If-None-Match": etag} if etag else {})}
        return api.http.get("/api/v1/clusters", headers=headers, params=params)

    def names(res) -> set[str]:
        assert res.status_code == 200, res.text
        return {c["name"] for c in res.json()["clusters"]}

    first = get("alice")
    assert names(first) == {"ca"}
    e1 = first.headers["etag"]
    assert e1 == etag_of(first.content) and "no-cache" in first.headers["cache-control"]
    # Nothing changed: 304, no body; asked again without the tag, the same bytes.
    again = get("alice", e1)
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == e1
    assert get("alice").content == first.content

    # Bob at the same position: his own view, never alice's kept one, even when he sends her tag.
    bob = get("bob", e1)
    assert names(bob) == {"cb"} and bob.headers["etag"] != e1
    assert names(get("alice", all_users="true")) == {"ca", "cb"}
    assert names(get("root")) == {"ca", "cb"}  # an admin's every row
    assert names(get("alice")) == {"ca"}  # still her own after the all-users views were kept

    # A cluster launched after the kept answer is in the next GET, and the old tag is no longer a 304.
    _publish(nats_server, _provisioned("ca2", "alice"))
    after = get("alice", e1)
    assert after.status_code == 200 and names(after) == {"ca", "ca2"}
    e2 = after.headers["etag"]
    assert e2 != e1
    # The log moved, but not alice's view (bob's new cluster): her tag is still a 304; bob's is not.
    e_bob = get("bob").headers["etag"]
    _publish(nats_server, _provisioned("cb2", "bob"))
    assert get("alice", e2).status_code == 304
    assert names(get("bob", e_bob)) == {"cb", "cb2"}
    assert names(get("alice", e2, all_users="true")) == {"ca", "ca2", "cb", "cb2"}  # a different body: 200


def test_a_gzip_answer_is_the_same_json_and_only_for_a_client_that_asks(nats_server, plane):
    tok = _tokens(nats_server)
    _publish(nats_server, *(_provisioned(f"g{i}", "alice") for i in range(4)))
    api = plane

    def raw(accept: str, etag: str | None = None) -> tuple[int, dict[str, str], bytes]:
        headers = {**api.as_(tok["root"]), "Accept-Encoding": accept, **({"If-None-Match": etag} if etag else {})}
        with api.http.stream("GET", "/api/v1/clusters", params={"all_users": "true"}, headers=headers) as res:
            return res.status_code, dict(res.headers), b"".join(res.iter_raw())  # the bytes as sent

    status, plain_headers, plain = raw("identity")
    assert status == 200 and "content-encoding" not in plain_headers
    assert {c["name"] for c in json.loads(plain)["clusters"]} == {f"g{i}" for i in range(4)}
    status, headers, packed = raw("br;q=1.0, gzip;q=0.8")
    assert status == 200 and headers["content-encoding"] == "gzip" and "Accept-Encoding" in headers["vary"]
    assert len(packed) * 3 < len(plain) and gzip.decompress(packed) == plain  # the same bytes, decoded
    assert headers["etag"] == "W/" + plain_headers["etag"] and plain_headers["etag"] == etag_of(plain)
    assert raw("gzip", etag=raw("gzip")[1]["etag"])[1]["etag"] == headers["etag"]  # the same kept bytes again
    for tag in (headers["etag"], plain_headers["etag"]):  # either form of the tag: nothing changed
        assert raw("gzip", tag)[0] == 304 and raw("identity", tag)[0] == 304
    for refused in ("gzip;q=0", "deflate", "*;q=0", ""):
        status, h, body = raw(refused)
        assert status == 200 and "content-encoding" not in h and body == plain, refused
    assert raw("*")[1].get("content-encoding") == "gzip"

    # A cluster launched after: the next compressed answer has it, and the old tags are no 304.
    _publish(nats_server, _provisioned("g-new", "bob"))
    status, h, newer = raw("gzip", headers["etag"])
    assert status == 200 and "g-new" in {c["name"] for c in json.loads(gzip.decompress(newer))["clusters"]}
    assert raw("identity", plain_headers["etag"])[0] == 200
    # What httpx does by itself (it asks for gzip and decodes): the same JSON as uncompressed.
    assert api.http.get("/api/v1/clusters", params={"all_users": "true"}, headers=api.as_(tok["root"])).json() \
        == json.loads(raw("identity")[2])


def test_a_body_is_compressed_where_that_gains_and_off_the_loop_when_big() -> None:
    async def main() -> None:
        rows = b",".join(b'{"name":"c%05d","status":"UP","nodes":[]}' % i for i in range(40_000))
        big = await make_listing(3, b'{"clusters":[' + rows + b"]}")  # > GZIP_OFF_LOOP_BYTES: on a thread
        assert len(big.body) > GZIP_OFF_LOOP_BYTES and big.gzipped is not None
        assert gzip.decompress(big.gzipped) == big.body and big.etag == etag_of(big.body)
        assert big.size == len(big.body) + len(big.gzipped)
        small = await make_listing(3, b'{"clusters":[]}')
        assert small.gzipped is None and small.size == len(small.body)
        noise = await make_listing(3, os.urandom(GZIP_MIN_BYTES * 2))  # gains nothing: not kept twice
        assert noise.gzipped is None

    asyncio.run(main())


def test_accept_encoding_is_read_as_rfc_9110_says() -> None:
    assert accepts_gzip("gzip") and accepts_gzip("gzip, deflate, br") and accepts_gzip("x-gzip")
    assert accepts_gzip("br;q=1, GZIP ; q=0.5") and accepts_gzip("*") and accepts_gzip("identity, *;q=0.1")
    assert not accepts_gzip(None) and not accepts_gzip("") and not accepts_gzip("identity")
    assert not accepts_gzip("gzip;q=0") and not accepts_gzip("gzip;q=0.0, *") and not accepts_gzip("*;q=0")
    assert not accepts_gzip("gzip;q=x") and not accepts_gzip("deflate, br")
    assert not accepts_gzip("x" * 2000 + ", gzip")  # past the bound: not read


def test_requests_together_share_one_read_of_the_log_and_none_reads_before_it_asked(nats_server) -> None:
    async def main() -> None:
        bus = await connect_bus(nats_server)
        shared = SharedReads(bus.last_seq)
        try:
            # Fifty at once: two reads at most (the one they all missed the start of, and theirs).
            first = await bus.publish(_provisioned("s0", "alice"))
            seqs = await asyncio.gather(*(shared.get() for _ in range(50)))
            assert shared.reads <= 2 and all(s >= first.seq for s in seqs), (shared.reads, seqs)

            # Never staler than the caller's own read: an event acknowledged before it asked is in
            # the position it gets, while others keep reads in flight all along.
            async def churn() -> None:
                while True:
                    await shared.get()

            others = [asyncio.create_task(churn()) for _ in range(5)]
            await asyncio.sleep(0.05)
            for i in range(20):
                ack = await bus.publish(_provisioned(f"s{i + 1}", "bob"))
                assert await shared.get() >= ack.seq
            for t in others:
                t.cancel()
            await asyncio.gather(*others, return_exceptions=True)
        finally:
            await shared.close()
            await bus.close()

        # A caller who arrives while a read is in flight waits for the next one; a failed read is
        # every waiter's error, and the next caller reads again.
        gate, value, fail = asyncio.Event(), [0], [False]

        async def read() -> int:
            value[0] += 1
            n = value[0]
            await gate.wait()
            if fail[0]:
                raise ConnectionError("bus away")
            return n

        reads = SharedReads(read)
        early = asyncio.create_task(reads.get())
        await asyncio.sleep(0.01)  # its read is in flight
        late = [asyncio.create_task(reads.get()) for _ in range(3)]
        await asyncio.sleep(0.01)
        gate.set()
        assert await early == 1 and await asyncio.gather(*late) == [2, 2, 2] and reads.reads == 2
        gate.clear()
        fail[0] = True
        failing = [asyncio.create_task(reads.get()) for _ in range(3)]
        await asyncio.sleep(0.01)
        gate.set()
        assert all(isinstance(r, ConnectionError) for r in await asyncio.gather(*failing, return_exceptions=True))
        fail[0] = False
        assert await reads.get() == 4
        leaving = asyncio.create_task(reads.get())  # a caller who leaves: the read goes on for others
        gate.clear()
        staying = asyncio.create_task(reads.get())
        await asyncio.sleep(0.01)
        leaving.cancel()
        gate.set()
        assert await staying == 5
        await reads.close()

    asyncio.run(main())


def test_if_none_match_is_read_as_rfc_9110_says() -> None:
    listing = Listing(1, b"{}", etag_of(b"{}"))
    assert listing.matches(listing.etag) and listing.matches("*") and listing.matches(f'"x", W/{listing.etag}')
    assert not listing.matches(None) and not listing.matches("") and not listing.matches('"x"')
    assert not listing.matches(listing.etag.strip('"'))  # an ETag is quoted


def test_the_status_service_reads_once_per_position_and_answers_while_another_waits(nats_server, tmp_path):
    async def main() -> None:
        bus = await connect_bus(nats_server)
        first = _provisioned("c1", "alice")
        await bus.publish(first)
        svc = StatusService(tmp_path / "status.duckdb")
        await svc.start(bus)
        try:
            assert await svc.wait_caught_up()
            answers = await asyncio.gather(*(sq.status(bus) for _ in range(20)))
            assert all(a == answers[0] for a in answers) and [c["name"] for c in answers[0]] == ["c1"]
            assert svc.answers.computed == 1 and svc.answers.hits >= 1  # one read for twenty
            assert len(await sq.status(bus, all=True)) == 1 and svc.answers.computed == 2  # another query

            # The projection moves: the next answer is read anew, with the new cluster.
            ack = await bus.publish(_provisioned("c2", "bob"))
            assert {c["name"] for c in await sq.status(bus, min_seq=ack.seq)} == {"c1", "c2"}
            assert svc.answers.computed == 3 and svc.answers.position == ack.seq

            # One waiting for a position the log has not reached holds up no other.
            waiting = asyncio.create_task(sq.status(bus, min_seq=ack.seq + 100, timeout=10))
            await asyncio.sleep(0.2)
            t = time.monotonic()
            assert len(await sq.status(bus, timeout=5)) == 2
            assert time.monotonic() - t < 2 and not waiting.done()
            waiting.cancel()

            # strict: past the wait, an error rather than an answer older than min_seq.
            with pytest.raises(RuntimeError, match="not yet"):
                await bus.request("status", "status", {"min_seq": ack.seq + 100, "wait_s": 0.3, "strict": True})
        finally:
            await svc.close()
            await bus.close()

    asyncio.run(main())


def test_the_answer_cache_forgets_on_a_move_and_stays_in_its_bounds() -> None:
    async def main() -> None:
        cache, reads = AnswerCache(max_entries=3, max_bytes=100), []
        gate = asyncio.Event()

        async def read(data: bytes) -> bytes:
            reads.append(data)
            await gate.wait()
            return data

        k = answer_key("status", {"all": True, "min_seq": 5})
        assert k == answer_key("status", {"min_seq": 9, "wait_s": 1, "all": True})  # when, not what
        assert k != answer_key("status", {"all": False}) and k != answer_key("queue", {"all": True})
        many = [asyncio.create_task(cache.get(k, 7, lambda: read(b"a"))) for _ in range(10)]
        await asyncio.sleep(0.01)
        gate.set()
        assert await asyncio.gather(*many) == [b"a"] * 10 and reads == [b"a"]  # one read
        assert await cache.get(k, 7, lambda: read(b"never")) == b"a"
        assert await cache.get(k, 8, lambda: read(b"b")) == b"b" and cache.position == 8 and len(cache) == 1
        for i in range(5):  # bounded in entries
            await cache.get(answer_key("q", {"i": i}), 8, lambda: read(b"x" * 10))
        assert len(cache) == 3
        await cache.get(answer_key("q", {"big": 1}), 8, lambda: read(b"y" * 90))  # bounded in bytes
        assert len(cache) == 2 and cache._size == 100  # the oldest two gone
        await cache.get(answer_key("q", {"huge": 1}), 8, lambda: read(b"z" * 101))  # over the bound: not kept
        assert len(cache) == 2 and cache._size == 100

    asyncio.run(main())
