"""`spz jobs launch|queue|cancel|logs` against a real bus, with the real recovery service and
the other services played by publishing their events (managed_fixtures.Background)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from managed_fixtures import Background
from typer.testing import CliRunner

from skypurza.cli.main import app

PIPELINE = """\
name: pipe
---
name: prep
run: echo prep
---
name: train
secrets:
  TOKEN: hush-hush-value
run: echo train
"""


@pytest.fixture
def cli(nats_server, spz_home, monkeypatch):
    monkeypatch.setenv("SKYPURZA_NATS_URL", nats_server.url)
    monkeypatch.setenv("SKYPURZA_STAGE", "test")
    monkeypatch.setenv("SKYPURZA_USER", "alice")
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args), catch_exceptions=False)

    return invoke


def _secrets(url: str, key: str, cluster: str) -> dict[str, str]:
    import asyncio

    from skypurza.events.bus import Bus

    async def read() -> dict[str, str]:
        bus = await Bus.connect(url, "test", source="/tests/secrets")
        try:
            return await bus.get_secrets(key, cluster, legacy=False, attempts=1)
        finally:
            await bus.close()

    return asyncio.run(read())


def queue(cli) -> list[dict]:
    result = cli("jobs", "queue", "-a", "-o", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_launch_queue_logs_and_a_pipeline(cli, nats_server, tmp_path: Path):
    task = tmp_path / "train.yaml"
    task.write_text("name: train\nresources:\n  use_spot: true\nrun: python train.py\n")
    pipe = tmp_path / "pipe.yaml"
    pipe.write_text(PIPELINE)
    with Background(nats_server.url) as bg:
        # Streams the job's output to the end; the exit status is the job's.
        result = cli("jobs", "launch", str(task), "-y", "--job-recovery", "FAILOVER", "--cpus", "4+")
        assert result.exit_code == 0, result.output
        assert "Managed job 1 (train) submitted." in result.output
        assert "── launch 1: cluster train-1-1 ──" in result.output
        assert "hello from train-1-1 as sky-managed-" in result.output
        submitted = bg.stand.submitted[0]
        assert submitted.task.resources.to_dict() == {"use_spot": True, "job_recovery": "FAILOVER", "cpus": "4+"}

        result = cli("jobs", "launch", str(pipe), "-n", "etl", "-y", "--detach-run")
        assert result.exit_code == 0, result.output
        assert "Managed job 2 (etl) submitted." in result.output
        result = cli("jobs", "logs", "2")  # follows until the pipeline ends
        assert result.exit_code == 0, result.output
        assert "── launch 1: cluster etl-2-1 ──" in result.output and "── launch 2: cluster etl-2-2 ──" in result.output
        assert "_etl_prep_2-0" in result.output and "_etl_train_2-1" in result.output
        names = [t.task.name for t in bg.stand.submitted if t.managed_job_id == 2]
        assert names == ["prep", "train"]
        # Each task's launch carries every task id of the pipeline, in order (SKYPILOT_TASK_IDS),
        # and the first job on its cluster gets them.
        from skypurza.events.models import JobQueued
        from skypurza.services.provisioner.plan import job_fields

        pipeline = [t for t in bg.stand.submitted if t.managed_job_id == 2]
        ids = [t.skypilot_task_id for t in pipeline]
        assert all(t.managed_task_ids == ids for t in pipeline) and len(set(ids)) == 2
        assert JobQueued(cluster="x", job_id=1, **job_fields(pipeline[1])).managed_task_ids == ids
        # The secret's value is not in the log, only its name; it went to the secrets store.
        train = [t for t in bg.stand.submitted if t.managed_job_id == 2][1]
        assert train.task.secrets == {"TOKEN": None} and train.secrets_key.endswith("-1")
        # The recovery service copied them under the launch's cluster, the one key its agent's
        # own bus user may read; the task without secrets names none.
        assert _secrets(nats_server.url, train.secrets_key, train.cluster) == {"TOKEN": "hush-hush-value"}
        assert train.cluster == "etl-2-2"
        assert [t for t in bg.stand.submitted if t.managed_job_id == 2][0].secrets_key is None

        rows = {r["id"]: r for r in queue(cli)}
        assert {k: rows[1][k] for k in ("id", "name", "status", "recoveries", "cluster")} == {
            "id": 1, "name": "train", "status": "SUCCEEDED", "recoveries": 0, "cluster": "train-1-1"}
        assert (rows[2]["status"], rows[2]["num_tasks"], rows[2]["task_index"], rows[2]["cluster"]) == (
            "SUCCEEDED", 2, 1, "etl-2-2")
        result = cli("jobs", "logs", "1", "--no-follow")
        assert result.exit_code == 0 and "hello from train-1-1" in result.output
        table = cli("jobs", "queue")
        assert table.exit_code == 0 and "etl" in table.output and "SUCCEEDED" in table.output


def test_cancel_by_id_name_and_all(cli, nats_server, tmp_path: Path):
    with Background(nats_server.url, default="hold"):
        for name in ("a", "a", "b", "c"):
            result = cli("jobs", "launch", "echo", "hi", "-n", name, "-y", "-d")
            assert result.exit_code == 0, result.output
        result = cli("jobs", "cancel", "1", "-y")
        assert result.exit_code == 0 and "Managed job 1: CANCELLED." in result.output
        assert cli("jobs", "cancel", "1", "-y").output.startswith("Managed job 1 already ended (CANCELLED).")
        result = cli("jobs", "cancel", "-n", "a", "-y")
        assert result.exit_code == 0 and "Managed job 2: CANCELLED." in result.output
        assert cli("jobs", "cancel", "9", "-y").exit_code == 1
        assert cli("jobs", "cancel").exit_code == 1  # nothing chosen
        result = cli("jobs", "cancel", "--all", "-y")
        assert "Managed job 3: CANCELLED." in result.output and "Managed job 4: CANCELLED." in result.output
        assert {r["status"] for r in queue(cli)} == {"CANCELLED"}
        result = cli("jobs", "logs", "4")
        assert result.exit_code == 103  # the exit status of a cancelled job


def test_launch_refuses_bad_input(cli, tmp_path: Path):
    pipe = tmp_path / "pipe.yaml"
    pipe.write_text(PIPELINE)
    result = cli("jobs", "launch", str(pipe), "--gpus", "A100", "-y")
    assert result.exit_code == 1 and "pipeline of 2 tasks" in result.output
    result = cli("jobs", "launch", "echo hi", "--job-recovery", "SOMETIMES", "-y")
    assert result.exit_code == 1 and "unknown recovery strategy" in result.output
