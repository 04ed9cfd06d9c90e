"""The plain task (events/taskspec/plaintask.py): wherever it answers, the models accept the same
document and give the same name, node count, resource requests and autostop; it answers for the
plain tasks it is meant for; and a cold dry run of one makes no pydantic model at all."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from skypurza.cli.submit import SubmitError, load_task
from skypurza.events.limits import (
    MAX_ENV_NAME_CHARS,
    MAX_ENV_VALUE_BYTES,
    MAX_NODES,
    MAX_SCRIPT_BYTES,
    MAX_TASK_NAME_CHARS,
)
from skypurza.events.taskspec import CliOverrides, apply_overrides
from skypurza.events.taskspec.loader import load_document, load_tasks
from skypurza.events.taskspec.plaintask import RESOURCE_KEYS, TASK_KEYS, load_plain, plain_task, plain_without_warnings
from skypurza.events.taskspec.yamlsrc import parse_documents

ROOT = Path(__file__).resolve().parent.parent
CORPUS = sorted((Path(__file__).parent / "taskspec_corpus").glob("*/*.yaml"))
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _same_reading(plain: Any, task: Any) -> None:
    assert plain.name == task.name
    assert plain.num_nodes == task.num_nodes
    assert plain.resource_requests() == task.resource_requests()
    assert plain.autostop() == task.autostop()


def _models(data: Any) -> Any:
    """The task the dry run's model path makes of one document (cli/submit.py load_task: the
    document validated, then the empty overrides applied), or None when the models refuse it."""
    task, problems, warnings = load_document(data)
    if task is None or any(w.at_launch for w in warnings):
        return None
    return apply_overrides(task, CliOverrides())


@pytest.mark.parametrize("path", CORPUS + EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_file_the_plain_loader_takes_reads_the_same_with_the_models(path: Path) -> None:
    plain = load_plain([str(path)])
    if plain is None:
        return  # the models load it (what the corpus tests check)
    _same_reading(plain, load_task([str(path)], CliOverrides()))


@pytest.mark.parametrize("path", CORPUS + EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_what_check_yaml_finds_valid_without_the_models_the_models_find_valid_without_a_word(path: Path) -> None:
    if not plain_without_warnings(path):
        return
    loaded = load_tasks(path)
    assert len(loaded.tasks) == 1 and loaded.warnings == []


def test_a_plain_task_naming_an_accelerator_is_the_models_for_check_yaml(tmp_path: Path) -> None:
    (tmp_path / "misspelt.yaml").write_text("resources:\n  accelerators: A10O:1\nrun: echo\n")
    assert load_plain([str(tmp_path / "misspelt.yaml")]) is not None  # the dry run does not warn
    assert not plain_without_warnings(tmp_path / "misspelt.yaml")
    assert load_tasks(tmp_path / "misspelt.yaml").warnings  # check-yaml does
    (tmp_path / "task.txt").write_text("run: echo\n")  # check-yaml reads any file it is given
    assert plain_without_warnings(tmp_path / "task.txt") and load_plain([str(tmp_path / "task.txt")]) is None


def test_the_plain_loader_takes_the_common_tasks() -> None:
    """Not vacuous: the examples and the corpus's plain files are answered without the models."""
    assert load_plain([str(ROOT / "examples" / "hello.yaml")]) is not None
    assert load_plain([str(ROOT / "examples" / "distributed.yaml")]) is not None
    assert load_plain([str(ROOT / "examples" / "envs_and_mounts.yaml")]) is not None
    taken = [p.stem for p in CORPUS if load_plain([str(p)]) is not None]
    for stem in ("01_minimal", "02_name_workdir_setup", "04_num_nodes", "15_accelerators_string",
                 "23_cpus_memory_plus_units", "25_instance_type_spot"):
        assert stem in taken, (stem, taken)
    # and what it must leave to the models: other keys, other forms, anything invalid
    assert not any(p.parent.name == "invalid" for p in CORPUS if p.stem in taken)
    for stem in ("14_legacy_cloud_region_zone", "19_accelerators_set", "39_any_of", "47_file_mounts"):
        assert stem not in taken


def test_what_is_not_one_plain_document_goes_to_the_models(tmp_path: Path) -> None:
    cases = {
        "pipeline.yaml": "name: p\n---\nname: a\nrun: echo a\n---\nname: b\nrun: echo b\n",
        "dupe.yaml": "name: a\nname: b\n",
        "syntax.yaml": "name: [a\n",
        "list.yaml": "- run: echo\n",
        "empty.yaml": "",
        "header.yaml": "name: g\nexecution: parallel\n",
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        assert load_plain([str(tmp_path / name)]) is None, name
    assert load_plain([str(tmp_path / "missing.yaml")]) is None
    assert load_plain(["echo", "hi"]) is None and load_plain([]) is None
    (tmp_path / "ok.yaml").write_text("run: echo hi\n")
    assert load_plain([" ", str(tmp_path / "ok.yaml")]) is not None  # blank words are dropped, as load_task does


# Values for each key: the first ones plain and valid, then what the plain loader must leave to
# the models (other types and forms, bounds, nulls, odd strings).
_BAD_STR = ["", None, 1, 1.5, True, [], {}, "\ud800"]
TOP = {
    "name": ["hi", "a.b-c_d", "x" * MAX_TASK_NAME_CHARS, "x" * (MAX_TASK_NAME_CHARS + 1), "-bad", "a..b", "hi\n",
             "a...b", "héllo", *_BAD_STR],
    "run": ["echo hi", "", "x" * MAX_SCRIPT_BYTES, "x" * (MAX_SCRIPT_BYTES + 1), "é" * (MAX_SCRIPT_BYTES // 2 + 1),
            None, 1, ["echo"], "\ud800"],
    "setup": ["pip install x", None, 2, {}],
    "workdir": [".", "~/code/$PROJ", "", None, {"url": "https://x/y.git"}, 1, "\udc80"],
    "num_nodes": [1, 2, MAX_NODES, MAX_NODES + 1, 0, -1, True, False, 1.0, "2", None, 2**70],
    "file_mounts": [{"/data": "."}, {"/data": "s3://bucket/x", "~/ckpt": "~/local"}, {}, {"/": "."},
                    {"~/sky_workdir": "."}, {"~/sky_workdir/": "."}, {"/a/": "."}, {"$PROJ/x": "."}, {"/m": "$PROJ"},
                    {"/${PROJ}": "."}, {"$A/": "."}, {"/a": {"source": "s3://b"}}, {"/a": None}, {"/a": 1},
                    {1: "."}, {"/a": "\ud800"}, {f"/m{i}": "." for i in range(1001)}, None, [], "/a"],
    "envs": [{"A": "1"}, {"A": 1, "B": True, "C": 2.5}, {}, {"PROJ": "p"}, {"PROJ": "/p/", "A": "/"}, {"A": "~/sky_workdir"}, {1: "x"}, {True: "x"}, {"A": None},
             {"A": [1]}, {"A": {"b": 1}}, {"1A": "x"}, {"A-B": "x"}, {"A" * MAX_ENV_NAME_CHARS: "x"},
             {"A" * (MAX_ENV_NAME_CHARS + 1): "x"}, {"A": "x" * MAX_ENV_VALUE_BYTES},
             {"A": "x" * (MAX_ENV_VALUE_BYTES + 1)}, {f"V{i}": "x" * (MAX_ENV_VALUE_BYTES - 10) for i in range(17)},
             {f"V{i}": "1" for i in range(1001)}, {"A\n": "x"}, {"A": "\ud800"}, None, [], "A=1"],
}
RES = {
    "infra": ["aws", "local", "aws/us-east-1", "aws/us-east-1/us-east-1a", "k8s", "kubernetes/ctx", "*", "gcp",
              "aws/*/use1-az4", "bogus", "aws/", "AWS", "", None, 1, ["aws"]],
    "cpus": ["1+", 4, "4", 2.5, "0.5+", 0, -1, "0", "many", 10**6, float("inf"), float("nan"), True, None, [4], "4++"],
    "memory": ["16+", 16, "16GB", "1TB+", "4x", "512MB", 0, "0x", "-1", "16 GB", "lots", True, None, float("inf"),
               2**80],
    "accelerators": ["A100:8", "a100:1", "V100", "T4:0.5", "H100:0", "A100:-1", "A100:1000", "A100:x", ":8", "",
                     {"A100": 8}, ["A100:8"], "{A100:8, H100:8}", None, 8],
    "use_spot": [True, False, None, 1, "true"],
    "instance_type": ["p4d.24xlarge", "m5.large", "", None, 4],
    "disk_size": [256, "256GB", "1TB", "256", 0, -5, 10**9, 1.5, "lots", True, None],
}
EXTRA = {"file_mounts": {"/a": "."}, "secrets": {"T": "x"}, "config": {}, "service": {"readiness_probe": "/"},
         "event_callback": "x", "resources.any_of": [{"cpus": 2}], "resources.autostop": 10,
         "resources.cloud": "aws", "resources.gpus": "A100:1", "resources.labels": {"a": "b"}}


def _documents(rng: random.Random, count: int) -> list[dict[str, Any]]:
    docs = []
    for _ in range(count):
        doc: dict[str, Any] = {}
        for key, values in TOP.items():
            if rng.random() < 0.6:
                doc[key] = values[0] if rng.random() < 0.6 else rng.choice(values)
        if rng.random() < 0.8:
            res = {}
            for key, values in RES.items():
                if rng.random() < 0.45:
                    res[key] = values[0] if rng.random() < 0.5 else rng.choice(values)
            doc["resources"] = res if rng.random() < 0.95 else rng.choice([None, [], "cpus: 2"])
        if rng.random() < 0.1:
            key, value = rng.choice(sorted(EXTRA.items()))
            if key.startswith("resources.") and isinstance(doc.get("resources"), dict):
                doc["resources"][key.split(".", 1)[1]] = value
            else:
                doc[key.split(".")[-1]] = value
        docs.append(doc)
    return docs


def test_wherever_the_plain_reading_answers_the_models_agree() -> None:
    rng = random.Random(21)
    answered = refused_by_models = 0
    for doc in _documents(rng, 3000):
        plain = plain_task(doc)
        task = _models(doc)
        if task is None:
            refused_by_models += 1
            assert plain is None, doc  # never vouch for what the models refuse
            continue
        if plain is not None:
            answered += 1
            _same_reading(plain, task)
    # the generator reaches both sides
    assert answered > 300 and refused_by_models > 600, (answered, refused_by_models)


def test_every_value_alone_is_answered_where_it_is_plain_and_valid() -> None:
    """Each key with each of its values, alone: what the models refuse is left to them, and every
    valid value in a plain form (a string, a number, a bool) is answered, and read alike."""
    cases = [({key: value}, value) for key, values in TOP.items() for value in values]
    cases += [({"resources": {key: value}}, value) for key, values in RES.items() for value in values]
    for doc, value in cases:
        task, plain = _models(doc), plain_task(doc)
        if task is None:
            assert plain is None, doc
        elif _other_form(next(iter(doc)), value) or _unencodable(value):
            # another form (a git workdir, an accelerator set), a lone surrogate: the models' own
            assert plain is None, doc
        else:
            assert plain is not None, doc
            _same_reading(plain, task)
    assert RESOURCE_KEYS == set(RES) and TASK_KEYS == set(TOP) | {"resources"}


def _other_form(key: str, value: Any) -> bool:
    """A valid value in a form the plain reading leaves to the models (a git workdir, a storage
    mount, an accelerator set or list)."""
    if key == "file_mounts":
        return isinstance(value, dict) and any(not isinstance(v, str) for v in value.values())
    return key != "envs" and isinstance(value, (dict, list))


def test_file_mounts_are_judged_after_their_variables_are_filled_in() -> None:
    """The models fill `$VAR`s in from the envs before they check a destination: so does the
    plain reading (a destination that only becomes the workdir's, or a directory, once filled)."""
    for envs, mounts in (({"A": "~/sky_workdir"}, {"$A": "."}), ({"D": "/x/"}, {"${D}": "."}),
                         ({"N": "1"}, {"/a$N": ".", "/a1": "."})):
        doc = {"workdir": ".", "envs": envs, "file_mounts": mounts}
        task, plain = _models(doc), plain_task(doc)
        assert (task is None) == (plain is None), doc
        if task is not None:
            _same_reading(plain, task)
    assert _models({"workdir": ".", "envs": {"A": "~/sky_workdir"}, "file_mounts": {"$A": "."}}) is None
    assert plain_task({"envs": {"A": "~/sky_workdir"}, "file_mounts": {"$A": "."}}) is not None  # no workdir: fine


def _unencodable(value: Any) -> bool:
    """A string with a lone surrogate, anywhere in `value`."""
    if isinstance(value, dict):
        return any(_unencodable(k) or _unencodable(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_unencodable(v) for v in value)
    try:
        str(value).encode()
    except UnicodeEncodeError:
        return True
    return False


def _probe(tmp_path: Path, args: list[str]) -> tuple[int, str, str, bool]:
    """`spz ARGS` as the `spz` script runs it, and whether the process imported pydantic."""
    probe = tmp_path / "probe.json"
    hook = ("import atexit, json, os, sys; "
            "atexit.register(lambda: open(os.environ['PROBE'], 'w').write(json.dumps('pydantic' in sys.modules))); "
            "sys.argv = ['spz', *sys.argv[1:]]; from skypurza.cli.script import main; main()")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKYPURZA_") and k not in ("FORCE_COLOR", "NO_COLOR")}
    env.update(SKYPURZA_HOME=str(tmp_path / "home"), PROBE=str(probe), COLUMNS="100", SKYPURZA_CLI_WORKER="0")
    r = subprocess.run([sys.executable, "-c", hook, *args], capture_output=True, timeout=120, cwd=tmp_path, env=env)
    return r.returncode, r.stdout.decode(), r.stderr.decode(), json.loads(probe.read_text())


def test_a_cold_dry_run_of_a_plain_task_makes_no_model_and_prints_what_the_models_print(tmp_path: Path) -> None:
    plain = tmp_path / "plain.yaml"
    plain.write_text("name: train\nnum_nodes: 2\nenvs:\n  EPOCHS: 3\nworkdir: .\nresources:\n  cpus: 2+\n"
                     "  memory: 4+\n  use_spot: false\nrun: echo $EPOCHS\n")
    code, out, err, pydantic = _probe(tmp_path, ["launch", "--dryrun", "-o", "json", str(plain)])
    assert (code, err, pydantic) == (0, "", False), (code, err)
    doc = json.loads(out)
    assert doc["task"] == "train" and doc["chosen"]["num_nodes"] == 2
    # a task outside the plain keys, and a plain key with a bad value: the models, their message
    other = tmp_path / "other.yaml"
    other.write_text("name: train\nresources:\n  any_of:\n    - cpus: 2+\nrun: echo\n")
    code, out, err, pydantic = _probe(tmp_path, ["launch", "--dryrun", "-o", "json", str(other)])
    assert code == 0 and pydantic is True and json.loads(out)["task"] == "train"
    bad = tmp_path / "bad.yaml"
    bad.write_text("resources:\n  cpus: 0\nrun: echo\n")
    code, out, err, pydantic = _probe(tmp_path, ["launch", "--dryrun", str(bad)])
    assert code == 1 and pydantic is True and "bad.yaml:2" in err and "cpus must be positive" in err, err
    # check-yaml: a plain file without the models; one that gets a warning, with them
    code, out, err, pydantic = _probe(tmp_path, ["check-yaml", str(plain)])
    assert (code, err, pydantic) == (0, "", False) and "valid (1 task)" in out, (code, out, err)
    warned = tmp_path / "warned.yaml"
    warned.write_text("resources:\n  accelerators: A10O:1\nrun: echo\n")
    code, out, err, pydantic = _probe(tmp_path, ["check-yaml", "-o", "json", str(plain), str(warned)])
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and pydantic is True and [len(doc["warnings"]) for doc in lines] == [0, 1], out
    with pytest.raises(SubmitError, match="cpus must be positive"):
        load_task([str(bad)], CliOverrides())


def test_plain_tasks_of_the_corpus_parse_to_one_document() -> None:
    # The plain loader reads files through the same YAML reader as the models' loader.
    for path in CORPUS:
        if load_plain([str(path)]) is not None:
            docs, issues = parse_documents(path.read_text())
            assert not issues and len(docs) == 1
