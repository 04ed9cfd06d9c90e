"""`python -m skypurza.services.agent.spare`: a node agent started before its node exists.

A cold agent process spends most of its start importing (the event models, nats-py, the task
spec: ~0.35 s of CPU on a 2-core machine), and its first job pays the task spec's import again.
The `local` backend keeps one spare process that has already done both; a launch hands it the
node's agent argv and it becomes that node's agent (issue 21: a new local node,
PlacementChosen → NodeReady).

Protocol, on stdin: one JSON line `{"argv": [...AgentSpec.to_argv()], "home": "...", "log": "..."}`.
The spare then starts a session of its own (it outlives the control plane, as a cold agent does),
moves to the node's home, sends its output to the node's log and runs the agent's `main(argv)`.
End of input before a line (the backend closed it or died) ends the spare: it never runs
anything it was not handed. A line it cannot read is one line on stderr and exit 2.
"""

from __future__ import annotations

import json
import os
import sys

# What the agent imports after NodeReady (node samples, a local node's user environment) and its
# first job (the task spec), done while the spare waits: the reason it exists.
import venv  # noqa: F401

from skypurza.events.taskspec.task import Task  # noqa: F401

from . import sampling  # noqa: F401

from .__main__ import EXIT_BAD_SETTING, main as agent_main

MAX_LINE_BYTES = 1 << 20  # a gang's argv is O(1) per node (node IPs are in a file)


def parse_handoff(line: bytes) -> tuple[list[str], str, str]:
    """The agent argv, the node's home and its log file, checked (pure)."""
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"hand-off line longer than {MAX_LINE_BYTES} bytes")
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("hand-off is not an object")
    argv, home, log_file = data.get("argv"), data.get("home"), data.get("log")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError("hand-off argv is not a list of strings")
    if not isinstance(home, str) or not home or not isinstance(log_file, str) or not log_file:
        raise ValueError("hand-off home and log must be non-empty strings")
    return argv, home, log_file


def _become(home: str, log_file: str) -> None:
    """This process as a cold agent would have been started: its output in the node's log (what
    fails after this is said there), its own session, the node's home as its directory."""
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if os.getsid(0) != os.getpid():  # the backend starts spares in a session of their own already
        os.setsid()
    os.chdir(home)


def run() -> int:
    line = sys.stdin.buffer.readline(MAX_LINE_BYTES + 1)
    if not line.strip():
        return 0  # no node for this spare: the backend closed or went away
    try:
        argv, home, log_file = parse_handoff(line)
        _become(home, log_file)
    except (ValueError, OSError) as exc:
        print(f"spz agent spare: {exc}", file=sys.stderr)
        return EXIT_BAD_SETTING
    return agent_main(argv)


if __name__ == "__main__":
    sys.exit(run())
