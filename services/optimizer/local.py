"""The `local` infra: what this machine offers (CPUs, memory, NVIDIA GPUs).

`detect_local_resources()` reads the machine (os.cpu_count, /proc/meminfo, `nvidia-smi`);
the parsing is in pure functions so it is tested without the hardware.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Iterable

from .catalog.names import gpu_catalog_name


@dataclass(frozen=True)
class LocalResources:
    cpus: int
    memory_gib: float
    gpus: dict[str, int] = field(default_factory=dict)  # catalog spelling -> count

    def describe(self) -> str:
        gpus = ", ".join(f"{n}:{c}" for n, c in sorted(self.gpus.items())) or "no NVIDIA GPU"
        return f"{self.cpus} CPUs, {self.memory_gib:g} GiB memory, {gpus}"


def parse_meminfo(text: str) -> float:
    """MemTotal of /proc/meminfo in GiB (rounded to 0.1)."""
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    if not m:
        raise ValueError("no MemTotal in /proc/meminfo")
    return round(int(m.group(1)) / (1024 * 1024), 1)


def parse_nvidia_smi(text: str, known: Iterable[str]) -> dict[str, int]:
    """Lines of `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader`."""
    known = tuple(known)
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, _, mem = line.rpartition(",")
        if not name:  # no memory column
            name, mem = mem, ""
        m = re.search(r"(\d+)\s*MiB", mem)
        gpu = gpu_catalog_name(name, int(m.group(1)) if m else None, known)
        out[gpu] = out.get(gpu, 0) + 1
    return out


def detect_local_resources(known_accelerators: Iterable[str] | None = None,
                           nvidia_smi: str | None = "nvidia-smi", timeout_s: float = 5.0) -> LocalResources:
    """This machine's CPUs, memory and NVIDIA GPUs (none when nvidia-smi is absent or fails)."""
    if known_accelerators is None:
        from .catalog import load_catalog

        cat = load_catalog()
        known_accelerators = set(cat.accelerator_clouds) | set(cat.accelerators())
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open("/proc/meminfo") as f:
            mem = parse_meminfo(f.read())
    except OSError:
        mem = 0.0
    import shutil

    gpus: dict[str, int] = {}
    exe = shutil.which(nvidia_smi) if nvidia_smi else None
    if exe:
        import subprocess  # only with a GPU tool to run: a dry run on a machine without one spares it

        try:
            res = subprocess.run([exe, "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=timeout_s)
            if res.returncode == 0:
                gpus = parse_nvidia_smi(res.stdout, known_accelerators)
        except (OSError, subprocess.SubprocessError):
            pass  # a broken driver means no usable GPU, not a failed placement
    return LocalResources(cpus=cpus, memory_gib=mem, gpus=gpus)
