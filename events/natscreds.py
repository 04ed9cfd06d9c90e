"""A deployment's bus credentials on disk: drawn at random, written 0600, read back, never logged.

`write_deployment` draws a password per user (events/natsauth.py decides the users and their
permissions), writes one file per user under `naming.bus_credentials_dir(stage)` and the server's
`authorization {}` block to `naming.bus_auth_file(stage)`, both 0600; passwords made once are kept
(a restarted deployment keeps its users' credentials). It imports no contract (the bus imports
this module), so it takes the users and the block's renderer from its caller (cli/busauth.py). A process finds its own by a path:
`SKYPURZA_NATS_CREDS` (what the supervisor gives the services, the API server and, through the
provisioner's environment, local node agents), read by `Bus.connect`; where no file can be put
first (a Kubernetes pod), SKYPURZA_NATS_USER and SKYPURZA_NATS_PASSWORD (a remote cluster's own
agent user, events/agentusers.py).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import naming

CREDS_ENV = "SKYPURZA_NATS_CREDS"
# Where no file can be placed first (a Kubernetes pod's env): the user and password themselves.
# A job never inherits them (the agent strips every SKYPURZA_* variable from a job's environment).
USER_ENV = "SKYPURZA_NATS_USER"
PASSWORD_ENV = "SKYPURZA_NATS_PASSWORD"
_MAX_FILE_BYTES = 4096


@dataclass(frozen=True)
class BusCredentials:
    user: str
    password: str

    def __repr__(self) -> str:  # never shown, whoever logs the object
        return f"BusCredentials(user={self.user!r}, password=<hidden>)"

    __str__ = __repr__


class CredentialsError(Exception):
    """A credentials file that cannot be used (one line for the user; the password never in it)."""


def write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def credentials_file(directory: Path, user: str) -> Path:
    return directory / f"{naming.subject_token(user)}.json"


def read_credentials(path: Path) -> BusCredentials:
    try:
        if path.stat().st_size > _MAX_FILE_BYTES:
            raise CredentialsError(f"{path} is not a bus credentials file (too large)")
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CredentialsError(f"cannot read bus credentials {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise CredentialsError(f"{path} is not a bus credentials file (not JSON)") from None
    user, password = (data.get("user"), data.get("password")) if isinstance(data, dict) else (None, None)
    if not isinstance(user, str) or not isinstance(password, str) or not user or not password:
        raise CredentialsError(f"{path} is not a bus credentials file (needs user and password)")
    return BusCredentials(user, password)


def credentials_from_env(environ: Mapping[str, str] | None = None) -> BusCredentials | None:
    env = os.environ if environ is None else environ
    path = env.get(CREDS_ENV)
    if path:
        return read_credentials(Path(path))
    user, password = env.get(USER_ENV, ""), env.get(PASSWORD_ENV, "")
    if user or password:
        if not user or not password:
            raise CredentialsError(f"{USER_ENV} and {PASSWORD_ENV} go together: set both or neither")
        return BusCredentials(user, password)
    return None


def credentials_env(creds: BusCredentials) -> dict[str, str]:
    """The environment a node agent connects as `creds` with (a pod's env)."""
    return {USER_ENV: creds.user, PASSWORD_ENV: creds.password}


def write_deployment(users: Sequence[str], render: Callable[[Mapping[str, str]], str], *, directory: Path,
                     auth_file: Path) -> Path:
    """Write every user's credentials and the server's authorization block (`render(passwords)`);
    return the block's path. Passwords already written are kept; new users get fresh ones (256 bits)."""
    passwords: dict[str, str] = {}
    for user in users:
        path = credentials_file(directory, user)
        try:
            passwords[user] = read_credentials(path).password
        except CredentialsError:
            passwords[user] = secrets.token_urlsafe(32)
            write_private(path, json.dumps({"user": user, "password": passwords[user]}))
    write_private(auth_file, render(passwords))
    return auth_file
