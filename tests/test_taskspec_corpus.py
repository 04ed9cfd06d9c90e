"""The task YAML corpus: every valid file loads, every invalid file fails with exactly the
expected problems, valid files round-trip, and every verdict agrees with SkyPilot 0.14.1.

Agreement with SkyPilot: its own JSON Schemas (skypilot-0.14.1-schemas.json, as data) are run
with the `jsonschema` package the way SkyPilot runs them (task schema on the document,
resources schema on `resources` after the `gpus` alias, storage schema on storage mounts,
service schema on `service`/`pool`). Where SkyPilot rejects beyond its schema (at load or launch
time), the invalid file's `.expected.json` says why; where we accept what SkyPilot does not
(our own `infra: local`), the valid file says so in a `# spz-extension:` header.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import ValidationError as SchemaError
from jsonschema import validators

from skypurza.events.taskspec import Task, TaskSpecError, load_tasks

CORPUS = Path(__file__).parent / "taskspec_corpus"
VALID = sorted((CORPUS / "valid").glob("*.yaml"))
INVALID = sorted((CORPUS / "invalid").glob("*.yaml"))
# SkyPilot 0.14.1's own JSON Schemas, kept as a fixture (the suite runs from a plain clone).
SCHEMAS_FILE = Path(__file__).resolve().parent / "fixtures" / "skypilot-0.14.1-schemas.json"


def _name(p: Path) -> str:
    return p.stem


def test_corpus_is_large_enough() -> None:
    assert len(VALID) + len(INVALID) >= 60
    assert len(VALID) >= 40 and len(INVALID) >= 30
    for path in INVALID:
        assert path.with_suffix(".expected.json").exists(), path


@pytest.mark.parametrize("path", VALID, ids=_name)
def test_valid_file_loads(path: Path) -> None:
    loaded = load_tasks(path)
    assert loaded.tasks
    for task in loaded.tasks:
        assert task.resource_requests()  # every valid task expands to at least one request


@pytest.mark.parametrize("path", INVALID, ids=_name)
def test_invalid_file_gives_exactly_the_expected_problems(path: Path) -> None:
    expected = json.loads(path.with_suffix(".expected.json").read_text())
    with pytest.raises(TaskSpecError) as info:
        load_tasks(path)
    got = []
    for p in info.value.problems:
        assert p.file == str(path)
        item = {"line": p.line, "column": p.column, "path": p.path, "message": p.message}
        if p.document is not None:
            item["document"] = p.document
        got.append(item)
    assert got == expected["errors"]


@pytest.mark.parametrize("path", VALID, ids=_name)
def test_valid_file_round_trips(path: Path) -> None:
    """parse -> model -> dump -> parse gives the same model (templates, forms and all)."""
    first = load_tasks(path)
    for task in first.tasks:
        dumped = yaml.safe_dump(task.to_yaml_dict(), sort_keys=False)
        again = load_tasks(dumped).tasks
        assert len(again) == 1
        assert again[0] == task
        assert again[0].to_yaml_dict() == task.to_yaml_dict()
        assert again[0].resource_requests() == task.resource_requests()
        # The plain dict is also accepted directly by the model.
        assert Task.model_validate(task.to_yaml_dict()) == task


# ------------------------------------------------------------------ SkyPilot 0.14.1's schemas

def _case_insensitive_enum(validator: Any, enums: list[str], instance: Any, schema: Any) -> Any:
    if isinstance(instance, str) and instance.lower() not in {e.lower() for e in enums}:
        yield SchemaError(f"{instance!r} is not one of {enums} (any case)")


def _case_sensitive_enum(validator: Any, enums: list[str], instance: Any, schema: Any) -> Any:
    if isinstance(instance, str) and instance not in enums:
        yield SchemaError(f"{instance!r} is not one of {enums}")


@pytest.fixture(scope="module")
def skypilot() -> dict[str, Any]:
    """SkyPilot's validators, with its two custom keywords (case_(in)sensitive_enum)."""
    schemas = json.loads(SCHEMAS_FILE.read_text())
    out = {}
    for name, schema in schemas.items():
        base = validators.validator_for(schema)
        cls = validators.extend(base, {"case_insensitive_enum": _case_insensitive_enum,
                                       "case_sensitive_enum": _case_sensitive_enum})
        cls.check_schema(schema)
        out[name] = cls(schema)
    return out


def _alias_gpus(d: Any) -> Any:
    # resources.py RESOURCE_CONFIG_ALIASES: `gpus` is renamed `accelerators` before validation.
    if isinstance(d, dict) and "gpus" in d:
        d = dict(d)
        value = d.pop("gpus")
        d.setdefault("accelerators", value)
    return d


def skypilot_schema_errors(v: dict[str, Any], text: str) -> list[str]:
    """The schema errors SkyPilot 0.14.1's loader would raise for this file (empty: accepted)."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        return [f"YAML: {exc}"]
    if docs and isinstance(docs[0], dict) and "name" in docs[0]:
        keys = set(docs[0])
        if (docs[0].get("execution") == "parallel") or (keys <= {"name", "execution"} and (len(docs) > 1 or keys == {"name"})):
            docs = docs[1:]  # a pipeline / job group header, not a task
    errors: list[str] = []
    for doc in docs:
        if not isinstance(doc, dict):
            errors.append("a task document must be a mapping")
            continue
        doc = dict(doc)
        if isinstance(doc.get("envs"), dict):  # Task.from_yaml_config str()s env values first
            doc["envs"] = {str(k): (None if val is None else str(val)) for k, val in doc["envs"].items()}
        errors += [e.message for e in v["get_task_schema"].iter_errors(doc)]
        res = doc.get("resources")
        if isinstance(res, dict):
            res = _alias_gpus(res)
            for key in ("any_of", "ordered"):
                if isinstance(res.get(key), list):
                    res[key] = [_alias_gpus(x) for x in res[key]]
            errors += [e.message for e in v["get_resources_schema"].iter_errors(res)]
        for mount in (doc.get("file_mounts") or {}).values() if isinstance(doc.get("file_mounts"), dict) else []:
            if isinstance(mount, dict):
                errors += [e.message for e in v["get_storage_schema"].iter_errors(mount)]
        for key in ("service", "pool"):
            if isinstance(doc.get(key), dict):
                errors += [e.message for e in v["get_service_schema"].iter_errors(doc[key])]
    return errors


@pytest.mark.parametrize("path", VALID, ids=_name)
def test_valid_file_agrees_with_skypilot(path: Path, skypilot: dict[str, Any]) -> None:
    text = path.read_text()
    errors = skypilot_schema_errors(skypilot, text)
    if text.startswith("# spz-extension:"):
        assert errors, f"{path.name} is marked as an spz extension but SkyPilot accepts it"
    else:
        assert errors == []


@pytest.mark.parametrize("path", INVALID, ids=_name)
def test_invalid_file_agrees_with_skypilot(path: Path, skypilot: dict[str, Any]) -> None:
    verdict = json.loads(path.with_suffix(".expected.json").read_text())["skypilot"]
    errors = skypilot_schema_errors(skypilot, path.read_text())
    if verdict["schema"] == "rejects":
        assert errors, f"SkyPilot's schema accepts {path.name}"
    else:
        # SkyPilot's schema lets it through; its loader (or launch-time validation) rejects it.
        assert verdict["schema"] == "accepts" and verdict["rejected_by_skypilot"]
        assert errors == []


def test_our_json_schema_accepts_every_valid_document() -> None:
    from jsonschema import Draft7Validator

    from skypurza.events.taskspec import task_json_schema

    schema = task_json_schema()
    assert "$defs" not in json.dumps(schema)  # draft-07: every yaml-language-server reads it
    Draft7Validator.check_schema(schema)
    validator = Draft7Validator(schema)
    for path in VALID:
        for task in load_tasks(path).tasks:
            assert list(validator.iter_errors(task.to_yaml_dict())) == [], path.name
    # ... and it refuses what the models refuse at the type level.
    assert list(validator.iter_errors({"runn": "echo"}))
    assert list(validator.iter_errors({"resources": {"spot_recovery": "FAILOVER"}}))
    assert list(validator.iter_errors({"resources": {"use_spot": "yes"}}))
    assert list(validator.iter_errors({"envs": {"1BAD": "x"}}))
