"""Runs on a bus node (its own Python and nats-py, not SkyPurza): create or update what
/etc/nats/streams.json defines, so everything a service only checks on connect exists before
any service starts (infra/busconfig.py `stream_definitions`, from the definitions events/bus.py
and events/uploads.py use): the streams (a mirror's `sources` among them), the secrets
key-value bucket (`{"key_value": ...}`) and the uploads object store (`{"object_store": ...}`).

It connects as the bus's `control` user (its credentials file, which bus-auth.py writes 0600 from
the user's secret): the bus is secured and no service's user may create a stream or a bucket.
Every node runs it at boot, at once: what another node made meanwhile counts as made.

Stdlib and nats-py only: the node has no SkyPurza.

Bounded: gives up after DEADLINE_S with exit 1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import sys
import time
from typing import Any, Awaitable, Callable

import nats
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, BucketNotFoundError, NotFoundError

USAGE = "usage: python3 bus-streams.py streams.json control.json [nats URL]"
DEADLINE_S = 240
LOCAL_URL = "nats://127.0.0.1:4222"  # the node's own server
NO_PEERS = 10005  # "no suitable peers for placement": the cluster is still forming
STREAM_EXISTS = 10058  # another node made it first (with the same definition: it is made)


async def _placed(step: Callable[[], Awaitable[None]], deadline: float) -> None:
    """`step`, tried again while the cluster cannot place a replicated stream yet."""
    while True:
        try:
            await step()
            return
        except APIError as exc:
            if exc.err_code != NO_PEERS or time.monotonic() > deadline:
                raise
            await asyncio.sleep(2)


async def _stream(js: JetStreamContext, raw: dict[str, Any]) -> None:
    cfg = api.StreamConfig.from_response(dict(raw))
    try:
        await js.stream_info(cfg.name)
        await js.update_stream(cfg)  # a failover swaps sources for subjects
    except NotFoundError:
        try:
            await js.add_stream(cfg)
        except APIError as exc:
            if exc.err_code != STREAM_EXISTS:
                raise
    print(f"stream {cfg.name}: applied")


async def _key_value(js: JetStreamContext, raw: dict[str, Any]) -> None:
    # Made if missing, else left as it is (its data is the jobs' secrets), with one exception, as
    # events/bus.py `ensure_secrets_bucket` does: direct gets on, the only way a cluster's agent
    # user may read its own keys.
    cfg = api.KeyValueConfig.from_response(dict(raw))
    try:
        await js.key_value(cfg.bucket)
    except (NotFoundError, BucketNotFoundError):
        try:
            await js.create_key_value(cfg)
        except APIError as exc:
            if exc.err_code != STREAM_EXISTS:
                raise
    stream = f"KV_{cfg.bucket}"
    info = await js.stream_info(stream)
    if cfg.direct and not info.config.allow_direct:
        await js.update_stream(dataclasses.replace(info.config, allow_direct=True))
    print(f"key-value bucket {cfg.bucket}: applied")


async def _object_store(js: JetStreamContext, raw: dict[str, Any]) -> None:
    cfg = api.ObjectStoreConfig.from_response(dict(raw))
    try:
        await js.object_store(cfg.bucket)  # there: left as it is (its objects' TTL is the stream's)
    except (NotFoundError, BucketNotFoundError):
        try:
            await js.create_object_store(cfg.bucket, config=cfg)
        except APIError as exc:
            if exc.err_code != STREAM_EXISTS:
                raise
    print(f"object store {cfg.bucket}: applied")


async def _quiet(exc: Exception) -> None:
    """Connection errors are retried by `main` until the deadline, then said once. A coroutine
    function: nats-py 2.16 refuses any other callback (a lambda returning one included)."""


async def apply(defs: list[dict[str, Any]], creds: dict[str, str], deadline: float, url: str = LOCAL_URL) -> None:
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=3,
                            user=creds["user"], password=creds["password"], error_cb=_quiet)
    js = nc.jetstream(timeout=10)
    try:
        for raw in defs:
            if "key_value" in raw:
                await _placed(functools.partial(_key_value, js, raw["key_value"]), deadline)
            elif "object_store" in raw:
                await _placed(functools.partial(_object_store, js, raw["object_store"]), deadline)
            else:
                await _placed(functools.partial(_stream, js, raw), deadline)
    finally:
        await nc.close()


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(USAGE, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        defs = json.load(f)
    with open(argv[2]) as f:
        creds = json.load(f)
    url = argv[3] if len(argv) == 4 else LOCAL_URL
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            asyncio.run(apply(defs, creds, deadline, url))
            return 0
        except Exception as exc:  # the node's own server may still be starting
            if time.monotonic() > deadline:
                print(f"bus streams not applied: {exc}", file=sys.stderr)
                return 1
            time.sleep(3)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
