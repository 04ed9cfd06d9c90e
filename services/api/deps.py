"""What a route family needs from the app: who the caller is, the bus, the status service."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from typing import Annotated

from fastapi import Path

from skypurza.events import limits, naming
from skypurza.events.bus import Bus

from .identity import Principal

STATUS_TIMEOUT_S = 10.0

# Path parameters, bounded at the edge: a name with a subject or path metacharacter is a 422.
ClusterName = Annotated[str, Path(min_length=1, max_length=limits.MAX_CLUSTER_NAME_CHARS,
                                  pattern=f"^{naming.CLUSTER_NAME_RE.pattern}$",
                                  description="The cluster's name (letters, digits, - _ .).")]
JobId = Annotated[int, Path(ge=1, le=limits.MAX_JOB_ID, description="The job's id on its cluster.")]


@dataclass(frozen=True)
class ApiDeps:
    principal: Callable[..., Awaitable[Principal]]  # a FastAPI dependency: the authenticated caller
    bus: Callable[[], Bus]  # the declared bus: publishes are checked against the API's contract
    admission: tuple[Any, ...] = ()  # the admission policies (services/api/extensions.py), asked before a submit
    directory: Callable[[], Awaitable[Any]] | None = None  # the identity directory now (teams: workspaces)
