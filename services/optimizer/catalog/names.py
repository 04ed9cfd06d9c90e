"""Accelerator names: map what AWS and nvidia-smi call a GPU to the catalog's spelling."""

from __future__ import annotations

import re
from typing import Iterable

_VENDOR_WORDS = ("nvidia", "tesla", "geforce", "quadro")


def gpu_catalog_name(raw: str, memory_mib: int | None, known: Iterable[str]) -> str:
    """Map an nvidia-smi product name to the catalog's spelling.

    "NVIDIA H200" -> H200, "NVIDIA A100-SXM4-80GB" -> A100-80GB, "Tesla T4" -> T4,
    "NVIDIA H100 80GB HBM3" -> H100, "NVIDIA GeForce RTX 4090" -> RTX4090. Names the catalog
    does not know are returned cleaned (vendor words dropped, spaces removed).
    """
    words = [w for w in re.split(r"[\s_]+", raw.strip()) if w and w.lower() not in _VENDOR_WORDS]
    canon = {k.lower().replace(" ", ""): k for k in known}
    tokens = "-".join(words).split("-")  # "A100-SXM4-80GB" and "H100 80GB HBM3" alike
    base = None
    # Longest run of leading tokens that is a known name: RTX + 4090 -> RTX4090, L40S beats L40.
    for n in range(len(tokens), 0, -1):
        for joiner in ("", "-"):
            cand = joiner.join(tokens[:n]).lower()
            if cand in canon:
                base = canon[cand]
                break
        if base:
            break
    if base is None:
        return "".join(words) or raw.strip()
    # Memory variants the catalog spells separately (A100-80GB, V100-32GB): from the name
    # ("A100-SXM4-80GB") or from the reported memory.
    for tok in tokens:
        if re.fullmatch(r"\d+GB", tok, re.IGNORECASE) and f"{base}-{tok}".lower() in canon:
            return canon[f"{base}-{tok}".lower()]
    if memory_mib:
        gib = round(memory_mib / 1024)
        for size in (gib, 80 if 76 <= gib <= 84 else None, 32 if 30 <= gib <= 34 else None):
            if size is None:
                continue
            variant = f"{base}-{size}GB".lower()
            if variant in canon and not base.lower().endswith("gb"):
                return canon[variant]
    return base
