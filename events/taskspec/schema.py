"""JSON Schema of the task model, for editors (yaml-language-server) and for `spz schema task`."""

from __future__ import annotations

from typing import Any


def task_json_schema() -> dict[str, Any]:
    """Draft-07 schema of one task document, as our models accept it.

    Draft-07 (`definitions`, not `$defs`) because every yaml-language-server release reads it;
    the schema uses no keyword that later drafts changed.
    """
    from .task import Task

    schema = Task.model_json_schema(by_alias=True, mode="validation", ref_template="#/definitions/{model}")
    schema = _tidy(schema)
    if "$defs" in schema:
        schema["definitions"] = schema.pop("$defs")
    # Env names are checked by pattern; say so for names that do not match it too.
    schema["properties"]["envs"]["additionalProperties"] = False
    out: dict[str, Any] = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "SkyPilot 0.14.1 task (as accepted by spz)",
        "description": ("One task of a SkyPilot task YAML. Multi-document files are pipelines: "
                        "an optional first document {name, execution} names them."),
    }
    out.update({k: v for k, v in schema.items() if k != "title"})
    return out


def _tidy(node: Any) -> Any:
    """Drop what editors show as noise: null defaults and generated titles."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "default" and value is None:
                continue
            if key == "title" and isinstance(value, str):
                continue
            if key in ("properties", "$defs", "definitions", "patternProperties"):
                out[key] = {name: _tidy(v) for name, v in value.items()}
            else:
                out[key] = _tidy(value)
        return out
    if isinstance(node, list):
        return [_tidy(v) for v in node]
    return node
