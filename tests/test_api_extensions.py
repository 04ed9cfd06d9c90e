"""The API server's extension points through real entry points: an authenticator plug-in and an
admission policy, in a tiny package installed as a dist-info in a temporary folder on the API
server's PYTHONPATH (importlib.metadata finds it as it finds any installed distribution).

Against a real nats-server and the API server as a uvicorn process: the plug-in maps a header
to a user of the directory (their team and role, stamped as a token's would be); it can refuse
with a reason (401); a broken one grants nothing; a plug-in that does not load is left out. The
policy mutates an admitted task (a label, an env: what is published), refuses with its reason
as 403 or 422, and a policy that fails refuses the submission (a 500 naming it, no traceback);
nothing refused is published. Tokens keep working beside the plug-in.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from api_harness import Api, problem
from nats_fixtures import connect_bus

from skypurza.events.principal import stamped_principal
from skypurza.services.api.extensions import AdmissionRefused, AdmissionRequest, Plugin, admit

PLUGIN = '''
from skypurza.services.api.extensions import AdmissionRefused, AuthRefused


def header_auth(credentials, directory):
    who = credentials.headers.get("x-test-user")
    if who is None:
        return None
    if who == "mallory":
        raise AuthRefused("mallory is refused by the header plug-in")
    if who == "boom":
        raise RuntimeError("a bug in the plug-in")
    return who


async def policy(request):
    task = dict(request.task)
    if "forbidden" in (task.get("run") or ""):
        raise AdmissionRefused(f"{request.user}: tasks may not run 'forbidden' (policy no-forbidden)", 403)
    if task.get("name") == "bad":
        raise AdmissionRefused("the task name 'bad' is reserved", 422)
    if task.get("name") == "crash":
        raise ValueError("a bug in the policy")
    resources = dict(task.get("resources") or {})
    resources["labels"] = {**(resources.get("labels") or {}), "admitted-by": "policy", "kind": request.kind}
    task["resources"] = resources
    task["envs"] = {**(task.get("envs") or {}), "ADMITTED": request.team}
    return task
'''

ENTRY_POINTS = """\
[skypurza.authenticators]
header = spz_test_plugins:header_auth
missing = spz_test_plugins:not_there

[skypurza.admission_policies]
policy = spz_test_plugins:policy
"""


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    dist = site / "spz_test_plugins-0.1.dist-info"
    dist.mkdir(parents=True)
    (site / "spz_test_plugins.py").write_text(textwrap.dedent(PLUGIN))
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: spz-test-plugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    return site


def _spz(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def _submitted(server) -> list:
    async def main() -> list:
        bus = await connect_bus(server)
        try:
            return [s async for s in bus.replay() if s.event is not None and s.event.EVENT_NAME in (
                "task_submitted", "managed_job_submitted")]
        finally:
            await bus.close()

    return asyncio.run(main())


@pytest.fixture
def plugged(nats_server, tmp_path):
    env = {**os.environ, "SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": "test",
           "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_NO_PLUGINS": "1"}
    assert _spz(env, "teams", "add", "ml").returncode == 0
    r = _spz(env, "users", "add", "alice", "--team", "ml", "--role", "member", "-o", "json")
    assert r.returncode == 0, r.stderr
    token = json.loads(r.stdout)["token"]
    server_env = {k: v for k, v in os.environ.items() if k != "SKYPURZA_NO_PLUGINS"}
    server_env["PYTHONPATH"] = os.pathsep.join([str(_site(tmp_path)), server_env.get("PYTHONPATH", "")])
    api = Api(nats_server, tmp_path, env=server_env)
    yield api, token
    api.close()


TASK = "name: train\nrun: echo hi\nresources:\n  labels:\n    project: llm\n"


def test_an_authenticator_plug_in_maps_a_header_to_a_user_and_refuses_with_its_reason(plugged, nats_server) -> None:
    api, token = plugged
    res = api.http.post("/api/v1/tasks", headers={"X-Test-User": "alice"}, json={"task": TASK, "cluster": "c1"})
    assert res.status_code == 202, res.text
    assert (res.json()["user"], res.json()["team"]) == ("alice", "ml")

    refused = problem(api.http.post("/api/v1/tasks", headers={"X-Test-User": "mallory"}, json={"task": TASK}), 401)
    assert refused["detail"] == "mallory is refused by the header plug-in"
    unknown = problem(api.http.post("/api/v1/tasks", headers={"X-Test-User": "zed"}, json={"task": TASK}), 401)
    assert "user 'zed' is not known here" in unknown["detail"]
    problem(api.http.post("/api/v1/tasks", headers={"X-Test-User": "boom"}, json={"task": TASK}), 401)
    problem(api.http.post("/api/v1/tasks", json={"task": TASK}), 401)  # no credentials at all
    problem(api.http.post("/api/v1/tasks", headers={"Authorization": "Basic eA=="}, json={"task": TASK}), 401)
    # The built-in tokens still work beside the plug-in.
    res = api.http.post("/api/v1/tasks", headers=api.as_(token), json={"task": TASK, "cluster": "c2"})
    assert res.status_code == 202, res.text
    # Health names a plug-in's caller as it names a token's, and which plug-in knew them.
    caller = api.http.get("/api/v1/health", headers={"X-Test-User": "alice"}).json()["caller"]
    assert caller == {"user": "alice", "team": "ml", "teams": ["ml"], "role": "member", "roles": {"ml": "member"},
                      "authenticator": "header"}, caller
    assert api.http.get("/api/v1/health", headers={"X-Test-User": "mallory"}).json()["caller"] is None
    assert api.http.get("/api/v1/health", headers=api.as_(token)).json()["caller"]["user"] == "alice"
    assert "caller" not in api.http.get("/api/v1/health").json()  # no credentials: a plain liveness probe

    subs = _submitted(nats_server)
    assert [stamped_principal(s.envelope) for s in subs] == [("alice", "ml"), ("alice", "ml")]
    out = api.close()
    assert "authenticator header failed: RuntimeError" in out and "missing failed to load" in out, out[-3000:]
    assert "Traceback" not in out and token not in out


def test_an_admission_policy_mutates_or_refuses_before_anything_is_published(plugged, nats_server) -> None:
    api, token = plugged
    who = api.as_(token)
    res = api.http.post("/api/v1/tasks", headers=who, json={"task": TASK, "cluster": "c1"})
    assert res.status_code == 202, res.text
    denied = problem(api.http.post("/api/v1/tasks", headers=who, json={"task": "run: echo forbidden\n"}), 403)
    assert denied["detail"] == "alice: tasks may not run 'forbidden' (policy no-forbidden)"
    assert denied["type"].endswith("/admission-refused")
    bad = problem(api.http.post("/api/v1/tasks", headers=who, json={"task": "name: bad\nrun: x\n"}), 422)
    assert bad["detail"] == "the task name 'bad' is reserved"
    crash = problem(api.http.post("/api/v1/tasks", headers=who, json={"task": "name: crash\nrun: x\n"}), 500)
    assert "admission policy policy failed" in crash["detail"] and "Traceback" not in crash["detail"]
    problem(api.http.post("/api/v1/jobs", headers=who, json={"task": "run: echo forbidden\n"}), 403)
    job = api.http.post("/api/v1/jobs", headers=who, json={"task": TASK})
    assert job.status_code == 202, job.text

    subs = _submitted(nats_server)
    assert [s.event.EVENT_NAME for s in subs] == ["task_submitted", "managed_job_submitted"]
    task = subs[0].event.task
    assert task.labels() == {"project": "llm", "admitted-by": "policy", "kind": "task"}
    assert task.envs == {"ADMITTED": "ml"} and subs[0].event.project == "llm"
    managed = subs[1].event.tasks[0]
    assert managed.labels()["kind"] == "managed_job"
    out = api.close()
    assert "admission policy policy failed: ValueError" in out and "Traceback" not in out, out[-3000:]


def test_policies_chain_in_order_and_unchanged_is_none() -> None:
    req = AdmissionRequest("task", "alice", "ml", "member", {"run": "x"})

    def add(key):
        return lambda r: {**r.task, "envs": {**(r.task.get("envs") or {}), key: "1"}}

    assert asyncio.run(admit([Plugin("a", lambda r: None)], req)) is None
    assert asyncio.run(admit([Plugin("a", add("A")), Plugin("b", add("B"))], req)) == {
        "run": "x", "envs": {"A": "1", "B": "1"}}

    def refuse(r):
        raise AdmissionRefused("no", 418)

    with pytest.raises(AdmissionRefused) as info:
        asyncio.run(admit([Plugin("a", add("A")), Plugin("r", refuse)], req))
    assert info.value.status == 403  # only 403 or 422


async def _cluster_up(server, name: str, user: str, team: str) -> None:
    """A cluster `user` of `team` launched through an API server, up (one node)."""
    from ledger_history import cand

    from skypurza.events.models import ClusterProvisioned, PlacementChosen, TaskSubmitted
    from skypurza.events.principal import stamp
    from skypurza.events.types import NodeInfo

    bus = await connect_bus(server)
    try:
        task_id = f"t-{name}"
        await bus.publish(stamp(bus.envelope(TaskSubmitted(task_id=task_id, cluster=name, task={"run": "x"},
                                                           user=user, team=team)), user, team))
        c = cand()
        pc = bus.envelope(PlacementChosen(task_id=task_id, cluster=name, attempt=1, candidate=c, num_nodes=1))
        await bus.publish(pc)
        await bus.publish(ClusterProvisioned(cluster=name, task_id=task_id, placement_id=pc.id, candidate=c,
                                             nodes=[NodeInfo(rank=0, instance_id="i-0", private_ip="10.0.0.1",
                                                             zone="us-east-1a")],
                                             hourly_price_micros=c.hourly_price_micros, launched_at=pc.time))
    finally:
        await bus.close()


def _queued(server) -> list:
    async def main() -> list:
        bus = await connect_bus(server)
        try:
            return [s async for s in bus.replay() if s.event is not None and s.event.EVENT_NAME == "job_queued"]
        finally:
            await bus.close()

    return asyncio.run(main())


def test_the_admission_policy_sees_a_task_queued_on_a_cluster_and_may_refuse_or_change_it(plugged,
                                                                                          nats_server) -> None:
    api, token = plugged
    asyncio.run(_cluster_up(nats_server, "ex1", "alice", "ml"))
    who = api.as_(token)
    res = api.http.post("/api/v1/clusters/ex1/jobs", headers=who, json={"task": TASK, "setup": "skip"})
    assert res.status_code == 202, res.text
    assert (res.json()["job_id"], res.json()["team"]) == (1, "ml")
    denied = problem(api.http.post("/api/v1/clusters/ex1/jobs", headers=who, json={"task": "run: echo forbidden\n"}),
                     403)
    assert denied["detail"] == "alice: tasks may not run 'forbidden' (policy no-forbidden)"
    assert denied["type"].endswith("/admission-refused")
    bad = problem(api.http.post("/api/v1/clusters/ex1/jobs", headers=who, json={"task": "name: bad\nrun: x\n"}), 422)
    assert bad["detail"] == "the task name 'bad' is reserved"
    crash = problem(api.http.post("/api/v1/clusters/ex1/jobs", headers=who, json={"task": "name: crash\nrun: x\n"}),
                    500)
    assert "admission policy policy failed" in crash["detail"]
    # Through the CLI too: `spz exec` over the server says the policy's reason in one line.
    env = {k: v for k, v in os.environ.items() if k not in ("SKYPURZA_NATS_URL",)}
    env.update({"SKYPURZA_API_SERVER": api.url, "SKYPURZA_API_TOKEN": token, "SKYPURZA_STAGE": "test",
                "SKYPURZA_HOME": str(Path(api.log).parent / "home"), "SKYPURZA_NO_PLUGINS": "1"})
    r = _spz(env, "exec", "ex1", "echo forbidden")
    assert r.returncode == 1 and "tasks may not run 'forbidden'" in r.stderr and "Traceback" not in r.stderr, r.stderr

    queued = _queued(nats_server)
    assert [q.event.job_id for q in queued] == [1]  # nothing refused was published
    task = queued[0].event.task
    assert task.labels() == {"project": "llm", "admitted-by": "policy", "kind": "cluster_job"}
    assert task.envs == {"ADMITTED": "ml"} and stamped_principal(queued[0].envelope) == ("alice", "ml")
    out = api.close()
    assert "Traceback" not in out, out[-3000:]
