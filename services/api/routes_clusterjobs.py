"""`POST /api/v1/clusters/{name}/jobs`: a task queued as a job on a cluster that is up.

What `spz exec NAME` and `spz launch -c NAME` (on an existing cluster) do on the embedded bus,
decided by the same pure code: the task goes through the task spec as `POST /api/v1/tasks`
takes it (services/api/tasks.py: the overrides, the bounds, no local paths), the fit check and
the setup/autostop decision are `events/queueplan.plan_queue` (`events/clusterfit.py` inside),
and the job id is allocated by the log (`events/jobqueue.queue_job`), the JobQueued stamped with
the caller (events/principal.py) — its `user` is the caller whatever the task says.

`setup`: `if_changed` (launch: setup runs again only when it changed since the last job that
ran it), or `skip` (exec, and launch's --no-setup / --fast). `idle_minutes`, `down`,
`wait_for`: launch's -i, --down, --wait-for; an AutostopSet follows the JobQueued.

Who may: `submit` (a viewer may not), and `act` on the cluster's owner (the member who launched
it, or an admin). The job is stamped with the cluster's team when the caller is in it (or an
admin: services/api/workspaces.py `for_cluster`), and the admission policies see it as a
`cluster_job` before anything is published (services/api/extensions.py; a refusal is 403/422). Answers: 202 with the job id once it is in the log; 404 no such cluster (or a
terminated one); 409 a cluster that is not up (STOPPED: start it) or that the task does not fit
(more nodes, other accelerators ... than it was launched with); 422 a task the spec refuses.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Literal, Optional

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from skypurza.events import limits
from skypurza.events.cluster_events import AutostopSet
from skypurza.events.jobqueue import queue_job
from skypurza.events.principal import stamp
from skypurza.events.queueplan import QueueOn, Wanted, plan_queue

from . import workspaces
from .deps import ApiDeps, ClusterName
from .extensions import admitted_task
from .identity import Principal, authorize
from .problems import Problem, conflict, forbidden, not_found
from .routes_clusters import WaitFor, cluster_or_404
from .tasks import Refused, TaskOverrides, TaskRequest, load_task

log = logging.getLogger("skypurza.api")

TAKES_JOBS = ("UP", "INIT")  # INIT: a node was lost; the cluster still takes jobs


class QueueRequest(BaseModel):
    """A task to queue on an existing cluster. `user` and `team` are not fields: the server
    stamps the caller, so a body naming them is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str | dict[str, Any] = Field(description="The task YAML text, or the same as a JSON object.")
    overrides: TaskOverrides = TaskOverrides()
    setup: Literal["if_changed", "skip"] = Field(
        "if_changed", description="if_changed: run setup when it changed (spz launch -c); skip: never (spz exec, "
                                  "--no-setup, --fast).")
    down: bool = Field(False, description="Tear the cluster down when the job ends (--down).")
    idle_minutes: Optional[int] = Field(None, ge=0, le=limits.MAX_IDLE_MINUTES,
                                        description="Set autostop after this many idle minutes (-i).")
    wait_for: Optional[WaitFor] = Field(None, description="What autostop waits for (--wait-for); needs idle_minutes.")


def router(deps: ApiDeps) -> APIRouter:
    r = APIRouter(prefix="/api/v1/clusters", tags=["clusters"])
    caller = Depends(deps.principal)

    @r.post("/{name}/jobs", status_code=202, summary="Queue a task on an existing cluster (spz exec, spz launch -c)")
    async def queue(name: ClusterName, body: QueueRequest, who: Principal = caller) -> dict[str, Any]:
        if body.wait_for is not None and body.idle_minutes is None:
            raise Problem(422, "invalid-request", "Invalid request",
                          "wait_for goes with idle_minutes (--wait-for with -i)")
        # Whether they submit anywhere (their highest role); the cluster's team's role is checked below.
        decision = authorize(who, "submit", who.user, None)
        if not decision.allowed:
            raise forbidden(decision.reason)
        try:
            task = load_task(TaskRequest(task=body.task, overrides=body.overrides))
        except Refused as exc:
            raise Problem(422, "invalid-task", "Invalid task", exc.detail, problems=exc.problems)
        missing = not_found(f"cluster {name} does not exist; launch it with spz launch -c {name}")
        try:
            view = await cluster_or_404(deps, name)
        except Problem as exc:
            raise (missing if exc.status == 404 else exc) from None
        if view.status == "TERMINATED" or view.shape is None:
            raise missing
        decision = authorize(who, "act", *view.owner)
        if not decision.allowed:
            raise forbidden(decision.reason)
        if view.status not in TAKES_JOBS:
            raise conflict(f"cluster {name} is {view.status}" + (f": spz start {name}" if view.status == "STOPPED"
                                                                  else "; it takes jobs once it is UP"))
        who = workspaces.for_cluster(who, view.owner[1])
        decision = authorize(who, "submit", who.user, who.team)  # a viewer in the team the job is stamped with
        if not decision.allowed:
            raise forbidden(decision.reason)
        # As POST /tasks: the policies see the task (overrides applied) and may refuse or change
        # it; the fit and setup decisions below are made on what they leave.
        task = await admitted_task(deps.admission, "cluster_job", who, task, name)
        autostop = task.autostop()
        enabled = autostop is not None and autostop.enabled
        idle = body.idle_minutes if body.idle_minutes is not None else (autostop.idle_minutes if enabled else None)
        down = body.down or bool(enabled and autostop.down and body.idle_minutes is None)
        wanted = Wanted(nodes=task.num_nodes or 1, setup=task.setup, no_setup=body.setup == "skip",
                        idle_minutes=idle, down=down, requests=tuple(task.resource_requests()))
        plan = plan_queue(view.shape, view.set_up, view.idle_minutes, wanted)
        if not isinstance(plan, QueueOn):
            raise conflict(plan.message())
        b = deps.bus()
        task_id = str(uuid.uuid4())
        secret_values = task.secret_values()
        if secret_values:
            await b.put_secrets(task_id, secret_values, name)
        job, env = await queue_job(b, cluster=name, task_id=task_id, task=task.public_dict(), name=task.name,
                                   user=who.user, run_setup=plan.run_setup,
                                   secrets_key=task_id if secret_values else None, down_after=plan.down_after,
                                   principal=(who.user, who.team))
        if plan.autostop is not None:  # after the job, so the cluster is not idle in between
            await b.publish(stamp(b.envelope(AutostopSet(
                cluster=name, idle_minutes=plan.autostop.idle_minutes, down=plan.autostop.down,
                wait_for=body.wait_for or "jobs_and_ssh")), who.user, who.team))
        log.info("job %s queued on cluster %s by %s (team %s)", job.job_id, name, who.user, who.team)
        return {"cluster": name, "job_id": job.job_id, "task_id": task_id, "run_setup": plan.run_setup,
                "num_nodes": task.num_nodes or 1, "user": who.user, "team": who.team,
                "status": "PENDING"}

    return r
