"""What queueing a task on a cluster that is up means: which setup runs, what autostop follows.

Pure, one copy for both ways of asking: `spz launch -c NAME` on the embedded bus
(cli/launchplan.py, after it has decided the cluster takes jobs) and
`POST /api/v1/clusters/{name}/jobs` through an API server (services/api/routes_clusterjobs.py).
As `sky launch` on an existing cluster:
- a task needing more nodes than the cluster has is refused (`TooFewNodes`), and one asking for
  resources it was not launched with (`clusterfit.Misfit`);
- setup runs again only when it changed since the last job that ran it (or never, with
  --no-setup / --fast, and never for `spz exec`);
- -i sets autostop after the job is queued (so the cluster is never idle in between); `--down`
  alone on a cluster that already has an autostop interval becomes "down as soon as idle", else
  it tears the cluster down when this job ends (`down_after`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from .clusterfit import FitShape, Misfit, misfit
from .taskspec.request import ResourceRequest


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
class SetUp:
    """What the cluster's nodes were set up with: the setup of the last job that ran it."""

    ran: bool  # some job of this cluster ran setup (False: setup runs whatever the task's is)
    setup: str | None = None


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


QueuePlan = Union[TooFewNodes, Misfit, QueueOn]


def setup_changed(new_setup: str | None, last_setup: str | None) -> bool:
    """A relaunch runs setup again only when the setup script differs from the cluster's last job's."""
    return (new_setup or "").strip() != (last_setup or "").strip()


def plan_queue(cluster: FitShape, set_up: SetUp, idle_minutes: int | None, wanted: Wanted) -> QueuePlan:
    """The job to queue on `cluster` (UP or INIT: it takes jobs), whose autostop interval is
    `idle_minutes` now, or why the task cannot go there."""
    if wanted.nodes > cluster.num_nodes:
        return TooFewNodes(cluster.name, wanted.nodes, cluster.num_nodes)
    unfit = misfit(cluster, wanted.requests, wanted.nodes)
    if unfit is not None:
        return unfit
    run_setup = not wanted.no_setup and (not set_up.ran or setup_changed(wanted.setup, set_up.setup))
    autostop = None
    if wanted.idle_minutes is not None or (wanted.down and idle_minutes is not None):
        autostop = Autostop(wanted.idle_minutes if wanted.idle_minutes is not None else 0, wanted.down)
    return QueueOn(cluster.name, run_setup, down_after=wanted.down and wanted.idle_minutes is None, autostop=autostop)
