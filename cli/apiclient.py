"""Which API server the CLI talks to, and asking it who we are.

One decision, `resolve()` (pure): `SKYPURZA_API_SERVER`, else SkyPilot's
`SKYPILOT_API_SERVER_ENDPOINT`, else what `spz api login` stored (naming.api_login_file, mode
0600), else none (the embedded control plane). The token: `SKYPURZA_API_TOKEN`, else the stored
one — and the stored token only goes to the stored server: an environment variable that points
elsewhere never receives it.

A token is never printed, logged or put in an error message.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skypurza.events import naming

ENV_SERVER = "SKYPURZA_API_SERVER"
ENV_TOKEN = "SKYPURZA_API_TOKEN"
ENV_SKY_SERVER = "SKYPILOT_API_SERVER_ENDPOINT"
MAX_URL = 2048
MAX_TOKEN = 512
MAX_REPLY = 64 * 1024
TIMEOUT_S = 10.0


class ApiClientError(Exception):
    """A problem with the API server said to the user (one line, never the token)."""


@dataclass(frozen=True)
class Endpoint:
    url: str
    token: str | None
    source: str  # "SKYPURZA_API_SERVER", "SKYPILOT_API_SERVER_ENDPOINT" or "spz api login"


def check_url(url: str) -> str:
    """An http(s) server URL, without a trailing slash; anything else is refused, saying why."""
    url = (url or "").strip().rstrip("/")
    if not url or len(url) > MAX_URL:
        raise ApiClientError(f"the API server URL must be 1 to {MAX_URL} characters")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ApiClientError(f"{url!r} is not an API server URL: expected http://HOST:PORT or https://HOST")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ApiClientError("the API server URL must not carry a user, password, query or fragment "
                             "(give a token with --token)")
    try:
        parts.port
    except ValueError:
        raise ApiClientError(f"{url!r}: the port must be a number from 1 to 65535") from None
    return url


def check_token(token: str) -> str:
    token = token.strip()
    if not token or len(token) > MAX_TOKEN or any(c.isspace() or not c.isprintable() for c in token):
        raise ApiClientError(f"a token is 1 to {MAX_TOKEN} printable characters without spaces")
    return token


def resolve(env: Mapping[str, str], stored: Mapping[str, Any] | None) -> Endpoint | None:
    """The API server to talk to, or None for the embedded control plane (pure)."""
    stored = stored or {}
    stored_url = stored.get("endpoint") if isinstance(stored.get("endpoint"), str) else None
    stored_token = stored.get("token") if isinstance(stored.get("token"), str) else None
    for var in (ENV_SERVER, ENV_SKY_SERVER):
        if env.get(var, "").strip():
            url = check_url(env[var])
            token = env.get(ENV_TOKEN) or (stored_token if stored_url == url else None)
            return Endpoint(url, token or None, var)
    if stored_url:
        return Endpoint(stored_url, env.get(ENV_TOKEN) or stored_token or None, "spz api login")
    return None


def load_login(path: Path | None = None) -> dict[str, Any] | None:
    path = path or naming.api_login_file()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ApiClientError(f"{path} is unreadable ({type(exc).__name__}); spz api logout, then log in again")
    return data if isinstance(data, dict) else None


def save_login(url: str, token: str | None, path: Path | None = None) -> Path:
    """Write the login file atomically, mode 0600 from its first byte."""
    path = path or naming.api_login_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps({"endpoint": url, **({"token": token} if token else {})}) + "\n")
    return path


def write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def forget_login(path: Path | None = None) -> bool:
    path = path or naming.api_login_file()
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


def health(url: str, token: str | None, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """`GET {url}/api/v1/health` with the token; the reply, or ApiClientError saying what is wrong:
    unreachable, not an spz API server, or (with a token) a token the server does not accept."""
    req = urllib.request.Request(f"{url}/api/v1/health", headers={"Accept": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read(MAX_REPLY + 1)
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            raise ApiClientError(f"{url} refused the token (401): it is unknown, revoked, or its user was "
                                 "removed; ask an admin for a new one (spz users token NAME)") from None
        raise ApiClientError(f"{url} is not an spz API server: GET /api/v1/health answered {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ApiClientError(f"cannot reach the API server at {url}: {reason}; is it running (spz api start), "
                             "and is the URL right?") from None
    try:
        body = json.loads(raw[:MAX_REPLY])
    except ValueError:
        body = None
    if len(raw) > MAX_REPLY or not isinstance(body, dict) or "version" not in body or "stage" not in body:
        raise ApiClientError(f"{url} is not an spz API server: GET /api/v1/health is not spz's answer")
    if token and body.get("caller") is None:
        raise ApiClientError(f"{url} does not accept the token (401): it is unknown, revoked, or its user was "
                             "removed; ask an admin for a new one (spz users token NAME)")
    return body
