"""`spz users` and `spz teams` through a configured API server (cli/transport.py picks this or the bus).

The server's identity routes (services/api/routes_identity.py, admins only) make the same changes
`services/api/directory_io.py` makes on the embedded bus; these functions turn their answers into
what cli/cmd_identity.py prints either way: a `Directory`-like listing and each change's result.
A refusal is one line (the server's reason: 403 for a non-admin, 404 an unknown name, 409 a
conflict); an unreachable server says so.
"""

from __future__ import annotations

from typing import Any

from .apitransport import ApiError, ApiTransport
from .context import fail


def _call(work: Any) -> Any:
    try:
        return work()
    except ApiError as exc:
        raise fail(str(exc)) from None


def add_user(t: ApiTransport, name: str, teams: list[str], role: str) -> tuple[str, str]:
    """(token id, token): the token is in this one answer."""
    body = {"name": name, "team": teams[0], "other_teams": teams[1:], "role": role}
    out = _call(lambda: t.post("/api/v1/users", body))
    return str(out["token_id"]), str(out["token"])


def new_token(t: ApiTransport, name: str, service_account: bool) -> tuple[str, str]:
    out = _call(lambda: t.post(f"/api/v1/users/{name}/token", {"service_account": service_account}))
    return str(out["token_id"]), str(out["token"])


def remove_user(t: ApiTransport, name: str) -> None:
    _call(lambda: t.delete(f"/api/v1/users/{name}"))


def user_rows(t: ApiTransport) -> list[dict[str, Any]]:
    """`spz users list -o json`'s rows, from GET /api/v1/users."""
    users = _call(lambda: t.get("/api/v1/users"))["users"]
    return [{"user": u["name"], "team": u["team"], "teams": list(u.get("teams") or [u["team"]]), "role": u["role"],
             "roles": dict(u.get("roles") or {t: u["role"] for t in (u.get("teams") or [u["team"]])}),  # an older server
             "tokens": list(u.get("token_ids") or []),
             "service_account_tokens": list(u.get("service_account_token_ids") or [])} for u in users]


def team_rows(t: ApiTransport) -> list[dict[str, Any]]:
    """`spz teams list -o json`'s rows, from GET /api/v1/teams."""
    teams = _call(lambda: t.get("/api/v1/teams"))["teams"]
    return [{"team": x["name"], "allowed_infras": list(x["allowed_infras"]), "labels": dict(x["labels"]),
             "credentials": dict(x.get("credentials") or {}), "users": list(x["members"])} for x in teams]


def add_team(t: ApiTransport, name: str, infras: list[str], labels: dict[str, str],
             aws_profile: str | None = None, k8s_namespace: str | None = None,
             slurm_account: str | None = None) -> None:
    body: dict[str, Any] = {"name": name, "allowed_infras": infras, "labels": labels}
    creds: dict[str, Any] = {}
    if aws_profile:
        creds["aws"] = {"profile": aws_profile}
    if k8s_namespace:
        creds["kubernetes"] = {"namespace": k8s_namespace}
    if slurm_account:
        creds["slurm"] = {"account": slurm_account}
    if creds:
        body["credentials"] = creds
    _call(lambda: t.post("/api/v1/teams", body))


def update_team(t: ApiTransport, name: str, infras: list[str] | None,
                labels: dict[str, str] | None, aws_profile: str | None = None,
                k8s_namespace: str | None = None,
                slurm_account: str | None = None) -> tuple[list[str], dict[str, str]]:
    body: dict[str, Any] = {}
    if infras is not None:
        body["allowed_infras"] = infras
    if labels is not None:
        body["labels"] = labels
    creds: dict[str, Any] = {}  # a key left out is kept by the server; null: back to the default
    if aws_profile is not None:
        creds["aws"] = {"profile": aws_profile} if aws_profile else None
    if k8s_namespace is not None:
        creds["kubernetes"] = {"namespace": k8s_namespace} if k8s_namespace else None
    if slurm_account is not None:
        creds["slurm"] = {"account": slurm_account} if slurm_account else None
    if creds:
        body["credentials"] = creds
    out = _call(lambda: t.patch(f"/api/v1/teams/{name}", body))
    return list(out["allowed_infras"]), dict(out["labels"])


def remove_team(t: ApiTransport, name: str) -> None:
    _call(lambda: t.delete(f"/api/v1/teams/{name}"))


def add_member(t: ApiTransport, team: str, user: str, primary: bool, role: str | None = None) -> tuple[str, ...]:
    body: dict[str, Any] = {"user": user, "primary": primary}
    if role is not None:
        body["role"] = role
    out = _call(lambda: t.post(f"/api/v1/teams/{team}/members", body))
    return tuple(out["teams"])


def remove_member(t: ApiTransport, team: str, user: str) -> tuple[str, ...]:
    out = _call(lambda: t.delete(f"/api/v1/teams/{team}/members/{user}"))
    return tuple(out["teams"])


def set_role(t: ApiTransport, team: str, user: str, role: str) -> dict[str, str]:
    """The user's role in each team after the change (PATCH /api/v1/teams/{team}/members/{user})."""
    out = _call(lambda: t.patch(f"/api/v1/teams/{team}/members/{user}", {"role": role}))
    return dict(out["roles"])
