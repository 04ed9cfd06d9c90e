"""`python -m skypurza.services.agent <AgentSpec argv>`: run one node agent until it is told to stop."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from skypurza.events.agentspec import AgentSpec

from .agent import Agent


def _dump_tasks() -> None:
    """SIGUSR1: log where every asyncio task of the agent waits (for a stuck agent)."""
    import io

    for task in asyncio.all_tasks():
        buf = io.StringIO()
        task.print_stack(file=buf)
        logging.getLogger("skypurza.agent").warning("task %s:\n%s", task.get_name(), buf.getvalue())


def main(argv: list[str] | None = None) -> int:
    spec = AgentSpec.from_argv(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=os.environ.get("SKYPURZA_AGENT_LOG_LEVEL", "INFO"),
                        format=f"%(asctime)s agent[{spec.cluster}/{spec.rank}] %(levelname)s %(message)s")
    logging.getLogger("nats").setLevel(logging.WARNING)
    heartbeat_s = float(os.environ.get("SKYPURZA_AGENT_HEARTBEAT_S", "5"))
    grace_s = float(os.environ.get("SKYPURZA_AGENT_KILL_GRACE_S", "10"))

    async def run() -> int:
        agent = Agent(spec, heartbeat_s=heartbeat_s, kill_grace_s=grace_s)
        loop = asyncio.get_running_loop()
        # SIGTERM stops the agent, not the jobs: a restarted agent adopts them.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, agent.stop_event.set)
        loop.add_signal_handler(signal.SIGUSR1, _dump_tasks)
        return await agent.run()

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
