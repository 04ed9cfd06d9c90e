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
