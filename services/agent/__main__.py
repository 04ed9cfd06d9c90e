"""`python -m skypurza.services.agent <AgentSpec argv>`: run one node agent until it is told to stop.

Its settings (settings.py) are read first: a bad value is one line on stderr and exit 2; so are bus
credentials (SKYPURZA_NATS_CREDS) that are missing, broken or refused."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from skypurza.events.agentspec import READY_FD_VAR, AgentSpec
from skypurza.events.bus import CANNOT_CONNECT
from skypurza.events.settings import SettingsError

from .agent import Agent
from .settings import AgentSettings

EXIT_BAD_SETTING = 2


def _dump_tasks() -> None:
    """SIGUSR1: log where every asyncio task of the agent waits (for a stuck agent)."""
    import io

    for task in asyncio.all_tasks():
        buf = io.StringIO()
        task.print_stack(file=buf)
        logging.getLogger("skypurza.agent").warning("task %s:\n%s", task.get_name(), buf.getvalue())


def _ready_fd() -> int | None:
    """The local backend's ready pipe, taken out of the environment so no job inherits its name."""
    value = os.environ.pop(READY_FD_VAR, "")
    try:
        fd = int(value)
    except ValueError:
        return None
    return fd if fd > 2 else None


def main(argv: list[str] | None = None) -> int:
    spec = AgentSpec.from_argv(sys.argv[1:] if argv is None else argv)
    ready_fd = _ready_fd()
    try:
        settings = AgentSettings.load()
    except SettingsError as exc:
        print(f"spz agent: {exc}", file=sys.stderr)
        return EXIT_BAD_SETTING
    logging.basicConfig(level=settings.log_level,
                        format=f"%(asctime)s agent[{spec.cluster}/{spec.rank}] %(levelname)s %(message)s")
    logging.getLogger("nats").setLevel(logging.WARNING)

    async def run() -> int:
        agent = Agent(spec, heartbeat_s=settings.heartbeat_s, kill_grace_s=settings.kill_grace_s,
                      checkpoint_sync_s=settings.checkpoint_sync_s, bucket_store=settings.bucket_store,
                      sample_s=settings.sample_s, xid_source=settings.xid_source, ready_fd=ready_fd,
                      gpu_source=settings.gpu_source, tool_timeout_s=settings.tool_timeout_s)
        loop = asyncio.get_running_loop()
        # SIGTERM stops the agent, not the jobs: a restarted agent adopts them.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, agent.stop_event.set)
        loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
        return await agent.run()

    try:
        return asyncio.run(run())
    except CANNOT_CONNECT as exc:  # which file, what is wrong; never a traceback
        print(f"spz agent: {exc}", file=sys.stderr)
        return EXIT_BAD_SETTING


if __name__ == "__main__":
    sys.exit(main())
