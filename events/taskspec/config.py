"""Task-level `config:` (overrides of ~/.sky/config.yaml keys allowed in a task, plus `hooks`).

Known sections are typed as SkyPilot 0.14.1's schema types them; other top-level keys are
carried (SkyPilot's client accepts them and leaves the judgement to its server).
"""

# No `from __future__ import annotations` in the model modules: pydantic would evaluate every
# field's annotation string with eval() when the class is made (~10 ms of a cold check-yaml, issue 21).

from typing import Annotated, Any, Literal, Union

from pydantic import Field, Tag, field_validator

from ._base import NotNull, Open, Strict, choose, is_bool, is_dict, is_int, is_list, is_none, is_number, is_str, spz_error, tag

_DURATION = r"^[0-9]+(m|h|d|w|M|H|D|W)?$"


def _no_name_namespace(v: dict[str, Any]) -> dict[str, Any]:
    for key in ("name", "namespace"):
        if key in v:
            raise spz_error(f"custom_metadata may not set `{key}`", key)
    return v


StrOrList = Annotated[
    Union[Annotated[str, Tag(tag("str"))], Annotated[list[str], Tag(tag("list"))]],
    choose("a string or a list of strings", ("str", is_str), ("list", is_list)),
]
AzureIdentity = Annotated[
    Union[
        Annotated[Annotated[str, Field(min_length=1)], Tag(tag("str"))],
        Annotated[list[Annotated[dict[str, Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=1)]], Tag(tag("list"))],
    ],
    choose("a string or a list of single-key mappings", ("str", is_str), ("list", is_list)),
]
Duration = Annotated[
    Union[Annotated[Annotated[str, Field(pattern=_DURATION)], Tag(tag("str"))], Annotated[int, Tag(tag("int"))]],
    choose("minutes or a duration like 10m, 2h", ("str", is_str), ("int", is_int)),
]
K8sIdentity = Annotated[
    Union[Annotated[str, Tag(tag("str"))], Annotated[dict[str, str], Tag(tag("dict"))]],
    choose("a string or a mapping", ("str", is_str), ("dict", is_dict)),
]
PodLimits = Annotated[
    Union[Annotated[bool, Tag(tag("bool"))], Annotated[Annotated[int | float, Field(ge=1)], Tag(tag("num"))]],
    choose("true/false or a number >= 1", ("bool", is_bool), ("num", is_number)),
]


class DockerOptions(Strict):
    run_options: Annotated[StrOrList | None, NotNull] = None


class NvidiaGpus(Strict):
    disable_ecc: Annotated[bool | None, NotNull] = None


class ManagedInstanceGroup(Strict):
    run_duration: int
    provision_timeout: Annotated[int | None, NotNull] = None


class GcpOptions(Strict):
    managed_instance_group: Annotated[ManagedInstanceGroup | None, NotNull] = None
    enable_gvnic: Annotated[bool | None, NotNull] = None
    enable_gpu_direct: Annotated[bool | None, NotNull] = None
    placement_policy: Annotated[str | None, NotNull] = None
    vpc_name: Annotated[str, Field(pattern=r"^(?:[-a-z0-9]+/)?[-a-z0-9]+$")] | None = None
    subnet_names: StrOrList | None = None


class AzureOptions(Strict):
    vpc_name: str | None = None
    remote_identity: Annotated[AzureIdentity | None, NotNull] = None


class Kueue(Strict):
    local_queue_name: Annotated[str | None, NotNull] = None
    admission_timeout: Annotated[int | None, NotNull] = None


class Quota(Open):
    queue: Annotated[str | None, NotNull] = None


class Dws(Strict):
    enabled: Annotated[bool | None, NotNull] = None
    max_run_duration: Annotated[Duration | None, NotNull] = None


class EnableDocker(Strict):
    mode: Literal["ALL", "BUILD"]
    cache_volume: Annotated[str | None, NotNull] = None


DockerMode = Annotated[
    Union[Annotated[bool, Tag(tag("bool"))], Annotated[Literal["ALL", "BUILD"], Tag(tag("str"))], Annotated[EnableDocker, Tag(tag("dict"))]],
    choose("true/false, ALL, BUILD or {mode: ALL|BUILD}", ("bool", is_bool), ("str", is_str), ("dict", is_dict)),
]


class KubernetesOptions(Open):
    pod_config: Annotated[dict[str, Any] | None, NotNull] = None
    provision_timeout: Annotated[int | None, NotNull] = None
    custom_metadata: Annotated[dict[str, Any] | None, NotNull] = None
    kueue: Annotated[Kueue | None, NotNull] = None
    quota: Annotated[Quota | None, NotNull] = None
    dws: Annotated[Dws | None, NotNull] = None
    remote_identity: Annotated[K8sIdentity | None, NotNull] = None
    set_pod_resource_limits: Annotated[PodLimits | None, NotNull] = None
    enable_docker: Annotated[DockerMode | None, NotNull] = None

    @field_validator("custom_metadata")
    @classmethod
    def _metadata(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _no_name_namespace(v)


class SshOptions(Strict):
    pod_config: Annotated[dict[str, Any] | None, NotNull] = None
    provision_timeout: Annotated[int | None, NotNull] = None
    custom_metadata: Annotated[dict[str, Any] | None, NotNull] = None

    @field_validator("custom_metadata")
    @classmethod
    def _metadata(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _no_name_namespace(v)


SbatchValue = Annotated[
    Union[
        Annotated[Annotated[str, Field(pattern=r"^[^\n]*$")], Tag(tag("str"))],
        Annotated[bool, Tag(tag("bool"))],
        Annotated[int | float, Tag(tag("num"))],
        Annotated[None, Tag(tag("null"))],
    ],
    choose("a one-line string, a number, true/false or null", ("str", is_str), ("bool", is_bool), ("num", is_number),
           ("null", is_none)),
]


class SlurmQuota(Open):
    queue: Annotated[Annotated[str, Field(min_length=1)] | None, NotNull] = None
    account: Annotated[Annotated[str, Field(min_length=1)] | None, NotNull] = None


class SlurmOptions(Open):
    sbatch_options: Annotated[dict[str, SbatchValue] | None, NotNull] = None
    quota: Annotated[SlurmQuota | None, NotNull] = None
    cpu_partition: Annotated[str | None, NotNull] = None


class VastOptions(Strict):
    datacenter_only: Annotated[bool | None, NotNull] = None
    create_instance_kwargs: Annotated[dict[str, Any] | None, NotNull] = None


HookEvent = Literal["stop", "preemption", "down"]


class Hook(Strict):
    run: Annotated[str, Field(min_length=1, max_length=16384)]
    events: Annotated[Annotated[list[HookEvent], Field(min_length=1)] | None, NotNull] = None
    timeout: Annotated[Annotated[int, Field(ge=1)] | None, NotNull] = None

    @field_validator("events")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise spz_error("hook events must not repeat")
        return v


class TaskConfig(Open):
    docker: Annotated[DockerOptions | None, NotNull] = None
    nvidia_gpus: Annotated[NvidiaGpus | None, NotNull] = None
    active_workspace: Annotated[str | None, NotNull] = None
    gcp: Annotated[GcpOptions | None, NotNull] = None
    azure: Annotated[AzureOptions | None, NotNull] = None
    kubernetes: Annotated[KubernetesOptions | None, NotNull] = None
    ssh: Annotated[SshOptions | None, NotNull] = None
    slurm: Annotated[SlurmOptions | None, NotNull] = None
    vast: Annotated[VastOptions | None, NotNull] = None
    hooks: Annotated[Annotated[list[Hook], Field(max_length=32)] | None, NotNull] = None
