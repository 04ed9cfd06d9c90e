"""A managed job on the `local` infra, end to end: the real optimizer, provisioner (local
backend: one agent process per node), recovery service and agents. A node dies (its agent and
its job are killed); the silence of its heartbeats is the only evidence; the job recovers on
a new local cluster and resumes from its checkpoint bucket (a directory store: no AWS here)."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest
from managed_fixtures import statuses, until, wait_status
from nats_fixtures import connect_bus

from skypurza.events import naming
from skypurza.events.models import NodeLost
from skypurza.events.service import ServiceRunner
from skypurza.services.optimizer.service import OptimizerService
from skypurza.services.provisioner.service import ProvisionerService
from skypurza.services.provisioner.settings import ProvisionerSettings
from skypurza.services.recovery.service import RecoveryService
from skypurza.services.recovery.settings import RecoverySettings
from skypurza.services.recovery.submit import submit_managed_job

RUN = """
echo "$SKYPILOT_TASK_ID" >> ~/ckpt/runs.log
if [ -f ~/ckpt/step ]; then echo "resumed from step $(cat ~/ckpt/step)"; exit 0; fi
echo 1 > ~/ckpt/step
sleep 120
"""


def kill_node(home: Path) -> None:
    """The node dies: its agent and its job's process group, at once."""
    state = home / ".spz-agent"
    for f in (state / "run").glob("*.pgid"):
        try:
            os.killpg(int(f.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    os.kill(int((state / "ready").read_text()), signal.SIGKILL)


@pytest.mark.timeout(120)
def test_lost_local_node_recovers_on_a_new_cluster_and_resumes(nats_server, spz_home, monkeypatch):
    for k, v in {"SKYPURZA_AGENT_HEARTBEAT_S": "0.3", "SKYPURZA_BUCKET_STORE": "dir",
                 "SKYPURZA_CHECKPOINT_SYNC_S": "0.2", "SKYPURZA_AGENT_KILL_GRACE_S": "1"}.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)

    async def main():
        bus = await connect_bus(nats_server)
        prov = ProvisionerService(replace(ProvisionerSettings(), reconcile_interval_s=0, ack_wait_s=5.0))
        rec = RecoveryService(RecoverySettings(ec2_poll_s=0, heartbeat_timeout_s=1.5, reconcile_s=5))
        services = [OptimizerService(enabled=frozenset({"local"})), prov, rec]
        runners = [ServiceRunner(bus, s) for s in services]
        tasks = [asyncio.create_task(r.run()) for r in runners]
        try:
            task = {"name": "train", "resources": {"infra": "local"}, "run": RUN,
                    "file_mounts": {"~/ckpt": {"name": "ckpt-local", "store": "s3"}}}
            job = await submit_managed_job(bus, name="train", tasks=[task])
            await wait_status(bus, 1, "RUNNING", timeout=30)
            bucket = naming.state_dir("test") / "buckets" / "ckpt-local"
            await until(lambda: (bucket / "step").exists(), timeout=20, what="the checkpoint in the bucket")
            home = naming.state_dir("test") / "clusters" / "train-1-1" / "node-0"
            kill_node(home)
            got = await wait_status(bus, 1, "SUCCEEDED", timeout=60)
            assert [e.status for e in got] == ["STARTING", "RUNNING", "RECOVERING", "RUNNING", "SUCCEEDED"]
            lost = await bus.last_event(naming.event_subject("test", "cluster", "train-1-1", "node_lost"))
            assert isinstance(lost.event, NodeLost) and lost.event.evidence["source"] == "heartbeat"
            assert got[2].reason.startswith("node_lost: train-1-1: node 0")
            assert (bucket / "runs.log").read_text().split() == [job.skypilot_task_ids[0]] * 2
            logs = [m.data.decode() async for m in bus.replay_raw(
                filter_subject=naming.logs_subject_filter("test", "train-1-2"), stream=bus.logs_stream)]
            assert any("resumed from step 1" in line for line in logs)
            await until(lambda: not (naming.state_dir("test") / "clusters" / "train-1-2").exists(), timeout=20,
                        what="the last cluster torn down")
            assert len(await statuses(bus, 1)) == 5
        finally:
            for r in runners:
                r.stop()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
            await rec.close()
            await prov.close()
            await bus.close()

    asyncio.run(main())
