"""The bus's fast envelope (`envelope_of`) and the decoder's cached fast path keep the wire format.

`envelope_of` skips the dump-and-validate round trip of `make_envelope` (issue 21); these tests
hold it to the same bytes, for every event of the golden log (every event type), and check the
edges it must not get wrong: ids, fallbacks, copies with plain data, decoding back.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from skypurza.events.envelope import (
    Envelope, PoisonEvent, decode, envelope_of, envelopes_of, make_envelope, new_id, new_ids,
)
from skypurza.events.models import TaskSubmitted

GOLDEN = Path(__file__).parent / "golden" / "events.jsonl"


def _golden_events():
    out = []
    for line in GOLDEN.read_bytes().splitlines():
        try:
            d = decode(line)
        except PoisonEvent:
            continue
        if d.event is not None:
            out.append(d)
    return out


def test_envelope_of_writes_the_same_bytes_as_make_envelope_for_every_golden_event():
    decoded = _golden_events()
    assert len({type(d.event) for d in decoded}) >= 30  # the golden log covers the event types
    for d in decoded:
        env = d.envelope
        fast = envelope_of(d.event, source=env.source, id=env.id, time=env.time)
        slow = make_envelope(d.event, source=env.source, id=env.id, time=env.time)
        assert fast.to_json() == slow.to_json(), env.type
        assert fast.data_dict() == slow.data_dict()
        back = decode(fast.to_json())
        assert back.status == "ok" and back.event == d.event and back.envelope == fast


def test_envelopes_of_many_writes_each_as_envelope_of_with_its_own_new_id_and_time():
    """The pipelined publish's batch (events of every type, mixed in runs) is `envelope_of` of
    each: the same bytes given the same id and time, every id new, times in order."""
    events = [d.event for d in _golden_events()]
    events = events + events[::-1]  # runs of one type and changes of type both ways
    before = datetime.now(timezone.utc)
    envs = envelopes_of(events, source="/s")
    assert len(envs) == len(events) and len({e.id for e in envs}) == len(envs)
    assert [e.time for e in envs] == sorted(e.time for e in envs) and envs[0].time >= before
    for ev, env in zip(events, envs):
        one = envelope_of(ev, source="/s", id=env.id, time=env.time)
        assert type(env) is type(one) and env.to_json() == one.to_json(), env.type
        assert decode(env.to_json()).event == ev
    assert envelopes_of([], source="/s") == []


def test_times_with_and_without_microseconds_and_other_offsets_serialise_alike():
    ev = TaskSubmitted(task_id="t", cluster="c", task={"run": "x"})
    for t in (datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
              datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=timezone.utc),
              datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2))),
              datetime(2026, 1, 2, 3, 4, 5)):
        assert envelope_of(ev, source="/s", id="i", time=t).to_json() == \
            make_envelope(ev, source="/s", id="i", time=t).to_json()


def test_unexpected_arguments_take_the_validating_path():
    ev = TaskSubmitted(task_id="t", cluster="c", task={"run": "x"})
    env = envelope_of(ev, source="/s", id="i", time="2026-01-02T03:04:05Z")  # type: ignore[arg-type]
    assert type(env) is Envelope and env.time == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    with pytest.raises(ValueError):
        envelope_of(ev, source="/s", id="i", time="not a time")  # type: ignore[arg-type]


def test_new_ids_are_random_version_4_uuids_in_their_usual_form():
    ids = [new_id() for _ in range(2000)] + new_ids(2000) + new_ids(1)
    assert len(set(ids)) == len(ids)
    for s in ids:
        u = uuid.UUID(s)
        assert str(u) == s and u.version == 4 and u.variant == uuid.RFC_4122


def test_a_typed_envelope_copied_with_plain_data_serialises_that_data():
    ev = TaskSubmitted(task_id="t", cluster="c", task={"run": "x"})
    env = envelope_of(ev, source="/s", id="i", time=datetime(2026, 1, 2, tzinfo=timezone.utc))
    data = {**env.data_dict(), "cluster": "other"}
    copy = env.model_copy(update={"type": "io.skypurza.task_submitted.v1", "data": data})
    assert type(copy) is Envelope and copy.data == data
    assert decode(copy.to_json()).event.cluster == "other"
    same = env.model_copy(update={"id": "j"})  # no data given: stays typed
    assert same.id == "j" and same.data is ev and same.to_json() == env.to_json().replace(b'"id":"i"', b'"id":"j"')


def test_the_decoders_fast_path_still_rejects_what_does_not_validate():
    ev = TaskSubmitted(task_id="t", cluster="c", task={"run": "x"})
    good = envelope_of(ev, source="/s", id="i").to_json()
    assert decode(good).status == "ok" and decode(good).event == ev  # twice: the cached path
    bad = good.replace(b'"cluster":"c"', b'"cluster":7')
    with pytest.raises(PoisonEvent):
        decode(bad)
