"""Per-service health of a services process: recorded by `cli/serve.py`, read by `spz api status`.

The supervisor in `serve.py` restarts a service that dies, with back-off. Each start and each
death is recorded here, in one small JSON file in the stage's state directory
(`naming.services_health_file`), rewritten atomically (a reader never sees half a file):

    {"pid": 4242, "updated_at": "...", "services": {"ledger": {"state": "restarting",
     "restarts": 3, "since": "...", "last_error": "OverflowError: ...", "last_error_at": "...",
     "restart_times": [1767000000.1, ...]}}}

What a reader shows is decided at read time (`service_view`), because a crash loop is a matter
of how recent the restarts are: a service restarted more than once within `FAILING_WINDOW_S` is
**failing**, with its last error, even while it happens to be up between two crashes.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from skypurza.events.processes import pid_alive

FAILING_WINDOW_S = 60.0
FAILING_RESTARTS = 2  # this many restarts within the window: failing
KEEP_RESTART_TIMES = 10
ERROR_CHARS = 2000


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def error_text(exc: BaseException | None) -> str:
    if exc is None:
        return "stopped without an error"
    text = str(exc)
    return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:ERROR_CHARS]


class HealthRecorder:
    """What one services process's supervisor knows about its services, kept in a file."""

    def __init__(self, path: Path | None, clock: Any = time.time):
        self.path = path
        self.clock = clock
        self.services: dict[str, dict[str, Any]] = {}

    def _entry(self, name: str) -> dict[str, Any]:
        return self.services.setdefault(name, {"state": "starting", "restarts": 0, "since": _iso(self.clock()),
                                               "last_error": None, "last_error_at": None, "restart_times": []})

    def _set_state(self, entry: dict[str, Any], state: str) -> None:
        if entry["state"] != state:
            entry["state"], entry["since"] = state, _iso(self.clock())

    def started(self, name: str) -> None:
        self._set_state(self._entry(name), "running")
        self.write()

    def died(self, name: str, exc: BaseException | None) -> None:
        e = self._entry(name)
        now = self.clock()
        e["restarts"] += 1
        e["restart_times"] = (e["restart_times"] + [now])[-KEEP_RESTART_TIMES:]
        e["last_error"], e["last_error_at"] = error_text(exc), _iso(now)
        self._set_state(e, "restarting")
        self.write()

    def stopped(self, name: str) -> None:
        self._set_state(self._entry(name), "stopped")
        self.write()

    def write(self) -> None:
        if self.path is None:
            return
        doc = {"pid": os.getpid(), "updated_at": _iso(self.clock()), "services": self.services}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(doc, indent=2, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError:
            pass  # health is a report: failing to write it must not stop a service


def read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("services"), dict) else None


def service_view(name: str, entry: dict[str, Any], now: float, process_alive: bool = True) -> dict[str, Any]:
    """Pure: what `spz api status` says about one service (state running | restarting | failing |
    stopped | down) from what its supervisor recorded and the time now."""
    times = [t for t in entry.get("restart_times") or [] if isinstance(t, (int, float))]
    recent = sum(1 for t in times if now - t <= FAILING_WINDOW_S)
    state = str(entry.get("state") or "unknown")
    if not process_alive:
        state = "down"
    elif recent >= FAILING_RESTARTS:
        state = "failing"
    return {"name": name, "state": state, "healthy": state == "running", "restarts": int(entry.get("restarts") or 0),
            "restarts_last_minute": recent, "since": entry.get("since"), "last_error": entry.get("last_error"),
            "last_error_at": entry.get("last_error_at")}


def services_status(path: Path, now: float | None = None) -> list[dict[str, Any]]:
    """Every service the file records, as `service_view`s (empty when there is no file)."""
    doc = read(path)
    if doc is None:
        return []
    alive = pid_alive(doc.get("pid"))
    t = time.time() if now is None else now
    return [service_view(name, entry, t, alive) for name, entry in sorted(doc["services"].items())
            if isinstance(entry, dict)]


def why_not_answering(path: Path, name: str) -> str | None:
    """What to tell a user whose request `name` did not answer, when its supervisor knows why."""
    view = next((s for s in services_status(path) if s["name"] == name), None)
    if view is None or view["state"] == "running" or not view.get("last_error"):
        return None
    return (f"the {name} service is {view['state']} (restarted {view['restarts']} time(s); last error: "
            f"{view['last_error']}); see `spz api status` and `spz api logs`")
