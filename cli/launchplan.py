"""What `spz launch` does next on a cluster, decided apart from doing it.

A pure function of the cluster as the log has it (`clusterlog.Cluster`) and what the user asked
for (`Wanted`); `cmd_launch._launch` does the I/O and the printing. As `sky launch`:
- a STOPPED cluster is started again, in the same place (`StartStopped`), and the plan is then
  made again on the started cluster;
- on a cluster that is UP, or INIT (a node was lost: it still takes jobs), the task is queued
  as a job (`QueueOn`), unless it needs more nodes than the cluster has (`TooFewNodes`) or
  resources it was not launched with (`clusterfit.Misfit`: other accelerators, more CPUs or
  memory, another infra/region/zone/instance type, spot); setup runs again only when it changed
  (or never, with --no-setup); that part is `events/queueplan.plan_queue`, which the API server's
  `POST /api/v1/clusters/{name}/jobs` decides with too;
- anything else (no such cluster, or a terminated one) is a new task (`SubmitNew`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

# The queue-on decision is shared with the API server (events/queueplan.py); its names stay importable here.
from skypurza.events.queueplan import Autostop, QueueOn, SetUp, TooFewNodes, Wanted, plan_queue

from .clusterfit import Misfit
from .clusterlog import Cluster

__all__ = ["Autostop", "LaunchPlan", "Misfit", "QueueOn", "StartStopped", "SubmitNew", "TooFewNodes", "Wanted",
           "plan_launch"]


@dataclass(frozen=True)
class StartStopped:
    cluster: str


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
    last = cluster.last_setup()
    set_up = SetUp(ran=last is not None, setup=last.setup if last is not None else None)
    return plan_queue(cluster, set_up, cluster.idle_minutes, wanted)
