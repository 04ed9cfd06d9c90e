"""`spz logs --provision/--autostop/--sync-down`, `spz jobs logs --controller/--sync-down` and
`spz status -r` through a configured API server.

The same facts as on the embedded bus, asked of the server's routes instead of read from the
log (services/api/routes_history.py, routes_reconcile.py); cli/cmd_inspect.py prints them the
same way whichever answered. A refusal is one line (cli/via_api.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skypurza.events.clusterhistory import MAX_LOG_FILE_BYTES, log_file_name

from .apitransport import ApiError, ApiTransport
from .context import fail


def history(t: ApiTransport, cluster: str, kind: str) -> list[str]:
    """The cluster's `provision` or `autostop` history lines (none for a cluster the server does not know)."""
    lines: list[str] = []
    try:
        for event, data in t.frames(f"/api/v1/clusters/{cluster}/history/{kind}"):
            if event == "line":
                lines.append(str(data.get("line") or ""))
    except ApiError as exc:
        if exc.status == 404:
            return []
        raise fail(str(exc))
    return lines


def sync_down(t: ApiTransport, cluster: str, job_id: int | None, dest_root: Path,
              max_bytes: int = MAX_LOG_FILE_BYTES) -> tuple[int | None, list[Path], list[Path]]:
    """Download the job's log files (a file per node that printed something) under
    `dest_root/CLUSTER/JOB/`: (the job, the files, those cut at `max_bytes`); the job is None
    when there is no such job."""
    from . import via_api

    rows = via_api._jobs(t, cluster)
    by_id = {int(r["job_id"]): r for r in rows or [] if r.get("job_id") is not None}
    if job_id is None and by_id:
        job_id = max(by_id)
    job = by_id.get(job_id) if job_id is not None else None
    if job is None or job_id is None:
        return None, [], []
    _, files, cut = _files_of(t, cluster, job_id, int(job.get("num_nodes") or 1), dest_root / cluster / str(job_id),
                              max_bytes)
    return job_id, files, cut


def _files_of(t: ApiTransport, cluster: str, job_id: int, nodes: int, dest: Path,
              max_bytes: int = MAX_LOG_FILE_BYTES) -> tuple[int, list[Path], list[Path]]:
    """Each node's file of the job downloaded into `dest` (none for a node that printed nothing):
    (the job, the files, those cut at `max_bytes`)."""
    dest.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    cut: list[Path] = []
    for rank in range(max(nodes, 1)):
        path = dest / log_file_name(rank)
        part = path.with_name(path.name + ".part")
        try:
            with part.open("wb") as sink:
                written, was_cut = t.download(f"/api/v1/clusters/{cluster}/jobs/{job_id}/logs/files/{rank}", sink,
                                              max_bytes, max_bytes=max_bytes)
        except ApiError as exc:
            part.unlink(missing_ok=True)
            raise fail(str(exc))
        if written == 0:  # as on the bus: a node that printed nothing has no file
            part.unlink(missing_ok=True)
            continue
        part.replace(path)
        files.append(path)
        if was_cut:
            cut.append(path)
    return job_id, files, cut


def refresh(t: ApiTransport, terminate_orphans: bool, include_terminated: bool,
            all_users: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The server's reconciliation (the provisioner's pass): (the report, the refreshed clusters)."""
    try:
        got = t.post("/api/v1/reconcile", {"terminate_orphans": terminate_orphans, "all_users": all_users,
                                           "include_terminated": include_terminated})
    except ApiError as exc:
        raise fail(str(exc))
    return dict(got.get("report") or {}), list(got.get("clusters") or [])


def managed_records(t: ApiTransport, job_id: int | None, name: str | None, *, controller: bool,
                    dest_root: Path) -> int:
    """`spz jobs logs --controller` / `--sync-down` through the server, printing what the
    embedded `cmd_jobs._job_records` prints: the job's recovery events, or its output written
    under `dest_root/managed_jobs/ID/CLUSTER/JOB/rank-N.log`."""
    import typer

    from skypurza.events.fold import EXIT_NOT_FOUND

    from .via_api_jobs import queue_rows

    target = job_id
    if target is None:
        matching = sorted(int(r["id"]) for r in queue_rows(t, False, True) if name is None or r.get("name") == name)
        target = matching[-1] if matching else None
    missing = "No managed job" + (f" {job_id}" if job_id else (f" named {name}" if name else "s")) + "."
    try:
        if target is None:
            typer.echo(missing, err=True)
            return EXIT_NOT_FOUND
        if controller:
            for event, data in t.frames(f"/api/v1/jobs/{target}/controller"):
                if event == "line":
                    typer.echo(str(data.get("line") or ""))
            return 0
        listing = t.get(f"/api/v1/jobs/{target}/logs/files")
    except ApiError as exc:
        if exc.status == 404:
            typer.echo(missing, err=True)
            return EXIT_NOT_FOUND
        raise fail(str(exc))
    base = dest_root / "managed_jobs" / str(target)
    written: list[Path] = []
    cut: list[Path] = []
    for c in listing.get("clusters") or []:
        for job in c.get("jobs") or []:
            got, files, was_cut = _files_of(t, str(c["cluster"]), int(job["job_id"]), int(job.get("num_nodes") or 1),
                                            base / str(c["cluster"]) / str(job["job_id"]))
            written += files
            cut += was_cut
    if not written:
        typer.echo(f"Managed job {target} has printed nothing yet.")
        return 0
    typer.echo(f"Managed job {target}'s logs: {base}")
    for f in written:
        typer.echo(f"  {f}")
    for f in cut:
        typer.echo(f"{f}: cut at {MAX_LOG_FILE_BYTES // 2**20} MiB (the most the API server sends of one file); "
                   "spz jobs logs prints all of it", err=True)
    return 0
