"""Dispatch and alerts over HTTP against real parts: a real control plane on the `local` infra
(nats-server, the dispatch service, the optimizer, real node agents: tests/support/local_cli.py),
the API server as its own process, httpx as the client.

A member may not change the policy (403); an admin's policy with a typo is a 422 naming its line
and key, and nothing is applied; a valid one is published stamped with the admin, and shown back
as YAML. A task beyond its team's quota waits in the queue with dispatch's reason, its queue's
quota shown used against nominal; a higher quota PUT by the admin admits it and the queue shows
its quota in use. Budgets show the team's limit; an alert raised on the log is listed until it is
resolved; a viewer sees no fleet alerts.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

from api_harness import Api, team_of_four
from api_harness import problem as _problem
from local_cli import local_cli

from skypurza.events import naming
from skypurza.events.alert_events import AlertRaised, AlertResolved
from skypurza.events.bus import Bus
from skypurza.events.dispatch_events import DispatchPolicyApplied
from skypurza.events.principal import stamped_principal
from skypurza.services.api.routes_dispatch import OpenAlerts

STAGE = "test"
TASK = "resources:\n  cpus: 2\nrun: sleep 60\n"


def policy(nominal: int) -> str:
    return ("flavors:\n  - name: local\n    infra: local\nqueues:\n  - name: ml\n    team: ml\n    quotas:\n"
            f"      - flavor: local\n        resources:\n          cpu: {{nominal: {nominal}}}\n"
            "budgets:\n  - team: ml\n    period: month\n    limit_usd: 50\n")


def _until(api: Api, token: str, path: str, check, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    body: dict = {}
    while time.monotonic() < deadline:
        res = api.http.get(path, headers=api.as_(token))
        if res.status_code == 200:
            body = res.json()
            if check(body):
                return body
        time.sleep(0.3)
    raise AssertionError(f"{path} never matched: {body}")


async def _publish(url: str, event) -> None:
    bus = await Bus.connect(url, STAGE, source="/tests/api-dispatch")
    try:
        await bus.publish(event)
    finally:
        await bus.close()


async def _policies(url: str) -> list:
    bus = await Bus.connect(url, STAGE, source="/tests/api-dispatch")
    try:
        return [s async for s in bus.replay(filter_subject=naming.event_filter(STAGE, "dispatch", "*"))]
    finally:
        await bus.close()


def test_policy_queue_budgets_and_alerts_over_http(tmp_path: Path) -> None:
    with local_cli(tmp_path, STAGE) as env:
        alice, _bob, vera, root = team_of_four(env)
        nats = f"nats://127.0.0.1:{env['SKYPURZA_NATS_PORT']}"
        api = Api(SimpleNamespace(url=nats), tmp_path)
        try:
            # No policy yet: nothing waits; a member may read, not change it.
            assert api.http.get("/api/v1/dispatch/policy", headers=api.as_(alice)).json()["policy"] is None
            body = _problem(api.http.put("/api/v1/dispatch/policy", headers=api.as_(alice),
                                         json={"yaml": policy(1)}), 403)
            assert "admins" in body["detail"]

            # A typo is refused at its line and key, and nothing is published.
            bad = policy(1).replace("nominal: 1", "nominall: 1")
            body = _problem(api.http.put("/api/v1/dispatch/policy", headers=api.as_(root), json={"yaml": bad}), 422)
            assert body["problems"][0]["line"] == 10 and body["problems"][0]["key"].endswith("cpu.nominall"), body
            assert "unknown key" in body["detail"] and "nominal" in body["problems"][0]["message"], body
            assert asyncio.run(_policies(nats)) == []

            res = api.http.put("/api/v1/dispatch/policy", headers=api.as_(root), json={"yaml": policy(1)})
            assert res.status_code == 200 and res.json()["applied_by"] == "root", res.text
            stored = asyncio.run(_policies(nats))
            assert [type(s.event) for s in stored] == [DispatchPolicyApplied]
            assert stamped_principal(stored[0].envelope) == ("root", "ml")
            shown = api.http.get("/api/v1/dispatch/policy", headers=api.as_(vera)).json()
            assert shown["applied_by"] == "root" and "team: ml" in shown["yaml"] and shown["source"] == "console"

            # Beyond quota: held, with dispatch's reason; the queue's quota shown against nominal.
            res = api.http.post("/api/v1/tasks", headers=api.as_(alice),
                                json={"task": TASK, "cluster": "dq", "overrides": {"infra": "local"}})
            assert res.status_code == 202, res.text
            task_id = res.json()["task_id"]
            q = _until(api, alice, "/api/v1/dispatch/queue",
                       lambda b: any(p["task_id"] == task_id and p["kind"] for p in b["pending"]))
            row = next(p for p in q["pending"] if p["task_id"] == task_id)
            assert row["kind"] == "quota" and "cpu" in row["reason"] and row["user"] == "alice", row
            assert row["request"]["cpu"] == 2
            assert q["queues"][0]["name"] == "ml" and q["queues"][0]["quotas"][0] == {
                "flavor": "local", "resource": "cpu", "nominal": 1.0, "used": 0.0, "borrowing_limit": None,
                "lending_limit": None}

            # The admin raises the quota: admitted, and its quota is in use while it runs.
            assert api.http.put("/api/v1/dispatch/policy", headers=api.as_(root),
                                json={"yaml": policy(4)}).status_code == 200
            q = _until(api, alice, "/api/v1/dispatch/queue",
                       lambda b: not b["pending"] and b["queues"][0]["quotas"][0]["used"] == 2)
            assert q["queues"][0]["quotas"][0]["nominal"] == 4

            budgets = api.http.get("/api/v1/budgets", headers=api.as_(alice)).json()["budgets"]
            assert [(b["team"], b["limit_usd"], b["state"]) for b in budgets] == [("ml", 50.0, "ok")], budgets

            # An alert on the log is listed until resolved; a viewer sees none.
            now = datetime.now(timezone.utc)
            asyncio.run(_publish(nats, AlertRaised(key="cluster_idle:dq", kind="cluster_idle", subject="dq",
                                                  summary="cluster dq idle", raised_at=now)))
            alerts = api.http.get("/api/v1/alerts", headers=api.as_(alice)).json()["alerts"]
            assert [(a["key"], a["summary"]) for a in alerts] == [("cluster_idle:dq", "cluster dq idle")]
            assert api.http.get("/api/v1/alerts", headers=api.as_(vera)).json()["alerts"] == []
            asyncio.run(_publish(nats, AlertResolved(key="cluster_idle:dq", kind="cluster_idle", subject="dq",
                                                    resolved_at=now)))
            assert api.http.get("/api/v1/alerts", headers=api.as_(alice)).json()["alerts"] == []

            # Removing the policy is an admin's too.
            _problem(api.http.delete("/api/v1/dispatch/policy", headers=api.as_(alice)), 403)
            assert api.http.delete("/api/v1/dispatch/policy", headers=api.as_(root)).json()["policy"] is None
            assert api.http.get("/api/v1/dispatch/policy", headers=api.as_(alice)).json()["policy"] is None
        finally:
            out = api.close()
        assert "Traceback" not in out, out[-3000:]


def test_open_alerts_fold_by_occurrence() -> None:
    """A resolve ends the occurrence it names, not a later raise of the same key."""
    t = datetime(2026, 12, 1, tzinfo=timezone.utc)
    board = OpenAlerts()
    board.apply(AlertRaised(key="k", kind="orphan", subject="a", occurrence=2, raised_at=t))
    board.apply(AlertResolved(key="k", kind="orphan", subject="a", occurrence=1, resolved_at=t))
    assert [a["occurrence"] for a in board.rows()] == [2]
    board.apply(AlertResolved(key="k", kind="orphan", subject="a", occurrence=2, resolved_at=t))
    assert board.rows() == []
