"""Reconciliation: nodes behind the broker's back, the periodic pass in the service, `spz reconcile`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import typer
from aws_fixtures import FakeAws
from nats_fixtures import connect_bus
from provisioner_fixtures import REGION, STAGE, candidate, events_on, launch, running, service, subject, wait_for
from typer.testing import CliRunner

from skypurza.cli import cmd_provision
from skypurza.events import naming
from skypurza.events.models import OrphanFound


def behind_our_back(aws: FakeAws, stage: str | None, cluster: str) -> str:
    tags = {**naming.base_tags(stage), naming.TAG_CLUSTER: cluster} if stage else {"Name": cluster}
    reply = aws.client(REGION).run_instances(
        ImageId="ami-dca37ea5", InstanceType="t3.micro", MinCount=1, MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}])
    return str(reply["Instances"][0]["InstanceId"])


def states(aws: FakeAws) -> dict[str, str]:
    reply = aws.client(REGION).describe_instances()
    return {i["InstanceId"]: i["State"]["Name"] for r in reply["Reservations"] for i in r["Instances"]}


def orphan_events(nats_server, cluster: str) -> list[OrphanFound]:
    async def read() -> list[OrphanFound]:
        bus = await connect_bus(nats_server)
        found = [s.event for s in await events_on(bus, subject("cluster", cluster, "orphan_found"))]
        await bus.close()
        return found  # type: ignore[return-value]

    return asyncio.run(read())


def test_orphans_are_reported_periodically_and_terminated_on_request(
        nats_server, fake_aws: FakeAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ghost = behind_our_back(fake_aws, STAGE, "ghost")
    foreign = behind_our_back(fake_aws, "other", "ghost")
    untagged = behind_our_back(fake_aws, None, "mine")

    async def periodic() -> list[str]:
        bus = await connect_bus(nats_server)
        async with running(bus, service(fake_aws, reconcile_interval_s=0.5)):
            await launch(bus, "t1", "train", candidate())
            prov = (await wait_for(bus, subject("cluster", "train", "cluster_provisioned"))).event
            reported = await wait_for(bus, subject("cluster", "ghost", "orphan_found"), timeout=10)
            await asyncio.sleep(1.2)  # two more passes: still one event per (node, action)
        assert isinstance(reported.event, OrphanFound)
        assert (reported.event.instance_id, reported.event.action, reported.event.region) == (ghost, "reported", REGION)
        all_orphans = await events_on(bus, naming.event_filter(STAGE, "cluster", "orphan_found"))
        assert [s.envelope.id for s in all_orphans] == [reported.envelope.id]
        await bus.close()
        return [n.instance_id for n in prov.nodes]

    train = asyncio.run(periodic())
    assert states(fake_aws)[ghost] == "running"  # the periodic pass only reports by default
    # A node of the live cluster disappears behind our back.
    fake_aws.client(REGION).terminate_instances(InstanceIds=[train[1]])

    for key, value in {**fake_aws.env, "SKYPURZA_NATS_URL": nats_server.url, "SKYPURZA_STAGE": STAGE,
                       "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_AWS_REGIONS": REGION,
                       "SKYPURZA_RECONCILE_GRACE_S": "0"}.items():
        monkeypatch.setenv(key, value)
    app = typer.Typer()
    app.callback()(lambda: None)
    cmd_provision.register(app)
    result = CliRunner().invoke(app, ["reconcile", "--terminate-orphans", "-o", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["checked"] == {"aws": [REGION]} and report["live_clusters"] == ["train"]
    assert [(o["instance_id"], o["cluster"], o["terminated"]) for o in report["orphans"]] == [(ghost, "ghost", True)]
    assert report["vanished"] == {"train": [train[1]]} and report["errors"] == {}

    after = states(fake_aws)
    assert after[ghost] == "terminated"
    assert after[foreign] == "running" and after[untagged] == "running"  # not this stage's
    assert after[train[0]] == "running"
    assert [(e.instance_id, e.action) for e in orphan_events(nats_server, "ghost")] == [
        (ghost, "reported"), (ghost, "terminated")]

    # The human-readable form, with nothing left to find but the vanished node.
    table = CliRunner().invoke(app, ["reconcile"])
    assert table.exit_code == 0, table.output
    assert "No orphans." in table.output and train[1] in table.output

    # `spz status --refresh` runs the same pass before showing the clusters.
    from skypurza.cli.main import app as spz_app

    status = CliRunner().invoke(spz_app, ["status", "--refresh"])
    assert status.exit_code == 0, status.output
    assert "Vanished" in status.output and train[1] in status.output and "train" in status.output
    assert CliRunner().invoke(spz_app, ["status", "--terminate-orphans"]).exit_code != 0


def test_enabled_regions_from_settings_or_from_ec2(fake_aws: FakeAws, monkeypatch: pytest.MonkeyPatch) -> None:
    from skypurza.services.provisioner.backends import Backends
    from skypurza.services.provisioner.settings import ProvisionerSettings

    configured = ProvisionerSettings.load(env={}, config={"aws": {"regions": ["eu-west-1", "us-east-2"]},
                                                          "provisioner": {"concurrency": 3}})
    assert configured.aws_regions == ("eu-west-1", "us-east-2") and configured.concurrency == 3
    env_wins = ProvisionerSettings.load(env={"SKYPURZA_AWS_REGIONS": "ap-south-1"},
                                        config={"aws": {"regions": ["eu-west-1"]}})
    assert env_wins.aws_regions == ("ap-south-1",)
    # Nothing configured: the regions EC2 lists for the account (AWS_ENDPOINT_URL honoured).
    for key, value in fake_aws.env.items():
        monkeypatch.setenv(key, value)
    backends = Backends(ProvisionerSettings.load(env={}, config={}), stage=STAGE)
    regions = asyncio.run(backends.aws_regions())
    assert {"us-east-1", "eu-west-1", "af-south-1"} <= set(regions) and list(regions) == sorted(regions)
