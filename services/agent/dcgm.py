"""Pure parsing of what DCGM's CLI says about a node's GPUs: `dcgmi discovery -l` (which GPUs,
their names and PCI bus ids) and one `dcgmi dmon -e <field ids> -c 1` sample. No I/O here
(sampling.py runs the commands); tests feed recorded outputs.

The field ids are DCGM's (`dcgm_fields.h`, docs/observability.md *DCGM* cites them). dmon prints
one whitespace-aligned row per entity, `GPU <id>` then the fields in the order asked for, `N/A`
for a blank value; a header (`#Entity ...`) and a units line (`ID ...`) come first. Only numeric
fields are asked for: a string field (a name) may hold spaces or be cut to its column's width,
so names and bus ids come from discovery instead. MIG entities (`GPU-I`, `GPU-CI`) are skipped:
a sample is per physical GPU.

A GPU discovery lists but dmon gives no row for, or a row with no reading at all, is kept as
unreachable (by its bus id, with its last Xid), never guessed into numbers: that is how a GPU
that fell off the bus (Xid 79) looks through DCGM.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from skypurza.events.nodesample import MAX_GPUS, MAX_NOTE_CHARS, GpuSample, UnlistedDevice, XidCount

from .smi import throttle_reasons

# (DCGM field id, what it is), in the order dmon is asked for them (dcgm_fields.h).
DMON_FIELDS: tuple[tuple[int, str], ...] = (
    (52, "nvml_index"),                # DCGM_FI_DEV_NVML_INDEX: the index nvidia-smi and CUDA use
    (203, "gpu_util"),                 # DCGM_FI_DEV_GPU_UTIL, %
    (252, "fb_used"),                  # DCGM_FI_DEV_FB_USED, MiB
    (250, "fb_total"),                 # DCGM_FI_DEV_FB_TOTAL, MiB
    (155, "power_usage"),              # DCGM_FI_DEV_POWER_USAGE, W
    (150, "gpu_temp"),                 # DCGM_FI_DEV_GPU_TEMP, C
    (311, "ecc_dbe_vol_total"),        # DCGM_FI_DEV_ECC_DBE_VOL_TOTAL: uncorrected (double bit), volatile
    (310, "ecc_sbe_vol_total"),        # DCGM_FI_DEV_ECC_SBE_VOL_TOTAL: corrected (single bit), volatile
    (230, "xid_errors"),               # DCGM_FI_DEV_XID_ERRORS: the last Xid code seen (0: none)
    (112, "clock_throttle_reasons"),   # DCGM_FI_DEV_CLOCK_THROTTLE_REASONS: NVML's bitmask
)
FIELD_IDS = ",".join(str(fid) for fid, _ in DMON_FIELDS)
DISCOVERY_ARGS = ("discovery", "-l")
DMON_ARGS = ("dmon", "-e", FIELD_IDS, "-c", "1")

_NAMES = [name for _, name in DMON_FIELDS]
_READINGS = ("gpu_util", "fb_used", "fb_total", "power_usage", "gpu_temp", "ecc_dbe_vol_total")
_BLANK = {"n/a", "", "[n/a]"}
# DCGM's blank sentinels (DCGM_INT32_BLANK 0x7ffffff0 and up, DCGM_INT64_BLANK, DCGM_FP64_BLANK
# 2^47 and up): dmon prints N/A for them, but a raw one must never read as a value.
_INT_BLANK = 0x7FFFFFF0
MAX_ERRORS = 8


@dataclass(frozen=True)
class DiscoveredGpu:
    gpu_id: int
    name: str = ""
    pci_bus_id: str = ""


@dataclass
class DcgmReading:
    gpus: list[GpuSample] = field(default_factory=list)
    unreachable: list[UnlistedDevice] = field(default_factory=list)  # listed by discovery, no readings
    errors: list[str] = field(default_factory=list)  # lines that were neither a header nor a GPU's row
    rows: int = 0  # GPU rows dmon printed

    @property
    def usable(self) -> bool:
        """dmon printed a row for at least one GPU (garbage, or a host engine that answers with
        no row, is not a reading: the sampler falls back to nvidia-smi then)."""
        return self.rows > 0


def _note(errors: list[str], line: str) -> None:
    if len(errors) < MAX_ERRORS:
        errors.append(line.strip()[:MAX_NOTE_CHARS])


def parse_discovery(text: str) -> tuple[dict[int, DiscoveredGpu], list[str]]:
    """`dcgmi discovery -l`'s GPU table -> {DCGM GPU id: name and bus id}, and lines not understood.

    The table has one block per GPU: `| 0 | Name: NVIDIA H100 80GB HBM3 |`, then rows with an
    empty id cell (`| | PCI Bus ID: 00000000:18:00.0 |`, `| | Device UUID: ... |`). Other tables
    (NvSwitches, CPUs on newer versions) end the GPU one."""
    gpus: dict[int, DiscoveredGpu] = {}
    errors: list[str] = []
    current: int | None = None
    in_gpus = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("+"):
            continue
        if not line.startswith("|"):
            low = line.lower()
            if "gpu" in low and "found" in low:
                in_gpus = True
            elif "found" in low:
                in_gpus, current = False, None  # another entity table (switches, CPUs)
            else:
                _note(errors, line)
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 2 or not in_gpus:
            continue
        ident, info = cells
        if ident.isdigit():
            current = int(ident)
            if current >= 4 * MAX_GPUS or (current not in gpus and len(gpus) >= MAX_GPUS):
                current = None
                continue
            gpus.setdefault(current, DiscoveredGpu(current))
        elif ident:
            current = None  # the header row (`GPU ID | Device Information`)
            continue
        if current is None or ":" not in info:
            continue
        key, value = (part.strip() for part in info.split(":", 1))
        gpu = gpus[current]
        if key.lower() == "name":
            gpus[current] = DiscoveredGpu(gpu.gpu_id, value[:100], gpu.pci_bus_id)
        elif key.lower() == "pci bus id":
            gpus[current] = DiscoveredGpu(gpu.gpu_id, gpu.name, value[:40])
    return gpus, errors


def _value(text: str) -> float | None:
    t = text.strip()
    if t.lower() in _BLANK:
        return None
    try:
        value = float(t)
    except ValueError:
        return None
    if value != value or abs(value) >= _INT_BLANK:
        return None  # NaN, a blank sentinel (no reading of a GPU is 2^31 - 16 or more)
    return value


def _count(text: str) -> int | None:
    value = _value(text)
    return int(value) if value is not None and value >= 0 else None


def parse_dmon(text: str, discovered: dict[int, DiscoveredGpu]) -> DcgmReading:
    """One `dcgmi dmon -e FIELD_IDS -c 1` sample -> the GPUs' readings.

    A row is `GPU <id>` and exactly one value per field asked for; anything else that is not a
    header is an error line. `discovered` gives each GPU's name and bus id; a discovered GPU
    without a row, or whose row has no reading, is unreachable."""
    out = DcgmReading()
    rows: dict[int, dict[str, str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        tokens = line.split()
        if tokens[0] in ("#Entity", "ID") or line.startswith("#"):
            continue
        if tokens[0] in ("GPU-I", "GPU-CI", "vGPU", "Switch"):
            continue
        if tokens[0] != "GPU" or len(tokens) != 2 + len(_NAMES) or not tokens[1].isdigit():
            _note(out.errors, line)
            continue
        gpu_id = int(tokens[1])
        if gpu_id in rows or len(rows) >= MAX_GPUS:
            continue
        rows[gpu_id] = dict(zip(_NAMES, tokens[2:], strict=True))
    out.rows = len(rows)
    seen_index: set[int] = set()
    for gpu_id in sorted(set(rows) | set(discovered)):
        found = discovered.get(gpu_id, DiscoveredGpu(gpu_id))
        row = rows.get(gpu_id)
        xid = _count(row["xid_errors"]) if row else None
        xids = [XidCount(code=xid, count=1)] if xid and xid <= 100_000 else []
        if row is None or all(_value(row[k]) is None for k in _READINGS):
            _note(out.errors, f"GPU {gpu_id} ({found.pci_bus_id or 'bus id unknown'}): no readings from DCGM")
            if len(out.unreachable) < MAX_GPUS:
                out.unreachable.append(UnlistedDevice(pci_bus_id=found.pci_bus_id or f"dcgm-gpu-{gpu_id}",
                                                      xids=xids))
            continue
        index = _count(row["nvml_index"])
        index = gpu_id if index is None else index
        if index >= MAX_GPUS or index in seen_index:
            continue
        seen_index.add(index)
        out.gpus.append(GpuSample(
            index=index, name=found.name, pci_bus_id=found.pci_bus_id, utilization_pct=_value(row["gpu_util"]),
            memory_used_mib=_value(row["fb_used"]), memory_total_mib=_value(row["fb_total"]),
            power_w=_value(row["power_usage"]), temperature_c=_value(row["gpu_temp"]),
            ecc_uncorrected_volatile=_count(row["ecc_dbe_vol_total"]),
            ecc_corrected_volatile=_count(row["ecc_sbe_vol_total"]),
            throttle_reasons=throttle_reasons(row["clock_throttle_reasons"]), xids=xids))
    out.gpus.sort(key=lambda g: g.index)
    return out
