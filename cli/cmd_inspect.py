"""`spz status`, `queue`, `logs` and `cancel`: what the clusters and their jobs are doing.

`status` and `queue` ask the status service's projections (request-reply) and read the log directly
when it does not answer or with `--refresh`; `logs` and `cancel` always read the log.
"""

from __future__ import annotations

import fnmatch
from datetime import datetime, timezone
from typing import Any, Optional

import typer

from . import bounds, options
from .context import check_output, fail, print_json, run_async, stage
from .tables import parse_time, print_line, print_table
from .verbs import WAIT_S, _clusters_from_log, _confirm, _config, _report_job, _status_service


# -------------------------------------------------------------------------------------------- logs

def logs_command(
    cluster: str = typer.Argument(..., callback=bounds.cluster_argument, help="The cluster."),
    job_id: Optional[int] = typer.Argument(None, parser=bounds.JOB_ID, help="The job (default: the cluster's latest)."),
    follow: bool = typer.Option(True, "--follow/--no-follow", help="Follow until the job ends, or print what there is."),
    status_only: bool = typer.Option(False, "--status", help="Print the job's status and exit with it: 0 succeeded, "
                                                            "100 failed, 101 not finished, 102 not found, 103 cancelled."),
    tail: int = typer.Option(0, "--tail", parser=bounds.TAIL_LINES, help="Only the last N lines of what was already printed (0: all)."),
    timestamps: bool = typer.Option(False, "--timestamps", help="Prefix each line with when it was printed."),
    worker: Optional[int] = typer.Option(None, "-w", "--worker", parser=bounds.BoundedInt(0, 1023, "node ranks"),
                                         help="Only this node's output (0 is the head)."),
    sync_down: bool = typer.Option(False, "-s", "--sync-down", help="Write the job's output to ~/sky_logs/CLUSTER/"
                                                                    "JOB/rank-N.log (a file per node) and say where."),
    provision: bool = typer.Option(False, "--provision", help="The cluster's provisioning history (placement, "
                                                              "capacity errors, launch, nodes ready)."),
    autostop: bool = typer.Option(False, "--autostop", help="The cluster's autostop history (settings, idle "
                                                            "reports, stops and teardowns they made)."),
    hook: Optional[str] = typer.Option(None, "--hook", help="A lifecycle hook's log (spz has no lifecycle hooks)."),
) -> None:
    """Print a job's output (every node, prefixed by rank when there are several).

    Works after the job ended and after the control plane restarted: output is kept in the logs stream (30 days). Ctrl-C stops following; the job keeps running.
    """
    from .progress import StatusLine, echo_out

    if hook is not None:
        raise fail("--hook: spz has no lifecycle hooks, so there is no hook log; spz logs --provision shows "
                   "how the cluster came up", 2)
    from .transport import api

    t = api()
    if provision or autostop:
        raise typer.Exit(_history(cluster, "provision" if provision else "autostop", t))
    if sync_down:
        raise typer.Exit(_sync_down(cluster, job_id, t))
    status = StatusLine()
    try:
        if t is not None:
            from . import via_api

            code = via_api.logs(t, cluster, job_id, follow, status_only, tail, timestamps, status, echo_out, worker)
        else:
            code = run_async(_logs(cluster, job_id, follow, status_only, tail, timestamps, status, echo_out, worker))
    except KeyboardInterrupt:
        status.stop()
        status.note("\nStopped following (Ctrl-C); the job keeps running.")
        raise typer.Exit(130)
    finally:
        status.stop()
    raise typer.Exit(code)


def _history(cluster: str, kind: str, t: Any = None) -> int:
    """`--provision` / `--autostop`: read from the log, or asked of the API server (the same lines)."""
    from .clusterhistory import AUTOSTOP_EVENTS, PROVISION_EVENTS, history_lines

    what = "provisioning" if kind == "provision" else "autostop"

    async def run() -> list[str]:
        from .control import connect_bus

        bus = await connect_bus(stage(), "logs")
        try:
            return await history_lines(bus, cluster, PROVISION_EVENTS if kind == "provision" else AUTOSTOP_EVENTS)
        finally:
            await bus.close()

    if t is not None:
        from . import via_api_history

        lines = via_api_history.history(t, cluster, kind)
    else:
        lines = run_async(run())
    if not lines:
        print_line(f"No {what} history for cluster {cluster}.")
        return 1 if what == "provisioning" else 0
    for line in lines:
        typer.echo(line)
    return 0


def _sync_down(cluster: str, job_id: int | None, t: Any = None) -> int:
    """The job's output written to ~/sky_logs/CLUSTER/JOB/rank-N.log, from the log or downloaded
    through the API server (the same files)."""
    from .clusterhistory import sky_logs_dir, sync_down

    async def run() -> tuple[int | None, list[Any]]:
        from .clusterlog import read_cluster
        from .control import connect_bus

        bus = await connect_bus(stage(), "logs")
        try:
            c = await read_cluster(bus, cluster)
            job = c.jobs.get(job_id) if job_id is not None else c.last_job()
            if job is None:
                return None, []
            return job.job_id, await sync_down(bus, cluster, job.job_id, sky_logs_dir() / cluster / str(job.job_id))
        finally:
            await bus.close()

    from .clusterlog import EXIT_NOT_FOUND

    cut: list[Any] = []
    if t is not None:
        from . import via_api_history

        found, files, cut = via_api_history.sync_down(t, cluster, job_id, sky_logs_dir())
    else:
        found, files = run_async(run())
    if found is None:
        typer.echo(f"No job {job_id} on cluster {cluster}." if job_id else f"Cluster {cluster} has no jobs.", err=True)
        return EXIT_NOT_FOUND
    if not files:
        typer.echo(f"Job {found} of cluster {cluster} has printed nothing yet.")
        return 0
    typer.echo(f"Job {found}'s logs of cluster {cluster} (a file per node): {files[0].parent}")
    for f in files:
        typer.echo(f"  {f}")
    from skypurza.events.clusterhistory import MAX_LOG_FILE_BYTES

    for f in cut:
        typer.echo(f"{f}: cut at {MAX_LOG_FILE_BYTES // 2**20} MiB (the most the API server sends "
                   "of one file); spz logs prints all of it", err=True)
    return 0


async def _logs(cluster: str, job_id: int | None, follow: bool, status_only: bool, tail: int, timestamps: bool,
                status: Any, out: Any, worker: int | None = None) -> int:
    from .clusterlog import EXIT_NOT_FOUND, exit_code_of, read_cluster
    from .control import connect_bus
    from .jobwatch import stream_job

    bus = await connect_bus(stage(), "logs")
    try:
        c = await read_cluster(bus, cluster)
        if not c.jobs and c.status is None:
            status.note(f"[red]No cluster named {cluster}.[/red]")
            return EXIT_NOT_FOUND
        if job_id is None:
            last = c.last_job()
            if last is None:
                status.note(f"Cluster {cluster} has no jobs yet.")
                return EXIT_NOT_FOUND
            job_id = last.job_id
        job = c.jobs.get(job_id)
        if status_only:
            out(f"Job {job_id}: {job.status if job else 'NOT FOUND'}")
            return exit_code_of(job.status if job else None)
        if job is None:
            status.note(f"[red]Job {job_id} not found on cluster {cluster}.[/red]")
            return EXIT_NOT_FOUND
        if worker is not None and worker >= max(job.num_nodes, 1):
            status.note(f"[red]Job {job_id} runs on {job.num_nodes} node(s): there is no worker {worker}.[/red]")
            return 1
        done = await stream_job(bus, cluster, job_id, print_line=out, follow=follow, tail=tail,
                                timestamps=timestamps, status=status.update if follow else None, rank=worker,
                                progress=status.update if follow and getattr(status, "live", False) else None)
        status.stop()
        if done is not None and done.terminal and follow:
            _report_job(status, cluster, done)
        return exit_code_of(done.status) if done is not None and (follow or done.terminal) else 0
    finally:
        await bus.close()


# ----------------------------------------------------------------------------------- status, queue

def _fmt_price(micros: Any) -> str:
    return "-" if micros in (None, 0) else f"${int(micros) / 1e6:.3f}"


def cluster_row(d: dict[str, Any]) -> dict[str, Any]:
    """One cluster in `status -o json` form, from a status row or the log's fold (both give the
    price per node as `hourly_price_micros`); `hourly_price` is the whole cluster's, in dollars."""
    nodes = int(d.get("num_nodes") or 0)
    node_micros = d.get("hourly_price_micros")
    total = int(node_micros) * max(nodes, 1) if node_micros is not None else None
    return {
        "name": d.get("name") or d.get("cluster"),
        "status": d.get("status"),
        "infra": d.get("infra"),
        "region": d.get("region"),
        "zone": d.get("zone"),
        "instance_type": d.get("instance_type"),
        "num_nodes": nodes,
        "accelerators": d.get("accelerators"),
        "use_spot": bool(d.get("use_spot") or d.get("market") == "spot"),
        "hourly_price": total / 1_000_000 if total is not None else None,
        "hourly_price_micros": total,
        "node_hourly_price_micros": int(node_micros) if node_micros is not None else None,
        "launched_at": d.get("launched_at"),
        "user": d.get("user"),
        "autostop": d.get("autostop", d.get("autostop_minutes")),
        "autodown": bool(d.get("autodown", d.get("autostop_down", False))),
    }


def job_row(d: dict[str, Any]) -> dict[str, Any]:
    """One job in `queue -o json` form (SkyPilot's status names: SETTING_UP, not the SETUP of
    ledger files written before the one fold)."""
    from skypurza.events.fold import LEGACY_JOB_STATUS

    out = dict(d)
    if out.get("status") in LEGACY_JOB_STATUS:
        out["status"] = LEGACY_JOB_STATUS[out["status"]]
    return out


def status_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Only these clusters (glob patterns allowed)."),
    all_: bool = typer.Option(False, "-a", "--all", help="Also show terminated clusters."),
    output: str = typer.Option("table", "-o", "--output", help="table or json (a list of clusters)."),
    refresh: bool = typer.Option(False, "-r", "--refresh", help="Reconcile first: list what the clouds hold with this "
                                 "stage's tags, report orphans (instances no live cluster owns, recorded as OrphanFound "
                                 "events) and clusters whose instances vanished; then read the event log itself "
                                 "instead of the status service's projection."),
    terminate_orphans: bool = typer.Option(False, "--terminate-orphans", help="With --refresh: also terminate the "
                                           "orphans found (only this stage's; other stages are never touched)."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Show every column (user, head IP, ports)."),
    ip: bool = typer.Option(False, "--ip", help="Print the head node's IP address of the one cluster named."),
    endpoints: bool = typer.Option(False, "--endpoints", help="Print the cluster's open ports and their addresses."),
    endpoint: Optional[int] = typer.Option(None, "--endpoint", parser=bounds.BoundedInt(1, 65535, "a TCP port"),
                                           help="Print the address of this open port of the cluster."),
    show_managed_jobs: bool = typer.Option(True, "--show-managed-jobs/--no-show-managed-jobs", show_default=False,
                                           help="Also show the managed jobs in progress (default: yes)."),
    show_services: Optional[bool] = typer.Option(None, "--show-services/--no-show-services", show_default=False,
                                                 help="SkyServe services (spz has none yet)."),
    show_pools: Optional[bool] = typer.Option(None, "--show-pools/--no-show-pools", show_default=False,
                                              help="Pools (spz has none)."),
    all_users: bool = options.all_users_option(),
) -> None:
    """Show clusters: status, where they run, what they cost per hour, autostop.

    --ip, --endpoints and --endpoint PORT print one cluster's addresses and nothing else.
    """
    check_output(output)
    if terminate_orphans and not refresh:
        raise typer.BadParameter("--terminate-orphans goes with --refresh", param_hint="--terminate-orphans")
    from .transport import api

    t = api()
    if t is None:
        options.all_users_note(all_users)
    if show_services:
        options.unused("--show-services", "SkyServe services are not supported yet; there are none to show")
    if show_pools:
        options.unused("--show-pools", "SkyPurza has no pools")
    if ip or endpoints or endpoint is not None:
        raise typer.Exit(_addresses(clusters or [], ip=ip, endpoint=endpoint, t=t))
    report: dict[str, Any] | None = None
    refreshed: list[dict[str, Any]] | None = None
    if refresh and t is not None:  # the provisioner's pass, asked through the server; its refreshed view
        from . import via_api_history

        report, refreshed = via_api_history.refresh(t, terminate_orphans, all_, all_users)
        _print_reconcile(report, to_stderr=output == "json")
    elif refresh:
        from .cmd_provision import refresh_command

        report = refresh_command(terminate_orphans=terminate_orphans)
        _print_reconcile(report, to_stderr=output == "json")

    # The managed jobs in progress come on the same connection as the clusters (one connect,
    # not two); only the table shows them.
    with_managed = show_managed_jobs and output != "json"

    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        from .control import connect_bus

        bus = await connect_bus(stage(), "status")
        try:
            rows = None if refresh else await _status_service(bus, "status", all=all_)
            if rows is None:
                rows = [c.as_dict() for c in await _clusters_from_log(bus, all_)]
            return [cluster_row(r) for r in rows], (await _managed_rows(bus) if with_managed else None)
        finally:
            await bus.close()

    managed: list[dict[str, Any]] | None = None
    if refreshed is not None:
        rows = [cluster_row(r) for r in refreshed]
    elif t is not None:
        from . import via_api

        rows = [cluster_row(r) for r in via_api.status_rows(t, all_, all_users)]
    else:
        rows, managed = run_async(run())
    if not all_:
        rows = [r for r in rows if r["status"] != "TERMINATED"]
    missing: list[str] = []
    if clusters:
        missing = [p for p in clusters if not any(fnmatch.fnmatchcase(r["name"] or "", p) for r in rows)]
        rows = [r for r in rows if any(fnmatch.fnmatchcase(r["name"] or "", p) for p in clusters)]
    # Newest first, the same order whichever answered (the status service or the log) and after
    # a restart: launch time, then name.
    rows.sort(key=lambda r: r["name"] or "")
    rows.sort(key=lambda r: str(r["launched_at"] or "~"), reverse=True)  # not launched yet: the newest
    if missing:  # as sky: the names asked for that are not there, on stderr
        typer.echo(f"Cluster(s) not found: {', '.join(missing)}.", err=True)
    if output == "json":
        print_json(rows)
        return
    if managed is None:
        managed = _managed_in_progress(t) if show_managed_jobs else []
    if not rows:
        if not missing:
            print_line("No existing clusters.")
        _print_managed(managed)
        return
    now = datetime.now(timezone.utc)
    from .tables import since

    def line(r: dict[str, Any]) -> list[str]:
        where = "/".join(str(p) for p in (r["infra"], r["region"], r["zone"]) if p)
        acc = ", ".join(f"{k}:{v:g}" for k, v in (r["accelerators"] or {}).items()) if isinstance(r["accelerators"], dict) else ""
        res = f"{r['num_nodes']}x {r['instance_type'] or r['infra'] or ''}" + (f" ({acc})" if acc else "") + (
            " [spot]" if r["use_spot"] else "")
        auto = "-" if r["autostop"] is None else f"{r['autostop']}m" + (" (down)" if r["autodown"] else "")
        return [r["name"], since(parse_time(r["launched_at"]), now), where, res, r["status"] or "-", auto,
                _fmt_price(r["hourly_price_micros"])]

    columns = ("NAME", "LAUNCHED", "INFRA", "RESOURCES", "STATUS", "AUTOSTOP", "$/HOUR")
    if verbose:
        names = [r["name"] for r in rows]
        details = _api_details(t, names) if t is not None else run_async(_cluster_details(names))
        print_table((*columns, "USER", "HEAD IP", "PORTS"),
                    [[*line(r), r["user"] or "-", details.get(r["name"], ("-", "-"))[0],
                      details.get(r["name"], ("-", "-"))[1]] for r in rows])
    else:
        print_table(columns, [line(r) for r in rows])
    _print_managed(managed)


async def _cluster_details(names: list[str]) -> dict[str, tuple[str, str]]:
    """name -> (head IP, ports), from the log (`status -v`)."""
    from .clusterlog import read_cluster
    from .control import connect_bus

    bus = await connect_bus(stage(), "status")
    try:
        out = {}
        for n in names:
            c = await read_cluster(bus, n)
            out[n] = (c.head_ip or "-", ",".join(c.ports) or "-")
        return out
    finally:
        await bus.close()


def _api_details(t: Any, names: list[str]) -> dict[str, tuple[str, str]]:
    """name -> (head IP, ports), from the server's cluster rows (`status -v` through a server)."""
    out = {}
    for n in names:
        c = _api_cluster(t, n)
        out[n] = (c.head_ip or "-", ",".join(c.ports) or "-")
    return out


def _api_cluster(t: Any, name: str) -> Any:
    """What `_addresses` reads of a cluster, from GET /api/v1/clusters/{name} (no such: status None)."""
    from types import SimpleNamespace

    from .apitransport import ApiError

    try:
        row = t.get(f"/api/v1/clusters/{name}")
    except ApiError as exc:
        if exc.status != 404:
            raise fail(str(exc))
        row = {}
    return SimpleNamespace(status=row.get("status"), head_ip=row.get("head_ip"),
                           ports=tuple(str(p) for p in row.get("ports") or ()))


def expand_ports(ports: tuple[str, ...]) -> list[int]:
    """`8080`, `8000-8010` -> every port, in order, once (events/addresses.py)."""
    from skypurza.events.addresses import expand_ports as expand

    return expand(ports)


def _addresses(clusters: list[str], *, ip: bool, endpoint: int | None, t: Any = None) -> int:
    """`status --ip | --endpoints | --endpoint PORT` of exactly one cluster, as sky prints them."""
    flag = "--ip" if ip else ("--endpoint" if endpoint is not None else "--endpoints")
    if len(clusters) != 1 or any(ch in clusters[0] for ch in "*?["):
        raise fail(f"{flag} needs exactly one cluster name (e.g. spz status {flag} mycluster)", 2)
    name = clusters[0]

    async def run() -> Any:
        from .clusterlog import read_cluster
        from .control import connect_bus

        bus = await connect_bus(stage(), "status")
        try:
            return await read_cluster(bus, name)
        finally:
            await bus.close()

    c = _api_cluster(t, name) if t is not None else run_async(run())
    if c.status not in ("UP", "INIT", "STOPPED"):
        raise fail(f"cluster {name} not found" + (" (it was terminated)" if c.status == "TERMINATED" else ""))
    if c.status != "UP" or not c.head_ip:
        raise fail(f"cluster {name} is {c.status}: it has no address until it is UP")
    if ip:
        typer.echo(c.head_ip)
        return 0
    ports = expand_ports(c.ports)
    if endpoint is not None:
        if endpoint not in ports:
            raise fail(f"port {endpoint} is not open on cluster {name}" +
                       (f" (open: {', '.join(c.ports)})" if c.ports else " (it opens none: launch with --ports)"))
        typer.echo(f"{c.head_ip}:{endpoint}")
        return 0
    if not ports:
        typer.echo(f"Cluster {name} opens no ports (launch it with --ports, or resources.ports in the task).", err=True)
        return 0
    for port in ports:
        typer.echo(f"{port}: {c.head_ip}:{port}")
    return 0


def _managed_in_progress(t: Any = None) -> list[dict[str, Any]]:
    """The managed jobs not yet ended (`status --show-managed-jobs`, sky's default), read from the log
    (through an API server `t`: its GET /api/v1/jobs)."""
    if t is not None:
        from .apitransport import ApiError
        from .jobrows import queue_row

        try:
            return [queue_row(r) for r in t.get("/api/v1/jobs", skip_finished=True)["jobs"]]
        except ApiError as exc:
            raise fail(str(exc))

    async def run() -> list[dict[str, Any]]:
        from .control import connect_bus

        bus = await connect_bus(stage(), "status")
        try:
            return await _managed_rows(bus)
        finally:
            await bus.close()

    return run_async(run())


async def _managed_rows(bus: Any) -> list[dict[str, Any]]:
    """The managed jobs not yet ended: the status service's projection, else the log's fold."""
    from .jobrows import projected_jobs, queue_row

    rows = await projected_jobs(bus, skip_finished=True)
    if isinstance(rows, list):
        from skypurza.events.managed_events import TERMINAL_STATUSES

        return [queue_row(r) for r in rows if r.get("status") not in TERMINAL_STATUSES]
    from skypurza.services.recovery.submit import read_jobs  # the fold of the log: only when no service answers

    jobs = await read_jobs(bus)
    return [queue_row(s.summary()) for _, s in sorted(jobs.items(), reverse=True) if not s.terminal]


def _print_managed(jobs: list[dict[str, Any]]) -> None:
    if not jobs:
        return
    print_line("")
    print_table(("ID", "NAME", "STATUS", "CLUSTER"),
                [[str(j["id"]), j["name"] or "-", j["status"] or "-", j["cluster"] or "-"] for j in jobs[:10]],
                title=f"[bold]Managed jobs in progress[/bold] ({len(jobs)}; spz jobs queue shows them all)")


def _print_reconcile(report: dict[str, Any], to_stderr: bool) -> None:
    """What reconciliation found, in words (on stderr when stdout is JSON for a script)."""
    from .console import console as make_console

    console = make_console(stderr=to_stderr)
    checked = ", ".join(f"{infra} ({', '.join(regions) or 'all regions'})" for infra, regions in
                        (report.get("checked") or {}).items()) or "nothing"
    console.print(f"Reconciled with: {checked}.")
    for o in report.get("orphans") or []:
        what = "terminated" if o.get("terminated") else "reported"
        console.print(f"[yellow]Orphan[/yellow] {o.get('instance_id')} ({o.get('instance_type') or '?'}, "
                      f"{o.get('region') or '?'}, tag cluster={o.get('cluster') or '-'}): {what}."
                      + ("" if o.get("terminated") else " Terminate with: spz status --refresh --terminate-orphans"))
    for cluster, ids in (report.get("vanished") or {}).items():
        console.print(f"[yellow]Vanished[/yellow]: cluster {cluster} lost {', '.join(ids)}.")
    for infra, message in (report.get("errors") or {}).items():
        console.print(f"[red]Could not check {infra}[/red]: {message}")


def queue_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Clusters to show (default: every existing cluster)."),
    skip_finished: bool = typer.Option(False, "-s", "--skip-finished", help="Only pending and running jobs."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
    all_users: bool = options.all_users_option(),
) -> None:
    """Show the job queue of clusters: each job's id, name, user, times and status."""
    check_output(output)
    from .transport import api

    t = api()
    if t is None:
        options.all_users_note(all_users)

    async def run() -> list[dict[str, Any]]:
        from .clusterlog import read_cluster
        from .control import connect_bus

        bus = await connect_bus(stage(), "queue")
        try:
            names = list(clusters or [])
            for n in names:
                c = await read_cluster(bus, n)
                if c.status is None and not c.jobs:
                    raise fail(f"no cluster named {n}")
            if not names:
                names = [c.name for c in await _clusters_from_log(bus, False)]
            if not names:
                return []
            rows = await _status_service(bus, "queue", clusters=names)
            if rows is None:
                rows = []
                for n in names:
                    c = await read_cluster(bus, n)
                    rows += [{"cluster": n, **j.as_dict()} for j in sorted(c.jobs.values(), key=lambda j: -j.job_id)]
            return [job_row(r) for r in rows]
        finally:
            await bus.close()

    if t is not None:
        from . import via_api

        rows = [job_row(r) for r in via_api.queue_rows(t, list(clusters or []), all_users)]
    else:
        rows = run_async(run())
    if skip_finished:
        from .clusterlog import TERMINAL_JOB

        rows = [r for r in rows if r.get("status") not in TERMINAL_JOB]
    if output == "json":
        print_json(rows)
        return
    from .tables import duration, since

    now = datetime.now(timezone.utc)
    by_cluster: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_cluster.setdefault(r["cluster"], []).append(r)
    if not by_cluster:
        print_line("No jobs.")
    for cname, jobs in by_cluster.items():
        print_table(("ID", "NAME", "USER", "SUBMITTED", "STARTED", "DURATION", "NODES", "RESOURCES", "STATUS"),
                    [[str(r.get("job_id")), r.get("name") or "-", r.get("user") or "-",
                      since(parse_time(r.get("submitted_at")), now), since(parse_time(r.get("started_at")), now),
                      duration(parse_time(r.get("started_at")), parse_time(r.get("ended_at")), now),
                      str(r.get("num_nodes") or 1), r.get("resources") or "-", str(r.get("status"))]
                     for r in sorted(jobs, key=lambda r: -int(r.get("job_id") or 0))],
                    title=f"[bold]Job queue of cluster {cname}[/bold]")


# ------------------------------------------------------------------------------------------ cancel

def cancel_command(
    cluster: str = typer.Argument(..., callback=bounds.cluster_argument, help="The cluster."),
    job_ids: Optional[list[int]] = typer.Argument(None, parser=bounds.JOB_ID, help="Jobs to cancel (default: the latest unfinished one)."),
    all_: bool = typer.Option(False, "-a", "--all", help="Cancel every unfinished job on the cluster."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    async_: bool = options.async_option("Do not wait for the jobs to stop."),
    all_users: bool = options.all_users_option(),
) -> None:
    """Cancel jobs: their whole process groups get SIGTERM, then SIGKILL after a grace period."""
    if all_ and job_ids:
        raise fail("give job ids or --all, not both")
    from .transport import api

    t = api()
    if t is not None:
        from . import via_api

        raise typer.Exit(via_api.cancel(t, cluster, list(job_ids or []), all_, yes, async_, WAIT_S))
    options.all_users_note(all_users)

    async def run() -> int:
        from skypurza.events.job_events import CancelRequested

        from .clusterlog import read_cluster
        from .control import connect_bus
        from .jobwatch import merged_follow

        bus = await connect_bus(stage(), "cancel")
        try:
            c = await read_cluster(bus, cluster)
            if c.status is None and not c.jobs:
                raise fail(f"no cluster named {cluster}")
            from skypurza.events.verbs import cancel_targets

            choice = cancel_targets(c.jobs, job_ids or (), all_)
            if choice.missing:
                raise fail(f"no job {', '.join(map(str, choice.missing))} on cluster {cluster}")
            for j in choice.ended:
                typer.echo(f"Job {j} already ended ({c.jobs[j].status}).")
            targets = [c.jobs[j] for j in choice.targets]
            if not targets:
                typer.echo(f"No unfinished jobs to cancel on cluster {cluster}.")
                return 0
            ids = [j.job_id for j in targets]
            _confirm(f"Cancel job(s) {', '.join(map(str, ids))} on cluster {cluster}?", yes or bool(job_ids))
            cfg = _config()
            for j in ids:
                await bus.publish(CancelRequested(cluster=cluster, job_id=j, requested_by=cfg.user))
            if async_:
                typer.echo(f"Cancellation of job(s) {', '.join(map(str, ids))} requested.")
                return 0
            from skypurza.events import naming
            import asyncio

            pending = set(ids)
            results: dict[int, str] = {}

            async def watch() -> None:
                from .clusterlog import apply

                async for s in merged_follow(bus, [naming.aggregate_subjects(bus.stage, "cluster", cluster)],
                                             c.last_seq + 1):
                    if s.event is None or s.envelope is None:
                        continue
                    apply(c, s.event, s.envelope.time)
                    for j in list(pending):
                        if c.jobs[j].terminal:
                            results[j] = c.jobs[j].status
                            pending.discard(j)
                    if not pending:
                        return

            try:
                await asyncio.wait_for(watch(), WAIT_S)
            except asyncio.TimeoutError:
                pass
            for j in ids:
                typer.echo(f"Job {j}: {results.get(j, 'cancellation requested, not confirmed yet')}")
            return 0 if not pending else 1
        finally:
            await bus.close()

    raise typer.Exit(run_async(run()))


def register(app: typer.Typer) -> None:
    """Add `status`, `queue`, `logs` and `cancel` to the spz app (cli/commandtable.py)."""
    app.command("status")(status_command)
    app.command("queue")(queue_command)
    app.command("logs")(logs_command)
    app.command("cancel")(cancel_command)
