"""The API server's extension points, loaded through entry points: authenticators and admission policies.

The seam the platform plugs into (SkyPilot's admin policies are the model for the second):

- `skypurza.authenticators`: each entry is a callable `(credentials, directory) -> result`
  (plain or async). `credentials` is a `Credentials` (the request's headers, lower-case names,
  and the client's address); `directory` the identity directory the log holds now. The result is
  a user name (looked up in the directory: their team and role), a `Principal`, or None (not
  this plug-in's caller). `AuthRefused(reason)` is a 401 with the reason. Tokens (`spz_...`) are
  built in and asked first; plug-ins are asked in name order, the first answer wins.
- `skypurza.admission_policies`: each entry is a callable `(request) -> result` (plain or async),
  asked in name order for every submission before it is published (`POST /api/v1/tasks`,
  `POST /api/v1/jobs` and `POST /api/v1/clusters/{name}/jobs`). `request` is an `AdmissionRequest`
  (kind, who, the task as the task spec's public mapping, the cluster): `kind` is "task" (a new
  cluster), "managed_job", or "cluster_job" (a task queued on the cluster `cluster`, which is up:
  `spz exec`, `spz launch -c`); `team` is the team the submission will be stamped with (the
  workspace: `-w`, the primary team, or for a cluster job the cluster's). The result is None (admitted unchanged) or a new task mapping (a
  mutation: checked by the task spec again, local paths refused, as a body's task is). Raising
  `AdmissionRefused(reason, status=403|422)` refuses the submission with the reason; anything
  else a policy raises refuses it too (a 500 that names the policy: fail closed), and is logged.

A plug-in that fails to load is logged and left out; a broken authenticator call is logged and
counts as no answer (it never grants). `SKYPURZA_NO_PLUGINS=1` loads none (cli/plugins.py's switch).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from skypurza.events.identity_events import ROLES
from skypurza.events.naming import check_principal_name

from .identity import Directory, Principal

log = logging.getLogger("skypurza.api")

AUTHENTICATORS = "skypurza.authenticators"
ADMISSION_POLICIES = "skypurza.admission_policies"
SKIP_ENV = "SKYPURZA_NO_PLUGINS"


class AuthRefused(Exception):
    """An authenticator recognised the credentials and refuses them: 401 with `reason`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AdmissionRefused(Exception):
    """An admission policy refuses the submission: `status` 403 (not allowed) or 422 (not valid)."""

    def __init__(self, reason: str, status: int = 403) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status if status in (403, 422) else 403


@dataclass(frozen=True)
class Credentials:
    headers: Mapping[str, str]  # lower-case names
    client: str  # the client's address


@dataclass(frozen=True)
class AdmissionRequest:
    kind: str  # "task" (a new cluster), "managed_job", or "cluster_job" (queued on `cluster`, up)
    user: str
    team: str
    role: str
    task: dict[str, Any]  # the task spec's public mapping, overrides applied
    cluster: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Plugin:
    name: str
    fn: Callable[..., Any]


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    out = fn(*args)
    return await out if inspect.isawaitable(out) else out


def load_group(group: str) -> tuple[Plugin, ...]:
    """The group's entry points, loaded, in name order; none when switched off or none installed."""
    if os.environ.get(SKIP_ENV, "") not in ("", "0"):
        return ()
    out = []
    for ep in sorted(entry_points(group=group), key=lambda ep: ep.name):
        try:
            fn = ep.load()
        except Exception as exc:  # a broken plug-in must not take the server down
            log.warning("%s %s failed to load (%s: %s); left out", group, ep.name, type(exc).__name__, exc)
            continue
        if not callable(fn):
            log.warning("%s %s is not callable; left out", group, ep.name)
            continue
        out.append(Plugin(ep.name, fn))
    if out:
        log.info("%s: %s", group, ", ".join(p.name for p in out))
    return tuple(out)


# ---------------------------------------------------------------- authenticators


def _principal_of(result: Any, directory: Directory, plugin: str) -> Principal | None:
    if result is None:
        return None
    if isinstance(result, str):
        user = directory.users.get(result)
        if user is None:
            raise AuthRefused(f"{plugin}: user {result[:63]!r} is not known here; an admin adds them with "
                              f"spz users add NAME --team TEAM")
        return user.principal()
    if isinstance(result, Principal):
        # A plug-in's principal must be one the rest of the server can stamp and authorize.
        check_principal_name(result.user, "user name")
        check_principal_name(result.team, "team name")
        if result.role not in ROLES:
            raise ValueError(f"role {result.role!r}")
        return result
    raise TypeError(f"returned a {type(result).__name__}, not a user name, a Principal or None")


async def authenticate_plugins(plugins: Sequence[Plugin], credentials: Credentials,
                               directory: Directory) -> Principal | None:
    """The first plug-in's principal for these credentials, or None. AuthRefused passes on."""
    found = await authenticating_plugin(plugins, credentials, directory)
    return None if found is None else found[1]


async def authenticating_plugin(plugins: Sequence[Plugin], credentials: Credentials,
                                directory: Directory) -> tuple[str, Principal] | None:
    """The first plug-in to know these credentials, by name, and its principal (health names it)."""
    for p in plugins:
        try:
            who = _principal_of(await _call(p.fn, credentials, directory), directory, p.name)
        except AuthRefused:
            raise
        except Exception as exc:  # a broken authenticator grants nothing
            log.error("authenticator %s failed: %s: %s", p.name, type(exc).__name__, exc)
            continue
        if who is not None:
            return p.name, who
    return None


# ---------------------------------------------------------------- admission


class PolicyFailed(Exception):
    """A policy raised something other than AdmissionRefused (a bug in it): the submission is refused."""

    def __init__(self, name: str) -> None:
        super().__init__(f"the admission policy {name} failed on this submission; the server's log has the error")
        self.name = name


async def admit(policies: Sequence[Plugin], request: AdmissionRequest) -> dict[str, Any] | None:
    """The task as the policies leave it: None when none changed it, else the last mutation.
    Each policy sees the task as the one before it left it."""
    task, changed = request.task, False
    for p in policies:
        try:
            out = await _call(p.fn, request if not changed else _with_task(request, task))
        except AdmissionRefused:
            raise
        except Exception as exc:
            log.error("admission policy %s failed: %s: %s", p.name, type(exc).__name__, exc)
            raise PolicyFailed(p.name) from None
        if out is None:
            continue
        if not isinstance(out, Mapping):
            log.error("admission policy %s returned a %s, not a task mapping or None", p.name, type(out).__name__)
            raise PolicyFailed(p.name)
        task, changed = dict(out), True
    return task if changed else None


def _with_task(request: AdmissionRequest, task: dict[str, Any]) -> AdmissionRequest:
    from dataclasses import replace

    return replace(request, task=task)


async def admitted_task(policies: Sequence[Plugin], kind: str, who: Principal, task: Any,
                        cluster: str | None = None) -> Any:
    """`task` (a loaded task spec) as the admission policies leave it; a refusal is a Problem
    (403/422 with the policy's reason; a policy's own failure a 500 naming it)."""
    if not policies:
        return task
    from .problems import Problem
    from .tasks import Refused, TaskOverrides, TaskRequest, load_task

    labels = dict(task.resources.labels or {}) if task.resources is not None and task.resources.labels else {}
    request = AdmissionRequest(kind, who.user, who.team, who.role, task.public_dict(), cluster, labels)
    try:
        new = await admit(policies, request)
    except AdmissionRefused as exc:
        raise Problem(exc.status, "admission-refused", "Refused by an admission policy", exc.reason[:2000])
    except PolicyFailed as exc:
        raise Problem(500, "internal", "Internal error", str(exc))
    if new is None:
        return task
    try:  # the mutated task goes through the task spec again, as a body's task does
        return load_task(TaskRequest(task=new, overrides=TaskOverrides(secrets=task.secret_values())))
    except Refused as exc:
        raise Problem(422, "invalid-task", "Invalid task", f"the admission policy's task is not valid: {exc.detail}",
                      problems=exc.problems)
    except Exception as exc:  # the policy's mapping is not even a task (a pydantic error of its shape)
        log.error("admission policies made a task that does not load: %s: %s", type(exc).__name__, exc)
        raise Problem(422, "invalid-task", "Invalid task", "the admission policy's task is not valid")
