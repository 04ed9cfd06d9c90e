"""The task models' validators kept between processes (events/taskspec/schemacache.py, issue 21).

Each test runs real processes over the whole task YAML corpus: the first builds the validators
and stores them, the next takes them from the cache, and every verdict (a task's dump, or every
problem with its line and column, and every warning) and the task's JSON Schema must be the same
as a process that builds them as pydantic does (SKYPURZA_SCHEMA_CACHE=0). `source` says which path each process took, so a
cache that silently never loads fails here too.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

from skypurza.events.taskspec import schemacache

CORPUS = Path(__file__).parent / "taskspec_corpus"

PROBE = r"""
import json, sys
from pathlib import Path
from skypurza.events.taskspec import TaskSpecError, load_tasks, schemacache

verdicts = {}
for path in sorted(Path(sys.argv[1]).glob("*/*.yaml")):
    try:
        tf = load_tasks(str(path))
    except TaskSpecError as exc:
        verdicts[path.name] = ["invalid", str(exc)]
        continue
    verdicts[path.name] = ["valid", [t.model_dump(mode="json", exclude_none=True) for t in tf.tasks],
                           [str(w) for w in tf.warnings],
                           [[r.cloud, r.accelerator, r.use_spot] for t in tf.tasks for r in t.resource_requests()]]
from skypurza.events.taskspec.schema import task_json_schema
schema = task_json_schema()  # after the loads: the JSON Schema of a model whose validator came from the cache
print(json.dumps({"source": schemacache.source, "verdicts": verdicts, "schema": schema}, sort_keys=True))
"""


def _probe(home: Path, **env: str) -> dict:
    run_env = {**_environ(), "SKYPURZA_HOME": str(home), **env}
    r = subprocess.run([sys.executable, "-c", PROBE, str(CORPUS)], env=run_env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "SKYPURZA_SCHEMA_CACHE"}


def _cache_files(home: Path) -> list[Path]:
    return sorted((home / "cache").glob("taskspec-*.pickle"))


def test_a_later_process_takes_the_validators_from_the_cache_and_judges_the_whole_corpus_the_same(tmp_path: Path) -> None:
    first = _probe(tmp_path)
    assert first["source"]["Task"] == "built"
    files = _cache_files(tmp_path)
    assert files and all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    assert (tmp_path / "cache").stat().st_mode & 0o077 == 0  # nobody else may write where it is read from
    second = _probe(tmp_path)
    assert second["source"]["Task"] == "cache"
    uncached = _probe(tmp_path / "off", SKYPURZA_SCHEMA_CACHE="0")
    assert uncached["source"]["Task"] == "built" and not _cache_files(tmp_path / "off")
    assert second["verdicts"] == first["verdicts"] == uncached["verdicts"]
    assert second["schema"] == first["schema"] == uncached["schema"] and second["schema"]["properties"]["resources"]
    kinds = [v[0] for v in second["verdicts"].values()]
    assert kinds.count("valid") >= 40 and kinds.count("invalid") >= 30


def test_a_cache_file_that_others_may_write_or_that_is_not_a_pickle_is_not_read(tmp_path: Path) -> None:
    reference = _probe(tmp_path)
    files = _cache_files(tmp_path)
    for f in files:
        f.chmod(0o666)  # a file another user could have written: a pickle runs code when read
    again = _probe(tmp_path)
    assert again["source"]["Task"] == "built" and again["verdicts"] == reference["verdicts"]
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in _cache_files(tmp_path))  # stored afresh, private
    for f in _cache_files(tmp_path):
        f.write_bytes(b"\x80\x05not a pickle at all")
        f.chmod(0o600)
    garbled = _probe(tmp_path)
    assert garbled["source"]["Task"] == "built" and garbled["verdicts"] == reference["verdicts"]
    assert _probe(tmp_path)["source"]["Task"] == "cache"


def test_an_entry_is_used_only_while_every_file_that_shaped_it_is_unchanged(tmp_path: Path) -> None:
    _probe(tmp_path)
    # Stand a file of our own in for the modules the entry records, then change it as an edit would.
    source_file = tmp_path / "shaping.py"
    source_file.write_text("x = 1\n")
    for f in _cache_files(tmp_path):
        entry = pickle.loads(f.read_bytes())
        st = source_file.stat()
        f.write_bytes(pickle.dumps(([(str(source_file), st.st_mtime_ns, st.st_size)], *entry[1:])))
    assert _probe(tmp_path)["source"]["Task"] == "cache"  # the stand-in is unchanged
    source_file.write_text("x = 22\n")
    assert _probe(tmp_path)["source"]["Task"] == "built"


def test_two_installs_for_one_user_never_take_each_others_entries(tmp_path: Path) -> None:
    import shutil

    import skypurza

    home = tmp_path / "home"
    assert _probe(home)["source"]["Task"] == "built"
    assert _probe(home)["source"]["Task"] == "cache"
    # A second install of the package (another virtualenv, a checkout), the same user and home:
    # its model files are other files, which the first install's stamps say nothing of.
    other = tmp_path / "other"
    shutil.copytree(Path(skypurza.__file__).parent, other / "skypurza", ignore=shutil.ignore_patterns(
        "tests", "docs", "bench", "infra", "examples", ".git", "__pycache__", "*.egg-info", "build"))
    copy = _probe(home, PYTHONPATH=str(other))
    assert copy["source"]["Task"] == "built"  # not the first install's entry, however unchanged its files
    assert copy["verdicts"] == _probe(home)["verdicts"]
    assert _probe(home, PYTHONPATH=str(other))["source"]["Task"] == "cache"  # its own entry, next time
    assert _probe(home)["source"]["Task"] == "cache"  # and the first install's is still its own


def test_unchanged_compares_mtime_and_size(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("a")
    st = f.stat()
    assert schemacache.unchanged([(str(f), st.st_mtime_ns, st.st_size)])
    assert not schemacache.unchanged([(str(f), st.st_mtime_ns + 1, st.st_size)])
    assert not schemacache.unchanged([(str(f), st.st_mtime_ns, st.st_size + 1)])
    assert not schemacache.unchanged([(str(tmp_path / "gone.py"), 0, 0)])
    assert not schemacache.unchanged([]) and not schemacache.unchanged("junk") and not schemacache.unchanged([("x",)])


def test_the_dry_run_and_check_yaml_print_the_same_from_the_cache(tmp_path: Path) -> None:
    task = tmp_path / "t.yaml"
    # labels: not a plain task (events/taskspec/plaintask.py), so the dry run loads it with the models
    task.write_text("name: t\nresources:\n  cpus: 1+\n  infra: local\n  labels: {team: ml}\nrun: echo hi\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: t\nresources:\n  cpus: [1]\n  disk_tier: fastest\nnum_nodes: 0\nrun: echo hi\n")
    outs = {}
    for label, env in (("off", {"SKYPURZA_SCHEMA_CACHE": "0"}), ("store", {}), ("cached", {})):
        run_env = {**_environ(), "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_STAGE": "schemacache", **env}
        outs[label] = [subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=run_env,
                                      capture_output=True, text=True, timeout=120)
                       for args in (("launch", "--dryrun", "-o", "json", str(task)), ("check-yaml", str(bad)),
                                    ("check-yaml", "-o", "json", str(bad)))]
    assert len(_cache_files(tmp_path / "home")) >= 2  # Task, and Resources the dry run builds too
    for label in ("store", "cached"):
        assert [(r.returncode, r.stdout, r.stderr) for r in outs[label]] == \
            [(r.returncode, r.stdout, r.stderr) for r in outs["off"]]
    assert outs["off"][0].returncode == 0 and outs["off"][1].returncode != 0 and "disk_tier" in outs["off"][1].stdout + outs["off"][1].stderr


def test_processes_storing_at_once_leave_whole_entries_and_an_unwritable_cache_still_validates(tmp_path: Path) -> None:
    """Six processes start with no cache at once: each builds, each stores through its own file
    and an atomic rename, so whatever file stands is whole and the next process takes it. A cache
    directory that cannot be made only costs the build."""
    env = {**_environ(), "SKYPURZA_HOME": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", PROBE, str(CORPUS)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(6)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-500:] for _, err in outs]
    verdicts = [json.loads(out)["verdicts"] for out, _ in outs]
    assert all(v == verdicts[0] for v in verdicts)
    assert not list((tmp_path / "cache").glob("*.tmp"))  # no process left its own file behind
    again = _probe(tmp_path)
    assert again["source"]["Task"] == "cache" and again["verdicts"] == verdicts[0]

    # A cache directory that cannot be made (a file stands where it would be: refused even to
    # root) only costs the build: the task is judged the same and nothing is stored.
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "cache").write_text("not a directory\n")
    first = _probe(blocked)
    assert first["source"]["Task"] == "built" and first["verdicts"] == verdicts[0]
    assert (blocked / "cache").read_text() == "not a directory\n"
