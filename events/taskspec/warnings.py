"""Things that are valid but worth saying: deprecated spellings, accelerator names that look
misspelt. They never make a task invalid."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .accelerators import suggest
from .resources import AutostopConfig, ResourceAlternative, Resources
from .values import Infra, accelerator_choices, format_infra, parse_accelerator

if TYPE_CHECKING:
    from .task import Task

Loc = tuple[str | int, ...]


def task_warnings(task: Task) -> list[tuple[Loc, str]]:
    out: list[tuple[Loc, str]] = []
    res = task.resources
    if res is None:
        return out
    out += _resource_warnings(res, ("resources",))
    for key in ("any_of", "ordered"):
        for i, alt in enumerate(getattr(res, key) or []):
            out += _resource_warnings(alt, ("resources", key, i))
    return out


def launch_checks(task: Task) -> list[tuple[Loc, str]]:
    """What SkyPilot accepts when it reads a task and refuses when it launches it: warnings for
    `check-yaml`, errors for `launch` and `jobs launch` (Problem.at_launch)."""
    from .storage import Storage

    out: list[tuple[Loc, str]] = []
    for dst, mount in (task.file_mounts or {}).items():
        if isinstance(mount, Storage) and mount.name is None and mount.source is None:
            out.append((("file_mounts", dst, "name"),
                        "the bucket name is empty: fill it in (or give a `source`) before launching; "
                        "a launch refuses it, as SkyPilot's does"))
    return out


def _resource_warnings(res: Resources | ResourceAlternative, at: Loc) -> list[tuple[Loc, str]]:
    out: list[tuple[Loc, str]] = []
    legacy = [k for k in ("cloud", "region", "zone") if k in res.model_fields_set]
    if legacy:
        infra = format_infra(Infra(res.cloud.lower() if res.cloud else None, res.region, res.zone))
        out.append((at + (legacy[0],), f"`{'`/`'.join(legacy)}` is deprecated in SkyPilot; write `infra: {infra}` instead"))
    if "ephemeral_storage" in res.model_fields_set:
        out.append((at + ("ephemeral_storage",), "`ephemeral_storage` is deprecated; write `disk_size` instead"))
    if isinstance(res.autostop, AutostopConfig) and res.autostop.hook is not None:
        out.append((at + ("autostop", "hook"), "`autostop.hook` is deprecated; use `config.hooks` with events: [stop]"))
    for key in ("accelerators", "gpus"):
        value = getattr(res, key)
        for i, choice in enumerate(accelerator_choices(value)):
            name, _ = parse_accelerator(choice)
            close = suggest(name)
            if close:
                sub: Loc = (key,) if isinstance(value, str) else ((key, i) if isinstance(value, list) else (key, _dict_key(value, i)))
                out.append((at + sub, f"unknown accelerator '{name}' (kept as written). Did you mean " + " or ".join(f"'{c}'" for c in close) + "?"))
    return out


def _dict_key(value: object, index: int) -> str:
    assert isinstance(value, dict)
    keys: list[str] = list(value)
    return keys[index]
