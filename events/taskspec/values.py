"""Parsers for the small languages inside a task YAML: infra strings, cpus/memory, disk sizes,
accelerator strings, autostop, ports. Pure functions; each raises ValueError with a message
that says what was found and what is accepted.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Any

# SkyPilot 0.14.1's cloud names (skylet/constants.py ALL_CLOUDS), as its schema lists them.
SKYPILOT_CLOUDS: tuple[str, ...] = (
    "aws", "azure", "gcp", "ibm", "lambda", "scp", "oci", "kubernetes", "runpod", "vast",
    "vsphere", "cudo", "fluidstack", "paperspace", "primeintellect", "do", "nebius", "ssh",
    "slurm", "hyperbolic", "seeweb", "shadeform", "yotta", "mithril", "verda",
)
# SkyPurza's own infra: this machine as a one-node cluster. Not a SkyPilot name; accepted in
# `infra:` and `--infra` only.
SPZ_CLOUDS: tuple[str, ...] = ("local",)
_K8S_ALIASES = ("kubernetes", "k8s")

DISK_TIERS: tuple[str, ...] = ("low", "medium", "high", "ultra", "best")
NETWORK_TIERS: tuple[str, ...] = ("standard", "best")
# Managed-job recovery strategies registered in 0.14.1 (jobs/recovery_strategy.py);
# "none" switches recovery off.
RECOVERY_STRATEGIES: tuple[str, ...] = ("EAGER_NEXT_REGION", "FAILOVER")
DEFAULT_RECOVERY_STRATEGY = "EAGER_NEXT_REGION"
AUTOSTOP_WAIT_FOR: tuple[str, ...] = ("jobs_and_ssh", "jobs", "none")
DEFAULT_AUTOSTOP_IDLE_MINUTES = 5
# Where a task's workdir is synced on every node (no file mount may take it).
SKY_REMOTE_WORKDIR = "~/sky_workdir"

ENV_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# Task names (sky/task.py _VALID_NAME_REGEX): alphanumerics joined by at most two of . _ -
TASK_NAME_RE = re.compile(r"^[a-zA-Z0-9]+(?:[._-]{1,2}[a-zA-Z0-9]+)*$")
JOB_GROUP_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
# Size strings of disk_size / storage config (the SkyPilot schema's pattern).
DISK_SIZE_RE = re.compile(r"^[0-9]+(kb|ki|mb|mi|gb|gi|tb|ti|pb|pi|KB|KI|MB|MI|GB|GI|TB|TI|PB|PI|Kb|Ki|Mb|Mi|Gb|Gi|Tb|Ti|Pb|Pi)?$")
AUTOSTOP_RE = re.compile(r"^[0-9]+(m|h|d|w|M|H|D|W)?$")

from skypurza.events.limits import (
    MAX_ACCELERATOR_COUNT,
    MAX_CPUS,
    MAX_DISK_GB,
    MAX_IDLE_MINUTES,
    MAX_MEMORY_GIB,
    MAX_MEMORY_RATIO,
    MAX_PORT_ENTRIES,
)

_UNIT_BYTES = {
    "kb": 2**10, "ki": 2**10, "mb": 2**20, "mi": 2**20, "gb": 2**30, "gi": 2**30,
    "tb": 2**40, "ti": 2**40, "pb": 2**50, "pi": 2**50,
}
_GIB = 2**30


def did_you_mean(word: str, choices: list[str] | tuple[str, ...], cutoff: float = 0.6) -> str:
    """' Did you mean 'x'?' (with a leading space) or ''."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    if not matches:
        lowered = {c.lower(): c for c in choices}
        hit = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=cutoff)
        matches = [lowered[h] for h in hit]
    return f" Did you mean '{matches[0]}'?" if matches else ""


def _num(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def as_number(value: float) -> int | float:
    """8.0 -> 8, 0.5 -> 0.5: how counts and sizes read back to a user."""
    return int(value) if float(value).is_integer() else value


# ------------------------------------------------------------------------------------------ infra

@dataclass(frozen=True)
class Infra:
    cloud: str | None  # lower-case; "kubernetes" for k8s; None for "*"
    region: str | None  # for kubernetes: the context; for ssh: the node pool
    zone: str | None


_INFRA_FORMS = ("aws, aws/us-east-1, aws/us-east-1/us-east-1a, aws/*/use1-az4, */us-east-1, "
                "k8s, k8s/CONTEXT, ssh/NODE-POOL")


def parse_infra(text: str) -> Infra:
    """`cloud[/region[/zone]]` with `*` wildcards; `k8s/<context, may contain '/'>`."""
    if not text or text.strip() != text:
        raise ValueError(f"expected CLOUD[/REGION[/ZONE]] (e.g. {_INFRA_FORMS}), found {text!r}")
    head, _, rest = text.partition("/")
    cloud = head.lower()
    if cloud in _K8S_ALIASES:
        if _ and not rest:
            raise ValueError(f"'{text}': the Kubernetes context after '/' is empty")
        return Infra("kubernetes", rest or None, None)
    parts = text.split("/")
    if any(p == "" for p in parts):
        raise ValueError(f"'{text}' has an empty part; expected CLOUD[/REGION[/ZONE]] (e.g. {_INFRA_FORMS})")
    if len(parts) > 3:
        raise ValueError(f"'{text}' has {len(parts)} parts; expected at most CLOUD/REGION/ZONE")
    known = SKYPILOT_CLOUDS + SPZ_CLOUDS + ("k8s",)
    if cloud != "*" and cloud not in known:
        raise ValueError(
            f"unknown cloud '{head}' in infra '{text}'.{did_you_mean(cloud, known)} "
            f"Accepted clouds: {', '.join(sorted(set(known)))}, or '*' for any")
    if cloud in SPZ_CLOUDS and len(parts) > 1:
        raise ValueError(f"infra '{cloud}' takes no region or zone, found '{text}'")

    def part(i: int) -> str | None:
        return None if len(parts) <= i or parts[i] == "*" else parts[i]

    return Infra(None if cloud == "*" else cloud, part(1), part(2))


def format_infra(infra: Infra) -> str:
    parts = [infra.cloud or "*", infra.region or "*", infra.zone or "*"]
    while len(parts) > 1 and parts[-1] == "*":
        parts.pop()
    return "/".join(parts)


# ------------------------------------------------------------------------------ cpus and memory

@dataclass(frozen=True)
class Amount:
    value: float | None  # vCPUs or GiB
    plus: bool = False  # "4+": at least
    ratio: float | None = None  # memory "4x": GiB per vCPU


def parse_cpus(raw: Any) -> Amount:
    text = str(raw).strip() if not isinstance(raw, bool) else ""
    plus = text.endswith("+")
    value = _num(text[:-1] if plus else text)
    if value is None:
        raise ValueError(f"expected a number of vCPUs like 4 or 4+ (at least 4), found {raw!r}")
    if value <= 0:
        raise ValueError(f"cpus must be positive, found {raw!r}")
    if value > MAX_CPUS:
        raise ValueError(f"cpus must be at most {MAX_CPUS} (the largest instances have 896), found {raw!r}")
    return Amount(value, plus)


def parse_memory(raw: Any) -> Amount:
    """`16`, `16+`, `16GB`, `32GB+`, `1TB`, `512MB`, `4x` (GiB per vCPU). Plain numbers are GiB."""
    accepted = "16 (GiB), 16+ (at least), 16GB, 1TB+, 512MB, or 4x (GiB per vCPU)"
    text = str(raw).strip() if not isinstance(raw, bool) else ""
    plus = text.endswith("+")
    body = text[:-1] if plus else text
    if body.lower().endswith("x"):
        ratio = _num(body[:-1])
        if ratio is None or ratio <= 0:
            raise ValueError(f"expected memory like {accepted}, found {raw!r}")
        if ratio > MAX_MEMORY_RATIO:
            raise ValueError(f"memory per vCPU must be at most {MAX_MEMORY_RATIO}x, found {raw!r}")
        return Amount(None, plus, ratio)
    value = _num(body)
    if value is None:
        lowered = body.lower()
        for unit, size in _UNIT_BYTES.items():
            if lowered.endswith(unit):
                number = _num(lowered[: -len(unit)])
                if number is not None:
                    value = number * size / _GIB
                break
    if value is None:
        raise ValueError(f"expected memory like {accepted}, found {raw!r}")
    if value <= 0:
        raise ValueError(f"memory must be positive, found {raw!r}")
    if value > MAX_MEMORY_GIB:
        raise ValueError(f"memory must be at most {MAX_MEMORY_GIB:,} GiB, found {raw!r}")
    return Amount(value, plus)


def parse_disk_size(raw: Any) -> int:
    """Whole GB: `256`, `1TB` (1024), `512Gi`."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw <= 0:
            raise ValueError(f"disk size must be positive, found {raw}")
        if raw > MAX_DISK_GB:
            raise ValueError(f"disk size must be at most {MAX_DISK_GB:,} GB (64 TiB), found {raw}")
        return raw
    text = str(raw)
    if not DISK_SIZE_RE.match(text):
        raise ValueError(f"expected a size in GB like 256, 256GB, 1TB or 512Gi, found {raw!r}")
    digits = re.match(r"^[0-9]+", text)
    assert digits is not None
    if len(digits.group(0).lstrip("0")) > 24:  # past any bound in any unit; int() of it is costly
        raise ValueError(f"disk size must be at most {MAX_DISK_GB:,} GB (64 TiB), found {text[:30]!r}...")
    number = int(digits.group(0))
    unit = text[digits.end():].lower() or "gb"
    size_bytes = number * _UNIT_BYTES[unit]
    if size_bytes % _GIB:
        raise ValueError(f"disk size {raw!r} is not a whole number of GB")
    gb = size_bytes // _GIB
    if gb <= 0:
        raise ValueError(f"disk size must be positive, found {raw!r}")
    if gb > MAX_DISK_GB:
        raise ValueError(f"disk size must be at most {MAX_DISK_GB:,} GB (64 TiB), found {raw!r}")
    return gb


# ---------------------------------------------------------------------------------- accelerators

_ACC_FORBIDDEN = set("{}[],")


def parse_accelerator(text: str) -> tuple[str, int | float]:
    """`A100` -> (A100, 1); `A100:8` -> (A100, 8); `A100:0.5` -> (A100, 0.5). Name as written."""
    if any(ch in _ACC_FORBIDDEN for ch in text):
        raise ValueError(
            f"expected NAME or NAME:COUNT (e.g. A100:8), found {text!r}. To offer a choice of "
            "accelerators write a YAML list [A100:8, H100:8] (in order of preference) or a set "
            "{A100:8, H100:8} (cheapest first), not a quoted string")
    name, sep, count_text = text.partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"expected NAME or NAME:COUNT (e.g. A100:8), found {text!r}")
    if not sep:
        return name, 1
    count = _num(count_text.strip())
    if count is None or ":" in count_text:
        raise ValueError(f"expected NAME or NAME:COUNT with a number COUNT (e.g. A100:8, A100:0.5), found {text!r}")
    if count <= 0:
        raise ValueError(f"accelerator count must be positive, found {text!r}")
    if count > MAX_ACCELERATOR_COUNT:
        raise ValueError(f"accelerator count must be at most {MAX_ACCELERATOR_COUNT} per node, found {text!r}")
    return name, as_number(count)


# -------------------------------------------------------------------------------------- autostop

def accelerator_choices(v: Any) -> list[str]:
    """Accelerators as NAME[:COUNT] strings, in the written order (empty when none)."""
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, list):
        return list(v)
    return [key if count is None else f"{key}:{count}" for key, count in v.items()]


@dataclass(frozen=True)
class Autostop:
    enabled: bool
    idle_minutes: int = DEFAULT_AUTOSTOP_IDLE_MINUTES
    down: bool = False
    wait_for: str = "jobs_and_ssh"


_AUTOSTOP_UNIT_MINUTES = {"m": 1, "h": 60, "d": 60 * 24, "w": 60 * 24 * 7}


def autostop_minutes(text: str) -> int:
    if not AUTOSTOP_RE.match(text):
        raise ValueError(f"expected minutes like 10, or a duration like 10m, 2h, 1d, 1w, found {text!r}")
    unit = text[-1].lower() if text[-1].isalpha() else "m"
    digits = (text[:-1] if text[-1].isalpha() else text).lstrip("0") or "0"
    minutes = int(digits) * _AUTOSTOP_UNIT_MINUTES[unit] if len(digits) <= 12 else MAX_IDLE_MINUTES + 1
    check_idle_minutes(minutes, text)
    return minutes


def check_idle_minutes(minutes: int, shown: Any = None) -> None:
    """Idle minutes of autostop: at most MAX_IDLE_MINUTES (a year; more means "never")."""
    if minutes > MAX_IDLE_MINUTES:
        raise ValueError(f"autostop must be at most {MAX_IDLE_MINUTES:,} idle minutes (a year; leave autostop off "
                         f"for never), found {shown if shown is not None else minutes!r}")


def parse_autostop(raw: Any) -> Autostop:
    """true/false, minutes (int or '10m', '2h'), or {idle_minutes, down, wait_for, ...}."""
    if isinstance(raw, bool):
        return Autostop(raw)
    if isinstance(raw, int):
        return Autostop(raw >= 0, max(raw, 0))
    if isinstance(raw, str):
        return Autostop(True, autostop_minutes(raw))
    if isinstance(raw, dict):
        idle = raw.get("idle_minutes", DEFAULT_AUTOSTOP_IDLE_MINUTES)
        return Autostop(True, int(idle), bool(raw.get("down", False)),
                        str(raw.get("wait_for") or "jobs_and_ssh").lower())
    raise ValueError(f"expected true/false, minutes, a duration like 10m or a mapping, found {raw!r}")


# ----------------------------------------------------------------------------------------- ports

def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_port(text: str, original: Any) -> None:
    if not (text.isascii() and text.isdigit() and len(text) <= 5) or not 1 <= int(text) <= 65535:
        raise ValueError(f"expected a port 1-65535 or a range like 8000-8010, found {_shown(original)}")


def normalize_port(item: Any) -> str:
    """8080 -> '8080'; '8000-8010' checked and kept."""
    if isinstance(item, bool):
        raise ValueError(f"expected a port 1-65535 or a range like 8000-8010, found {item!r}")
    text = str(item).strip()
    if "-" in text:
        low, _, high = text.partition("-")
        _check_port(low.strip(), item)
        _check_port(high.strip(), item)
        if int(low) > int(high):
            raise ValueError(f"port range {_shown(item)} runs backwards")
        return f"{int(low)}-{int(high)}"
    if "," in text:
        raise ValueError(f"expected one port or range per item, found {_shown(item)}; write a list: [8080, 9090]")
    _check_port(text, item)
    return text


def normalize_ports(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = raw if isinstance(raw, list) else [raw]
    if len(items) > MAX_PORT_ENTRIES:
        raise ValueError(f"at most {MAX_PORT_ENTRIES} ports or ranges allowed, found {len(items)}")
    return tuple(normalize_port(i) for i in items)


# ------------------------------------------------------------------------------------ local_disk

_LOCAL_DISK_RE = re.compile(r"^(?:(nvme|ssd)(?::(\d+)(\+)?)?|(\d+)(\+)?)$", re.IGNORECASE)


def parse_local_disk(text: str) -> tuple[str, int, bool]:
    """`[nvme|ssd:]size[+]` or a mode alone (size 100+): (mode, GB, at_least)."""
    m = _LOCAL_DISK_RE.match(text.strip())
    if not m:
        raise ValueError(f"expected [nvme|ssd:]SIZE[+] or nvme/ssd (e.g. nvme:1000+, ssd:500, 1000+), found {text!r}")
    size = m.group(2) or m.group(4)
    if size is not None and (len(size.lstrip("0")) > 6 or int(size) > MAX_DISK_GB):
        raise ValueError(f"local disk size must be at most {MAX_DISK_GB:,} GB, found {text[:30]!r}")
    if m.group(1):
        mode = m.group(1).lower()
        if m.group(2) is None:
            return mode, 100, True
        return mode, int(m.group(2)), bool(m.group(3))
    return "nvme", int(m.group(4)), bool(m.group(5))
