"""Node samples: parsing recorded nvidia-smi and kernel-log outputs (pure), the agent's
settings for them, and the sampler run against the fake nvidia-smi/dmesg executables."""

from __future__ import annotations

import pytest
from fake_gpu import FIXTURES, install

from skypurza.events.nodesample import NodeSample, decode_sample
from skypurza.events.settings import SettingsError
from skypurza.services.agent import sampling, smi
from skypurza.services.agent.settings import AgentSettings


def _fixture(case: str, name: str) -> str:
    return (FIXTURES / case / name).read_text()


def test_healthy_rows_parse_with_na_and_not_supported_as_none():
    r = smi.parse_query(_fixture("healthy", "smi.txt"))
    assert r.errors == []
    assert [g.index for g in r.gpus] == [0, 1]
    g0, g1 = r.gpus
    assert (g0.utilization_pct, g0.memory_used_mib, g0.memory_total_mib, g0.power_w, g0.temperature_c) == \
        (97.0, 61234.0, 81559.0, 512.34, 61.0)
    assert g0.ecc_uncorrected_volatile == 0 and g0.throttle_reasons == []
    assert g1.power_w is None and g1.ecc_uncorrected_volatile is None  # [N/A], [Not Supported]
    assert g1.throttle_reasons == ["sw_power_cap"]


def test_a_lost_gpu_is_an_error_line_not_a_row():
    r = smi.parse_query(_fixture("xid79", "smi.txt"))
    assert [g.index for g in r.gpus] == [0]
    assert r.errors == ["Unable to determine the device handle for GPU0000:2A:00.0: Unknown Error"]


def test_garbage_and_duplicates_never_become_gpus():
    text = "0, A, 00000000:18:00.0, 1, 2, 3, 4, 5, 6, 0x0\n0, dup, x, 1, 2, 3, 4, 5, 6, 0x0\nnot,a,row\n" \
           "99, big, x, 1, 2, 3, 4, 5, 6, 0x0\n1, B, x, nan, inf, 1e30, -, 5, -3, zz\n"
    r = smi.parse_query(text)
    assert [g.index for g in r.gpus] == [0, 1]
    b = r.gpus[1]
    assert b.utilization_pct is None and b.memory_used_mib is None and b.memory_total_mib is None
    assert b.ecc_uncorrected_volatile is None and b.throttle_reasons == []
    assert r.errors == ["not,a,row"]


def test_throttle_mask_bits():
    assert smi.throttle_reasons("0x0000000000000044") == ["sw_power_cap", "hw_thermal_slowdown"]
    assert smi.throttle_reasons("0x80") == ["hw_power_brake_slowdown"]
    assert smi.throttle_reasons("[N/A]") == []


def test_xids_from_the_kernel_log_attach_to_their_gpu_or_stay_unlisted():
    ecc = smi.parse_xids(_fixture("ecc", "dmesg.txt"))
    assert ecc == {(0, 0x18, 0): {48: 1}}
    gpus = smi.with_xids(smi.parse_query(_fixture("ecc", "smi.txt")).gpus, ecc)
    assert [(x.code, x.count) for x in gpus[0].xids] == [(48, 1)] and gpus[1].xids == []
    lost = smi.parse_xids(_fixture("xid79", "dmesg.txt"))
    listed = smi.parse_query(_fixture("xid79", "smi.txt")).gpus
    un = smi.unlisted(lost, listed)
    assert [(d.pci_bus_id, [x.code for x in d.xids]) for d in un] == [("0000:2a:00", [79])]
    assert smi.parse_xids(_fixture("healthy", "dmesg.txt")) == {}


def test_proc_readers():
    assert sampling.read_cpu_times("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1") == sampling.CpuTimes(busy=150,
                                                                                                  total=1000)
    assert sampling.read_cpu_times("garbage") is None
    used, total = sampling.read_meminfo("MemTotal:  2048000 kB\nMemFree: 1 kB\nMemAvailable:  1024000 kB\n")
    assert (used, total) == (1000.0, 2000.0)


def test_sample_settings_are_bounded():
    assert AgentSettings.load({}).sample_s == 10.0
    assert AgentSettings.load({"SKYPURZA_AGENT_SAMPLE_S": "0"}).sample_s == 0.0
    with pytest.raises(SettingsError, match="SKYPURZA_AGENT_SAMPLE_S"):
        AgentSettings.load({"SKYPURZA_AGENT_SAMPLE_S": "0.01"})
    with pytest.raises(SettingsError, match="SKYPURZA_AGENT_XID_SOURCE"):
        AgentSettings.load({"SKYPURZA_AGENT_XID_SOURCE": "syslog"})


def test_oversized_or_bad_samples_are_refused():
    assert decode_sample(b"{" + b" " * 70_000 + b"}") is None
    assert decode_sample(b"not json") is None
    assert decode_sample(b'{"cluster": "c", "rank": -1, "ts": "x"}') is None
    ok = decode_sample(NodeSample(cluster="c", rank=0, ts="t").model_dump_json().encode())
    assert ok is not None and ok.cluster == "c"


@pytest.mark.parametrize("case", ["healthy", "xid79", "ecc", "missing"])
def test_sampler_runs_the_fake_tools(case, tmp_path, monkeypatch):
    """The real Sampler, running the fake executables as subprocesses on PATH."""
    bin_dir = install(tmp_path / "bin")
    home = tmp_path / "clusters" / "c1" / "node-0"
    home.mkdir(parents=True)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("SPZ_FAKE_GPU_MAP", f"c1={case}")
    monkeypatch.chdir(home)
    s = sampling.Sampler(home).sample("c1", 0, "i-1", "2026-12-01T00:00:00+00:00", expected_gpus=2, busy_gpus=[0])
    assert s.memory_total_mib and s.disk_total_gib and s.xid_source == "dmesg"
    if case == "healthy":
        assert len(s.gpus) == 2 and s.gpu_error == "" and s.unlisted == []
    if case == "xid79":
        assert [g.index for g in s.gpus] == [0] and "Unable to determine" in s.gpu_error
        assert [x.code for x in s.unlisted[0].xids] == [79]
    if case == "ecc":
        assert s.gpus[0].ecc_uncorrected_volatile == 2 and [x.code for x in s.gpus[0].xids] == [48]
    if case == "missing":
        assert len(s.gpus) == 1 and s.expected_gpus == 2
