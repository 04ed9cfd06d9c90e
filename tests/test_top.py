"""`spz top`'s frame and `spz cost-report --live`'s lines, pure: query answers and a time in,
what the view and the JSON show out (the control-plane test in test_metrics.py runs both CLIs)."""

from __future__ import annotations

from datetime import UTC, datetime

from skypurza.services.ledger.live import live_lines
from skypurza.services.observability.top import MAX_ROWS, frame, render

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CLUSTERS = [
    {"name": "train", "status": "UP", "infra": "aws", "num_nodes": 2, "hourly_price_micros": 4_100_000,
     "user": "ann", "team": "ml", "cost_usd": "12.5", "cost_micros": 12_500_000},
    {"name": "dev", "status": "UP", "infra": "local", "num_nodes": 1, "hourly_price_micros": 0, "user": "bob",
     "team": "web", "cost_usd": "0", "cost_micros": 0},
    {"name": "parked", "status": "STOPPED", "infra": "aws", "num_nodes": 1, "hourly_price_micros": 900_000,
     "user": "bob", "team": "web", "cost_usd": "3", "cost_micros": 3_000_000},
]
JOBS = [
    {"cluster": "dev", "job_id": 2, "name": "nb", "user": "bob", "status": "RUNNING", "num_nodes": 1,
     "started_at": "2026-12-01T11:00:00Z"},
    {"cluster": "dev", "job_id": 3, "name": None, "user": "bob", "status": "PENDING", "started_at": None},
    {"cluster": "train", "job_id": 1, "name": "fit", "user": "ann", "status": "RUNNING", "num_nodes": 2,
     "started_at": "2026-12-01T10:00:00Z"},
]
MANAGED = [{"job_id": 7, "name": "fit", "user": "ann", "team": "ml", "status": "RUNNING", "cluster": "train",
            "started_at": "2026-12-01T10:00:00Z"},
           {"job_id": 6, "name": "old", "user": "ann", "team": "ml", "status": "SUCCEEDED", "cluster": "gone"}]
NODES = [{"cluster": "train", "rank": r, "sample": {"gpus": [{"utilization_pct": u} for u in utils]}}
         for r, utils in ((0, (90, 70)), (1, (10, None)))]
ALERTS = [{"state": "firing", "severity": "warning", "kind": "job_pending", "subject": "dev/3", "summary": "waits",
           "raised_at": "2026-12-01T11:30:00Z"},
          {"state": "resolved", "severity": "critical", "kind": "orphan", "subject": "i-1", "summary": "x"}]


def test_the_frame_totals_and_rows() -> None:
    f = frame(CLUSTERS, JOBS, MANAGED, NODES, ALERTS, NOW)
    t = f["totals"]
    # $/h now: UP clusters only (price per node x nodes), as skypurza_cost_rate_dollars_per_hour sums.
    assert t["rate_usd_per_hour"] == "8.20" and (t["clusters"], t["up"], t["nodes"]) == (3, 2, 3)
    assert (t["jobs_running"], t["jobs_pending"], t["managed_running"]) == (2, 1, 1)
    assert (t["gpus"], t["gpu_util_pct"], t["alerts_firing"]) == (4, round((90 + 70 + 10) / 3, 1), 1)
    assert [c["name"] for c in f["clusters"]] == ["train", "dev", "parked"]  # the most expensive first
    assert f["clusters"][2]["nodes"] == 0 and f["clusters"][2]["rate_usd_per_hour"] == "0.00"  # stopped: none paid
    assert [(j["cluster"], j["job_id"], j["running_s"]) for j in f["jobs"]] == \
        [("dev", 2, 3600), ("train", 1, 7200), ("dev", 3, None)]
    assert [a["kind"] for a in f["alerts"]] == ["job_pending"]
    assert f["sources"] == {"gpuhealth": True, "alerts": True}
    render(f)  # draws without error


def test_missing_sources_are_said_not_guessed() -> None:
    f = frame(CLUSTERS, None, None, None, None, NOW)
    assert f["totals"]["alerts_firing"] is None and f["totals"]["managed_running"] is None
    assert f["totals"]["gpu_util_pct"] is None and f["sources"] == {"gpuhealth": False, "alerts": False}
    many = [{"name": f"c{i}", "status": "UP", "num_nodes": 1, "hourly_price_micros": i} for i in range(200)]
    assert len(frame(many, [], [], [], [], NOW)["clusters"]) == MAX_ROWS


def test_live_costs_of_running_jobs() -> None:
    rep = live_lines(CLUSTERS, JOBS, MANAGED, NOW)
    lines = [(x["job"], x["kind"], x["cost_usd"], x["estimate"]) for x in rep["lines"]]
    # The managed job: its own cluster's metered cost (the cluster job on it is that same spend).
    # The job on the shared free cluster: an estimate at list price (0 here).
    assert lines == [("7", "managed", "12.500000", False), ("dev/2", "cluster", "0.000000", True)]
    assert rep["total"]["cost_micros"] == 12_500_000
    priced = [dict(c, hourly_price_micros=3_600_000) if c["name"] == "dev" else c for c in CLUSTERS]
    dev = [x for x in live_lines(priced, JOBS, [], NOW)["lines"] if x["job"] == "dev/2"][0]
    assert dev["cost_micros"] == 3_600_000 and dev["cluster_cost_usd"] == "0.000000"  # an hour at $3.60/h
