"""JSON Schemas of the events: the envelope with each event's typed `data` (for `spz events schema`)."""

from __future__ import annotations

from typing import Any

from .envelope import Envelope
from .models import all_event_types


def event_schemas() -> dict[str, Any]:
    env = Envelope.model_json_schema()
    out: dict[str, Any] = {}
    for cls in all_event_types():
        data = cls.model_json_schema()
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": cls.__name__,
            "description": (cls.__doc__ or "").strip(),
            "type": "object",
            "required": ["specversion", "id", "source", "type", "time", "subject", "data"],
            "properties": {
                **{k: v for k, v in env["properties"].items() if k != "data"},
                "type": {"const": cls.type_name()},
                "subject": {"type": "string", "pattern": f"^{cls.AGGREGATE}/"},
                "data": {k: v for k, v in data.items() if k != "$defs"},
            },
        }
        if "$defs" in data:
            schema["$defs"] = data["$defs"]
        out[cls.type_name()] = schema
    return out
