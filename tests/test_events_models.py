"""The events package: envelope, registry, derived ids, upcasting, schemas, docs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skypurza.events import naming
from skypurza.cli.contracts import all_contracts
from skypurza.events.docgen import NO_EMITTER, render, roles
from skypurza.events.envelope import (REGISTRY, UPCASTERS, Event, PoisonEvent, decode, derive_id, make_envelope,
                                      register, upcaster)
from skypurza.events.models import PlacementChosen, TaskSubmitted, all_event_types
from skypurza.events.schemas import event_schemas
from skypurza.events.types import Candidate

ROOT = Path(__file__).resolve().parent.parent

REQUIRED = {"TaskSubmitted", "PlacementChosen", "PlacementFailed", "CapacityError", "ClusterProvisioned",
            "ProvisionFailed", "DownRequested", "ClusterTerminated", "JobQueued", "JobStarted", "JobSucceeded",
            "JobFailed", "JobCancelled", "SpotPreempted", "UsageRecorded"}


def test_required_event_types_exist_and_are_frozen_cloudevents():
    names = {c.__name__ for c in all_event_types()}
    assert REQUIRED <= names
    ev = TaskSubmitted(task_id="t1", cluster="c", task={"run": "x"})
    with pytest.raises(Exception):
        ev.cluster = "other"  # frozen
    env = make_envelope(ev, source="/test")
    doc = json.loads(env.to_json())
    assert set(doc) >= {"specversion", "id", "source", "type", "time", "subject", "datacontenttype", "data"}
    assert doc["specversion"] == "1.0" and doc["type"] == "io.skypurza.task_submitted.v1"
    assert doc["subject"] == "task/t1" and doc["datacontenttype"] == "application/json"
    back = decode(env.to_json())
    assert back.status == "ok" and back.event == ev


def test_decoding_our_own_events_takes_the_single_pass_path():
    env = make_envelope(TaskSubmitted(task_id="t1", cluster="c", task={"run": "x"}), source="/t")
    got = decode(env.to_json())
    assert got.status == "ok" and isinstance(got.envelope.data, TaskSubmitted)  # typed envelope
    assert got.envelope.data_dict() == env.data and got.envelope.to_json() == env.to_json()
    # A payload the fast path cannot take still decodes (foreign key order), or is reported.
    reordered = json.dumps({"data": env.data, **{k: v for k, v in json.loads(env.to_json()).items() if k != "data"}})
    slow = decode(reordered.encode())
    assert slow.status == "ok" and slow.event == got.event and isinstance(slow.envelope.data, dict)


def test_derived_ids_are_deterministic_and_distinct():
    a = derive_id("cause-1", "optimizer", "attempt-1")
    assert a == derive_id("cause-1", "optimizer", "attempt-1")
    assert len({a, derive_id("cause-2", "optimizer", "attempt-1"), derive_id("cause-1", "provisioner", "attempt-1"),
                derive_id("cause-1", "optimizer", "attempt-2")}) == 4


def test_derived_ids_are_the_version_5_uuids_they_always_were():
    """derive_id is built without the UUID object (issue 21): it must stay uuid5's text, or a
    redelivered cause would publish a new id (a duplicate JetStream no longer drops)."""
    import uuid

    from skypurza.events.envelope import _ID_NAMESPACE

    assert derive_id("cause-1", "optimizer", "attempt-1") == \
        str(uuid.uuid5(uuid.UUID("5b1f3c52-7a0e-4d7b-9a57-6b1d2f0c9e11"), "cause-1|optimizer|attempt-1"))
    for cause, handler, key in [("", "", ""), ("é☃", "/optimizer", "attempt-2"), ("x" * 300, "h|i", "k|")]:
        got = derive_id(cause, handler, key)
        assert got == str(uuid.uuid5(_ID_NAMESPACE, f"{cause}|{handler}|{key}"))
        assert uuid.UUID(got).version == 5


def test_unknown_newer_and_poison():
    env = make_envelope(TaskSubmitted(task_id="t", cluster="c", task={}), source="/t")
    unknown = env.model_copy(update={"type": "io.skypurza.brand_new.v1"})
    assert decode(unknown.to_json()).status == "unknown"
    foreign = env.model_copy(update={"type": "com.example.other"})
    assert decode(foreign.to_json()).status == "unknown"
    newer = env.model_copy(update={"type": "io.skypurza.task_submitted.v7"})
    assert decode(newer.to_json()).status == "newer"
    with pytest.raises(PoisonEvent):
        decode(b"\xff\xfe")
    with pytest.raises(PoisonEvent):
        decode(env.model_copy(update={"data": {"task_id": "t"}}).to_json())


def test_upcaster_chain_runs_before_validation():
    @register
    class RenamedThing(Event):
        EVENT_NAME = "test_renamed_thing"
        VERSION = 3
        AGGREGATE = "test"
        AGGREGATE_KEY = "thing_id"
        thing_id: str
        cost_micros: int

    @upcaster("test_renamed_thing", 1)
    def v1_v2(d):
        return {"thing_id": d["id"], "cost_usd": d["cost_usd"]}

    @upcaster("test_renamed_thing", 2)
    def v2_v3(d):
        return {"thing_id": d["thing_id"], "cost_micros": round(d["cost_usd"] * 1_000_000)}

    try:
        env = make_envelope(RenamedThing(thing_id="x", cost_micros=1), source="/t")
        old = env.model_copy(update={"type": "io.skypurza.test_renamed_thing.v1", "data": {"id": "x", "cost_usd": 1.5}})
        got = decode(old.to_json())
        assert got.status == "ok" and got.event == RenamedThing(thing_id="x", cost_micros=1_500_000)
    finally:
        REGISTRY.pop("test_renamed_thing")
        UPCASTERS.pop(("test_renamed_thing", 1))
        UPCASTERS.pop(("test_renamed_thing", 2))


def test_every_upcaster_chain_reaches_the_latest_version():
    for cls in all_event_types():
        for v in range(1, cls.VERSION):
            assert (cls.EVENT_NAME, v) in UPCASTERS, f"{cls.__name__}: no upcaster from v{v}"


def test_event_schemas_cover_every_type_and_validate_real_events():
    import jsonschema
    schemas = event_schemas()
    assert set(schemas) == {c.type_name() for c in all_event_types()}
    env = make_envelope(PlacementChosen(task_id="t", cluster="c", attempt=1, candidate=Candidate(infra="aws")),
                        source="/t")
    jsonschema.validate(json.loads(env.to_json()), schemas["io.skypurza.placement_chosen.v1"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**json.loads(env.to_json()), "type": "io.skypurza.other.v1"},
                            schemas["io.skypurza.placement_chosen.v1"])


def test_docs_events_md_is_generated_and_complete():
    contracts = all_contracts()
    silent = [name for name, (emit, _) in roles(contracts).items() if emit == NO_EMITTER]
    assert not silent, f"no contract declares that it emits {silent} (events/contract.py)"
    assert (ROOT / "docs" / "events.md").read_text() == render(contracts), \
        "docs/events.md is stale: python -m skypurza.cli.contracts > docs/events.md"


def test_naming_shapes():
    assert naming.name("dev", "ledger", "projections") == "skypurza-dev-ledger-projections"
    assert naming.status_db_file("dev").name == "skypurza-dev-status-projections.duckdb"
    assert naming.status_db_file("dev").parent == naming.projections_file("dev").parent
    assert naming.events_stream("prod") == "skypurza-prod-bus-events"
    assert naming.event_subject("dev", "cluster", "my.cluster", "job_queued") == \
        "skypurza.dev.evt.cluster.my%2Ecluster.job_queued"
    assert naming.base_tags("dev") == {"Project": "skypurza", "Stage": "dev"}
    with pytest.raises(ValueError):
        naming.name("Bad Stage", "x", "y")


@pytest.mark.parametrize("name_", ["a", "train-1", "my.cluster_2", "A" * 63])
def test_cluster_names_the_cli_and_the_api_accept(name_):
    assert naming.valid_cluster_name(name_)


@pytest.mark.parametrize("name_", ["", "1abc", "abc-", "a.b>c", "a*", "a/b", "a b", "a\n", "a" * 64])
def test_cluster_names_every_edge_refuses(name_):
    assert not naming.valid_cluster_name(name_)


def test_a_generated_cluster_name_is_a_valid_one():
    assert naming.generated_cluster_name("Alice O'Brien", "3f2a") == "spz-3f2a-aliceobrien"
    assert naming.generated_cluster_name("***", "0000") == "spz-0000-user"
    assert naming.valid_cluster_name(naming.generated_cluster_name("x" * 200, "beef"))
