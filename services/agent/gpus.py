"""NVIDIA GPUs of this node, for NodeReady.gpus (name as nvidia-smi reports it, shortened)."""

from __future__ import annotations

import re
import shutil
import subprocess

_VENDOR = re.compile(r"^(NVIDIA|Tesla|GeForce|Quadro)\s+", re.IGNORECASE)


def short_name(full: str) -> str:
    """`NVIDIA H100 80GB HBM3` -> `H100`; `Tesla T4` -> `T4`; `NVIDIA A10G` -> `A10G`."""
    name = full.strip()
    while True:
        stripped = _VENDOR.sub("", name)
        if stripped == name:
            break
        name = stripped
    first = name.split()[0] if name.split() else full.strip()
    return first.replace("-SXM4", "").replace("-PCIE", "").replace("-SXM", "")


def parse_gpu_names(text: str) -> dict[str, int]:
    """Lines of `nvidia-smi --query-gpu=name --format=csv,noheader` -> {name: count}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line.strip():
            name = short_name(line)
            out[name] = out.get(name, 0) + 1
    return out


def detect_gpus(exe: str = "nvidia-smi", timeout_s: float = 10.0) -> dict[str, int]:
    path = shutil.which(exe)
    if not path:
        return {}
    try:
        res = subprocess.run([path, "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_gpu_names(res.stdout) if res.returncode == 0 else {}
