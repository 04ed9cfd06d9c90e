"""A role per team: a user may be a member of one team and a viewer of another.

- The fold (pure): UserJoinedTeam's `role` and UserTeamRoleSet give a user a role in one team;
  a membership without one (every log before per-team roles, tests/fixtures/identity_v1.jsonl)
  has the user's own role, so an old log authorizes as it did; admin is deployment-wide.
- Authorization (pure) by the role in the team a request acts in: the workspace a submission is
  stamped with, the team of the cluster acted on.
- Against a real nats-server, the status service and the API server as a uvicorn process: bob,
  member in ml and viewer in cv, submits in ml (202) and not in cv (403 naming the team and the
  role); reads cv's clusters and cannot stop them; `spz teams set-role cv bob member` (through
  the server, an admin's token) lets him submit there with the same token; `spz users list`, the
  health route's caller and `spz api info` show each team's role.
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
from api_harness import Api, problem
from ledger_history import cand
from nats_fixtures import connect_bus

from skypurza.events.cluster_events import ClusterProvisioned
from skypurza.events.envelope import decode
from skypurza.events.identity_events import TeamAdded, TokenIssued, UserAdded, UserJoinedTeam, UserLeftTeam, \
    UserTeamRoleSet
from skypurza.events.types import NodeInfo
from skypurza.services.api import workspaces
from skypurza.services.api.identity import Directory, authenticate, authorize, issue_token, visible

FIXTURES = Path(__file__).parent / "fixtures"


# ------------------------------------------------------------------------------------------ the fold


def test_an_old_log_gives_each_user_their_own_role_in_every_team() -> None:
    lines = [line for line in (FIXTURES / "identity_v1.jsonl").read_bytes().splitlines() if line.strip()]
    d = Directory.of((i + 1, decode(line).event) for i, line in enumerate(lines))
    assert {u.name: u.roles for u in d.users.values()} == {"alice": {"cv": "admin"}, "bob": {"cv": "viewer"}}
    # A membership event stored before `role` existed decodes without one: the user's own role.
    old = decode(b'{"specversion":"1.0","id":"x1","source":"/t","type":"io.skypurza.user_joined_team.v1",'
                 b'"time":"2026-11-02T01:00:01Z","subject":"user/vera","datacontenttype":"application/json","data":{"user":"vera","team":"cv"}}')
    assert isinstance(old.event, UserJoinedTeam) and old.event.role is None
    d = Directory.of(enumerate([TeamAdded(team="ml"), TeamAdded(team="cv"),
                                UserAdded(user="vera", team="ml", role="viewer"), old.event], start=1))
    assert d.users["vera"].roles == {"ml": "viewer", "cv": "viewer"}


def _directory() -> tuple[Directory, str]:
    token = issue_token()
    d = Directory.of(enumerate([
        TeamAdded(team="ml"), TeamAdded(team="cv"), TeamAdded(team="fin"),
        UserAdded(user="bob", team="ml", role="member"),
        TokenIssued(user="bob", token_id=token.token_id, token_sha256=token.sha256),
        UserJoinedTeam(user="bob", team="cv", role="viewer"),
    ], start=1))
    return d, token.token


def test_a_role_per_team_folded_changed_and_forgotten_on_leaving() -> None:
    d, token = _directory()
    bob = d.users["bob"]
    assert (bob.roles, bob.primary_role, bob.role) == ({"ml": "member", "cv": "viewer"}, "member", "member")
    d.apply(UserTeamRoleSet(user="bob", team="cv", role="member"), 10)
    assert d.users["bob"].roles == {"ml": "member", "cv": "member"} and d.seq_of("user", "bob") == 10
    d.apply(UserTeamRoleSet(user="bob", team="fin", role="viewer"), 11)  # not his team: nothing
    assert "fin" not in d.users["bob"].roles and d.users["bob"].team_roles.get("fin") is None
    d.apply(UserTeamRoleSet(user="ghost", team="cv", role="viewer"), 12)  # no such user: nothing
    d.apply(UserTeamRoleSet(user="bob", team="ml", role="viewer"), 13)
    assert d.users["bob"].roles == {"ml": "viewer", "cv": "member"}
    assert authenticate(d, token).role == "viewer"  # the primary team's role, read on each request
    d.apply(UserLeftTeam(user="bob", team="cv"), 14)
    d.apply(UserJoinedTeam(user="bob", team="cv"), 15)  # joined again without a role: his own
    assert d.users["bob"].roles == {"ml": "viewer", "cv": "member"}
    # An admin is one in every team, whatever a membership says (admin is deployment-wide).
    d.apply(UserAdded(user="root", team="ml", role="admin"), 16)
    d.apply(UserJoinedTeam(user="root", team="cv", role="viewer"), 17)
    assert d.users["root"].roles == {"ml": "admin", "cv": "admin"}


def test_authorization_uses_the_role_in_the_team_the_request_acts_in() -> None:
    d, token = _directory()
    bob = authenticate(d, token)
    assert bob is not None and dict(bob.roles) == {"ml": "member", "cv": "viewer"} and bob.role == "member"
    assert authorize(bob, "submit", "bob", "ml").allowed
    no = authorize(bob, "submit", "bob", "cv")
    assert not no.allowed and "bob is a viewer in team cv" in no.reason and "spz teams set-role cv bob member" \
        in no.reason
    # The workspace carries its role: what POST /api/v1/tasks authorizes after resolving -w.
    in_cv, _ = workspaces.resolve(bob, "cv", d)
    assert (in_cv.team, in_cv.role) == ("cv", "viewer") and not authorize(in_cv, "submit", "bob", in_cv.team).allowed
    assert workspaces.resolve(bob, None, d)[0].role == "member"
    assert workspaces.for_cluster(bob, "cv").role == "viewer"
    # His own cluster in cv: he reads it and its logs, and may not act on it; in ml he may.
    assert authorize(bob, "read", "bob", "cv").allowed and authorize(bob, "logs", "ann", "cv").allowed
    assert not authorize(bob, "act", "bob", "cv").allowed and authorize(bob, "act", "bob", "ml").allowed
    assert not authorize(bob, "secrets", "bob", "cv").allowed and authorize(bob, "secrets", "bob", "ml").allowed
    # Outside his teams his highest role reads (members read everyone's clusters), and no more.
    assert authorize(bob, "read", "carl", "fin").allowed and not authorize(bob, "logs", "carl", "fin").allowed
    rows = [{"name": n, "user": u, "team": t} for n, u, t in
            (("b-ml", "bob", "ml"), ("a-ml", "ann", "ml"), ("a-cv", "ann", "cv"), ("c-fin", "carl", "fin"))]
    # His listing: his own where he is a member, the team's where he is a viewer.
    assert [r["name"] for r in visible(bob, rows, all_users=False)] == ["b-ml", "a-cv"]
    assert [r["name"] for r in visible(bob, rows, all_users=True)] == ["b-ml", "a-ml", "a-cv", "c-fin"]


# ------------------------------------------------------------------------- the server, end to end


def _spz(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def _ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    return r


def _refused(r: subprocess.CompletedProcess, text: str, code: int = 1) -> None:
    assert r.returncode == code and text in r.stderr and "Traceback" not in r.stderr, r.stdout + r.stderr


@pytest.fixture
def status_service(nats_server, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "skypurza.services.status.service", "--nats", nats_server.url,
                             "--stage", "test", "--db", str(tmp_path / "status.duckdb")],
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "status.log").open("wb"))
    yield proc
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


async def _seed(server) -> None:
    bus = await connect_bus(server)
    now = datetime.now(timezone.utc)
    try:
        for cluster, user, team in (("bob-ml", "bob", "ml"), ("bob-cv", "bob", "cv"), ("ann-cv", "ann", "cv")):
            await bus.publish(ClusterProvisioned(
                cluster=cluster, task_id=f"t-{cluster}", placement_id=f"p-{cluster}", candidate=cand(),
                nodes=[NodeInfo(rank=0, instance_id=f"i-{cluster}", private_ip="10.0.0.1")],
                hourly_price_micros=1_000_000, launched_at=now, user=user, team=team))
    finally:
        await bus.close()


def test_member_in_ml_viewer_in_cv_then_made_a_member_there_without_a_new_token(
        nats_server, tmp_path, status_service) -> None:
    env = {**os.environ, "SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": "test",
           "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_NO_PLUGINS": "1", "COLUMNS": "200"}
    for var in ("SKYPURZA_API_SERVER", "SKYPURZA_API_TOKEN", "SKYPILOT_API_SERVER_ENDPOINT"):
        env.pop(var, None)
    for team in ("ml", "cv", "fin"):
        _ok(_spz(env, "teams", "add", team))
    bob = json.loads(_ok(_spz(env, "users", "add", "bob", "--team", "ml", "-o", "json")).stdout)["token"]
    root = json.loads(_ok(_spz(env, "users", "add", "root", "--team", "ml", "--role", "admin", "-o",
                               "json")).stdout)["token"]
    # On the embedded bus: bob joins cv as a viewer; the CLI checks the role at the edge.
    _ok(_spz(env, "teams", "add-member", "cv", "bob", "--role", "viewer"))
    _refused(_spz(env, "teams", "add-member", "fin", "bob", "--role", "admin"), "admin is deployment-wide", 2)
    _refused(_spz(env, "teams", "set-role", "cv", "bob", "admin"), "admin is deployment-wide", 2)
    _refused(_spz(env, "teams", "set-role", "fin", "bob", "member"), "bob is not in team fin")
    _refused(_spz(env, "teams", "set-role", "ml", "root", "viewer"), "root is an admin, which is deployment-wide")
    listed = {u["user"]: u for u in json.loads(_ok(_spz(env, "users", "list", "-o", "json")).stdout)}
    assert (listed["bob"]["role"], listed["bob"]["roles"]) == ("member", {"ml": "member", "cv": "viewer"})
    assert "ml: member, cv: viewer" in _ok(_spz(env, "users", "list")).stdout
    asyncio.run(_seed(nats_server))

    api = Api(nats_server, tmp_path, env=env)
    try:
        as_bob = api.as_(bob)
        post = lambda ws: api.http.post("/api/v1/tasks", headers=as_bob,  # noqa: E731
                                        json={"task": "run: echo hi\n", "workspace": ws})
        ok = post("ml")
        assert (ok.status_code, ok.json()["team"]) == (202, "ml"), ok.text
        detail = problem(post("cv"), 403)["detail"]
        assert "bob is a viewer in team cv" in detail and "viewers read only" in detail, detail
        job = api.http.post("/api/v1/jobs", headers=as_bob, json={"task": "run: echo hi\n", "workspace": "cv"})
        assert "viewer in team cv" in problem(job, 403)["detail"]

        # He reads cv's clusters (a viewer there), and may not stop them, his own included.
        for name in ("ann-cv", "bob-cv"):
            got = api.http.get(f"/api/v1/clusters/{name}", headers=as_bob)
            assert got.status_code == 200 and got.json()["name"] == name, got.text
        stop = problem(api.http.post("/api/v1/clusters/bob-cv/stop", headers=as_bob), 403)["detail"]
        assert "viewer in team cv" in stop, stop
        assert api.http.post("/api/v1/clusters/bob-ml/stop", headers=as_bob).status_code == 202
        listing = api.http.get("/api/v1/clusters", headers=as_bob).json()["clusters"]
        assert sorted(c["name"] for c in listing) == ["ann-cv", "bob-cv", "bob-ml"]  # cv's all: a viewer there

        # The health route and `spz api info` name each team's role; `role` stays the primary's.
        caller = api.http.get("/api/v1/health", headers=as_bob).json()["caller"]
        assert (caller["role"], caller["roles"]) == ("member", {"ml": "member", "cv": "viewer"}), caller
        via_bob = {**env, "SKYPURZA_API_SERVER": api.url, "SKYPURZA_API_TOKEN": bob}
        info = _ok(_spz(via_bob, "api", "info")).stdout
        assert "role: member; cv: viewer (by token)" in info, info
        assert json.loads(_ok(_spz(via_bob, "api", "info", "-o", "json")).stdout)["roles"] == {
            "ml": "member", "cv": "viewer"}

        # An admin makes him a member of cv through the server: the same token submits there.
        via = {**env, "SKYPURZA_API_SERVER": api.url, "SKYPURZA_API_TOKEN": root}
        _refused(_spz(via_bob, "teams", "set-role", "cv", "bob", "member"), "managing users and teams is for admins")
        made = json.loads(_ok(_spz(via, "teams", "set-role", "cv", "bob", "member", "-o", "json")).stdout)
        assert made == {"team": "cv", "user": "bob", "role": "member", "roles": {"ml": "member", "cv": "member"}}
        now = post("cv")
        assert (now.status_code, now.json()["team"]) == (202, "cv"), now.text
        assert api.http.post("/api/v1/clusters/bob-cv/stop", headers=as_bob).status_code == 202
        assert problem(api.http.post("/api/v1/clusters/ann-cv/stop", headers=as_bob), 403)["detail"].startswith(
            "this is ann's")  # a member acts on their own only
        listed = {u["user"]: u for u in json.loads(_ok(_spz(via, "users", "list", "-o", "json")).stdout)}
        assert listed["bob"]["roles"] == {"ml": "member", "cv": "member"}
        # The route refuses what the CLI does: admin is no team's role, a team not his, no such user.
        patch = lambda team, user, role: api.http.patch(  # noqa: E731
            f"/api/v1/teams/{team}/members/{user}", headers=api.as_(root), json={"role": role})
        problem(patch("cv", "bob", "admin"), 422)
        assert "not in team fin" in problem(patch("fin", "bob", "viewer"), 409)["detail"]
        problem(patch("cv", "nobody", "viewer"), 404)
        problem(patch("cv", "a.b", "viewer"), 422)
        assert problem(api.http.patch("/api/v1/teams/cv/members/bob", headers=as_bob, json={"role": "viewer"}),
                       403)["detail"] == "managing users and teams is for admins"
        # Back to viewer over HTTP: refused again on his very next request.
        assert patch("cv", "bob", "viewer").json()["roles"] == {"ml": "member", "cv": "viewer"}
        problem(post("cv"), 403)
    finally:
        out = api.close()
    assert "Traceback" not in out and bob not in out and root not in out
