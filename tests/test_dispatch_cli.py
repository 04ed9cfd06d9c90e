"""`spz dispatch policy check|apply|show`, `spz dispatch queue` and `spz budgets` as a user runs
them, against the embedded control plane (which runs the dispatch service from its entry point)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from local_cli import local_cli, spz

POLICY = """\
flavors:
  - name: local
    infra: local
queues:
  - name: team-z
    team: team-z
    quotas:
      - flavor: local
        resources:
          cpu: {nominal: 0}
budgets:
  - team: team-z
    period: day
    limit_usd: 5
"""


def test_policy_apply_holds_a_launch_with_its_reason(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.replace("nominal: 0", "nominl: 0"))
    task = tmp_path / "task.yaml"
    task.write_text("resources:\n  infra: local\n  labels: {team: team-z}\nrun: echo hi\n")
    with local_cli(tmp_path, "dcli") as env:
        bad = spz(env, "dispatch", "policy", "check", str(policy))
        assert bad.returncode == 1 and "Traceback" not in bad.stderr
        assert f"{policy}:10:17: queues[0].quotas[0].resources.cpu.nominl: unknown key" in bad.stderr
        assert spz(env, "dispatch", "policy", "apply", str(policy)).returncode == 1  # nothing published
        policy.write_text(POLICY)
        r = spz(env, "dispatch", "policy", "apply", str(policy), "-o", "json", timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        shown = json.loads(spz(env, "dispatch", "policy", "show", "-o", "json").stdout)
        assert shown["policy"]["queues"][0]["name"] == "team-z" and shown["source"] == str(policy)
        r = spz(env, "launch", "-y", "--async", "-c", "zz", str(task))
        assert r.returncode == 0, r.stdout + r.stderr
        deadline = time.monotonic() + 60
        while True:
            queue = json.loads(spz(env, "dispatch", "queue", "-o", "json").stdout)
            rows = [p for p in queue["pending"] if p["cluster"] == "zz"]
            if rows and rows[0]["kind"] == "quota":
                break
            assert time.monotonic() < deadline, queue
            time.sleep(0.5)
        assert rows[0]["team"] == "team-z"
        assert rows[0]["reason"] == "team-z: 0/0 cpu in use (flavor local); needs 0.5"
        budgets = json.loads(spz(env, "budgets", "-o", "json").stdout)["budgets"]
        assert [(b["team"], b["spent_usd"], b["limit_usd"], b["state"]) for b in budgets] == [("team-z", 0, 5, "ok")]
        r = spz(env, "dispatch", "policy", "clear")
        assert r.returncode == 0, r.stdout + r.stderr
        deadline = time.monotonic() + 60
        while json.loads(spz(env, "dispatch", "queue", "-o", "json").stdout)["pending"]:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        assert spz(env, "down", "-y", "zz", timeout=120).returncode == 0


PRIORITY_POLICY = """\
flavors:
  - name: local
    infra: local
queues:
  - name: team-z
    team: team-z
    quotas:
      - flavor: local
        resources:
          cpu: {nominal: NOMINAL}
USERS
priority:
  weights: {age: 1000, jobsize: 500}
  max_age_s: 315360000
"""


def _lines_until(stream, text: str, seen: list[str], timeout: float = 120) -> None:
    """Read `stream` (a thread collects it into `seen`) until a line contains `text`."""
    deadline = time.monotonic() + timeout
    while not any(text in line for line in seen):
        assert time.monotonic() < deadline, f"no line with {text!r} in:\n" + "".join(seen)
        time.sleep(0.2)


def test_a_foreground_launch_shows_held_then_goes_on_and_share_prio_are_live(tmp_path: Path) -> None:
    import subprocess
    import sys
    import threading

    from local_cli import REPO

    policy = tmp_path / "policy.yaml"
    task = tmp_path / "task.yaml"
    task.write_text("resources:\n  infra: local\n  labels: {team: team-z}\nrun: echo held-then-ran\n")
    with local_cli(tmp_path, "dheld") as env:
        policy.write_text(PRIORITY_POLICY.replace("NOMINAL", "0").replace("USERS", ""))
        r = spz(env, "dispatch", "policy", "apply", str(policy), timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        launch = subprocess.Popen([sys.executable, "-m", "skypurza.cli.main", "launch", "-y", "-c", "zh", str(task)],
                                  env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  stdin=subprocess.DEVNULL)
        seen: list[str] = []
        reader = threading.Thread(target=lambda: seen.extend(iter(launch.stdout.readline, "")), daemon=True)
        reader.start()
        try:
            _lines_until(launch.stdout, "held: team-z: 0/0 cpu in use (flavor local); needs 0.5", seen)
            # live prio and share, over the fold of the log
            prio = json.loads(spz(env, "dispatch", "prio", "-o", "json").stdout)
            assert prio["priority"] is True
            [job] = [j for j in prio["jobs"] if j["cluster"] == "zh"]
            # age over a ten-year PriorityMaxAge adds under 1: the priority is the job size's alone
            assert job["team"] == "team-z" and job["priority"] == 500
            assert job["jobsize"] == 500.0 and job["factors"]["jobsize"] == 1.0  # the only pending job: the largest
            queue = json.loads(spz(env, "dispatch", "queue", "-o", "json").stdout)
            assert [p["priority"] for p in queue["pending"] if p["cluster"] == "zh"] == [job["priority"]]
            table = spz(env, "dispatch", "prio")
            assert table.returncode == 0 and "PRIORITY" in table.stdout and job["task_id"] in table.stdout
            share = json.loads(spz(env, "dispatch", "share", "-o", "json").stdout)
            assert {r["path"] for r in share} >= {"/team-z", f"/team-z/{job['user']}"}
            # a new reason replaces the line: a user cap of 0 CPUs
            user = job["user"]
            policy.write_text(PRIORITY_POLICY.replace("NOMINAL", "1").replace(
                "USERS", f"    users:\n      - user: {user}\n        resources: {{cpu: 0}}"))
            assert spz(env, "dispatch", "policy", "apply", str(policy)).returncode == 0
            _lines_until(launch.stdout, f"held: team-z/{user}: 0/0 cpu in use (user limit); needs 0.5", seen)
            # quota for it: admitted, placed, run, and the launch ends as any other
            policy.write_text(PRIORITY_POLICY.replace("NOMINAL", "1").replace("USERS", ""))
            assert spz(env, "dispatch", "policy", "apply", str(policy)).returncode == 0
            assert launch.wait(timeout=240) == 0, "".join(seen)
            reader.join(timeout=10)
            out = "".join(seen)
            assert "held-then-ran" in out and "Traceback" not in out
            assert out.index("held: team-z: 0/0") < out.index("held: team-z/") < out.index("held-then-ran")
        finally:
            if launch.poll() is None:
                launch.kill()
                launch.wait(timeout=30)
        assert spz(env, "down", "-y", "zh", timeout=120).returncode == 0


def test_a_managed_job_launch_shows_held_then_runs(tmp_path: Path) -> None:
    import subprocess
    import sys
    import threading

    from local_cli import REPO

    policy = tmp_path / "policy.yaml"
    task = tmp_path / "job.yaml"
    task.write_text("resources:\n  infra: local\n  labels: {team: team-z}\nrun: echo managed-held-then-ran\n")
    with local_cli(tmp_path, "dmheld") as env:
        policy.write_text(PRIORITY_POLICY.replace("NOMINAL", "0").replace("USERS", ""))
        r = spz(env, "dispatch", "policy", "apply", str(policy), timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        launch = subprocess.Popen([sys.executable, "-m", "skypurza.cli.main", "jobs", "launch", "-y", "-n", "mh",
                                   str(task)], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, stdin=subprocess.DEVNULL)
        seen: list[str] = []
        reader = threading.Thread(target=lambda: seen.extend(iter(launch.stdout.readline, "")), daemon=True)
        reader.start()
        try:
            _lines_until(launch.stdout, "held: team-z: 0/0 cpu in use (flavor local); needs 0.5", seen)
            assert spz(env, "dispatch", "policy", "clear").returncode == 0
            assert launch.wait(timeout=240) == 0, "".join(seen)
            reader.join(timeout=10)
            out = "".join(seen)
            assert "managed-held-then-ran" in out and "Traceback" not in out
            assert out.index("held: team-z") < out.index("managed-held-then-ran")
        finally:
            if launch.poll() is None:
                launch.kill()
                launch.wait(timeout=30)


PREEMPT_POLICY = """\
flavors:
  - name: local
    infra: local
queues:
  - name: team-z
    team: team-z
    preemption: {within_queue: LowerPriority}
    quotas:
      - flavor: local
        resources:
          cpu: {nominal: 1}
priority:
  classes:
    - {name: high, value: 10}
    - {name: low, value: 1}
"""


def _job_status(env: dict[str, str], cluster: str) -> str | None:
    r = spz(env, "queue", cluster, "-o", "json")
    rows = json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else []
    return rows[0]["status"] if rows else None


def _until(check, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def test_a_higher_priority_task_preempts_a_running_job_of_its_queue(tmp_path: Path) -> None:
    """Real agents: the low-priority job runs; a high-priority submission of the same queue is
    held, dispatch cancels the low job with the reason, and the high one runs once its quota is back."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(PREEMPT_POLICY)
    low, high = tmp_path / "low.yaml", tmp_path / "high.yaml"
    low.write_text("resources:\n  infra: local\n  cpus: 1\n  priority_class: low\n  labels: {team: team-z}\n"
                   "run: echo low-started; sleep 300\n")
    high.write_text("resources:\n  infra: local\n  cpus: 1\n  priority_class: high\n  labels: {team: team-z}\n"
                    "run: echo high-ran\n")
    with local_cli(tmp_path, "dpre") as env:
        r = spz(env, "dispatch", "policy", "apply", str(policy), timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        assert spz(env, "launch", "-y", "--async", "-c", "zlow", str(low)).returncode == 0
        _until(lambda: _job_status(env, "zlow") == "RUNNING", "the low job runs", 180)
        r = spz(env, "launch", "-y", "-c", "zhigh", str(high), timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "high-ran" in r.stdout
        assert _until(lambda: _job_status(env, "zlow") in ("CANCELLED", "FAILED") and _job_status(env, "zlow"),
                      "the low job ends") == "CANCELLED"
        events = spz(env, "events", "replay", "--type", "task_preempted", "-o", "json")
        assert events.returncode == 0, events.stdout + events.stderr
        assert "preempted by" in events.stdout and "(priority 10) in team-z" in events.stdout
        for c in ("zlow", "zhigh"):
            assert spz(env, "down", "-y", c, timeout=120).returncode == 0


def test_a_preempted_managed_job_is_recovered_and_waits_for_admission(tmp_path: Path) -> None:
    """Real agents: a low-priority managed job runs; a high-priority launch of its queue
    preempts it; the recovery service takes its cluster down and launches it again, and that
    launch waits (held) while the high task runs."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(PREEMPT_POLICY)
    low, high = tmp_path / "low.yaml", tmp_path / "high.yaml"
    low.write_text("resources:\n  infra: local\n  cpus: 1\n  priority_class: low\n  labels: {team: team-z}\n"
                   "run: echo managed-low; sleep 300\n")
    high.write_text("resources:\n  infra: local\n  cpus: 1\n  priority_class: high\n  labels: {team: team-z}\n"
                    "run: echo high-ran; sleep 5\n")
    with local_cli(tmp_path, "dmpre") as env:
        r = spz(env, "dispatch", "policy", "apply", str(policy), timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        r = spz(env, "jobs", "launch", "-y", "--async", "-n", "mlow", str(low))
        assert r.returncode == 0, r.stdout + r.stderr

        def managed() -> dict:
            rows = json.loads(spz(env, "jobs", "queue", "-o", "json").stdout or "[]")
            return rows[0] if rows else {}
        _until(lambda: managed().get("status") == "RUNNING", "the managed job runs", 180)
        r = spz(env, "launch", "-y", "--async", "-c", "zhigh", str(high))
        assert r.returncode == 0, r.stdout + r.stderr
        job = _until(lambda: (m := managed()) and m.get("recoveries", 0) >= 1 and m, "the managed job recovered", 180)
        assert job["status"] in ("RECOVERING", "STARTING", "PENDING"), job
        # its new launch waits behind the high task (held for quota), and nothing cancelled the job itself
        queue = _until(lambda: [p for p in json.loads(spz(env, "dispatch", "queue", "-o", "json").stdout)["pending"]
                                if p["kind"] == "quota"], "the relaunch is held", 120)
        assert queue[0]["team"] == "team-z"
        events = spz(env, "events", "replay", "--type", "task_preempted", "-o", "json").stdout
        import re

        assert "preempted by" in events and re.search(r'"managed_job_id":\s*%d\b' % job["id"], events), events
        assert spz(env, "jobs", "cancel", "-y", str(job["id"])).returncode == 0
        assert spz(env, "down", "-y", "zhigh", timeout=120).returncode == 0
