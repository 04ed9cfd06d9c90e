"""What the API server reads of dispatch (platform), found through an entry-point group.

The API server's core is open code and imports no platform module (docs/DESIGN.md, *Open and
platform*). Dispatch declares its pieces in pyproject.toml's `skypurza.dispatch_reads` group, as
the ledger and dispatch join `spz api serve` through `skypurza.services`:

- `load_state`: `async (bus) -> state`, the dispatch service's own fold of the log (what `spz
  dispatch queue` and `spz budgets` answer from): `policy`, `pending` (task id -> what it asks),
  `held` (task id -> (kind, reason)), `usage` (queue -> (flavor, resource) -> in use), `spend`;
- `load_policy`: `(text, file) -> DispatchPolicy`, the YAML loader, raising
- `policy_error`: its exception, whose `problems` each have file, line, column, key, message;
- `budget_status`: `(budget, spend, now) -> status`, one budget's state in its period;
- `share_rows` (optional: an older dispatch has none, and the tree is then left out): `(state,
  now) -> {algorithm, rows}`, the fairshare tree `spz dispatch share` prints.

So the API answers exactly what the CLI does, with one fold and one validator. With no dispatch
installed (or `SKYPURZA_NO_PLUGINS=1`) `load()` is None and the routes say so.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Callable

log = logging.getLogger("skypurza.api")

GROUP = "skypurza.dispatch_reads"
SKIP_ENV = "SKYPURZA_NO_PLUGINS"  # the same switch as cli/plugins.py's
NAMES = ("load_state", "load_policy", "policy_error", "budget_status")
OPTIONAL = ("share_rows",)


@dataclass(frozen=True)
class DispatchReads:
    load_state: Callable[..., Any]
    load_policy: Callable[[str, str], Any]
    policy_error: type[Exception]
    budget_status: Callable[..., Any]
    share_rows: Callable[..., Any] | None = None


def load() -> DispatchReads | None:
    """Dispatch's reads, or None when it is not installed, switched off, or fails to load (logged
    once: the rest of the API goes on)."""
    if os.environ.get(SKIP_ENV, "") not in ("", "0"):
        return None
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    if not found:
        return None
    missing = [n for n in NAMES if n not in found]
    if missing:
        log.warning("dispatch reads: %s declares no %s; the dispatch endpoints are off", GROUP, ", ".join(missing))
        return None
    try:
        return DispatchReads(**{n: found[n].load() for n in NAMES + OPTIONAL if n in found})
    except Exception as exc:  # a broken platform package must not take the API server down
        log.warning("dispatch reads failed to load (%s: %s); the dispatch endpoints are off", type(exc).__name__, exc)
        return None
