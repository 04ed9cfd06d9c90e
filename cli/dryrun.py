"""`spz launch --dryrun`: the optimizer's table for a task, with no side effects.

It runs the same pure placement the optimizer service runs (same catalog, same enabled infras),
in this process: no bus, no control plane, so it answers in a fraction of a second.
"""

from __future__ import annotations

import sys
from typing import Any

from .jsonout import print_json  # not cli/context.py: this module imports no typer (cli/launchdry.py)


def dryrun_command(task: Any, overrides: Any = None, output: str = "table", limit: int = 10) -> int:
    """Print the ranked candidates for `task` (a taskspec Task); return the exit code (1: infeasible)."""
    from skypurza.services.optimizer.catalog import load_catalog
    from skypurza.services.optimizer.placement import place
    from skypurza.services.optimizer.settings import OptimizerSettings
    from skypurza.services.optimizer.world import enabled_infras_here
    from skypurza.services.optimizer.render import dryrun_json, dryrun_rows

    if overrides is not None:
        from skypurza.events.taskspec import apply_overrides

        task = apply_overrides(task, overrides)
    catalog = load_catalog()
    enabled = enabled_infras_here(OptimizerSettings.load())
    local = None
    if "local" in enabled or _asks_local(task):
        from skypurza.services.optimizer.local import detect_local_resources

        local = detect_local_resources(catalog.accelerators())
    slurm = ()
    if "slurm" in enabled or any(r.cloud == "slurm" for r in task.resource_requests()):
        from skypurza.services.optimizer.world import slurm_clusters

        slurm = slurm_clusters(enabled | {"slurm"})  # over SSH, bounded: what the optimizer would see
    kube = ()
    if "kubernetes" in enabled or any(r.cloud in ("kubernetes", "k8s") for r in task.resource_requests()):
        from skypurza.services.optimizer.world import kubernetes_contexts

        kube = kubernetes_contexts(enabled | {"kubernetes"})  # each context's free capacity, bounded
    plan = place(task.resource_requests(), task.num_nodes or 1, catalog, (), enabled, local, slurm=slurm,
                 kubernetes=kube)
    if output == "json":
        doc = dryrun_json(plan, catalog, limit=None)
        doc["task"] = task.name
        doc["enabled_infras"] = sorted(enabled)
        print_json(doc)
        return 0 if plan.feasible else 1
    from .console import console as make_console
    from rich.table import Table

    console = make_console()
    if not plan.feasible:
        make_console(stderr=True).print(f"[red]No placement:[/red] {plan.reason}")
        return 1
    nodes = task.num_nodes or 1
    title = f"Placement for {task.name or 'task'} ({nodes} node{'s' if nodes != 1 else ''}; " \
            f"infras: {', '.join(sorted(enabled))}; catalog built {catalog.built_at})"
    table = Table(title=title, title_justify="left")
    for col in ("", "infra", "region", "zone", "instance type", "accelerators", "vCPUs", "mem GiB", "market",
                "$/h node", "$/h total"):
        table.add_column(col, justify="right" if col.startswith("$") or col in ("vCPUs", "mem GiB") else "left")
    for r in dryrun_rows(plan, limit):
        table.add_row("✔" if r["chosen"] else "", r["infra"], r["region"], r["zone"], r["instance_type"],
                      r["accelerators"], f"{r['vcpus']:g}", f"{r['memory_gib']:g}", r["market"],
                      f"{r['hourly_price']:.4f}", f"{r['total_hourly_price']:.4f}")
    console.print(table)
    more = len(plan.candidates) - min(limit, len(plan.candidates))
    if more > 0:
        console.print(f"... and {more} more candidate(s) (-o json lists all).")
    for note in plan.notes:
        console.print(f"[dim]note: {note}[/dim]")
    return 0


def _asks_local(task: Any) -> bool:
    return any((r.cloud or "") == "local" for r in task.resource_requests())


def exit_with(code: int) -> None:
    import typer

    sys.stdout.flush()
    raise typer.Exit(code)
