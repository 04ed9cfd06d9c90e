"""A user in several teams: the fold, the workspace a submission is stamped with, and billing by it.

- The fold (pure): UserJoinedTeam / UserLeftTeam give a user teams, the first their primary one;
  a log written before membership events existed (tests/fixtures/identity_v1.jsonl, frozen bytes
  of the code before them) folds to the very directory it folded to then.
- Against a real nats-server and the API server as a uvicorn process: `spz users add --team A
  --team B` and `spz teams add-member|remove-member` (on the embedded bus, then through the API
  server with an admin's token: a member's is refused there, which the bus would not do);
  `-w/--workspace` picks a team of the caller's (403 naming their teams when not theirs), none
  picks the primary; the stamp is what the ledger bills (the real ledger service on a real DuckDB
  file): one user's two clusters in two teams are each team's line of the cost report.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from api_harness import Api, problem
from ledger_history import cand
from nats_fixtures import connect_bus

from skypurza.events.envelope import decode
from skypurza.events.identity_events import TeamAdded, TokenIssued, UserAdded, UserJoinedTeam, UserLeftTeam
from skypurza.events.models import ClusterProvisioned, ClusterTerminated, PlacementChosen, TaskSubmitted
from skypurza.events.principal import stamped_principal
from skypurza.events.types import NodeInfo
from skypurza.services.api import workspaces
from skypurza.services.api.identity import Directory, Principal, authenticate, authorize, issue_token, visible
from skypurza.services.api.problems import Problem

FIXTURES = Path(__file__).parent / "fixtures"


# ------------------------------------------------------------------------------------------ the fold


def test_a_log_written_before_membership_events_folds_to_the_same_directory() -> None:
    lines = [line for line in (FIXTURES / "identity_v1.jsonl").read_bytes().splitlines() if line.strip()]
    d = Directory.of((i + 1, decode(line).event) for i, line in enumerate(lines))
    # What the code before UserJoinedTeam folded these bytes to (re-adding alice moved her to cv).
    assert {u.name: (u.team, u.role, sorted(u.tokens)) for u in d.users.values()} == {
        "alice": ("cv", "admin", ["0123456789abcdef"]), "bob": ("cv", "viewer", ["2222222222222222"])}
    assert {t.name: (t.allowed_infras, t.labels) for t in d.teams.values()} == {
        "ml": (("aws",), (("cost-center", "ml"),)), "cv": (("local",), (("tier", "gold"),))}
    assert d.token_owner == {"0123456789abcdef": "alice", "2222222222222222": "bob"}
    assert d.subject_seq == {("team", "ml"): 1, ("team", "cv"): 11, ("user", "alice"): 8, ("user", "bob"): 12,
                             ("user", "carol"): 10}
    assert d.applied == {"team": 11, "user": 12}
    assert (d.members("ml"), d.members("cv")) == ([], ["alice", "bob"])
    # ... and each user is in exactly their one team.
    assert {u.name: u.teams for u in d.users.values()} == {"alice": ("cv",), "bob": ("cv",)}


def _directory() -> tuple[Directory, str]:
    token = issue_token()
    d = Directory.of(enumerate([
        TeamAdded(team="ml"), TeamAdded(team="cv", labels={"tier": "gold"}), TeamAdded(team="fin"),
        UserAdded(user="alice", team="ml", role="member"),
        TokenIssued(user="alice", token_id=token.token_id, token_sha256=token.sha256),
        UserJoinedTeam(user="alice", team="cv"), UserJoinedTeam(user="alice", team="cv"),  # twice: once
        UserJoinedTeam(user="ghost", team="cv"),  # no such user: nothing
        UserAdded(user="vera", team="ml", role="viewer"), UserJoinedTeam(user="vera", team="cv"),
    ], start=1))
    return d, token.token


def test_joining_leaving_and_the_primary_team() -> None:
    d, _ = _directory()
    assert d.users["alice"].teams == ("ml", "cv") and d.users["alice"].team == "ml"
    assert "ghost" not in d.users and d.members("cv") == ["alice", "vera"]
    d.apply(UserJoinedTeam(user="alice", team="cv", primary=True), 20)
    assert (d.users["alice"].team, d.users["alice"].teams) == ("cv", ("cv", "ml"))
    d.apply(UserLeftTeam(user="alice", team="cv"), 21)
    assert (d.users["alice"].team, d.users["alice"].teams) == ("ml", ("ml",))
    d.apply(UserLeftTeam(user="alice", team="ml"), 22)  # the last team: a user is always in one
    assert d.users["alice"].teams == ("ml",) and d.seq_of("user", "alice") == 22
    # Added again: the team given, and only it (as before membership events).
    d.apply(UserJoinedTeam(user="alice", team="fin"), 23)
    d.apply(UserAdded(user="alice", team="cv", role="member"), 24)
    assert d.users["alice"].teams == ("cv",)


def test_the_workspace_stamped_is_a_team_of_the_callers_or_their_primary() -> None:
    d, token = _directory()
    alice = authenticate(d, token)
    assert alice is not None and (alice.team, alice.teams) == ("ml", ("ml", "cv"))
    assert workspaces.resolve(alice, None, d) == (alice, {})
    stamped, labels = workspaces.resolve(alice, "cv", d)
    assert (stamped.user, stamped.team, stamped.teams, labels) == ("alice", "cv", ("ml", "cv"), {"tier": "gold"})
    with pytest.raises(Problem) as refused:
        workspaces.resolve(alice, "fin", d)
    assert refused.value.status == 403
    assert refused.value.detail.startswith("alice is not in team fin; their teams: ml, cv"), refused.value.detail
    root = Principal("root", "ml", "admin")
    assert workspaces.resolve(root, "fin", d)[0].team == "fin"  # an admin submits into any workspace
    # A job on an existing cluster joins the cluster's team when the caller is in it.
    assert workspaces.for_cluster(alice, "cv").team == "cv"
    assert workspaces.for_cluster(alice, "fin").team == "ml" and workspaces.for_cluster(root, "fin").team == "fin"


def test_reads_by_team_cover_every_team_of_the_callers() -> None:
    d, _ = _directory()
    vera = Principal("vera", "ml", "viewer", teams=d.users["vera"].teams)
    assert authorize(vera, "read", "alice", "cv").allowed and authorize(vera, "logs", "alice", "cv").allowed
    no = authorize(vera, "read", "carl", "fin")
    assert not no.allowed and "viewers read their own team's (ml, cv) only" in no.reason
    rows = [{"name": "a", "user": "alice", "team": "cv"}, {"name": "b", "user": "carl", "team": "fin"}]
    assert [r["name"] for r in visible(vera, rows, all_users=False)] == ["a"]
    alice = Principal("alice", "ml", "member", teams=("ml", "cv"))
    assert authorize(alice, "logs", "bob", "cv").allowed and not authorize(alice, "logs", "carl", "fin").allowed
    assert not authorize(Principal("alice", "ml", "member"), "logs", "bob", "cv").allowed  # in ml only


# --------------------------------------------------------------------- the CLI, the server, the ledger


def _spz(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def _ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    return r


def _refused(r: subprocess.CompletedProcess, text: str) -> None:
    assert r.returncode == 1 and text in r.stderr and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


async def _provision_and_bill(server, db: Path, clusters: dict[str, str], meanwhile) -> tuple[dict, dict, object]:
    """Each (cluster, task id) up for one hour of a g5.xlarge; the ledger's report by team and by
    user, and what `meanwhile()` answers while the ledger runs (the API server's reports)."""
    from skypurza.events import ledger_queries as lq
    from skypurza.services.ledger.ledgerconfig import LedgerConfig
    from skypurza.services.ledger.service import LedgerService

    bus = await connect_bus(server)
    svc = LedgerService(db, tick_s=3600, config=LedgerConfig())
    try:
        launched = datetime(2026, 11, 2, 9, tzinfo=UTC)
        for i, (cluster, task_id) in enumerate(sorted(clusters.items())):
            c = cand()
            pc = bus.envelope(PlacementChosen(task_id=task_id, cluster=cluster, attempt=1, candidate=c, num_nodes=1))
            await bus.publish(pc)
            await bus.publish(ClusterProvisioned(
                cluster=cluster, task_id=task_id, placement_id=pc.id, candidate=c,
                nodes=[NodeInfo(rank=0, instance_id=f"i-{i}", private_ip=f"10.0.0.{i + 1}", zone="us-east-1a")],
                hourly_price_micros=c.hourly_price_micros, launched_at=launched))
            await bus.publish(ClusterTerminated(cluster=cluster, terminated_at=launched + timedelta(hours=1),
                                                       reason="user", instance_ids=[f"i-{i}"]))
        await svc.start(bus)
        assert await svc.wait_written(await bus.last_seq())
        deadline = asyncio.get_running_loop().time() + 30
        while len((by_team := await lq.cost_report(bus, by="team"))["lines"]) < len(clusters):
            assert asyncio.get_running_loop().time() < deadline, f"the meter never billed both runs: {by_team}"
            await asyncio.sleep(0.2)
        return by_team, await lq.cost_report(bus, by="user"), await asyncio.to_thread(meanwhile)
    finally:
        await svc.close()
        await bus.close()


def _usage(report: dict) -> dict[str, int]:
    return {x["key"]: x["cost_micros"] for x in report["lines"] if x["kind"] == "usage"}


def test_a_user_in_two_teams_submits_into_each_and_each_team_is_billed(nats_server, tmp_path) -> None:
    env = {**os.environ, "SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": "test",
           "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_NO_PLUGINS": "1", "COLUMNS": "200"}
    for var in ("SKYPURZA_API_SERVER", "SKYPURZA_API_TOKEN", "SKYPILOT_API_SERVER_ENDPOINT"):
        env.pop(var, None)
    for team in ("ml", "cv", "fin"):
        _ok(_spz(env, "teams", "add", team))
    made = json.loads(_ok(_spz(env, "users", "add", "alice", "--team", "ml", "--team", "cv", "-o", "json")).stdout)
    assert (made["team"], made["teams"]) == ("ml", ["ml", "cv"])
    alice = made["token"]
    root = json.loads(_ok(_spz(env, "users", "add", "root", "--team", "ml", "--role", "admin", "-o", "json")).stdout)
    _refused(_spz(env, "users", "add", "bob", "--team", "ml", "--team", "nope"), "no team nope")
    _refused(_spz(env, "teams", "remove-member", "fin", "alice"), "alice is not in team fin (teams: ml, cv)")
    assert _spz(env, "users", "add", "bob", "--team", "a.b").returncode == 2
    listed = json.loads(_ok(_spz(env, "users", "list", "-o", "json")).stdout)
    assert [(u["user"], u["team"], u["teams"]) for u in listed] == [("alice", "ml", ["ml", "cv"]),
                                                                   ("root", "ml", ["ml"])]
    assert "ml, cv" in _ok(_spz(env, "users", "list")).stdout
    teams = {t["team"]: t["users"] for t in json.loads(_ok(_spz(env, "teams", "list", "-o", "json")).stdout)}
    assert teams == {"cv": ["alice"], "fin": [], "ml": ["alice", "root"]}
    _refused(_spz(env, "teams", "remove", "cv"), "team cv still has 1 user(s): alice")

    api = Api(nats_server, tmp_path, env=env)
    try:
        task = "run: echo hi\n"
        post = lambda body: api.http.post("/api/v1/tasks", headers=api.as_(alice), json={"task": task, **body})  # noqa: E731
        primary, chosen = post({"cluster": "c-ml"}), post({"cluster": "c-cv", "workspace": "cv"})
        assert (primary.status_code, primary.json()["team"]) == (202, "ml"), primary.text
        assert (chosen.status_code, chosen.json()["team"]) == (202, "cv"), chosen.text
        body = problem(post({"workspace": "fin"}), 403)
        assert body["detail"].startswith("alice is not in team fin; their teams: ml, cv"), body
        problem(api.http.post("/api/v1/jobs", headers=api.as_(alice), json={"task": task, "workspace": "fin"}), 403)

        # The same commands through the API server: an admin's token changes the directory there ...
        via = {**env, "SKYPURZA_API_SERVER": api.url, "SKYPURZA_API_TOKEN": root["token"]}
        joined = json.loads(_ok(_spz(via, "teams", "add-member", "fin", "alice", "--primary", "-o", "json")).stdout)
        assert joined == {"team": "fin", "user": "alice", "teams": ["fin", "ml", "cv"], "primary": "fin"}
        now_fin = post({"cluster": "c-fin"})
        assert (now_fin.status_code, now_fin.json()["team"]) == (202, "fin"), now_fin.text  # the new primary
        # The health route and `spz api info` name every team of the caller's, the primary first.
        caller = api.http.get("/api/v1/health", headers=api.as_(alice)).json()["caller"]
        assert (caller["team"], caller["teams"]) == ("fin", ["fin", "ml", "cv"]), caller
        info = _ok(_spz({**via, "SKYPURZA_API_TOKEN": alice}, "api", "info"))
        assert "team: fin (also in: ml, cv)" in info.stdout, info.stdout
        info = json.loads(_ok(_spz({**via, "SKYPURZA_API_TOKEN": alice}, "api", "info", "-o", "json")).stdout)
        assert (info["team"], info["teams"]) == ("fin", ["fin", "ml", "cv"]), info
        left = _ok(_spz(via, "teams", "remove-member", "cv", "alice")).stdout
        assert "alice's teams: fin, ml (primary: fin)" in left, left
        assert problem(post({"workspace": "cv"}), 403)["detail"].startswith("alice is not in team cv; their teams: "
                                                                            "fin, ml")
        listed = json.loads(_ok(_spz(via, "users", "list", "-o", "json")).stdout)
        assert [(u["user"], u["teams"], len(u["tokens"])) for u in listed] == [("alice", ["fin", "ml"], 1),
                                                                              ("root", ["ml"], 1)]
        via_teams = {t["team"]: t["users"] for t in json.loads(_ok(_spz(via, "teams", "list", "-o", "json")).stdout)}
        assert via_teams == {"cv": [], "fin": ["alice"], "ml": ["alice", "root"]}
        _refused(_spz(via, "teams", "add-member", "fin", "alice"), "alice is already in team fin")
        _refused(_spz(via, "teams", "add-member", "nope", "alice"), "no team nope")
        _ok(_spz(via, "teams", "remove-member", "fin", "alice"))
        _refused(_spz(via, "teams", "remove-member", "ml", "alice"), "team ml is alice's only team")
        # ... and a member's token is refused there (on the embedded bus the OS user is the admin).
        as_alice = {**via, "SKYPURZA_API_TOKEN": alice}
        _refused(_spz(as_alice, "teams", "add-member", "cv", "alice"), "not allowed: managing users and teams is for "
                                                                        "admins")
        problem(api.http.post("/api/v1/teams/cv/members", headers=api.as_(root["token"]),
                              json={"user": "alice", "role": "admin"}), 422)  # no such field
        problem(api.http.delete("/api/v1/teams/cv/members/a.b", headers=api.as_(root["token"])), 422)

        # The stamp is what the ledger bills: alice's clusters are each team's line.
        subs = asyncio.run(_submitted(nats_server))
        assert [stamped_principal(s.envelope) for s in subs] == [("alice", "ml"), ("alice", "cv"), ("alice", "fin")]
        def reports() -> tuple:
            report = api.http.get("/api/v1/cost-report", headers=api.as_(root["token"]))
            cv = api.http.get("/api/v1/cost-report", headers=api.as_(root["token"]), params={"workspace": "cv"})
            mine = api.http.get("/api/v1/cost-report", headers=api.as_(alice))
            theirs = api.http.get("/api/v1/cost-report", headers=api.as_(alice), params={"workspace": "cv"})
            # `spz cost-report -w cv` both ways: the bus's (the OS user: every team's to read) and the server's.
            plugins = {k: v for k, v in env.items() if k != "SKYPURZA_NO_PLUGINS"}
            clis = [_spz({**plugins, **extra}, "cost-report", "-w", "cv", "-o", "json") for extra in (
                {}, {"SKYPURZA_API_SERVER": api.url, "SKYPURZA_API_TOKEN": root["token"]},
                {"SKYPURZA_API_SERVER": api.url, "SKYPURZA_API_TOKEN": alice})]
            return report, cv, mine, theirs, clis

        by_team, by_user, (report, cv, mine, theirs, clis) = asyncio.run(_provision_and_bill(
            nats_server, tmp_path / "ledger.duckdb", {"c-ml": primary.json()["task_id"],
                                                      "c-cv": chosen.json()["task_id"]}, reports))
        assert _usage(by_team) == {"ml": 1_006_000, "cv": 1_006_000}, by_team  # an hour of g5.xlarge each
        assert _usage(by_user) == {"alice": 2_012_000}, by_user
        # Through the server: the admin's report has both (or one team's, -w); alice's is one team of
        # hers at a time (she has left cv since).
        assert report.json()["scope"] == "all" and _usage(report.json()) == {"ml": 1_006_000, "cv": 1_006_000}
        assert (cv.json()["scope"], _usage(cv.json())) == ("team cv", {"cv": 1_006_000}), cv.text
        assert (mine.json()["scope"], _usage(mine.json())) == ("team ml", {"ml": 1_006_000}), mine.text
        assert problem(theirs, 403)["detail"].startswith("alice is not in team cv; their teams: ml")
        on_bus, via_root, via_alice = clis
        for r in (on_bus, via_root):
            assert _usage(json.loads(_ok(r).stdout)) == {"cv": 1_006_000}, r.stdout + r.stderr
        assert "Team cv only." in on_bus.stderr and "team cv only" in via_root.stderr
        assert json.loads(on_bus.stdout).keys() == json.loads(via_root.stdout).keys()  # printed the same
        assert via_alice.returncode == 1 and "alice is not in team cv" in via_alice.stderr, via_alice.stderr
        assert "Traceback" not in via_alice.stderr
    finally:
        out = api.close()
    assert "Traceback" not in out and alice not in out


async def _submitted(server) -> list:
    bus = await connect_bus(server)
    try:
        return [s async for s in bus.replay() if isinstance(s.event, TaskSubmitted)]
    finally:
        await bus.close()
