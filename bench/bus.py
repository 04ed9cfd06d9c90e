"""Bus benchmark: our layer (models, envelope, de-dup headers, acks) beside a bare nats-py client.

Prints, through a real nats-server started here (file storage, as the control plane runs it):
- publish throughput, sequential (each publish awaited) and pipelined (publish_async window),
  and the pipeline's client CPU time (events per CPU-second of this process: steady under load);
  the pipelined rows take events built before the clock starts, as the bare client's payload is
  (building a typed event is its caller's work; the sequential row builds each in the loop);
- consume throughput (durable pull consumer, fetch + ack; ours: decode + typed event + ack);
- publish -> consume latency, p50 and p99;
each beside the same figure for a bare nats-py client in the same run, and the ratio.

    python bench/bus.py [--events 20000] [--latency-samples 500]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nats
from nats.js import api

from skypurza.events import naming
from skypurza.events.bus import Bus, stored_from_msg
from skypurza.events.models import TaskSubmitted
from skypurza.events.natsserver import NatsServer, free_port

TASK = {"name": "bench", "resources": {"accelerators": "A100:8", "use_spot": True}, "run": "python train.py"}


def event(i: int) -> TaskSubmitted:
    return TaskSubmitted(task_id=f"t{i}", cluster=f"c{i}", task=TASK, user="bench")


async def bare_setup(url: str) -> tuple[object, object]:
    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    js = nc.jetstream()
    await js.add_stream(api.StreamConfig(name="BARE", subjects=["bare.>"], storage=api.StorageType.FILE,
                                         duplicate_window=300.0))
    return nc, js


async def bench_publish(bus: Bus, js, n: int) -> dict[str, float]:
    payload = bus.envelope(event(0)).to_json()  # the same bytes size for the bare client
    out: dict[str, float] = {}
    # Sequential, awaited.
    t = time.perf_counter()
    for i in range(n // 4):
        await js.publish(f"bare.seq.{i}", payload)
    out["bare_seq"] = (n // 4) / (time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(n // 4):
        await bus.publish(event(i))
    out["ours_seq"] = (n // 4) / (time.perf_counter() - t)
    # Pipelined.
    t = time.perf_counter()
    futs = [await js.publish_async(f"bare.pipe.{i}", payload) for i in range(n)]
    await asyncio.gather(*futs)
    out["bare_pipe"] = n / (time.perf_counter() - t)
    # The events are built before the clock starts, as the bare client's payload is: building
    # them is the caller's cost, not the bus layer's (envelope, encoding, headers, acks).
    events = [event(i) for i in range(n)]
    t = time.perf_counter()
    await bus.publish_many(events)
    out["ours_pipe"] = n / (time.perf_counter() - t)
    # The same pipeline in this process's CPU time (the server runs in its own): what our layer
    # costs beside bare nats-py, whatever the machine's load.
    c = time.process_time()
    futs = [await js.publish_async(f"bare.cpu.{i}", payload) for i in range(n)]
    await asyncio.gather(*futs)
    out["bare_pipe_cpu"] = n / (time.process_time() - c)
    events = [event(n + i) for i in range(n)]
    c = time.process_time()
    await bus.publish_many(events)
    out["ours_pipe_cpu"] = n / (time.process_time() - c)
    return out


async def bench_consume(bus: Bus, js, n: int, round_: int = 0) -> dict[str, float]:
    """Both read the same number of messages of the same size, each with its own new durable."""
    out: dict[str, float] = {}
    sub = await js.pull_subscribe("bare.pipe.>", durable=f"bare_consumer{round_}", stream="BARE",
                                  config=api.ConsumerConfig(ack_policy=api.AckPolicy.EXPLICIT))
    got = 0
    t = time.perf_counter()
    while got < n:
        msgs = await sub.fetch(batch=500, timeout=5)
        for m in msgs:
            await m.ack()
        got += len(msgs)
    out["bare_consume"] = got / (time.perf_counter() - t)

    sub2 = await bus.js.pull_subscribe(naming.all_events_subject(bus.stage), durable=f"ours_consumer{round_}",
                                       stream=bus.events_stream,
                                       config=api.ConsumerConfig(ack_policy=api.AckPolicy.EXPLICIT))
    total = n
    got = 0
    t = time.perf_counter()
    while got < total:
        msgs = await sub2.fetch(batch=500, timeout=5)
        for m in msgs:
            stored = stored_from_msg(m)  # envelope + typed, validated event
            assert stored.event is not None
            await m.ack()
        got += len(msgs)
    out["ours_consume"] = got / (time.perf_counter() - t)
    return out


async def bench_latency(bus: Bus, nc, js, samples: int) -> dict[str, float]:
    payload = bus.envelope(event(0)).to_json()

    async def measure(publish, subject: str, stream: str, decode: bool) -> list[float]:
        lat: list[float] = []
        sub = await js.pull_subscribe(subject, stream=stream,
                                      config=api.ConsumerConfig(ack_policy=api.AckPolicy.EXPLICIT,
                                                                deliver_policy=api.DeliverPolicy.NEW))
        for i in range(samples):
            t0 = time.perf_counter()
            await publish(i)
            msgs = await sub.fetch(batch=1, timeout=5)
            if decode:
                stored_from_msg(msgs[0])
            await msgs[0].ack()
            lat.append((time.perf_counter() - t0) * 1000)
        return lat

    bare = await measure(lambda i: js.publish(f"bare.lat.{i}", payload), "bare.lat.>", "BARE", False)
    ours = await measure(lambda i: bus.publish(event(i)), naming.all_events_subject(bus.stage),
                         bus.events_stream, True)
    q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1]  # noqa: E731
    return {"bare_p50": q(bare, 50), "bare_p99": q(bare, 99), "ours_p50": q(ours, 50), "ours_p99": q(ours, 99)}


async def main(n: int, samples: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        server = NatsServer(Path(d) / "js", free_port()).start()
        try:
            bus = await Bus.connect(server.url, "bench", source="/bench")
            nc, js = await bare_setup(server.url)
            pub = await bench_publish(bus, js, n)
            rounds = [await bench_consume(bus, js, n, r) for r in range(3)]
            con = {k: max(r[k] for r in rounds) for k in rounds[0]}  # best of 3 for each
            lat = await bench_latency(bus, nc, js, samples)
            await bus.close()
            await nc.close()
        finally:
            server.stop()
    rows = [
        ("publish, sequential (events/s)", pub["bare_seq"], pub["ours_seq"]),
        ("publish, pipelined (events/s)", pub["bare_pipe"], pub["ours_pipe"]),
        ("pipelined, client CPU (events/CPU-s)", pub["bare_pipe_cpu"], pub["ours_pipe_cpu"]),
        ("consume + ack (events/s)", con["bare_consume"], con["ours_consume"]),
    ]
    print(f"bus benchmark: {n} events, nats-server file storage (sync always), one Python process")
    print(f"{'figure':<36}{'bare nats-py':>14}{'skypurza':>12}{'ratio':>8}")
    for name, bare, ours in rows:
        print(f"{name:<36}{bare:>14,.0f}{ours:>12,.0f}{ours / bare:>8.0%}")
    print(f"{'publish->consume latency p50 (ms)':<36}{lat['bare_p50']:>14.2f}{lat['ours_p50']:>12.2f}")
    print(f"{'publish->consume latency p99 (ms)':<36}{lat['bare_p99']:>14.2f}{lat['ours_p99']:>12.2f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=20000)
    p.add_argument("--latency-samples", type=int, default=500)
    a = p.parse_args()
    asyncio.run(main(a.events, a.latency_samples))
    sys.exit(0)
