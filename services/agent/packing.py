"""Which queued jobs of a cluster start now: FIFO admission packed by cpus, memory and GPUs.

Pure (no I/O, no clock). SkyPilot 0.14.1 runs a cluster's jobs concurrently when their declared
resources fit (`examples/job_queue/*`: two `T4:0.5` jobs share one GPU, `cpus: 1` jobs share a
node); this is that rule, derived from log facts only:

- the queue is the cluster's unended jobs in job-id order (`JobQueued`), each with whether it
  has started (`JobStarted`) and the GPU indices its `JobStarted` recorded;
- a started job always holds its resources (admission is monotonic: once started, never
  un-started, whatever the numbers say — an old log ran jobs one at a time);
- the first job that has not started is admitted when it fits beside every running one and
  every job admitted before it in this call; **strict FIFO**: a job that does not fit stops the
  scan, so a later small job never jumps an earlier big one (no starvation, and every node
  derives the same answer from the same log). Ray, under SkyPilot, may let a later placement
  group through; we do not;
- a job runs on ranks `0..num_nodes-1` (a 1-node job on the head), with the same per-node
  demand on each, so every node's load is a subset of the head's: checking the head is checking
  every node of the job;
- demand per node (events/jobdemand.py): the task's `cpus`, else SkyPilot's default task demand
  of 0.5 CPU; `memory` in GiB, else none; accelerators with fractional counts; of a task with
  alternatives, the first whose accelerator the cluster has;
- capacity per node: what the cluster was provisioned with (`ClusterProvisioned.candidate`:
  vcpus, memory GiB, accelerators); unknown vcpus leave room for one default job at a time
  (`capacity_of`), unknown memory does not limit;
- GPUs as Ray hands them out: a whole-GPU job gets `ceil(count)` GPU indices that nothing else
  uses, the lowest free ones; a fractional job (`T4:0.5`) shares one index with other fractional
  jobs, the fullest one it fits on (best fit, then the lowest index);
- a job that could not run even on an empty cluster (only possible when it got past the launch
  check, `events/clusterfit.py`, e.g. the capacity was not known then) runs alone once nothing else
  runs, as every job ran before packing, rather than blocking the queue for ever.

Amounts are counted in units of 1/10000 (Ray's precision), so 0.1 + 0.2 fits in 0.3.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skypurza.events.jobdemand import DEFAULT_CPU_DEMAND, Demand, demand_options
from skypurza.events.payloads import TaskPayload

__all__ = ["DEFAULT_CPU_DEMAND", "Admission", "Capacity", "Demand", "QueuedJob", "admit", "capacity_of", "demand_of"]

UNKNOWN_CPUS = DEFAULT_CPU_DEMAND  # CPUs of a node the log does not describe: one job at a time
UNIT = 10_000  # amounts are integers of 1/UNIT
WHOLE = UNIT  # one whole GPU


def units(x: float) -> int:
    return int(round(x * UNIT))


@dataclass(frozen=True)
class Capacity:
    """One node of the cluster (every node is alike); None: not known, so not limiting."""

    num_nodes: int = 1
    cpus: float | None = None
    memory_gib: float | None = None
    accelerators: Mapping[str, int] = field(default_factory=dict)  # name -> GPUs per node

    def gpus_named(self, name: str | None) -> tuple[str, int] | None:
        """The cluster's spelling of an accelerator and its count per node (names match in any case)."""
        if not name:
            return None
        for have, count in self.accelerators.items():
            if have.lower() == name.lower():
                return have, count
        return None


@dataclass(frozen=True)
class QueuedJob:
    job_id: int
    demand: Demand
    started: bool = False
    gpu_indices: tuple[int, ...] | None = None  # as its JobStarted recorded them (None: not recorded)


@dataclass(frozen=True)
class Admission:
    job_id: int
    gpu_indices: tuple[int, ...] = ()  # the node's GPU indices it may use (CUDA_VISIBLE_DEVICES)


@dataclass
class _Load:
    """What the running jobs hold on the head node, which holds at least what any node holds."""

    capacity: Capacity
    cpus: int = 0
    memory: int = 0
    jobs: int = 0

    def __post_init__(self) -> None:
        self.gpu_free: dict[str, list[int]] = {n: [WHOLE] * max(0, int(c)) for n, c in self.capacity.accelerators.items()}

    def pick(self, d: Demand) -> tuple[int, ...] | None:
        """The GPU indices `d` would get now, () when it needs none, None when they are not free."""
        need = d.gpu_count()
        if need == 0:
            return ()
        named = self.capacity.gpus_named(d.accelerator)
        if named is None:
            return None
        free = self.gpu_free[named[0]]
        if d.accelerator_count < 1:
            want = units(d.accelerator_count)
            fits = [i for i, f in enumerate(free) if f >= want]
            return (min(fits, key=lambda i: (free[i], i)),) if fits else None
        whole = [i for i, f in enumerate(free) if f == WHOLE]
        return tuple(whole[:need]) if len(whole) >= need else None

    def fits(self, d: Demand) -> tuple[int, ...] | None:
        c = self.capacity
        if d.num_nodes > c.num_nodes:
            return None
        if c.cpus is not None and self.cpus + units(d.cpus) > units(c.cpus):
            return None
        if c.memory_gib is not None and self.memory + units(d.memory_gib) > units(c.memory_gib):
            return None
        return self.pick(d)

    def take(self, d: Demand, indices: Sequence[int]) -> None:
        self.cpus += units(d.cpus)
        self.memory += units(d.memory_gib)
        self.jobs += 1
        named = self.capacity.gpus_named(d.accelerator)
        if named is None or d.gpu_count() == 0:
            return
        free = self.gpu_free[named[0]]
        share = units(d.accelerator_count) if d.accelerator_count < 1 else WHOLE
        for i in indices:
            if 0 <= i < len(free):
                free[i] = max(0, free[i] - share)


def fits_empty(capacity: Capacity, demand: Demand) -> bool:
    """Whether the job could run on the cluster with nothing else running."""
    return _Load(capacity).fits(demand) is not None


def admit(capacity: Capacity, queue: Sequence[QueuedJob]) -> list[Admission]:
    """The jobs to start now, in order, each with its GPU indices.

    `queue`: the cluster's unended jobs, in job-id order. Started ones hold what they hold (their
    recorded GPU indices, or the ones they would get in order when none were recorded); then
    the ones not started are admitted FIFO while they fit (module docstring).
    """
    load = _Load(capacity)
    running = [j for j in queue if j.started]
    for job in running:
        indices = job.gpu_indices if job.gpu_indices is not None else (load.pick(job.demand) or ())
        load.take(job.demand, indices)
    out: list[Admission] = []
    for job in queue:
        if job.started:
            continue
        indices = load.fits(job.demand)
        if indices is None and load.jobs == 0 and not fits_empty(capacity, job.demand):
            indices = _everything(capacity, job.demand)  # runs alone (module docstring)
        if indices is None:
            break  # strict FIFO: nothing behind it jumps the queue
        load.take(job.demand, indices)
        out.append(Admission(job.job_id, tuple(indices)))
        if not fits_empty(capacity, job.demand):
            break  # an oversized job runs alone
    return out


def _everything(capacity: Capacity, demand: Demand) -> tuple[int, ...]:
    named = capacity.gpus_named(demand.accelerator)
    return tuple(range(named[1])) if named else ()


# ------------------------------------------------------------------------ from the log's facts

def capacity_of(candidate: Any, num_nodes: int) -> Capacity:
    """A node's capacity from `ClusterProvisioned.candidate`.

    A cluster whose CPUs the log does not know (no ClusterProvisioned, or a candidate without
    vcpus) gets room for one default job: it runs one job at a time, as every cluster did before
    packing — never more at once than it may hold. Unknown memory does not limit. Accelerator
    counts are whole GPUs per node: a local cluster placed for `T4:0.5` holds one GPU of the
    machine per node (the optimizer reserves `ceil(count)` per node there)."""
    if candidate is None:
        return Capacity(num_nodes=num_nodes, cpus=UNKNOWN_CPUS)
    accs = {str(k): max(1, math.ceil(float(v) - 1e-9)) if v else 1
            for k, v in (candidate.accelerators or {}).items()}
    return Capacity(num_nodes=num_nodes, cpus=_positive(candidate.vcpus) or UNKNOWN_CPUS,
                    memory_gib=_positive(candidate.memory_gib), accelerators=accs)


def demand_of(task: TaskPayload, capacity: Capacity) -> Demand:
    """A job's demand per node from its task: the first alternative the cluster can hold."""
    options = demand_options(task)
    return next((d for d in options if d.accelerator is None or capacity.gpus_named(d.accelerator) is not None),
                options[0])


def _positive(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) and x > 0 else None
