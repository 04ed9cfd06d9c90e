"""Run any subset of the control-plane services in one process (`spz api serve`, containers, `spz api`).

Each service declares its shape in its contract (events/contract.py): a `ServiceContract` is
handled through a durable consumer by `ServiceRunner`; a `LoopContract` service runs its own
`async run(bus, stop)` loop (the status service and the ledger keep their position in DuckDB).

The open broker's services are listed here (`OPEN_SERVICES`, by import path, imported at run
time); platform services (the ledger's accounting) join through the `skypurza.services`
entry-point group (cli/plugins.py), so this module names no platform module and the open broker
runs without them (`SKYPURZA_NO_PLUGINS=1` runs it so). Services never import each other.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import logging
import signal
import sys
from pathlib import Path

from skypurza.events import naming
from skypurza.events.aiotasks import stop_tasks
from skypurza.events.bus import CANNOT_CONNECT, Bus, StreamPlacementError
from skypurza.events.natscreds import BusCredentials, credentials_file, read_credentials
from skypurza.events.config import ConfigError
from skypurza.events.service import LoopContract, LoopService, Service, ServiceContract, ServiceRunner

from .health import HealthRecorder
from .plugins import service_entry_points

# The open broker's services, in the order they start; platform ones follow (`services()`).
OPEN_SERVICES: dict[str, str] = {
    "optimizer": "skypurza.services.optimizer.service:OptimizerService",
    "provisioner": "skypurza.services.provisioner.service:ProvisionerService",
    "status": "skypurza.services.status.service:StatusService",
    "recovery": "skypurza.services.recovery.service:RecoveryService",
    "mirror": "skypurza.services.mirror.service:MirrorService",
}


# The services process's cyclic garbage collector: Python's default gen-0 threshold (700 new
# containers) runs a collection every few events, and each one walks every young pydantic model
# and candidate: 35-50% of the optimizer's CPU for 1,000 placements (issue 21). Nearly all of a
# handler's garbage is freed by reference counting anyway; a higher threshold collects the rest
# less often, for a few MB at most.
GC_THRESHOLD = (10_000, 10, 10)


def tune_gc() -> None:
    """Collect cycles less often in this long-running process (see GC_THRESHOLD)."""
    gc.set_threshold(*GC_THRESHOLD)


def services() -> dict[str, str]:
    """Every service this install runs: the open ones, then the platform services' entry points
    (`skypurza.services`; none under SKYPURZA_NO_PLUGINS). A platform service cannot take an
    open one's name."""
    out = dict(OPEN_SERVICES)
    for name, value in service_entry_points().items():
        out.setdefault(name, value)
    return out


SERVICES = services()

log = logging.getLogger("skypurza.serve")

READY_WAIT_S = 20.0  # how long "ready" waits for every service to serve (the CLI's own wait is longer)
HEALTHY_RUN_S = 60.0  # a service that ran this long before it died restarts after the first back-off step
# What makes the services process exit with one line (said by serve(), exit 2): retrying mends none.
CANNOT_USE_BUS = (ConfigError, StreamPlacementError, *CANNOT_CONNECT)


def parse_services(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if names == ["all"] or not names:
        return list(SERVICES)
    unknown = [n for n in names if n not in SERVICES]
    if unknown:
        raise ValueError(f"unknown service(s): {', '.join(unknown)}; known: {', '.join(SERVICES)}, or 'all'")
    return names


def load_service(name: str) -> Service | LoopService:
    module_name, _, cls_name = SERVICES[name].partition(":")
    module = importlib.import_module(module_name)
    svc = getattr(module, cls_name)()  # each service is built with no arguments (its settings are its own)
    if not isinstance(getattr(svc, "contract", None), (ServiceContract, LoopContract)):
        raise TypeError(f"service {name} declares no ServiceContract or LoopContract")
    return svc  # type: ignore[no-any-return]


def start_service(bus: Bus, svc: Service | LoopService, stop: asyncio.Event) -> tuple[asyncio.Task, ServiceRunner | None]:
    """Run a service by its declared shape: its own loop, or a ServiceRunner's consumer."""
    if isinstance(svc.contract, LoopContract):
        return asyncio.create_task(svc.run(bus, stop)), None  # type: ignore[union-attr]
    runner = ServiceRunner(bus, svc)  # type: ignore[arg-type]
    return asyncio.create_task(runner.run()), runner


async def serve(url: str, stage: str, names: list[str], stop: asyncio.Event | None = None,
                ready: asyncio.Event | None = None, explicit: bool = True,
                health_file: Path | None = None, credentials_dir: Path | None = None) -> None:
    """Run the named services until `stop` is set. Each is supervised on its own: one that dies
    is logged and restarted with back-off (a fresh instance: state comes from the log), and the
    others go on — a broken ledger file must not stop the provisioner. With `health_file`, each
    service's health (running, restarting, restarts, last error) is kept there (cli/health.py).
    With `credentials_dir` (a deployment's secured bus), each service connects as its own user
    (its contract's name, events/natscreds.py) on a bus of its own."""
    stop = stop or asyncio.Event()
    health = HealthRecorder(health_file)
    try:
        bus = await Bus.connect(url, stage, source=f"/skypurza/{stage}/serve",
                                credentials=_credentials(credentials_dir, next(iter(names), "")))
    except CANNOT_USE_BUS as exc:  # a bad URL, a cluster that cannot hold the log, a user refused
        log.error("cannot use the bus: %s", exc)
        raise
    started: list[str] = []
    for name in names:
        try:
            load_service(name)  # fail fast on a missing module
        except ConfigError as exc:  # a bad setting (events/settings.py): one line, here, then exit
            log.error("service %s cannot start: %s", name, exc)
            health.died(name, exc)
            await bus.close()
            raise
        except ModuleNotFoundError as exc:
            if explicit:
                raise
            log.warning("service %s is not available in this build (%s); skipped", name, exc)
            continue
        started.append(name)
    first = {name: asyncio.Event() for name in started}
    buses = {name: bus for name in started}
    if credentials_dir is not None:
        for name in started[1:]:  # the first one's user is `bus`'s
            try:
                buses[name] = await Bus.connect(url, stage, source=f"/skypurza/{stage}/{name}",
                                                credentials=_credentials(credentials_dir, name))
            except CANNOT_USE_BUS as exc:
                log.error("service %s cannot use the bus: %s", name, exc)
                for b in {id(b): b for b in [bus, *buses.values()]}.values():
                    await b.close()
                raise
    tasks = [asyncio.create_task(_supervise(buses[name], name, stop, health, first[name]), name=name)
             for name in started]
    # "Ready" means answering: a command run right after the control plane started (`spz
    # cost-report` on first use) must find the projections' queries served, not "not running".
    waits = [asyncio.create_task(e.wait()) for e in first.values()]
    _, late = await asyncio.wait(waits, timeout=READY_WAIT_S)
    for w in late:
        w.cancel()
    if late:
        log.warning("not serving within %.0f s: %s", READY_WAIT_S, ", ".join(n for n, e in first.items() if not e.is_set()))
    log.info("services ready: %s", ", ".join(started))
    if ready:
        ready.set()
    await stop.wait()
    if tasks:
        await asyncio.wait(tasks, timeout=10)
    await stop_tasks(*tasks)
    for b in {id(b): b for b in [bus, *buses.values()]}.values():
        await b.close()


def _credentials(directory: Path | None, name: str) -> BusCredentials | None:
    """The service's own user on a secured bus (by its contract's name), or None (embedded)."""
    if directory is None or not name:
        return None
    contract_name = load_service(name).contract.name
    return read_credentials(credentials_file(directory, contract_name))


async def _supervise(bus: Bus, name: str, stop: asyncio.Event, health: HealthRecorder | None = None,
                     first_ready: asyncio.Event | None = None) -> None:
    """Run one service, restarting it when it stops; `first_ready` is set once its first
    instance serves (a projection: its queries answered), or has stopped trying."""
    health = health or HealthRecorder(None)
    first_ready = first_ready or asyncio.Event()
    marking: set[asyncio.Task] = set()
    delay = 1.0
    while not stop.is_set():
        runner: ServiceRunner | None = None
        try:
            svc = load_service(name)
        except Exception as exc:  # its settings cannot be read: a failure like any other
            svc = None
            job: asyncio.Future = asyncio.get_running_loop().create_future()
            job.set_exception(exc)
        else:
            job, runner = start_service(bus, svc, stop)
        log.info("service %s started", name)
        health.started(name)
        if not first_ready.is_set():
            mark = asyncio.create_task(_mark_serving(svc, job, first_ready))
            marking.add(mark)  # held: the loop keeps only a weak reference to a task
            mark.add_done_callback(marking.discard)
        began = asyncio.get_running_loop().time()
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait([job, stopper], return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            if runner is not None:
                runner.stop()
            try:
                await asyncio.wait_for(job, 10)
            except BaseException:  # shutting down: whatever it raised is moot
                job.cancel()
            await _close(svc)
            health.stopped(name)
            return
        stopper.cancel()
        exc = job.exception() if not job.cancelled() else None
        await _close(svc)  # its background loops must not outlive it next to the new instance
        if asyncio.get_running_loop().time() - began >= HEALTHY_RUN_S:
            delay = 1.0  # it ran well for a while: this is a new failure, not the same crash loop
        health.died(name, exc)
        log.error("service %s stopped unexpectedly (%r); restarting in %.0fs", name, exc, delay)
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except asyncio.TimeoutError:
            pass
        delay = min(delay * 2, 30.0)


async def _mark_serving(svc: Service | LoopService | None, job: asyncio.Future, done: asyncio.Event) -> None:
    """Set `done` when `svc` serves (its `serving()`, when it has one), or its run ended."""
    serving = getattr(svc, "serving", None)
    if callable(serving):
        waiter = asyncio.ensure_future(serving())
        await asyncio.wait([waiter, job], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
    done.set()


async def _close(svc: Service | LoopService | None) -> None:
    if svc is None:
        return
    try:
        await asyncio.wait_for(svc.close(), 10)
    except Exception as exc:
        log.warning("closing %s failed: %r", svc.contract.name, exc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m skypurza.cli.serve", description=__doc__)
    p.add_argument("--nats", required=True)
    p.add_argument("--stage", default="dev")
    p.add_argument("--services", default="all")
    p.add_argument("--nats-creds-dir", default=None, type=Path,
                   help="a deployment's bus credentials: each service connects as its own user")
    # Only a marker: it lets `spz api stop` recognise this process as its stage's (cli/planeprocs.py).
    p.add_argument("--control-plane", default=None, help="the stage's state directory (set by the supervisor)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    tune_gc()
    try:
        names = parse_services(args.services)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(args.nats, args.stage, names, stop, explicit=args.services != "all",
                    health_file=naming.services_health_file(args.stage), credentials_dir=args.nats_creds_dir)

    try:
        asyncio.run(run())
    except CANNOT_USE_BUS:
        return 2  # already said, once, by serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
