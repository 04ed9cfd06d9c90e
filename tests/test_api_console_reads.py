"""The pure pieces behind the console's dispatch and time-travel endpoints: the `at` edge, the
queue's quota rows, and how the open API server finds dispatch (an entry-point group naming
platform code; none under SKYPURZA_NO_PLUGINS). The endpoints themselves run against a real
control plane in tests/test_console.py."""

from __future__ import annotations

import tomllib
from datetime import datetime, timezone
from pathlib import Path

import pytest

from skypurza.services.api import dispatch_reads
from skypurza.services.api.routes_dispatch import queue_quotas
from skypurza.services.api.timetravel import BadTime, parse_at

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
ROOT = Path(__file__).resolve().parents[1]


def test_at_is_an_iso_time_in_utc_between_2000_and_now() -> None:
    assert parse_at("2026-12-01T10:00:00Z", NOW) == datetime(2026, 12, 1, 10, tzinfo=timezone.utc)
    assert parse_at("2026-12-01T11:00:00+01:00", NOW) == datetime(2026, 12, 1, 10, tzinfo=timezone.utc)
    assert parse_at("2026-12-01T10:00", NOW) == datetime(2026, 12, 1, 10, tzinfo=timezone.utc)  # no offset: UTC
    for bad, says in (("yesterday", "not an ISO 8601 time"), ("2026-12-01T12:00:01Z", "in the future"),
                      ("1999-12-31T23:59:59Z", "before 2000"), ("2" * 41, "at most 40")):
        with pytest.raises(BadTime, match=says):
            parse_at(bad, NOW)


def test_a_queues_quota_rows_are_the_policys_with_what_is_in_use() -> None:
    load = dispatch_reads.load()
    assert load is not None, "dispatch is installed in the test environment"
    policy = load.load_policy("flavors: [{name: f}]\nqueues:\n  - name: q\n    team: t\n    quotas:\n"
                              "      - flavor: f\n        resources: {cpu: {nominal: 4, lending_limit: 1}, A100: {nominal: 2}}\n",
                              "p.yaml")
    rows = queue_quotas(policy, {"q": {("f", "cpu"): 3.0}})
    assert rows == [{"name": "q", "team": "t", "cohort": None, "strategy": "BestEffortFIFO", "quotas": [
        {"flavor": "f", "resource": "cpu", "nominal": 4.0, "used": 3.0, "borrowing_limit": None, "lending_limit": 1.0},
        {"flavor": "f", "resource": "A100", "nominal": 2.0, "used": 0.0, "borrowing_limit": None,
         "lending_limit": None}]}]


def test_the_api_finds_dispatch_through_entry_points_that_name_platform_code(monkeypatch) -> None:
    group = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][dispatch_reads.GROUP]
    assert sorted(group) == sorted(dispatch_reads.NAMES + dispatch_reads.OPTIONAL)
    assert all(v.startswith("skypurza.services.dispatch.") for v in group.values()), group
    load = dispatch_reads.load()
    assert load is not None and issubclass(load.policy_error, Exception) and load.share_rows is not None
    with pytest.raises(load.policy_error) as err:
        load.load_policy("queues:\n  - name: q\n    teem: t\n", "p.yaml")
    assert (err.value.problems[0].line, err.value.problems[0].key) == (3, "queues[0].teem")
    monkeypatch.setenv(dispatch_reads.SKIP_ENV, "1")
    assert dispatch_reads.load() is None  # the open server alone: the dispatch endpoints say so


def test_gpu_rows_are_one_per_gpu_of_each_nodes_last_sample_bounded_and_hostile_input_dropped(monkeypatch) -> None:
    from skypurza.services.api import observability_view
    from skypurza.services.api.observability_view import gpu_rows

    gpu = {"index": 0, "name": "H100", "utilization_pct": 87, "memory_total_mib": 81559.0, "power_w": True}
    nodes = [
        {"cluster": "b", "rank": 1, "sample": {"ts": "t2", "cpu_pct": 5, "gpus": [gpu, {**gpu, "index": 1}]},
         "findings": [{"rule": "xid"}]},
        {"cluster": "a", "rank": 0, "sample": {"ts": "t1", "gpus": [], "gpu_error": "nvidia-smi: not found" * 50}},
        {"cluster": "c", "rank": 0, "sample": None, "findings": [{"rule": "xid"}]},  # read back, no sample yet
        "not a node", {"cluster": "d", "rank": 0, "sample": {"ts": "t", "gpus": ["junk", 3]}},
    ]
    rows, truncated = gpu_rows(nodes)
    assert not truncated
    assert [(r["cluster"], r["rank"], r["gpu_index"]) for r in rows] == [("a", 0, None), ("b", 1, 0), ("b", 1, 1),
                                                                          ("d", 0, None)]
    a, b0 = rows[0], rows[1]
    assert len(a["gpu_error"]) == observability_view.MAX_TEXT_CHARS and a["utilization_pct"] is None
    assert (b0["utilization_pct"], b0["memory_total_mib"], b0["power_w"], b0["findings"]) == (87.0, 81559.0, None, 1)
    assert [r["cluster"] for r in gpu_rows(nodes, "b")[0]] == ["b", "b"]
    monkeypatch.setattr(observability_view, "MAX_GPU_ROWS", 2)
    rows, truncated = gpu_rows(nodes)
    assert len(rows) == 2 and truncated


def test_a_fatal_finding_is_a_drain_and_a_warning_is_not() -> None:
    from skypurza.events.health_events import GpuUnhealthy
    from skypurza.services.api.observability_view import finding_row

    fatal = GpuUnhealthy(cluster="c", rank=0, gpu_index=2, rule="xid", detail="GPU 2: Xid 79", detected_at=NOW)
    warm = GpuUnhealthy(cluster="c", rank=0, rule="thermal_throttle", severity="warning", detected_at=NOW)
    assert finding_row(7, fatal) == {"seq": 7, "cluster": "c", "rank": 0, "gpu_index": 2, "rule": "xid",
                                     "severity": "fatal", "detail": "GPU 2: Xid 79",
                                     "detected_at": NOW.isoformat(), "drained": True}
    assert finding_row(8, warm)["drained"] is False and finding_row(8, warm)["gpu_index"] is None


def test_a_managed_job_then_is_pending_until_its_first_change_and_owned_as_the_stamp_says() -> None:
    from skypurza.events.bus import Stored
    from skypurza.events.managed_events import ManagedJobStatusChanged, ManagedJobSubmitted
    from skypurza.services.api.timetravel import PastManagedJob

    def stored(seq: int, ev: object) -> Stored:
        return Stored(seq=seq, subject="s", timestamp=NOW, envelope=None, event=ev, status="ok")  # type: ignore[arg-type]

    past = PastManagedJob(3)
    past.add(stored(1, ManagedJobSubmitted(managed_job_id=3, name="train", tasks=[], user="alice", team="ml")))
    assert past.row() == {"job_id": 3, "name": "train", "user": "alice", "team": "ml", "status": "PENDING"}
    past.add(stored(2, ManagedJobStatusChanged(managed_job_id=3, status="STARTING", kind="launch", cluster="c1")))
    past.add(stored(3, ManagedJobStatusChanged(managed_job_id=3, status="RECOVERING", kind="preempted", cluster="c1")))
    past.add(stored(4, ManagedJobStatusChanged(managed_job_id=3, status="RUNNING", kind="started", cluster="c2")))
    assert past.row()["status"] == "RUNNING" and past.clusters == ["c1", "c2"]
    assert [c["kind"] for c in past.changes] == ["launch", "preempted", "started"]
