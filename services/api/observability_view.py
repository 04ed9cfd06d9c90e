"""What the console's observability page shows, from what the observability services answer (pure).

- `gpu_rows`: the GPU health manager's last sample of each node (events/health_queries.py) as one
  row per GPU, with the node's CPU, its GPU source (dcgm or nvidia-smi), each GPU's ECC counts
  (corrected: DCGM only) and the source's error beside (a node with no GPU listed is
  one row with `gpu_index` null, so a node whose GPUs fell off the bus still shows);
- `finding_row`: one GpuUnhealthy from the log; `drained` is whether the node agents drained the
  cluster on it (a fatal finding: services/agent/view.py; no new job is admitted there).

Everything is bounded: at most MAX_GPU_ROWS rows, strings cut at MAX_TEXT_CHARS.
"""

from __future__ import annotations

from typing import Any

from skypurza.events.health_events import GpuUnhealthy

MAX_GPU_ROWS = 5000
MAX_TEXT_CHARS = 300


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text(value: Any) -> str:
    return value[:MAX_TEXT_CHARS] if isinstance(value, str) else ""


def gpu_source(sample: dict[str, Any]) -> str:
    """dcgm or nvidia-smi; an agent from before DCGM says nothing and read nvidia-smi; "" for no GPU."""
    source = _text(sample.get("gpu_source"))
    return source or ("nvidia-smi" if sample.get("gpus") else "")


def gpu_rows(nodes: list[Any], cluster: str | None = None) -> tuple[list[dict[str, Any]], bool]:
    """One row per GPU of each node's last sample, by cluster and rank; True when rows were left out."""
    rows: list[dict[str, Any]] = []
    for node in sorted((n for n in nodes if isinstance(n, dict)),
                       key=lambda n: (str(n.get("cluster")), n.get("rank") if isinstance(n.get("rank"), int) else 0)):
        if cluster and node.get("cluster") != cluster:
            continue
        sample = node.get("sample") if isinstance(node.get("sample"), dict) else None
        if sample is None:
            continue  # findings read back from the log, no sample heard since the manager started
        base = {"cluster": _text(node.get("cluster")), "rank": node.get("rank"), "sampled_at": _text(sample.get("ts")),
                "cpu_pct": _num(sample.get("cpu_pct")), "gpu_error": _text(sample.get("gpu_error")),
                "gpu_source": gpu_source(sample),
                "findings": len(node.get("findings") or [])}
        gpus = [g for g in sample.get("gpus") or [] if isinstance(g, dict)]
        for g in gpus or [None]:
            if len(rows) >= MAX_GPU_ROWS:
                return rows, True
            rows.append({**base, "gpu_index": g.get("index") if g else None, "name": _text(g.get("name")) if g else "",
                         **{k: (_num(g.get(k)) if g else None) for k in
                            ("utilization_pct", "memory_used_mib", "memory_total_mib", "temperature_c", "power_w")},
                         **{k: (_count(g.get(k)) if g else None) for k in
                            ("ecc_corrected_volatile", "ecc_uncorrected_volatile")}})
    return rows, False


def finding_row(seq: int, ev: GpuUnhealthy) -> dict[str, Any]:
    return {"seq": seq, "cluster": ev.cluster, "rank": ev.rank, "gpu_index": ev.gpu_index, "rule": ev.rule,
            "severity": ev.severity, "detail": ev.detail[:MAX_TEXT_CHARS], "detected_at": ev.detected_at.isoformat(),
            "drained": ev.severity == "fatal"}
