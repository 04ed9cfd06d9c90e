"""The task: one SkyPilot 0.14.1 task YAML document as a pydantic model.

`Task.model_validate(yaml_dict)` behaves like SkyPilot's loader: envs and secrets values are
str()-ed, `$VAR`/`${VAR}` are filled into file_mounts/service/workdir/volumes (the written
templates are kept, so a dump reads like the input), and null envs are refused (give them with
`--env`). Use `load_tasks` for files: it adds line/column to every problem.
"""

# No `from __future__ import annotations` in the model modules: pydantic would evaluate every
# field's annotation string with eval() when the class is made (~10 ms of a cold check-yaml, issue 21).

import copy
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import AfterValidator, Field, PrivateAttr, Tag, field_validator, model_validator
from pydantic_core import core_schema

from . import public
from ._base import NotNull, Strict, choose, is_dict, is_list, is_str, spz_error, tag
from .checks import (
    env_name_problem,
    env_value_problem,
    environment_problem,
    mount_destination_problem,
    num_nodes_problem,
    script_problem,
    task_name_problem,
    workdir_mount_problem,
)
from .config import TaskConfig
from .envsubst import SUBSTITUTED_FIELDS, stringify, substitute, variables_of
from .resources import AutostopConfig, Resources
from .service import Service
from .storage import Storage, VolumeMount
from .values import ENV_NAME_RE, parse_autostop

from skypurza.events.limits import (
    MAX_ENV_NAME_CHARS,
    MAX_ENV_VARS,
    MAX_MOUNTS,
    MAX_NODES,
)

if TYPE_CHECKING:
    from .request import ResourceRequest
    from .values import Autostop

Num = int | float


class WorkdirGit(Strict):
    url: str
    ref: Annotated[str | None, NotNull] = None


Workdir = Annotated[
    Union[Annotated[str, Tag(tag("str"))], Annotated[WorkdirGit, Tag(tag("git"))]],
    choose("a local directory or a git mapping {url, ref}", ("str", is_str), ("git", is_dict)),
]
FileMount = Annotated[
    Union[Annotated[str, Tag(tag("str"))], Annotated[Storage, Tag(tag("storage"))]],
    choose("a local path, a bucket URL (s3://…) or a storage mapping {name, source, store, mode}",
           ("str", is_str), ("storage", is_dict)),
]
TaskVolume = Annotated[
    Union[Annotated[str, Tag(tag("str"))], Annotated[dict[str, Any], Tag(tag("dict"))]],
    choose("a volume name or a volume mapping", ("str", is_str), ("dict", is_dict)),
]


class _EnvValue:
    """An env value: a string, or null meaning "required: give it with --env" (refused if still null)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(_check_env_value_given, handler(source))


def _check_env_value_given(value: Any) -> Any:
    if value is None:
        raise spz_error("environment variable {key} has no value (null in the YAML): give it on the "
                        "command line with --env {key}=VALUE (use '' for an empty value)")
    check_env_value(value)
    return value


def check_env_value(value: Any) -> None:
    problem = env_value_problem(value) if isinstance(value, str) else None
    if problem:
        raise spz_error(problem)


def _check_env_name(name: str) -> str:
    problem = env_name_problem(name)
    if problem:
        raise spz_error(problem)
    return name


class _EnvName:
    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(_check_env_name, handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict[str, Any]:
        out = handler(schema)
        out["pattern"] = ENV_NAME_RE.pattern
        return dict(out)


EnvName = Annotated[str, _EnvName()]
EnvValue = Annotated[str | None, _EnvValue()]
def _check_secret_name(name: str) -> str:
    if len(name) > MAX_ENV_NAME_CHARS:
        raise spz_error(f"secret name of {len(name):,} characters: at most {MAX_ENV_NAME_CHARS}")
    return name


def _check_secret_value(value: Any) -> Any:
    check_env_value(value)
    return value


SecretName = Annotated[str, AfterValidator(_check_secret_name)]
SecretValue = Annotated[str | None, AfterValidator(_check_secret_value)]
Secrets = Annotated[
    Union[Annotated[dict[SecretName, SecretValue], Tag(tag("dict"))],
          Annotated[list[SecretName], Tag(tag("list"))]],
    choose("a mapping {NAME: value or null} or a list of secret names", ("dict", is_dict), ("list", is_list)),
]


Mounts = Field(max_length=MAX_MOUNTS)


class MountPath(Strict):
    mount_path: Annotated[str | None, NotNull] = None


ManagedSecret = Annotated[
    Union[Annotated[str, Tag(tag("str"))], Annotated[Annotated[dict[str, MountPath], Field(max_length=1)], Tag(tag("dict"))]],
    choose("a secret name or {NAME: {mount_path: PATH}}", ("str", is_str), ("dict", is_dict)),
]


class Task(Strict):
    """One task of a SkyPilot task YAML (all keys optional)."""

    name: Annotated[str | None, NotNull, Field(description="Task name.")] = None
    workdir: Annotated[Workdir | None, NotNull, Field(description=(
        "Local directory synced to ~/sky_workdir, or a git repository {url, ref}."))] = None
    event_callback: Annotated[str | None, NotNull] = None
    num_nodes: Annotated[int | None, NotNull, Field(description=f"Number of nodes (default 1, at most {MAX_NODES}).")] = None
    resources: Annotated[Resources | None, NotNull] = None
    file_mounts: Annotated[Annotated[dict[str, FileMount], Mounts] | None, NotNull, Field(description=(
        "REMOTE_PATH: local path, bucket URL, or storage mapping."))] = None
    service: Annotated[Service | None, NotNull] = None
    pool: Annotated[Service | None, NotNull, Field(description="`sky jobs pool` spec, e.g. {workers: 2}.")] = None
    setup: Annotated[str | None, NotNull, Field(description="Shell script run once per cluster on every node.")] = None
    run: Annotated[str | None, NotNull, Field(description="Shell script run on every node.")] = None
    envs: Annotated[Annotated[dict[EnvName, EnvValue], Field(max_length=MAX_ENV_VARS)] | None, NotNull, Field(description=(
        "Environment variables; null means required (give it with --env NAME=VALUE)."))] = None
    secrets: Annotated[Secrets | None, NotNull, Field(description=(
        "Secret environment variables; values never enter the event log."))] = None
    managed_secrets: Annotated[Annotated[list[ManagedSecret], Mounts] | None, NotNull] = None
    inputs: Annotated[Annotated[dict[str, Num], Field(max_length=1)] | None, NotNull] = None
    outputs: Annotated[Annotated[dict[str, Num], Field(max_length=1)] | None, NotNull] = None
    file_mounts_mapping: Annotated[dict[str, Any] | None, NotNull] = None
    config: Annotated[TaskConfig | None, NotNull] = None
    volumes: Annotated[Annotated[dict[str, TaskVolume], Mounts] | None, NotNull, Field(description="MOUNT_PATH: volume name.")] = None
    volume_mounts: Annotated[Annotated[list[VolumeMount], Mounts] | None, NotNull] = None
    api_server_access: Annotated[bool | None, NotNull] = None
    metadata: Annotated[dict[str, Any] | None, NotNull, Field(alias="_metadata")] = None

    # The written (pre-substitution) form of the fields that had $VAR filled in.
    _templates: dict[str, Any] = PrivateAttr(default_factory=dict)

    # ------------------------------------------------------------------------ validation

    @model_validator(mode="wrap")
    @classmethod
    def _fill_in_variables(cls, data: Any, handler: Any) -> "Task":
        if not isinstance(data, dict):
            return handler(data)  # type: ignore[no-any-return]
        data = dict(data)
        for key in ("envs", "secrets"):
            if key in data:
                data[key] = stringify(data[key])
        variables = variables_of(data.get("envs"), data.get("secrets"))
        templates: dict[str, Any] = {}
        if variables:
            for key in SUBSTITUTED_FIELDS:
                if data.get(key) is not None:
                    resolved = substitute(data[key], variables)
                    if resolved != data[key]:
                        templates[key] = copy.deepcopy(data[key])
                        data[key] = resolved
        task: Task = handler(data)
        task._templates = templates
        return task

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        problem = task_name_problem(v)
        if problem:
            raise spz_error(problem)
        return v

    @field_validator("num_nodes")
    @classmethod
    def _num_nodes(cls, v: int) -> int:
        problem = num_nodes_problem(v)
        if problem:
            raise spz_error(problem)
        return v

    @field_validator("setup", "run")
    @classmethod
    def _script_size(cls, v: str) -> str:
        problem = script_problem(v)
        if problem:
            raise spz_error(problem)
        return v

    @field_validator("secrets")
    @classmethod
    def _secret_count(cls, v: Any) -> Any:
        if len(v) > MAX_ENV_VARS:
            raise spz_error(f"at most {MAX_ENV_VARS} secrets allowed, found {len(v):,}")
        return v

    @model_validator(mode="after")
    def _environment_size(self) -> "Task":
        problem = environment_problem(self.env_values(), self.secret_values())
        if problem:
            raise spz_error(problem, "envs" if self.envs else "secrets")
        return self

    @field_validator("file_mounts")
    @classmethod
    def _destinations(cls, v: dict[str, Any]) -> dict[str, Any]:
        for dst in v:
            problem = mount_destination_problem(dst)
            if problem:
                raise spz_error(problem, dst)
        return v

    @model_validator(mode="after")
    def _workdir_is_reserved(self) -> "Task":
        if self.workdir is not None and self.file_mounts:
            for dst in self.file_mounts:
                problem = workdir_mount_problem(dst)
                if problem:
                    raise spz_error(problem, "file_mounts", dst)
        return self

    # --------------------------------------------------------------------------- reading

    def env_values(self) -> dict[str, str]:
        return {k: v for k, v in (self.envs or {}).items() if v is not None}

    def secret_values(self) -> dict[str, str]:
        """Secret name -> value for every secret that has one (the only place values leave the task)."""
        if isinstance(self.secrets, dict):
            return {k: v for k, v in self.secrets.items() if v is not None}
        return {}

    def secret_names(self) -> list[str]:
        if isinstance(self.secrets, dict):
            return list(self.secrets)
        return list(self.secrets or [])

    def resource_requests(self) -> "list[ResourceRequest]":
        """One ResourceRequest per alternative (accelerator choices, any_of, ordered)."""
        from .expand import resource_requests

        return resource_requests(self.resources)

    def autostop(self) -> "Autostop | None":
        """The autostop setting of the task's resources, normalised; None when not given."""
        if self.resources is None or self.resources.autostop is None:
            return None
        value = self.resources.autostop
        return parse_autostop(value.model_dump(exclude_unset=True) if isinstance(value, AutostopConfig) else value)

    # ----------------------------------------------------------------------------- dumps

    def to_yaml_dict(self, *, json_safe: bool = False) -> dict[str, Any]:
        """The task as plain YAML data, in the form written (with $VAR templates); secrets included.

        Free-form sections keep YAML's own values (dates, ...); `json_safe` turns them into
        JSON types (for events), at the price of an exact round trip of such values.
        """
        out: dict[str, Any] = self.model_dump(mode="json" if json_safe else "python", by_alias=True,
                                              exclude_unset=True)
        for key, template in self._templates.items():
            out[key] = copy.deepcopy(template)
        return out

    def public_dict(self) -> dict[str, Any]:
        """The task without secret values (names kept, values null), JSON-safe: for the event log."""
        return public.public_dict(self.to_yaml_dict(json_safe=True), self.secret_values())

    @classmethod
    def from_public_dict(cls, data: dict[str, Any], secrets: dict[str, str] | None = None) -> "Task":
        """Rebuild a task from `public_dict()` output and the secret values kept elsewhere (the
        keys only the bus carries, `public.TRANSPORT_KEYS`, left out: they are not SkyPilot's)."""
        data = {k: v for k, v in data.items() if k not in public.TRANSPORT_KEYS}
        return cls.model_validate(public.merge_secrets(data, secrets or {}))
