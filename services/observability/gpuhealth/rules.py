"""The GPU health rules: pure functions of one node's sample, what was seen before (when each
lasting condition began) and the settings. No I/O, no clock: `now` is an argument.

Each rule gives findings (node, GPU index, rule, severity, evidence); a finding's `key` is what
makes it once-only (the service reports each key once). Rules:
- xid: each Xid code the kernel (or DCGM) logged for a GPU, or for a device the GPU source
  (DCGM or nvidia-smi) no longer reads;
  fatal for `fatal_xids` (79 fallen off the bus, 48 double-bit ECC, 64 row remap failure, ...),
  a warning otherwise (13/31/43 are mostly the application's), none for `ignored_xids`;
- ecc_uncorrected: volatile uncorrected ECC errors at or over `ecc_uncorrected`: fatal;
- ecc_corrected: the volatile corrected (single-bit) ECC count risen by `ecc_corrected_rise` or
  more within `ecc_corrected_window_s` (DCGM only: nvidia-smi's query has no such column): a
  warning (the memory still corrects; a rising rate comes before row remapping or an uncorrectable
  error, so the node is watched, not drained);
- gpu_missing: fewer GPUs than the node was provisioned with, or the GPU source failing on a node
  that should have GPUs: fatal (gpu_index None: the node);
- gpu_idle: a GPU a running job holds under `idle_pct` utilisation for `idle_s`: a warning
  (the job wastes it; the GPU is not sick);
- thermal_throttle / power_throttle: a thermal or power-brake slowdown active for `throttle_s`:
  a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from skypurza.events.nodesample import NodeSample

from .settings import HealthSettings
from .xids import meaning

THERMAL = ("hw_thermal_slowdown", "sw_thermal_slowdown")
POWER = ("hw_power_brake_slowdown",)


@dataclass(frozen=True)
class Finding:
    cluster: str
    rank: int
    gpu_index: int | None
    rule: str
    severity: str  # fatal | warning
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        code = self.evidence.get("xid", "")
        return f"{self.cluster}|{self.rank}|{self.gpu_index}|{self.rule}|{code}"


@dataclass(frozen=True)
class Evaluation:
    findings: list[Finding]
    since: dict[str, datetime]  # lasting condition -> when it began (only the conditions still true)
    # GPU -> (when its window began, its corrected ECC count then): the base a rise is measured from
    ecc_base: dict[str, tuple[datetime, int]] = field(default_factory=dict)


def _source(s: NodeSample) -> str:
    """Who listed the node's GPUs (samples from agents before DCGM say nothing: nvidia-smi)."""
    return s.gpu_source or "nvidia-smi"


def _unread(s: NodeSample) -> str:
    return "no readings from DCGM" if s.gpu_source == "dcgm" else f"not listed by {_source(s)}"


def _xid_findings(s: NodeSample, cfg: HealthSettings) -> list[Finding]:
    out = []
    where: list[tuple[int | None, str, list]] = [(g.index, g.pci_bus_id, g.xids) for g in s.gpus]
    where += [(None, d.pci_bus_id, d.xids) for d in s.unlisted]
    for index, bus, xids in where:
        for x in xids:
            if x.code in cfg.ignored_xids:
                continue
            severity = "fatal" if x.code in cfg.fatal_xids else "warning"
            gpu = f"GPU {index}" if index is not None else f"the GPU at {bus or '?'} ({_unread(s)})"
            out.append(Finding(s.cluster, s.rank, index, "xid", severity, f"{gpu}: Xid {x.code} ({meaning(x.code)})",
                               {"xid": x.code, "count": x.count, "pci_bus_id": bus, "meaning": meaning(x.code),
                                "source": s.xid_source}))
    return out


def _ecc_findings(s: NodeSample, cfg: HealthSettings) -> list[Finding]:
    return [Finding(s.cluster, s.rank, g.index, "ecc_uncorrected", "fatal",
                    f"GPU {g.index}: {g.ecc_uncorrected_volatile} uncorrected ECC errors (volatile)",
                    {"ecc_uncorrected_volatile": g.ecc_uncorrected_volatile, "threshold": cfg.ecc_uncorrected})
            for g in s.gpus if g.ecc_uncorrected_volatile is not None
            and g.ecc_uncorrected_volatile >= cfg.ecc_uncorrected]


def _ecc_corrected_findings(s: NodeSample, now: datetime, base: Mapping[str, tuple[datetime, int]],
                            cfg: HealthSettings, kept: dict[str, tuple[datetime, int]]) -> list[Finding]:
    """A rise of the volatile corrected count within a window. The base is taken again when the
    window has passed and when the count fell (the driver reloaded: volatile counts restart)."""
    if cfg.ecc_corrected_rise <= 0:
        return []
    out = []
    for g in s.gpus:
        count = g.ecc_corrected_volatile
        if count is None:
            continue
        key = f"{s.cluster}|{s.rank}|{g.index}|ecc_corrected"
        began, first = base.get(key, (now, count))
        if count < first or (now - began).total_seconds() > cfg.ecc_corrected_window_s:
            began, first = now, count
        kept[key] = (began, first)
        rise = count - first
        if rise >= cfg.ecc_corrected_rise:
            out.append(Finding(s.cluster, s.rank, g.index, "ecc_corrected", "warning",
                               f"GPU {g.index}: corrected ECC errors rose by {rise} in "
                               f"{(now - began).total_seconds():.0f} s (to {count}, volatile)",
                               {"ecc_corrected_volatile": count, "base": first, "since": began.isoformat(),
                                "rise": rise, "threshold": cfg.ecc_corrected_rise,
                                "window_s": cfg.ecc_corrected_window_s, "source": s.gpu_source}))
    return out


def _missing_findings(s: NodeSample) -> list[Finding]:
    if s.expected_gpus <= 0:
        return []
    if len(s.gpus) >= s.expected_gpus and not s.unlisted:
        return []
    seen = [g.index for g in s.gpus]
    why = f"{_source(s)}: {s.gpu_error}" if s.gpu_error else f"{_source(s)} lists {len(seen)}"
    return [Finding(s.cluster, s.rank, None, "gpu_missing", "fatal",
                    f"{len(seen)} of {s.expected_gpus} GPUs visible ({why})",
                    {"expected": s.expected_gpus, "visible": seen, "error": s.gpu_error})]


def _lasting(s: NodeSample, now: datetime, since: Mapping[str, datetime], cfg: HealthSettings,
             kept: dict[str, datetime]) -> list[Finding]:
    out = []
    busy = set(s.busy_gpus)
    for g in s.gpus:
        checks: list[tuple[str, bool, float, str]] = [
            ("gpu_idle", g.index in busy and g.utilization_pct is not None and g.utilization_pct < cfg.idle_pct,
             cfg.idle_s, f"under {cfg.idle_pct:g}% while a job holds it"),
            ("thermal_throttle", any(r in g.throttle_reasons for r in THERMAL), cfg.throttle_s,
             "thermal slowdown"),
            ("power_throttle", any(r in g.throttle_reasons for r in POWER), cfg.throttle_s, "power brake slowdown"),
        ]
        for rule, holds, needed_s, what in checks:
            key = f"{s.cluster}|{s.rank}|{g.index}|{rule}"
            if not holds:
                continue
            began = since.get(key, now)
            kept[key] = began
            lasted = (now - began).total_seconds()
            if lasted >= needed_s:
                out.append(Finding(s.cluster, s.rank, g.index, rule, "warning",
                                   f"GPU {g.index}: {what} for {lasted:.0f} s",
                                   {"since": began.isoformat(), "seconds": round(lasted, 1), "threshold_s": needed_s,
                                    "utilization_pct": g.utilization_pct, "temperature_c": g.temperature_c,
                                    "power_w": g.power_w, "throttle_reasons": list(g.throttle_reasons)}))
    return out


def evaluate(sample: NodeSample, now: datetime, since: Mapping[str, datetime], cfg: HealthSettings,
             ecc_base: Mapping[str, tuple[datetime, int]] | None = None) -> Evaluation:
    """The findings of one sample; `since` holds when each lasting condition of this node began
    and `ecc_base` each GPU's corrected ECC base (both from earlier samples). The returned ones
    replace this node's entries."""
    kept: dict[str, datetime] = {}
    bases: dict[str, tuple[datetime, int]] = {}
    findings = (_xid_findings(sample, cfg) + _ecc_findings(sample, cfg)
                + _ecc_corrected_findings(sample, now, ecc_base or {}, cfg, bases) + _missing_findings(sample)
                + _lasting(sample, now, since, cfg, kept))
    return Evaluation(findings, kept, bases)
