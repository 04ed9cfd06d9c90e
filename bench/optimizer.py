"""Optimizer benchmark: in-process placement time, and placements through the real bus.

Prints:
- in-process placement per task over the whole shipped catalog (p50, p99; target p50 < 1 ms),
  by running bench/placement_inproc.py's task set;
- the time for N TaskSubmitted (published at once) to become N PlacementChosen through a real
  nats-server and the optimizer service (target: 1,000 in under 1 s on a 2-core machine).

    python bench/optimizer.py [--tasks 1000] [--rounds 5] [--runs 1] [--baseline DIR]

Each own-process row also prints the optimizer process's CPU seconds for the N placements (from
/proc: the figure to compare on a loaded machine) and the load average. With `--baseline DIR` (a
tree whose DIR/skypurza is the old code, e.g. `git archive REV | tar -x -C DIR/skypurza`) the
every-spec-distinct own-process row runs again with that code first on the optimizer's
PYTHONPATH, alternating with the current code `--runs` times: the old code path, same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
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


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a running process (Linux /proc); None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


async def through_bus(n: int, distinct: bool, separate: bool,
                      baseline: Path | None = None) -> tuple[float, float, float | None]:
    """Submit n tasks at once; time until all n placements are stored. Returns (wall seconds,
    seconds of it submitting, the optimizer process's CPU seconds meanwhile or None).

    separate=True runs the optimizer as the control plane does, in its own process
    (`python -m skypurza.cli.serve --services optimizer`), so submitting and placing use both
    cores; separate=False runs it in the submitting process (one core for everything).
    `baseline`: a tree whose skypurza/ the optimizer process imports instead (separate only)."""
    with tempfile.TemporaryDirectory() as d:
        server = NatsServer(Path(d) / "js", free_port()).start()
        proc = None
        cpu0: float | None = None
        try:
            bus = await Bus.connect(server.url, "bench", source="/bench")
            chosen_subject = naming.event_filter("bench", "task", "placement_chosen")
            got = 0
            done = asyncio.Event()

            async def count(msg) -> None:
                nonlocal got
                got += 1
                if got >= n:
                    done.set()

            await bus.nc.subscribe(chosen_subject, cb=count)  # sees each placement as it is stored
            runner = task = None
            if separate:
                env = {**os.environ, "SKYPURZA_ENABLED_INFRAS": "aws", "PYTHONUNBUFFERED": "1"}
                if baseline is not None:
                    env["PYTHONPATH"] = str(baseline) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
                proc = subprocess.Popen([sys.executable, "-m", "skypurza.cli.serve", "--nats", server.url,
                                         "--stage", "bench", "--services", "optimizer"], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for line in proc.stdout:  # type: ignore[union-attr]
                    if "service optimizer started" in line:
                        break
                await asyncio.sleep(0.5)  # its durable consumer exists
            else:
                runner = ServiceRunner(bus, OptimizerService(enabled=frozenset({"aws"})), batch=500)
                task = asyncio.create_task(runner.run())
                await asyncio.sleep(0.5)
            events = [TaskSubmitted(task_id=f"t{i}", cluster=f"c{i}",
                                    task=distinct_task(i) if distinct else TASKS[i % len(TASKS)]) for i in range(n)]
            cpu0 = process_cpu_s(proc.pid) if proc is not None else None
            t0 = time.perf_counter()
            await bus.publish_many(events)
            t_pub = time.perf_counter() - t0
            await asyncio.wait_for(done.wait(), 120)
            # Core subscribers see a publish as it arrives; the clock stops when the log holds
            # every placement (re-checked every 20 ms).
            while True:
                info = await bus.js.stream_info(bus.events_stream, subjects_filter=chosen_subject)
                if len(info.state.subjects or {}) >= n:
                    break
                await asyncio.sleep(0.02)
            total = time.perf_counter() - t0
            cpu1 = process_cpu_s(proc.pid) if proc is not None else None
            cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
            if runner is not None:
                runner.stop()
                await task
            await bus.close()
            return total, t_pub, cpu
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(10)
            server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=1, help="own-process distinct row: runs of each code")
    ap.add_argument("--baseline", type=Path, help="a tree whose skypurza/ is the old code")
    a = ap.parse_args()
    if a.baseline is not None and not (a.baseline / "skypurza" / "services" / "optimizer" / "service.py").is_file():
        ap.error(f"--baseline: {a.baseline}/skypurza/services/optimizer/service.py not found")
    inproc = subprocess.run([sys.executable, str(Path(__file__).parent / "placement_inproc.py"),
                             "--rounds", str(a.rounds)], capture_output=True, text=True, check=True)
    print(inproc.stdout.rstrip())
    for separate in (True, False):
        where = "optimizer in its own process" if separate else "optimizer in the submitting process"
        for distinct, label in ((False, f"{len(TASKS)} resource specs"), (True, "every spec distinct")):
            trees: list[tuple[str, Path | None]] = [("", None)]
            if separate and distinct:
                trees = [("", None), (" [baseline]", a.baseline)] if a.baseline is not None else trees
                trees = trees * max(1, a.runs)
            for tag, tree in trees:
                total, pub, cpu = asyncio.run(through_bus(a.tasks, distinct, separate, tree))
                used = f"; optimizer process CPU {cpu:.2f} s" if cpu is not None else ""
                print(f"through the bus, {where}, {label}{tag}: {a.tasks} TaskSubmitted -> {a.tasks} PlacementChosen "
                      f"in {total:.3f} s ({a.tasks / total:,.0f}/s; submitting took {pub:.3f} s of it{used}; "
                      f"load {os.getloadavg()[0]:.1f}) (target < 1 s)")


if __name__ == "__main__":
    main()
