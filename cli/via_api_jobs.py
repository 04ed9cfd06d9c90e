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


def job_body(job_name: str, tasks: list[Any], publics: list[dict[str, Any]], header: dict[str, Any],
             num_jobs: int = 1, workspace: str | None = None) -> dict[str, Any]:
    """POST /api/v1/jobs's body for a launch: one task as an object (its secrets as overrides),
    several (a pipeline, a job group) as the YAML documents the server loads again (a header,
    then each task with its own secrets)."""
    body: dict[str, Any] = {"name": job_name}
    if len(tasks) == 1 and not header:
        body["task"] = {k: v for k, v in publics[0].items() if k != "secrets"}
        if tasks[0].secret_values():
            body["overrides"] = {"secrets": tasks[0].secret_values()}
    else:
        import yaml

        docs = [header or {"name": job_name}]
        for task, public in zip(tasks, publics):
            doc = {k: v for k, v in public.items() if k != "secrets"}
            if task.secret_values():
                doc["secrets"] = task.secret_values()
            docs.append(doc)
        body["task"] = yaml.safe_dump_all(docs, sort_keys=False)
    if num_jobs > 1:
        body["num_jobs"] = num_jobs
    if workspace:
        body["workspace"] = workspace
    return body


def launch_many(t: ApiTransport, plans: list[Any], body: dict[str, Any], *, output: str,
                detach_run: bool) -> int:
    """fanout.launch_many through the server: it submits every job (all or none), then each is
    followed over its logs stream, lines labelled, and the exit status decided as on the bus."""
    from concurrent.futures import ThreadPoolExecutor

    from .fanout import LIVE_FOLLOWERS, finish
    from .progress import StatusLine, echo_err, echo_out

    status = StatusLine()
    out = echo_err if output == "json" else echo_out
    submitted: list[int] = []
    try:
        status.update(f"Submitting {len(plans)} managed jobs to the API server")
        try:
            summaries = list(t.post("/api/v1/jobs", body).get("jobs") or [])
        except ApiError as exc:
            raise _fail(exc)
        for s in summaries:
            submitted.append(int(s["id"]))
            status.note(f"Managed job {s['id']} ({s['name']}) submitted.")
        ids = " ".join(map(str, submitted))
        if detach_run:
            status.note(f"See them: spz jobs queue; follow one: spz jobs logs ID; cancel them: spz jobs cancel {ids}")
            code = 0
        else:
            status.update(f"Following {len(submitted)} managed jobs")
            with ThreadPoolExecutor(max_workers=max(1, min(LIVE_FOLLOWERS, len(submitted)))) as pool:
                finals = list(pool.map(lambda jp: follow(t, jp[0], lambda line: out(f"({jp[1].label}) {line}"),
                                                         follow=True), zip(submitted, plans)))
            status.stop()
            code = finish(status, summaries, finals)
    except KeyboardInterrupt:
        status.stop()
        if submitted:
            ids = " ".join(map(str, submitted))
            status.note(f"\nDetached (Ctrl-C): managed jobs {ids} keep running. See them: spz jobs queue; "
                        f"cancel them: spz jobs cancel {ids}")
        else:
            status.note("\nStopped (Ctrl-C) before the server answered: see spz jobs queue for what it submitted.")
        raise typer.Exit(130)
    finally:
        status.stop()
    if output == "json":
        from .context import print_json

        print_json(summaries)
    return code


def launch(t: ApiTransport, job_name: str, task: Any, public: dict[str, Any], *, detach_run: bool, status: Any,
           out: Callable[[str], None], workspace: str | None = None,
           body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """One managed job (a task; a pipeline given as `body`, job_body's) submitted and followed."""
    from skypurza.events.fold import exit_code_of

    body = body or job_body(job_name, [task], [public], {}, workspace=workspace)
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


def cost_report(t: ApiTransport, by: str, since: str | None, until: str | None, *,
                workspace: str | None = None) -> dict[str, Any]:
    """The ledger's report as `spz cost-report` prints it (an admin's: every line; a member's:
    their team's, by team; `-w TEAM`: that team's, a team of theirs); the server's `scope` is
    said on stderr, not mixed into the report."""
    try:
        rep = t.get("/api/v1/cost-report", by=by, since=since, until=until, workspace=workspace)
    except ApiError as exc:
        raise _fail(exc)
    scope = rep.pop("scope", None)
    rep.pop("team", None)  # the ledger's cut, said in `scope`: the report is printed as on the bus
    if scope and scope != "all":
        typer.echo(f"Through {t.url}: {scope} only (another team's lines are for admins).", err=True)
    return rep
