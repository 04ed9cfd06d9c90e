"""`spz api login|logout|info`: which API server this CLI talks to (cli/apiclient.py decides)."""

from __future__ import annotations

import os
from typing import Any, Optional

import typer

from .context import check_output, fail, print_json, stage


def _client_error(exc: Exception, code: int = 1) -> typer.Exit:
    return fail(str(exc), code)


def api_login(
    endpoint: str = typer.Option(..., "-e", "--endpoint", help="The API server's URL, e.g. https://spz.example.com "
                                                               "or http://10.0.0.5:46580."),
    token: Optional[str] = typer.Option(None, "-t", "--token", "--service-account-token",
                                        help="Your token (spz users add / spz users token print it). Checked "
                                             "against the server before it is stored."),
    output: str = typer.Option("table", "-o", "--output", help="table or json (never the token)."),
) -> None:
    """Log in to an API server: check it answers (and takes the token), then store the URL and the
    token (mode 0600): the next commands (launch, status, logs, down, jobs ...) go through that
    server, as you. SKYPURZA_API_SERVER / SKYPURZA_API_TOKEN override it."""
    check_output(output)
    from .apiclient import ApiClientError, check_token, check_url, health, save_login

    try:
        url = check_url(endpoint)
        tok = check_token(token) if token is not None else None
    except ApiClientError as exc:
        raise _client_error(exc, 2)
    try:
        body = health(url, tok)
    except ApiClientError as exc:
        raise _client_error(exc)
    path = save_login(url, tok)
    caller = body.get("caller") if tok else None
    out = {"endpoint": url, "stage": body.get("stage"), "version": body.get("version"),
           "user": (caller or {}).get("user"), "team": (caller or {}).get("team"),
           "role": (caller or {}).get("role"), "login_file": str(path)}
    if output == "json":
        print_json(out)
        return
    who = f" as {out['user']} (team {out['team']}, {out['role']})" if caller else " without a token"
    typer.echo(f"Logged in to {url}{who}; stored in {path}.")
    if not tok and body.get("auth") == "token":
        typer.echo("This server takes tokens only: log in again with --token (an admin makes one: "
                   "spz users add NAME --team TEAM).", err=True)
    if os.environ.get("SKYPURZA_API_SERVER"):
        typer.echo("SKYPURZA_API_SERVER is set and wins over this login while it is.", err=True)


def api_logout() -> None:
    """Forget the API server `spz api login` stored (and its token): commands use the embedded
    control plane again, unless SKYPURZA_API_SERVER / SKYPILOT_API_SERVER_ENDPOINT is set."""
    from .apiclient import forget_login

    forgot = forget_login()
    typer.echo("Logged out: the stored API server and token are forgotten." if forgot else "Not logged in.")
    for var in ("SKYPURZA_API_SERVER", "SKYPILOT_API_SERVER_ENDPOINT"):
        if os.environ.get(var):
            typer.echo(f"{var} is still set and still chooses the API server.", err=True)


def _embedded_url() -> str | None:
    from .control import ControlPlane

    return ControlPlane(stage()).status().get("api_url")


def api_info(output: str = typer.Option("table", "-o", "--output", help="table or json (never the token).")) -> None:
    """Which API server this CLI talks to, and as whom (user, team, role): the server's
    /api/v1/health. Exit 1 when it cannot be reached or does not take the token."""
    check_output(output)
    from .apiclient import ApiClientError, health, load_login, resolve

    try:
        ep = resolve(os.environ, load_login())
    except ApiClientError as exc:
        raise _client_error(exc)
    if ep is None:
        url, token, source = _embedded_url(), None, "embedded control plane"
        if url is None:
            raise fail(f"no API server: not logged in (spz api login -e URL), and the embedded control plane of "
                       f"stage {stage()} is not running (spz api start)")
    else:
        url, token, source = ep.url, ep.token, ep.source
    try:
        body = health(url, token)
    except ApiClientError as exc:
        raise _client_error(exc)
    caller: dict[str, Any] = body.get("caller") or {}
    out = {"endpoint": url, "source": source, "stage": body.get("stage"), "version": body.get("version"),
           "user": caller.get("user"), "team": caller.get("team"),
           "teams": caller.get("teams") or ([caller["team"]] if caller.get("team") else []),  # an older server: one
           "role": caller.get("role"),
           "roles": caller.get("roles") or ({t: caller.get("role") for t in caller.get("teams") or [caller["team"]]}
                                            if caller.get("team") else {}),  # an older server: one role
           "authenticated": bool(caller) and not caller.get("local"),
           "token": "set" if token else None}  # whether one is used, never its value
    if output == "json":
        print_json(out)
        return
    typer.echo(f"API server: {url} ({source}), version {out['version']}, stage {out['stage']}")
    if caller:
        how = ("the OS user on the embedded control plane" if caller.get("local")
               else f"by the {caller['authenticator']} authenticator" if caller.get("authenticator") else "by token")
        others = [t for t in out["teams"] if t != caller.get("team")]
        teams = f" (also in: {', '.join(others)})" if others else ""
        # A role per team: the others are named where one differs from the primary team's.
        differ = [f"{t}: {r}" for t, r in out["roles"].items() if t != caller.get("team") and r != caller.get("role")]
        elsewhere = f"; {', '.join(differ)}" if differ else ""
        typer.echo(f"User: {caller.get('user')}  team: {caller.get('team')}{teams}  role: {caller.get('role')}"
                   f"{elsewhere} ({how})")
    else:
        typer.echo("User: none (no token: spz api login -e URL --token TOKEN)")


def register_login(api: typer.Typer) -> None:
    api.command("login")(api_login)
    api.command("logout")(api_logout)
    api.command("info")(api_info)
