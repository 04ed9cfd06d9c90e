"""The optimizer's settings: environment first, then `~/.skypurza/config.yaml`, then defaults
(events/settings.py, the pattern of every service).

    SKYPURZA_MAX_PLACEMENT_ATTEMPTS=64     # attempts per task before PlacementFailed; 1-10000
                                           # (config: optimizer.max_placement_attempts)
    SKYPURZA_LIVE_SPOT_PRICES=0            # 1: read live spot prices before a first placement
                                           # (config: optimizer.live_spot_prices)
    SKYPURZA_ENABLED_INFRAS=aws,local      # the infras placement may use, whatever is configured
                                           # (environment only); unset: world.py decides
    allowed_infras: [aws, local]           # config only: the infras tasks may be placed on

A value outside its range is a SettingsError naming the variable, the value and the range.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skypurza.events.settings import Sources

# Attempts per task before PlacementFailed; decide.py reads it from here (the settings import no
# event model, so `spz launch --dryrun` stays light).
DEFAULT_MAX_ATTEMPTS = 64


@dataclass(frozen=True)
class OptimizerSettings:
    max_placement_attempts: int = DEFAULT_MAX_ATTEMPTS
    live_spot_prices: bool = False
    enabled_infras: tuple[str, ...] = ()  # empty: AWS if configured, local while no cloud is
    allowed_infras: tuple[str, ...] | None = None  # None: no restriction from the config

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None) -> "OptimizerSettings":
        src = Sources.load(env, config)
        base = cls()
        allowed = src.names(None, key="allowed_infras")
        return cls(
            max_placement_attempts=src.integer("SKYPURZA_MAX_PLACEMENT_ATTEMPTS", base.max_placement_attempts,
                                               low=1, high=10000, key="optimizer.max_placement_attempts"),
            live_spot_prices=src.flag("SKYPURZA_LIVE_SPOT_PRICES", base.live_spot_prices,
                                      key="optimizer.live_spot_prices"),
            enabled_infras=tuple(x.lower() for x in src.names("SKYPURZA_ENABLED_INFRAS")),
            allowed_infras=tuple(x.lower() for x in allowed) or None,
        )
