"""The verbs through a configured API server (cli/transport.py picks this or the embedded bus).

Each prints what its embedded form prints (the same sentences, on the same stream) and exits
with the same code; only how it learns the facts differs: the server's routes (docs/team.md)
instead of the log. Waiting for an outcome polls the cluster's row (bounded by the verb's
--timeout); a job's output and a launch's progress come as server-sent events.

A refusal is one line: 401 (the token), 403 (the server's reason: whose it is and the role
needed), 404/409/422 (the server's detail); an unreachable server says so.
"""

from __future__ import annotations

import fnmatch
import json
import time
from types import SimpleNamespace
from typing import Any, Callable

import typer

from .apitransport import ApiError, ApiTransport
from .context import fail

POLL_S = 1.0


def _fail(exc: ApiError) -> typer.Exit:
    return fail(str(exc))


def _cluster(t: ApiTransport, name: str) -> dict[str, Any] | None:
    """The cluster's row, None when the server knows no such cluster."""
    try:
        return t.get(f"/api/v1/clusters/{name}")
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise _fail(exc)


def _jobs(t: ApiTransport, name: str) -> list[dict[str, Any]] | None:
    try:
        return [{"cluster": name, **j} for j in t.get(f"/api/v1/clusters/{name}/jobs")["jobs"]]
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise _fail(exc)


# ----------------------------------------------------------------------------------- status, queue

def status_rows(t: ApiTransport, include_terminated: bool, all_users: bool) -> list[dict[str, Any]]:
    try:
        return list(t.get("/api/v1/clusters", all_users=all_users,
                          include_terminated=include_terminated)["clusters"])
    except ApiError as exc:
        raise _fail(exc)


def queue_rows(t: ApiTransport, clusters: list[str], all_users: bool) -> list[dict[str, Any]]:
    names = list(clusters)
    rows: list[dict[str, Any]] = []
    for n in names:
        got = _jobs(t, n)
        if got is None:
            raise fail(f"no cluster named {n}")
        rows += got
    if not names:
        for c in status_rows(t, False, all_users):
            rows += _jobs(t, c["name"]) or []
    return rows


# --------------------------------------------------------------------------------- lifecycle verbs

def _targets(t: ApiTransport, patterns: list[str], all_: bool, all_users: bool) -> list[dict[str, Any]]:
    """The clusters named (globs allowed) or all, as the embedded `_resolve` picks them."""
    globbed = all_ or any(any(ch in p for ch in "*?[") for p in patterns)
    known = status_rows(t, False, all_users) if globbed else []
    if all_:
        return known
    chosen: list[dict[str, Any]] = []
    for p in patterns:
        if any(ch in p for ch in "*?["):
            matched = [c for c in known if fnmatch.fnmatchcase(c["name"], p)]
            if not matched:
                raise fail(f"no cluster matches {p!r}")
            chosen += [c for c in matched if c["name"] not in {x["name"] for x in chosen}]
            continue
        c = _cluster(t, p)
        if c is None or c.get("status") not in ("UP", "STOPPED", "INIT"):
            raise fail(f"no cluster named {p}" + (" (it was terminated)" if c and c.get("status") == "TERMINATED"
                                                   else ""))
        chosen.append(c)
    return chosen


def _graceful(t: ApiTransport, targets: list[dict[str, Any]], timeout: float) -> None:
    """`--graceful` as on the bus: cancel the clusters' unfinished jobs, wait (at most `timeout`
    s) until they have ended, then go on to the stop or the teardown."""
    from .clusterlog import TERMINAL_JOB

    open_jobs: dict[str, list[int]] = {}
    for c in targets:
        ids = [int(j["job_id"]) for j in (_jobs(t, c["name"]) or []) if j.get("status") not in TERMINAL_JOB]
        open_jobs[c["name"]] = ids
        if ids:
            try:
                t.post(f"/api/v1/clusters/{c['name']}/jobs/cancel", {"job_ids": ids})
            except ApiError as exc:
                raise _fail(exc)
            typer.echo(f"Cluster {c['name']}: cancelling job(s) {', '.join(map(str, ids))} first (--graceful).")
    deadline = time.monotonic() + timeout
    for name, ids in open_jobs.items():
        while ids:
            now = _job_states(_jobs(t, name) or [])
            ids = [j for j in ids if j in now and not now[j].terminal]
            if not ids:
                break
            if time.monotonic() > deadline:
                typer.echo(f"Cluster {name}: job(s) {', '.join(map(str, ids))} still running after {timeout:.0f} s "
                           "(--graceful-timeout); going on.", err=True)
                break
            time.sleep(POLL_S / 2)


def _purge(t: ApiTransport, names: list[str]) -> None:
    """`down --purge`: the clusters whose teardown was not confirmed leave the records all the same."""
    for name in names:
        try:
            t.post(f"/api/v1/clusters/{name}/purge")
        except ApiError as exc:
            raise _fail(exc)
        typer.echo(f"Cluster {name}: purged from spz's records (--purge). Its instances may still run and cost "
                   "money: check the cloud console (or spz status --refresh for orphans).", err=True)


def lifecycle(t: ApiTransport, verb: str, clusters: list[str], all_: bool, yes: bool, async_: bool,
              timeout: float, autostop: dict[str, Any] | None = None, all_users: bool = False, *,
              graceful: bool = False, graceful_timeout: float | None = None, purge: bool = False) -> int:
    from skypurza.events.verbs import LIFECYCLE_FROM, LIFECYCLE_GOAL

    from .progress import StatusLine
    from .verbs import _confirm

    states = LIFECYCLE_FROM[verb]
    targets = _targets(t, clusters, all_, all_users)
    _only_own(t, [c for c in targets if c.get("status") in states], verb)
    for c in [c for c in targets if c.get("status") not in states]:
        typer.echo(f"Cluster {c['name']} is already {c.get('status')}.")
    targets = [c for c in targets if c.get("status") in states]
    if not targets:
        return 0
    names = ", ".join(c["name"] for c in targets)
    what = {"stop": "Stop", "start": "Start", "down": "Tear down"}[verb]
    _confirm(f"{what} cluster(s) {names}?", yes or verb == "start")
    if graceful and verb in ("stop", "down"):
        _graceful(t, targets, graceful_timeout if graceful_timeout is not None else timeout)
    for c in targets:
        try:
            t.post(f"/api/v1/clusters/{c['name']}/{verb}", autostop if verb == "start" else None)
        except ApiError as exc:
            raise _fail(exc)
    if async_:
        typer.echo(f"{what} requested for {names}.")
        return 0
    goal = LIFECYCLE_GOAL[verb]
    status = StatusLine()
    status.update(f"{what} {names}: waiting for the provisioner")
    pending = {c["name"] for c in targets}
    deadline = time.monotonic() + timeout
    try:
        while pending and time.monotonic() < deadline:
            for name in sorted(pending):
                row = _cluster_or_transient(t, name)
                if row is not None and row.get("status") == goal:
                    status.note(f"Cluster {name}: {goal}.")
                    pending.discard(name)
            if pending:
                time.sleep(POLL_S)
    finally:
        status.stop()
    for n in sorted(pending):
        typer.echo(f"Cluster {n}: {what.lower()} requested, not confirmed within {timeout:.0f}s "
                   "(see spz status and spz events dlq).", err=True)
    if purge and pending:
        _purge(t, sorted(pending))
        return 0
    return 1 if pending else 0


def _only_own(t: ApiTransport, targets: list[dict[str, Any]], verb: str) -> None:
    """Acting on another's cluster is for admins: a member's `-a -u` (or a glob) that takes in
    someone else's is refused before any is acted on, never half done."""
    if not targets:
        return
    try:
        caller = t.get("/api/v1/health").get("caller") or {}
    except ApiError as exc:
        raise _fail(exc)
    if caller.get("role") == "admin":
        return
    others = [c for c in targets if c.get("user") and c.get("user") != caller.get("user")]
    if others:
        c = others[0]
        raise fail(f"not allowed: cluster {c['name']} is {c['user']}'s; acting on another user's clusters and jobs "
                   f"is for admins (you are {caller.get('user')}, {caller.get('role')}); nothing was asked to {verb}")


def _cluster_or_transient(t: ApiTransport, name: str) -> dict[str, Any] | None:
    """The row while waiting: a server busy for a moment (503) is asked again, not fatal."""
    try:
        return t.get(f"/api/v1/clusters/{name}")
    except ApiError as exc:
        if exc.status in (503, 404):
            return None
        raise _fail(exc)


def autostop(t: ApiTransport, clusters: list[str], all_: bool, idle_minutes: int | None, down: bool,
             cancel: bool, wait_for: str | None, all_users: bool = False) -> int:
    targets = _targets(t, clusters, all_, all_users)
    if all_:
        targets = [c for c in targets if c.get("status") == "UP"]
    _only_own(t, targets, "autostop")
    for c in targets:
        body: dict[str, Any] = {"down": down}
        body.update({"cancel": True} if cancel else {"idle_minutes": idle_minutes, "wait_for": wait_for})
        try:
            t.post(f"/api/v1/clusters/{c['name']}/autostop", body)
        except ApiError as exc:
            raise _fail(exc)
        if cancel:
            typer.echo(f"Autostop of {c['name']}: off.")
        elif wait_for == "none":
            typer.echo(f"Autostop of {c['name']}: {'tear down' if down else 'stop'} in {idle_minutes} minute(s), "
                       "whatever runs (--wait-for none).")
        else:
            typer.echo(f"Autostop of {c['name']}: {'tear down' if down else 'stop'} after {idle_minutes} idle "
                       f"minute(s).")
    return 0


# ------------------------------------------------------------------------------------------ cancel

def _job_states(rows: list[dict[str, Any]]) -> dict[int, Any]:
    from .clusterlog import TERMINAL_JOB

    return {int(r["job_id"]): SimpleNamespace(status=r.get("status"), terminal=r.get("status") in TERMINAL_JOB)
            for r in rows if r.get("job_id") is not None}


def cancel(t: ApiTransport, cluster: str, job_ids: list[int], all_: bool, yes: bool, async_: bool,
           wait_s: float) -> int:
    from skypurza.events.verbs import cancel_targets

    from .verbs import _confirm

    rows = _jobs(t, cluster)
    if rows is None:
        raise fail(f"no cluster named {cluster}")
    jobs = _job_states(rows)
    choice = cancel_targets(jobs, job_ids, all_)
    if choice.missing:
        raise fail(f"no job {', '.join(map(str, choice.missing))} on cluster {cluster}")
    for j in choice.ended:
        typer.echo(f"Job {j} already ended ({jobs[j].status}).")
    ids = list(choice.targets)
    if not ids:
        typer.echo(f"No unfinished jobs to cancel on cluster {cluster}.")
        return 0
    _confirm(f"Cancel job(s) {', '.join(map(str, ids))} on cluster {cluster}?", yes or bool(job_ids))
    try:
        t.post(f"/api/v1/clusters/{cluster}/jobs/cancel", {"job_ids": ids})
    except ApiError as exc:
        raise _fail(exc)
    if async_:
        typer.echo(f"Cancellation of job(s) {', '.join(map(str, ids))} requested.")
        return 0
    results: dict[int, str] = {}
    deadline = time.monotonic() + wait_s
    while len(results) < len(ids) and time.monotonic() < deadline:
        time.sleep(POLL_S / 2)
        now = _job_states(_jobs(t, cluster) or [])
        for j in ids:
            if j in now and now[j].terminal:
                results[j] = now[j].status
    for j in ids:
        typer.echo(f"Job {j}: {results.get(j, 'cancellation requested, not confirmed yet')}")
    return 0 if len(results) == len(ids) else 1


# -------------------------------------------------------------------------------------------- logs

def logs(t: ApiTransport, cluster: str, job_id: int | None, follow: bool, status_only: bool, tail: int,
         timestamps: bool, status: Any, out: Callable[[str], None], worker: int | None = None) -> int:
    from .clusterlog import EXIT_NOT_FOUND, exit_code_of

    rows = _jobs(t, cluster)
    if rows is None:
        status.note(f"[red]No cluster named {cluster}.[/red]")
        return EXIT_NOT_FOUND
    by_id = {int(r["job_id"]): r for r in rows if r.get("job_id") is not None}
    if job_id is None:
        if not by_id:
            status.note(f"Cluster {cluster} has no jobs yet.")
            return EXIT_NOT_FOUND
        job_id = max(by_id)
    job = by_id.get(job_id)
    if status_only:
        out(f"Job {job_id}: {job['status'] if job else 'NOT FOUND'}")
        return exit_code_of(job["status"] if job else None)
    if job is None:
        status.note(f"[red]Job {job_id} not found on cluster {cluster}.[/red]")
        return EXIT_NOT_FOUND
    nodes = int(job.get("num_nodes") or 1)
    if worker is not None and worker >= max(nodes, 1):
        status.note(f"[red]Job {job_id} runs on {nodes} node(s): there is no worker {worker}.[/red]")
        return 1
    end = stream_lines(t, cluster, job_id, nodes, out, follow=follow, tail=tail, timestamps=timestamps,
                       rank=worker, status=status)
    final = end.get("status") or job.get("status")
    status.stop()
    done = _finished(t, cluster, job_id, final, end)
    if done.terminal and follow:
        from .verbs import _report_job

        _report_job(status, cluster, done)
    return exit_code_of(final) if follow or done.terminal else 0


def _finished(t: ApiTransport, cluster: str, job_id: int, final: str | None,
              end: dict[str, Any] | None = None) -> Any:
    """The job as `_report_job` reads it (status, reason): from the logs stream's `end` frame,
    else (a server whose frame has no reason) from the queue once it has ended."""
    from .clusterlog import TERMINAL_JOB

    if end is not None and "reason" in end and end.get("status") == final:
        reason = end.get("reason")
    else:
        row = next((r for r in (_jobs(t, cluster) or []) if r.get("job_id") == job_id), {})
        reason = row.get("reason") if row.get("status") == final else None
    return SimpleNamespace(job_id=job_id, status=final, terminal=final in TERMINAL_JOB, reason=reason)


def stream_lines(t: ApiTransport, cluster: str, job_id: int, nodes: int, out: Callable[[str], None], *,
                 follow: bool = True, tail: int = 0, timestamps: bool = False, rank: int | None = None,
                 status: Any = None) -> dict[str, Any]:
    """Print the job's output as `spz logs` does on the bus (the same prefixes, partial lines and
    carriage returns joined); the `end` frame's data."""
    from skypurza.events.logchunks import LogLine, format_line

    from .logrender import Render, show, with_text

    if follow:
        from . import lostplane

        lostplane.still_running(f"job {job_id} keeps running on cluster {cluster}; "
                                f"follow it with spz logs {cluster} {job_id}")
    render = Render(lambda ln, text: format_line(with_text(ln, text), nodes, timestamps))
    progress = status.update if follow and status is not None and getattr(status, "live", False) else None
    end: dict[str, Any] = {}
    try:
        for event, data in t.frames(f"/api/v1/clusters/{cluster}/jobs/{job_id}/logs", follow=follow, tail=tail):
            if event == "line":
                if rank is not None and data.get("rank") != rank:
                    continue
                line = LogLine(seq=0, ts=str(data.get("ts") or ""), rank=int(data.get("rank") or 0),
                               stream=str(data.get("stream") or "run"), line=str(data.get("line") or ""),
                               end=str(data.get("end", "\n")))
                show(render.feed(line), out, progress)
            elif event == "end":
                end = data
    except ApiError as exc:
        raise _fail(exc)
    show(render.close(), out)
    return end


# ------------------------------------------------------------------------------------------ launch

def _body(task: Any, public: dict[str, Any]) -> dict[str, Any]:
    """The task as a request carries it: secrets' values beside it (the server puts them in the
    secrets bucket), never in the task."""
    body: dict[str, Any] = {"task": {k: v for k, v in public.items() if k != "secrets"}}
    if task.secret_values():
        body["overrides"] = {"secrets": task.secret_values()}
    return body


def _follow(t: ApiTransport, cluster: str, job_id: int, nodes: int, status: Any,
            out: Callable[[str], None]) -> tuple[int, dict[str, Any]]:
    """The job's output as `spz logs` prints it, then its end as the embedded verbs report it:
    (the exit code, the `end` frame's data)."""
    from .clusterlog import EXIT_NOT_FOUND, exit_code_of
    from .verbs import _report_job

    end = stream_lines(t, cluster, job_id, nodes, out, status=status)
    final = end.get("status")
    status.stop()
    if final is None:
        status.note(f"[red]Job {job_id} not found on cluster {cluster}.[/red]")
        return EXIT_NOT_FOUND, end
    _report_job(status, cluster, _finished(t, cluster, job_id, final, end))
    return exit_code_of(final), end


def queue_on(t: ApiTransport, cluster: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST /api/v1/clusters/{name}/jobs: the server's answer (the job id, whether setup runs)."""
    try:
        return t.post(f"/api/v1/clusters/{cluster}/jobs", body)
    except ApiError as exc:
        raise _fail(exc)


def exec_(t: ApiTransport, task: Any, public: dict[str, Any], cluster: str, *, detach_run: bool, status: Any,
          out: Callable[[str], None]) -> int:
    """`spz exec` through the server: the job queued without setup, then its output."""
    from .verbs import _detached_hint

    job = queue_on(t, cluster, {**_body(task, public), "setup": "skip"})
    job_id = int(job["job_id"])
    status.note(f"Job {job_id} queued on cluster {cluster}.")
    if detach_run:
        status.note(_detached_hint(cluster, job_id))
        return 0
    return _follow(t, cluster, job_id, int(job.get("num_nodes") or 1), status, out)[0]


def _start_stopped(t: ApiTransport, cluster: str, status: Any, timeout_s: float) -> None:
    """As the embedded launch does with a stopped cluster: start it, wait until it is UP."""
    from .jobwatch import SubmissionFailed

    status.note(f"Cluster {cluster} is stopped: starting it.")
    try:
        t.post(f"/api/v1/clusters/{cluster}/start")
    except ApiError as exc:
        raise _fail(exc)
    status.update(f"Starting cluster {cluster}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = _cluster_or_transient(t, cluster)
        if row is not None and row.get("status") == "UP":
            status.note(f"Cluster {cluster} is up again.")
            return
        if row is not None and row.get("status") == "TERMINATED":
            raise SubmissionFailed(f"cluster {cluster} was terminated while starting")
        time.sleep(POLL_S)
    raise SubmissionFailed(f"cluster {cluster} did not come up within {timeout_s:.0f}s")


START_TIMEOUT_S = 1800.0  # a stopped cloud cluster's instances start in minutes; never wait forever


def launch(t: ApiTransport, task: Any, public: dict[str, Any], cluster: str, *, idle: int | None, down: bool,
           detach_run: bool, async_: bool, status: Any, out: Callable[[str], None], no_setup: bool = False,
           wait_for: str | None = None, workspace: str | None = None,
           retry_until_up: bool = False) -> tuple[int, dict[str, Any]]:
    """`spz launch` through the server: on a cluster that is up (a stopped one is started
    first), the job queued there (POST /api/v1/clusters/{name}/jobs); else a new cluster
    (POST /api/v1/tasks), its progress from the events stream. Then its job's output as
    `spz logs` prints it. `retry_until_up` (-r): as on the embedded bus, a submission that found
    no capacity anywhere is submitted again after a back-off (cmd_launch.retry_delay_s), here by
    this client (the server keeps no state of its own); Ctrl-C stops it."""
    from .clusterlog import exit_code_of
    from .jobwatch import SubmissionFailed
    from .verbs import _detached_hint

    summary: dict[str, Any] = {"cluster": cluster}
    existing = _cluster(t, cluster)
    if existing is not None and existing.get("status") == "STOPPED":
        _start_stopped(t, cluster, status, START_TIMEOUT_S)
        existing = _cluster(t, cluster)
    if existing is not None and existing.get("status") in ("UP", "INIT"):
        body = {**_body(task, public), "setup": "skip" if no_setup else "if_changed", "down": down,
                "idle_minutes": idle, "wait_for": wait_for}
        status.update("Queueing on the API server")
        job = queue_on(t, cluster, body)
        job_id = int(job["job_id"])
        summary.update(task_id=job.get("task_id"), job_id=job_id)
        status.note(f"Cluster {cluster} is up: job {job_id} queued "
                    f"({'setup runs again' if job.get('run_setup') else 'setup unchanged, skipped'}).")
        nodes = int(job.get("num_nodes") or 1)
    else:
        if wait_for is not None and async_:
            raise fail("--wait-for on a new cluster needs it up: leave out --async, or set it later with "
                       f"spz autostop {cluster} -i {idle} --wait-for {wait_for}", 2)
        attempt = 0
        while True:
            status.update("Submitting to the API server")
            try:
                sub = t.post("/api/v1/tasks", {**_body(task, public), "cluster": cluster, "down": down,
                                               "idle_minutes": idle, **({"workspace": workspace} if workspace else {})})
            except ApiError as exc:
                raise _fail(exc)
            task_id, seq = sub["task_id"], int(sub.get("seq") or 0)
            summary.update(task_id=task_id, submitted_seq=seq)
            if async_:
                status.note(f"Submitted task {task_id} for cluster {cluster}. Follow: spz logs {cluster}; see it: "
                            "spz status")
                summary["status"] = "SUBMITTED"
                return 0, summary
            try:
                job_id, nodes = _wait_for_job(t, task_id, cluster, seq, status)
                break
            except SubmissionFailed as exc:
                if retry_until_up and exc.retryable:
                    from skypurza.events.verbs import retry_delay_s

                    attempt += 1
                    delay = retry_delay_s(attempt)
                    status.note(f"[yellow]{exc}[/yellow]\nNo capacity anywhere yet (-r): submitting again in "
                                f"{delay:.0f} s (attempt {attempt + 1}); Ctrl-C stops.")
                    time.sleep(delay)
                    continue
                status.stop()
                status.note(f"[red]✗ {exc}[/red]")
                summary.update(status="FAILED", reason=str(exc))
                return 1, summary
        summary["job_id"] = job_id
        if wait_for is not None and idle is not None:
            # `sky launch -i N --wait-for X` is `sky launch` then `sky autostop -i N --wait-for X`.
            try:
                t.post(f"/api/v1/clusters/{cluster}/autostop", {"idle_minutes": idle, "down": down,
                                                                 "wait_for": wait_for})
            except ApiError as exc:
                raise _fail(exc)
    if async_ or detach_run:
        status.note(f"Job {job_id} queued on cluster {cluster}. " + _detached_hint(cluster, job_id))
        summary["status"] = "QUEUED"
        return 0, summary
    code, end = _follow(t, cluster, job_id, nodes, status, out)
    final = end.get("status")
    summary.update(status=final, exit_code=end.get("exit_code"),
                   cli_exit_code=code if final is None else exit_code_of(final))
    return code, summary


def _wait_for_job(t: ApiTransport, task_id: str, cluster: str, seq: int, status: Any) -> tuple[int, int]:
    """Follow the caller's events from the submission on until the task's job is queued: (job id,
    nodes). The same notes as the embedded launch; a failed placement or launch ends it."""
    from skypurza.events.envelope import decode

    from .jobwatch import SubmissionFailed, held_text

    status.update("Choosing where to run the task")
    nodes = 1
    try:
        for _, data in t.frames("/api/v1/events", since=max(seq - 1, 0)):
            try:
                decoded = decode(json.dumps(data).encode())
            except Exception:
                continue  # an event this CLI cannot read is not this launch's outcome
            ev, env = decoded.event, decoded.envelope
            if ev is None or env is None:
                continue
            kind, mine = ev.EVENT_NAME, getattr(ev, "task_id", None) == task_id
            ours = env.subject.startswith((f"task/{task_id}", f"cluster/{cluster}"))
            if not ours:
                continue
            if kind == "placement_chosen" and mine:
                c = ev.candidate
                price = f", ${c.total_hourly_price_micros / 1e6:.4f}/h" if c.hourly_price_micros else ""
                status.note(f"Placement (attempt {ev.attempt}): {c.label()} x{ev.num_nodes}{price}")
                status.update(f"Launching {ev.num_nodes} node(s) on {c.label()}")
                nodes = ev.num_nodes
            elif kind == "capacity_error" and mine:
                status.note(f"No capacity on {ev.candidate.label()}: {ev.code} ({ev.error_class}); trying the next "
                            "placement")
            elif kind == "task_held" and mine:
                status.update(held_text(ev.reason))  # as jobwatch.wait_for_job: a new reason replaces the line
            elif kind == "task_admitted" and mine:
                status.update(f"Admitted ({ev.queue or 'no queue'}): choosing where to run the task")
            elif kind == "placement_failed" and mine:
                from .jobwatch import out_of_capacity

                raise SubmissionFailed(f"no placement for the task: {ev.reason}", retryable=out_of_capacity(ev))
            elif kind == "provision_failed" and mine:
                raise SubmissionFailed(f"launch failed: {ev.code}: {ev.message}")
            elif kind == "cluster_provisioned":
                nodes = len(ev.nodes)
                status.note(f"Cluster {cluster} is up ({nodes} node(s))")
                status.update("Waiting for the nodes' agents")
            elif kind == "job_queued" and mine:
                return ev.job_id, int(getattr(ev, "num_nodes", None) or nodes)
            elif kind == "cluster_terminated":
                raise SubmissionFailed(f"cluster {cluster} was terminated before the job was queued")
    except ApiError as exc:
        raise _fail(exc)
    raise SubmissionFailed("the API server ended the events stream before the job was queued")
