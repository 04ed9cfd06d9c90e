"""`spz health [CLUSTER]`: each node's last sample and the GPU health findings, a CLI plugin of
the platform (the `skypurza.cli_plugins` entry point, as the ledger's commands join).

It asks the GPU health manager (service.py) over NATS request-reply
(`naming.query_subject(stage, "gpuhealth", "nodes")`); the manager keeps the last sample of every
node it heard and the findings it published (GpuUnhealthy on the log). Nothing is read from the
nodes themselves.
"""

from __future__ import annotations

from typing import Any, Optional

import typer

from skypurza.cli.bounds import check_cluster_name
from skypurza.cli.context import check_output, fail, print_json, run_async, stage

QUERY_TIMEOUT_S = 10.0


def _fmt(value: Any, unit: str = "", digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _gpus(sample: dict[str, Any] | None) -> str:
    if not sample:
        return "-"
    gpus = sample.get("gpus") or []
    if not gpus:
        return sample.get("gpu_error") or ("0" if not sample.get("expected_gpus") else "none seen")
    util = [g["utilization_pct"] for g in gpus if g.get("utilization_pct") is not None]
    temp = [g["temperature_c"] for g in gpus if g.get("temperature_c") is not None]
    parts = [f"{len(gpus)}x {gpus[0].get('name') or 'GPU'}"]
    if util:
        parts.append(f"util {sum(util) / len(util):.0f}%")
    if temp:
        parts.append(f"max {max(temp):.0f}C")
    return ", ".join(parts)


def gpu_source(sample: dict[str, Any] | None) -> str:
    """Who read the node's GPUs: dcgm or nvidia-smi (an agent from before DCGM says nothing: nvidia-smi)."""
    if not sample:
        return "-"
    source = sample.get("gpu_source")
    if isinstance(source, str) and source:
        return source
    return "nvidia-smi" if sample.get("gpus") else "-"


def corrected_ecc(sample: dict[str, Any] | None) -> int | None:
    """The node's volatile corrected (single-bit) ECC errors over its GPUs; None when no GPU reports
    the count (nvidia-smi's query has no such column: only DCGM gives it)."""
    counts = [g.get("ecc_corrected_volatile") for g in (sample or {}).get("gpus") or [] if isinstance(g, dict)]
    known = [c for c in counts if isinstance(c, int) and not isinstance(c, bool)]
    return sum(known) if known else None


def with_gpu_source(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The JSON form: each node as the manager answered, plus its GPU source and corrected ECC count."""
    return [{**n, "gpu_source": gpu_source(n.get("sample")), "ecc_corrected_volatile": corrected_ecc(n.get("sample"))}
            for n in nodes]


def _findings(found: list[dict[str, Any]]) -> str:
    if not found:
        return "healthy"
    return "; ".join(f"{f.get('severity', '?')}: {f.get('rule', '?')}"
                     f"{'' if f.get('gpu_index') is None else ' GPU ' + str(f['gpu_index'])}"
                     f" ({f.get('detail', '')})" for f in found)


def rows_of(nodes: list[dict[str, Any]]) -> list[list[str]]:
    """The table's rows: one per node (pure, for the tests)."""
    out = []
    for n in nodes:
        s = n.get("sample")
        out.append([n["cluster"], str(n["rank"]), (s or {}).get("ts", "-"), _fmt((s or {}).get("cpu_pct"), "%"),
                    gpu_source(s), _gpus(s), _fmt(corrected_ecc(s)), _findings(n.get("findings") or [])])
    return out


def health_command(
    cluster: Optional[str] = typer.Argument(None, metavar="CLUSTER", help="Only this cluster's nodes."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Each node's last sample (CPU, GPUs, the GPU source: dcgm or nvidia-smi, corrected ECC errors)
    and the GPU health findings (Xid, ECC, missing GPUs, idle or throttled GPUs). A node with a fatal finding is drained and its managed jobs are
    recovered elsewhere (docs/gpu-health.md)."""
    check_output(output)
    name = check_cluster_name(cluster, "CLUSTER", pattern=False)

    async def ask() -> list[dict[str, Any]]:
        from skypurza.cli.control import connect_bus

        from .service import QUERY_SERVICE  # here: every spz command loads this plugin, few ask it

        bus = await connect_bus(stage(), "health")
        try:
            return await bus.request(QUERY_SERVICE, "nodes", {"cluster": name} if name else {},
                                     timeout=QUERY_TIMEOUT_S)
        finally:
            await bus.close()

    try:
        nodes = run_async(ask())
    except Exception as exc:
        if type(exc).__name__ in ("NoRespondersError", "TimeoutError"):
            raise fail("the GPU health manager is not answering; is the control plane up? (`spz api status`)")
        if isinstance(exc, RuntimeError):
            raise fail(str(exc))
        raise
    if output == "json":
        print_json(with_gpu_source(nodes))
        return
    if not nodes:
        typer.echo(f"No samples from {name}'s nodes yet." if name else "No node samples yet.")
        return
    from skypurza.cli.tables import print_table

    print_table(["CLUSTER", "NODE", "SAMPLED", "CPU", "SOURCE", "GPUS", "ECC CORRECTED", "HEALTH"], rows_of(nodes))


def register(app: typer.Typer) -> None:
    app.command("health")(health_command)
