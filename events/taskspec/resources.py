"""`resources:` of a task: every key and form of SkyPilot 0.14.1, kept as the user wrote it.

Values keep their written form (so a dump reads like the input); the parsers in `values`
check them here and interpret them in `expand` (which turns resources into ResourceRequests).
"""

# No `from __future__ import annotations` in the model modules: pydantic would evaluate every
# field's annotation string with eval() when the class is made (~10 ms of a cold check-yaml, issue 21).

from typing import Annotated, Any, Union

from pydantic import Field, Tag, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ._base import NotNull, Open, Strict, check_enum, choose, is_bool, is_dict, is_int, is_list, is_number, is_str, spz_error, tag
from skypurza.events.limits import (
    MAX_ACCELERATOR_COUNT,
    MAX_HOURLY_COST,
    MAX_IDLE_MINUTES,
    MAX_LABELS,
    MAX_MOUNTS,
    MAX_PORT_ENTRIES,
    MAX_RESOURCE_ALTERNATIVES,
    MAX_RESTARTS,
    MAX_TIMEOUT_S,
)

from .values import (
    AUTOSTOP_RE,
    AUTOSTOP_WAIT_FOR,
    DISK_SIZE_RE,
    DISK_TIERS,
    NETWORK_TIERS,
    RECOVERY_STRATEGIES,
    SKYPILOT_CLOUDS,
    did_you_mean,
    normalize_ports,
    parse_accelerator,
    parse_cpus,
    parse_disk_size,
    parse_infra,
    parse_local_disk,
    parse_memory,
    accelerator_choices,
    autostop_minutes,
)

Num = int | float

# ------------------------------------------------------------------------------------ value forms

AccelForms = Annotated[
    Union[
        Annotated[str, Tag(tag("str"))],
        Annotated[dict[str, Num | None], Tag(tag("dict"))],
        Annotated[list[str], Tag(tag("list"))],
    ],
    choose("NAME[:COUNT] like A100:8, a mapping {A100: 8}, a set {A100:8, H100:8} (cheapest first) "
           "or a list [A100:8, H100:8] (in order of preference)", ("str", is_str), ("dict", is_dict), ("list", is_list)),
]
# Inside any_of / ordered: one accelerator only.
AccelOne = Annotated[
    Union[Annotated[str, Tag(tag("str"))], Annotated[Annotated[dict[str, Num], Field(max_length=1)], Tag(tag("dict"))]],
    choose("NAME[:COUNT] like A100:8 or a one-key mapping {A100: 8} (one accelerator per any_of/ordered entry)",
           ("str", is_str), ("dict", is_dict)),
]
Quantity = Annotated[
    Union[Annotated[str, Tag(tag("str"))], Annotated[Num, Tag(tag("num"))]],
    choose("a number or a string like 4+ / 16GB", ("str", is_str), ("num", is_number)),
]
DiskSize = Annotated[
    Union[Annotated[str, Tag(tag("str"))], Annotated[int, Tag(tag("int"))]],
    choose("a size in GB like 256, 256GB or 1TB", ("str", is_str), ("int", is_int)),
]
Ports = Annotated[
    Union[
        Annotated[int, Tag(tag("int"))],
        Annotated[str, Tag(tag("str"))],
        Annotated[list[Annotated[Union[Annotated[int, Tag(tag("int"))], Annotated[str, Tag(tag("str"))]],
                                 choose("a port or a range like 8000-8010", ("int", is_int), ("str", is_str))]],
                  Tag(tag("list"))],
    ],
    choose("a port (8080), a range ('8000-8010') or a list of them", ("int", is_int), ("str", is_str), ("list", is_list)),
]
ImageId = Annotated[
    Union[Annotated[str, Tag(tag("str"))], Annotated[dict[str, str], Tag(tag("dict"))]],
    choose("an image id (ami-…, docker:IMAGE) or a mapping {REGION: image id}", ("str", is_str), ("dict", is_dict)),
]
ExitCode = Annotated[int, Field(ge=0, le=255)]
ExitCodes = Annotated[
    Union[Annotated[ExitCode, Tag(tag("int"))], Annotated[list[ExitCode], Tag(tag("list"))]],
    choose("an exit code 0-255 or a list of them", ("int", is_int), ("list", is_list)),
]


class JobRecovery(Open):
    """Managed-job recovery: strategy and restarts on user-code failures. Extra keys are carried."""

    strategy: str | None = None
    max_restarts_on_errors: Annotated[Annotated[int, Field(ge=0, le=MAX_RESTARTS)] | None, NotNull] = None
    recover_on_exit_codes: Annotated[ExitCodes | None, NotNull] = None

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, v: str | None) -> str | None:
        if v is not None:
            check_strategy(v)
        return v

    @field_validator("recover_on_exit_codes")
    @classmethod
    def _unique(cls, v: Any) -> Any:
        if isinstance(v, list) and len(set(v)) != len(v):
            raise spz_error("recover_on_exit_codes must not repeat a code")
        return v


def check_strategy(name: str) -> None:
    # SkyPilot's schema takes any string; its launch-time validation rejects unknown strategies.
    if name.lower() == "none" or name.upper() in RECOVERY_STRATEGIES:
        return
    hint = did_you_mean(name.upper(), RECOVERY_STRATEGIES)
    raise spz_error(f"unknown recovery strategy {name!r}; accepted: {', '.join(RECOVERY_STRATEGIES)} or none"
                    + (f".{hint}" if hint else ""))


Recovery = Annotated[
    Union[Annotated[str, Tag(tag("str"))], Annotated[JobRecovery, Tag(tag("dict"))]],
    choose("a strategy name (EAGER_NEXT_REGION, FAILOVER, none) or a mapping "
           "{strategy, max_restarts_on_errors, recover_on_exit_codes}", ("str", is_str), ("dict", is_dict)),
]


class AutostopConfig(Strict):
    idle_minutes: Annotated[Annotated[int, Field(ge=0, le=MAX_IDLE_MINUTES)] | None, NotNull] = None
    down: Annotated[bool | None, NotNull] = None
    wait_for: Annotated[str | None, NotNull] = None
    hook: Annotated[str | None, NotNull, Field(description="Deprecated: use config.hooks.")] = None
    hook_timeout: Annotated[Annotated[int, Field(ge=1, le=MAX_TIMEOUT_S)] | None, NotNull] = None

    @field_validator("wait_for")
    @classmethod
    def _wait_for(cls, v: str) -> str:
        return check_enum(v, AUTOSTOP_WAIT_FOR, "wait_for")


AutostopForms = Annotated[
    Union[
        Annotated[bool, Tag(tag("bool"))],
        Annotated[int, Tag(tag("int"))],
        Annotated[Annotated[str, Field(pattern=AUTOSTOP_RE.pattern)], Tag(tag("str"))],
        Annotated[AutostopConfig, Tag(tag("dict"))],
    ],
    choose("true/false, idle minutes (10), a duration (10m, 2h, 1d) or a mapping "
           "{idle_minutes, down, wait_for}", ("bool", is_bool), ("int", is_int), ("str", is_str), ("dict", is_dict)),
]


class AcceleratorArgs(Strict):
    runtime_version: Annotated[str | None, NotNull] = None
    tpu_name: Annotated[str | None, NotNull] = None
    tpu_vm: Annotated[bool | None, NotNull] = None
    gcp_queued_resource: Annotated[bool | None, NotNull] = None


class DiskVolume(Open):
    """An entry of `resources.volumes` (extra disks)."""

    disk_size: Annotated[DiskSize | None, NotNull] = None
    disk_tier: Annotated[str | None, NotNull] = None
    path: Annotated[str | None, NotNull] = None
    auto_delete: Annotated[bool | None, NotNull] = None
    storage_type: Annotated[str | None, NotNull] = None
    name: Annotated[str | None, NotNull] = None
    attach_mode: Annotated[str | None, NotNull] = None

    @field_validator("disk_size")
    @classmethod
    def _disk_size(cls, v: Any) -> Any:
        if isinstance(v, str) and not DISK_SIZE_RE.match(v):
            raise spz_error(f"expected a size like 256, 256GB or 1TB, found {v!r}")
        try:
            parse_disk_size(v)
        except ValueError as exc:
            raise spz_error(str(exc)) from None
        return v


class DockerLoginConfig(Strict):
    username: str
    password: str
    server: str


# ------------------------------------------------------------------------------------- resources

_LEGACY_LOCATION = ("cloud", "region", "zone")


class _ResourceKeys(Strict):
    """The keys shared by `resources` and its `any_of`/`ordered` entries (accelerators aside)."""

    infra: Annotated[str | None, NotNull, Field(description=(
        "Where to run: CLOUD[/REGION[/ZONE]] with * wildcards (aws, aws/us-east-1, "
        "aws/us-east-1/us-east-1a, aws/*/use1-az4, k8s/CONTEXT, ssh/NODE-POOL, local)."))] = None
    cloud: Annotated[str | None, NotNull, Field(description="Deprecated: use infra.", json_schema_extra={"deprecated": True})] = None
    region: Annotated[str | None, NotNull, Field(description="Deprecated: use infra.", json_schema_extra={"deprecated": True})] = None
    zone: Annotated[str | None, NotNull, Field(description="Deprecated: use infra.", json_schema_extra={"deprecated": True})] = None
    cpus: Annotated[Quantity | None, NotNull, Field(description="vCPUs per node: 4 (exactly) or 4+ (at least).")] = None
    memory: Annotated[Quantity | None, NotNull, Field(description=(
        "Memory per node in GiB: 16, 16+, 16GB, 1TB+, or 4x (GiB per vCPU)."))] = None
    instance_type: Annotated[str | None, NotNull] = None
    use_spot: Annotated[bool | None, NotNull] = None
    job_recovery: Annotated[Recovery | None, NotNull] = None
    volumes: Annotated[Annotated[list[DiskVolume], Field(max_length=MAX_MOUNTS)] | None, NotNull] = None
    disk_size: Annotated[DiskSize | None, NotNull, Field(description="OS disk size in GB: 256, 256GB, 1TB.")] = None
    ephemeral_storage: Annotated[DiskSize | None, NotNull, Field(description="Deprecated alias of disk_size.")] = None
    disk_tier: Annotated[str | None, NotNull, Field(description="low, medium, high, ultra or best.")] = None
    network_tier: Annotated[str | None, NotNull, Field(description="standard or best.")] = None
    local_disk: Annotated[str | None, NotNull, Field(description="Instance storage: [nvme|ssd:]SIZE[+], or nvme / ssd.")] = None
    max_hourly_cost: Annotated[Annotated[Num, Field(gt=0, le=MAX_HOURLY_COST)] | None, NotNull] = None
    ports: Ports | None = None
    labels: Annotated[Annotated[dict[str, str], Field(max_length=MAX_LABELS)] | None, NotNull] = None
    accelerator_args: Annotated[AcceleratorArgs | None, NotNull] = None
    no_missing_accel_warnings: Annotated[bool | None, NotNull, Field(alias="_no_missing_accel_warnings")] = None
    image_id: ImageId | None = None
    autostop: Annotated[AutostopForms | None, NotNull] = None
    priority: Annotated[Annotated[int, Field(ge=-1000, le=1000)] | None, NotNull] = None
    priority_class: Annotated[str | None, NotNull] = None
    docker_login_config: Annotated[DockerLoginConfig | None, NotNull, Field(alias="_docker_login_config")] = None
    is_image_managed: Annotated[bool | None, NotNull, Field(alias="_is_image_managed")] = None
    requires_fuse: Annotated[bool | None, NotNull, Field(alias="_requires_fuse")] = None
    cluster_config_overrides: Annotated[dict[str, Any] | None, NotNull, Field(alias="_cluster_config_overrides")] = None

    @field_validator("infra")
    @classmethod
    def _infra(cls, v: str) -> str:
        try:
            parse_infra(v)
        except ValueError as exc:
            raise spz_error(str(exc)) from None
        return v

    @field_validator("cloud")
    @classmethod
    def _cloud(cls, v: str) -> str:
        return check_enum(v, SKYPILOT_CLOUDS, "cloud")

    @field_validator("accelerators", "gpus", check_fields=False)
    @classmethod
    def _accelerators(cls, v: Any) -> Any:
        check_accelerators(v)
        return v

    @field_validator("cpus")
    @classmethod
    def _cpus(cls, v: Any) -> Any:
        try:
            parse_cpus(v)
        except ValueError as exc:
            raise spz_error(str(exc)) from None
        return v

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: Any) -> Any:
        try:
            parse_memory(v)
        except ValueError as exc:
            raise spz_error(str(exc)) from None
        return v

    @field_validator("disk_size", "ephemeral_storage")
    @classmethod
    def _disk(cls, v: Any) -> Any:
        try:
            parse_disk_size(v)
        except ValueError as exc:
            raise spz_error(str(exc)) from None
        return v

    @field_validator("disk_tier")
    @classmethod
    def _disk_tier(cls, v: str) -> str:
        return check_enum(v, DISK_TIERS, "disk_tier")

    @field_validator("network_tier")
    @classmethod
    def _network_tier(cls, v: str) -> str:
        return check_enum(v, NETWORK_TIERS, "network_tier")

    @field_validator("local_disk")
    @classmethod
    def _local_disk(cls, v: str) -> str:
        try:
            parse_local_disk(v)
        except ValueError as exc:
            raise spz_error(str(exc)) from None
        return v

    @field_validator("ports")
    @classmethod
    def _ports(cls, v: Any) -> Any:
        items = v if isinstance(v, list) else [v]
        if len(items) > MAX_PORT_ENTRIES:
            raise spz_error(f"at most {MAX_PORT_ENTRIES} ports or ranges allowed, found {len(items)}")
        for i, item in enumerate(items):
            try:
                normalize_ports(item)
            except ValueError as exc:
                raise spz_error(str(exc), *([i] if isinstance(v, list) else [])) from None
        return v

    @field_validator("autostop")
    @classmethod
    def _autostop(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool) and v > MAX_IDLE_MINUTES:
            raise spz_error(f"autostop must be at most {MAX_IDLE_MINUTES:,} idle minutes (a year; leave autostop "
                            f"off for never), found {v}")
        if isinstance(v, str):
            try:
                autostop_minutes(v)
            except ValueError as exc:
                raise spz_error(str(exc)) from None
        return v

    @field_validator("job_recovery")
    @classmethod
    def _recovery(cls, v: Any) -> Any:
        if isinstance(v, str):
            check_strategy(v)
        return v

    @model_validator(mode="after")
    def _one_way_to_say_it(self) -> "_ResourceKeys":
        check_location_keys(self.model_fields_set)
        if {"accelerators", "gpus"} <= self.model_fields_set:
            raise spz_error("give either `accelerators` or its alias `gpus`, not both", "gpus")
        return self


def check_location_keys(keys: set[str]) -> None:
    if "infra" in keys and keys & set(_LEGACY_LOCATION):
        legacy = [k for k in _LEGACY_LOCATION if k in keys]
        raise spz_error(
            f"cannot give both `infra` and {', '.join('`' + k + '`' for k in legacy)}: "
            "`cloud`/`region`/`zone` are the deprecated spelling of infra; write infra: CLOUD/REGION/ZONE",
            legacy[0])


def check_accelerators(v: Any) -> None:
    """Each accelerator spelled NAME[:COUNT] with a positive count; sub-path points at the bad item."""
    if isinstance(v, (list, dict)) and len(v) > MAX_RESOURCE_ALTERNATIVES:
        raise spz_error(f"at most {MAX_RESOURCE_ALTERNATIVES} accelerator choices allowed, found {len(v)}")
    if isinstance(v, str):
        _parse_or_fail(v)
    elif isinstance(v, list):
        for i, item in enumerate(v):
            _parse_or_fail(item, i)
    elif isinstance(v, dict):
        for key, count in v.items():
            if count is None:
                _parse_or_fail(key, key)
            else:
                if ":" in key:
                    raise spz_error(f"accelerator {key!r} has a count in its name and a count {count!r} as value; "
                                    "write {NAME: COUNT}", key)
                if count <= 0:
                    raise spz_error(f"accelerator count must be positive, found {count!r}", key)
                if count > MAX_ACCELERATOR_COUNT:
                    raise spz_error(f"accelerator count must be at most {MAX_ACCELERATOR_COUNT} per node, "
                                    f"found {count!r}", key)
                _parse_or_fail(key, key)


def _parse_or_fail(text: str, *subpath: str | int) -> None:
    try:
        parse_accelerator(text)
    except ValueError as exc:
        raise spz_error(str(exc), *subpath) from None


class ResourceAlternative(_ResourceKeys):
    """One set of resources: the keys allowed in an `any_of` or `ordered` entry."""

    accelerators: Annotated[AccelOne | None, NotNull, Field(description="Accelerator and count: A100:8.")] = None
    gpus: Annotated[AccelOne | None, NotNull, Field(description="Alias of accelerators.")] = None


class Resources(_ResourceKeys):
    """The task's `resources:`; `any_of`/`ordered` entries are merged over the other keys."""

    accelerators: Annotated[AccelForms | None, NotNull, Field(description=(
        "A100:8, {A100: 8}, a set {A100:8, H100:8} (cheapest) or a list [A100:8, H100:8] (in order)."))] = None
    gpus: Annotated[AccelForms | None, NotNull, Field(description="Alias of accelerators.")] = None
    any_of: Annotated[Annotated[list[ResourceAlternative], Field(max_length=MAX_RESOURCE_ALTERNATIVES)] | None, NotNull, Field(description=(
        "Alternatives merged over the other keys; the cheapest feasible one is chosen."))] = None
    ordered: Annotated[Annotated[list[ResourceAlternative], Field(max_length=MAX_RESOURCE_ALTERNATIVES)] | None, NotNull, Field(description=(
        "Alternatives merged over the other keys, tried strictly in order."))] = None

    @model_validator(mode="after")
    def _alternatives(self) -> "Resources":
        if self.any_of is not None and self.ordered is not None:
            raise spz_error("cannot give both `any_of` and `ordered`; choose one", "ordered")
        accs = self.accelerators if self.accelerators is not None else self.gpus
        acc_key = "accelerators" if self.accelerators is not None else "gpus"
        several = len(accelerator_choices(accs)) > 1
        if several and self.ordered:
            raise spz_error(f"cannot give several `{acc_key}` together with `ordered`; put one accelerator in "
                            "each `ordered` entry", acc_key)
        if several and self.any_of and isinstance(accs, list):
            raise spz_error(f"cannot give `{acc_key}` as a list (an order of preference) together with `any_of`; "
                            "use a set {A100:8, H100:8} or put one accelerator in each `any_of` entry", acc_key)
        base_keys = self.model_fields_set - {"any_of", "ordered"}
        for key in ("any_of", "ordered"):
            for i, alt in enumerate(getattr(self, key) or []):
                merged = base_keys | alt.model_fields_set  # SkyPilot merges with dict.update
                try:
                    check_location_keys(merged)
                except PydanticCustomError:
                    raise spz_error(
                        "this entry and the resources it is merged over mix `infra` with `cloud`/`region`/`zone` "
                        "(the deprecated spelling of infra); use infra everywhere", key, i) from None
        return self
