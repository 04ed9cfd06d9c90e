"""Verdicts as SkyPilot gives them (issue 12 §5): what its service spec refuses, refused with the
place; what it only refuses at launch (a storage mount with an empty bucket name), a warning for
check-yaml and a positioned error for launch and jobs launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skypurza.events.taskspec import TaskSpecError, load_tasks

REPO = Path(__file__).resolve().parent.parent

SERVICE = "run: python -m http.server 8080\nresources: {{ports: 8080}}\nservice:\n{body}"


def _problems(text: str) -> list[str]:
    with pytest.raises(TaskSpecError) as err:
        load_tasks(text, filename="svc.yaml")
    return [str(p) for p in err.value.problems]


@pytest.mark.parametrize("body, where, words", [
    ("  readiness_probe: health\n  replicas: 1\n", "svc.yaml:4:20: service.readiness_probe", "must start with /"),
    ("  readiness_probe: {path: v1}\n", "svc.yaml:4:27: service.readiness_probe.path", "must start with /"),
    ("  replica_policy: {min_replicas: 3, max_replicas: 1, target_qps_per_replica: 2}\n",
     "service.replica_policy.max_replicas", "max_replicas (1) must be at least min_replicas (3)"),
    ("  replica_policy: {min_replicas: 1, target_qps_per_replica: 2}\n",
     "service.replica_policy.target_qps_per_replica", "needs max_replicas"),
    ("  replica_policy: {min_replicas: 1, max_replicas: 4}\n",
     "service.replica_policy.max_replicas", "target_qps_per_replica is not set"),
    ("  replicas: 2\n  replica_policy: {min_replicas: 1}\n", "service.replicas", "not both"),
    ("  replicas: 1\n  ports: 70000\n", "service.ports", "a port is 1 to 65535"),
    ("  readiness_probe: {path: /h, post_data: '{not json'}\n", "service.readiness_probe.post_data", "must be JSON"),
])
def test_service_sections_are_judged_by_skyserves_rules(body: str, where: str, words: str) -> None:
    problems = _problems(SERVICE.format(body=body))
    assert len(problems) == 1 and where in problems[0] and words in problems[0], problems


@pytest.mark.parametrize("body", [
    "  readiness_probe: /health\n  replicas: 2\n",
    "  readiness_probe: {path: /v1/models, post_data: '{\"model\": \"m\"}'}\n  replica_policy: {min_replicas: 2}\n",
    "  replica_policy: {min_replicas: 0, max_replicas: 2, target_qps_per_replica: 1}\n",
    "  replica_policy: {min_replicas: 2, max_replicas: 2}\n",
])
def test_services_skyserve_accepts_are_accepted(body: str) -> None:
    assert len(load_tasks(SERVICE.format(body=body), filename="svc.yaml").tasks) == 1


EMPTY_BUCKET = "file_mounts:\n  /data:\n    name:\n    mode: MOUNT\nrun: ls /data\n"


def test_an_empty_bucket_name_is_a_warning_when_read_and_an_error_at_launch(tmp_path: Path) -> None:
    loaded = load_tasks(EMPTY_BUCKET, filename="t.yaml")
    assert [str(w) for w in loaded.at_launch] == [
        "t.yaml:3:5: file_mounts./data.name: the bucket name is empty: fill it in (or give a `source`) before "
        "launching; a launch refuses it, as SkyPilot's does"]
    # Neither a name nor a source at all is still refused when read.
    assert "needs a `name`" in _problems("file_mounts:\n  /data:\n    mode: MOUNT\nrun: x\n")[0]
    # Through the CLI: check-yaml accepts (exit 0, the warning shown); both launches refuse with the
    # place, before anything is started or published (no control plane is needed to say so).
    task = tmp_path / "bucket.yaml"
    task.write_text(EMPTY_BUCKET)
    env = {**os.environ, "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_STAGE": "verdicts"}

    def spz(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, cwd=REPO, text=True,
                              capture_output=True, timeout=60, stdin=subprocess.DEVNULL)

    checked = spz("check-yaml", str(task))
    assert checked.returncode == 0 and "warning: the bucket name is empty" in checked.stdout + checked.stderr
    checked_json = json.loads(spz("check-yaml", "-o", "json", str(task)).stdout)
    assert checked_json["valid"] is True and checked_json["errors"] == []
    assert [(w["line"], w["path"]) for w in checked_json["warnings"]] == [(3, "file_mounts./data.name")]
    for launch in (["launch", "-y"], ["jobs", "launch", "-y"]):
        out = spz(*launch, str(task))
        assert out.returncode == 1, out.stdout + out.stderr
        assert f"{task}:3:5: file_mounts./data.name: the bucket name is empty" in out.stderr
        assert "Traceback" not in out.stderr
    assert not (tmp_path / "home" / "verdicts" / "api.json").exists()  # nothing was started


def test_a_tab_in_the_indentation_is_named_as_such() -> None:
    problems = _problems("name: t\nresources:\n\taccelerators: A100\nrun: echo\n")
    assert problems == ["svc.yaml:3:1: YAML syntax error: YAML forbids tabs for indentation: use spaces"]


def test_a_memory_sized_name_of_a_base_variant_suggests_the_base() -> None:
    from skypurza.events.taskspec.accelerators import suggest

    assert suggest("A100-40GB")[0] == "A100"
    assert "A100-80GB" in suggest("A100-40GB")
    assert suggest("A100-80GB") == []  # a catalog name is not "unknown"
