"""Nothing orphaned in a team's own AWS account (issue 14): reconciliation, the cleanup sweep and
teardown reach every account a node of ours may be in.

Against the real fault-injecting moto server over HTTP (tests/support/fakeaws.py), where an access
key id is an account: a team's profile in a shared credentials file is its account. An orphan
there is found and terminated; a cluster there whose nodes are terminated behind our back is
declared vanished; an unused security group there is swept in the background. A profile removed
from the credentials file makes reconcile warn and keep its clusters, and a teardown of one of
them is refused at once (a dead letter naming team and profile), not after its retries.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from aws_fixtures import SECRET, FakeAws, FakeAwsServer, another_account
from nats_fixtures import connect_bus
from provisioner_fixtures import REGION, STAGE, candidate, events_on, place, running, service, subject, wait_for

from skypurza.events import deadletters, naming
from skypurza.events.bus import Bus
from skypurza.events.models import ClusterProvisioned, ClusterTerminated, DownRequested, OrphanFound, TaskSubmitted
from skypurza.events.team_credentials import with_aws_profile
from skypurza.services.api import directory_io


def _credentials_file(path: Path, accounts: dict[str, FakeAws]) -> Path:
    path.write_text("".join(f"[{name}]\naws_access_key_id = {aws.account_id}\naws_secret_access_key = {SECRET}\n\n"
                            for name, aws in accounts.items()))
    return path


def _use_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default: FakeAws,
                  accounts: dict[str, FakeAws]) -> Path:
    path = _credentials_file(tmp_path / "credentials", accounts)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(path))
    (tmp_path / "config").write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    for key, value in default.env.items():  # the server's default credentials: the default account
        monkeypatch.setenv(key, value)
    return path


async def _launch(bus: Bus, cluster: str, team: str) -> ClusterProvisioned:
    task_id = f"t-{cluster}"
    await bus.publish(TaskSubmitted(task_id=task_id, cluster=cluster, num_nodes=1, user="alice", team=team,
                                    task={"name": "train", "run": "echo hi"}, secrets_key=task_id))
    await place(bus, task_id, cluster, candidate(num_nodes=1, use_spot=False))
    ev = (await wait_for(bus, subject("cluster", cluster, "cluster_provisioned"))).event
    assert isinstance(ev, ClusterProvisioned)
    return ev


def _stray_instance(aws: FakeAws, cluster: str) -> str:
    """A node of ours (this stage's tags) that no event knows: a launch that died before the log."""
    tags = {**naming.base_tags(STAGE), naming.TAG_CLUSTER: cluster}
    reply = aws.client(REGION).run_instances(
        ImageId="ami-dca37ea5", InstanceType="t3.micro", MinCount=1, MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}])
    return str(reply["Instances"][0]["InstanceId"])


def _state(aws: FakeAws, instance_id: str) -> str:
    reply = aws.client(REGION).describe_instances(InstanceIds=[instance_id])
    return str(reply["Reservations"][0]["Instances"][0]["State"]["Name"])


def _group_ids(aws: FakeAws) -> set[str]:
    return {g["GroupId"] for g in aws.client(REGION).describe_security_groups()["SecurityGroups"]}


def test_a_team_accounts_orphans_vanished_clusters_and_unused_groups_are_found(
        nats_server, fake_aws: FakeAws, fakeaws_server: FakeAwsServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ml = another_account(fakeaws_server)
    _use_profiles(tmp_path, monkeypatch, fake_aws, {"ml-prod": ml})

    async def main() -> None:
        bus = await connect_bus(nats_server)
        await directory_io.add_team(bus, "ml", [], {}, with_aws_profile(None, "ml-prod"))
        svc = service(fake_aws)
        async with running(bus, svc):
            made = await _launch(bus, "c-ml", "ml")
            ghost = _stray_instance(ml, "ghost")
            stray_default = _stray_instance(fake_aws, "ghost-default")

            report = await svc.reconcile(terminate=True)
            # Both accounts were listed, and each one's orphan found and terminated in its account.
            assert report.checked.get("aws") == [REGION] and report.checked.get("aws@ml-prod") == [REGION]
            assert {n.instance_id for n in report.orphans} == {ghost, stray_default}
            assert set(report.terminated) >= {ghost, stray_default}
            assert _state(ml, ghost) in ("shutting-down", "terminated")
            assert _state(fake_aws, stray_default) in ("shutting-down", "terminated")
            found = [s.event for s in await events_on(bus, subject("cluster", "ghost", "orphan_found"))]
            assert [(e.instance_id, e.action) for e in found if isinstance(e, OrphanFound)] == [
                (ghost, "reported"), (ghost, "terminated")]
            assert "aws@ml-prod" in found[0].detail  # type: ignore[attr-defined]
            # The team's live cluster is where it was made: neither vanished nor an orphan.
            assert "c-ml" not in report.vanished and report.errors == {}
            assert _state(ml, made.nodes[0].instance_id) == "running"

            # An unused security group of this stage in the team's account: the background sweep.
            group = ml.client(REGION).create_security_group(
                GroupName=f"{STAGE}-stray", Description="left behind",
                TagSpecifications=[{"ResourceType": "security-group", "Tags": [
                    {"Key": k, "Value": v} for k, v in naming.base_tags(STAGE).items()]}])["GroupId"]
            swept = await svc.sweep()
            assert f"{STAGE}-stray" in swept.deleted and group not in _group_ids(ml)
            assert "aws@ml-prod" in swept.regions

            # Its nodes terminated behind our back: the team-account cluster is vanished, and over.
            ml.client(REGION).terminate_instances(InstanceIds=[n.instance_id for n in made.nodes])
            report = await svc.reconcile()
            assert report.vanished.get("c-ml") == tuple(n.instance_id for n in made.nodes)
            assert report.ended == ["c-ml"]
            ended = (await wait_for(bus, subject("cluster", "c-ml", "cluster_terminated"))).event
            assert isinstance(ended, ClusterTerminated) and ended.reason == "vanished"
        await bus.close()

    asyncio.run(main())
    ml.clear_requests()


def test_a_profile_gone_from_the_server_is_reported_and_its_clusters_kept(
        nats_server, fake_aws: FakeAws, fakeaws_server: FakeAwsServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    cv = another_account(fakeaws_server)
    path = _use_profiles(tmp_path, monkeypatch, fake_aws, {"cv-prod": cv})

    async def main() -> None:
        bus = await connect_bus(nats_server)
        await directory_io.add_team(bus, "cv", [], {}, with_aws_profile(None, "cv-prod"))
        async with running(bus, service(fake_aws)):
            made = await _launch(bus, "c-cv", "cv")
        node = made.nodes[0].instance_id

        # The admin drops the profile from the server's credentials file; the server restarts.
        _credentials_file(path, {})
        svc = service(fake_aws)
        async with running(bus, svc) as runner:
            for _ in range(200):  # the runner starts the service in its own task
                if svc._bus is not None:
                    break
                await asyncio.sleep(0.05)
            with caplog.at_level(logging.WARNING, logger="skypurza.services.provisioner.reconcile"):
                report = await svc.reconcile(terminate=True)
            why = report.errors.get("aws@cv-prod", "")
            assert "cv-prod" in why and "team cv" in why and "c-cv" in why, report.errors
            assert any("cv-prod" in r.getMessage() for r in caplog.records)
            # Unknown is not gone: the cluster is neither vanished nor ended, its node untouched.
            assert "c-cv" not in report.vanished and report.ended == []
            assert report.checked.get("aws") == [REGION]
            assert await events_on(bus, subject("cluster", "c-cv", "cluster_terminated")) == []
            assert _state(cv, node) == "running"

            # A teardown cannot reach it: refused at once, with the reason, on the first delivery.
            down = await bus.publish(DownRequested(cluster="c-cv"))
            loop = asyncio.get_running_loop()
            deadline, letters = loop.time() + 10, []
            while loop.time() < deadline and not letters:
                letters = [d for d in await deadletters.dead_letters(bus, "provisioner")
                           if d["stream_seq"] == down.seq]
                await asyncio.sleep(0.1)
            assert letters, "the teardown's failure was not published"
            error = letters[0]["error"]
            assert "c-cv" in error and "team cv" in error and "cv-prod" in error and "--purge" in error, error
            assert runner.stats.failed == 1  # parked at the first delivery, not after the retries
            assert await events_on(bus, subject("cluster", "c-cv", "cluster_terminated")) == []
            assert _state(cv, node) == "running"
        await bus.close()

    asyncio.run(main())


def test_the_accounts_to_look_in_come_from_every_teams_history() -> None:
    from datetime import UTC, datetime

    from skypurza.events.bus import Stored
    from skypurza.events.identity_events import TeamAdded, TeamRemoved, TeamUpdated
    from skypurza.services.provisioner import cleanup, teamcreds
    from skypurza.services.provisioner.backends import aws_account, credentials_key, split_key

    def at(seq: int, event: object) -> Stored:
        return Stored(seq=seq, subject="s", timestamp=datetime(2026, 11, 2, tzinfo=UTC), envelope=None,  # type: ignore[arg-type]
                      event=event, status="ok")

    ml = teamcreds.fold("ml", [at(2, TeamAdded(team="ml", credentials=with_aws_profile(None, "a"))),
                               at(5, TeamUpdated(team="ml", credentials=with_aws_profile(None, "b"))),
                               at(9, TeamRemoved(team="ml"))])
    cv = teamcreds.fold("cv", [at(3, TeamAdded(team="cv"))])
    histories = {"ml": ml, "cv": cv}
    # A profile left behind (a), and one of a removed team (b), may still hold nodes.
    assert teamcreds.profiles_ever(histories.values()) == ["a", "b"]
    assert teamcreds.launched_in(histories, "ml", 4) == "a" and teamcreds.launched_in(histories, "ml", 6) == "b"
    assert teamcreds.launched_in(histories, "ml", 10) is None and teamcreds.launched_in(histories, "cv", 4) is None
    assert teamcreds.launched_in(histories, None, 4) is None and teamcreds.teams_with(histories, "b") == ["ml"]
    assert split_key(credentials_key("aws", aws_account("a"))) == ("aws", aws_account("a"))
    assert split_key("aws") == ("aws", None) and split_key("kubernetes@ns") == ("kubernetes@ns", None)
    assert cleanup.with_accounts({"aws": {"r1"}, "aws@a": {"r2"}}, ["aws@a", "aws@b"]) == {
        "aws": {"r1"}, "aws@a": {"r1", "r2"}, "aws@b": {"r1"}}
    # A team account's failures are its own: the same key pair name in two accounts, two resources.
    assert cleanup.resource_key("r1", "key-pair", "k") != cleanup.resource_key("r1", "key-pair", "k", infra="aws@a")
