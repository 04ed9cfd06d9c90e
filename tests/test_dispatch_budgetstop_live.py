"""A budget with `on_limit: stop`, live: the embedded control plane (a real nats-server, the
dispatch, optimizer, provisioner and recovery services) and real local agents. Team a's job and
team b's job run; team a's spend reaches its stop budget (a UsageRecorded, as the ledger's
metering stores it: the local infra itself costs nothing); dispatch cancels team a's job with
the reason, team b's job keeps running, and a new launch of team a is held for its budget."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from local_cli import REPO, local_cli, spz

POLICY = """\
flavors:
  - name: local
    infra: local
queues:
  - {name: team-a, team: team-a, quotas: [{flavor: local, resources: {cpu: {nominal: 4}}}]}
  - {name: team-b, team: team-b, quotas: [{flavor: local, resources: {cpu: {nominal: 4}}}]}
budgets:
  - {team: team-a, period: month, limit_usd: 100, on_limit: stop}
"""

REASON = "budget team-a/month: $100.00 of $100.00 spent"

# What the ledger's meter would store for team a: $100 this month, published on the plane's bus.
SPEND = """
import asyncio, sys
from datetime import datetime, timedelta, timezone
from skypurza.cli.control import ControlPlane, operator_credentials
from skypurza.events.bus import Bus
from skypurza.events.models import UsageRecorded

async def main(stage):
    bus = await Bus.connect(ControlPlane(stage).ensure_url(), stage, source="/tests/meter",
                            credentials=operator_credentials(stage))
    now = datetime.now(timezone.utc)
    await bus.publish(UsageRecorded(cluster="old-a", rank=0, instance_id="i-1", start=now - timedelta(minutes=5),
                                    end=now, hourly_price_micros=1_200_000_000, cost_micros=100_000_000,
                                    user="someone", team="team-a"))
    await bus.close()

asyncio.run(asyncio.wait_for(main(sys.argv[1]), 60))
"""


def _status(env: dict[str, str], cluster: str) -> str | None:
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


def test_a_spent_stop_budget_cancels_its_teams_running_job_and_holds_its_new_work(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    job = "resources:\n  infra: local\n  cpus: 0.5\n  labels: {team: TEAM}\nrun: echo started; sleep 300\n"
    for team in ("a", "b"):
        (tmp_path / f"{team}.yaml").write_text(job.replace("TEAM", f"team-{team}"))
    with local_cli(tmp_path, "dbstop") as env:
        try:
            r = spz(env, "dispatch", "policy", "apply", str(policy), timeout=180)
            assert r.returncode == 0, r.stdout + r.stderr
            for team in ("a", "b"):
                r = spz(env, "launch", "-y", "--async", "-c", f"z{team}", str(tmp_path / f"{team}.yaml"))
                assert r.returncode == 0, r.stdout + r.stderr
            for c in ("za", "zb"):
                _until(lambda c=c: _status(env, c) == "RUNNING", f"{c}'s job runs", 180)
            r = subprocess.run([sys.executable, "-c", SPEND, env["SKYPURZA_STAGE"]], env=env, cwd=REPO,
                               capture_output=True, text=True, timeout=90)
            assert r.returncode == 0, r.stdout + r.stderr
            assert _until(lambda: (s := _status(env, "za")) in ("CANCELLED", "FAILED", "SUCCEEDED") and s,
                          "team a's job ends", 120) == "CANCELLED"
            assert _status(env, "zb") == "RUNNING"  # another team's work goes on
            stopped = spz(env, "events", "replay", "--type", "task_budget_stopped", "-o", "json")
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
            assert stopped.stdout.count(REASON) == 1, stopped.stdout  # one job of team a: stopped once
            cancels = spz(env, "events", "replay", "--type", "cancel_requested", "-o", "json").stdout
            assert f"dispatch: {REASON}" in cancels
            # a new launch of team a waits for its budget
            r = spz(env, "launch", "-y", "--async", "-c", "za2", str(tmp_path / "a.yaml"))
            assert r.returncode == 0, r.stdout + r.stderr
            rows = _until(lambda: [p for p in json.loads(spz(env, "dispatch", "queue", "-o", "json").stdout)["pending"]
                                   if p["cluster"] == "za2" and p["kind"] == "budget"], "team a's new launch held", 120)
            assert rows[0]["reason"].startswith("team-a: $100.00 of $100.00 monthly budget spent (hard limit)")
            budgets = json.loads(spz(env, "budgets", "-o", "json").stdout)["budgets"]
            assert [(b["team"], b["state"], b["on_limit"]) for b in budgets] == [("team-a", "exceeded", "stop")]
            assert _status(env, "zb") == "RUNNING"
        finally:
            for c in ("za", "zb", "za2"):
                spz(env, "down", "-y", c, timeout=120)
