"""A team's workspace (allowed infras) confines where its tasks are placed.

Pure: the fold of the team events (`workspace.TeamInfras`), the narrowing of a World and of a
plan (`decide.first_placement` / `after_capacity_error` with a team's entries) on the real catalog.
Through the real bus: the optimizer service folds TeamAdded / TeamUpdated from the log and places a
submission stamped by the API server with the stamped team's infras, whatever team the event's
own fields claim; a task asking for an infra the team may not use fails with a reason naming the
team, its infras and how to change them.
"""

from __future__ import annotations

import asyncio

from nats_fixtures import connect_bus

from skypurza.events import naming
from skypurza.events.identity_events import TeamAdded, TeamRemoved, TeamUpdated
from skypurza.events.models import CapacityError, PlacementChosen, PlacementFailed, TaskSubmitted
from skypurza.events.principal import stamp
from skypurza.events.service import ServiceRunner
from skypurza.services.optimizer import decide, workspace
from skypurza.services.optimizer.catalog import load_catalog
from skypurza.services.optimizer.local import LocalResources
from skypurza.services.optimizer.service import OptimizerService

CPU = {"run": "true", "resources": {"cpus": "2"}}
SPOT_V100 = {"resources": {"accelerators": "V100:1", "use_spot": True}, "run": "nvidia-smi"}


async def wait_for(bus, cls, task_id: str, count: int, timeout: float = 15.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = [s.event async for s in bus.replay(filter_subject=naming.aggregate_subjects("test", "task", task_id))
               if isinstance(s.event, cls)]
        if len(got) >= count:
            return got
        assert asyncio.get_running_loop().time() < deadline, f"waited for {count} {cls.__name__}"
        await asyncio.sleep(0.05)


def capacity_error(chosen: PlacementChosen, placement_id: str) -> CapacityError:
    return CapacityError(task_id=chosen.task_id, cluster=chosen.cluster, placement_id=placement_id,
                         attempt=chosen.attempt, candidate=chosen.candidate, error_class="spot_capacity",
                         code="InsufficientInstanceCapacity", message="no capacity")


def _world(enabled=("aws", "local")) -> decide.World:
    local = LocalResources(cpus=8, memory_gib=32.0)
    return decide.World(load_catalog(), frozenset(enabled), local)


def _sub(task, task_id="t1") -> TaskSubmitted:
    return TaskSubmitted(task_id=task_id, cluster=f"c-{task_id}", task=task, team="ml")


def test_the_fold_follows_added_updated_removed_and_ignores_an_update_of_a_removed_team() -> None:
    f = workspace.TeamInfras()
    f.apply(TeamAdded(team="ml", allowed_infras=["aws/us-west-2", "K8S"]))
    assert f.of("ml") == (("aws", "us-west-2", None), ("kubernetes", None, None))
    f.apply(TeamUpdated(team="ml", allowed_infras=["local"]))
    assert f.of("ml") == (("local", None, None),)
    f.apply(TeamUpdated(team="ml", allowed_infras=[]))
    assert f.of("ml") == () and f.of(None) == () and f.of("nobody") == ()
    f.apply(TeamRemoved(team="ml"))
    f.apply(TeamUpdated(team="ml", allowed_infras=["aws"]))
    assert "ml" not in f.teams


def test_placement_stays_on_the_teams_infras_and_regions() -> None:
    world = _world()
    anywhere = decide.first_placement(_sub(CPU), world)
    assert isinstance(anywhere, PlacementChosen)
    only_aws = decide.first_placement(_sub(CPU), world, "ml", workspace.parse_entries(["aws"]))
    assert isinstance(only_aws, PlacementChosen) and only_aws.candidate.infra == "aws"
    assert all(c.infra == "aws" for c in only_aws.remaining)
    only_local = decide.first_placement(_sub(CPU), world, "ml", workspace.parse_entries(["local"]))
    assert isinstance(only_local, PlacementChosen) and only_local.candidate.infra == "local"

    # A region: the cheapest place there, even where it is far down the whole ranking.
    west = decide.first_placement(_sub(SPOT_V100), world, "ml", workspace.parse_entries(["aws/us-west-2"]))
    assert isinstance(west, PlacementChosen), west
    assert {c.region for c in [west.candidate, *west.remaining]} == {"us-west-2"}
    cheapest = decide.first_placement(_sub(SPOT_V100), world)
    assert west.candidate.hourly_price_micros >= cheapest.candidate.hourly_price_micros

    # ... and a failover stays in it.
    err = capacity_error(west, "p1")
    again = decide.after_capacity_error(_sub(SPOT_V100), [err], world, "ml", workspace.parse_entries(["aws/us-west-2"]))
    assert isinstance(again, PlacementChosen) and again.candidate.region == "us-west-2"
    assert again.candidate.zone != west.candidate.zone


def test_a_task_the_workspace_leaves_nowhere_to_go_fails_with_the_teams_reason() -> None:
    world = _world()
    asks_aws = decide.first_placement(_sub(SPOT_V100), world, "ml", workspace.parse_entries(["local"]))
    assert isinstance(asks_aws, PlacementFailed)
    assert asks_aws.reason.startswith("team ml may run only on local (its allowed infras")
    assert "spz teams update ml --allowed-infras" in asks_aws.reason
    off = decide.first_placement(_sub(CPU), world, "ml", workspace.parse_entries(["kubernetes"]))
    assert isinstance(off, PlacementFailed) and "none of them is enabled here (enabled: aws, local)" in off.reason


def test_the_optimizer_places_by_the_stamped_teams_workspace_from_the_log(nats_server) -> None:
    async def main():
        bus = await connect_bus(nats_server)
        await bus.publish(TeamAdded(team="ml", allowed_infras=["local"]))
        await bus.publish(TeamAdded(team="finance"))  # every infra
        runner = ServiceRunner(bus, OptimizerService(enabled=frozenset({"aws", "local"})))
        task = asyncio.create_task(runner.run())
        try:
            # Stamped ml by the API server; the event's own team claims finance (which may use aws).
            claim = TaskSubmitted(task_id="t1", cluster="c1", task=SPOT_V100, user="alice", team="finance")
            await bus.publish(stamp(bus.envelope(claim), "alice", "ml"))
            failed = (await wait_for(bus, PlacementFailed, "t1", 1))[0]
            assert failed.reason.startswith("team ml may run only on local"), failed.reason

            await bus.publish(stamp(bus.envelope(TaskSubmitted(task_id="t2", cluster="c2", task=CPU)), "alice", "ml"))
            assert (await wait_for(bus, PlacementChosen, "t2", 1))[0].candidate.infra == "local"

            # The admin widens the workspace: the next task may go to aws (consumed while running).
            await bus.publish(TeamUpdated(team="ml", allowed_infras=["aws"]))
            await asyncio.sleep(0.5)
            await bus.publish(stamp(bus.envelope(TaskSubmitted(task_id="t3", cluster="c3", task=CPU)), "alice", "ml"))
            assert (await wait_for(bus, PlacementChosen, "t3", 1))[0].candidate.infra == "aws"

            # Unstamped (the embedded bus): the event's own team decides.
            await bus.publish(TaskSubmitted(task_id="t4", cluster="c4", task=SPOT_V100, team="finance"))
            assert (await wait_for(bus, PlacementChosen, "t4", 1))[0].candidate.infra == "aws"
        finally:
            runner.stop()
            await task

        # A fresh optimizer reads the workspace back from the log.
        runner = ServiceRunner(bus, OptimizerService(enabled=frozenset({"aws", "local"})))
        task = asyncio.create_task(runner.run())
        try:
            await bus.publish(stamp(bus.envelope(TaskSubmitted(task_id="t5", cluster="c5", task=CPU)), "bob", "ml"))
            assert (await wait_for(bus, PlacementChosen, "t5", 1))[0].candidate.infra == "aws"
        finally:
            runner.stop()
            await task
            await bus.close()

    asyncio.run(main())


def test_spz_teams_add_and_update_set_allowed_infras_and_labels(nats_server, tmp_path) -> None:
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": "test",
           "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_NO_PLUGINS": "1"}

    def spz(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, capture_output=True,
                              text=True, timeout=60)

    assert spz("teams", "add", "ml", "--allowed-infras", "aws,local", "--label", "cost=ml").returncode == 0
    r = spz("teams", "update", "ml", "--allowed-infras", "aws/us-west-2")
    assert r.returncode == 0 and "infras aws/us-west-2; labels cost=ml" in r.stdout, r.stdout + r.stderr
    listed = json.loads(spz("teams", "list", "-o", "json").stdout)
    assert listed == [{"team": "ml", "allowed_infras": ["aws/us-west-2"], "labels": {"cost": "ml"}, "credentials": {},
                       "users": []}]
    assert spz("teams", "update", "ml", "--clear-labels", "--allowed-infras", "").returncode == 0
    assert json.loads(spz("teams", "list", "-o", "json").stdout)[0] | {} == {
        "team": "ml", "allowed_infras": [], "labels": {}, "credentials": {}, "users": []}
    for bad in (("teams", "update", "ml"), ("teams", "update", "ml", "--allowed-infras", "aws;rm"),
                ("teams", "update", "a.b", "--allowed-infras", "aws")):
        r = spz(*bad)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (bad, r.stderr)
    r = spz("teams", "update", "nope", "--allowed-infras", "aws")
    assert r.returncode == 1 and "no team nope" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_submissions_workspace_over_http_stamps_its_team_and_brings_its_labels(nats_server, tmp_path) -> None:
    import json
    import os
    import subprocess
    import sys

    from api_harness import Api, problem

    from skypurza.events.principal import stamped_principal

    env = {**os.environ, "SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": "test",
           "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_NO_PLUGINS": "1"}

    def spz(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, capture_output=True,
                              text=True, timeout=60)

    def token(user: str, team: str, role: str) -> str:
        r = spz("users", "add", user, "--team", team, "--role", role, "-o", "json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["token"]

    assert spz("teams", "add", "ml", "--allowed-infras", "local", "--label", "cost-center=ml").returncode == 0
    assert spz("teams", "add", "cv", "--label", "cost-center=cv", "--label", "tier=gold").returncode == 0
    alice, root = token("alice", "ml", "member"), token("root", "ml", "admin")
    api = Api(nats_server, tmp_path, env={**os.environ, "SKYPURZA_NO_PLUGINS": "1"})
    try:
        task = "run: echo hi\nresources:\n  labels:\n    tier: silver\n    team: cv\n"
        mine = api.http.post("/api/v1/tasks", headers=api.as_(alice), json={"task": task, "workspace": "ml"})
        assert mine.status_code == 202 and mine.json()["team"] == "ml", mine.text
        body = problem(api.http.post("/api/v1/tasks", headers=api.as_(alice), json={"task": task, "workspace": "cv"}),
                       403)
        assert body["detail"].startswith("alice is not in team cv; their teams: ml"), body
        problem(api.http.post("/api/v1/jobs", headers=api.as_(alice), json={"task": task, "workspace": "cv"}), 403)
        theirs = api.http.post("/api/v1/tasks", headers=api.as_(root), json={"task": task, "workspace": "cv"})
        assert theirs.status_code == 202 and theirs.json()["team"] == "cv", theirs.text
        assert "no workspace nope" in problem(api.http.post(
            "/api/v1/tasks", headers=api.as_(root), json={"task": task, "workspace": "nope"}), 404)["detail"]
        for bad in ("a.b", "../x", "a*", ">", "a b", "é"):
            problem(api.http.post("/api/v1/tasks", headers=api.as_(root), json={"task": task, "workspace": bad}), 422)
        # The PATCH route replaces a team's workspace (admins only).
        res = api.http.patch("/api/v1/teams/ml", headers=api.as_(root), json={"allowed_infras": ["aws", "local"]})
        assert res.status_code == 200 and res.json() == {"name": "ml", "allowed_infras": ["aws", "local"],
                                                         "labels": {"cost-center": "ml"}}, res.text
        problem(api.http.patch("/api/v1/teams/ml", headers=api.as_(alice), json={"labels": {}}), 403)
        problem(api.http.patch("/api/v1/teams/nope", headers=api.as_(root), json={"labels": {}}), 404)
        problem(api.http.patch("/api/v1/teams/ml", headers=api.as_(root), json={"allowed_infras": ["aws;rm"]}), 422)
    finally:
        out = api.close()
    assert "Traceback" not in out

    async def submitted() -> list:
        bus = await connect_bus(nats_server)
        try:
            return [s async for s in bus.replay() if isinstance(s.event, TaskSubmitted)]
        finally:
            await bus.close()

    subs = asyncio.run(submitted())
    assert [stamped_principal(s.envelope) for s in subs] == [("alice", "ml"), ("root", "cv")]
    # The workspace's labels are defaults: the task's own win; a task's `team` label changes no team.
    assert subs[0].event.task.labels() == {"cost-center": "ml", "tier": "silver", "team": "cv"}
    assert subs[1].event.task.labels() == {"cost-center": "cv", "tier": "silver", "team": "cv"}
    assert (subs[0].event.team, subs[1].event.team) == ("ml", "cv")


def test_dash_w_is_checked_as_a_team_name(tmp_path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_NO_PLUGINS": "1"}
    for argv in (["launch", "-w", "a.b", "echo hi"], ["jobs", "launch", "-w", "../x", "-y", "echo hi"]):
        r = subprocess.run([sys.executable, "-m", "skypurza.cli.main", *argv], env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and "workspace (team) name" in r.stderr and "Traceback" not in r.stderr, r.stderr
