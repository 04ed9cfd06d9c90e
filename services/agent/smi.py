"""Pure parsing of what a node says about its GPUs: `nvidia-smi --query-gpu` CSV and the kernel
log's Xid lines. No I/O here (sampling.py runs the commands); tests feed recorded outputs.

nvidia-smi prints `[N/A]` or `[Not Supported]` for a field a GPU does not report (both become
None), and, for a GPU it cannot reach (Xid 79, "fallen off the bus"), a line such as
`Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error` instead of the GPU's
row: such lines are kept as errors, never guessed into numbers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from skypurza.events.nodesample import MAX_GPUS, MAX_NOTE_CHARS, MAX_XIDS, GpuSample, UnlistedDevice, XidCount

# The --query-gpu fields, in order (`nvidia-smi --help-query-gpu`). clocks_throttle_reasons.active
# is the NVML bitmask (newer drivers call it clocks_event_reasons.active and accept both).
QUERY_FIELDS = ("index", "name", "pci.bus_id", "utilization.gpu", "memory.used", "memory.total", "power.draw",
                "temperature.gpu", "ecc.errors.uncorrected.volatile.total", "clocks_throttle_reasons.active")
QUERY_ARGS = (f"--query-gpu={','.join(QUERY_FIELDS)}", "--format=csv,noheader,nounits")

# NVML's nvmlClocksThrottleReason bits (nvml.h).
THROTTLE_BITS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
_MISSING = {"", "[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", "[gpu is lost]"}
# `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.[0-9a-fA-F]+)?\): (\d+)")
_BUS_ID = re.compile(r"^([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.[0-9a-fA-F]+)?$")


@dataclass
class SmiReading:
    gpus: list[GpuSample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # lines that were not a GPU's row


def _number(text: str) -> float | None:
    t = text.strip()
    if t.lower() in _MISSING:
        return None
    try:
        value = float(t)
    except ValueError:
        return None
    return value if value == value and abs(value) < 1e12 else None  # NaN and absurd values are not readings


def _count(text: str) -> int | None:
    value = _number(text)
    return int(value) if value is not None and value >= 0 else None


def throttle_reasons(text: str) -> list[str]:
    """`0x0000000000000044` -> ["sw_power_cap", "hw_thermal_slowdown"]; unreadable -> []."""
    t = text.strip().lower()
    try:
        mask = int(t, 16) if t.startswith("0x") else int(t)
    except ValueError:
        return []
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def bus_key(bus_id: str) -> tuple[int, int, int] | None:
    """`00000000:3B:00.0` and the kernel log's `0000:3b:00` -> (0, 0x3b, 0)."""
    m = _BUS_ID.match(bus_id.strip())
    return (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)) if m else None


def parse_query(text: str) -> SmiReading:
    out = SmiReading()
    seen: set[int] = set()
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != len(QUERY_FIELDS) or not cols[0].isdigit():
            if len(out.errors) < 8:
                out.errors.append(line[:MAX_NOTE_CHARS])
            continue
        index = int(cols[0])
        if index >= MAX_GPUS or index in seen or len(out.gpus) >= MAX_GPUS:
            continue
        seen.add(index)
        out.gpus.append(GpuSample(
            index=index, name=cols[1][:100], pci_bus_id=cols[2][:40], utilization_pct=_number(cols[3]),
            memory_used_mib=_number(cols[4]), memory_total_mib=_number(cols[5]), power_w=_number(cols[6]),
            temperature_c=_number(cols[7]), ecc_uncorrected_volatile=_count(cols[8]),
            throttle_reasons=throttle_reasons(cols[9])))
    out.gpus.sort(key=lambda g: g.index)
    return out


def parse_xids(kernel_log: str) -> dict[tuple[int, int, int], dict[int, int]]:
    """Xid codes per PCI device (bus key) in a kernel log, with how often each was seen."""
    out: dict[tuple[int, int, int], dict[int, int]] = {}
    for m in _XID.finditer(kernel_log):
        key = (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16))
        codes = out.setdefault(key, {})
        code = int(m.group(4))
        if code in codes or len(codes) < MAX_XIDS:
            codes[code] = codes.get(code, 0) + 1
    return out


def _merged(have: list[XidCount], codes: dict[int, int]) -> list[XidCount]:
    """Xids already known (DCGM's last one) and the kernel log's; the kernel log's count wins."""
    merged = {x.code: x.count for x in have}
    merged.update(codes)
    return [XidCount(code=c, count=n) for c, n in sorted(merged.items())][:MAX_XIDS]


def with_xids(gpus: list[GpuSample], xids: dict[tuple[int, int, int], dict[int, int]]) -> list[GpuSample]:
    """Each GPU with the Xids the kernel logged for its PCI device (added to those it has)."""
    out = []
    for gpu in gpus:
        key = bus_key(gpu.pci_bus_id)
        codes = xids.get(key, {}) if key else {}
        out.append(gpu.model_copy(update={"xids": _merged(gpu.xids, codes)}) if codes else gpu)
    return out


def unlisted(xids: dict[tuple[int, int, int], dict[int, int]], gpus: list[GpuSample],
             unreachable: Sequence[UnlistedDevice] = ()) -> list[UnlistedDevice]:
    """Xids of PCI devices the GPU source does not list (a GPU that fell off the bus has no row),
    and the devices it lists without readings (DCGM's unreachable), each once."""
    listed = {bus_key(g.pci_bus_id) for g in gpus}
    out = []
    for dev in unreachable:
        key = bus_key(dev.pci_bus_id)
        codes = xids.get(key, {}) if key else {}
        out.append(dev.model_copy(update={"xids": _merged(dev.xids, codes)}) if codes else dev)
        listed.add(key)
    out += [UnlistedDevice(pci_bus_id=f"{d:04x}:{b:02x}:{dev:02x}",
                           xids=[XidCount(code=c, count=n) for c, n in sorted(codes.items())])
            for (d, b, dev), codes in sorted(xids.items()) if (d, b, dev) not in listed]
    return out[:MAX_GPUS]
