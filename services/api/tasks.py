"""`POST /api/v1/tasks`: from a request body to the TaskSubmitted the CLI would publish.

The body is the task (YAML text or the same as a mapping) and the overrides `spz launch` has;
it goes through the same task spec (load, overrides, validation, bounds) as the CLI, and the
submission is stamped with the authenticated caller: the task's labels and the body cannot
choose the user or team. Pure, but for the task spec's parsing (which reads no file here: the
text is always parsed as text).

Local paths (a workdir, a file mount's source) name the client's disk, which the server cannot
read: they are refused, with what to use instead (a git workdir, a bucket URL).
"""

from __future__ import annotations

import secrets as _secrets
from dataclasses import dataclass
from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from skypurza.events import limits, naming
from skypurza.events.task_events import TaskSubmitted

from .identity import Principal

# A request body: a task file at its bound, with room for the overrides around it.
MAX_BODY_BYTES = limits.MAX_YAML_FILE_BYTES + limits.MAX_ENV_TOTAL_BYTES + 64 * limits.KIB

_Short = Annotated[str, Field(min_length=1, max_length=256)]
_Vars = Annotated[dict[Annotated[str, Field(max_length=limits.MAX_ENV_NAME_CHARS)],
                       Annotated[str, Field(max_length=limits.MAX_ENV_VALUE_BYTES)]],
                  Field(max_length=limits.MAX_ENV_VARS)]


Workspace = Annotated[str, Field(min_length=1, max_length=63, pattern=naming.PRINCIPAL_NAME_PATTERN)]
WORKSPACE_DESCRIPTION = ("The workspace (team) to run in (-w): a member's own team (the default); an admin's any "
                         "team. Its allowed infras confine the placement; its labels are the task's defaults.")


class TaskOverrides(BaseModel):
    """The overrides of `spz launch` (`sky launch`), by the flag's name; the task spec checks values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    infra: Optional[_Short] = None
    gpus: Optional[_Short] = None
    cpus: Optional[_Short] = None
    memory: Optional[_Short] = None
    instance_type: Optional[_Short] = None
    use_spot: Optional[bool] = None
    num_nodes: Optional[Annotated[int, Field(ge=1, le=limits.MAX_NODES)]] = None
    disk_size: Optional[Annotated[int, Field(ge=1, le=limits.MAX_DISK_GB)]] = None
    image_id: Optional[_Short] = None
    envs: _Vars = {}
    secrets: _Vars = {}
    name: Optional[Annotated[str, Field(min_length=1, max_length=limits.MAX_TASK_NAME_CHARS)]] = None
    disk_tier: Optional[_Short] = None
    network_tier: Optional[_Short] = None
    local_disk: Optional[_Short] = None
    ports: Optional[Annotated[list[_Short], Field(max_length=limits.MAX_PORT_ENTRIES)]] = None
    priority: Optional[_Short] = None
    git_url: Optional[Annotated[str, Field(min_length=1, max_length=2048)]] = None
    git_ref: Optional[_Short] = None


class TaskRequest(BaseModel):
    """A task to launch on a new cluster. `user` and `team` are not fields: the server stamps the
    caller, so a body naming them is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str | dict[str, Any] = Field(description="The task YAML text, or the same as a JSON object.")
    cluster: Optional[Annotated[str, Field(min_length=1, max_length=limits.MAX_CLUSTER_NAME_CHARS)]] = Field(
        None, description="The cluster's name (-c); made up when left out.")
    overrides: TaskOverrides = TaskOverrides()
    down: bool = Field(False, description="Tear the cluster down when the job ends (--down).")
    idle_minutes: Optional[Annotated[int, Field(ge=0, le=limits.MAX_IDLE_MINUTES)]] = Field(
        None, description="Stop the cluster after this many idle minutes (-i).")
    workspace: Optional[Workspace] = Field(None, description=WORKSPACE_DESCRIPTION)


class Refused(Exception):
    """The request names a task the spec refuses: `detail` says what to change (422)."""

    def __init__(self, detail: str, problems: list[str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.problems = problems or []


@dataclass(frozen=True)
class Submission:
    event: TaskSubmitted
    secret_values: dict[str, str]


def cluster_name(given: str | None, user: str) -> str:
    if given is not None:
        if not naming.valid_cluster_name(given):
            raise Refused(f"invalid cluster name {given!r}: {naming.CLUSTER_NAME_RULE}")
        return given
    return naming.generated_cluster_name(user, _secrets.token_hex(2))


def _task_text(task: str | dict[str, Any]) -> str:
    if isinstance(task, dict):
        import yaml

        return yaml.safe_dump(task, sort_keys=False)
    # The task spec reads a one-line string ending in .yaml as a path; a request's task is text.
    return task if task.endswith("\n") else task + "\n"


def _cli_overrides(o: TaskOverrides) -> Any:
    from skypurza.events.taskspec import CliOverrides

    return CliOverrides(infra=o.infra, gpus=o.gpus, cpus=o.cpus, memory=o.memory, instance_type=o.instance_type,
                        use_spot=o.use_spot, num_nodes=o.num_nodes, disk_size=o.disk_size, image_id=o.image_id,
                        envs=dict(o.envs), secrets=dict(o.secrets), name=o.name, disk_tier=o.disk_tier,
                        network_tier=o.network_tier, local_disk=o.local_disk,
                        ports=tuple(o.ports) if o.ports is not None else None, priority=o.priority,
                        git_url=o.git_url, git_ref=o.git_ref)


def load_task(request: TaskRequest) -> Any:
    """The one task of the request, with its overrides, validated as `spz launch` validates it."""
    loaded = load_tasks_of(request.task, request.overrides)
    if len(loaded.tasks) != 1:
        raise Refused(f"the task holds {len(loaded.tasks)} tasks (a pipeline or job group); a cluster runs one "
                      "task at a time")
    return loaded.tasks[0]


def load_tasks_of(task: str | dict[str, Any], overrides: TaskOverrides) -> Any:
    """Every task of a request's YAML (a pipeline or a job group allowed: the loader's TaskFile),
    validated as `spz jobs launch` validates them: the overrides' envs and secrets apply to every
    task, the other overrides to a single task only (as SkyPilot, and the CLI)."""
    from dataclasses import replace

    from skypurza.events.taskspec import TaskSpecError, apply_overrides, load_tasks

    text = _task_text(task)
    if len(text.encode()) > limits.MAX_YAML_FILE_BYTES:
        raise Refused(f"the task is {len(text.encode()):,} bytes; at most {limits.MAX_YAML_FILE_BYTES:,}")
    cli = _cli_overrides(overrides)
    try:
        loaded = load_tasks(text, env_overrides=dict(cli.envs), secret_overrides=dict(cli.secrets),
                            filename="task")
        if loaded.at_launch:
            raise TaskSpecError(loaded.at_launch)
        if len(loaded.tasks) == 1 and not loaded.is_job_group:
            loaded = replace(loaded, tasks=[apply_overrides(loaded.tasks[0], cli)])
        elif overrides.model_dump(exclude={"envs", "secrets"}, exclude_defaults=True):
            what = "job group" if loaded.is_job_group else "pipeline"
            raise Refused(f"the overrides other than envs and secrets apply to one task; the task is a {what} of "
                          f"{len(loaded.tasks)} tasks: set them in its YAML")
    except TaskSpecError as exc:
        problems = [str(p) for p in exc.problems][:50]
        raise Refused(f"the task is not valid: {problems[0] if problems else exc}", problems) from None
    for t in loaded.tasks:
        _refuse_local_paths(t)
    return loaded


def _local(value: Any) -> bool:
    return isinstance(value, str) and "://" not in value


def _refuse_local_paths(task: Any) -> None:
    local = []
    if _local(task.workdir):
        local.append(f"workdir {task.workdir}")
    for dst, src in (task.file_mounts or {}).items():
        source = src if isinstance(src, str) else getattr(src, "source", None)
        if _local(source):
            local.append(f"file_mounts.{dst} from {source}")
    if local:
        raise Refused(f"{'; '.join(local)}: a local path is on your machine, which the API server cannot read; "
                      "use a git workdir (overrides.git_url) or a bucket URL (s3://...)")


def build_submission(request: TaskRequest, principal: Principal, task_id: str, task: Any = None,
                     default_labels: dict[str, str] | None = None) -> Submission:
    """The TaskSubmitted for `request` by `principal`: the caller's user and team, whatever the task claims.
    `task`: the request's task loaded already (and admitted: services/api/extensions.py);
    `default_labels`: the workspace's (services/api/workspaces.py), under the task's own."""
    from .workspaces import with_default_labels

    task = load_task(request) if task is None else task
    cluster = cluster_name(request.cluster, principal.user)
    autostop = task.autostop()
    enabled = autostop is not None and autostop.enabled
    idle = request.idle_minutes if request.idle_minutes is not None else (autostop.idle_minutes if enabled else None)
    down = request.down or bool(enabled and autostop.down and request.idle_minutes is None)
    labels = dict(task.resources.labels or {}) if task.resources is not None and task.resources.labels else {}
    labels = {**(default_labels or {}), **labels}
    secret_values = task.secret_values()
    public = with_default_labels(task.public_dict(), default_labels or {})
    event = TaskSubmitted(task_id=task_id, cluster=cluster, task=public, num_nodes=task.num_nodes or 1,
                          user=principal.user, team=principal.team, project=labels.get("project"),
                          secrets_key=task_id if secret_values else None, down=down, idle_minutes=idle)
    return Submission(event, secret_values)
