"""Memory of an N-node `local` launch on the services (provisioner) side: linear, not quadratic.

What is measured, honestly: 512 real agent processes (~40 MB each) do not fit this box, so the
agents are not started. What the provisioner process itself builds for an N-node local launch
is built for real, by the real code, in a fresh Python process per figure:
`LocalAdapter._new_record` (one AgentSpec and argv per rank, the node-IP file), the record
written to `cluster.json`, and the `NodeInfo` list a ClusterProvisioned event carries.
Printed per N: the growth of the process's RSS over its state after imports, the Python heap
peak (tracemalloc) and the size of cluster.json.

The "old" rows rebuild the quadratic form the backend had before (issue 11 §3): every rank's
argv listed every node IP (`--node-ips 127.0.0.1,127.0.0.1,...`) and each call built its own
tuple of N IPs, so N nodes cost N² IPs in memory and in cluster.json. They run the same
AgentSpec code with the IPs inline instead of the shared file.

    python bench/local_nodes_memory.py [--nodes 1 64 512]

Bounded in time: each figure is one subprocess of well under a second (< 2 min in all).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PAGE = 4096


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def worker(mode: str, n: int) -> dict[str, float]:
    import gc
    import tracemalloc
    from dataclasses import replace

    from skypurza.events.models import NodeInfo  # noqa: F401  (imports paid before the baseline)
    from skypurza.services.provisioner.adapter import LaunchSpec
    from skypurza.services.provisioner.local import LOCAL_IP, LocalAdapter

    with tempfile.TemporaryDirectory() as tmp:
        adapter = LocalAdapter("nats://127.0.0.1:4222", "bench", Path(tmp))
        spec = LaunchSpec(stage="bench", cluster="mem", launch_token="tok", instance_type="local", region="local",
                          num_nodes=n, infra="local", labels={"start_seq": "1"})
        if mode == "old":
            new_spec = adapter.agent_spec

            def old_agent_spec(spec: LaunchSpec, rank: int, home: Path):  # type: ignore[no-untyped-def]
                ips = tuple(LOCAL_IP for _ in range(spec.num_nodes))  # built per rank, as before
                return replace(new_spec(spec, rank, home), node_ips=ips, node_ips_file="")

            adapter.agent_spec = old_agent_spec  # type: ignore[method-assign]
        gc.collect()
        before = rss_bytes()
        tracemalloc.start()
        t0 = time.perf_counter()
        record = adapter._new_record(spec)
        adapter._write(spec.cluster, record)
        nodes = adapter._nodes(record)
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        after = rss_bytes()
        size = (adapter.cluster_dir("mem") / "cluster.json").stat().st_size
        assert len(nodes) == n
        return {"rss_growth": after - before, "heap_peak": peak, "record_bytes": size, "seconds": elapsed,
                "rss": after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 64, 512])
    parser.add_argument("--worker", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        mode, n = args.worker
        print(json.dumps(worker(mode, int(n))))
        return
    print(f"{'nodes':>6} {'form':>4} {'RSS':>9} {'RSS growth':>11} {'heap peak':>10} {'cluster.json':>13} {'build':>8}")
    results: dict[tuple[str, int], dict[str, float]] = {}
    for n in args.nodes:
        for mode in ("new", "old"):
            out = subprocess.run([sys.executable, __file__, "--worker", mode, str(n)], capture_output=True,
                                 text=True, timeout=60, check=True)
            r = json.loads(out.stdout)
            results[(mode, n)] = r
            print(f"{n:>6} {mode:>4} {r['rss'] / 2**20:>7.1f}MB {r['rss_growth'] / 2**20:>9.2f}MB "
                  f"{r['heap_peak'] / 2**20:>8.2f}MB {r['record_bytes'] / 2**10:>11.1f}KB {r['seconds'] * 1000:>6.1f}ms")
    lo, hi = min(args.nodes), max(args.nodes)
    if lo != hi:
        for mode in ("new", "old"):
            ratio = results[(mode, hi)]["heap_peak"] / max(results[(mode, lo)]["heap_peak"], 1)
            per_node = results[(mode, hi)]["heap_peak"] / hi
            print(f"{mode}: heap peak x{ratio:,.0f} from {lo} to {hi} nodes ({per_node / 1024:.1f} KB per node at {hi})")


if __name__ == "__main__":
    main()
