"""NVIDIA GPUs of this node, for NodeReady.gpus (name as DCGM or nvidia-smi reports it, shortened).

The same source choice as the samples (sampling.py, `SKYPURZA_AGENT_GPU_SOURCE`): `auto` asks
DCGM (`dcgmi discovery -l`) and falls back to nvidia-smi when dcgmi is absent, fails, hangs or
lists no GPU; `dcgm` and `nvidia-smi` force one. Placement and the health rule "a GPU missing
from the node" trust this count, so a node announces what its own GPU source sees.
"""

from __future__ import annotations

import re

# dcgm and sampling (node-sample models) are imported where a detection runs, not with the agent's
# entry point: the agent's start imports only what it needs (tests/test_cli_light.py).

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


def names_of_discovery(text: str) -> dict[str, int]:
    """`dcgmi discovery -l` -> {short name: count} (a GPU listed without a name counts as `GPU`)."""
    from . import dcgm

    found, _ = dcgm.parse_discovery(text)
    out: dict[str, int] = {}
    for gpu in found.values():
        name = short_name(gpu.name) if gpu.name.strip() else "GPU"
        out[name] = out.get(name, 0) + 1
    return out


def detect_gpus(source: str = "auto", *, smi_exe: str = "nvidia-smi", dcgm_exe: str = "dcgmi",
                timeout_s: float = 10.0) -> dict[str, int]:
    """{short name: count} of this node's GPUs; {} on a node without them (or whose source fails)."""
    from . import dcgm
    from .sampling import run_tool

    if source in ("auto", "dcgm"):
        code, out = run_tool((dcgm_exe, *dcgm.DISCOVERY_ARGS), timeout_s)
        names = names_of_discovery(out) if code == 0 else {}
        if names or source == "dcgm":
            return names
    code, out = run_tool((smi_exe, "--query-gpu=name", "--format=csv,noheader"), timeout_s)
    return parse_gpu_names(out) if code == 0 else {}
