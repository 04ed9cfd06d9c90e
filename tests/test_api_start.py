"""`spz api start` runs the API server; `--deploy` makes the first admin; `spz api login/info/logout`.

Real processes: the `spz` CLI, the stage's supervisor, nats-server, the services and the API
server; a small real HTTP server plays a server that is not spz's (and records what it is sent).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from leftovers import kill_stage

from skypurza.cli import planeprocs
from skypurza.cli.apiclient import ApiClientError, Endpoint, check_url, resolve
from skypurza.cli.control import ControlPlaneError, choose_api_port
from skypurza.events.natsserver import free_port

STAGE = "apistart"


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "SKYPURZA_HOME": str(home), "SKYPURZA_STAGE": STAGE, "SKYPURZA_USER": "osuser",
           "COLUMNS": "200", **extra}
    for var in ("SKYPURZA_NATS_URL", "SKYPURZA_NATS_PORT", "SKYPURZA_API_SERVER", "SKYPURZA_API_TOKEN", "SKYPURZA_API_PORT",
                "SKYPILOT_API_SERVER_ENDPOINT", "SKYPILOT_API_SERVER_LOCAL_PORT"):
        if var not in extra:
            env.pop(var, None)
    return env


def spz(env: dict[str, str], *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def _roles(home: Path) -> Counter:
    sd = home / STAGE
    return Counter(p.role for p in planeprocs.find(sd, sd / "jetstream" / "nats.conf", STAGE))


@pytest.fixture
def home(tmp_path: Path):
    h = tmp_path / "home"
    yield h
    spz(_env(h), "api", "stop", timeout=90)
    kill_stage(h, STAGE)  # whatever a failure left


# ------------------------------------------------------------------------------------ pure decisions

def test_which_server_env_wins_and_the_stored_token_only_goes_to_the_stored_server() -> None:
    stored = {"endpoint": "http://team:46580", "token": "spz_a_stored"}
    assert resolve({}, None) is None, "nothing configured: the embedded control plane"
    assert resolve({}, stored) == Endpoint("http://team:46580", "spz_a_stored", "spz api login")
    assert resolve({"SKYPURZA_API_TOKEN": "spz_b_env"}, stored).token == "spz_b_env"
    other = resolve({"SKYPURZA_API_SERVER": "http://elsewhere:1/"}, stored)
    assert other == Endpoint("http://elsewhere:1", None, "SKYPURZA_API_SERVER"), "never the stored token elsewhere"
    same = resolve({"SKYPILOT_API_SERVER_ENDPOINT": "http://team:46580"}, stored)
    assert same == Endpoint("http://team:46580", "spz_a_stored", "SKYPILOT_API_SERVER_ENDPOINT")
    both = resolve({"SKYPURZA_API_SERVER": "http://a:1", "SKYPILOT_API_SERVER_ENDPOINT": "http://b:2"}, None)
    assert both.url == "http://a:1", "spz's variable wins over SkyPilot's"
    for bad in ("ftp://x", "http://", "http://u:p@h:1", "http://h:99999", "x" * 3000):
        with pytest.raises(ApiClientError):
            check_url(bad)


def test_api_port_choice_never_takes_a_port_in_use() -> None:
    taken = {46580, 5000}
    in_use = taken.__contains__
    assert choose_api_port(None, None, None, in_use, lambda: 7777) == 7777, "46580 taken: any free port"
    assert choose_api_port(None, None, 6000, in_use, lambda: 7777) == 6000, "the recorded one"
    assert choose_api_port(None, "6100", 6000, in_use, lambda: 7777) == 6100, "SKYPILOT_API_SERVER_LOCAL_PORT"
    assert choose_api_port(None, None, None, lambda p: False, lambda: 7777) == 46580, "sky's default"
    assert choose_api_port(6200, None, 6000, in_use, lambda: 7777) == 6200
    with pytest.raises(ControlPlaneError, match="in use"):
        choose_api_port(5000, None, None, in_use, lambda: 7777)


# ------------------------------------------------------------------------------------ real processes

def test_api_start_serves_health_as_the_os_user_and_stop_leaves_no_api_server(home: Path) -> None:
    env = _env(home)
    port = free_port()
    r = spz(env, "api", "start", "--port", str(port), "-o", "json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["api_url"] == f"http://127.0.0.1:{port}" and not st["api_deploy"]
    health = httpx.get(f"{st['api_url']}/api/v1/health", timeout=10).json()
    assert health["stage"] == STAGE and health["version"]
    # The embedded default: a loopback caller without a token is the OS user, as admin.
    assert health["caller"] == {"user": "osuser", "team": "local", "teams": ["local"], "role": "admin",
                                "roles": {"local": "admin"}, "local": True}
    assert httpx.get(f"{st['api_url']}/api/v1/clusters", timeout=20).json()["clusters"] == []
    # The web console is served by the same server, at the URL `spz api start` and `status` give.
    assert st["console_url"] == f"{st['api_url']}/console/"
    page = httpx.get(st["console_url"], timeout=10)
    assert page.status_code == 200 and "SkyPurza console" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert httpx.get(f"{st['api_url']}/", timeout=10).headers["location"] == "/console/"
    status = spz(env, "api", "status", "-o", "json")
    assert json.loads(status.stdout)["console_url"] == st["console_url"], status.stdout
    assert _roles(home)["api-server"] == 1
    info = spz(env, "api", "info", "-o", "json")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout) == {"endpoint": st["api_url"], "source": "embedded control plane",
                                           "stage": STAGE, "version": health["version"], "user": "osuser",
                                           "team": "local", "teams": ["local"], "role": "admin",
                                           "roles": {"local": "admin"}, "authenticated": False,
                                           "token": None}
    # A start that finds it running uses it; a deployment is not a no-op on a plane without auth.
    assert json.loads(spz(env, "api", "start", "-o", "json").stdout)["already_running"] is True
    refused = spz(env, "api", "start", "--deploy")
    assert refused.returncode == 1 and "without --deploy" in refused.stderr and "Traceback" not in refused.stderr
    stopped = spz(env, "api", "stop", "-o", "json")
    assert stopped.returncode == 0 and "api-server" in {p["name"] for p in json.loads(stopped.stdout)["stopped"]}
    assert _roles(home) == Counter(), "api stop left a process behind"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{st['api_url']}/api/v1/health", timeout=3)
    # The port is kept: a start on first use serves on it again.
    again = json.loads(spz(env, "api", "start", "-o", "json").stdout)
    assert again["api_url"] == st["api_url"]


class _NotSpz(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802
        _NotSpz.seen.append(dict(self.headers))
        body = b"<html>hello</html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_deploy_makes_the_admin_once_and_login_info_logout_round_trip(home: Path) -> None:
    env = _env(home)
    port = free_port()
    r = spz(env, "api", "start", "--deploy", "--host", "127.0.0.1", "--port", str(port), "-o", "json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    url, admin = st["api_url"], st["admin"]
    assert st["api_deploy"] and admin["created"] and admin["token"].startswith("spz_")
    token_file = home / STAGE / "admin-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert token_file.read_text().strip() == admin["token"]
    token = admin["token"]
    ok = httpx.get(f"{url}/api/v1/clusters", headers={"Authorization": f"Bearer {token}"}, timeout=20)
    assert ok.status_code == 200 and ok.json()["clusters"] == []
    assert httpx.get(f"{url}/api/v1/clusters", timeout=10).status_code == 401, "a deployment takes tokens only"
    assert httpx.get(f"{url}/api/v1/health", timeout=10).json().get("caller") is None
    # A second start makes no second admin and prints no token.
    again = spz(env, "api", "start", "--deploy", "--host", "127.0.0.1", "--port", str(port))
    assert again.returncode == 0 and "spz_" not in again.stdout + again.stderr and "admin-token" in again.stderr

    # Not logged in: info speaks of the embedded plane's server, with no user (tokens only).
    assert json.loads(spz(env, "api", "info", "-o", "json").stdout)["user"] is None
    wrong = spz(env, "api", "login", "-e", url, "--token", "spz_nope_nope")
    assert wrong.returncode == 1 and "does not accept the token" in wrong.stderr and "Traceback" not in wrong.stderr
    assert not (home / "api-login.json").exists(), "a refused login stores nothing"
    login = spz(env, "api", "login", "-e", url + "/", "--token", token, "-o", "json")
    assert login.returncode == 0, login.stderr
    assert json.loads(login.stdout)["user"] == "admin" and token not in login.stdout
    login_file = home / "api-login.json"
    assert stat.S_IMODE(login_file.stat().st_mode) == 0o600
    info = spz(env, "api", "info", "-o", "json")
    assert info.returncode == 0 and token not in info.stdout + info.stderr
    assert json.loads(info.stdout) == {"endpoint": url, "source": "spz api login", "stage": STAGE,
                                           "version": json.loads(info.stdout)["version"], "user": "admin",
                                           "team": "admin", "teams": ["admin"], "role": "admin",
                                           "roles": {"admin": "admin"}, "authenticated": True,
                                           "token": "set"}
    status = spz(env, "api", "status", "-o", "json")
    assert token not in status.stdout and json.loads(status.stdout)["api_url"] == url

    # Env precedence: SKYPILOT_API_SERVER_ENDPOINT names the same server (the stored token goes);
    # SKYPURZA_API_TOKEN overrides the stored token (a wrong one: exit 1, said plainly).
    sky = spz(_env(home, SKYPILOT_API_SERVER_ENDPOINT=url), "api", "info", "-o", "json")
    assert json.loads(sky.stdout)["source"] == "SKYPILOT_API_SERVER_ENDPOINT" and json.loads(sky.stdout)["user"] == "admin"
    bad = spz(_env(home, SKYPURZA_API_TOKEN="spz_x_y"), "api", "info")
    assert bad.returncode == 1 and "does not accept the token" in bad.stderr
    # SKYPURZA_API_SERVER pointing at a server that is not spz's: said so, and the stored token is not sent.
    other = ThreadingHTTPServer(("127.0.0.1", 0), _NotSpz)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        elsewhere = f"http://127.0.0.1:{other.server_address[1]}"
        not_spz = spz(_env(home, SKYPURZA_API_SERVER=elsewhere), "api", "info")
        assert not_spz.returncode == 1 and "is not an spz API server" in not_spz.stderr, not_spz.stderr
        assert _NotSpz.seen and all("Authorization" not in h for h in _NotSpz.seen)
    finally:
        other.shutdown()
    gone = spz(_env(home, SKYPURZA_API_SERVER=f"http://127.0.0.1:{free_port()}"), "api", "info")
    assert gone.returncode == 1 and "cannot reach the API server" in gone.stderr
    assert spz(env, "api", "login", "-e", "ftp://x").returncode == 2

    out = spz(env, "api", "logout")
    assert out.returncode == 0 and not login_file.exists()
    assert json.loads(spz(env, "api", "info", "-o", "json").stdout)["source"] == "embedded control plane"
    assert spz(env, "api", "logout").stdout.strip() == "Not logged in."
    # No token on any log line of the control plane.
    for log in (home / STAGE / "logs").glob("*.log"):
        assert token not in log.read_text(errors="replace"), log
