"""`spz stop`, `start`, `down` and `autostop`: a cluster's lifecycle, asked of the provisioner
(StopRequested, StartRequested, DownRequested, AutostopSet) and followed on the log until it is
done, failed (the request parked on the dead-letter stream), or the timeout.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Optional

import typer

from . import bounds
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


def _lifecycle(verb: str, clusters: list[str], all_: bool, yes: bool, async_: bool,
               timeout: float = WAIT_S) -> None:
    if not clusters and not all_:
        raise fail(f"name the cluster(s) to {verb}, or use -a for all")

    async def run() -> int:
        import asyncio

        from skypurza.events import naming
        from skypurza.events.cluster_events import DownRequested, StartRequested, StopRequested

        from .clusterlog import apply
        from .control import connect_bus
        from .jobwatch import merged_follow
        from .progress import StatusLine
        from .jobwatch import SubmissionFailed
        from .requestwatch import first_dead_letter

        bus = await connect_bus(stage(), verb)
        try:
            states = {"stop": ("UP", "INIT"), "start": ("STOPPED",), "down": ("UP", "STOPPED", "INIT")}[verb]
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
            request_seq: dict[int, str] = {}  # stream sequence of each request -> its cluster
            for c in targets:
                if verb == "stop":
                    if c.use_spot:
                        raise fail(f"cluster {c.name} runs on spot instances, which cannot be stopped: spz down {c.name}")
                    ev: Any = StopRequested(cluster=c.name)
                elif verb == "start":
                    ev = StartRequested(cluster=c.name)
                else:
                    ev = DownRequested(cluster=c.name, reason="user", requested_by=cfg.user)
                ack = await bus.publish(ev)
                request_seq[ack.seq] = c.name
            if async_:
                typer.echo(f"{what} requested for {names}.")
                return 0
            goal = {"stop": "STOPPED", "start": "UP", "down": "TERMINATED"}[verb]
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
                return 1
            finally:
                status.stop()
                for t in [*watchers.values(), parked]:
                    t.cancel()
                await asyncio.gather(*watchers.values(), parked, return_exceptions=True)
            for n, why in failed.items():
                typer.echo(f"Cluster {n}: {what.lower()} failed: {why}", err=True)
            for n in pending:
                typer.echo(f"Cluster {n}: {what.lower()} requested, not confirmed within {timeout:.0f}s "
                           "(see spz status and spz events dlq).", err=True)
            for n, lines in warnings.items():
                for line in lines:
                    typer.echo(f"Cluster {n}: warning: not released: {line} (retried in the background)", err=True)
            if failed or pending:
                return 1
            return EXIT_CLEANUP_INCOMPLETE if warnings else 0
        finally:
            await bus.close()

    raise typer.Exit(run_async(run()))


def stop_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Clusters to stop (glob patterns allowed)."),
    all_: bool = typer.Option(False, "-a", "--all", help="Stop every running cluster."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    async_: bool = typer.Option(False, "--async", help="Do not wait until they are stopped."),
    timeout: float = typer.Option(WAIT_S, "--timeout", min=1, max=86400,
                                  help="Seconds to wait for the provisioner's confirmation (exit 1 after)."),
) -> None:
    """Stop clusters: nodes (and running jobs) stop, disks and homes are kept; spz start resumes."""
    _lifecycle("stop", clusters or [], all_, yes, async_, timeout)


def start_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Clusters to start (glob patterns allowed)."),
    all_: bool = typer.Option(False, "-a", "--all", help="Start every stopped cluster."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    async_: bool = typer.Option(False, "--async", help="Do not wait until they are up."),
    timeout: float = typer.Option(WAIT_S, "--timeout", min=1, max=86400,
                                  help="Seconds to wait for the provisioner's confirmation (exit 1 after)."),
) -> None:
    """Start stopped clusters again, in the same place."""
    _lifecycle("start", clusters or [], all_, yes, async_, timeout)


def down_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Clusters to tear down (glob patterns allowed)."),
    all_: bool = typer.Option(False, "-a", "--all", help="Tear down every cluster."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
    async_: bool = typer.Option(False, "--async", help="Do not wait until they are gone."),
    timeout: float = typer.Option(WAIT_S, "--timeout", min=1, max=86400,
                                  help="Seconds to wait for the provisioner's confirmation (exit 1 after)."),
) -> None:
    """Tear clusters down: every node is terminated and its disk (or local home) deleted; billing stops.

    Exit status: 0 gone; 1 a teardown failed or was not confirmed in time (the reason is printed);
    3 gone, but a security group, key pair or placement group is not released yet (retried in the background)."""
    _lifecycle("down", clusters or [], all_, yes, async_, timeout)


# ---------------------------------------------------------------------------------------- autostop

def autostop_command(
    clusters: Optional[list[str]] = typer.Argument(None, help="Clusters (glob patterns allowed)."),
    idle_minutes: Optional[int] = typer.Option(None, "-i", "--idle-minutes", parser=bounds.IDLE_MINUTES, help="Idle minutes before stopping."),
    down: bool = typer.Option(False, "--down", help="Tear down instead of stopping."),
    cancel: bool = typer.Option(False, "--cancel", help="Turn autostop off."),
    all_: bool = typer.Option(False, "-a", "--all", help="Every running cluster."),
    yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation."),
) -> None:
    """Stop (or, with --down, tear down) a cluster after it has been idle for -i minutes.

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

    async def run() -> int:
        from skypurza.events.cluster_events import AutostopSet

        from .control import connect_bus

        bus = await connect_bus(stage(), "autostop")
        try:
            targets = await _resolve(bus, clusters or [], all_, ("UP",))
            for c in targets:
                await bus.publish(AutostopSet(cluster=c.name, idle_minutes=None if cancel else idle_minutes,
                                              down=down))
                if cancel:
                    typer.echo(f"Autostop of {c.name}: off.")
                else:
                    typer.echo(f"Autostop of {c.name}: {'tear down' if down else 'stop'} after {idle_minutes} idle "
                               f"minute(s).")
            return 0
        finally:
            await bus.close()

    raise typer.Exit(run_async(run()))
