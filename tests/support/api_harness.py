"""The API server as a process of its own, for tests: `Api(server, tmp_path)` and RFC 9457 checks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from skypurza.events.natsserver import free_port

STAGE = "test"


class Api:
    """The API server as a process of its own; its stdout and stderr go to one file."""

    def __init__(self, server, tmp_path: Path, env: dict[str, str] | None = None, name: str = "api") -> None:
        """`env`: the process's environment (default: this one's); `name`: its log's (two replicas)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "skypurza.services.api", "--nats", server.url, "--stage", STAGE,
                 "--host", "127.0.0.1", "--port", str(self.port)], stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.url}/api/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.1)
        self.http = httpx.Client(base_url=self.url, timeout=20)

    def as_(self, token: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}

    def close(self) -> str:
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        return self.log.read_text()


def problem(res: httpx.Response, status: int) -> dict:
    assert res.status_code == status, res.text
    assert res.headers["content-type"].startswith("application/problem+json")
    body = res.json()
    assert body["status"] == status and body["type"].startswith("https://") and body["title"] and body["detail"]
    return body


def sse_frames(res: httpx.Response, until: float) -> Iterator[tuple[str, dict]]:
    """(event, data) of an SSE response, until the server ends it or `until` (monotonic) passes."""
    event, data = None, []
    for raw in res.iter_lines():
        if time.monotonic() > until:
            return
        if raw.startswith("event: "):
            event = raw[7:]
        elif raw.startswith("data: "):
            data.append(raw[6:])
        elif raw == "" and event is not None:
            yield event, json.loads("\n".join(data))
            event, data = None, []


def cli_token(env: dict[str, str], user: str, role: str, team: str = "ml") -> str:
    """`spz users add USER` on the plane `env` points at: the token it shows once."""
    from local_cli import spz

    r = spz(env, "users", "add", user, "--team", team, "--role", role, "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)["token"]


def team_of_four(env: dict[str, str]) -> tuple[str, str, str, str]:
    """Team `ml` with members alice and bob, viewer vera, admin root: their tokens, in that order."""
    from local_cli import spz

    assert spz(env, "teams", "add", "ml").returncode == 0
    return (cli_token(env, "alice", "member"), cli_token(env, "bob", "member"),
            cli_token(env, "vera", "viewer"), cli_token(env, "root", "admin"))
