"""One suite, both ways: the CLI's verbs on the embedded bus, and the same verbs through a
configured API server (cli/transport.py, cli/via_api.py), with the same assertions on their
output and exit codes.

Real parts: the embedded control plane on the `local` infra (nats-server, the services, the
API server `spz api start` runs, real node agents), `spz` as a user runs it. For `api`, member
alice's token comes from `spz users add` and reaches the CLI through SKYPURZA_API_SERVER /
SKYPURZA_API_TOKEN, so every verb goes over HTTP as alice; on `embedded` the OS user is alice.

Through the server only (the refusals): another member acting on alice's cluster is refused
naming the owner and the role needed, a wrong token is a 401 line, an unreachable server is one
line and exit 1 within the connect bound; none shows a traceback.

One cluster carries every cluster verb (a launch is a provisioning and a node agent: the
costliest step), and each `spz` run asserts all it can: the suite is bounded by how many
processes it starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from local_cli import REPO, local_cli, spz

from skypurza.events.natsserver import free_port

STAGE = "cliway"
SERVER_VARS = ("SKYPURZA_API_SERVER", "SKYPURZA_API_TOKEN", "SKYPILOT_API_SERVER_ENDPOINT")


@dataclass
class Way:
    name: str
    env: dict[str, str]  # what the verbs run with
    admin_env: dict[str, str]  # the plane's own (embedded) environment
    bob: str | None = None  # another member's token, through the server


def _ok(r: subprocess.CompletedProcess, code: int = 0) -> subprocess.CompletedProcess:
    assert r.returncode == code, f"exit {r.returncode}, wanted {code}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    return r


@pytest.fixture(params=["embedded", "api"])
def way(request: pytest.FixtureRequest, tmp_path: Path):
    with _way(request.param, tmp_path) as w:
        yield w


@contextmanager
def _way(name: str, tmp_path: Path, extra: dict[str, str] | None = None) -> Iterator[Way]:
    """The control plane (with `extra` in its environment), and the verbs' environment: `embedded`
    on its bus as alice, `api` through its API server with member alice's token."""
    with local_cli(tmp_path, STAGE) as base:
        for var in SERVER_VARS:
            base.pop(var, None)
        base.update(extra or {})
        if name == "embedded":
            yield Way("embedded", {**base, "SKYPURZA_USER": "alice"}, base)
            return
        base["SKYPURZA_USER"] = "carol"  # the plane's OS user: admin on the embedded server, not alice
        url = json.loads(_ok(spz(base, "api", "start", "-o", "json")).stdout)["api_url"]
        _ok(spz(base, "teams", "add", "ml"))
        tokens = {}
        for user in ("alice", "bob"):
            r = _ok(spz(base, "users", "add", user, "--team", "ml", "--role", "member", "-o", "json"))
            tokens[user] = json.loads(r.stdout)["token"]
        yield Way("api", {**base, "SKYPURZA_API_SERVER": url, "SKYPURZA_API_TOKEN": tokens["alice"]}, base,
                  bob=tokens["bob"])


def _until(check, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)


def test_every_verb_behaves_the_same_on_the_bus_and_through_the_server(way: Way, tmp_path: Path) -> None:
    env = way.env
    # ------------------------------------------------------------- launch streams the output
    r = _ok(spz(env, "launch", "-y", "-c", "t1", "--infra", "local", "--ports", "8080", "echo hello-1; echo hello-2"))
    assert r.stdout.splitlines() == ["hello-1", "hello-2"]
    assert "Placement (attempt 1): local" in r.stderr and "Cluster t1 is up (1 node(s))" in r.stderr
    assert "✓ Job 1 on t1 succeeded." in r.stderr

    # ------------------------------------------------------------- logs, status, queue
    assert _ok(spz(env, "logs", "t1", "1")).stdout.splitlines() == ["hello-1", "hello-2"]
    assert _ok(spz(env, "logs", "t1", "9", "--status"), 102).stdout.strip() == "Job 9: NOT FOUND"
    assert "No cluster named nope." in _ok(spz(env, "logs", "nope"), 102).stderr
    rows = json.loads(_ok(spz(env, "status", "-u", "-o", "json")).stdout)
    assert [(c["name"], c["status"], c["infra"], c["num_nodes"], c["user"]) for c in rows] == [
        ("t1", "UP", "local", 1, "alice")]
    assert _ok(spz(env, "status", "--endpoints", "t1")).stdout.splitlines() == ["8080: 127.0.0.1:8080"]
    verbose = _ok(spz(env, "status", "-v")).stdout
    assert "HEAD IP" in verbose and "127.0.0.1" in verbose and "8080" in verbose

    # ------------------------------------------------------------- status -r, logs --sync-down / --provision
    r = _ok(spz(env, "status", "-r", "-o", "json"))  # through a server: the provisioner's pass, then its view
    assert [(c["name"], c["status"]) for c in json.loads(r.stdout)] == [("t1", "UP")]
    assert "Reconciled with: local" in r.stderr and "Orphan" not in r.stderr, r.stderr
    laptop = {**env, "HOME": str(tmp_path / "laptop")}  # --sync-down writes under ~/sky_logs, as sky
    synced = tmp_path / "laptop" / "sky_logs" / "t1" / "1" / "rank-0.log"
    r = _ok(spz(laptop, "logs", "t1", "1", "--sync-down"))
    assert synced.read_text() == "hello-1\nhello-2\n"
    assert r.stdout.splitlines() == [f"Job 1's logs of cluster t1 (a file per node): {synced.parent}", f"  {synced}"]
    assert _ok(spz(laptop, "logs", "t1", "7", "--sync-down"), 102).stderr.strip() == "No job 7 on cluster t1."
    prov = _ok(spz(env, "logs", "t1", "--provision")).stdout.splitlines()
    names = [line.split(" ")[1].rstrip(":") for line in prov]  # oldest first: the node is ready, then the cluster up
    assert names == ["task_submitted", "placement_chosen", "node_ready", "cluster_provisioned"], prov
    assert "user=alice" in prov[0] and "local" in prov[1] and "1 node(s)" in prov[3]
    assert _ok(spz(env, "logs", "nope", "--provision"), 1).stdout.strip() == "No provisioning history for cluster nope."
    assert _ok(spz(env, "logs", "t1", "--autostop")).stdout.strip() == "No autostop history for cluster t1."

    # ------------------------------------------------------------- exec, and what it refuses
    r = _ok(spz(env, "exec", "t1", "echo exec-hi"))
    assert r.stdout.splitlines() == ["exec-hi"]
    assert "Job 2 queued on cluster t1." in r.stderr and "✓ Job 2 on t1 succeeded." in r.stderr
    err = _ok(spz(env, "exec", "t1", "--gpus", "H100:8", "echo x"), 1).stderr
    assert "the task asks for H100:8 per node; cluster t1 has no accelerators" in err
    assert len(err.strip().splitlines()) == 1, err

    # ------------------------------------------------------------- launch onto it, -d, autostop, cancel
    r = _ok(spz(env, "launch", "-y", "-c", "t1", "--no-setup", "-d", "echo started; sleep 300"))
    assert "Cluster t1 is up: job 3 queued (setup unchanged, skipped)." in r.stderr
    assert "Job 3 queued on cluster t1" in r.stderr and r.stdout == ""
    _until(lambda: spz(env, "logs", "t1", "3", "--no-follow", "--tail", "1").stdout.splitlines() == ["started"])
    jobs = json.loads(_ok(spz(env, "queue", "t1", "-o", "json")).stdout)
    assert [(j["cluster"], j["job_id"], j["status"], j["user"]) for j in jobs] == [
        ("t1", 3, "RUNNING", "alice"), ("t1", 2, "SUCCEEDED", "alice"), ("t1", 1, "SUCCEEDED", "alice")]
    r = _ok(spz(env, "autostop", "t1", "-i", "30"))
    assert r.stdout.strip() == "Autostop of t1: stop after 30 idle minute(s)."
    auto = _ok(spz(env, "logs", "t1", "--autostop")).stdout.splitlines()
    assert len(auto) == 1 and " autostop_set: idle_minutes=30 " in auto[0], auto
    if way.bob is not None:
        # Through the server another member may read alice's cluster, not act on it.
        as_bob = {**env, "SKYPURZA_API_TOKEN": way.bob}
        assert {c["name"] for c in json.loads(_ok(spz(as_bob, "status", "-u", "-o", "json")).stdout)} == {"t1"}
        for args in (("down", "-y", "t1"), ("exec", "t1", "echo bob")):  # refused by the CLI, by the server
            err = _ok(spz(as_bob, *args), 1).stderr
            assert "not allowed" in err and "alice's" in err and "admins" in err, (args, err)
            assert len(err.strip().splitlines()) == 1, err
        err = _ok(spz({**env, "SKYPURZA_API_TOKEN": "spz_wrong_token"}, "status"), 1).stderr
        assert "refused the token (401)" in err and "spz_wrong_token" not in err
        err = _ok(spz(as_bob, "status", "-r", "--terminate-orphans"), 1).stderr  # anyone's instances: admins'
        assert "not allowed" in err and "for admins" in err and len(err.strip().splitlines()) == 1, err
        _log_files_route(env["SKYPURZA_API_SERVER"], env["SKYPURZA_API_TOKEN"])
    r = _ok(spz(env, "cancel", "-y", "t1", "3"))
    assert "Job 3: CANCELLED" in r.stdout

    # ------------------------------------------------------------- down --graceful: its jobs first
    r = _ok(spz(env, "exec", "t1", "-d", "sleep 300"))
    assert "Job 4 queued on cluster t1." in r.stderr and "spz logs t1 4" in r.stderr
    r = _ok(spz(env, "down", "-y", "--graceful", "t1"))
    assert "Cluster t1: cancelling job(s) 4 first (--graceful)." in r.stdout
    assert "Cluster t1: TERMINATED." in r.stderr
    assert "no cluster named t1 (it was terminated)" in _ok(spz(env, "down", "-y", "t1"), 1).stderr

    # ------------------------------------------------------------- launch -r retries for want of capacity only
    r = _ok(spz(env, "launch", "-y", "-c", "nowhere", "-r", "--infra", "local", "--gpus", "H100:8", "echo x"), 1)
    assert "no placement" in r.stderr and "submitting again" not in r.stderr, r.stderr

    # ------------------------------------------------------------- managed jobs, the cost report
    r = _ok(spz(env, "jobs", "launch", "-y", "-n", "mj", "--infra", "local", "echo managed-hi"))
    assert "managed-hi" in r.stdout.splitlines() and "Managed job 1 (mj) submitted." in r.stderr
    assert "Managed job 1: SUCCEEDED" in r.stderr
    jobs = json.loads(_ok(spz(env, "jobs", "queue", "-r", "--infra", "local", "-o", "json")).stdout)
    assert [(j["id"], j["name"], j["status"], j["user"]) for j in jobs] == [(1, "mj", "SUCCEEDED", "alice")]
    assert "managed-hi" in _ok(spz(env, "jobs", "logs", "1", "--no-follow")).stdout.splitlines()
    ctl = _ok(spz(env, "jobs", "logs", "1", "--controller")).stdout.splitlines()  # its recovery events
    assert ctl[0].split(" ")[1] == "managed_job_submitted:" and "status=SUCCEEDED" in ctl[-1], ctl
    r = _ok(spz(laptop, "jobs", "logs", "1", "--sync-down"))
    [mfile] = (tmp_path / "laptop" / "sky_logs" / "managed_jobs" / "1").glob("*/*/rank-0.log")
    assert "managed-hi" in mfile.read_text().splitlines() and f"  {mfile}" in r.stdout.splitlines(), r.stdout
    assert _ok(spz(env, "jobs", "logs", "77", "--controller"), 102).stderr.strip() == "No managed job 77."
    assert _ok(spz(env, "jobs", "cancel", "-y", "1")).stdout.splitlines() == [
        "Managed job 1 already ended (SUCCEEDED).", "Nothing to cancel."]
    # A pipeline of two tasks: one managed job (through a server: POST /api/v1/jobs with both).
    pipe = tmp_path / "pipe.yaml"
    pipe.write_text("name: pipe\n---\nname: one\nresources: {infra: local}\nrun: echo pipe-one\n---\n"
                    "name: two\nresources: {infra: local}\nrun: echo pipe-two\n")
    r = _ok(spz(env, "jobs", "launch", "-y", str(pipe)))
    assert [x for x in r.stdout.splitlines() if x.startswith("pipe-")] == ["pipe-one", "pipe-two"], r.stdout
    assert "Managed job 2 (pipe) submitted." in r.stderr and "Managed job 2: SUCCEEDED" in r.stderr
    # A job group, detached: every job submitted at once (through a server: by the server), then cancelled.
    group = tmp_path / "grp.yaml"
    group.write_text("name: grp\nexecution: parallel\n---\nname: a\nresources: {infra: local}\nrun: sleep 300\n"
                     "---\nname: b\nresources: {infra: local}\nrun: sleep 300\n")
    r = _ok(spz(env, "jobs", "launch", "-y", "-d", "-o", "json", str(group)))
    assert [(j["id"], j["name"], j["job_group"], j["root_job_id"], j["status"]) for j in json.loads(r.stdout)] == [
        (3, "grp/a", "grp", 3, "PENDING"), (4, "grp/b", "grp", 3, "PENDING")], r.stdout
    assert "Managed job 3 (grp/a) submitted." in r.stderr and "Managed job 4 (grp/b) submitted." in r.stderr
    _ok(spz(env, "jobs", "cancel", "-y", "--async", "3", "4"))
    report = json.loads(_ok(spz(env, "cost-report", "-o", "json")).stdout)
    assert {"lines", "total", "by"} <= set(report) and "scope" not in report and report["by"] == "team"

    if way.name == "embedded":  # the bus path never loads the HTTP client
        probe = ("import runpy, sys; sys.argv = ['spz', 'status', '-o', 'json']\n"
                 "try:\n    runpy.run_module('skypurza.cli.main', run_name='__main__')\n"
                 "except SystemExit:\n    pass\n"
                 "print('httpx' in sys.modules, file=sys.stderr)")
        # In this process (the probe reads its own modules), not forked from the warm CLI worker.
        r = subprocess.run([sys.executable, "-c", probe], env={**env, "SKYPURZA_CLI_WORKER": "0"},
                           capture_output=True, text=True, timeout=60)
        assert r.stderr.strip().splitlines()[-1] == "False", r.stderr


def _log_files_route(url: str, token: str) -> None:
    """The routes behind --sync-down and --provision, asked directly: a node's file streamed and cut
    at `max_bytes`, a node that printed nothing an empty file, names and kinds checked at the edge."""
    import httpx

    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        got = http.get("/api/v1/clusters/t1/jobs/1/logs/files/0")
        assert (got.status_code, got.text) == (200, "hello-1\nhello-2\n")
        assert got.headers["content-type"].startswith("text/plain")
        assert 'filename="rank-0.log"' in got.headers["content-disposition"]
        assert http.get("/api/v1/clusters/t1/jobs/1/logs/files/0", params={"max_bytes": 5}).text == "hello"
        assert (http.get("/api/v1/clusters/t1/jobs/1/logs/files/3").text, got.status_code) == ("", 200)
        for path, code in (("/api/v1/clusters/t1/jobs/9/logs/files/0", 404), ("/api/v1/clusters/nope/history/provision", 404),
                           ("/api/v1/clusters/t1/jobs/1/logs/files/0?max_bytes=0", 422),
                           ("/api/v1/clusters/t1/jobs/1/logs/files/5000", 422), ("/api/v1/clusters/t1/history/setup", 422),
                           ("/api/v1/clusters/t1%2A/history/provision", 422)):
            res = http.get(path)
            assert res.status_code == code and res.headers["content-type"] == "application/problem+json", (path, res.text)


def test_an_unreachable_configured_server_is_one_line_not_a_hang(tmp_path: Path) -> None:
    env = {**os.environ, "SKYPURZA_HOME": str(tmp_path / "home"), "SKYPURZA_STAGE": STAGE,
           "SKYPURZA_API_SERVER": f"http://127.0.0.1:{free_port()}", "SKYPURZA_API_TOKEN": "spz_a_b"}
    for args in (("status",), ("logs", "c1"), ("exec", "c1", "echo hi"), ("status", "-r"), ("logs", "c1", "--provision"),
                 ("logs", "c1", "--sync-down"), ("jobs", "logs", "1", "--controller")):
        started = time.monotonic()
        r = _ok(spz(env, *args, timeout=60), 1)
        assert time.monotonic() - started < 30, args
        assert r.stderr.startswith("error: cannot reach the API server at http://127.0.0.1:") and \
            "spz api start" in r.stderr and "spz_a_b" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == "", r.stderr


FULL = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


@pytest.mark.parametrize("name", ["embedded", "api"])
def test_launch_r_submits_again_until_a_place_has_capacity(name: str, tmp_path: Path) -> None:
    """`launch -r`: the only place (an emulated Kubernetes context, tests/support/kube_emulator.py)
    has no room for the first pod, so the submission fails for want of capacity; the CLI submits
    again after the back-off (through a server, the client does, as on the bus) and the second
    attempt runs the job (a real node agent in the pod, started by the test's kubelet)."""
    from kube_emulator import Kubelet, KubeCluster, write_kubeconfig

    kube = KubeCluster("full").start()
    kube.add_node("full-gpu", cpus=32, memory_gib=128, gpus=4, labels={"nvidia.com/gpu.product": "NVIDIA-L4"},
                  taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    write_kubeconfig(tmp_path / "kubeconfig", {"full": kube})
    decided: list[str | None] = []

    def first_pod_finds_no_room(pod: dict) -> str | None:
        decided.append(FULL if not decided else None)
        return decided[-1]

    scheduler = kube.schedule(first_pod_finds_no_room)
    kubelet = Kubelet(kube, tmp_path / "pods", env={"SKYPURZA_AGENT_HEARTBEAT_S": "1", "SKYPURZA_AGENT_SAMPLE_S": "0"})
    port = str(free_port())
    plane = {"SKYPURZA_NATS_PORT": port, "SKYPURZA_AGENT_NATS_URL": f"nats://127.0.0.1:{port}",
             "SKYPURZA_KUBECONFIG": str(tmp_path / "kubeconfig"), "SKYPURZA_K8S_CONTEXTS": "full",
             "SKYPURZA_K8S_PROVISION_TIMEOUT_S": "20", "SKYPURZA_LIVE_SPOT_PRICES": "0",
             "SKYPURZA_RECONCILE_INTERVAL_S": "0", "SKYPURZA_CLEANUP_INTERVAL_S": "0"}
    try:
        with _way(name, tmp_path, plane) as w:
            started = time.monotonic()
            r = _ok(spz(w.env, "launch", "-y", "-r", "-c", "retried", "--infra", "k8s", "--gpus", "L4:1",
                        "echo up-at-last", timeout=240))
            assert r.stdout.splitlines() == ["up-at-last"], r.stdout + r.stderr
            assert "No capacity on kubernetes/full" in r.stderr and "no placement for the task" in r.stderr, r.stderr
            assert "No capacity anywhere yet (-r): submitting again in 10 s (attempt 2); Ctrl-C stops." in r.stderr
            assert "✓ Job 1 on retried succeeded." in r.stderr and time.monotonic() - started >= 10
            assert decided == [FULL, None]
            _ok(spz(w.env, "down", "-y", "retried"))
    finally:
        kubelet.stop()
        scheduler.stop()
        kube.stop()


HOLD_POLICY = """
flavors:
  - name: local
    infra: local
queues:
  - name: ml
    team: ml
    quotas:
      - flavor: local
        resources:
          cpu: {nominal: 1}
"""


@pytest.mark.parametrize("name", ["embedded", "api"])
def test_launch_shows_the_dispatch_hold_and_admission_both_ways(name: str, tmp_path: Path) -> None:
    """A dispatch policy (`spz dispatch policy apply`) gives team ml one CPU: a second launch is
    held with the policy's reason, and admitted when the first job is cancelled; the launch says
    both, through a server as on the bus (the events stream carries task_held / task_admitted)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(HOLD_POLICY)
    with _way(name, tmp_path) as w:
        _ok(spz(w.admin_env, "dispatch", "policy", "apply", str(policy)))
        first = _ok(spz(w.env, "launch", "-y", "-d", "-w", "ml", "-c", "h1", "--infra", "local", "--cpus", "1",
                        "sleep 300"))
        assert "Job 1 queued on cluster h1" in first.stderr, first.stderr
        err_file = tmp_path / "second.err"
        with open(err_file, "w") as err:
            second = subprocess.Popen([sys.executable, "-m", "skypurza.cli.main", "launch", "-y", "-w", "ml", "-c",
                                       "h2", "--infra", "local", "--cpus", "1", "echo admitted-at-last"],
                                      env=w.env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=err, text=True)
            try:
                _until(lambda: "… held: ml: 1/1 cpu in use" in err_file.read_text(), timeout=60)
                _ok(spz(w.env, "cancel", "-y", "h1", "1"))
                out, _ = second.communicate(timeout=120)
            finally:
                if second.poll() is None:
                    second.kill()
                    second.wait(10)
        text = err_file.read_text()
        assert second.returncode == 0, text
        assert out.splitlines() == ["admitted-at-last"], out + text
        assert "… Admitted (ml): choosing where to run the task" in text, text
        assert text.index("held: ml") < text.index("Admitted (ml)") < text.index("Placement (attempt 1): local")
        assert "Traceback" not in text
        _ok(spz(w.env, "down", "-y", "h1", "h2"))
