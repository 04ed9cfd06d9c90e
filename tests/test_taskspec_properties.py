"""Property tests: random mutations of valid task YAMLs never raise anything but TaskSpecError,
and whatever still loads behaves (expands, dumps, round-trips, splits its secrets)."""

from __future__ import annotations

import copy
import datetime
import json
import os
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skypurza.events.taskspec import Task, TaskSpecError, load_tasks

CORPUS = Path(__file__).parent / "taskspec_corpus"
SOURCES = sorted((CORPUS / "valid").glob("*.yaml")) + sorted((CORPUS / "invalid").glob("*.yaml"))
TEXTS = [p.read_text() for p in SOURCES]
DOCS: list[list[Any]] = []
for _text in TEXTS:
    try:
        DOCS.append(list(yaml.safe_load_all(_text)))
    except yaml.YAMLError:
        pass

# SPZ_HYPOTHESIS_EXAMPLES raises the count for a longer bug hunt; the suite runs 200.
SETTINGS = settings(max_examples=int(os.environ.get("SPZ_HYPOTHESIS_EXAMPLES", "200")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

KEYS = ["name", "run", "setup", "envs", "secrets", "resources", "accelerators", "gpus", "infra", "cloud", "region",
        "zone", "cpus", "memory", "any_of", "ordered", "use_spot", "job_recovery", "spot_recovery", "autostop",
        "ports", "disk_size", "file_mounts", "source", "mode", "store", "num_nodes", "workdir", "url", "service",
        "labels", "image_id", "config", "hooks", "execution", "volumes", "_metadata", "strategy"]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 70000), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["A100:8", "a100", "{A100:8, H100:8}", "[A100:8]", "4+", "16GB", "4x", "aws/us-east-1",
                     "k8s/ctx/x", "*", "${VAR}", "$HOME", "8000-8010", "10m", "FAILOVER", "MOUNT", "s3://b/k",
                     "", "none", "tpu-v4-8", "A100:0", "A100:-1", "nvme:100+", "~/sky_workdir", "/x/"]),
    st.text(max_size=12),
    st.dates(),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6), st.integers(0, 3)),
                                            inner, max_size=3)),
    max_leaves=8,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, prefix + (i,))
    return out


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        node = node[p]
    return node


def _mutate(doc: Any, data: st.DataObject) -> Any:
    doc = copy.deepcopy(doc)
    paths = _paths(doc)
    path = data.draw(st.sampled_from(paths))
    action = data.draw(st.sampled_from(["replace", "delete", "add", "rename", "wrap"]))
    value = data.draw(VALUES)
    if not path:
        return value if action == "replace" else ({"resources": doc} if action == "wrap" else doc)
    parent, key = _get(doc, path[:-1]), path[-1]
    if action == "replace":
        parent[key] = value
    elif action == "delete":
        del parent[key]
    elif action == "wrap":
        parent[key] = [parent[key]] if data.draw(st.booleans()) else {data.draw(st.sampled_from(KEYS)): parent[key]}
    elif action == "add" and isinstance(parent, dict):
        parent[data.draw(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)))] = value
    elif action == "rename" and isinstance(parent, dict):
        new_key = data.draw(st.one_of(st.sampled_from(KEYS), st.text(min_size=1, max_size=8)))
        parent[new_key] = parent.pop(key)
    return doc


def _exercise(text: str, envs: dict[str, str]) -> None:
    try:
        loaded = load_tasks(text, env_overrides=envs)
    except TaskSpecError as exc:
        assert exc.problems
        for p in exc.problems:
            assert isinstance(p.message, str) and p.message
            assert p.line is None or p.line >= 1
        return
    for task in loaded.tasks:
        task.resource_requests()
        task.autostop()
        public = task.public_dict()
        for value in task.secret_values().values():
            if len(value) >= 4:
                assert value not in json.dumps(public, default=str)
        dumped = yaml.safe_dump(task.to_yaml_dict(), sort_keys=False)
        again = load_tasks(dumped).tasks
        assert again == [task]


@SETTINGS
@given(data=st.data(), envs=st.dictionaries(st.sampled_from(["VAR", "HF_TOKEN", "B", "x-y"]), st.text(max_size=5), max_size=2))
def test_mutated_documents_fail_only_with_task_spec_errors(data: st.DataObject, envs: dict[str, str]) -> None:
    docs = data.draw(st.sampled_from(DOCS))
    index = data.draw(st.integers(0, len(docs) - 1))
    docs = list(docs)
    for _ in range(data.draw(st.integers(1, 3))):
        docs[index] = _mutate(docs[index], data)
    try:
        text = yaml.safe_dump_all(docs, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError:
        return  # not representable as YAML at all (nothing a user could write)
    _exercise(text, envs)


@SETTINGS
@given(data=st.data())
def test_mutated_text_fails_only_with_task_spec_errors(data: st.DataObject) -> None:
    text = data.draw(st.sampled_from(TEXTS))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(text)))
        kind = data.draw(st.sampled_from(["insert", "delete", "replace"]))
        chunk = data.draw(st.sampled_from([":", " ", "\n", "-", "{", "}", "[", "]", "&a", "*a", "!!set", "'", '"', "\t",
                                           "<<: ", "---\n", "#", "%", "\x00", "é", "  ", "x", "0"]))
        if kind == "insert":
            text = text[:pos] + chunk + text[pos:]
        elif kind == "delete":
            text = text[:pos] + text[pos + len(chunk):]
        else:
            text = text[:pos] + chunk + text[pos + 1:]
    _exercise(text, {})


@SETTINGS
@given(value=VALUES)
def test_model_validate_on_any_data_raises_only_validation_errors(value: Any) -> None:
    from pydantic import ValidationError

    for data in (value, {"resources": value}, {"envs": value, "file_mounts": {"/d": "${VAR}"}}, {"secrets": value},
                 {"file_mounts": value}, {"service": value}):
        try:
            task = Task.model_validate(data)
        except ValidationError:
            continue
        task.resource_requests()
        task.public_dict()


def test_dates_survive_as_env_values() -> None:
    task = load_tasks("envs:\n  DAY: 2024-01-31\n").tasks[0]
    assert task.envs == {"DAY": str(datetime.date(2024, 1, 31))}
