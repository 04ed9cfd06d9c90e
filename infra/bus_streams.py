"""Runs on a bus node (its own Python and nats-py, not SkyPurza): create or update the streams
that /etc/nats/streams.json defines, so a mirror's `sources` exist before any service starts.

Usage: python3 bus-streams.py streams.json. Bounded: gives up after DEADLINE_S with exit 1.
"""

import asyncio
import json
import sys
import time

import nats
from nats.js import api
from nats.js.errors import APIError, NotFoundError

DEADLINE_S = 240
NO_PEERS = 10005  # "no suitable peers for placement": the cluster is still forming


async def apply(defs, deadline):
    nc = await nats.connect("nats://127.0.0.1:4222", connect_timeout=5, max_reconnect_attempts=3,
                            error_cb=lambda e: asyncio.sleep(0))
    js = nc.jetstream(timeout=10)
    try:
        for raw in defs:
            cfg = api.StreamConfig.from_response(dict(raw))
            while True:
                try:
                    try:
                        await js.stream_info(cfg.name)
                        await js.update_stream(cfg)  # a failover swaps sources for subjects
                    except NotFoundError:
                        await js.add_stream(cfg)
                    print(f"stream {cfg.name}: applied")
                    break
                except APIError as exc:
                    if exc.err_code != NO_PEERS or time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(2)
    finally:
        await nc.close()


def main(argv):
    with open(argv[1]) as f:
        defs = json.load(f)
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            asyncio.run(apply(defs, deadline))
            return 0
        except Exception as exc:  # the node's own server may still be starting
            if time.monotonic() > deadline:
                print(f"bus streams not applied: {exc}", file=sys.stderr)
                return 1
            time.sleep(3)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
