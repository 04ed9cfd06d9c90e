"""The API server's cluster, job and stream endpoints against real parts: a real control plane on
the `local` infra (nats-server, the status service, the provisioner, real node agents:
tests/support/local_cli.py), the API server as a uvicorn process, httpx as the client.

One member launches through POST /tasks (and a second cluster, which it purges), streams the job's output over SSE and sees its lines;
another member and a viewer are refused (403, with the reason) when they act on it, the viewer
reads it; the owner cancels it and the stream ends naming CANCELLED; an admin tears it down; the
events stream filtered by type shows the job's JobQueued to its owner and not to another member;
a caller's streams are bounded and a client that disconnects frees its slot.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import httpx
from local_cli import local_cli
from api_harness import Api, sse_frames, team_of_four
from api_harness import problem as _problem

STAGE = "test"  # the stage test_api_server.Api starts the server on
TASK = "run: |\n  for i in 1 2 3; do echo line-$i; sleep 0.3; done\n  sleep 120\n"


def _wait_job(api: Api, token: str, cluster: str, status: str, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    jobs: list = []
    while time.monotonic() < deadline:
        res = api.http.get(f"/api/v1/clusters/{cluster}/jobs", headers=api.as_(token))
        if res.status_code == 200:
            jobs = res.json()["jobs"]
            if any(j["job_id"] == 1 and j["status"] == status for j in jobs):
                return next(j for j in jobs if j["job_id"] == 1)
        time.sleep(0.5)
    raise AssertionError(f"job 1 of {cluster} not {status}: {jobs}")


def test_launch_stream_cancel_down_with_roles_and_the_events_stream(tmp_path: Path) -> None:
    with local_cli(tmp_path, STAGE) as env:
        alice, bob, vera, root = team_of_four(env)
        api = Api(SimpleNamespace(url=f"nats://127.0.0.1:{env['SKYPURZA_NATS_PORT']}"), tmp_path)
        try:
            res = api.http.post("/api/v1/tasks", headers=api.as_(alice),
                                json={"task": TASK, "cluster": "ar", "overrides": {"infra": "local"}})
            assert res.status_code == 202, res.text
            # A second cluster, to purge (spz down --purge's route) once it is up.
            res = api.http.post("/api/v1/tasks", headers=api.as_(alice),
                                json={"task": "run: sleep 300\n", "cluster": "pg", "overrides": {"infra": "local"}})
            assert res.status_code == 202, res.text
            _wait_job(api, alice, "ar", "RUNNING")

            # The owner streams the output and sees its lines.
            seen: list[str] = []
            with api.http.stream("GET", "/api/v1/clusters/ar/jobs/1/logs", headers=api.as_(alice),
                                 params={"follow": "true"}) as stream:
                assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
                for event, data in sse_frames(stream, time.monotonic() + 60):
                    if event == "line":
                        seen.append(data["line"])
                    if "line-3" in seen:
                        break
            assert seen[:3] == ["line-1", "line-2", "line-3"], seen

            # Another member and a viewer may not act on it; the viewer reads it.
            body = _problem(api.http.post("/api/v1/clusters/ar/jobs/1/cancel", headers=api.as_(bob)), 403)
            assert "alice" in body["detail"] and "admins" in body["detail"]
            body = _problem(api.http.post("/api/v1/clusters/ar/down", headers=api.as_(vera)), 403)
            assert "viewer" in body["detail"]
            got = api.http.get("/api/v1/clusters/ar", headers=api.as_(vera))
            assert got.status_code == 200 and got.json()["owner"] == {"user": "alice", "team": "ml"}, got.text
            _problem(api.http.get("/api/v1/clusters/ar/jobs/9/logs", headers=api.as_(alice)), 404)
            _problem(api.http.get("/api/v1/clusters/a.b>c/jobs", headers=api.as_(alice)), 422)

            # The owner cancels; a stream opened meanwhile ends naming the final status.
            with api.http.stream("GET", "/api/v1/clusters/ar/jobs/1/logs", headers=api.as_(alice),
                                 params={"tail": "1"}) as stream:
                res = api.http.post("/api/v1/clusters/ar/jobs/1/cancel", headers=api.as_(alice))
                assert res.status_code == 202 and res.json()["cancelled"] == [1], res.text
                frames = list(sse_frames(stream, time.monotonic() + 60))
            assert frames[0] == ("line", frames[0][1]) and frames[0][1]["line"] == "line-3", frames[:2]
            assert frames[-1][0] == "end" and frames[-1][1]["status"] == "CANCELLED", frames[-1]
            assert _wait_job(api, alice, "ar", "CANCELLED", 30)["status"] == "CANCELLED"

            # The events stream, filtered by type: the owner sees the job's JobQueued, bob does not.
            def queued(token: str, count: int = 1) -> list[dict]:
                out: list[dict] = []
                try:  # nothing for 4 s: nothing to see (the stream itself never ends)
                    with api.http.stream("GET", "/api/v1/events", headers=api.as_(token), timeout=httpx.Timeout(20, read=4),
                                         params={"type": "job_queued", "since": "0", "subject": "cluster/ar"}) as stream:
                        for event, data in sse_frames(stream, time.monotonic() + 4):
                            assert event == "job_queued"
                            out.append(data)
                            if len(out) == count:
                                break
                except httpx.ReadTimeout:
                    pass
                return out
            mine = queued(alice)
            assert mine and mine[0]["subject"] == "cluster/ar" and mine[0]["specversion"] == "1.0", mine
            assert queued(bob) == []

            # A task queued on the cluster (spz exec's route): the fit check, who may, the stamp.
            route, run = "/api/v1/clusters/ar/jobs", {"task": "run: echo x\n"}
            body = _problem(api.http.post(route, headers=api.as_(alice), json={**run, "overrides": {"gpus": "H100:8"}}),
                            409)
            assert "asks for H100:8 per node; cluster ar has no accelerators" in body["detail"], body
            assert "viewer" in _problem(api.http.post(route, headers=api.as_(vera), json=run), 403)["detail"]
            assert "alice's" in _problem(api.http.post(route, headers=api.as_(bob), json=run), 403)["detail"]
            body = _problem(api.http.post("/api/v1/clusters/nope/jobs", headers=api.as_(alice), json=run), 404)
            assert body["detail"] == "cluster nope does not exist; launch it with spz launch -c nope"
            _problem(api.http.post(route, headers=api.as_(alice), json={"task": "run: [\n"}), 422)
            body = _problem(api.http.post(route, headers=api.as_(alice), json={**run, "user": "bob"}), 422)
            assert "stamps" in body["detail"]
            res = api.http.post(route, headers=api.as_(alice), json={"task": {"run": "echo by-alice"}, "setup": "skip"})
            assert res.status_code == 202, res.text
            assert {k: res.json()[k] for k in ("job_id", "run_setup", "user", "team")} == {
                "job_id": 2, "run_setup": False, "user": "alice", "team": "ml"}
            second = queued(alice, 2)[-1]
            assert second["data"]["job_id"] == 2 and second["spzuser"] == "alice" and second["spzteam"] == "ml", second

            # A caller's streams are bounded; one that disconnects frees its slot.
            opened = []
            try:
                for _ in range(8):
                    s = api.http.stream("GET", "/api/v1/events", headers=api.as_(bob))
                    opened.append(s)
                    assert s.__enter__().status_code == 200
                _problem(api.http.get("/api/v1/events", headers=api.as_(bob)), 429)
                opened.pop().__exit__(None, None, None)
                deadline = time.monotonic() + 20
                while True:
                    with api.http.stream("GET", "/api/v1/events", headers=api.as_(bob)) as s:
                        if s.status_code == 200:
                            break
                    assert time.monotonic() < deadline, "a disconnected stream's slot was not freed"
                    time.sleep(0.5)
            finally:
                for s in opened:
                    s.__exit__(None, None, None)

            # Purging drops a cluster from the records (its agents exit): the owner's to do, once.
            _wait_job(api, alice, "pg", "RUNNING")
            assert "alice's" in _problem(api.http.post("/api/v1/clusters/pg/purge", headers=api.as_(bob)), 403)["detail"]
            res = api.http.post("/api/v1/clusters/pg/purge", headers=api.as_(alice))
            assert res.status_code == 202 and res.json()["requested"] == "purge", res.text
            assert api.http.get("/api/v1/clusters/pg", headers=api.as_(alice)).json()["status"] == "TERMINATED"
            assert "nothing to purge" in _problem(api.http.post("/api/v1/clusters/pg/purge", headers=api.as_(alice)),
                                                  409)["detail"]

            # An admin may act on anyone's cluster: the teardown is published, stamped, and done.
            res = api.http.post("/api/v1/clusters/ar/down", headers=api.as_(root))
            assert res.status_code == 202 and res.json()["goal"] == "TERMINATED", res.text
            deadline = time.monotonic() + 120
            while api.http.get("/api/v1/clusters/ar", headers=api.as_(root)).json()["status"] != "TERMINATED":
                assert time.monotonic() < deadline
                time.sleep(0.5)
            _problem(api.http.post("/api/v1/clusters/ar/stop", headers=api.as_(root)), 409)
        finally:
            out = api.close()
        assert "Traceback" not in out, out[-3000:]
