"""In-process placement time per task over the whole shipped catalog (p50, p99; target p50 < 1 ms).

    python bench/placement_inproc.py [--rounds 20]

Tasks: every accelerator and count in the catalog (on-demand and spot), the default CPU
instance, CPU minimums, instance-type pins, region pins, `any_of` spot+on-demand pairs,
`ordered` lists and a failover step (place with blocks, then next_placement). Also prints
the cold-process import + load time of the catalog (what `spz launch --dryrun` pays first).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from skypurza.events.taskspec.request import ResourceRequest as R
from skypurza.services.optimizer.catalog import load_catalog
from skypurza.services.optimizer.placement import block_for_error, next_placement, place


def tasks(cat) -> list[tuple[str, list[R], int]]:  # type: ignore[no-untyped-def]
    out: list[tuple[str, list[R], int]] = []
    for acc in cat.accelerators():
        for n in sorted({t.accelerator_count for t in cat.types_with_accelerator(acc)}):
            out.append((f"{acc}:{n}", [R(accelerator=acc, accelerator_count=n)], 1))
            out.append((f"{acc}:{n} spot", [R(accelerator=acc, accelerator_count=n, use_spot=True)], 1))
            out.append((f"{acc}:{n} any_of spot|od", [R(accelerator=acc, accelerator_count=n, use_spot=True),
                                                      R(accelerator=acc, accelerator_count=n)], 2))
    out += [
        ("default cpu", [R()], 1),
        ("default cpu spot", [R(use_spot=True)], 1),
        ("cpus 4+ memory 16+", [R(cpus=4, cpus_plus=True, memory_gib=16, memory_plus=True)], 1),
        ("cpus 32+ spot", [R(cpus=32, cpus_plus=True, use_spot=True)], 4),
        ("pin p4d", [R(instance_type="p4d.24xlarge")], 1),
        ("pin p5 spot us-east-2", [R(instance_type="p5.48xlarge", use_spot=True, region="us-east-2")], 2),
        ("A100:8 in eu-north-1", [R(accelerator="A100", accelerator_count=8, region="eu-north-1")], 1),
        ("ordered H100:8, A100:8, L40S:8", [R(accelerator="H100", accelerator_count=8, order=0),
                                            R(accelerator="A100", accelerator_count=8, order=1),
                                            R(accelerator="L40S", accelerator_count=8, order=2)], 1),
        ("any_of 3 GPUs x 2 markets", [R(accelerator=a, accelerator_count=1, use_spot=s)
                                       for a in ("L4", "A10G", "T4") for s in (True, False)], 1),
        ("infeasible H200:16", [R(accelerator="H200", accelerator_count=16)], 1),
        ("image per region", [R(accelerator="H100", accelerator_count=8,
                                image_id={"us-east-1": "ami-1", "us-west-2": "ami-2"})], 1),
    ]
    return out


def cold_load_ms() -> float:
    code = ("import time; t=time.perf_counter()\n"
            "from skypurza.services.optimizer.catalog import load_catalog\n"
            "from skypurza.services.optimizer.placement import place\n"
            "load_catalog(); print((time.perf_counter()-t)*1000)")
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
            for _ in range(5)]
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    cat = load_catalog()
    ts = tasks(cat)
    samples: list[float] = []
    per_task: dict[str, list[float]] = {}
    candidates: dict[str, int] = {}
    for _ in range(a.rounds):
        for name, reqs, n in ts:
            t0 = time.perf_counter()
            plan = place(reqs, n, cat)
            dt = time.perf_counter() - t0
            samples.append(dt)
            per_task.setdefault(name, []).append(dt)
            candidates[name] = len(plan.candidates)
    # A failover step: place with two blocks, then ask for the next candidate.
    fo: list[float] = []
    base = place([R(accelerator="A10G", accelerator_count=1, use_spot=True)], 1, cat)
    blocks = [block_for_error(base.candidates[0], "capacity"), block_for_error(base.candidates[1], "quota")]
    for _ in range(a.rounds * 20):
        t0 = time.perf_counter()
        plan = place([R(accelerator="A10G", accelerator_count=1, use_spot=True)], 1, cat, blocks=blocks)
        next_placement(plan, blocks, base.candidates[1])
        fo.append(time.perf_counter() - t0)

    def q(xs: list[float], p: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000

    print(f"catalog: {len(cat.types)} instance types, {len(cat.regions)} regions, built {cat.built_at}")
    print(f"cold process import + load: {cold_load_ms():.1f} ms (median of 5)")
    print(f"placement per task, {len(ts)} tasks x {a.rounds} rounds: p50 {q(samples, .5):.3f} ms, "
          f"p99 {q(samples, .99):.3f} ms, max {max(samples) * 1000:.3f} ms  (target p50 < 1 ms)")
    print(f"failover step (place with 2 blocks + next_placement): p50 {q(fo, .5):.3f} ms, p99 {q(fo, .99):.3f} ms")
    print("slowest tasks (p50 ms, candidates):")
    for name, xs in sorted(per_task.items(), key=lambda kv: -statistics.median(kv[1]))[:6]:
        print(f"  {statistics.median(xs) * 1000:7.3f}  {candidates[name]:5d}  {name}")


if __name__ == "__main__":
    main()
