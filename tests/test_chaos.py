"""The chaos campaign (bench/chaos.py) as a test: managed jobs on the local infra while
nats-server and the services are SIGKILLed at random, with CLI calls racing the restarts
(issue 11 §1). Nothing acknowledged is lost, no id is issued twice, every job ends exactly once,
no CLI call hangs or shows a traceback, nothing is left running, and the ledger equals a replay."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "chaos.py"


def _load():
    spec = importlib.util.spec_from_file_location("spz_bench_chaos", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(900)
def test_campaign_with_random_kills_loses_and_duplicates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    chaos = _load()
    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path))
    monkeypatch.delenv("SPZ_CHAOS_KEEP", raising=False)
    try:
        report = chaos.run_campaign(jobs=20, kills=4, seed=11, deadline_s=400, home=tmp_path)
    finally:  # whatever a failed campaign left behind
        from leftovers import kill_stage

        sd = tmp_path / chaos.STAGE
        kill_stage(tmp_path, chaos.STAGE)
        for pid in chaos._agents_under(sd):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    assert len(report.kills_done) == 4
    assert report.probes_acked > 100 and report.probes_lost == 0, report
    assert report.submissions_ok + report.submissions_refused == 20 and report.submissions_lost == 0, report
    assert report.ids_issued_twice == 0 and report.terminal_more_than_once == 0, report
    assert report.started_more_than_once == 0, report
    assert report.stuck == 0, report.notes
    assert report.cli_hung == 0 and report.cli_tracebacks == 0, report.notes
    assert report.leftover_control_plane == 0 and report.leftover_agents == 0, report
    assert report.audit_equal, report.notes
