"""`$VAR` / `${VAR}` substitution where SkyPilot does it at load time: file_mounts, service,
workdir and volumes (keys and values), from the task's envs and secrets. Not in run/setup:
those get the variables exported by the shell on the node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

SUBSTITUTED_FIELDS: tuple[str, ...] = ("file_mounts", "service", "workdir", "volumes")

_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def substitute(value: Any, variables: Mapping[str, str]) -> Any:
    """Replace known variables in every string of `value`; unknown ones stay as written."""
    if isinstance(value, str):
        def repl(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2)
            return variables.get(name, m.group(0))

        return _VAR.sub(repl, value)
    if isinstance(value, dict):
        return {substitute(k, variables): substitute(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, variables) for v in value]
    return value


def stringify(values: Any) -> Any:
    """SkyPilot str()s scalar env/secret values (`1` -> "1", `true` -> "True"); null stays null."""
    if not isinstance(values, dict):
        return values
    out: dict[Any, Any] = {}
    for key, val in values.items():
        key = key if isinstance(key, str) else str(key)
        if val is None or isinstance(val, (str, dict, list)):
            out[key] = val
        else:
            out[key] = str(val)
    return out


def variables_of(envs: Any, secrets: Any) -> dict[str, str]:
    """The `$VAR`s a task fills in: its envs' and secrets' string values (stringified first)."""
    out: dict[str, str] = {}
    for source in (envs, secrets):
        if isinstance(source, dict):
            out.update({k: v for k, v in source.items() if isinstance(k, str) and isinstance(v, str)})
    return out
