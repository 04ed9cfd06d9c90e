"""The Task model's checks of its own values, each as the problem's message or None: the model
raises them (task.py), and the plain reading (plaintask.py) declines a task that has one, so
the two cannot judge a value differently. Pure; no pydantic.
"""

from __future__ import annotations

from collections.abc import Mapping

from skypurza.events.limits import (
    MAX_ENV_NAME_CHARS,
    MAX_ENV_TOTAL_BYTES,
    MAX_ENV_VALUE_BYTES,
    MAX_NODES,
    MAX_SCRIPT_BYTES,
    MAX_TASK_NAME_CHARS,
)

from .values import ENV_NAME_RE, SKY_REMOTE_WORKDIR, TASK_NAME_RE


def task_name_problem(name: str) -> str | None:
    if len(name) > MAX_TASK_NAME_CHARS:
        return f"task name of {len(name):,} characters: at most {MAX_TASK_NAME_CHARS}"
    if not TASK_NAME_RE.match(name):
        return (f"invalid task name {name!r}: use letters and digits, joined by at most two of . _ - "
                "(starting and ending with a letter or digit)")
    return None


def num_nodes_problem(nodes: int) -> str | None:
    if nodes < 1:
        return f"num_nodes must be a positive integer, found {nodes}"
    if nodes > MAX_NODES:
        return f"num_nodes must be at most {MAX_NODES}, found {nodes}"
    return None


def script_problem(script: str) -> str | None:
    # len * 4 first: a short script is not encoded at all
    if len(script) * 4 > MAX_SCRIPT_BYTES and len(script.encode()) > MAX_SCRIPT_BYTES:
        return (f"the script is {len(script.encode()):,} bytes; at most {MAX_SCRIPT_BYTES:,} "
                "(put a long script in the workdir and run it from there)")
    return None


def env_name_problem(name: str) -> str | None:
    if len(name) > MAX_ENV_NAME_CHARS:
        return f"environment variable name of {len(name):,} characters: at most {MAX_ENV_NAME_CHARS}"
    if not ENV_NAME_RE.match(name):
        return f"invalid environment variable name {name!r}: use letters, digits and _, not starting with a digit"
    return None


def env_value_problem(value: str) -> str | None:
    """At most MAX_ENV_VALUE_BYTES (UTF-8): every value is exported into every job's environment.
    The message names the variable as `{key}` (filled in where the problem is reported)."""
    if len(value) * 4 > MAX_ENV_VALUE_BYTES and len(value.encode()) > MAX_ENV_VALUE_BYTES:
        return (f"the value of {{key}} is {len(value.encode()):,} bytes; at most {MAX_ENV_VALUE_BYTES:,} "
                "(put large data in a file mount)")
    return None


def environment_problem(*variables: Mapping[str, str]) -> str | None:
    """The envs and secrets together (names, values, `=` and a separator) within MAX_ENV_TOTAL_BYTES."""
    total = sum(len(k.encode()) + len(v.encode()) + 2 for values in variables for k, v in values.items())
    if total > MAX_ENV_TOTAL_BYTES:
        return (f"envs and secrets together are {total:,} bytes; at most {MAX_ENV_TOTAL_BYTES:,} "
                "(they are exported into every job's environment)")
    return None


def mount_destination_problem(dst: str) -> str | None:
    if dst.endswith("/") and dst != "/":
        return f"file mount destination {dst!r} must not end with '/'"
    return None


def workdir_mount_problem(dst: str) -> str | None:
    """A file mount onto the workdir's place (a task with a workdir only)."""
    if dst.rstrip("/") == SKY_REMOTE_WORKDIR:
        return f"{SKY_REMOTE_WORKDIR} is where the workdir is synced; mount elsewhere"
    return None
