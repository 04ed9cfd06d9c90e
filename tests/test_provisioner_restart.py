"""A provisioner process SIGKILLed right after it called RunInstances, then restarted, finds the
instances it launched instead of launching a second gang."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from aws_fixtures import FakeAws
from nats_fixtures import connect_bus
from provisioner_fixtures import aws_env, candidate, events_on, launch, subject, wait_for


def start_provisioner(url: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "skypurza.cli.serve", "--nats", url, "--stage", "test", "--services", "provisioner"],
        env={**os.environ, **env}, stdout=log.open("ab"), stderr=subprocess.STDOUT,
    )


def test_killed_after_run_instances_then_restarted_launches_once(nats_server, fake_aws: FakeAws,
                                                                  tmp_path: Path) -> None:
    # Tagging fails, so the launch stops right after RunInstances and the provisioner backs off
    # for a long time: the window in which it is killed.
    fake_aws.add_fault("InternalError", action="CreateTags")
    env = aws_env(fake_aws, SKYPURZA_HOME=str(tmp_path / "home"), SKYPURZA_PROVISIONER_TRANSIENT_BACKOFF_S="60")
    log = tmp_path / "provisioner.log"

    async def main() -> None:
        bus = await connect_bus(nats_server)
        first = start_provisioner(nats_server.url, env, log)
        try:
            placed = await launch(bus, "t1", "train", candidate())
            deadline = time.monotonic() + 30
            while fake_aws.request_count("RunInstances") == 0:
                assert first.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "the provisioner never called RunInstances"
                await asyncio.sleep(0.02)
            first.send_signal(signal.SIGKILL)
            first.wait(10)
        finally:
            if first.poll() is None:
                first.kill()
        assert fake_aws.count_instances() == 2
        assert await events_on(bus, subject("cluster", "train", "cluster_provisioned")) == []

        fake_aws.clear_faults()
        second = start_provisioner(nats_server.url, {**env, "SKYPURZA_PROVISIONER_TRANSIENT_BACKOFF_S": "0.05"}, log)
        try:
            prov = await wait_for(bus, subject("cluster", "train", "cluster_provisioned"), timeout=40)
            await wait_for(bus, subject("cluster", "train", "job_queued"), timeout=10)
        finally:
            second.terminate()
            second.wait(15)
        assert prov.event.placement_id == placed.id
        assert fake_aws.request_count("RunInstances") == 1
        assert fake_aws.count_instances() == 2
        assert sorted(n.instance_id for n in prov.event.nodes) == sorted(
            i["InstanceId"] for r in fake_aws.client().describe_instances()["Reservations"] for i in r["Instances"])
        assert len(await events_on(bus, subject("cluster", "train", "job_queued"))) == 1
        await bus.close()

    asyncio.run(main())
