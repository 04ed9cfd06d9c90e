"""What `spz launch` does next on a cluster, decided apart from doing it.

A pure function of the cluster as the log has it (`clusterlog.Cluster`) and what the user asked
for (`Wanted`); `cmd_launch._launch` does the I/O and the printing. As `sky launch`:
- a STOPPED cluster is started again, in the same place (`StartStopped`), and the plan is then
  made again on the started cluster;
- on a cluster that is UP, or INIT (a node was lost: it still takes jobs), the task is queued
  as a job (`QueueOn`), unless it needs more nodes than the cluster has (`TooFewNodes`) or
  resources it was not launched with (`clusterfit.Misfit`: other accelerators, more CPUs or
  memory, another infra/region/zone/instance type, spot); setup runs again only when it changed
  (or never, with --no-setup);
- anything else (no such cluster, or a terminated one) is a new task (`SubmitNew`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from skypurza.events.taskspec.request import ResourceRequest

from .clusterfit import Misfit, misfit
from .clusterlog import Cluster
from .submit import setup_changed


@dataclass(frozen=True)
class Wanted:
    """What the user asked for: the task's nodes and setup, and the launch flags."""

    nodes: int  # the task's num_nodes (1 when it names none)
    setup: str | None
    no_setup: bool = False
    idle_minutes: int | None = None  # -i, else the task's autostop
    down: bool = False  # --down, or the task's autostop with down
    requests: tuple[ResourceRequest, ...] = ()  # the task's resource alternatives (none: any)


@dataclass(frozen=True)
class StartStopped:
    cluster: str


@dataclass(frozen=True)
class TooFewNodes:
    cluster: str
    needs: int
    has: int

    def message(self) -> str:
        return f"the task needs {self.needs} nodes; cluster {self.cluster} has {self.has}"


@dataclass(frozen=True)
class Autostop:
    """The AutostopSet to publish after the job is queued (so the cluster is never idle between)."""

    idle_minutes: int
    down: bool


@dataclass(frozen=True)
class QueueOn:
    cluster: str
    run_setup: bool
    down_after: bool  # JobQueued.down_after: tear down when this job ends
    autostop: Autostop | None


@dataclass(frozen=True)
class SubmitNew:
    cluster: str
    num_nodes: int


LaunchPlan = Union[StartStopped, TooFewNodes, Misfit, QueueOn, SubmitNew]

TAKES_JOBS = ("UP", "INIT")  # INIT: a node was lost; the cluster still takes jobs


def plan_launch(cluster: Cluster, wanted: Wanted) -> LaunchPlan:
    if cluster.status == "STOPPED":
        return StartStopped(cluster.name)
    if cluster.status not in TAKES_JOBS:
        return SubmitNew(cluster.name, wanted.nodes)
    if wanted.nodes > cluster.num_nodes:
        return TooFewNodes(cluster.name, wanted.nodes, cluster.num_nodes)
    unfit = misfit(cluster, wanted.requests, wanted.nodes)
    if unfit is not None:
        return unfit
    last = cluster.last_setup()
    run_setup = not wanted.no_setup and (last is None or setup_changed(wanted.setup, last.setup))
    # `--down` alone on a cluster that has an autostop interval becomes "down as soon as idle".
    autostop = None
    if wanted.idle_minutes is not None or (wanted.down and cluster.idle_minutes is not None):
        autostop = Autostop(wanted.idle_minutes if wanted.idle_minutes is not None else 0, wanted.down)
    return QueueOn(cluster.name, run_setup, down_after=wanted.down and wanted.idle_minutes is None, autostop=autostop)
