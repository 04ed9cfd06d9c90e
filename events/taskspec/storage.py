"""`file_mounts` storage dicts (SkyPilot's storage schema) and task `volume_mounts` entries."""

# No `from __future__ import annotations` in the model modules: pydantic would evaluate every
# field's annotation string with eval() when the class is made (~10 ms of a cold check-yaml, issue 21).

from typing import Annotated, Union

from pydantic import Field, Tag, field_validator, model_validator

from ._base import NotNull, Open, Strict, check_enum, choose, is_int, is_list, is_str, spz_error, tag
from .values import DISK_SIZE_RE, SKYPILOT_CLOUDS

STORES: tuple[str, ...] = ("S3", "GCS", "AZURE", "R2", "IBM", "OCI", "NEBIUS", "COREWEAVE", "VASTDATA", "HF", "VOLUME")
MODES: tuple[str, ...] = ("MOUNT", "COPY", "MOUNT_CACHED")
STORAGE_TYPES: tuple[str, ...] = ("MODEL_CHECKPOINT_RO", "MODEL_CHECKPOINT_RW", "DATASET_RO", "DATASET_RW")

_RCLONE_SIZE = r"^[0-9]+(b|k|m|g|t|p|B|K|M|G|T|P)?$"
_RCLONE_DURATION = r"^(?:(?:[-+]?(?:\d+(?:\.\d+)?|\.\d+)(?:ms|[smhdwMy]))+|([-+]?(?:\d+(?:\.\d+)?|\.\d+)))$"

SizeStr = Annotated[str, Field(pattern=DISK_SIZE_RE.pattern)]
DiskSize = Annotated[
    Union[Annotated[SizeStr, Tag(tag("str"))], Annotated[int, Tag(tag("int"))]],
    choose("a size like 256, 256GB or 1TB", ("str", is_str), ("int", is_int)),
]


class MountCached(Strict):
    transfers: Annotated[Annotated[int, Field(ge=1)] | None, NotNull] = None
    buffer_size: Annotated[Annotated[str, Field(pattern=_RCLONE_SIZE)] | None, NotNull] = None
    vfs_cache_max_size: Annotated[Annotated[str, Field(pattern=_RCLONE_SIZE)] | None, NotNull] = None
    vfs_cache_max_age: Annotated[Annotated[str, Field(pattern=_RCLONE_DURATION)] | None, NotNull] = None
    vfs_read_ahead: Annotated[Annotated[str, Field(pattern=_RCLONE_SIZE)] | None, NotNull] = None
    vfs_read_chunk_size: Annotated[Annotated[str, Field(pattern=_RCLONE_SIZE)] | None, NotNull] = None
    vfs_read_chunk_streams: Annotated[Annotated[int, Field(ge=0)] | None, NotNull] = None
    vfs_write_back: Annotated[Annotated[str, Field(pattern=_RCLONE_DURATION)] | None, NotNull] = None
    read_only: Annotated[bool | None, NotNull] = None


class MountOptions(Strict):
    read_only: Annotated[bool | None, NotNull] = None
    hf_mount_args: Annotated[list[str] | None, NotNull] = None


class StorageConfig(Open):
    disk_size: Annotated[DiskSize | None, NotNull] = None
    disk_tier: Annotated[str | None, NotNull] = None
    storage_type: Annotated[str | None, NotNull] = None
    attach_mode: Annotated[str | None, NotNull] = None
    mount_cached: Annotated[MountCached | None, NotNull] = None
    mount: Annotated[MountOptions | None, NotNull] = None


Source = Annotated[
    Union[Annotated[str, Tag(tag("str"))], Annotated[Annotated[list[str], Field(min_length=1)], Tag(tag("list"))]],
    choose("a path or URL, or a non-empty list of paths", ("str", is_str), ("list", is_list)),
]


class Storage(Strict):
    """A bucket or volume mounted at a file_mounts destination."""

    # `name:` left empty (null) is accepted as SkyPilot accepts it when it reads the file; a
    # launch refuses it (warnings.launch_checks).
    name: Annotated[str | None, Field(description="Bucket name (created if it does not exist).")] = None
    source: Annotated[Source | None, NotNull, Field(description="Local path(s) to upload, or an existing bucket URL (s3://…).")] = None
    store: Annotated[str | None, NotNull, Field(description="Object store: " + ", ".join(STORES) + " (any case).")] = None
    persistent: Annotated[bool | None, NotNull] = None
    mode: Annotated[str | None, NotNull, Field(description="MOUNT, COPY or MOUNT_CACHED (any case).")] = None
    type: Annotated[str | None, NotNull] = None
    config: Annotated[StorageConfig | None, NotNull] = None
    is_sky_managed: Annotated[bool | None, NotNull, Field(alias="_is_sky_managed")] = None
    bucket_sub_path: Annotated[str | None, NotNull, Field(alias="_bucket_sub_path")] = None
    force_delete: Annotated[bool | None, NotNull, Field(alias="_force_delete")] = None

    @field_validator("store")
    @classmethod
    def _store(cls, v: str) -> str:
        return check_enum(v, STORES, "store")

    @field_validator("mode")
    @classmethod
    def _mode(cls, v: str) -> str:
        return check_enum(v, MODES, "mode")

    @field_validator("type")
    @classmethod
    def _type(cls, v: str) -> str:
        return check_enum(v, STORAGE_TYPES, "type")

    @model_validator(mode="after")
    def _name_or_source(self) -> "Storage":
        if self.name is None and self.source is None and "name" not in self.model_fields_set:
            raise spz_error("a storage mount needs a `name` (bucket) or a `source` (path or bucket URL)")
        return self


class VolumeConfig(Open):
    cloud: Annotated[str | None, NotNull] = None
    region: str | None = None
    zone: str | None = None

    @field_validator("cloud")
    @classmethod
    def _cloud(cls, v: str) -> str:
        return check_enum(v, SKYPILOT_CLOUDS, "cloud")


class VolumeMount(Strict):
    """An entry of the task's internal `volume_mounts` list."""

    path: Annotated[str | None, NotNull] = None
    volume_name: Annotated[str | None, NotNull] = None
    is_ephemeral: Annotated[bool | None, NotNull] = None
    sub_path: Annotated[Annotated[str, Field(pattern=r"^[a-zA-Z0-9._-][a-zA-Z0-9./_-]*$")] | None, NotNull] = None
    volume_config: Annotated[VolumeConfig | None, NotNull] = None
