"""A team's infra credentials by reference (issue 14): its AWS profile makes its clusters.

Against the real fault-injecting moto server over HTTP (tests/support/fakeaws.py), where an
access key id is an account: two teams with two profiles of one shared credentials file launch,
and each one's instances are in its own profile's account, none in the server's default one. A
team whose profile the server lacks gets a clear, non-retryable ProvisionFailed. The edge checks
(CLI and API) refuse a bad reference with the key named.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
import subprocess
import sys
from pathlib import Path

import pytest
from aws_fixtures import SECRET, FakeAws, FakeAwsServer, another_account
from nats_fixtures import connect_bus
from provisioner_fixtures import REGION, candidate, events_on, place, running, service, subject, wait_for

from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.identity_events import TeamAdded, TeamUpdated
from skypurza.events.models import ClusterProvisioned, ClusterTerminated, DownRequested, ProvisionFailed, TaskSubmitted
from skypurza.events.team_credentials import AwsCredentials, TeamCredentials, check_aws_profile, with_aws_profile
from skypurza.services.api import directory_io
from skypurza.services.provisioner import teamcreds


def _profiles(tmp_path: Path, accounts: dict[str, FakeAws]) -> Path:
    """An AWS shared credentials file with one profile per account (different access key ids)."""
    path = tmp_path / "credentials"
    path.write_text("".join(f"[{name}]\naws_access_key_id = {aws.account_id}\naws_secret_access_key = {SECRET}\n\n"
                            for name, aws in accounts.items()))
    return path


async def _submit(bus: Bus, task_id: str, cluster: str, team: str) -> None:
    await bus.publish(TaskSubmitted(task_id=task_id, cluster=cluster, num_nodes=1, user="alice", team=team,
                                    task={"name": "train", "run": "echo hi"}, secrets_key=task_id))
    await place(bus, task_id, cluster, candidate(num_nodes=1, use_spot=False))


def _live(aws: FakeAws, cluster: str) -> int:
    return aws.count_instances(REGION, tags={naming.TAG_CLUSTER: cluster})


def test_each_team_launches_and_tears_down_with_its_own_profile(
        nats_server, fake_aws: FakeAws, fakeaws_server: FakeAwsServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ml_account, cv_account = another_account(fakeaws_server), another_account(fakeaws_server)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(_profiles(tmp_path, {"ml-prod": ml_account,
                                                                               "cv.prod": cv_account})))
    (tmp_path / "config").write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    for key, value in fake_aws.env.items():  # the server's default credentials: the default account
        monkeypatch.setenv(key, value)

    async def main() -> None:
        bus = await connect_bus(nats_server)
        await directory_io.add_team(bus, "ml", [], {}, with_aws_profile(None, "ml-prod"))
        await directory_io.add_team(bus, "cv", [], {}, with_aws_profile(None, "cv.prod"))
        await directory_io.add_team(bus, "ops", [], {}, with_aws_profile(None, "no-such-profile"))
        await directory_io.add_team(bus, "plain", [], {})
        async with running(bus, service(fake_aws)):
            for team in ("ml", "cv", "ops", "plain"):
                await _submit(bus, f"t-{team}", f"c-{team}", team)
            provisioned = {team: await wait_for(bus, subject("cluster", f"c-{team}", "cluster_provisioned"))
                           for team in ("ml", "cv", "plain")}
            refused = await wait_for(bus, subject("task", "t-ops", "provision_failed"))

            # Each team's instances are in its own profile's account (the key the calls were signed
            # with), and none of them in the server's default account.
            assert _live(ml_account, "c-ml") == 1 and _live(cv_account, "c-cv") == 1
            assert _live(fake_aws, "c-plain") == 1
            assert _live(fake_aws, "c-ml") == _live(fake_aws, "c-cv") == 0
            assert _live(ml_account, "c-cv") == _live(cv_account, "c-ml") == 0
            assert ml_account.request_count("RunInstances") == cv_account.request_count("RunInstances") == 1
            assert all(isinstance(s.event, ClusterProvisioned) for s in provisioned.values())
            assert provisioned["ml"].event.team == "ml"

            # A profile the server lacks: one clear, non-retryable failure naming team and profile.
            ev = refused.event
            assert isinstance(ev, ProvisionFailed) and ev.error_class == "auth" and ev.code == "CredentialsNotFound"
            assert "team ops" in ev.message and "no-such-profile" in ev.message
            assert "Traceback" not in ev.message
            assert await events_on(bus, subject("task", "t-ops", "capacity_error")) == []
            assert await events_on(bus, subject("cluster", "c-ops", "cluster_provisioned")) == []

            # The team moves to the other account: its running cluster is still torn down where it
            # was made (the profile it was launched with), not looked for in the new account.
            await directory_io.update_team(bus, "ml", aws_profile="cv.prod")
            await bus.publish(DownRequested(cluster="c-ml"))
            ended = await wait_for(bus, subject("cluster", "c-ml", "cluster_terminated"))
            assert isinstance(ended.event, ClusterTerminated)
            assert _live(ml_account, "c-ml") == 0
            assert sorted(ended.event.instance_ids) == [n.instance_id for n in provisioned["ml"].event.nodes]
            assert cv_account.request_count("TerminateInstances") == 0
        await bus.close()

    asyncio.run(main())
    for aws in (ml_account, cv_account):
        aws.clear_faults()
        aws.clear_requests()


def test_history_is_what_the_team_had_at_each_point() -> None:
    from skypurza.events.bus import Stored

    def at(seq: int, event: object) -> Stored:
        return Stored(seq=seq, subject="s", timestamp=datetime(2026, 11, 2, tzinfo=UTC), envelope=None, event=event,  # type: ignore[arg-type]
                      status="ok")

    a = TeamCredentials(aws=AwsCredentials(profile="a"))
    b = TeamCredentials(aws=AwsCredentials(profile="b"))
    h = teamcreds.fold("ml", [at(5, TeamUpdated(team="ml", credentials=b)), at(2, TeamAdded(team="ml", credentials=a)),
                              at(9, TeamUpdated(team="ml"))])
    assert h.as_of(1).aws is None and h.as_of(2) == a and h.as_of(4) == a and h.as_of(5) == b
    assert h.as_of(None).aws is None and h.ever_aws()
    # An old TeamAdded (no credentials field at all) decodes, and means the server's default.
    old = TeamAdded.model_validate({"team": "ml", "allowed_infras": ["aws"], "labels": {}})
    assert old.credentials is None and not teamcreds.fold("ml", [at(1, old)]).ever_aws()


@pytest.mark.parametrize("bad", ["", "-x", "a b", "a/b", "x" * 65, "prof\n", "a*", "ä"])
def test_bad_profile_names_are_refused_with_the_key(bad: str) -> None:
    with pytest.raises(ValueError, match=r"credentials\.aws\.profile.*letters, digits"):
        check_aws_profile(bad)


def _spz_env(nats_server, tmp_path: Path) -> dict[str, str]:
    import os

    return {**os.environ, "SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": "test",
            "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_NO_PLUGINS": "1"}


def _spz(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, text=True,
                          capture_output=True, timeout=60)


def test_spz_teams_add_update_list_aws_profile_on_the_embedded_bus(nats_server, tmp_path: Path) -> None:
    env = _spz_env(nats_server, tmp_path)
    bad = _spz(env, "teams", "add", "ml", "--aws-profile", "a/b")
    assert bad.returncode == 2 and "credentials.aws.profile" in bad.stderr and "Traceback" not in bad.stderr
    assert _spz(env, "teams", "add", "ml", "--aws-profile", "ml-prod").returncode == 0
    assert _spz(env, "teams", "add", "cv").returncode == 0
    rows = {r["team"]: r for r in json.loads(_spz(env, "teams", "list", "-o", "json").stdout)}
    assert rows["ml"]["credentials"] == {"aws": {"profile": "ml-prod"}} and rows["cv"]["credentials"] == {}
    table = _spz(env, "teams", "list").stdout
    assert "CREDENTIALS" in table and "aws:ml-prod" in table
    # An update keeps the profile unless told; '' goes back to the server's default.
    assert _spz(env, "teams", "update", "ml", "--label", "tier=gold").returncode == 0
    rows = {r["team"]: r for r in json.loads(_spz(env, "teams", "list", "-o", "json").stdout)}
    assert rows["ml"]["credentials"] == {"aws": {"profile": "ml-prod"}} and rows["ml"]["labels"] == {"tier": "gold"}
    assert _spz(env, "teams", "update", "ml", "--aws-profile", "").returncode == 0
    rows = {r["team"]: r for r in json.loads(_spz(env, "teams", "list", "-o", "json").stdout)}
    assert rows["ml"]["credentials"] == {}


def test_teams_credentials_over_http(nats_server, tmp_path: Path) -> None:
    """POST/PATCH/GET /api/v1/teams with `credentials` (SkyPilot's shape); a bad one is a 422 naming the key."""
    import os

    from api_harness import Api, cli_token, problem

    env = _spz_env(nats_server, tmp_path)
    assert _spz(env, "teams", "add", "admins").returncode == 0
    root = cli_token(env, "root", "admin", team="admins")
    api = Api(nats_server, tmp_path, env={**os.environ, "SKYPURZA_NO_PLUGINS": "1"})
    try:
        made = api.http.post("/api/v1/teams", headers=api.as_(root),
                             json={"name": "ml", "credentials": {"aws": {"profile": "ml-prod"}}})
        assert made.status_code == 201 and made.json()["credentials"] == {"aws": {"profile": "ml-prod"}}, made.text
        for bad in ({"aws": {"profile": "a/b"}}, {"aws": {"profile": ""}}, {"aws": {"profile": "x" * 65}},
                    {"aws": {"profile": "p", "aws_secret_access_key": "no"}}, {"gcp": {}}):
            body = problem(api.http.post("/api/v1/teams", headers=api.as_(root),
                                         json={"name": "cv", "credentials": bad}), 422)
            assert "credentials" in json.dumps(body), body
        listed = {t["name"]: t for t in api.http.get("/api/v1/teams", headers=api.as_(root)).json()["teams"]}
        assert listed["ml"]["credentials"] == {"aws": {"profile": "ml-prod"}} and "cv" not in listed
        assert api.http.patch("/api/v1/teams/ml", headers=api.as_(root),
                              json={"credentials": {"aws": {"profile": "ml-2"}}}).status_code == 200
        listed = {t["name"]: t for t in api.http.get("/api/v1/teams", headers=api.as_(root)).json()["teams"]}
        assert listed["ml"]["credentials"] == {"aws": {"profile": "ml-2"}}
        # A member sees their own team's reference, never another team's.
        assert api.http.post("/api/v1/teams", headers=api.as_(root),
                             json={"name": "cv", "credentials": {"aws": {"profile": "cv-prod"}}}).status_code == 201
        alice = cli_token(env, "alice", "member", team="ml")
        theirs = api.http.get("/api/v1/teams", headers=api.as_(alice))
        assert theirs.status_code == 200, theirs.text
        assert [(t["name"], t["credentials"]) for t in theirs.json()["teams"]] == [("ml", {"aws": {"profile": "ml-2"}})]
        assert "cv-prod" not in theirs.text
        # The CLI through the server says the same.
        via = {**env, "SKYPURZA_API_SERVER": api.url, "SKYPURZA_API_TOKEN": root}
        assert _spz(via, "teams", "update", "ml", "--aws-profile", "").returncode == 0
        rows = {r["team"]: r for r in json.loads(_spz(via, "teams", "list", "-o", "json").stdout)}
        assert rows["ml"]["credentials"] == {}
    finally:
        out = api.close()
    assert "Traceback" not in out
