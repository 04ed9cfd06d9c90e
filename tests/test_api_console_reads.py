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
