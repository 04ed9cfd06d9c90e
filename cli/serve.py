"""Run any subset of the control-plane services in one process (`spz serve`, containers, `spz api`).

A service is either a `Service` (handled through a durable consumer by `ServiceRunner`) or an
object with its own `async run(bus, stop)` loop (the ledger keeps its position in DuckDB). This
module is the one place that knows every service by name; services never import each other.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import signal
import sys
from typing import Any

from skypurza.events.bus import Bus
from skypurza.events.service import ServiceRunner

SERVICES: dict[str, str] = {
    "optimizer": "skypurza.services.optimizer.service:OptimizerService",
    "provisioner": "skypurza.services.provisioner.service:ProvisionerService",
    "ledger": "skypurza.services.ledger.service:LedgerService",
    "recovery": "skypurza.services.recovery.service:RecoveryService",
}

log = logging.getLogger("skypurza.serve")


def parse_services(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if names == ["all"] or not names:
        return list(SERVICES)
    unknown = [n for n in names if n not in SERVICES]
    if unknown:
        raise ValueError(f"unknown service(s): {', '.join(unknown)}; known: {', '.join(SERVICES)}, or 'all'")
    return names


def load_service(name: str) -> Any:
    module_name, _, cls_name = SERVICES[name].partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, cls_name)()


async def serve(url: str, stage: str, names: list[str], stop: asyncio.Event | None = None,
                ready: asyncio.Event | None = None, explicit: bool = True) -> None:
    stop = stop or asyncio.Event()
    bus = await Bus.connect(url, stage, source=f"/skypurza/{stage}/serve")
    tasks: list[asyncio.Task] = []
    runners: list[ServiceRunner] = []
    for name in names:
        try:
            svc = load_service(name)
        except ModuleNotFoundError as exc:
            if explicit:
                raise
            log.warning("service %s is not available in this build (%s); skipped", name, exc)
            continue
        if hasattr(svc, "run") and not hasattr(svc, "handle"):
            tasks.append(asyncio.create_task(svc.run(bus, stop), name=name))
        else:
            runner = ServiceRunner(bus, svc)
            runners.append(runner)
            tasks.append(asyncio.create_task(runner.run(), name=name))
        log.info("service %s started", name)
    log.info("services ready: %s", ", ".join(names))
    if ready:
        ready.set()
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
    for t in done:
        if t is not stopper and t.exception():
            log.error("service %s died: %r", t.get_name(), t.exception())
    stop.set()
    for r in runners:
        r.stop()
    if tasks:
        await asyncio.wait(tasks, timeout=10)
    for t in tasks:
        t.cancel()
    await bus.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m skypurza.cli.serve", description=__doc__)
    p.add_argument("--nats", required=True)
    p.add_argument("--stage", default="dev")
    p.add_argument("--services", default="all")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
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
        await serve(args.nats, args.stage, names, stop, explicit=args.services != "all")

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
