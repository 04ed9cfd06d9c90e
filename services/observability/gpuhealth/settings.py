"""The GPU health manager's thresholds (events/settings.py: environment, then `config.yaml`'s
`gpuhealth.*`, then the default). docs/gpu-health.md lists them.

    SKYPURZA_GPUHEALTH_FATAL_XIDS=48,64,74,79,95,119,120   gpuhealth.fatal_xids     Xids that drain the node
    SKYPURZA_GPUHEALTH_IGNORED_XIDS=                       gpuhealth.ignored_xids   Xids never reported
    SKYPURZA_GPUHEALTH_ECC_UNCORRECTED=1                   gpuhealth.ecc_uncorrected   volatile uncorrected ECC errors that drain; 1-1e9
    SKYPURZA_GPUHEALTH_ECC_CORRECTED_RISE=100              gpuhealth.ecc_corrected_rise   corrected ECC errors risen this much warn; 0 off, up to 1e9
    SKYPURZA_GPUHEALTH_ECC_CORRECTED_WINDOW_S=3600         gpuhealth.ecc_corrected_window_s   ... within this; 60-604800
    SKYPURZA_GPUHEALTH_IDLE_PCT=1                          gpuhealth.idle_pct       utilisation under this is idle; 0-100
    SKYPURZA_GPUHEALTH_IDLE_S=1800                         gpuhealth.idle_s         idle this long while a job holds the GPU; 1-604800
    SKYPURZA_GPUHEALTH_THROTTLE_S=300                      gpuhealth.throttle_s     thermal/power throttling this long; 1-86400
    SKYPURZA_GPUHEALTH_MAX_NODES=20000                     gpuhealth.max_nodes      nodes whose last sample is kept; 1-1000000
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skypurza.events.settings import SettingsError, Sources

from .xids import DEFAULT_FATAL

WEEK_S = 7 * 86400.0


def _codes(src: Sources, var: str, key: str, default: tuple[int, ...]) -> frozenset[int]:
    if src.raw(var, key) is None:
        return frozenset(default)
    names = src.names(var, key=key)
    out = set()
    for n in names:
        if not n.isdigit() or int(n) > 100_000:
            raise SettingsError(f"{var}={','.join(names)}: {n!r} is not an Xid code (a whole number)")
        out.add(int(n))
    return frozenset(out)


@dataclass(frozen=True)
class HealthSettings:
    fatal_xids: frozenset[int] = frozenset(DEFAULT_FATAL)
    ignored_xids: frozenset[int] = frozenset()
    ecc_uncorrected: int = 1
    ecc_corrected_rise: int = 100
    ecc_corrected_window_s: float = 3600.0
    idle_pct: float = 1.0
    idle_s: float = 1800.0
    throttle_s: float = 300.0
    max_nodes: int = 20000

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None) -> HealthSettings:
        src = Sources.load(env, config)
        b = cls()
        return cls(
            fatal_xids=_codes(src, "SKYPURZA_GPUHEALTH_FATAL_XIDS", "gpuhealth.fatal_xids", DEFAULT_FATAL),
            ignored_xids=_codes(src, "SKYPURZA_GPUHEALTH_IGNORED_XIDS", "gpuhealth.ignored_xids", ()),
            ecc_uncorrected=src.integer("SKYPURZA_GPUHEALTH_ECC_UNCORRECTED", b.ecc_uncorrected, low=1,
                                        high=10**9, key="gpuhealth.ecc_uncorrected"),
            ecc_corrected_rise=src.integer("SKYPURZA_GPUHEALTH_ECC_CORRECTED_RISE", b.ecc_corrected_rise, low=0,
                                           high=10**9, key="gpuhealth.ecc_corrected_rise"),
            ecc_corrected_window_s=src.seconds("SKYPURZA_GPUHEALTH_ECC_CORRECTED_WINDOW_S", b.ecc_corrected_window_s,
                                               low=60, high=WEEK_S, key="gpuhealth.ecc_corrected_window_s"),
            idle_pct=src.number("SKYPURZA_GPUHEALTH_IDLE_PCT", b.idle_pct, low=0, high=100, key="gpuhealth.idle_pct"),
            idle_s=src.seconds("SKYPURZA_GPUHEALTH_IDLE_S", b.idle_s, low=1, high=WEEK_S, key="gpuhealth.idle_s"),
            throttle_s=src.seconds("SKYPURZA_GPUHEALTH_THROTTLE_S", b.throttle_s, low=1, high=86400,
                                   key="gpuhealth.throttle_s"),
            max_nodes=src.integer("SKYPURZA_GPUHEALTH_MAX_NODES", b.max_nodes, low=1, high=1_000_000,
                                  key="gpuhealth.max_nodes"),
        )
