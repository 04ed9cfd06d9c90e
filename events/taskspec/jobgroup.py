"""A job group's header as the recovery service acts on it: which tasks are primary and how long
the others still run once the primary tasks have ended (`termination_delay`).

`termination_delay` is seconds (`30`), a duration (`30s`, `5m`, `1h`), or a mapping of task
names to either, with `default` for the tasks it does not name. Pure: the loader checks a
header with these, and `spz jobs launch` reads the numbers from them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from skypurza.events.limits import MAX_TIMEOUT_S

_DURATION_RE = re.compile(r"^\s*([0-9]{1,9})\s*(s|sec|secs|seconds?|m|min|mins|minutes?|h|hr|hrs|hours?)?\s*$",
                          re.IGNORECASE)
_UNIT_S = {"s": 1, "m": 60, "h": 3600}


def delay_seconds(value: Any) -> int:
    """Seconds of one delay (an int or a duration string); ValueError says what is accepted."""
    if isinstance(value, bool):
        raise ValueError(f"expected seconds or a duration (30s, 5m, 1h), found {value!r}")
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = int(m.group(1)) * _UNIT_S[(m.group(2) or "s")[0].lower()]
    else:
        shown = value if not isinstance(value, str) or len(value) <= 40 else value[:40] + "..."
        raise ValueError(f"expected seconds or a duration (30s, 5m, 1h), found {shown!r}")
    if not 0 <= seconds <= MAX_TIMEOUT_S:
        raise ValueError(f"termination_delay must be 0 to {MAX_TIMEOUT_S:,} seconds (a day), found {seconds:,} s")
    return seconds


def delay_problems(value: Any, task_names: Sequence[str | None]) -> list[tuple[list[str | int], str]]:
    """What is wrong with a header's termination_delay, as (key path, message) pairs."""
    if value is None:
        return []
    if isinstance(value, dict):
        problems: list[tuple[list[str | int], str]] = []
        for key, item in value.items():
            if key != "default" and key not in task_names:
                problems.append((["termination_delay", str(key)],
                                 f"{key!r} is not the name of a job in this group (nor `default`)"))
                continue
            try:
                delay_seconds(item)
            except ValueError as exc:
                problems.append((["termination_delay", str(key)], str(exc)))
        return problems
    try:
        delay_seconds(value)
    except ValueError as exc:
        return [(["termination_delay"], str(exc))]
    return []


def delay_of(value: Any, task_name: str | None) -> int:
    """The termination delay of one task (0 when the header gives none for it)."""
    if value is None:
        return 0
    if isinstance(value, dict):
        item = value.get(task_name, value.get("default", 0)) if task_name is not None else value.get("default", 0)
        return delay_seconds(item)
    return delay_seconds(value)


def primary_indexes(primary_tasks: Any, task_names: Sequence[str | None]) -> list[int]:
    """The indexes of the primary tasks (empty: none named, so every task is primary)."""
    named = [p for p in (primary_tasks or []) if isinstance(p, str)]
    return [i for i, n in enumerate(task_names) if n in named]
