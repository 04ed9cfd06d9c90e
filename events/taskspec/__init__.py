"""SkyPilot 0.14.1 task YAML: models, loader, overrides, JSON Schema, and the ResourceRequest
contract with the optimizer.

Names are imported lazily so that `from skypurza.events.taskspec.request import ...` (or a CLI
command that does not read YAML) does not pay for building the pydantic models.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ResourceRequest": "request",
    "Problem": "errors",
    "TaskSpecError": "errors",
    "Task": "task",
    "Resources": "resources",
    "ResourceAlternative": "resources",
    "Storage": "storage",
    "Service": "service",
    "TaskFile": "loader",
    "load_tasks": "loader",
    "CliOverrides": "overrides",
    "apply_overrides": "overrides",
    "task_from_command": "overrides",
    "is_yaml_entrypoint": "source",
    "task_json_schema": "schema",
    "canonical_name": "accelerators",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .accelerators import canonical_name
    from .errors import Problem, TaskSpecError
    from .loader import TaskFile, load_tasks
    from .overrides import CliOverrides, apply_overrides, task_from_command
    from .request import ResourceRequest
    from .resources import ResourceAlternative, Resources
    from .schema import task_json_schema
    from .source import is_yaml_entrypoint
    from .service import Service
    from .storage import Storage
    from .task import Task


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
