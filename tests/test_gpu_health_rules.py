"""The GPU health rules (pure) over samples made from the recorded fixtures, the thresholds in
settings, and the agent's view draining a cluster on a fatal GpuUnhealthy."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from fake_gpu import FIXTURES

from skypurza.events.health_events import GpuUnhealthy
from skypurza.events.job_events import JobQueued
from skypurza.events.models import Candidate, ClusterProvisioned
from skypurza.events.nodesample import GpuSample, NodeSample
from skypurza.events.payloads import TaskPayload
from skypurza.events.settings import SettingsError
from skypurza.services.agent import smi
from skypurza.services.agent.view import ClusterView
from skypurza.services.observability.gpuhealth.rules import evaluate
from skypurza.services.observability.gpuhealth.settings import HealthSettings

T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
CFG = HealthSettings()


def sample_of(case: str, *, expected: int = 2, busy: list[int] | None = None) -> NodeSample:
    reading = smi.parse_query((FIXTURES / case / "smi.txt").read_text())
    xids = smi.parse_xids((FIXTURES / case / "dmesg.txt").read_text())
    return NodeSample(cluster="c", rank=0, ts=T0.isoformat(), expected_gpus=expected, busy_gpus=busy or [],
                      gpus=smi.with_xids(reading.gpus, xids), unlisted=smi.unlisted(xids, reading.gpus),
                      gpu_error=reading.errors[0] if reading.errors else "", xid_source="dmesg")


def rules_of(case: str, **kw) -> list[tuple]:
    return sorted((f.rule, f.severity, f.gpu_index) for f in evaluate(sample_of(case, **kw), T0, {}, CFG).findings)


def test_healthy_finds_nothing():
    assert rules_of("healthy") == []


def test_xid79_is_fatal_and_the_gpu_is_missing():
    found = evaluate(sample_of("xid79"), T0, {}, CFG).findings
    assert sorted((f.rule, f.severity, f.gpu_index) for f in found) == [("gpu_missing", "fatal", None),
                                                                     ("xid", "fatal", None)]
    xid = next(f for f in found if f.rule == "xid")
    assert xid.evidence["xid"] == 79 and "fallen off the bus" in xid.detail and xid.evidence["pci_bus_id"]


def test_ecc_uncorrected_and_xid48_are_fatal_on_gpu0():
    assert rules_of("ecc") == [("ecc_uncorrected", "fatal", 0), ("xid", "fatal", 0)]


def test_missing_gpu_vs_what_was_provisioned():
    assert rules_of("missing") == [("gpu_missing", "fatal", None)]
    assert rules_of("missing", expected=1) == []


def test_app_xids_are_warnings_and_ignored_xids_are_not_reported():
    s = NodeSample(cluster="c", rank=0, ts="t", gpus=[GpuSample(index=0, xids=[{"code": 13, "count": 2}])])
    assert [(f.rule, f.severity) for f in evaluate(s, T0, {}, CFG).findings] == [("xid", "warning")]
    quiet = HealthSettings.load({"SKYPURZA_GPUHEALTH_IGNORED_XIDS": "13"})
    assert evaluate(s, T0, {}, quiet).findings == []
    strict = HealthSettings.load({"SKYPURZA_GPUHEALTH_FATAL_XIDS": "13,79"})
    assert [f.severity for f in evaluate(s, T0, {}, strict).findings] == ["fatal"]


def test_idle_gpu_held_by_a_job_is_reported_after_idle_s_only():
    cfg = HealthSettings.load({"SKYPURZA_GPUHEALTH_IDLE_S": "600"})
    s = NodeSample(cluster="c", rank=0, ts="t", busy_gpus=[0],
                   gpus=[GpuSample(index=0, utilization_pct=0), GpuSample(index=1, utilization_pct=0)])
    first = evaluate(s, T0, {}, cfg)
    assert first.findings == [] and list(first.since) == ["c|0|0|gpu_idle"]  # GPU 1 is held by no job
    early = evaluate(s, T0 + timedelta(seconds=599), first.since, cfg)
    assert early.findings == []
    late = evaluate(s, T0 + timedelta(seconds=601), early.since, cfg)
    assert [(f.rule, f.gpu_index, f.severity) for f in late.findings] == [("gpu_idle", 0, "warning")]
    busy_again = s.model_copy(update={"gpus": [GpuSample(index=0, utilization_pct=80)]})
    assert evaluate(busy_again, T0 + timedelta(seconds=602), late.since, cfg).since == {}  # the clock starts over


def test_thermal_throttling_lasting_throttle_s():
    cfg = HealthSettings.load({}, {"gpuhealth": {"throttle_s": 60}})
    s = NodeSample(cluster="c", rank=0, ts="t", gpus=[GpuSample(index=3, throttle_reasons=["hw_thermal_slowdown"],
                                                               temperature_c=92)])
    e = evaluate(s, T0, {}, cfg)
    assert e.findings == []
    e2 = evaluate(s, T0 + timedelta(seconds=61), e.since, cfg)
    assert [(f.rule, f.gpu_index) for f in e2.findings] == [("thermal_throttle", 3)]
    assert e2.findings[0].evidence["temperature_c"] == 92


def _corrected(count: int | None) -> NodeSample:
    return NodeSample(cluster="c", rank=0, ts="t", gpu_source="dcgm",
                      gpus=[GpuSample(index=1, ecc_corrected_volatile=count, ecc_uncorrected_volatile=0)])


def test_a_rising_corrected_ecc_count_is_a_warning_within_the_window_only():
    cfg = HealthSettings.load({}, {"gpuhealth": {"ecc_corrected_rise": 10, "ecc_corrected_window_s": 600}})
    assert (HealthSettings().ecc_corrected_rise, HealthSettings().ecc_corrected_window_s) == (100, 3600.0)
    e = evaluate(_corrected(500), T0, {}, cfg, {})
    assert e.findings == []  # a count already high when first seen is not a rise
    e = evaluate(_corrected(509), T0 + timedelta(seconds=300), e.since, cfg, e.ecc_base)
    assert e.findings == []  # 9 < 10
    e2 = evaluate(_corrected(510), T0 + timedelta(seconds=400), e.since, cfg, e.ecc_base)
    [f] = e2.findings
    assert (f.rule, f.severity, f.gpu_index) == ("ecc_corrected", "warning", 1)
    assert (f.evidence["rise"], f.evidence["base"], f.evidence["ecc_corrected_volatile"]) == (10, 500, 510)
    assert f.detail == "GPU 1: corrected ECC errors rose by 10 in 400 s (to 510, volatile)"
    # The window passed: the base is taken again, so a slow climb is never a rise.
    e3 = evaluate(_corrected(515), T0 + timedelta(seconds=601), e.since, cfg, e.ecc_base)
    assert e3.findings == [] and e3.ecc_base["c|0|1|ecc_corrected"] == (T0 + timedelta(seconds=601), 515)
    # The driver reloaded (volatile counts restart): the lower count is the new base.
    e4 = evaluate(_corrected(3), T0 + timedelta(seconds=100), e.since, cfg, e.ecc_base)
    assert e4.findings == [] and e4.ecc_base["c|0|1|ecc_corrected"][1] == 3
    # No reading (nvidia-smi has no corrected column): no base, no finding.
    assert evaluate(_corrected(None), T0, {}, cfg, e.ecc_base).ecc_base == {}
    off = HealthSettings.load({"SKYPURZA_GPUHEALTH_ECC_CORRECTED_RISE": "0"})
    assert evaluate(_corrected(10**6), T0 + timedelta(seconds=1), {}, off, {"c|0|1|ecc_corrected": (T0, 0)}).findings == []


@pytest.mark.parametrize("env", [{"SKYPURZA_GPUHEALTH_FATAL_XIDS": "79,abc"}, {"SKYPURZA_GPUHEALTH_IDLE_S": "0"},
                                 {"SKYPURZA_GPUHEALTH_ECC_UNCORRECTED": "0"},
                                 {"SKYPURZA_GPUHEALTH_ECC_CORRECTED_RISE": "-1"},
                                 {"SKYPURZA_GPUHEALTH_ECC_CORRECTED_WINDOW_S": "10"}])
def test_bad_thresholds_are_refused_with_their_name(env):
    with pytest.raises(SettingsError, match=next(iter(env))):
        HealthSettings.load(env)


def test_a_fatal_finding_drains_the_cluster_in_the_agents_view():
    view = ClusterView("c", 1)
    view.apply(ClusterProvisioned(cluster="c", task_id="t", placement_id="p", candidate=Candidate(infra="local"),
                                  nodes=[], hourly_price_micros=0, launched_at=T0), "e1", T0)
    task = TaskPayload.model_validate({"run": "true"})
    view.apply(JobQueued(cluster="c", job_id=1, task_id="t", task=task), "e2", T0)
    assert [a.job_id for a in view.admissions()] == [1]
    view.apply(GpuUnhealthy(cluster="c", rank=0, rule="gpu_idle", severity="warning", detected_at=T0), "e3", T0)
    assert [a.job_id for a in view.admissions()] == [1]  # a warning does not drain
    view.apply(GpuUnhealthy(cluster="c", rank=0, gpu_index=1, rule="xid", detail="GPU 1: Xid 79",
                            detected_at=T0), "e4", T0)
    assert view.drained == {0: "GPU 1: Xid 79"} and view.admissions() == []
