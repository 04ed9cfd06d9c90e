"""An internal event as outsiders read it: CloudEvents 1.0, structured mode, JSON (pure).

The attributes are the event's own (`id`, `source`, `type`, `subject`, `time`), so a consumer
de-duplicates on (`source`, `id`) across republishes; `data` is the event without what is not
public (the task's body, which holds its commands and environment, and the secrets' key);
extension attributes: `spzuser` and `spzteam` (the owner an API server authenticated, when
known) and `sequence` (the log's stream sequence, as a string: outsiders order and resume by it).
"""

from __future__ import annotations

import json
from typing import Any

from skypurza.events import naming
from skypurza.events.envelope import Envelope
from skypurza.events.identity_events import EXT_TEAM, EXT_USER

CONTENT_TYPE = "application/cloudevents+json"  # the NATS binding's structured-mode header
EXT_SEQUENCE = "sequence"
# Never public, whichever event carries them.
PRIVATE_FIELDS = frozenset({"task", "secrets_key", "initial_blocks", "managed_task_ids"})
MAX_EXT_CHARS = 63  # = the principal-name bound: an extension value stays short


def public_data(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in PRIVATE_FIELDS}


def to_cloudevent(env: Envelope, seq: int, owner: tuple[str, str | None] | None) -> dict[str, Any]:
    """The structured-mode event: the required and the optional attributes, `data`, extensions."""
    out: dict[str, Any] = {
        "specversion": "1.0", "id": env.id, "source": env.source, "type": env.type, "subject": env.subject,
        "time": env.time.isoformat().replace("+00:00", "Z"), "datacontenttype": "application/json",
        "data": public_data(dict(env.data)), EXT_SEQUENCE: str(int(seq)),
    }
    if owner is not None:
        user, team = owner
        if user:
            out[EXT_USER] = user[:MAX_EXT_CHARS]
        if team:
            out[EXT_TEAM] = team[:MAX_EXT_CHARS]
    return out


def encode(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":"), sort_keys=True, default=str).encode()


def public_subject_of(stage: str, env: Envelope) -> str:
    """`skypurza.<stage>.public.<aggregate>.<id>.<event_type>` from the envelope's `aggregate/id`."""
    aggregate, _, agg_id = env.subject.partition("/")
    return naming.public_subject(stage, aggregate, agg_id or "-", env.event_name)
