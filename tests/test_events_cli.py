"""`spz events tail|replay|schema|dlq` against a real nats-server (SKYPURZA_NATS_URL)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

from nats_fixtures import connect_bus

from skypurza.events.models import PlacementChosen, TaskSubmitted
from skypurza.events.types import Candidate


def spz_env(server, tmp_path) -> dict[str, str]:
    return {**os.environ, "SKYPURZA_NATS_URL": server.url, "SKYPURZA_STAGE": "test",
            "SKYPURZA_HOME": str(tmp_path / "home")}


def spz(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def publish(server, events):
    async def main():
        bus = await connect_bus(server)
        acks = await bus.publish_many(events)
        await bus.close()
        return acks

    return asyncio.run(main())


def test_replay_prints_cloudevents_from_a_sequence_with_filters(nats_server, tmp_path):
    publish(nats_server, [TaskSubmitted(task_id=f"t{i}", cluster="c", task={"run": "x"}) for i in range(5)]
            + [PlacementChosen(task_id="t1", cluster="c", attempt=1, candidate=Candidate(infra="local"))])
    env = spz_env(nats_server, tmp_path)
    res = spz(env, "events", "replay", "-o", "json")
    assert res.returncode == 0, res.stderr
    docs = [json.loads(line) for line in res.stdout.splitlines()]
    assert [d["sequence"] for d in docs] == ["1", "2", "3", "4", "5", "6"]
    assert all(d["specversion"] == "1.0" for d in docs)
    since = [json.loads(x) for x in spz(env, "events", "replay", "--since", "5", "-o", "json").stdout.splitlines()]
    assert [d["sequence"] for d in since] == ["5", "6"]
    typed = [json.loads(x) for x in spz(env, "events", "replay", "--type", "PlacementChosen", "-o", "json").stdout.splitlines()]
    assert [d["type"] for d in typed] == ["io.skypurza.placement_chosen.v1"]
    subj = spz(env, "events", "replay", "--subject", "task/t3").stdout.splitlines()
    assert len(subj) == 1 and "task_submitted" in subj[0]
    bad = spz(env, "events", "replay", "--since", "yesterday-ish")
    assert bad.returncode != 0 and "sequence number" in (bad.stderr + bad.stdout)


def test_tail_follows_new_events_live(nats_server, tmp_path):
    env = spz_env(nats_server, tmp_path)
    publish(nats_server, [TaskSubmitted(task_id="old", cluster="c", task={})])
    proc = subprocess.Popen([sys.executable, "-m", "skypurza.cli.main", "events", "tail", "-o", "json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)  # the tail's consumer exists; it starts at new events only
        publish(nats_server, [TaskSubmitted(task_id="new1", cluster="c", task={}),
                              TaskSubmitted(task_id="new2", cluster="c", task={})])
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        ids = [json.loads(x)["data"]["task_id"] for x in lines]
        assert ids == ["new1", "new2"]
        proc.send_signal(signal.SIGINT)  # Ctrl-C stops following: exit 130, no traceback
        try:
            code = proc.wait(20)
        except subprocess.TimeoutExpired:
            from procdiag import process_report

            raise AssertionError(f"the tail did not stop on Ctrl-C: {process_report(proc.pid)}") from None
        assert code == 130
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)


def test_schema_export(tmp_path):
    env = {**os.environ, "SKYPURZA_HOME": str(tmp_path / "home")}
    res = spz(env, "events", "schema", "--list")
    assert "io.skypurza.usage_recorded.v1" in res.stdout.split()
    one = json.loads(spz(env, "events", "schema", "TaskSubmitted").stdout)
    assert one["properties"]["type"] == {"const": "io.skypurza.task_submitted.v1"}
    out = tmp_path / "all.json"
    assert spz(env, "events", "schema", "-o", str(out)).returncode == 0
    assert len(json.loads(out.read_text())) >= 15
    assert spz(env, "events", "schema", "NoSuchEvent").returncode != 0
