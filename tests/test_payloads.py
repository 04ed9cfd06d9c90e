"""The task payloads and failover blocks as typed models (events/payloads.py): every stored event
still reads and writes back the same, unknown keys survive a re-publish, and a bad payload is
refused at the edge naming the key — on a real bus, where the service parks it and goes on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from ledger_history import scripted
from nats_fixtures import connect_bus
from pydantic import ValidationError
from replay_history import OPTIMIZER_CASES, RECOVERY_CASES

from skypurza.events import deadletters, naming
from skypurza.events.envelope import PoisonEvent, decode, make_envelope, split_type
from skypurza.events.models import JobQueued, ManagedJobSubmitted, PlacementChosen, TaskSubmitted
from skypurza.events.payloads import FailoverBlock, StorageMount, TaskPayload
from skypurza.events.registry import REGISTRY
from skypurza.events.service import ServiceRunner
from skypurza.events.taskspec import load_tasks
from skypurza.services.optimizer.decide import initial_blocks
from skypurza.services.optimizer.service import OptimizerService
from skypurza.services.provisioner.plan import job_fields
from skypurza.services.recovery.buckets import checkpoint_buckets
from skypurza.services.recovery.strategy import pin_region

TESTS = Path(__file__).parent
GOLDEN = TESTS / "golden" / "events.jsonl"
CORPUS = sorted((TESTS / "taskspec_corpus" / "valid").glob("*.yaml"))
WITH_PAYLOADS = (TaskSubmitted, JobQueued, ManagedJobSubmitted)


def _stored(lines: list[bytes]) -> list[tuple[bytes, dict[str, Any]]]:
    """(bytes, data) of each stored event of a type that carries a task, at its current version."""
    out = []
    for line in lines:
        doc = json.loads(line)
        name, version = split_type(doc.get("type", ""))
        cls = REGISTRY.get(name)
        if cls in WITH_PAYLOADS and version == cls.VERSION:
            out.append((line, doc["data"]))
    return out


def _logs() -> dict[str, list[bytes]]:
    return {
        "golden log": [line for line in GOLDEN.read_bytes().splitlines() if line.strip()],
        "ledger history": scripted().lines(),
        "replay cases": [make_envelope(c.submitted, source="/t").to_json()
                         for c in [*OPTIMIZER_CASES.values(), *RECOVERY_CASES.values()]],
    }


@pytest.mark.parametrize("log", ["golden log", "ledger history", "replay cases"])
def test_every_stored_task_decodes_into_the_models_and_writes_back_the_same(log: str) -> None:
    stored = _stored(_logs()[log])
    assert stored, f"the {log} has no task-bearing event"
    kinds: set[type] = set()
    for line, data in stored:
        decoded = decode(line)
        ev = decoded.event
        assert decoded.status == "ok" and isinstance(ev, WITH_PAYLOADS), line
        kinds.add(type(ev))
        for task in ev.tasks if isinstance(ev, ManagedJobSubmitted) else [ev.task]:
            assert isinstance(task, TaskPayload)
        if isinstance(ev, TaskSubmitted):
            assert all(isinstance(b, FailoverBlock) for b in ev.initial_blocks)
        # Re-serialised (as a re-publish does): the same JSON readers saw, key for key (an event
        # stored before a field was added gains that field's default; its payloads gain nothing).
        for written in (ev.model_dump(mode="json"), json.loads(make_envelope(ev, source="/again").to_json())["data"]):
            assert {k: written[k] for k in data} == data
            assert {k: written[k] for k in ("task", "tasks", "initial_blocks") if k in written} == {
                k: data[k] for k in ("task", "tasks", "initial_blocks") if k in data}
        assert decode(make_envelope(ev, source="/again").to_json()).event == ev
    if log == "golden log":
        assert kinds == set(WITH_PAYLOADS)


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_every_task_the_cli_writes_is_a_payload_byte_for_byte(path: Path) -> None:
    """What `spz launch` / `spz jobs launch` put in the log (`Task.public_dict()`) for each task of
    the corpus validates, and dumps to the same JSON text (key order included)."""
    for task in load_tasks(path).tasks:
        public = task.public_dict()
        event = TaskSubmitted(task_id="t", cluster="c", task=public)
        assert json.dumps(event.task.to_dict()) == json.dumps(public)
        env = make_envelope(event, source="/cli")
        assert json.dumps(json.loads(env.to_json())["data"]["task"]) == json.dumps(public)


def test_a_payload_with_an_unknown_key_survives_every_re_publish() -> None:
    task = {"name": "train", "run": "python train.py", "x_future": {"nested": [1, 2]},
            "resources": {"accelerators": "A10G:1", "x_res": "kept", "any_of": [{"use_spot": True, "x_alt": 3}]},
            "file_mounts": {"/ckpt": {"store": "s3", "x_mount": True}}}
    block = {"scope": "region", "infra": "aws", "region": "us-east-1", "zone": None, "instance_type": None,
             "use_spot": None, "quota_class": None, "error_class": "preempted", "x_block": "kept"}
    sub = TaskSubmitted(task_id="t", cluster="c", task=task, initial_blocks=[block])
    assert sub.task.x_future == {"nested": [1, 2]} and sub.task.resources.x_res == "kept"
    # Through the log and back.
    back = decode(make_envelope(sub, source="/t").to_json()).event
    assert back.task.to_dict() == task and back.initial_blocks[0].to_dict() == block
    # The provisioner's first job on the new cluster carries the task on.
    queued = decode(make_envelope(JobQueued(cluster="c", job_id=1, **job_fields(back)), source="/p").to_json()).event
    assert queued.task.to_dict() == task
    # Recovery's launches edit the task (pin a region, name checkpoint buckets): the rest stays.
    pinned = pin_region(back.task, "aws", "us-east-1")
    named, buckets = checkpoint_buckets(pinned, "dev", 7)
    out = named.to_dict()
    assert buckets == {"/ckpt": naming.bucket("dev", "job7-ckpt")}
    assert out["x_future"] == {"nested": [1, 2]} and out["resources"]["x_res"] == "kept"
    assert out["resources"]["any_of"] == [{"use_spot": True, "x_alt": 3}]
    assert out["file_mounts"]["/ckpt"] == {"store": "s3", "x_mount": True, "name": buckets["/ckpt"]}
    assert out["resources"]["infra"] == "aws/us-east-1"
    # The optimizer reads the block's known keys; the unknown one does not get in its way.
    assert [b.region for b in initial_blocks(back)] == ["us-east-1"]


def test_defaults_are_not_written_and_nulls_given_are() -> None:
    """A payload dumps the keys it was given: no `num_nodes: null` appears from nowhere, and a block
    keeps the nulls it was written with."""
    sub = TaskSubmitted(task_id="t", cluster="c", task={"run": "x"},
                        initial_blocks=[FailoverBlock(scope="infra", infra="aws", zone=None)])
    data = sub.model_dump(mode="json")
    assert data["task"] == {"run": "x"}
    assert data["initial_blocks"] == [{"scope": "infra", "infra": "aws", "zone": None}]
    assert TaskPayload.model_validate({"run": "x"}).nodes() == 1
    assert TaskPayload.model_validate({"resources": {"labels": {"team": "ml"}}}).labels() == {"team": "ml"}


BAD = [
    # (the task, the key the error must name)
    ({"num_nodes": "two"}, "task.num_nodes"),
    ({"num_nodes": True}, "task.num_nodes"),  # strict: a bool is not a node count
    ({"num_nodes": 5000}, "task.num_nodes"),  # past limits.MAX_NODES
    ({"run": ["echo", "x"]}, "task.run"),
    ({"name": "n" * 1000}, "task.name"),  # past limits.MAX_TASK_NAME_CHARS
    ({"envs": {"A": 1}}, "task.envs.A"),
    ({"secrets": {"TOKEN": "hunter2"}}, "task.secrets"),  # a secret value never enters the log
    ({"resources": {"use_spot": "yes"}}, "task.resources.use_spot"),
    ({"resources": {"labels": {"team": 7}}}, "task.resources.labels.team"),
    ({"resources": {"any_of": [{"cpus": 2}, {"accelerators": 8}]}}, "task.resources.any_of.1.accelerators"),
    ({"resources": {"job_recovery": {"max_restarts_on_errors": -1}}}, "task.resources.job_recovery"),
    ({"file_mounts": {"/d": 3}}, "task.file_mounts./d"),
    ("not a mapping", "task"),
]


@pytest.mark.parametrize("task,where", BAD, ids=[w for _, w in BAD])
def test_a_bad_payload_is_refused_where_the_event_is_built_naming_the_key(task: Any, where: str) -> None:
    with pytest.raises(ValidationError) as info:
        TaskSubmitted(task_id="t", cluster="c", task=task)
    locs = {".".join(str(p) for p in e["loc"]) for e in info.value.errors()}
    assert any(loc == where or loc.startswith(where + ".") for loc in locs), locs


def test_bad_blocks_and_managed_tasks_are_refused_naming_the_key() -> None:
    with pytest.raises(ValidationError) as info:
        TaskSubmitted(task_id="t", cluster="c", task={}, initial_blocks=[{"scope": "planet", "infra": "aws"}])
    assert [e["loc"] for e in info.value.errors()] == [("initial_blocks", 0, "scope")]
    with pytest.raises(ValidationError) as info:
        ManagedJobSubmitted(managed_job_id=1, name="mj", tasks=[{"run": "x"}, {"num_nodes": "2"}])
    assert [e["loc"] for e in info.value.errors()] == [("tasks", 1, "num_nodes")]
    with pytest.raises(ValidationError):
        StorageMount.model_validate({"store": 3})


def _with_task(good: bytes, task: Any) -> bytes:
    doc = json.loads(good)
    doc["data"]["task"] = task
    return json.dumps(doc).encode()


def test_a_stored_bad_payload_is_poison_and_the_message_names_the_key() -> None:
    good = make_envelope(TaskSubmitted(task_id="t", cluster="c", task={"run": "x"}), source="/t").to_json()
    with pytest.raises(PoisonEvent) as info:
        decode(_with_task(good, {"run": "x", "num_nodes": "2"}))
    assert "task.num_nodes" in str(info.value)
    with pytest.raises(PoisonEvent) as info:
        decode(_with_task(good, {"resources": {"labels": {"team": ["ml"]}}}))
    assert "task.resources.labels.team" in str(info.value)


def test_the_optimizer_parks_a_bad_payload_and_places_the_next_task(nats_server) -> None:
    """On a real bus: a TaskSubmitted whose task does not validate (published raw, as an old or
    foreign writer could) is parked with the key in the error, and the next task is placed."""

    async def main():
        bus = await connect_bus(nats_server)
        runner = ServiceRunner(bus, OptimizerService(enabled=frozenset({"aws"})))
        running = asyncio.create_task(runner.run())
        try:
            bad = make_envelope(TaskSubmitted(task_id="bad", cluster="cb", task={"run": "x"}), source="/t")
            raw = _with_task(bad.to_json(), {"run": "x", "num_nodes": "two"})
            await bus.js.publish(naming.event_subject("test", "task", "bad", TaskSubmitted.EVENT_NAME), raw,
                                 headers={"Nats-Msg-Id": bad.id})
            await bus.publish(TaskSubmitted(task_id="good", cluster="cg", task={
                "resources": {"accelerators": "V100:1", "infra": "aws"}, "run": "nvidia-smi"}))
            placed: list[Any] = []
            letters: list[dict[str, Any]] = []
            for _ in range(300):
                placed = [s.event async for s in bus.replay(
                    filter_subject=naming.aggregate_subjects("test", "task", "good"))
                    if isinstance(s.event, PlacementChosen)]
                letters = await deadletters.dead_letters(bus)
                if placed and letters:
                    break
                await asyncio.sleep(0.05)
            assert placed and placed[0].candidate.accelerators == {"V100": 1.0}
            assert [d["event_id"] for d in letters] == [bad.id]
            assert "task.num_nodes" in letters[0]["error"], letters[0]
            bad_history = [s async for s in bus.replay(filter_subject=naming.aggregate_subjects("test", "task", "bad"))]
            assert all(not isinstance(s.event, PlacementChosen) for s in bad_history)
        finally:
            runner.stop()
            await running
            await bus.close()

    asyncio.run(main())
