"""The ledger attributes usage by the API server's stamp, never by what a task claims.

A real nats-server and the ledger service on a real DuckDB file. A task submitted through the API
server is stamped with its caller (alice, team ml: events/principal.py); the task's labels, its
envs and even the event's own fields claim team finance and user mallory. The cluster's rows and
the cost report bill alice and ml. The same history without the stamp (the embedded bus, where
the CLI chose the team from the labels) bills finance: the stamp is what changed the answer.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import duckdb
from ledger_history import History, cand, publish_all
from nats_fixtures import connect_bus

from skypurza.events import ledger_queries as lq
from skypurza.events.models import ClusterProvisioned, ClusterTerminated, PlacementChosen, TaskSubmitted
from skypurza.events.principal import stamp
from skypurza.events.types import NodeInfo
from skypurza.services.ledger.ledgerconfig import LedgerConfig
from skypurza.services.ledger.service import LedgerService

CLAIMING = {"name": "train", "run": "python train.py", "envs": {"TEAM": "finance", "SKYPURZA_TEAM": "finance"},
            "resources": {"labels": {"team": "finance", "project": "llm"}}}


def _history(stamped: bool) -> History:
    h = History(prefix="stamp")
    env = h.add(TaskSubmitted(task_id="t9", cluster="c9", task=CLAIMING, user="mallory", team="finance"))
    if stamped:
        h.envs[-1] = stamp(env, "alice", "ml")
    c = cand()
    pc = h.add(PlacementChosen(task_id="t9", cluster="c9", attempt=1, candidate=c, num_nodes=1))
    launched = h.t
    h.add(ClusterProvisioned(cluster="c9", task_id="t9", placement_id=pc.id, candidate=c,
                             nodes=[NodeInfo(rank=0, instance_id="i-0", private_ip="10.0.0.1", zone="us-east-1a")],
                             hourly_price_micros=c.hourly_price_micros, launched_at=launched,
                             user="mallory", team="finance"))
    end = launched + timedelta(hours=1)
    h.add(ClusterTerminated(cluster="c9", terminated_at=end, reason="user", instance_ids=["i-0"]), at=end)
    return h


def _bill(server, db: Path, stamped: bool) -> tuple[dict, dict, tuple]:
    async def main():
        bus = await connect_bus(server)
        # The meter bills the run once it has caught up (a tick of an hour: one usage row).
        svc = LedgerService(db, tick_s=3600, config=LedgerConfig())
        try:
            last = await publish_all(bus, _history(stamped).envs)
            await svc.start(bus)
            assert await svc.wait_written(last)
            deadline = asyncio.get_running_loop().time() + 30
            while not (by_team := await lq.cost_report(bus, by="team"))["lines"]:
                assert asyncio.get_running_loop().time() < deadline, "the meter never billed the run"
                await asyncio.sleep(0.1)
            return by_team, await lq.cost_report(bus, by="user")
        finally:
            await svc.close()
            await bus.close()

    by_team, by_user = asyncio.run(main())
    con = duckdb.connect(str(db), read_only=True)
    try:
        row = con.execute("SELECT user, team FROM clusters WHERE name = 'c9'").fetchone()
    finally:
        con.close()
    return by_team, by_user, row


def _usage(report: dict) -> dict[str, int]:
    return {x["key"]: x["cost_micros"] for x in report["lines"] if x["kind"] == "usage"}


def test_usage_is_billed_to_the_stamped_team_whatever_the_task_claims(nats_server, tmp_path) -> None:
    by_team, by_user, row = _bill(nats_server, tmp_path / "ledger.duckdb", stamped=True)
    assert row == ("alice", "ml")
    assert set(_usage(by_team)) == {"ml"} and _usage(by_team)["ml"] == 1_006_000, by_team  # one hour of g5.xlarge
    assert set(_usage(by_user)) == {"alice"}, by_user


def test_without_a_stamp_the_embedded_buses_own_fields_decide(nats_server, tmp_path) -> None:
    by_team, _, row = _bill(nats_server, tmp_path / "ledger.duckdb", stamped=False)
    assert row == ("mallory", "finance") and set(_usage(by_team)) == {"finance"}, by_team
