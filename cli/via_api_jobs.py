"""`spz jobs launch|queue|cancel|logs` and `spz cost-report` through a configured API server
(cli/transport.py), printing what their embedded forms print and exiting with the same codes.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, Callable

import typer

from .apitransport import ApiError, ApiTransport
from .context import fail

POLL_S = 1.0


def _fail(exc: ApiError) -> typer.Exit:
    return fail(str(exc))


def queue_rows(t: ApiTransport, skip_finished: bool, all_users: bool) -> list[dict[str, Any]]:
    from .jobrows import queue_row

    try:
        rows = t.get("/api/v1/jobs", skip_finished=skip_finished, all_users=all_users)["jobs"]
    except ApiError as exc:
        raise _fail(exc)
    return [queue_row(r) for r in rows]


def on_infra(t: ApiTransport, rows: list[dict[str, Any]], infra: str) -> list[dict[str, Any]]:
    """`jobs queue --infra` through the server: where each job's cluster is, from its row."""
    from .jobrows import on_infra as keep

    where: dict[str, tuple[Any, ...]] = {}
    for name in {r.get("cluster") for r in rows if r.get("cluster")}:
        try:
            c = t.get(f"/api/v1/clusters/{name}")
        except ApiError as exc:
            if exc.status != 404:  # a cluster gone since: not on any infra
                raise _fail(exc)
            continue
        where[name] = (c.get("infra"), c.get("region"), c.get("zone"))
    return keep(rows, infra, where)


def cancel(t: ApiTransport, job_ids: list[int], name: str | None, all_: bool, yes: bool, async_: bool,
           wait_s: float, all_users: bool) -> int:
    from skypurza.events.managed_events import TERMINAL_STATUSES

    from .verbs import _confirm

    # Named ids are looked up among everyone's (cancelling another's is the server's to refuse,
    # saying why); -n and --all pick among the caller's own, or everyone's with -u.
    rows = {int(r["id"]): r for r in queue_rows(t, False, all_users or bool(job_ids)) if r.get("id") is not None}
    if job_ids:
        missing = [j for j in job_ids if j not in rows]
        if missing:
            raise fail(f"no managed job {', '.join(map(str, missing))}")
        targets = [j for j in job_ids if rows[j]["status"] not in TERMINAL_STATUSES]
        for j in job_ids:
            if rows[j]["status"] in TERMINAL_STATUSES:
                typer.echo(f"Managed job {j} already ended ({rows[j]['status']}).")
    else:
        targets = sorted(j for j, r in rows.items() if r["status"] not in TERMINAL_STATUSES and (
            name is None or r.get("name") == name))
    if not targets:
        typer.echo("Nothing to cancel.")
        return 0
    _confirm(f"Cancel managed job(s) {', '.join(map(str, targets))}?", yes)
    for j in targets:
        try:
            t.post(f"/api/v1/jobs/{j}/cancel")
        except ApiError as exc:
            if exc.status != 409:  # it ended meanwhile: what the wait below reports
                raise _fail(exc)
    if async_:
        typer.echo(f"Cancellation requested for {', '.join(map(str, targets))}.")
        return 0
    deadline = time.monotonic() + wait_s
    while True:
        now = {int(r["id"]): r for r in queue_rows(t, False, True) if r.get("id") in targets}
        if all(now.get(j, {}).get("status") in TERMINAL_STATUSES for j in targets):
            break
        if time.monotonic() > deadline:
            raise fail("the jobs did not end in time; see spz jobs queue")
        time.sleep(POLL_S)
    for j in targets:
        typer.echo(f"Managed job {j}: {now[j]['status']}.")
    return 0


def follow(t: ApiTransport, job_id: int, out: Callable[[str], None], *, follow: bool, status: Any = None,
           tail: int = 0) -> str | None:
    """The managed job's output over the server's stream (each launch under a header), as
    cmd_jobs.follow_job prints it from the bus; its status (None: no such job)."""
    from skypurza.events.logchunks import LogLine, format_line

    from .jobrows import final_note as _final_note

    if follow:
        from . import lostplane

        lostplane.still_running(f"managed job {job_id} keeps running on its cluster; "
                                f"follow it with spz jobs logs {job_id}")
    header: dict[str, str] = {}  # cluster -> its launch header, printed before its first line
    nodes: dict[str, int] = {}
    cluster = ""
    end: dict[str, Any] = {}
    try:
        for event, data in t.frames(f"/api/v1/jobs/{job_id}/logs", follow=follow, tail=tail):
            if event == "launch":
                cluster = str(data.get("cluster") or "")
                header[cluster] = f"── launch {data.get('launch')}: cluster {cluster} ──"
                nodes[cluster] = _nodes(t, cluster)
            elif event == "line":
                if cluster in header:
                    out(header.pop(cluster))
                line = LogLine(seq=0, ts=str(data.get("ts") or ""), rank=int(data.get("rank") or 0),
                               stream=str(data.get("stream") or "run"), line=str(data.get("line") or ""))
                out(format_line(line, nodes.get(cluster, 1)))
            elif event == "error":
                raise fail(f"the API server: {data.get('detail')}")
            elif event == "end":
                end = data
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise _fail(exc)
    final = end.get("status")
    from skypurza.events.managed_events import TERMINAL_STATUSES

    _final_note(status, job_id, SimpleNamespace(status=final, reason=end.get("reason"),
                                                terminal=final in TERMINAL_STATUSES))
    return final


def _nodes(t: ApiTransport, cluster: str) -> int:
    try:
        return int(t.get(f"/api/v1/clusters/{cluster}").get("num_nodes") or 1)
    except ApiError:
        return 1


def logs(t: ApiTransport, job_id: int | None, name: str | None, follow_: bool, tail: int, status: Any,
         out: Callable[[str], None]) -> int:
    from skypurza.events.fold import EXIT_NOT_FOUND, exit_code_of

    target = job_id
    if target is None:
        matching = sorted(int(r["id"]) for r in queue_rows(t, False, True) if name is None or r.get("name") == name)
        if not matching:
            status.note("No managed jobs" + (f" named {name}." if name else "."))
            return EXIT_NOT_FOUND
        target = matching[-1]
    final = follow(t, target, out, follow=follow_, status=status if follow_ else None, tail=tail)
    if final is None:
        status.note(f"[red]No managed job {target}.[/red]")
        return EXIT_NOT_FOUND
    return exit_code_of(final) if follow_ else 0


def launch(t: ApiTransport, job_name: str, task: Any, public: dict[str, Any], *, detach_run: bool, status: Any,
           out: Callable[[str], None], workspace: str | None = None) -> tuple[int, dict[str, Any]]:
    from skypurza.events.fold import exit_code_of

    body: dict[str, Any] = {"task": {k: v for k, v in public.items() if k != "secrets"}, "name": job_name}
    if workspace:
        body["workspace"] = workspace
    if task.secret_values():
        body["overrides"] = {"secrets": task.secret_values()}
    status.update("Submitting to the API server")
    try:
        sub = t.post("/api/v1/jobs", body)
    except ApiError as exc:
        raise _fail(exc)
    job_id = int(sub["job_id"])
    summary: dict[str, Any] = {"id": job_id, "name": sub.get("name") or job_name, "task_ids": sub.get("task_ids")}
    status.note(f"Managed job {job_id} ({summary['name']}) submitted.")
    if detach_run:
        status.note(f"Follow it: spz jobs logs {job_id}; see it: spz jobs queue; cancel it: spz jobs cancel {job_id}")
        summary["status"] = "PENDING"
        return 0, summary
    final = follow(t, job_id, out, follow=True, status=status)
    summary["status"] = final
    return exit_code_of(final), summary


def cost_report(t: ApiTransport, by: str, since: str | None, until: str | None) -> dict[str, Any]:
    """The ledger's report as `spz cost-report` prints it (an admin's: every line; a member's:
    their team's, by team); the server's `scope` is said on stderr, not mixed into the report."""
    try:
        rep = t.get("/api/v1/cost-report", by=by, since=since, until=until)
    except ApiError as exc:
        raise _fail(exc)
    scope = rep.pop("scope", None)
    if scope and scope != "all":
        typer.echo(f"Through {t.url}: {scope} only (another team's lines are for admins).", err=True)
    return rep
