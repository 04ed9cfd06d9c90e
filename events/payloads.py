"""The task as it travels on the bus, and the failover blocks that go with it: typed payloads.

`TaskSubmitted.task`, `JobQueued.task` and each of `ManagedJobSubmitted.tasks` are a
`TaskPayload`: a task's public form (`Task.public_dict()`: secret names without values, `$VAR`
templates kept), which the CLI builds and the recovery service copies into each launch.
`TaskSubmitted.initial_blocks` are `FailoverBlock`s (the optimizer's `Block` as the log holds it).

Two rules, both for the log's sake:
- **Lenient about what they do not know.** Only the keys readers use are typed (and bounded by
  `limits.py`, far above what the task model lets through, so every task a writer could have
  published still reads); any other key — a SkyPilot key no reader uses, a key a newer writer
  adds — is kept as given (`extra="allow"`), so a re-publish (recovery's launches copy the task)
  loses nothing. A typed key of the wrong type is refused where the event is built or decoded,
  naming the key (`task.num_nodes: Input should be a valid integer`): the decoder parks such an
  event, it never reaches a service.
- **Re-serialised as given.** A payload dumps the keys it was given — not the defaults of the
  others — and values are never coerced (`strict`): a stored event read and written again is the
  same JSON, so nothing derived from it changes. Declared keys come in the task model's order
  (then the others, in the order given), so what the CLI wrote comes back byte for byte; a task
  written by hand in another order comes back with the same keys and values.

A managed job's task entry is a `TaskPayload` too (`ManagedTask`): the entry is exactly what
each of its launches carries, so there is nothing to convert.

The full SkyPilot semantics (validation, resource requests, autostop) stay in `taskspec/`;
readers that need them rebuild the `Task` from `to_dict()` (`Task.from_public_dict`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, SerializationInfo

from .limits import (
    MAX_ENV_NAME_CHARS,
    MAX_ENV_VALUE_BYTES,
    MAX_ENV_VARS,
    MAX_LABELS,
    MAX_MOUNTS,
    MAX_NODES,
    MAX_RESOURCE_ALTERNATIVES,
    MAX_RESTARTS,
    MAX_SCRIPT_BYTES,
    MAX_TASK_NAME_CHARS,
)


class Payload(BaseModel):
    """Base of the payload models: frozen, strict (no coercion), unknown keys kept, and dumped as
    given: the keys that were given (not the defaults of the others), declared ones in the order
    the task model writes them, then the others in the order given.

    No validator or serializer of ours runs per model (a Python hook per nested model cost more
    than the rest of a decoded event, and the ledger replays tens of thousands a second): a dump
    is pydantic's own with `exclude_unset`, which `model_dump` here defaults to and the event
    fields ask for (`AsGiven`)."""

    # defer_build: a model's validator is built the first time it is used, not at import: a
    # command that reads a few event types does not pay for the hundred others (issue 21).
    model_config = ConfigDict(frozen=True, extra="allow", strict=True, defer_build=True)

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        kwargs.setdefault("exclude_unset", True)
        return super().model_dump(**kwargs)

    def model_dump_json(self, **kwargs: Any) -> str:
        kwargs.setdefault("exclude_unset", True)
        return super().model_dump_json(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The payload as JSON data, exactly as it was given (unknown keys included)."""
        return self.model_dump(mode="json")

    def edited(self, drop: tuple[str, ...] = (), **changes: Any) -> Self:
        """A copy with the keys `drop` removed and `changes` set (new keys go last), validated
        again: a writer's edit (recovery pins a region) obeys the same types as any payload."""
        data = self.to_dict()
        for key in drop:
            data.pop(key, None)
        data.update(changes)
        return type(self).model_validate(data)


def _dump_as_given(value: Payload, info: SerializationInfo) -> Any:
    # Straight to pydantic-core: this runs for every payload of every event written.
    return value.__pydantic_serializer__.to_python(value, mode=info.mode, exclude_unset=True)


# On an event's payload field: the event's dump holds the payload as given, not its defaults.
AsGiven = PlainSerializer(_dump_as_given)


# ----------------------------------------------------------------------------- resources

# The forms of `accelerators` (and its alias `gpus`): "A100:8", {A100: 8}, a set {A100:8, H100:8}
# (a mapping to null counts) or a list in order of preference.
Accelerators = str | dict[str, int | float | None] | list[str]
ExitCode = Annotated[int, Field(ge=0, le=255)]


class JobRecoveryPayload(Payload):
    """`resources.job_recovery` as a mapping (it may also be just the strategy's name)."""

    strategy: str | None = None
    max_restarts_on_errors: Annotated[int, Field(ge=0, le=MAX_RESTARTS)] | None = None
    recover_on_exit_codes: ExitCode | list[ExitCode] | None = None

    def exit_codes(self) -> frozenset[int]:
        codes = self.recover_on_exit_codes
        return frozenset([codes] if isinstance(codes, int) else (codes or []))


class ResourcesPayload(Payload):
    """`resources:` of a task (and each of its `any_of` / `ordered` alternatives). Typed: where it
    may run, the market, accelerators, labels, recovery and the simple values; free-form ones
    (volumes, ports, autostop ...) are carried as written, for the task model to read. Declared in
    the task model's order (`taskspec/resources.py`), so a dump reads as the CLI wrote it."""

    infra: str | None = None
    cloud: str | None = None
    region: str | None = None
    zone: str | None = None
    cpus: str | int | float | None = None
    memory: str | int | float | None = None
    instance_type: str | None = None
    use_spot: bool | None = None
    job_recovery: str | JobRecoveryPayload | None = None
    volumes: Any = None
    disk_size: str | int | None = None
    ephemeral_storage: str | int | None = None
    disk_tier: str | None = None
    network_tier: str | None = None
    local_disk: str | None = None
    max_hourly_cost: int | float | None = None
    ports: int | str | list[int | str] | None = None  # 8080, '8000-8010' or a list of them
    labels: Annotated[dict[str, str], Field(max_length=MAX_LABELS)] | None = None
    accelerator_args: Any = None
    image_id: str | dict[str, str] | None = None
    autostop: Any = None
    priority: int | None = None
    priority_class: str | None = None
    accelerators: Accelerators | None = None
    gpus: Accelerators | None = None
    any_of: Annotated[list[ResourcesPayload], Field(max_length=MAX_RESOURCE_ALTERNATIVES)] | None = None
    ordered: Annotated[list[ResourcesPayload], Field(max_length=MAX_RESOURCE_ALTERNATIVES)] | None = None

    def accelerators_given(self) -> Accelerators | None:
        """`accelerators`, else its alias `gpus`."""
        return self.accelerators if self.accelerators is not None else self.gpus

    def alternatives(self) -> list[ResourcesPayload]:
        """The `ordered` alternatives, then the `any_of` ones (a task gives one kind at most)."""
        return [*(self.ordered or []), *(self.any_of or [])]


# ------------------------------------------------------------------------------- the task

Script = Annotated[str, Field(max_length=MAX_SCRIPT_BYTES)]  # characters: never more than its bytes
EnvName = Annotated[str, Field(max_length=MAX_ENV_NAME_CHARS)]


class GitWorkdir(Payload):
    """`workdir:` as a git repository."""

    url: str
    ref: str | None = None


class StorageMount(Payload):
    """A `file_mounts` value that is a storage mapping (a bucket; recovery names checkpoint ones).
    Declared in the order of `taskspec/storage.py`'s Storage."""

    name: str | None = None
    source: str | list[str] | None = None
    store: str | None = None
    persistent: bool | None = None
    mode: str | None = None

    def is_s3(self) -> bool:
        return (self.store or "").lower() == "s3"


Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


class UploadRef(Payload):
    """A local workdir or file-mount source the CLI sent to the stage's object store
    (events/uploads.py): the content digest of its archive (`kind` dir: a deterministic tar.gz)
    or of the file itself (`kind` file), and its size in bytes. Not a SkyPilot key: the agent of
    a cloud node reads it, and `Task.from_public_dict` leaves it out."""

    digest: Digest
    kind: Literal["dir", "file"]
    size: Annotated[int, Field(ge=0)]


class TaskPayload(Payload):
    """A task as the bus carries it: the public form of one SkyPilot task (no secret values).
    Declared in the task model's order (`taskspec/task.py`), so a dump reads as the CLI wrote it;
    the keys after `secrets` there (config, volumes, _metadata ...) are carried as given."""

    name: Annotated[str, Field(max_length=MAX_TASK_NAME_CHARS)] | None = None
    workdir: str | GitWorkdir | None = None
    event_callback: str | None = None
    num_nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] | None = None
    resources: ResourcesPayload | None = None
    file_mounts: Annotated[dict[str, str | StorageMount], Field(max_length=MAX_MOUNTS)] | None = None
    service: Any = None
    pool: Any = None
    setup: Script | None = None
    run: Script | None = None
    envs: Annotated[dict[EnvName, Annotated[str, Field(max_length=MAX_ENV_VALUE_BYTES)]],
                    Field(max_length=MAX_ENV_VARS)] | None = None
    # Names only: a value here would be a secret in the log, so it is refused.
    secrets: Annotated[dict[EnvName, None], Field(max_length=MAX_ENV_VARS)] | Annotated[
        list[EnvName], Field(max_length=MAX_ENV_VARS)] | None = None
    # The local sources (absolute paths as `workdir` / `file_mounts` name them) sent through the
    # object store, so that a node that is not this machine gets them (events/uploads.py).
    uploads: Annotated[dict[str, UploadRef], Field(max_length=MAX_MOUNTS + 1)] | None = None

    def nodes(self) -> int:
        """The nodes the task runs on: `num_nodes`, else 1 (SkyPilot's default)."""
        return self.num_nodes or 1

    def labels(self) -> dict[str, str]:
        """`resources.labels` (team, project ... for showback), empty when none."""
        return dict(self.resources.labels or {}) if self.resources is not None else {}


# A managed job's task entry: what each of its launches carries (see the module's docstring).
ManagedTask = TaskPayload

# The event fields (events/{task,job,managed}_events.py): the models, dumped as given.
TaskField = Annotated[TaskPayload, AsGiven]
ManagedTaskField = Annotated[ManagedTask, AsGiven]


# ------------------------------------------------------------------------- failover blocks

# What a block covers (services/optimizer/placement.py `Block`): an instance type in a zone
# (both markets), the spot market of a type in a zone, a quota class and market in a region,
# exactly one candidate, a whole infra.
BlockScope = Literal["zone", "spot_market", "region", "candidate", "infra"]


class FailoverBlock(Payload):
    """A place a task's first placement must not use (recovery blocks where a job was lost).
    None fields are wildcards."""

    scope: BlockScope
    infra: str
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    use_spot: bool | None = None
    quota_class: str | None = None  # AWS quota class ("P", "G", "Standard" ...), for region blocks
    error_class: str | None = None  # what caused it (for messages): "preempted" from recovery


BlockField = Annotated[FailoverBlock, AsGiven]


# Every payload model, for docs/events.md (events/docgen.py).
PAYLOAD_MODELS: tuple[type[Payload], ...] = (TaskPayload, ResourcesPayload, JobRecoveryPayload, GitWorkdir,
                                             StorageMount, UploadRef, FailoverBlock)
