"""Watching a submission and a job: progress from the event log, output from the logs stream.

- `wait_for_job` follows a task's events (placement, capacity errors, provisioning) and its
  cluster's events until the task's job is queued, updating a status line;
- `stream_job` prints a job's output (history, then live) until the job ends, and returns the
  job as the log tells it. Lines are printed in the order the logs stream stored them, each
  chunk once (`ChunkFilter`).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any, AsyncIterator, Callable

from skypurza.events import naming
from skypurza.events.aiotasks import stop_tasks
from skypurza.events.logchunks import ChunkFilter, LogLine, format_line, parse_log  # noqa: F401  (moved there)

from .clusterlog import Cluster, Job, apply, read_cluster
from .tables import duration, since  # noqa: F401  (moved there: the views need them without the watch)

# `spz jobs logs` (cli/cmd_jobs.py) still polls: it reads this long after its job ended.
DRAIN_S = 0.5
# After a job ended, how long `stream_job` waits at most for the reports of the nodes whose
# output it saw (a failing node's neighbours, stopped within the agent's 10 s kill grace, print
# and report after the head decided): only a node lost before reporting makes it wait this long.
LATE_REPORT_S = 15.0
OUTPUT_PHASES = ("setup", "run")  # the streams an agent reports the end of (JobNodeFinished)


def output_pending(reported: set[tuple[int, str]], streamed: set[tuple[int, str]]) -> set[tuple[int, str]]:
    """The (rank, phase) outputs that may still grow after the job ended: output seen, and no
    JobNodeFinished yet. An agent stores a phase's last chunk before it reports the phase, so a
    reported phase's output is all in the logs stream; a phase that printed nothing has nothing
    to wait for."""
    return streamed - reported


class SubmissionFailed(Exception):
    """The submission cannot go on. `retryable`: no place had capacity (every attempt failed on
    capacity, spot capacity or quota), which `launch -r` answers by submitting again."""

    def __init__(self, message: str = "", *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


async def merged_follow(bus: Any, filters: list[str], start_seq: int) -> AsyncIterator[Any]:
    """Several subject filters of the event log as one live sequence of Stored events."""
    from skypurza.events.bus import stored_from_msg

    queue: asyncio.Queue = asyncio.Queue()

    async def pump(subject: str) -> None:
        async for msg in bus.follow(filter_subject=subject, start_seq=start_seq):
            await queue.put(stored_from_msg(msg))

    tasks = [asyncio.create_task(pump(f)) for f in filters]
    try:
        while True:
            yield await queue.get()
    finally:
        await stop_tasks(*tasks)


def held_text(reason: str) -> str:
    """The progress line while dispatch holds a submission (docs/dispatch.md)."""
    return f"held: {reason}"


async def wait_for_job(bus: Any, *, task_id: str, cluster: str, start_seq: int,
                       status: Callable[[str], None], note: Callable[[str], None]) -> tuple[int, Cluster]:
    """Follow a submission until its job is queued on the cluster: (job_id, cluster so far)."""
    from .clusterlog import Cluster

    state = Cluster(cluster)
    filters = [naming.aggregate_subjects(bus.stage, "task", task_id),
               naming.aggregate_subjects(bus.stage, "cluster", cluster)]
    status("Choosing where to run the task")
    async for s in merged_follow(bus, filters, start_seq):
        ev = s.event
        if ev is None or s.envelope is None:
            continue
        kind = ev.EVENT_NAME
        if s.envelope.aggregate == "cluster":
            apply(state, ev, s.envelope.time)
        if kind == "placement_chosen" and ev.task_id == task_id:
            c = ev.candidate
            price = f", ${c.total_hourly_price_micros / 1e6:.4f}/h" if c.hourly_price_micros else ""
            note(f"Placement (attempt {ev.attempt}): {c.label()} x{ev.num_nodes}{price}")
            status(f"Launching {ev.num_nodes} node(s) on {c.label()}")
        elif kind == "capacity_error" and ev.task_id == task_id:
            note(f"No capacity on {ev.candidate.label()}: {ev.code} ({ev.error_class}); trying the next placement")
            status("Choosing the next placement")
        elif kind == "task_held" and ev.task_id == task_id:
            status(held_text(ev.reason))  # the dispatch policy holds it; a new reason replaces the line
        elif kind == "task_admitted" and ev.task_id == task_id:
            status(f"Admitted ({ev.queue or 'no queue'}): choosing where to run the task")
        elif kind == "placement_failed" and ev.task_id == task_id:
            raise SubmissionFailed(f"no placement for the task: {ev.reason}", retryable=out_of_capacity(ev))
        elif kind == "provision_failed" and ev.task_id == task_id:
            raise SubmissionFailed(f"launch failed: {ev.code}: {ev.message}")
        elif kind == "cluster_provisioned":
            note(f"Cluster {cluster} is up ({len(ev.nodes)} node(s))")
            status("Waiting for the nodes' agents")
        elif kind == "job_queued" and ev.task_id == task_id:
            return ev.job_id, state
        elif kind == "cluster_terminated":
            raise SubmissionFailed(f"cluster {cluster} was terminated before the job was queued")
    raise SubmissionFailed("the event log closed")  # pragma: no cover


async def stream_job(bus: Any, cluster_name: str, job_id: int, *, print_line: Callable[[str], None],
                     follow: bool = True, tail: int = 0, timestamps: bool = False,
                     status: Callable[[str], None] | None = None, rank: int | None = None,
                     progress: Callable[[str], None] | None = None) -> Job | None:
    """Print the job's output until it ends (or, without `follow`, what there is); with `rank`,
    that node's only (`logs -w`). Carriage returns and partial lines are joined as a terminal
    shows them (cli/logrender.py); on a terminal, `progress` shows an unfinished line's state
    (a progress bar) as it changes. Returns the job."""
    from .logrender import Render, show, with_text
    if follow:
        from . import lostplane

        lostplane.still_running(f"job {job_id} keeps running on cluster {cluster_name}; "
                                f"follow it with spz logs {cluster_name} {job_id}")
    cluster = await read_cluster(bus, cluster_name)
    job = cluster.jobs.get(job_id)
    nodes = job.num_nodes if job else 1
    subject = naming.logs_subject_filter(bus.stage, cluster_name, job_id)
    chunks = ChunkFilter()
    history: list[LogLine] = []
    streamed: set[tuple[int, str]] = set()  # (rank, phase) with output seen
    last = 0
    async for msg in bus.replay_raw(stream=bus.logs_stream, filter_subject=subject):
        line = parse_log(msg)
        last = line.seq
        if line.stream in OUTPUT_PHASES and (rank is None or line.rank == rank):
            streamed.add((line.rank, line.stream))
        if chunks.fresh(line) and (rank is None or line.rank == rank):
            history.append(line)
    render = Render(lambda ln, text: format_line(with_text(ln, text), nodes, timestamps))
    shown: list[str] = []
    for line in history:
        show(render.feed(line), shown.append)
    if not follow or job is None or job.terminal:
        show(render.close(), shown.append)
    for text in (shown[-tail:] if tail > 0 else shown):
        print_line(text)
    if not follow or job is None or job.terminal:
        return job

    done = asyncio.Event()
    changed = asyncio.Event()  # a cluster event arrived (a late node report, say)

    async def events() -> None:
        async for s in bus.follow(filter_subject=naming.aggregate_subjects(bus.stage, "cluster", cluster_name),
                                  start_seq=cluster.last_seq + 1):
            if s is None:
                continue
            from skypurza.events.bus import stored_from_msg

            stored = stored_from_msg(s)
            if stored.event is None or stored.envelope is None:
                continue
            apply(cluster, stored.event, stored.envelope.time)
            changed.set()
            j = cluster.jobs.get(job_id)
            if j is not None and status is not None and not done.is_set():
                status(_job_status_text(j, _ahead(cluster, job_id)))
            if j is not None and j.terminal:
                done.set()  # and go on: the nodes' late reports say when their output is all in
            if cluster.status == "TERMINATED":
                done.set()
                return

    def take(msg: Any) -> None:
        nonlocal last
        line = parse_log(msg)
        if line.seq <= last:
            return
        last = line.seq
        if line.stream in OUTPUT_PHASES and (rank is None or line.rank == rank):
            streamed.add((line.rank, line.stream))
        if chunks.fresh(line) and (rank is None or line.rank == rank):
            show(render.feed(line), print_line, progress)

    async def logs() -> None:
        async for msg in bus.follow(stream=bus.logs_stream, filter_subject=subject,
                                    start_seq=last + 1 if last else None):
            take(msg)

    async def read_rest() -> None:
        # Up to the stream's last message now, then done (bus.replay_raw waits for nothing).
        async for msg in bus.replay_raw(stream=bus.logs_stream, filter_subject=subject, start_seq=last + 1):
            take(msg)

    if status is not None and job is not None:
        status(_job_status_text(job, _ahead(cluster, job_id)))
    ev_task = asyncio.create_task(events())
    log_task = asyncio.create_task(logs())
    try:
        await done.wait()
        await stop_tasks(log_task)
        # The job ended: its output is all stored once every node whose output was seen has
        # reported its phase. A one-node success has reported before the head decided; a failing
        # node's neighbours report once stopped. No fixed wait: each report wakes this loop.
        deadline = asyncio.get_running_loop().time() + LATE_REPORT_S
        while True:
            changed.clear()
            await read_rest()
            j = cluster.jobs.get(job_id)
            if (cluster.status == "TERMINATED" or j is None or ev_task.done()
                    or not output_pending(j.reported, streamed)):
                break
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(changed.wait(), timeout=left)
            except asyncio.TimeoutError:
                pass  # a node lost before it reported: what it stored is read once more, above
    finally:
        await stop_tasks(ev_task, log_task)
    show(render.close(), print_line)
    return cluster.jobs.get(job_id)


def _ahead(cluster: Any, job_id: int) -> int:
    return sum(1 for jid, j in cluster.jobs.items() if jid < job_id and not j.terminal)


def _job_status_text(job: Job, ahead: int = 0) -> str:
    """The status line for a job; `ahead`: the unfinished jobs queued before it on its cluster."""
    if job.status == "PENDING":
        if ahead:
            return (f"Job {job.job_id}: queued behind {ahead} job{'s' if ahead != 1 else ''} "
                    "(it starts when the cluster has room for it, in queue order)")
        return f"Job {job.job_id}: queued (starting)"
    if job.status == "SETTING_UP":
        return f"Job {job.job_id}: running setup ({len(job.setup_done)}/{job.cluster_nodes} node(s) done)"
    if job.status == "RUNNING":
        return f"Job {job.job_id}: running on {job.num_nodes} node(s)"
    return f"Job {job.job_id}: {job.status}"


RETRYABLE_ERRORS = ("capacity", "spot_capacity", "quota")


def out_of_capacity(failed: Any) -> bool:
    """A PlacementFailed whose every attempt failed for want of capacity (not a task no place can run)."""
    attempts = list(getattr(failed, "attempts", None) or [])
    return bool(attempts) and all(a.error_class in RETRYABLE_ERRORS for a in attempts)
