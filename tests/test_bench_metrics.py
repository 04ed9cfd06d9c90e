"""bench/metrics.py's node samples row runs end to end at a tiny size: a real nats-server, the
observability service and the GPU health manager as the control plane runs them, simulated nodes
on the agents' subject; the row says the CPU per tick and the share of one core, with the load."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "metrics.py"


def test_the_metrics_bench_prints_the_node_samples_row() -> None:
    run = subprocess.run([sys.executable, str(BENCH), "--samples-only", "--sample-nodes", "5", "--sample-ticks", "2",
                          "--sample-gpu-share", "0.6", "--sample-idle-share", "0.5"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout
    assert re.search(r"^load_average_1_5_15\s+[\d.]+ [\d.]+ [\d.]+$", out, re.M), out
    rows = dict(line.split(None, 1) for line in out.splitlines() if line and not line.startswith("node samples"))
    assert (rows["samples_nodes"], rows["samples_gpu_nodes"], rows["samples_idle_gpu_nodes"]) == ("5", "3", "2"), out
    assert rows["samples_dropped"] == "0", out
    assert float(rows["samples_cpu_per_tick_p50_ms"]) > 0, out  # the consumers did work for each tick
    assert int(rows["sample_bytes_gpu_node"]) > int(rows["sample_bytes_cpu_node"]) > 0, out  # 8 GPUs vs none
    assert re.search(r"^node samples, 5 nodes every 10 s: [\d.]+ ms CPU per tick \(p50 of 2\) = [\d.]+% of one core; "
                     r"baselines: idle for as long [\d.]+ ms, idle for a whole interval [\d.]+ ms, "
                     r"decoding alone [\d.]+ ms$", out, re.M), out
    assert "metrics_p50_ms" not in rows  # --samples-only: the /metrics rows did not run
