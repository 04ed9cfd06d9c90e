"""The plain task: what `spz launch --dryrun FILE` needs of the common task, without pydantic
(issue 21).

A cold dry run spent most of its time making the task models: importing pydantic (~50 ms) and
creating ~40 model classes (~35 ms) before it read a line of YAML. Most task files use a handful
of keys with plain values (`name`, `run`, `setup`, `num_nodes`, `envs`, `workdir`, `file_mounts`
of paths and URLs, and `resources` with `infra`, `cpus`, `memory`, one accelerator, `use_spot`,
`instance_type`, `disk_size`). For those, `plain_task` checks each value with the very parsers
and checks the models' validators call (values.py, checks.py) and gives what a dry run reads:
the name, the node count and the resource requests, expanded by the same code (expand.py).

It answers only where it is sure, and returns None otherwise: any other key, a null, a value of
another type or form (an accelerator set, `any_of`, a storage mount), a value a check refuses, a string Python
cannot encode, a number that is not finite, a file that is not one plain document. The caller
then loads the task with the models, which say what is wrong or take what this leaves out — so
every error a user sees still comes from the models. tests/test_taskspec_plain.py holds the two
to each other: wherever this answers, the models accept the same document and give the same
name, node count, requests and autostop.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skypurza.events.limits import MAX_ENV_VARS, MAX_MOUNTS

from . import checks
from .envsubst import stringify, substitute, variables_of
from .values import parse_accelerator, parse_cpus, parse_disk_size, parse_infra, parse_memory

if TYPE_CHECKING:
    from .request import ResourceRequest

TASK_KEYS = frozenset({"name", "run", "setup", "num_nodes", "envs", "workdir", "file_mounts", "resources"})
RESOURCE_KEYS = frozenset({"infra", "cpus", "memory", "accelerators", "use_spot", "instance_type", "disk_size"})


@dataclass(frozen=True)
class PlainTask:
    """A task `plain_task` vouched for: what the dry run reads of a taskspec Task, the same way."""

    name: str | None
    num_nodes: int | None
    resources: Mapping[str, Any] | None  # the keys given, as the Resources model dumps them

    def resource_requests(self) -> list[ResourceRequest]:
        from .expand import requests_of_fields
        from .request import ResourceRequest

        return [ResourceRequest()] if self.resources is None else requests_of_fields(self.resources)

    def autostop(self) -> None:
        return None  # `resources.autostop` is not a plain key


def load_plain(entrypoint: list[str]) -> PlainTask | None:
    """The plain task of a dry run's entrypoint (one YAML file), or None: load it with the models."""
    from .source import is_yaml_entrypoint

    words = [w for w in entrypoint if w.strip()]
    if len(words) != 1 or not is_yaml_entrypoint(words[0]):
        return None
    return _plain_file(words[0])


def plain_without_warnings(path: os.PathLike[str]) -> bool:
    """True when `path` holds one plain task the models would take without a warning (`spz
    check-yaml`'s "valid (1 task)" and nothing more); False: ask the models. An accelerator can
    be warned about (a name that looks misspelt: warnings.py), so a task naming one is the models'."""
    task = _plain_file(path)
    return task is not None and "accelerators" not in (task.resources or {})


def _plain_file(source: str | os.PathLike[str]) -> PlainTask | None:
    from .source import read_source

    try:
        text, _ = read_source(source, None)
    except Exception:  # noqa: BLE001 - unreadable: the models' loader reports it
        return None
    from .yamlsrc import parse_documents

    docs, issues = parse_documents(text)
    if issues or len(docs) != 1:
        return None
    return plain_task(docs[0].data)


def plain_task(data: Any) -> PlainTask | None:
    """`data` (one YAML document) as a PlainTask when every key and value is plain and valid; else None."""
    if not isinstance(data, dict) or not data.keys() <= TASK_KEYS:
        return None
    name = data.get("name")
    if "name" in data and not (_text(name) and checks.task_name_problem(name) is None):
        return None
    for key in ("run", "setup"):
        if key in data and not (_text(data[key]) and checks.script_problem(data[key]) is None):
            return None
    if "workdir" in data and not _text(data["workdir"]):
        return None
    nodes = data.get("num_nodes")
    if "num_nodes" in data and not (type(nodes) is int and checks.num_nodes_problem(nodes) is None):
        return None
    if "envs" in data and not _plain_envs(data["envs"]):
        return None
    if "file_mounts" in data and not _plain_mounts(data["file_mounts"], variables_of(stringify(data.get("envs")), None),
                                                   workdir="workdir" in data):
        return None
    resources = data.get("resources")
    if "resources" in data and not _plain_resources(resources):
        return None
    return PlainTask(name, nodes, dict(resources) if resources is not None else None)


def _text(value: Any) -> bool:
    """A str that encodes as UTF-8. One with a lone surrogate is left to the models: they take it
    in some places (a script) and refuse it in others (an env value, when the sizes are summed)."""
    if type(value) is not str:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _plain_envs(envs: Any) -> bool:
    # As the Task model: scalar values str()-ed first (SkyPilot's loader), then names, values and sizes.
    envs = stringify(envs)
    if type(envs) is not dict or len(envs) > MAX_ENV_VARS:
        return False
    for key, value in envs.items():
        if not (_text(key) and _text(value)) or checks.env_name_problem(key) or checks.env_value_problem(value):
            return False
    return checks.environment_problem(envs) is None


def _plain_mounts(mounts: Any, variables: Mapping[str, str], *, workdir: bool) -> bool:
    # As the Task model: `$VAR`s filled in from the envs first (keys and values), then each
    # destination and source a plain path or URL (a storage mapping is the models').
    if variables:
        mounts = substitute(mounts, variables)
    if type(mounts) is not dict or len(mounts) > MAX_MOUNTS:
        return False
    for dst, src in mounts.items():
        if not (_text(dst) and _text(src)) or checks.mount_destination_problem(dst):
            return False
        if workdir and checks.workdir_mount_problem(dst):
            return False
    return True


def _plain_resources(resources: Any) -> bool:
    if type(resources) is not dict or not resources.keys() <= RESOURCE_KEYS:
        return False
    for key, value in resources.items():
        if key in ("infra", "instance_type", "accelerators"):
            if not _text(value):
                return False
        elif key == "use_spot":
            if type(value) is not bool:
                return False
        elif key in ("cpus", "memory"):
            if not (_text(value) or type(value) is int or (type(value) is float and math.isfinite(value))):
                return False
        elif not (_text(value) or type(value) is int):  # disk_size
            return False
    parsers = {"infra": parse_infra, "cpus": parse_cpus, "memory": parse_memory, "accelerators": parse_accelerator,
               "disk_size": parse_disk_size}
    try:
        for key, parse in parsers.items():
            if key in resources:
                parse(resources[key])
    except ValueError:
        return False
    return True
