"""Where a cluster can be reached: its head node's address and the ports its task opened.

What `spz status --ip / --endpoints / -v` print, read the same by the CLI's fold of the log
(cli/clusterlog.py) and by the API server's (services/api/clusterview.py). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def head_ip(nodes: Iterable[Any]) -> str | None:
    """Rank 0's public address, else its private one (None: no rank 0 reported yet)."""
    for node in nodes:
        if getattr(node, "rank", None) == 0:
            return node.public_ip or node.private_ip
    return None


def task_ports(task: Any) -> tuple[str, ...]:
    """The task's resources.ports (one port, a range, or a list of them), as strings."""
    resources = getattr(task, "resources", None)
    ports = resources.ports if resources is not None else None
    if ports is None:
        return ()
    return tuple(str(p) for p in (ports if isinstance(ports, list) else [ports]))


def expand_ports(ports: Iterable[str]) -> list[int]:
    """`8080`, `8000-8010` -> every port, in order, once."""
    out: list[int] = []
    for p in ports:
        low, _, high = str(p).partition("-")
        for port in range(int(low), int(high or low) + 1):
            if port not in out:
                out.append(port)
    return out
