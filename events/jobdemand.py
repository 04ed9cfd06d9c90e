"""What a job asks of each of its nodes, read from its task as the bus carries it (pure).

Shared by the node agent, which packs jobs by it (services/agent/packing.py), and by the status
projection and `spz queue`, which show it (RESOURCES). A task declares `cpus` (`4`, `4+`: 4),
`memory` (`16`, `16+` GiB; `4x`: 4 GiB per CPU asked) and `accelerators` (fractional counts
such as `T4:0.5` allowed); a task that declares no cpus asks SkyPilot's default task demand of
0.5 CPU (`DEFAULT_TASK_CPU_DEMAND`, sky/backends/cloud_vm_ray_backend.py). Values were
checked at the edge (the task model); one this cannot read counts as not given, never raises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from skypurza.events.payloads import TaskPayload

DEFAULT_CPU_DEMAND = 0.5  # SkyPilot's DEFAULT_TASK_CPU_DEMAND: a job that declares no cpus


@dataclass(frozen=True)
class Demand:
    """What a job asks of each of its nodes."""

    cpus: float = DEFAULT_CPU_DEMAND
    memory_gib: float = 0.0
    accelerator: str | None = None
    accelerator_count: float = 0.0
    num_nodes: int = 1

    def describe(self) -> str:
        """SkyPilot's RESOURCES of `sky queue`: `1x[CPU:0.5]`, `2x[T4:0.5]`, plus what else it asked."""
        parts = [f"{self.accelerator}:{self.accelerator_count:g}"] if self.accelerator else []
        parts.append(f"CPU:{self.cpus:g}")
        if self.memory_gib:
            parts.append(f"{self.memory_gib:g}GB")
        return f"{self.num_nodes}x[{', '.join(parts)}]"

    def gpu_count(self) -> int:
        """How many GPU indices the job holds on a node (a fractional job holds part of one)."""
        if not self.accelerator or self.accelerator_count <= 0:
            return 0
        return max(1, math.ceil(self.accelerator_count - 1e-9))


def demand_options(task: TaskPayload) -> list[Demand]:
    """The job's demand under each of its resource alternatives, in the task's order (never
    empty). An alternative's unset fields are the top level's, as SkyPilot merges them."""
    res = task.resources
    nodes = max(1, task.nodes())
    if res is None:
        return [Demand(num_nodes=nodes)]
    out: list[Demand] = []
    for alt in (res.alternatives() or [res]):
        cpus = _amount(alt.cpus if alt.cpus is not None else res.cpus)
        memory = _memory(alt.memory if alt.memory is not None else res.memory, cpus)
        for name, count in _accelerators(alt.accelerators_given() or res.accelerators_given()) or [(None, 0.0)]:
            out.append(Demand(cpus=DEFAULT_CPU_DEMAND if cpus is None else cpus, memory_gib=memory,
                              accelerator=name, accelerator_count=count if name else 0.0, num_nodes=nodes))
    return out or [Demand(num_nodes=nodes)]


def describe_task(task: TaskPayload) -> str:
    """RESOURCES of a job whose cluster is not known here: its first alternative's demand."""
    return demand_options(task)[0].describe()


def _memory(value: Any, cpus: float | None) -> float:
    text = str(value).strip() if value is not None else ""
    if text.endswith("x"):
        ratio = _amount(text[:-1])
        return ratio * cpus if ratio is not None and cpus is not None else 0.0
    return (_amount(text) or 0.0) if text else 0.0


def _accelerators(value: Any) -> list[tuple[str, float]]:
    """Every accelerator a resources block offers, in order: `T4`, `T4:0.5`, `{T4: 1}`, lists."""
    out: list[tuple[str, float]] = []
    if value is None:
        return out
    if isinstance(value, str):
        text = value.strip()
        if text.startswith(("{", "[")):
            for part in text.strip("{}[]").split(","):
                out += _accelerators(part)
            return out
        name, _, count = text.partition(":")
        if name.strip():
            out.append((name.strip(), _amount(count) or 1.0))
    elif isinstance(value, dict):
        for k, v in value.items():
            out.append((str(k), _amount(v) or 1.0))
    elif isinstance(value, list):
        for item in value:
            out += _accelerators(item)
    return out


def _amount(value: Any) -> float | None:
    """`4`, `4.5`, `"4+"` -> 4.0 / 4.5; anything else -> None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        x = float(str(value).strip().rstrip("+"))
    except ValueError:
        return None
    return x if math.isfinite(x) and x >= 0 else None

