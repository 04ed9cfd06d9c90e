"""Names with path or subject metacharacters on every name-taking route: a 422 problem, never a 5xx,
never a subject of another aggregate.

Against a real nats-server and the API server as a uvicorn process, as an admin (who may call
every route). The routes are read from the server's own OpenAPI document, so a new route with a
`{name}` or `{token_id}` is covered without editing this file. Each bad name is sent
percent-encoded in the path (and in the bodies that take names). A cluster's name may hold '.'
(SkyPilot's rule): `a.b` there is a name that does not exist (404), and its subject token is
escaped (events/naming.py `subject_token`), so it never reads or writes cluster `a`'s subjects.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from urllib.parse import quote

import pytest
from api_harness import Api, problem
from nats_fixtures import connect_bus

from skypurza.events import naming
from skypurza.events.cluster_events import ClusterProvisioned
from skypurza.events.types import NodeInfo

BAD = ["../x", "..", "a/b", "a*", ">", "a b", "é", "a\x00b", "x" * 300, "a.b", "A>B.c"]
BODIES = {("post", "/api/v1/clusters/{name}/jobs"): {"task": "run: echo\n"},
          ("post", "/api/v1/clusters/{name}/autostop"): {"idle_minutes": 5},
          ("post", "/api/v1/clusters/{name}/jobs/cancel"): {"all": True},
          ("patch", "/api/v1/teams/{name}"): {"labels": {}},
          ("post", "/api/v1/teams/{name}/members"): {"user": "root"}}


@pytest.fixture
def served(nats_server, tmp_path):
    env = {**os.environ, "SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": "test",
           "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_NO_PLUGINS": "1"}

    def spz(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, capture_output=True,
                              text=True, timeout=60)

    assert spz("teams", "add", "ml").returncode == 0
    r = spz("users", "add", "root", "--team", "ml", "--role", "admin", "-o", "json")
    assert r.returncode == 0, r.stderr
    api = Api(nats_server, tmp_path, env={**os.environ, "SKYPURZA_NO_PLUGINS": "1"})
    yield api, json.loads(r.stdout)["token"]
    assert "Traceback" not in api.close()


def _segment(name: str) -> str:
    """`name` as one path segment: percent-encoded ('.' too where it is all dots, which a client
    would otherwise resolve away before sending)."""
    quoted = quote(name, safe="")
    return quoted.replace(".", "%2E") if set(name) == {"."} else quoted


def _named_routes(api: Api) -> list[tuple[str, str]]:
    doc = api.http.get("/openapi.json").json()
    return sorted((m, p) for p, ops in doc["paths"].items() for m in ops
                  if "{name}" in p or "{token_id}" in p)


def test_every_name_taking_path_answers_a_bad_name_with_422(served) -> None:
    api, token = served
    routes = _named_routes(api)
    assert len(routes) >= 15, routes  # the clusters', the users', the teams' and the tokens' routes
    for method, template in routes:
        cluster_route = template.startswith("/api/v1/clusters/")
        for bad in BAD:
            path = template.replace("{job_id}", "1").replace("{kind}", "provision").replace("{rank}", "0")
            if "{token_id}" in path:  # the user is a good name here; the token id is the bad one
                path = path.replace("{name}", "root").replace("{token_id}", _segment(bad))
            else:
                path = path.replace("{name}", _segment(bad))
            res = api.http.request(method.upper(), path, headers=api.as_(token), json=BODIES.get((method, template)))
            assert res.status_code < 500, (method, path, res.text)
            if cluster_route and naming.valid_cluster_name(bad):
                body = problem(res, 404)  # a cluster's name may hold '.': a name, of no cluster
                assert "does not exist" in body["detail"] or "no " in body["detail"], (path, body)
                continue
            body = problem(res, 422)
            said = json.dumps([body["detail"], body["errors"]])  # (`instance` is the path, as RFC 9457 has it)
            assert body["errors"] and bad not in said, (method, path, body)  # the value is never echoed back


def test_names_in_bodies_are_422_and_a_dotted_cluster_never_touches_another_clusters_subjects(
        served, nats_server) -> None:
    api, token = served
    who = api.as_(token)
    for bad in BAD:
        if not naming.valid_cluster_name(bad):
            problem(api.http.post("/api/v1/tasks", headers=who, json={"task": "run: x\n", "cluster": bad}), 422)
        problem(api.http.post("/api/v1/users", headers=who, json={"name": bad, "team": "ml"}), 422)
        problem(api.http.post("/api/v1/users", headers=who, json={"name": "ok", "team": bad}), 422)
        problem(api.http.post("/api/v1/teams", headers=who, json={"name": bad}), 422)
        problem(api.http.post("/api/v1/tasks", headers=who, json={"task": "run: x\n", "workspace": bad}), 422)
        problem(api.http.post("/api/v1/jobs", headers=who, json={"task": "run: x\n", "workspace": bad}), 422)

    # Cluster `a` is up; `a.b` is another name whose subject token is escaped: it does not exist,
    # and acting on it publishes nothing on `a`'s subjects.
    async def seed() -> None:
        from ledger_history import cand

        bus = await connect_bus(nats_server)
        try:
            from datetime import datetime, timezone

            await bus.publish(ClusterProvisioned(
                cluster="a", task_id="t-a", placement_id="p-a", candidate=cand(), hourly_price_micros=1,
                nodes=[NodeInfo(rank=0, instance_id="i-a", private_ip="10.0.0.1")],
                launched_at=datetime.now(timezone.utc), user="root", team="ml"))
        finally:
            await bus.close()

    asyncio.run(seed())
    assert naming.event_subject("test", "cluster", "a.b", "x") != naming.event_subject("test", "cluster", "a", "x")
    assert ".a%2Eb." in naming.event_subject("test", "cluster", "a.b", "x")
    assert api.http.get("/api/v1/clusters/a/events", headers=who).status_code == 200
    problem(api.http.get("/api/v1/clusters/a.b/events", headers=who), 404)
    problem(api.http.post("/api/v1/clusters/a.b/down", headers=who), 404)

    async def on_a() -> list[str]:
        bus = await connect_bus(nats_server)
        try:
            return [s.subject async for s in bus.replay(
                filter_subject=naming.aggregate_subjects("test", "cluster", "a"))]
        finally:
            await bus.close()

    assert [s.rsplit(".", 1)[1] for s in asyncio.run(on_a())] == ["cluster_provisioned"]
