"""Managed jobs, the cost report and users/teams over HTTP, against real parts: a real control
plane on the `local` infra (nats-server, the status, recovery and ledger services, real node
agents: tests/support/local_cli.py) and the API server as a uvicorn process.

A member submits a managed job and sees it in /jobs; another member sees it only with
all_users and may not cancel it (403, with the reason); the owner streams its output over SSE,
cancels it, the stream ends naming CANCELLED, and a second cancel is a 409; an admin sees everyone's.
The cost report: an admin's has every line, a member's their own team's only. Users and teams are for admins (403 for a member,
with the reason); a new token is in the POST's answer once and works; a listing shows none.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from api_harness import Api
from api_harness import problem as _problem
from api_harness import sse_frames, team_of_four
from local_cli import local_cli

STAGE = "test"
TASK = "name: slow\nrun: |\n  echo managed-start\n  sleep 120\n"


def _wait(api: Api, token: str, job_id: int, statuses: set[str], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    rows: list = []
    while time.monotonic() < deadline:
        res = api.http.get("/api/v1/jobs", headers=api.as_(token))
        if res.status_code == 200:
            rows = [r for r in res.json()["jobs"] if r["job_id"] == job_id]
            if rows and rows[0]["status"] in statuses:
                return rows[0]
        time.sleep(0.5)
    raise AssertionError(f"managed job {job_id} not {statuses}: {rows}")


def test_managed_jobs_cost_report_and_identity_over_http(tmp_path: Path) -> None:
    with local_cli(tmp_path, STAGE) as env:
        alice, bob, vera, root = team_of_four(env)
        api = Api(SimpleNamespace(url=f"nats://127.0.0.1:{env['SKYPURZA_NATS_PORT']}"), tmp_path)
        try:
            # Users and teams: admins only; a new token is shown once, and works.
            body = _problem(api.http.get("/api/v1/users", headers=api.as_(alice)), 403)
            assert "admins" in body["detail"]
            _problem(api.http.post("/api/v1/teams", headers=api.as_(bob), json={"name": "cv"}), 403)
            assert api.http.post("/api/v1/teams", headers=api.as_(root), json={"name": "cv"}).status_code == 201
            _problem(api.http.post("/api/v1/teams", headers=api.as_(root), json={"name": "cv"}), 409)
            res = api.http.post("/api/v1/users", headers=api.as_(root), json={"name": "carol", "team": "cv"})
            assert res.status_code == 201, res.text
            carol = res.json()["token"]
            listed = api.http.get("/api/v1/users", headers=api.as_(root))
            assert listed.status_code == 200 and carol not in listed.text and "token" in listed.text
            rows = {u["name"]: u for u in listed.json()["users"]}
            assert {k: rows["carol"][k] for k in ("team", "teams", "role", "tokens")} == {
                "team": "cv", "teams": ["cv"], "role": "member", "tokens": 1}
            deadline = time.monotonic() + 20  # the server's directory follows the log
            while (api.http.get("/api/v1/health", headers=api.as_(carol)).json().get("caller") or {}).get("user") \
                    != "carol":
                assert time.monotonic() < deadline, "a new user's token was never accepted"
                time.sleep(0.2)
            _problem(api.http.delete("/api/v1/teams/cv", headers=api.as_(root)), 409)  # carol is in it
            res = api.http.post("/api/v1/users/carol/token", headers=api.as_(root))
            assert res.status_code == 201 and res.json()["token"] != carol
            assert api.http.delete("/api/v1/users/carol", headers=api.as_(root)).status_code == 200
            _problem(api.http.delete("/api/v1/users/carol", headers=api.as_(root)), 404)
            assert api.http.delete("/api/v1/teams/cv", headers=api.as_(root)).status_code == 200
            teams = api.http.get("/api/v1/teams", headers=api.as_(root)).json()["teams"]
            assert [t["name"] for t in teams] == ["ml"] and set(teams[0]["members"]) == {"alice", "bob", "root", "vera"}
            _problem(api.http.delete("/api/v1/users/a.b%3Ec", headers=api.as_(root)), 422)

            # A managed job: a viewer may not submit; a member does, stamped with themselves.
            _problem(api.http.post("/api/v1/jobs", headers=api.as_(vera), json={"task": TASK}), 403)
            body = _problem(api.http.post("/api/v1/jobs", headers=api.as_(alice),
                                          json={"task": TASK, "user": "bob"}), 422)
            assert "stamps" in body["detail"]
            res = api.http.post("/api/v1/jobs", headers=api.as_(alice),
                                json={"task": TASK, "overrides": {"infra": "local"}})
            assert res.status_code == 202, res.text
            job_id = res.json()["job_id"]
            assert res.json()["user"] == "alice" and res.json()["team"] == "ml"
            row = _wait(api, alice, job_id, {"RUNNING"})
            assert row["user"] == "alice" and row["team"] == "ml", row
            assert all(r["job_id"] != job_id for r in api.http.get("/api/v1/jobs", headers=api.as_(bob)).json()["jobs"])
            seen_by_bob = api.http.get("/api/v1/jobs", headers=api.as_(bob), params={"all_users": "true"}).json()
            assert any(r["job_id"] == job_id for r in seen_by_bob["jobs"])
            assert any(r["job_id"] == job_id for r in api.http.get("/api/v1/jobs", headers=api.as_(root)).json()["jobs"])

            body = _problem(api.http.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.as_(bob)), 403)
            assert "alice" in body["detail"] and "admins" in body["detail"]
            _problem(api.http.post("/api/v1/jobs/999/cancel", headers=api.as_(alice)), 404)
            _problem(api.http.get("/api/v1/jobs/999/logs", headers=api.as_(alice)), 404)
            other = api.http.post("/api/v1/users", headers=api.as_(root), json={"name": "olga", "team": "cv2"})
            assert other.status_code == 404, other.text  # no team cv2

            # The owner streams its output; cancelled meanwhile, the stream ends naming CANCELLED.
            frames: list = []
            with api.http.stream("GET", f"/api/v1/jobs/{job_id}/logs", headers=api.as_(alice)) as stream:
                assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
                for event, data in sse_frames(stream, time.monotonic() + 90):
                    frames.append((event, data))
                    if event == "line" and data["line"] == "managed-start":
                        res = api.http.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.as_(alice))
                        assert res.status_code == 202 and res.json()["requested"] == "cancel", res.text
            assert frames[0][0] == "launch" and frames[0][1]["cluster"] == row["cluster"], frames[:2]
            assert ("line", "managed-start") in [(e, d.get("line")) for e, d in frames], frames
            assert frames[-1][0] == "end" and frames[-1][1]["status"] == "CANCELLED", frames[-3:]
            _wait(api, alice, job_id, {"CANCELLED"})
            _problem(api.http.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.as_(alice)), 409)

            # The cost report: bounded parameters; a member sees their own team's line only.
            _problem(api.http.get("/api/v1/cost-report", headers=api.as_(alice), params={"since": "last week"}), 422)
            # A member's report by user, project or cluster: their own team's usage only (the ledger's cut).
            for by in ("user", "cluster", "project"):
                res = api.http.get("/api/v1/cost-report", headers=api.as_(alice), params={"by": by})
                assert res.status_code == 200 and res.json()["scope"] == "team ml" and res.json()["by"] == by, res.text
            res = api.http.get("/api/v1/cost-report", headers=api.as_(vera), params={"by": "user"})
            assert [x["key"] for x in res.json()["lines"] if x["kind"] == "usage"] == ["alice"], res.text
            # (without a ledger: a 503 that says so, tests/test_api_fuzz.py)
            res = api.http.get("/api/v1/cost-report", headers=api.as_(root), params={"by": "user"})
            assert res.status_code == 200 and res.json()["scope"] == "all" and res.json()["by"] == "user", res.text
            assert [(x["key"], x["rows"] >= 1) for x in res.json()["lines"] if x["kind"] == "usage"] == [("alice", True)]
            by_team = api.http.get("/api/v1/cost-report", headers=api.as_(root)).json()
            assert [x["key"] for x in by_team["lines"]] == ["ml"], by_team
            mine = api.http.get("/api/v1/cost-report", headers=api.as_(alice))
            assert mine.status_code == 200, mine.text
            assert mine.json()["scope"] == "team ml" and mine.json()["lines"] == by_team["lines"], mine.text

            # A pipeline, a job group and num_jobs, submitted as the CLI submits them; bounded.
            pipe = "name: pipe\n---\nname: one\nrun: echo one\n---\nname: two\nrun: echo two\n"
            group = ("name: grp\nexecution: parallel\n---\nname: a\nrun: sleep 120\n---\n"
                     "name: b\nrun: sleep 120\n")
            body = _problem(api.http.post("/api/v1/jobs", headers=api.as_(alice), json={"task": TASK, "num_jobs": 1001}),
                            422)
            assert "num_jobs" in str(body)
            body = _problem(api.http.post("/api/v1/jobs", headers=api.as_(alice), json={"task": group, "num_jobs": 2}),
                            422)
            assert "a job group's jobs are its tasks" in body["detail"]
            body = _problem(api.http.post("/api/v1/jobs", headers=api.as_(alice),
                                          json={"task": pipe, "overrides": {"infra": "local"}}), 422)
            assert "apply to one task" in body["detail"]
            made = {}
            for key, req in (("pipe", {"task": pipe}), ("group", {"task": group}),
                             ("ranks", {"task": TASK, "num_jobs": 2, "name": "ranks"})):
                res = api.http.post("/api/v1/jobs", headers=api.as_(alice), json=req)
                assert res.status_code == 202 and res.json()["user"] == "alice", res.text
                made[key] = res.json()["jobs"]
            assert [(j["name"], len(j["task_ids"])) for j in made["pipe"]] == [("pipe", 2)]
            root = made["group"][0]["id"]
            assert [(j["name"], j["job_group"], j["root_job_id"]) for j in made["group"]] == [
                ("grp/a", "grp", root), ("grp/b", "grp", root)]
            assert [(j["name"], j["job_rank"], j["num_jobs"]) for j in made["ranks"]] == [("ranks", 0, 2), ("ranks", 1, 2)]
            ids = [j["id"] for jobs in made.values() for j in jobs]
            assert len(set(ids)) == 5
            deadline = time.monotonic() + 30
            while True:
                rows = {r["job_id"]: r for r in api.http.get("/api/v1/jobs", headers=api.as_(alice)).json()["jobs"]}
                if set(ids) <= set(rows) or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            assert {(rows[i]["user"], rows[i]["team"]) for i in ids} == {("alice", "ml")}, rows
            for i in ids:
                assert api.http.post(f"/api/v1/jobs/{i}/cancel", headers=api.as_(alice)).status_code in (202, 409)
        finally:
            out = api.close()
        assert "Traceback" not in out, out[-3000:]


def test_a_members_cost_report_keeps_their_own_teams_line_and_sums_it_again() -> None:
    from skypurza.services.api.routes_jobs import _team_only

    line = {"kind": "usage", "cost_usd": "x", "billing_minutes": 1, "rows": 1, "for_period": None}
    report = {"by": "team", "lines": [{**line, "key": "ml", "cost_micros": 1_500_000, "billing_seconds": 60},
                                      {**line, "key": "cv", "cost_micros": 9_000_000, "billing_seconds": 600}],
              "total": {"cost_micros": 10_500_000}}
    mine = _team_only(report, "ml")
    assert [x["key"] for x in mine["lines"]] == ["ml"]
    assert mine["total"]["cost_micros"] == 1_500_000 and mine["total"]["cost_usd"] == "1.500000"
    assert mine["total"]["billing_seconds"] == 60
