"""The API server against real parts: a real nats-server, the status service and the API server as
real processes (uvicorn on a free port), httpx as the client, `spz users|teams` as the admin.

What is checked: no token, a wrong one, a replaced one and a removed user's are 401 with
`WWW-Authenticate: Bearer`; a viewer's submission is 403 with the reason; a member's submission
is on the log stamped with the member's user and team whatever the task or the body claims;
names with subject or path metacharacters are refused (422 here, exit 2 in the CLI); two
`spz users add` of one name at once make one user; no token is in the log or the server's
output; /openapi.json is OpenAPI 3.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from ledger_history import cand
from api_harness import Api, problem as _problem
from nats_fixtures import connect_bus

from skypurza.events import naming
from skypurza.events.cluster_events import ClusterProvisioned
from skypurza.events.principal import stamped_principal
from skypurza.events.types import NodeInfo

STAGE = "test"


def _env(server, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "SKYPURZA_NATS_URL": server.url, "SKYPURZA_STAGE": STAGE,
            "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_NO_PLUGINS": "1"}


def spz(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def _token(env: dict[str, str], user: str, team: str, role: str) -> str:
    res = spz(env, "users", "add", user, "--team", team, "--role", role, "-o", "json")
    assert res.returncode == 0, res.stderr
    body = json.loads(res.stdout)
    assert res.stdout.count(body["token"]) == 1  # shown once
    return body["token"]


@pytest.fixture
def api(nats_server, tmp_path):
    server = Api(nats_server, tmp_path)
    yield server
    server.close()


@pytest.fixture
def status_service(nats_server, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "skypurza.services.status.service", "--nats", nats_server.url,
                             "--stage", STAGE, "--db", str(tmp_path / "status.duckdb")],
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "status.log").open("wb"))
    yield proc
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def _everything_on_the_bus(server) -> bytes:
    """Every stored event and log chunk, raw."""
    async def main() -> bytes:
        bus = await connect_bus(server)
        try:
            out = [m.data async for m in bus.replay_raw()]
            out += [m.data async for m in bus.replay_raw(stream=bus.logs_stream)]
            return b"\n".join(out)
        finally:
            await bus.close()

    return asyncio.run(main())


def _submitted(server) -> list:
    async def main() -> list:
        bus = await connect_bus(server)
        try:
            return [s async for s in bus.replay() if s.event is not None and s.event.EVENT_NAME == "task_submitted"]
        finally:
            await bus.close()

    return asyncio.run(main())


def test_tokens_401_until_valid_and_die_when_replaced_or_the_user_removed(nats_server, tmp_path, api):
    env = _env(nats_server, tmp_path)
    assert spz(env, "teams", "add", "ml").returncode == 0
    alice = _token(env, "alice", "ml", "member")

    # No token, a malformed header, a well-formed token nobody has: 401, Bearer challenge, problem+json.
    for headers in ({}, {"Authorization": "Basic YWxpY2U6eA=="}, api.as_("spz_0123456789abcdef_" + "A" * 43),
                    api.as_("x" * 5000)):
        res = api.http.get("/api/v1/clusters", headers=headers)
        body = _problem(res, 401)
        assert res.headers["www-authenticate"].startswith("Bearer"), headers
        assert "token" in body["detail"]

    # One bad identity event (not JSON; a user_added without its fields) stops nothing: the server
    # reads past it, and is caught up with the log (no 503) for the next request.
    async def poison() -> None:
        bus = await connect_bus(nats_server)
        try:
            await bus.js.publish(naming.event_subject(STAGE, "user", "mallory", "user_added"), b"{not json")
            await bus.js.publish(naming.event_subject(STAGE, "user", "mallory", "user_added"),
                                 b'{"specversion":"1.0","id":"p1","source":"/x","type":"io.skypurza.user_added.v1",'
                                 b'"time":"2026-11-02T00:00:00Z","subject":"user/mallory","data":{}}')
        finally:
            await bus.close()

    asyncio.run(poison())
    health = api.http.get("/api/v1/health", headers=api.as_(alice)).json()
    assert health["caller"] == {"user": "alice", "team": "ml", "teams": ["ml"], "role": "member",
                                "roles": {"ml": "member"}} and health["version"]
    assert "caller" not in api.http.get("/api/v1/health").json()
    assert api.http.get("/api/v1/health", headers={"Authorization": "Basic YWxpY2U6eA=="}).json()["caller"] is None

    # A new token kills the old one at once (the server reads the log before it trusts a token).
    res = spz(env, "users", "token", "alice", "-o", "json")
    assert res.returncode == 0, res.stderr
    renewed = json.loads(res.stdout)["token"]
    assert api.http.get("/api/v1/health", headers=api.as_(alice)).json()["caller"] is None
    assert api.http.post("/api/v1/tasks", json={"task": "run: echo"}, headers=api.as_(alice)).status_code == 401
    assert api.http.get("/api/v1/health", headers=api.as_(renewed)).json()["caller"]["user"] == "alice"

    # A removed user's token: 401 from then on.
    assert spz(env, "users", "remove", "alice").returncode == 0
    res = api.http.post("/api/v1/tasks", json={"task": "run: echo"}, headers=api.as_(renewed))
    assert "removed" in _problem(res, 401)["detail"]
    assert 'error="invalid_token"' in res.headers["www-authenticate"]

    output = api.close()
    bus = _everything_on_the_bus(nats_server)
    for token in (alice, renewed):
        assert token.encode() not in bus and token not in output
        assert token.split("_")[1].encode() in bus  # its id is there: the events were read


def test_a_members_task_is_stamped_with_their_user_and_team_a_viewers_is_refused(nats_server, tmp_path, api):
    env = _env(nats_server, tmp_path)
    assert spz(env, "teams", "add", "ml").returncode == 0
    alice, vera = _token(env, "alice", "ml", "member"), _token(env, "vera", "ml", "viewer")
    task = "name: train\nrun: echo hi\nresources:\n  labels:\n    team: finance\n    project: llm\n"

    res = api.http.post("/api/v1/tasks", headers=api.as_(alice),
                        json={"task": task, "cluster": "c1", "overrides": {"cpus": "2", "envs": {"A": "1"}}})
    assert res.status_code == 202, res.text
    answer = res.json()
    assert (answer["user"], answer["team"], answer["cluster"]) == ("alice", "ml", "c1")

    # The body cannot choose the stamp; a viewer cannot submit; names and tasks are checked.
    claimed = api.http.post("/api/v1/tasks", headers=api.as_(alice), json={"task": task, "user": "mallory"})
    assert "stamps the authenticated caller" in _problem(claimed, 422)["detail"]
    denied = _problem(api.http.post("/api/v1/tasks", headers=api.as_(vera), json={"task": task}), 403)
    assert "viewers read only" in denied["detail"]
    for cluster in ("a/b", "a*", "a>", "a b"):
        body = _problem(api.http.post("/api/v1/tasks", headers=api.as_(alice),
                                      json={"task": task, "cluster": cluster}), 422)
        assert "invalid cluster name" in body["detail"]
    bad = _problem(api.http.post("/api/v1/tasks", headers=api.as_(alice),
                                 json={"task": "run: echo\nresources: {cpus: lots}\n"}), 422)
    assert "resources.cpus" in bad["detail"]
    local = _problem(api.http.post("/api/v1/tasks", headers=api.as_(alice), json={"task": "workdir: .\nrun: ls\n"}),
                     422)
    assert "local path" in local["detail"]
    big = api.http.post("/api/v1/tasks", headers={**api.as_(alice), "content-type": "application/json"},
                        content=b'{"task": "' + b"x" * (6 * 2**20) + b'"}')
    _problem(big, 413)
    _problem(api.http.post("/api/v1/tasks", headers=api.as_(alice), content=b"{not json"), 422)

    submitted = _submitted(nats_server)
    assert len(submitted) == 1, "only the member's valid task was published"
    s = submitted[0]
    assert stamped_principal(s.envelope) == ("alice", "ml")
    assert (s.event.user, s.event.team, s.event.project, s.event.cluster) == ("alice", "ml", "llm", "c1")
    assert s.event.task.resources.cpus == "2" and s.event.task.envs == {"A": "1"}
    assert s.envelope.model_extra == {"spzuser": "alice", "spzteam": "ml"}

    doc = api.http.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.1") and {"/api/v1/health", "/api/v1/clusters", "/api/v1/tasks"} <= set(
        doc["paths"])
    assert "Traceback" not in api.close()  # nothing was raised out of a handler, nor at shutdown


def test_clusters_show_your_own_everyones_with_all_users_and_a_viewer_their_teams(
        nats_server, tmp_path, api, status_service):
    env = _env(nats_server, tmp_path)
    for team in ("ml", "research"):
        assert spz(env, "teams", "add", team).returncode == 0
    alice, vera, root = (_token(env, "alice", "ml", "member"), _token(env, "vera", "ml", "viewer"),
                         _token(env, "root", "research", "admin"))

    async def seed() -> None:
        bus = await connect_bus(nats_server)
        now = datetime.now(timezone.utc)
        try:
            for cluster, user, team in (("ca", "alice", "ml"), ("cb", "bob", "research"), ("cv", "ursula", "ml")):
                await bus.publish(ClusterProvisioned(
                    cluster=cluster, task_id=f"t-{cluster}", placement_id=f"p-{cluster}", candidate=cand(),
                    nodes=[NodeInfo(rank=0, instance_id=f"i-{cluster}", private_ip="10.0.0.1")],
                    hourly_price_micros=1_000_000, launched_at=now, user=user, team=team))
        finally:
            await bus.close()

    asyncio.run(seed())

    def names(token: str, **params: str) -> set[str]:
        res = api.http.get("/api/v1/clusters", headers=api.as_(token), params=params)
        assert res.status_code == 200, res.text
        return {c["name"] for c in res.json()["clusters"]}

    assert names(alice) == {"ca"}
    assert names(alice, all_users="true") == {"ca", "cb", "cv"}
    assert names(vera) == {"ca", "cv"} and names(vera, all_users="true") == {"ca", "cv"}  # own team only
    assert names(root) == {"ca", "cb", "cv"}


def test_two_users_add_of_one_name_at_once_make_one_user_and_bad_names_exit_2(nats_server, tmp_path):
    env = _env(nats_server, tmp_path)
    assert spz(env, "teams", "add", "ml").returncode == 0
    procs = [subprocess.Popen([sys.executable, "-m", "skypurza.cli.main", "users", "add", "alice", "--team", "ml",
                               "--role", role, "-o", "json"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for role in ("member", "admin", "viewer")]
    results = [(p.wait(60), *p.communicate()) for p in procs]
    assert sorted(code for code, _, _ in results) == [0, 1, 1], results
    assert all("user alice exists" in err for code, _, err in results if code == 1)
    listed = json.loads(spz(env, "users", "list", "-o", "json").stdout)
    assert [u["user"] for u in listed] == ["alice"] and len(listed[0]["tokens"]) == 1

    for args in (("users", "add", "a.b", "--team", "ml"), ("users", "add", "x", "--team", "m*l"),
                 ("teams", "add", "a/b"), ("teams", "add", "a>b"), ("users", "token", "A")):
        res = spz(env, *args)
        assert res.returncode == 2 and "lower-case letters, digits" in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.stderr

    # An unreadable event on bob's subject: the next write expects it as bob's newest, and succeeds.
    async def poison() -> None:
        bus = await connect_bus(nats_server)
        try:
            await bus.js.publish(naming.event_subject(STAGE, "user", "bob", "user_added"), b"{not json")
        finally:
            await bus.close()

    asyncio.run(poison())
    res = spz(env, "users", "add", "bob", "--team", "ml")
    assert res.returncode == 0 and res.stdout.startswith("spz_"), res.stderr
    assert spz(env, "users", "remove", "bob").returncode == 0

    res = spz(env, "teams", "remove", "ml")
    assert res.returncode == 1 and "alice" in res.stderr
    assert spz(env, "users", "remove", "alice").returncode == 0
    assert spz(env, "teams", "remove", "ml").returncode == 0
    assert json.loads(spz(env, "teams", "list", "-o", "json").stdout) == []
