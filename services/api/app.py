"""The REST API in front of the bus: `create_app(settings)` (FastAPI; OpenAPI 3.1 at /openapi.json).

- `GET /api/v1/health`: no auth; the version and stage, and the caller when they are known (a
  valid Bearer token, an authenticator plug-in, the embedded default's local caller), with their
  role in each team.
- `GET /api/v1/clusters`: the status service's answer over the bus (events/status_queries.py),
  the caller's own clusters (an admin's: all); `?all_users=true` everyone's the caller may read;
  kept per log position and caller, with an ETag (If-None-Match: 304; listing.py).
- `POST /api/v1/tasks`: a task and the launch overrides (services/api/tasks.py), published as
  the CLI publishes it, the envelope stamped with the caller (events/principal.py).
- the routers it wires: one cluster, its queue, its lifecycle and job cancel
  (routes_clusters.py); a task queued on an existing cluster, as spz exec and spz launch -c
  (routes_clusterjobs.py); a job's logs and the CloudEvents as server-sent events
  (routes_streams.py, sse.py); a cluster's provisioning and autostop history and a job's log files
  (routes_history.py); a reconciliation with the clouds, as spz status -r (routes_reconcile.py); managed jobs, their logs and the cost report (routes_jobs.py);
  users and teams, for admins (routes_identity.py); what the web console reads besides (a
  cluster's timeline, a managed job's history, tokens: routes_console.py), dispatch's queue,
  policy and budgets and the open alerts (routes_dispatch.py), the metrics page for Prometheus
  (admins or the metrics token: routes_metrics.py), GPU utilisation, goodput and GPU health for
  admins (routes_observability.py), and the console's
  files at /console/ (console_static.py, docs/console.md). docs/team.md lists every endpoint and who
  may call it.

Errors are RFC 9457 problem details (`application/problem+json`: type, title, status, detail a
person can act on). No token, a wrong one, a removed user's: 401 with `WWW-Authenticate:
Bearer`; not allowed: 403 with the reason. The server keeps no state of its own: who is who
comes from the log (services/api/follower.py), clusters from the status service.
"""

from __future__ import annotations

import logging
import uuid
from http import HTTPStatus
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.principal import stamp
from skypurza.events.service import declared_bus

from . import (routes_clusterjobs, routes_clusters, routes_console, routes_dispatch, routes_history, routes_identity,
               routes_jobs, routes_metrics, routes_observability, routes_reconcile, routes_streams, timetravel,
               workspaces)
from .console_static import CONSOLE_PATH, ConsoleFiles
from .contract import CONTRACT
from .deps import ApiDeps
from .extensions import (ADMISSION_POLICIES, AUTHENTICATORS, AuthRefused, Credentials, Plugin, admitted_task,
                         authenticating_plugin, load_group)
from .follower import DirectoryFollower, DirectoryStale
from .identity import Principal, authenticate, authorize, visible
from .problems import PROBLEM, PROBLEM_BASE, Problem  # noqa: F401  (app.Problem, as before)
from . import listing
from .sse import StreamSlots
from .tasks import MAX_BODY_BYTES, Refused, TaskRequest, build_submission, load_task

log = logging.getLogger("skypurza.api")

STATUS_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ApiSettings:
    nats_url: str
    stage: str = naming.DEFAULT_STAGE
    max_body_bytes: int = MAX_BODY_BYTES
    # The embedded default (never a deployment): a loopback caller with no token is this principal.
    local_admin: Principal | None = None
    # A scrape-only secret for `GET /metrics` (routes_metrics.py); None: admins only.
    metrics_token: str | None = None
    # The extension points (services/api/extensions.py); None: loaded from their entry points.
    authenticators: tuple[Plugin, ...] | None = None
    admission_policies: tuple[Plugin, ...] | None = None


def _unauthorized(detail: str, error: str | None = None) -> Problem:
    challenge = 'Bearer realm="skypurza"' + (f', error="{error}"' if error else "")
    return Problem(401, "unauthorized", "Unauthorized", detail, {"WWW-Authenticate": challenge})


class _BodyTooLarge(StarletteHTTPException):
    # An HTTPException, so that FastAPI's body reading passes it on (it turns others into a 400).
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over {limit:,} bytes; a task file may have at most "
                              f"{limit:,} bytes with its overrides")


class _BodyLimit:
    """ASGI middleware: a request body over the bound is refused (413) before it is all read."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            too_large = _BodyTooLarge(self.max_bytes)
            problem = Problem(413, "too-large", "Content Too Large", str(too_large.detail))
            return await problem.response()(scope, receive, send)
        seen = 0

        async def bounded() -> Any:
            nonlocal seen
            message = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, bounded, send)


def _validation_detail(exc: RequestValidationError) -> tuple[str, list[dict[str, Any]]]:
    """What is wrong with the request, without echoing its values (they may be large, or secret)."""
    errors = []
    for e in exc.errors()[:50]:
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        errors.append({"field": ".".join(loc), "message": str(e.get("msg", ""))[:300]})
    stamped = [e["field"] for e in errors if e["field"] in ("user", "team") and "xtra" in e["message"]]
    if stamped:
        return (f"{' and '.join(stamped)} cannot be given: the server stamps the authenticated caller's user and "
                "team on what it publishes"), errors
    first = errors[0] if errors else {"field": "", "message": "invalid request"}
    return f"{first['field'] or 'the request'}: {first['message']}", errors


def _path_name_with_slash(scope: Any) -> bool:
    """An API path whose name segment would hold '/' (sent as %2F) or be a dot segment: no route
    matches it, but it is a bad name (422), not a missing path."""
    raw = bytes(scope.get("raw_path") or scope.get("path", "").encode()).split(b"?", 1)[0]
    if not raw.startswith(b"/api/v1/"):
        return False
    return b"%2f" in raw.lower() or any(seg in (b".", b"..", b"%2e", b"%2e%2e", b".%2e", b"%2e.")
                                        for seg in raw.lower().split(b"/"))


def create_app(settings: ApiSettings) -> FastAPI:
    state: dict[str, Any] = {}
    listings = listing.ClusterListings()  # `GET /api/v1/clusters` per log position and caller (listing.py)
    plugins = settings.authenticators if settings.authenticators is not None else load_group(AUTHENTICATORS)
    policies = (settings.admission_policies if settings.admission_policies is not None
                else load_group(ADMISSION_POLICIES))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        bus = await Bus.connect(settings.nats_url, settings.stage, source=f"/skypurza/{settings.stage}/api")
        follower = DirectoryFollower(bus)
        follower.start()
        state.update(bus=declared_bus(bus, CONTRACT), raw_bus=bus, follower=follower)
        log.info("API server on stage %s, bus %s", settings.stage, settings.nats_url)
        try:
            yield
        finally:
            await follower.close()
            await bus.close()

    from skypurza import __version__

    app = FastAPI(title="SkyPurza API", version=__version__, lifespan=lifespan,
                  description="The SkyPurza broker's REST API (docs/team.md). Errors are RFC 9457 problem details.")
    app.add_middleware(_BodyLimit, max_bytes=settings.max_body_bytes)

    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return exc.response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        detail, errors = _validation_detail(exc)
        return Problem(422, "invalid-request", "Invalid request", detail, errors=errors).response(request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = exc.status_code
        if code == 404 and _path_name_with_slash(request.scope):
            return Problem(422, "invalid-request", "Invalid request",
                           "a name in the path holds '/' or is '.' or '..': names are letters, digits, '-' and '_' "
                           "(a cluster's '.' too)", errors=[{"field": "path", "message": "not a name"}]
                           ).response(request.url.path)
        detail = {404: "no such path; the API is under /api/v1 (its paths: /openapi.json)",
                  405: f"{request.method} is not a method of {request.url.path} (its methods: /openapi.json)",
                  }.get(code, str(exc.detail))
        kind = {404: "not-found", 405: "method-not-allowed", 413: "too-large"}.get(code, "http")
        title = HTTPStatus(code).phrase if code in HTTPStatus._value2member_map_ else "Error"
        return Problem(code, kind, title, detail, dict(exc.headers or {})).response(request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return Problem(500, "internal", "Internal error",
                       "the server failed on this request; its log has the error").response(request.url.path)

    async def directory() -> Any:
        try:
            return await state["follower"].current()
        except DirectoryStale as exc:
            raise Problem(503, "unavailable", "Service unavailable", f"{exc}; try again shortly",
                          {"Retry-After": "2"})
        except Exception as exc:  # the bus is away (a restart): no answer is not a bug
            log.warning("identity lookup failed: %s: %s", type(exc).__name__, exc)
            raise Problem(503, "unavailable", "Service unavailable",
                          "the server cannot reach its bus just now; try again shortly", {"Retry-After": "2"})

    async def directory_now() -> Any:
        # What the follower holds: authenticating this request has just brought it up to date
        # (two round trips saved on every submission: bench/api.py).
        return state["follower"].directory

    def presented_token(request: Request) -> str | None:
        header = request.headers.get("authorization")
        if header is None:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized("the Authorization header must be 'Bearer <token>'", "invalid_request")
        return token.strip()

    def local_caller(request: Request) -> Principal | None:
        client = request.client.host if request.client else ""
        return settings.local_admin if client in ("127.0.0.1", "::1") else None

    async def principal(request: Request) -> Principal:
        return (await identify(request))[0]

    async def identify(request: Request) -> tuple[Principal, str]:
        """The caller and how they were known: "token", "local", or the authenticator plug-in's name."""
        malformed: Problem | None = None
        try:
            token = presented_token(request)
        except Problem as exc:  # not a Bearer token: an authenticator plug-in may know the scheme
            if not plugins:
                raise
            token, malformed = None, exc
        if token is not None and (who := authenticate(await directory(), token)) is not None:
            return who, "token"
        if plugins:
            creds = Credentials(dict(request.headers), request.client.host if request.client else "")
            try:
                found = await authenticating_plugin(plugins, creds, await directory())
            except AuthRefused as exc:
                raise _unauthorized(exc.reason[:500], "invalid_token")
            if found is not None:
                return found[1], found[0]
        if malformed is not None:
            raise malformed
        if token is None and (local := local_caller(request)) is not None:
            return local, "local"
        if token is None:
            raise _unauthorized("this needs a token: send 'Authorization: Bearer <token>' (an admin makes one with "
                                "spz users add NAME --team TEAM --role ROLE, or spz users token NAME)")
        raise _unauthorized("the token is not valid: unknown, revoked, or its user was removed; ask an admin "
                            "for a new one (spz users token NAME)", "invalid_token")

    def bus() -> Bus:
        return state["bus"]

    @app.get("/api/v1/health", summary="The server's version; the caller, when they are known (a token, "
                                        "an authenticator plug-in, the embedded default's local caller)")
    async def health(request: Request) -> dict[str, Any]:
        out: dict[str, Any] = {"status": "ok", "version": __version__, "stage": settings.stage}
        try:  # the caller as every other route finds them: a token, a plug-in, the local one
            who, via = await identify(request)
        except Problem as exc:
            if exc.status != 401:  # the directory is unreadable (503): said, as on any route
                raise
            # Health needs no auth: credentials that prove nobody are no caller, not an error;
            # with none at all there is no caller key (a plain liveness probe).
            if request.headers.get("authorization") is not None or "invalid_token" in exc.headers.get(
                    "WWW-Authenticate", ""):
                out["caller"] = None
        else:
            out["caller"] = {"user": who.user, "team": who.team, "teams": list(who.in_teams), "role": who.role,
                             "roles": who.roles_map()}
            if via == "local":
                out["caller"]["local"] = True
            elif via != "token":
                out["caller"]["authenticator"] = via
        out["auth"] = "local-or-token" if settings.local_admin is not None else "token"
        return out

    @app.get("/api/v1/clusters", summary="Clusters: your own, or everyone's you may read (all_users)",
             response_model=None)
    async def clusters(request: Request, who: Principal = Depends(principal),
                       all_users: bool = Query(False, description="Everyone's clusters, for reading (sky's -u)."),
                       include_terminated: bool = Query(False, description="Terminated clusters too."),
                       at: str | None = Query(None, max_length=timetravel.MAX_AT_CHARS,
                                              description=timetravel.AT_DESCRIPTION),
                       ) -> Any:
        b = bus()
        when = timetravel.checked_at(at)
        if when is not None:  # a past moment: folded from the log here, not the status service's "now"
            try:
                past, truncated = await timetravel.listing_at(b, when, include_terminated)
            except Exception as exc:
                log.warning("rebuilding clusters at %s failed: %s: %s", when, type(exc).__name__, exc)
                raise Problem(503, "unavailable", "Service unavailable",
                              "the server cannot read the log just now; try again shortly", {"Retry-After": "2"})
            return {"clusters": visible(who, past, all_users), "all_users": all_users, "at": when.isoformat(),
                    "truncated": truncated}
        try:
            now = await listings.listing(b, who, all_users, include_terminated, STATUS_TIMEOUT_S)
        except Exception as exc:
            log.warning("status query failed: %s: %s", type(exc).__name__, exc)
            raise Problem(503, "unavailable", "Service unavailable",
                          f"the status service did not answer in {STATUS_TIMEOUT_S:.0f} s; is the control plane "
                          "running (spz api status)?", {"Retry-After": "5"})
        return listing.response(now, request.headers.get("if-none-match"), request.headers.get("accept-encoding"))

    @app.post("/api/v1/tasks", status_code=202, summary="Launch a task on a new cluster (as spz launch)")
    async def submit(body: TaskRequest, who: Principal = Depends(principal)) -> dict[str, Any]:
        # The workspace first: the caller's role in that team (not their primary one's) decides.
        who, defaults = workspaces.resolve(who, body.workspace, await directory_now())
        decision = authorize(who, "submit", who.user, who.team)
        if not decision.allowed:
            raise Problem(403, "forbidden", "Forbidden", decision.reason)
        task_id = str(uuid.uuid4())
        try:
            task = load_task(body)
        except Refused as exc:
            raise Problem(422, "invalid-task", "Invalid task", exc.detail, problems=exc.problems)
        task = await admitted_task(policies, "task", who, task, body.cluster)
        try:
            submission = build_submission(body, who, task_id, task, defaults)
        except Refused as exc:
            raise Problem(422, "invalid-task", "Invalid task", exc.detail, problems=exc.problems)
        b = bus()
        if submission.secret_values:
            await b.put_secrets(task_id, submission.secret_values, submission.event.cluster)
        env = stamp(b.envelope(submission.event), who.user, who.team)
        ack = await b.publish(env)
        log.info("task %s for cluster %s submitted by %s (team %s)", task_id, submission.event.cluster, who.user,
                 who.team)
        return {"task_id": task_id, "cluster": submission.event.cluster, "seq": ack.seq, "user": who.user,
                "team": who.team, "status": "SUBMITTED"}

    # The route families (one module each); they reach the caller and the bus through `deps`.
    deps = ApiDeps(principal=principal, bus=bus, admission=policies, directory=directory_now)
    app.include_router(routes_clusters.router(deps))
    app.include_router(routes_clusterjobs.router(deps))
    slots = StreamSlots()  # one bound on a caller's streams, whichever family they are of
    app.include_router(routes_streams.router(deps, slots))
    app.include_router(routes_history.router(deps, slots))
    app.include_router(routes_reconcile.router(deps))
    app.include_router(routes_jobs.router(deps, slots))
    app.include_router(routes_identity.router(deps))
    app.include_router(routes_console.router(deps))
    app.include_router(routes_dispatch.router(deps))
    app.include_router(routes_observability.router(deps))
    app.include_router(routes_metrics.router(deps, settings.metrics_token))

    # The web console (services/api/console_static.py): static files calling the API above.
    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(f"{CONSOLE_PATH}/", status_code=307)

    @app.get(CONSOLE_PATH, include_in_schema=False)
    async def console_root() -> RedirectResponse:
        return RedirectResponse(f"{CONSOLE_PATH}/", status_code=307)

    app.mount(CONSOLE_PATH, ConsoleFiles(), name="console")

    return app
