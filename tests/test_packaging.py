"""Packaging and repository conventions: layout, naming, compose file, commit hook."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from compose_bin import compose_binary

ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"skypurza"}
    for top in ("events", "services", "cli"):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            found.add(".".join(("skypurza", *rel.parts)))
    assert found - listed == set(), "add these packages to pyproject.toml so the wheel ships them"
    assert listed - found == set()


def test_no_resource_name_literal_outside_the_naming_module():
    """Every resource name comes from events/naming.py: no other module writes 'skypurza-'."""
    offenders = []
    for top in ("events", "services", "cli"):
        for path in (ROOT / top).rglob("*.py"):
            if path.name == "naming.py" and path.parent.name == "events":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"skypurza-", line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []


def test_compose_file_is_valid_for_a_real_compose_binary(tmp_path):
    res = subprocess.run([compose_binary(), "-f", str(ROOT / "compose.yaml"), "config", "--quiet"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    listed = subprocess.run([compose_binary(), "-f", str(ROOT / "compose.yaml"), "config", "--services"],
                            capture_output=True, text=True, cwd=ROOT).stdout.split()
    assert set(listed) == {"nats-1", "nats-2", "nats-3", "bus-setup", "api", "optimizer", "provisioner", "recovery",
                           "status", "mirror", "ledger", "dispatch", "observability", "gpuhealth", "alerts"}
    # And the check is real: a broken file fails.
    broken = tmp_path / "compose.yaml"
    broken.write_text((ROOT / "compose.yaml").read_text().replace("restart: unless-stopped", "restart: 5", 1)
                      + "\n  bogus_top_level: 1\n")
    bad = subprocess.run([compose_binary(), "-f", str(broken), "config", "--quiet"], capture_output=True, text=True,
                         cwd=ROOT)
    assert bad.returncode != 0


@pytest.mark.parametrize("stage", ["prod", None])
def test_compose_nats_nodes_are_named_for_the_deployments_stage(tmp_path, stage):
    """The real Compose binary renders each node's config with the names naming gives the stage
    SKYPURZA_STAGE says (unset: dev), as the services' stage is."""
    import json

    from skypurza.events import naming
    from skypurza.events.natscluster import compose_config, compose_nodes

    env = {k: v for k, v in os.environ.items() if k != "SKYPURZA_STAGE"}
    if stage is not None:
        env["SKYPURZA_STAGE"] = stage
    empty = tmp_path / "empty.env"  # not the checkout's .env, should a developer have one
    empty.write_text("")
    res = subprocess.run([compose_binary(), "--env-file", str(empty), "-f", str(ROOT / "compose.yaml"), "config",
                          "--format", "json"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    want = stage or naming.DEFAULT_STAGE
    for i in (1, 2, 3):
        text = doc["configs"][f"nats-{i}"]["content"]
        assert f'server_name: "{naming.nats_server_name(want, i)}"' in text
        assert f'name: "{naming.nats_cluster_name(want)}"' in text
        assert all(n.route_url in text for n in compose_nodes(want))
        assert text == compose_config(want, i)
    assert {doc["services"][s]["environment"]["SKYPURZA_STAGE"] for s in ("optimizer", "status", "ledger")} == {want}


def _dockerfile_runs(text: str) -> list[str]:
    """The Dockerfile's RUN commands, continuation lines joined, each split on `&&`."""
    joined = re.sub(r"\\\n", " ", text)
    return [part.strip() for line in joined.splitlines() if line.startswith("RUN ")
            for part in line[len("RUN "):].split("&&")]


def test_the_image_makes_every_state_mount_point_of_compose_owned_by_its_user(tmp_path):
    """Docker gives a new named volume the ownership of the image's directory it is mounted on, and
    makes a missing one root-owned: the image must make each SkyPurza container's volume target
    itself, owned by the user its services run as, or they cannot write their state there."""
    import json

    empty = tmp_path / "empty.env"
    empty.write_text("")
    res = subprocess.run([compose_binary(), "--env-file", str(empty), "-f", str(ROOT / "compose.yaml"), "config",
                          "--format", "json"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    ours = {n: s for n, s in doc["services"].items() if "build" in s}  # the containers of this Dockerfile
    targets = {v["target"] for s in ours.values() for v in s.get("volumes") or [] if v["type"] == "volume"}
    assert targets  # status and ledger keep their DuckDB files on volumes

    text = (ROOT / "Dockerfile").read_text()
    (user,) = re.findall(r"^USER (\S+)$", text, re.M)
    (home,) = re.findall(r"^ENV SKYPURZA_HOME=(\S+)$", text, re.M)
    made = set()
    for cmd in _dockerfile_runs(text):
        words = cmd.split()
        if words[:2] == ["install", "-d"] and "-o" in words and words[words.index("-o") + 1] == user:
            made.update(w for w in words[2:] if w.startswith("/"))
    assert targets <= made, f"the Dockerfile makes no {sorted(targets - made)} owned by {user}"
    # what the volumes keep: the state the services write (SKYPURZA_HOME), the NATS nodes' stores,
    # and the per-cluster agent users the provisioner writes for the nodes to read
    from skypurza.events.natscluster import COMPOSE_AGENTS_DIR, COMPOSE_STORE_DIR

    assert targets == {home, COMPOSE_STORE_DIR, COMPOSE_AGENTS_DIR}


@pytest.mark.parametrize("message,ok", [("skypurza: add x", True), ("fix stuff", False), ("", False)])
def test_commit_msg_hook(tmp_path, message, ok):
    f = tmp_path / "MSG"
    f.write_text(message + "\n")
    res = subprocess.run(["bash", str(ROOT / ".githooks" / "commit-msg"), str(f)], capture_output=True)
    assert (res.returncode == 0) is ok


def test_wheel_ships_only_the_skypurza_package(tmp_path):
    import shutil

    # Build from a copy: setuptools leaves a build/ folder next to the sources it builds.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__",
                                                              ".pytest_cache", ".hypothesis"))
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                          str(tmp_path), str(src)], capture_output=True, text=True,
                         env={**os.environ, "PIP_NO_INDEX": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    import zipfile

    wheel = next(tmp_path.glob("skypurza-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert not any(n.startswith("skypurza/infra/") for n in names)  # infra/ deploys the package, not in it
    assert tops <= {"skypurza", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    for must in ("skypurza/events/bus.py", "skypurza/cli/main.py", "skypurza/services/optimizer/__init__.py",
                 "skypurza/events/projection/pipeline.py", "skypurza/services/status/service.py"):
        assert must in names
    # the platform's commands join `spz` through this entry point (cli/plugins.py)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/entry_points.txt")))
    groups = configparser.ConfigParser()
    groups.read_string(entry_points.decode())
    assert groups["skypurza.cli_plugins"]["ledger"] == "skypurza.services.ledger.cli:register"
    assert groups["skypurza.cli_plugins"]["health"] == "skypurza.services.observability.gpuhealth.cli:register"
    # and its services join `spz api serve` through this one (cli/serve.py)
    assert groups["skypurza.services"]["ledger"] == "skypurza.services.ledger.service:LedgerService"
    assert set(groups["skypurza.services"]) == {"ledger", "observability", "gpuhealth", "alerts", "dispatch"}
    assert groups["skypurza.cli_plugins"]["alerts"] == "skypurza.services.observability.alerts.cli:register"
    # the Prometheus alerting rules are package data (docs/observability.md#alerts)
    assert "skypurza/services/observability/rules/skypurza.rules.yml" in names
    # the web console's files are package data: pip install serves it, no build step (docs/console.md)
    for must in ("index.html", "style.css", "app.js", "api.js", "pages/cluster.js", "pages/cost.js"):
        assert f"skypurza/services/api/console/{must}" in names, must
