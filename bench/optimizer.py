"""Optimizer benchmark: in-process placement time, and placements through the real bus.

Prints:
- in-process placement per task over the whole shipped catalog (p50, p99; target p50 < 1 ms),
  by running bench/placement_inproc.py's task set;
- the time for N TaskSubmitted (published at once) to become N PlacementChosen through a real
  nats-server and the optimizer service (target: 1,000 in under 1 s on a 2-core machine).

    python bench/optimizer.py [--tasks 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.models import TaskSubmitted
from skypurza.events.natsserver import NatsServer, free_port
from skypurza.events.service import ServiceRunner
from skypurza.services.optimizer.service import OptimizerService

TASKS = [
    {"resources": {"accelerators": "A100:8", "use_spot": True}, "run": "python train.py"},
    {"resources": {"accelerators": "L4:1"}, "run": "python serve.py"},
    {"resources": {"cpus": "8+", "memory": "32+"}, "run": "make"},
    {"resources": {"any_of": [{"accelerators": "A10G:1", "use_spot": True}, {"accelerators": "A10G:1"}]},
     "run": "python eval.py"},
    {"resources": {"accelerators": ["H100:8", "A100-80GB:8"]}, "run": "torchrun train.py"},
]


def distinct_task(i: int) -> dict:
    """A resource spec no other task of the run has (defeats the optimizer's plan cache)."""
    return {"resources": {"cpus": f"{2 + i % 60}+", "memory": f"{4 + i // 60}+",
                          "use_spot": bool(i % 2)}, "run": "true"}


async def through_bus(n: int, distinct: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        server = NatsServer(Path(d) / "js", free_port()).start()
        try:
            bus = await Bus.connect(server.url, "bench", source="/bench")
            runner = ServiceRunner(bus, OptimizerService(enabled=frozenset({"aws"})), batch=500)
            task = asyncio.create_task(runner.run())
            await asyncio.sleep(0.5)  # consumer created
            events = [TaskSubmitted(task_id=f"t{i}", cluster=f"c{i}",
                                    task=distinct_task(i) if distinct else TASKS[i % len(TASKS)]) for i in range(n)]
            t0 = time.perf_counter()
            await bus.publish_many(events)
            t_pub = time.perf_counter() - t0
            # Done when the optimizer has every placement stored (acked by the server).
            while runner.stats.published < n:
                await asyncio.sleep(0.005)
            total = time.perf_counter() - t0
            chosen = [s async for s in bus.replay(filter_subject=naming.event_filter("bench", "task",
                                                                                     "placement_chosen"))]
            assert len(chosen) == n, f"{len(chosen)} placements stored, expected {n}"
            runner.stop()
            await task
            await bus.close()
            return total, t_pub
        finally:
            server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    inproc = subprocess.run([sys.executable, str(Path(__file__).parent / "placement_inproc.py"),
                             "--rounds", str(a.rounds)], capture_output=True, text=True, check=True)
    print(inproc.stdout.rstrip())
    for distinct, label in ((False, f"{len(TASKS)} resource specs"), (True, "every spec distinct")):
        total, pub = asyncio.run(through_bus(a.tasks, distinct))
        print(f"through the bus ({label}): {a.tasks} TaskSubmitted -> {a.tasks} PlacementChosen in {total:.3f} s "
              f"({a.tasks / total:,.0f}/s; publishing the submissions took {pub:.3f} s of it) (target < 1 s)")


if __name__ == "__main__":
    main()
