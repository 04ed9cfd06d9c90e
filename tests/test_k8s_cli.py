"""`spz check` and `spz gpus list --infra k8s` against emulated clusters, as real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

from kube_emulator import KubeCluster, write_kubeconfig


def _dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


class _Dead:
    url = _dead_url()


def spz(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["spz", *args], env=env, capture_output=True, text=True, timeout=90)


def test_check_shows_each_context_and_gpus_list_shows_free_gpus(tmp_path: Path) -> None:
    a = KubeCluster("a").start()
    try:
        a.add_node("gpu", cpus=48, gpus=8, labels={"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"})
        a.add_node("cpu", cpus=16)
        write_kubeconfig(tmp_path / "kubeconfig", {"a": a, "gone": _Dead()})  # type: ignore[dict-item]
        env = {**os.environ, "SKYPURZA_KUBECONFIG": str(tmp_path / "kubeconfig"), "SKYPURZA_K8S_CONTEXTS": "a,gone",
               "SKYPURZA_HOME": str(tmp_path / "home")}
        check = spz(env, "check", "k8s", "-o", "json")
        assert check.returncode == 0, check.stderr
        got = {i["infra"]: i for i in json.loads(check.stdout)["infras"]}
        assert got["kubernetes/a"]["enabled"] and "H100:8" in got["kubernetes/a"]["detail"]
        assert "64 CPUs" in got["kubernetes/a"]["detail"]
        assert not got["kubernetes/gone"]["enabled"] and "Connection refused" in got["kubernetes/gone"]["reason"]
        listed = spz(env, "gpus", "list", "--infra", "k8s", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout)["rows"] == [{"context": "a", "accelerator": "H100", "free": 8,
                                                      "most_on_a_node": 8, "nodes": 1, "hourly_price": 0.0}]
        assert "context 'gone' did not answer" in listed.stderr and "Traceback" not in listed.stderr
        none = spz(env, "gpus", "list", "--infra", "k8s/a", "A100", "-o", "json")
        assert json.loads(none.stdout)["rows"] == []
    finally:
        a.stop()


def test_dryrun_places_on_a_context_with_room(tmp_path: Path) -> None:
    a = KubeCluster("a").start()
    try:
        a.add_node("gpu", cpus=16, gpus=1, labels={"nvidia.com/gpu.product": "NVIDIA-L4"})
        write_kubeconfig(tmp_path / "kubeconfig", {"a": a})
        env = {**os.environ, "SKYPURZA_KUBECONFIG": str(tmp_path / "kubeconfig"), "SKYPURZA_HOME": str(tmp_path / "h")}
        ok = spz(env, "launch", "--dryrun", "--infra", "k8s", "--gpus", "L4:1", "-o", "json", "echo x")
        assert ok.returncode == 0, ok.stderr
        first = json.loads(ok.stdout)["candidates"][0]
        assert (first["infra"], first["region"], first["instance_type"]) == ("kubernetes", "a", "2CPU--4GB--L4:1")
        full = spz(env, "launch", "--dryrun", "--infra", "k8s", "--gpus", "L4:2", "echo x")
        assert full.returncode == 1 and "a: no room for 1 x 2CPU--4GB--L4:2" in full.stdout + full.stderr
    finally:
        a.stop()


def test_a_broken_kubeconfig_is_one_line_in_check_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "kubeconfig").write_text("contexts: [\n")
    env = {**os.environ, "SKYPURZA_KUBECONFIG": str(tmp_path / "kubeconfig"), "SKYPURZA_HOME": str(tmp_path / "h")}
    check = spz(env, "check", "k8s", "-o", "json")
    assert check.returncode == 0, check.stderr
    (row,) = json.loads(check.stdout)["infras"]
    assert not row["enabled"] and "not valid YAML" in row["reason"] and "Traceback" not in check.stderr
