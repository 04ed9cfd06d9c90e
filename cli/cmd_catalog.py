"""`spz gpus list`, `spz catalog refresh|show`, `spz check`: the catalog and the infras.

Imports of the catalog, boto3 and rich happen inside the commands, so `spz --help` and the
other verbs do not pay for them.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import typer

_OUTPUTS = ("table", "json")


def _check_output(output: str) -> None:
    if output not in _OUTPUTS:
        raise typer.BadParameter(f"{output!r}; accepted: {', '.join(_OUTPUTS)}", param_hint="-o/--output")


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False))


def _money(x: float | None) -> str:
    if x is None:
        return "-"
    return f"$ {x:,.2f}" if x >= 1 or round(x * 100) == x * 100 else f"$ {x:,.4f}".rstrip("0")


def _parse_infra(infra: str | None) -> tuple[str | None, str | None]:
    """`aws`, `aws/REGION`, `local`, `*`/`*/REGION` -> (cloud, region)."""
    if not infra:
        return None, None
    parts = infra.split("/")
    cloud = parts[0].lower()
    cloud = None if cloud == "*" else ("kubernetes" if cloud == "k8s" else cloud)
    region = parts[1] if len(parts) > 1 and parts[1] not in ("", "*") else None
    return cloud, region


# ------------------------------------------------------------------------------ gpus list

def gpus_list_command(
    accelerator: Optional[str] = typer.Argument(None, metavar="[NAME[:COUNT]]",
                                                help="Accelerator, e.g. A100 or h100:8 (case-insensitive)."),
    infra: Optional[str] = typer.Option(None, "--infra", help="aws, aws/REGION, k8s, k8s/CONTEXT, slurm, slurm/CLUSTER or local."),
    show_all: bool = typer.Option(False, "-a", "--all", help="Also accelerators that are not common GPUs."),
    all_regions: bool = typer.Option(False, "--all-regions", help="One row per region, not the cheapest only."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
    cloud_: Optional[str] = typer.Option(None, "--cloud", hidden=True, help="Deprecated spelling of --infra CLOUD."),
    region_: Optional[str] = typer.Option(None, "--region", hidden=True,
                                          help="Deprecated spelling of --infra CLOUD/REGION."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show everything in full (every instance type)."),
) -> None:
    """Accelerators, counts, instance types, on-demand and spot prices, cheapest regions."""
    _check_output(output)
    if cloud_ is not None or region_ is not None:
        if infra is not None:
            raise typer.BadParameter("give --infra or --cloud/--region, not both", param_hint="--infra")
        infra = f"{cloud_ or 'aws'}/{region_}" if region_ else cloud_
    from skypurza.services.optimizer import render
    from skypurza.services.optimizer.catalog import load_catalog

    cloud, region = _parse_infra(infra)
    name = count = None
    if accelerator:
        try:
            name, count = render.parse_accelerator_arg(accelerator)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="NAME[:COUNT]") from exc
    if cloud == "local":
        from skypurza.services.optimizer.local import detect_local_resources

        rows = render.local_gpus_rows(detect_local_resources())
        if name:
            rows = [r for r in rows if r["accelerator"].lower() == name.lower()
                    and (count is None or r["count"] >= count)]
        return _print_rows(rows, output, "local GPUs", ["accelerator", "count", "instance_type", "hourly_price"])
    if cloud == "kubernetes":
        rows = _kubernetes_gpu_rows(infra.split("/", 1)[1] if infra and "/" in infra else None)
        if name:
            rows = [r for r in rows if r["accelerator"].lower() == name.lower()
                    and (count is None or r["free"] >= count)]
        return _print_rows(rows, output, "Kubernetes GPUs (free now)",
                           ["context", "accelerator", "free", "most_on_a_node", "nodes", "hourly_price"])
    if cloud == "slurm":
        rows = _slurm_gpu_rows(infra.split("/", 1)[1] if infra and "/" in infra else None)
        if name:
            rows = [r for r in rows if r["accelerator"].lower() == name.lower()
                    and (count is None or r["per_node"] >= count)]
        return _print_rows(rows, output, "Slurm GPUs", ["cluster", "partition", "accelerator", "per_node", "nodes",
                                                        "hourly_price"])
    if cloud not in (None, "aws"):
        typer.echo(f"error: infra {cloud!r} is not supported yet: SkyPurza runs aws, kubernetes, slurm and local "
                   "today",
                   err=True)
        raise typer.Exit(2)
    cat = load_catalog()
    if region and region not in cat.regions:
        typer.echo(f"error: AWS region {region!r} is not in the catalog (regions: {', '.join(cat.regions)})", err=True)
        raise typer.Exit(2)
    if name is not None and cat.canonical_accelerator(name) is None:
        known = ", ".join(cat.accelerators())
        if output == "json":
            _echo_json({"accelerator": name, "rows": [], "error": f"unknown accelerator {name!r}; known: {known}"})
        else:
            typer.echo(f"No accelerator {name!r} in the AWS catalog. Known: {known}", err=True)
        raise typer.Exit(1)
    rows = render.gpus_list_rows(cat, name, count, region, show_all, all_regions)
    if output == "json":
        _echo_json({"catalog": {"built_at": cat.built_at, "source": cat.source}, "infra": "aws",
                    "region": region, "rows": rows})
        return
    if name is None:
        cols = ["accelerator", "counts", "instance_types", "priced_instance_type", "hourly_price",
                "hourly_spot_price", "spot_saving", "cheapest_regions"]
        title = "AWS accelerators" + (f" in {region}" if region else "")
    else:
        cols = ["accelerator", "count", "instance_type", "gpu_memory_gib", "vcpus", "memory_gib",
                "hourly_price", "region", "hourly_spot_price", "spot_zone", "spot_saving"]
        title = f"{cat.canonical_accelerator(name)} on AWS" + (f" in {region}" if region else "")
    _print_rows(rows, output, title, cols, full=verbose)
    typer.echo("On-demand: the cheapest region; spot: the cheapest zone, often elsewhere. SPOT SAVES compares "
               "spot with on-demand of the same type in the spot zone's region.")
    if name is None and not show_all:
        typer.echo("Hint: use -a/--all to see all accelerators; NAME[:COUNT] for instance types and prices.")


def _kubernetes_gpu_rows(only: str | None) -> list[dict[str, Any]]:
    """Each enabled context's GPUs by name: free now (allocatable minus requested), on how many nodes."""
    from skypurza.events.k8s_config import KubernetesSettings, read_all_capacity

    settings = KubernetesSettings.load()
    rows = []
    for ctx in read_all_capacity(settings):
        if only and ctx.context != only:
            continue
        if not ctx.reachable:
            typer.echo(f"warning: context {ctx.context!r} did not answer: {ctx.error}", err=True)
            continue
        by_gpu: dict[str, list[int]] = {}
        for node in ctx.nodes:
            if node.gpu:
                by_gpu.setdefault(node.gpu, []).append(node.gpus)
        for gpu, free in sorted(by_gpu.items()):
            rows.append({"context": ctx.context, "accelerator": gpu, "free": sum(free), "most_on_a_node": max(free),
                         "nodes": len(free), "hourly_price": settings.gpu_hourly_usd})
    return rows


def _slurm_gpu_rows(only: str | None) -> list[dict[str, Any]]:
    """Each Slurm partition's GPUs per node (its smallest usable node) and their price per hour."""
    from skypurza.events.slurm_discovery import accelerator_name
    from skypurza.services.optimizer.world import slurm_clusters

    rows = []
    for c in slurm_clusters(frozenset({"slurm"})):
        if only and c.cluster != only.split("/")[0]:
            continue
        if not c.reachable:
            typer.echo(f"warning: Slurm cluster {c.cluster!r} did not answer: {c.error}", err=True)
            continue
        for o in c.offers:
            cfg = c.config.for_partition(o.partition)
            for kind, per_node in o.gpus.items():
                name = accelerator_name(kind, cfg.gres)
                rows.append({"cluster": c.cluster, "partition": o.partition, "accelerator": name, "per_node": per_node,
                             "nodes": o.nodes, "hourly_price": cfg.pricing.hourly_micros(0, 0, name, 1) / 1e6})
    return rows


def _compact_types(names: list[str]) -> str:
    """`g5.xlarge, g5.2xlarge, ...` -> `g5 (8 types)`: the summary table stays narrow."""
    fams: dict[str, list[str]] = {}
    for n in names:
        fams.setdefault(n.split(".", 1)[0], []).append(n)
    return ", ".join(v[0] if len(v) == 1 else f"{f} ({len(v)} types)" for f, v in fams.items())


def _cell(v: Any, col: str, full: bool = False) -> str:
    if col.startswith("hourly"):
        return _money(v)
    if col == "spot_saving":
        return "-" if v is None else f"{v:.0%}"
    if col == "instance_types":
        return ", ".join(v) if full else _compact_types(list(v))
    if isinstance(v, (list, tuple)):
        return ", ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v)
    if isinstance(v, float):
        return f"{v:g}"
    return "-" if v is None else str(v)


def _print_rows(rows: list[dict[str, Any]], output: str, title: str, cols: list[str], full: bool = False) -> None:
    if output == "json":
        _echo_json({"rows": rows})
        return
    from .console import console as make_console
    from rich.table import Table

    headers = {"hourly_price": "ON-DEMAND $/h", "hourly_spot_price": "SPOT $/h", "gpu_memory_gib": "GPU MEM GiB",
               "memory_gib": "HOST MEM GiB", "vcpus": "vCPUs", "cheapest_regions": "CHEAPEST REGIONS",
               "priced_instance_type": "PRICED TYPE", "spot_saving": "SPOT SAVES",
               "region": "ON-DEMAND REGION"}
    table = Table(title=title)
    for c in cols:
        table.add_column(headers.get(c, c.upper().replace("_", " ")),
                         justify="right" if c.startswith(("hourly", "vcpus", "memory", "gpu_mem", "count", "spot_saving")) else "left")
    for r in rows:
        table.add_row(*[_cell(r.get(c), c, full) for c in cols])
    make_console().print(table)


# ------------------------------------------------------------------------------ catalog

def catalog_refresh_command(
    regions: Optional[list[str]] = typer.Option(None, "--regions", "--region",
                                                 help="Regions to refresh (repeat or comma-separate); "
                                                      "default: every region of the current catalog."),
    families: Optional[str] = typer.Option(None, "--families",
                                           help="Instance families, comma-separated (default: those of the "
                                                "current catalog)."),
    endpoint_url: Optional[str] = typer.Option(None, "--endpoint-url", envvar="AWS_ENDPOINT_URL",
                                               help="EC2 endpoint (AWS_ENDPOINT_URL)."),
    no_pricing_api: bool = typer.Option(False, "--no-pricing-api",
                                        help="Keep the current on-demand prices instead of asking the Price List API."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Rebuild the catalog from AWS: offerings per zone, instance types, spot and on-demand prices."""
    _check_output(output)
    from skypurza.services.optimizer.catalog import load_catalog, save_catalog
    from skypurza.services.optimizer.catalog.refresh import refresh_catalog

    region_list = [r.strip() for item in (regions or []) for r in item.split(",") if r.strip()] or None
    fams = [f.strip() for f in families.split(",") if f.strip()] if families else None
    base = load_catalog()

    def progress(msg: str) -> None:
        typer.echo(msg, err=True)  # progress on stderr keeps `-o json` stdout clean

    try:
        res = refresh_catalog(base, region_list, families=fams, endpoint_url=endpoint_url,
                              price_source=None if no_pricing_api else "default", progress=progress)
    except Exception as exc:  # noqa: BLE001 -- credentials missing etc.: say it, exit non-zero
        typer.echo(f"error: catalog refresh failed: {exc}", err=True)
        raise typer.Exit(1) from exc
    if not res.regions_refreshed:
        typer.echo("error: no region could be refreshed; the catalog is unchanged", err=True)
        for n in res.notes:
            typer.echo(f"  {n}", err=True)
        raise typer.Exit(1)
    path = save_catalog(res.catalog)
    summary = {
        "path": str(path), "built_at": res.catalog.built_at, "source": res.catalog.source,
        "regions_refreshed": res.regions_refreshed, "regions_failed": res.regions_failed,
        "instance_types": len(res.catalog.types), "notes": res.notes,
    }
    if output == "json":
        _echo_json(summary)
        return
    typer.echo(f"wrote {path} ({len(res.catalog.types)} instance types, built {res.catalog.built_at})")
    typer.echo(f"refreshed: {', '.join(res.regions_refreshed)}")
    for r, why in res.regions_failed.items():
        typer.echo(f"failed: {r}: {why}")
    for n in res.notes:
        typer.echo(f"note: {n}")


def catalog_show_command(output: str = typer.Option("table", "-o", "--output", help="table or json.")) -> None:
    """Which catalog file is used, when it was built and from what."""
    _check_output(output)
    from skypurza.services.optimizer.catalog import load_catalog
    from skypurza.services.optimizer.catalog.loader import catalog_path

    path = catalog_path()
    cat = load_catalog()
    info = {"path": str(path), "cloud": cat.cloud, "built_at": cat.built_at, "source": cat.source,
            "instance_types": len(cat.types), "regions": list(cat.regions), "accelerators": list(cat.accelerators()),
            "spot_refreshed_at": cat.spot_refreshed_at, "notes": list(cat.notes)}
    if output == "json":
        _echo_json(info)
        return
    for k in ("path", "cloud", "built_at", "source", "instance_types"):
        typer.echo(f"{k}: {info[k]}")
    typer.echo(f"regions: {len(cat.regions)}; accelerators: {', '.join(cat.accelerators())}")


# ------------------------------------------------------------------------------ check

def check_command(
    infras: Optional[list[str]] = typer.Argument(None, help="Infras to check (default: all)."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Also show the account each enabled infra is used "
                                                                "with."),
    workspace: Optional[str] = typer.Option(None, "-w", "--workspace",
                                            help="SkyPilot workspace (spz: the stage is the namespace)."),
) -> None:
    """Which infras are enabled (AWS: credentials and an answering STS/EC2; local: always) and why not."""
    _check_output(output)
    if workspace is not None:
        from .options import workspace_note

        workspace_note(workspace)
    from skypurza.services.optimizer.infras import check_infras
    from skypurza.services.optimizer.placement import default_enabled_infras

    statuses = check_infras(infras or None)
    clouds = sorted({s.infra.split("/")[0] for s in statuses if s.enabled and s.infra != "local"})
    default = sorted(default_enabled_infras(clouds)) if not infras else None
    if output == "json":
        _echo_json({"infras": [s.to_dict() for s in statuses],
                    "enabled": [s.infra for s in statuses if s.enabled],
                    "default_for_tasks": default})
        return
    from .console import console as make_console
    from rich.table import Table

    table = Table(title="Infras")
    for c in ("INFRA", "ENABLED", "WHY", "DETAIL"):
        table.add_column(c)
    for s in statuses:
        # The account an enabled infra is used with only with -v (as sky check -v); a disabled one's detail is why.
        table.add_row(s.infra, "yes" if s.enabled else "no", s.reason, s.detail if verbose or not s.enabled else "")
    console = make_console()
    console.print(table)
    if default is not None:
        console.print(f"Tasks without an explicit infra go to: {', '.join(default) or 'nothing'}")


def register(app: typer.Typer) -> None:
    """Add `gpus list`, `catalog refresh|show` and `check` to ``app``."""
    gpus = typer.Typer(name="gpus", help="GPU offerings and prices.", no_args_is_help=True)
    gpus.command("list")(gpus_list_command)
    app.add_typer(gpus, name="gpus")
    catalog = typer.Typer(name="catalog", help="The instance and price catalog.", no_args_is_help=True)
    catalog.command("refresh")(catalog_refresh_command)
    catalog.command("show")(catalog_show_command)
    app.add_typer(catalog, name="catalog")
    app.command("check")(check_command)
