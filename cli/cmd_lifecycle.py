"""`spz stop`, `start`, `down` and `autostop`: a cluster's lifecycle, asked of the provisioner
(StopRequested, StartRequested, DownRequested, AutostopSet) and followed on the log until it is
done, failed (the request parked on the dead-letter stream), or the timeout.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Optional

import typer


from . import bounds, options
from .context import fail, run_async, stage
from .verbs import EXIT_CLEANUP_INCOMPLETE, WAIT_S, _clusters_from_log, _config, _confirm, _watched


# --------------------------------------------------------------------------- stop, start, down

async def _resolve(bus: Any, patterns: list[str], all_: bool, states: tuple[str, ...],
                   launching: bool = False) -> list[Any]:
    """The clusters named (globs allowed) or all, in `states`. With `launching`, clusters whose
    launch is still in flight (INIT: submitted or placed, not yet up) count too — `down` must
    reach them, or a launch racing `spz down -a` would leave a cluster running that nobody asked
    for. Plain names read only their own cluster; the stage-wide reads are for `-a` and globs."""
    from .clusterlog import read_cluster

    if all_ or any(any(ch in p for ch in "*?[") for p in patterns):
        # Launches in flight first, then the clusters that are up: a launch that comes up between
        # the two reads is then in both (and kept as up), never in neither.
        in_flight = await _launching_clusters(bus) if launching else []
        known = await _clusters_from_log(bus, False)
        known += [c for c in in_flight if c.name not in {k.name for k in known}]
    else:
        known = []
    if all_:
        return [c for c in known if c.status in states]
    chosen: list[Any] = []
    for p in patterns:
        if any(ch in p for ch in "*?["):
            matched = [c for c in known if fnmatch.fnmatchcase(c.name, p)]
            if not matched:
                raise fail(f"no cluster matches {p!r}")
            chosen += [c for c in matched if c not in chosen]
            continue
        c = await read_cluster(bus, p)
        if c.status not in ("UP", "STOPPED", "INIT") and launching:
            c = next((k for k in await _launching_clusters(bus, only=p)), None) or await read_cluster(bus, p)
        if c.status not in ("UP", "STOPPED", "INIT"):
            raise fail(f"no cluster named {p}" + (" (it was terminated)" if c.status == "TERMINATED" else ""))
        chosen.append(c)
    return chosen


async def _launching_clusters(bus: Any, only: str | None = None) -> list[Any]:
    """Clusters with a launch in flight (INIT: a submission without an outcome yet, read from the
    log itself, so a ledger that is busy or behind cannot hide one). Clusters whose nodes were
    lost are INIT too, but they have come up: `_clusters_from_log` has them."""
    from .clusterlog import read_cluster

    submitted_at = await _in_flight_from_log(bus)
    out = []
    for name in sorted(n for n in submitted_at if only is None or n == only):
        c = await read_cluster(bus, name)
        if c.status in ("UP", "STOPPED", "INIT"):
            continue  # it came up meanwhile: the caller reads it as it is
        if c.status == "TERMINATED" and c.last_seq > submitted_at[name]:
            continue  # ended after that submission: nothing is launching
        c.status = "INIT"
        out.append(c)
    return out


async def _in_flight_from_log(bus: Any) -> dict[str, int]:
    """Cluster -> stream seq of its newest TaskSubmitted that has no outcome yet
    (ClusterProvisioned, JobQueued, PlacementFailed or ProvisionFailed for its task)."""
    from skypurza.events import naming

    pending: dict[str, tuple[str, int]] = {}
    async for s in bus.replay(filter_subject=naming.event_filter(bus.stage, "task", "task_submitted")):
        if s.event is not None:
            pending[s.event.task_id] = (s.event.cluster, s.seq)
    if not pending:
        return {}
    for aggregate, event_name in (("cluster", "cluster_provisioned"), ("cluster", "job_queued"),
                                  ("task", "placement_failed"), ("task", "provision_failed")):
        async for s in bus.replay(filter_subject=naming.event_filter(bus.stage, aggregate, event_name)):
            if s.event is not None:
                pending.pop(getattr(s.event, "task_id", None) or "", None)
    out: dict[str, int] = {}
    for cluster, seq in pending.values():
        out[cluster] = max(seq, out.get(cluster, 0))
    return out


async def _graceful(bus: Any, targets: list[Any], timeout: float, user: str) -> None:
    """`--graceful`: cancel the clusters' unfinished jobs and wait (at most `timeout` s) until they
    have ended, before the stop or the teardown."""
    import asyncio

    from skypurza.events.job_events import CancelRequested

    from .clusterlog import read_cluster

    open_jobs = {c.name: [j.job_id for j in c.jobs.values() if not j.terminal] for c in targets}
    for name, ids in open_jobs.items():
        for job_id in ids:
            await bus.publish(CancelRequested(cluster=name, job_id=job_id, requested_by=user))
        if ids:
            typer.echo(f"Cluster {name}: cancelling job(s) {', '.join(map(str, ids))} first (--graceful).")
    deadline = asyncio.get_running_loop().time() + timeout
    for name, ids in open_jobs.items():
        while ids:
            c = await read_cluster(bus, name)
            ids = [j for j in ids if j in c.jobs and not c.jobs[j].terminal]
            if not ids:
                break
            if asyncio.get_running_loop().time() > deadline:
                typer.echo(f"Cluster {name}: job(s) {', '.join(map(str, ids))} still running after {timeout:.0f} s "
                           "(--graceful-timeout); going on.", err=True)
                break
            await asyncio.sleep(0.5)


async def _purge(bus: Any, names: list[str]) -> None:
    """`down --purge`: the clusters whose teardown failed or was not confirmed leave spz's records
    (ClusterTerminated) all the same; their instances may still run."""
    from datetime import datetime, timezone

    from skypurza.events.cluster_events import ClusterTerminated

    for name in names:
        await bus.publish(ClusterTerminated(cluster=name, terminated_at=datetime.now(timezone.utc), reason="purged"))
        typer.echo(f"Cluster {name}: purged from spz's records (--purge). Its instances may still run and cost "
                   "money: check the cloud console (or spz status --refresh for orphans).", err=True)


def _lifecycle(verb: str, clusters: list[str], all_: bool, yes: bool, async_: bool,
               timeout: float = WAIT_S, *, graceful: bool = False, graceful_timeout: float | None = None,
               purge: bool = False, autostop: Any = None, all_users: bool = False) -> None:
    """stop / start / down of the clusters named. `graceful`: cancel their jobs first; `purge`
    (down): what could not be torn down is dropped from the records anyway; `autostop` (start):
    an AutostopSet (idle_minutes, down, wait_for) to publish with each start."""
    raise typer.Exit(_lifecycle_code(verb, clusters, all_, yes, async_, timeout, graceful=graceful,
                                     graceful_timeout=graceful_timeout, purge=purge, autostop=autostop,
                                     all_users=all_users))


def _lifecycle_code(verb: str, clusters: list[str], all_: bool, yes: bool, async_: bool,
                    timeout: float = WAIT_S, *, graceful: bool = False, graceful_timeout: float | None = None,
                    purge: bool = False, autostop: Any = None, all_users: bool = False) -> int:
    from skypurza.events.aiotasks import stop_tasks
    if not clusters and not all_:
        raise fail(f"name the cluster(s) to {verb}, or use -a for all")
    from .transport import api

    t = api()
    if t is not None:
        from . import via_api

        return via_api.lifecycle(t, verb, clusters, all_, yes, async_, timeout, autostop, all_users=all_users,
                                 graceful=graceful, graceful_timeout=graceful_timeout, purge=purge)

    async def run() -> int:
        import asyncio

        from skypurza.events import naming
        from skypurza.events.cluster_events import AutostopSet, DownRequested, StartRequested, StopRequested

        from .clusterlog import apply
        from .control import connect_bus
        from .jobwatch import merged_follow
        from .progress import StatusLine
        from .jobwatch import SubmissionFailed
        from .requestwatch import first_dead_letter

        bus = await connect_bus(stage(), verb)
        try:
            from skypurza.events.verbs import LIFECYCLE_FROM, LIFECYCLE_GOAL, stop_refusal

            states = LIFECYCLE_FROM[verb]
            targets = await _resolve(bus, clusters, all_, ("UP", "STOPPED", "INIT"), launching=verb == "down")
            skipped = [c for c in targets if c.status not in states]
            for c in skipped:
                typer.echo(f"Cluster {c.name} is already {c.status}.")
            targets = [c for c in targets if c.status in states]
            if not targets:
                return 0
            names = ", ".join(c.name for c in targets)
            what = {"stop": "Stop", "start": "Start", "down": "Tear down"}[verb]
            _confirm(f"{what} cluster(s) {names}?", yes or verb == "start")
            cfg = _config()
            if graceful and verb in ("stop", "down"):
                await _graceful(bus, targets, graceful_timeout if graceful_timeout is not None else timeout, cfg.user)
            request_seq: dict[int, str] = {}  # stream sequence of each request -> its cluster
            for c in targets:
                if verb == "stop":
                    refusal = stop_refusal(c.name, c.use_spot)
                    if refusal:
                        raise fail(refusal)
                    ev: Any = StopRequested(cluster=c.name)
                elif verb == "start":
                    ev = StartRequested(cluster=c.name)
                    if autostop is not None:  # `start -i N`: as `sky start -i`, autostop set with the start
                        await bus.publish(AutostopSet(cluster=c.name, **autostop))
                else:
                    ev = DownRequested(cluster=c.name, reason="user", requested_by=cfg.user)
                ack = await bus.publish(ev)
                request_seq[ack.seq] = c.name
            if async_:
                typer.echo(f"{what} requested for {names}.")
                return 0
            goal = LIFECYCLE_GOAL[verb]
            pending = {c.name: c for c in targets}
            status = StatusLine()
            status.update(f"{what} {names}: waiting for the provisioner")
            # `start` waits for ClusterStarted, not for the UP the cluster had before it stopped.
            seen_started: set[str] = set()
            failed: dict[str, str] = {}  # cluster -> why its request failed
            warnings: dict[str, list[str]] = {}  # cluster -> resources its teardown could not release

            async def watch(c: Any) -> None:
                async for s in merged_follow(bus, [naming.aggregate_subjects(bus.stage, "cluster", c.name)],
                                             c.last_seq + 1):
                    if s.event is None or s.envelope is None:
                        continue
                    apply(c, s.event, s.envelope.time)
                    if s.event.EVENT_NAME == "cluster_started":
                        seen_started.add(c.name)
                    if s.event.EVENT_NAME == "cleanup_failed":
                        e = s.event
                        warnings.setdefault(c.name, []).append(
                            f"{e.resource_type} {e.resource} in {e.region}: {e.code}: {e.message}")
                    if c.status == goal and (verb != "start" or c.name in seen_started):
                        status.note(f"Cluster {c.name}: {goal}.")
                        pending.pop(c.name, None)
                        return

            async def dead_letters(watchers: dict[str, asyncio.Task[None]]) -> None:
                # A request the provisioner gave up on (parked with its error) ends that cluster's wait.
                while set(request_seq.values()) & (set(pending) - set(failed)):
                    seqs = [q for q, n in request_seq.items() if n in pending and n not in failed]
                    letter = await first_dead_letter(bus, seqs=seqs)
                    name = request_seq[letter.stream_seq]
                    failed[name] = letter.reason()
                    pending.pop(name, None)
                    watchers[name].cancel()

            watchers = {c.name: asyncio.ensure_future(watch(c)) for c in targets}
            parked = asyncio.ensure_future(dead_letters(watchers))
            try:
                await _watched(asyncio.wait(list(watchers.values()), timeout=timeout))
            except SubmissionFailed as exc:
                status.stop()
                typer.echo(f"{what} of {names} not confirmed: {exc}", err=True)
                if purge:
                    await _purge(bus, [n for n in pending if n not in failed] + list(failed))
                    return 0
                return 1
            finally:
                status.stop()
                await stop_tasks(*watchers.values(), parked)
            for n, why in failed.items():
                typer.echo(f"Cluster {n}: {what.lower()} failed: {why}", err=True)
            for n in pending:
                typer.echo(f"Cluster {n}: {what.lower()} requested, not confirmed within {timeout:.0f}s "
                           "(see spz status and spz events dlq).", err=True)
            if purge and (failed or pending):
                await _purge(bus, sorted(set(failed) | set(pending)))
                failed, pending = {}, {}
            for n, lines in warnings.items():
                for line in lines:
                    typer.echo(f"Cluster {n}: warning: not released: {line} (retried in the background)", err=True)
            if failed or pending:
                return 1
            return EXIT_CLEANUP_INCOMPLETE if warnings else 0
        finally:
            await bus.close()

    return run_async(run())


def stop_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Clusters to stop (glob patterns allowed)."),
    all_: bool = typer.Option(False, "-a", "--all", help="Stop every running cluster."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    async_: bool = options.async_option("Do not wait until they are stopped."),
    timeout: float = typer.Option(WAIT_S, "--timeout", min=1, max=86400,
                                  help="Seconds to wait for the provisioner's confirmation (exit 1 after)."),
    graceful: bool = options.graceful_option(),
    graceful_timeout: Optional[int] = options.graceful_timeout_option(),
    all_users: bool = options.all_users_option(),
) -> None:
    """Stop clusters: nodes (and running jobs) stop, disks and homes are kept; spz start resumes."""
    _all_users_note(all_users)
    _lifecycle("stop", clusters or [], all_, yes, async_, timeout, graceful=graceful,
               graceful_timeout=graceful_timeout, all_users=all_users)


def start_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Clusters to start (glob patterns allowed)."),
    all_: bool = typer.Option(False, "-a", "--all", help="Start every stopped cluster."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    async_: bool = options.async_option("Do not wait until they are up."),
    timeout: float = typer.Option(WAIT_S, "--timeout", min=1, max=86400,
                                  help="Seconds to wait for the provisioner's confirmation (exit 1 after)."),
    idle_minutes: Optional[int] = typer.Option(None, "-i", "--idle-minutes-to-autostop", parser=bounds.IDLE_MINUTES,
                                               help="Set autostop: stop after this many idle minutes."),
    wait_for: Optional[str] = options.wait_for_option(),
    down: bool = typer.Option(False, "--down", help="With -i: tear down instead of stopping when idle."),
    retry_until_up: bool = typer.Option(False, "-r", "--retry-until-up",
                                        help="When the start fails or is not confirmed, ask again (with back-off) "
                                             "until the cluster is up; Ctrl-C stops."),
    force: bool = typer.Option(False, "-f", "--force", help="Start even a cluster that is UP (spz: nothing to do)."),
) -> None:
    """Start stopped clusters again, in the same place."""
    if down and idle_minutes is None:
        raise fail("--down goes with -i/--idle-minutes-to-autostop (as sky start)", 2)
    if wait_for is not None and idle_minutes is None:
        raise fail("--wait-for goes with -i/--idle-minutes-to-autostop", 2)
    if force:
        options.unused("-f/--force", "a cluster that is UP is left as it is; spz's node agents run this install's "
                                     "code and need no runtime upgrade")
    autostop = None if idle_minutes is None else {"idle_minutes": idle_minutes, "down": down,
                                                  "wait_for": wait_for or "jobs_and_ssh"}
    attempt = 0
    while True:
        code = _lifecycle_code("start", clusters or [], all_, yes, async_, timeout, autostop=autostop)
        if code == 0 or not retry_until_up or async_:
            raise typer.Exit(code)
        import time

        from .cmd_launch import retry_delay_s

        attempt += 1
        delay = retry_delay_s(attempt)
        typer.echo(f"Not up yet (-r): asking again in {delay:.0f} s (attempt {attempt + 1}); Ctrl-C stops.", err=True)
        time.sleep(delay)


def down_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Clusters to tear down (glob patterns allowed)."),
    all_: bool = typer.Option(False, "-a", "--all", help="Tear down every cluster."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    async_: bool = options.async_option("Do not wait until they are gone."),
    timeout: float = typer.Option(WAIT_S, "--timeout", min=1, max=86400,
                                  help="Seconds to wait for the provisioner's confirmation (exit 1 after)."),
    purge: bool = typer.Option(False, "-p", "--purge", help="(Advanced) When a teardown fails or is not confirmed, "
                               "drop the cluster from spz's records anyway; leaked instances are yours to remove."),
    graceful: bool = options.graceful_option(),
    graceful_timeout: Optional[int] = options.graceful_timeout_option(),
    all_users: bool = options.all_users_option(),
) -> None:
    """Tear clusters down: every node is terminated and its disk (or local home) deleted; billing stops.

    Exit status: 0 gone; 1 a teardown failed or was not confirmed in time (the reason is printed);
    3 gone, but a security group, key pair or placement group is not released yet (retried in the background)."""
    _all_users_note(all_users)
    if purge and async_:
        options.unused("--async", "--purge waits for the teardown's outcome, to know what to purge")
        async_ = False
    _lifecycle("down", clusters or [], all_, yes, async_, timeout, graceful=graceful,
               graceful_timeout=graceful_timeout, purge=purge, all_users=all_users)


def _all_users_note(all_users: bool) -> None:
    """-u means something through an API server (everyone's, for reading; acting is for admins);
    on the embedded bus every cluster is shown already."""
    from .transport import endpoint

    if endpoint() is None:
        options.all_users_note(all_users)


# ---------------------------------------------------------------------------------------- autostop

def autostop_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Clusters (glob patterns allowed)."),
    idle_minutes: Optional[int] = typer.Option(None, "-i", "--idle-minutes", parser=bounds.IDLE_MINUTES, help="Idle minutes before stopping."),
    down: bool = typer.Option(False, "--down", help="Tear down instead of stopping."),
    cancel: bool = typer.Option(False, "--cancel", help="Turn autostop off."),
    all_: bool = typer.Option(False, "-a", "--all", help="Every running cluster."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    wait_for: Optional[str] = options.wait_for_option(),
    async_: bool = options.async_option("Return once the setting is in the event log (autostop always does)."),
    all_users: bool = options.all_users_option(),
) -> None:
    """Stop (or, with --down, tear down) a cluster after it has been idle for -i minutes.

    --wait-for none makes it a hard limit: the cluster stops -i minutes after this, whatever runs.

    Idle means no job pending or running. The head node's agent measures it, so it works with your laptop closed. Setting autostop restarts the idle timer.

    Examples:

      spz autostop mycluster -i 30

      spz autostop mycluster -i 0 --down

      spz autostop mycluster --cancel
    """
    if cancel and idle_minutes is not None:
        raise fail("give -i MINUTES or --cancel, not both")
    if not cancel and idle_minutes is None:
        raise fail("give -i MINUTES (or --cancel to turn autostop off)")
    if idle_minutes is not None and idle_minutes < 0:
        raise fail(f"-i must be 0 or more minutes, found {idle_minutes}")
    if not clusters and not all_:
        raise fail("name the cluster(s), or use -a for all")
    if wait_for is not None and cancel:
        raise fail("--wait-for goes with -i MINUTES, not --cancel", 2)
    from .transport import api

    t = api()
    if t is not None:
        from . import via_api

        raise typer.Exit(via_api.autostop(t, clusters or [], all_, idle_minutes, down, cancel, wait_for,
                                          all_users=all_users))
    options.all_users_note(all_users)

    async def run() -> int:
        from skypurza.events.cluster_events import AutostopSet

        from .control import connect_bus

        bus = await connect_bus(stage(), "autostop")
        try:
            targets = await _resolve(bus, clusters or [], all_, ("UP",))
            for c in targets:
                await bus.publish(AutostopSet(cluster=c.name, idle_minutes=None if cancel else idle_minutes,
                                              down=down, wait_for=wait_for or "jobs_and_ssh"))
                if cancel:
                    typer.echo(f"Autostop of {c.name}: off.")
                elif wait_for == "none":
                    typer.echo(f"Autostop of {c.name}: {'tear down' if down else 'stop'} in {idle_minutes} minute(s), "
                               "whatever runs (--wait-for none).")
                else:
                    typer.echo(f"Autostop of {c.name}: {'tear down' if down else 'stop'} after {idle_minutes} idle "
                               f"minute(s).")
            return 0
        finally:
            await bus.close()

    raise typer.Exit(run_async(run()))


def register(app: typer.Typer) -> None:
    """Add `stop`, `start`, `down` and `autostop` to the spz app (cli/commandtable.py)."""
    app.command("stop")(stop_command)
    app.command("start")(start_command)
    app.command("down")(down_command)
    app.command("autostop")(autostop_command)
