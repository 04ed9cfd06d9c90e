"""The ledger's settings from `~/.skypurza/config.yaml` (read through events.config).

    billing:
      weights:
        default: "CPU=1.0,Mem=0.25G,GRES/gpu=2.0"   # TRESBillingWeights of every team ...
        teams: {ml-research: "CPU=1.0,GRES/gpu:h100=4.0"}   # ... unless the team has its own
      flags: MAX_TRES                                # PriorityFlags (billing formula)
    teams: {alice: ml-research}                      # user -> team, when a task names none
    team: platform                                   # the team of everyone else
    metering_tick_s: 60                              # SKYPURZA_METERING_TICK_S overrides; 0-86400, 0: off

`billing.weights` may also be a plain string: the default weights. Weights and flags are parsed
when the config is read, so a typo is reported at start, with the file's path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from skypurza.events.config import ConfigError, load_config
from skypurza.events.settings import Sources

from .billing import BillingWeights, billing, billing_mode, parse_weights, weights_for_team

DEFAULT_TICK_S = 60.0
TICK_ENV = "SKYPURZA_METERING_TICK_S"
TICK_MAX_S = 86400.0


@dataclass
class LedgerConfig:
    default_weights: BillingWeights = field(default_factory=lambda: parse_weights(""))
    team_weights: dict[str, BillingWeights] = field(default_factory=dict)
    flags: str = ""
    user_teams: dict[str, str] = field(default_factory=dict)
    default_team: str | None = None
    tick_s: float = DEFAULT_TICK_S
    _cache: dict[tuple[str | None, str], int] = field(default_factory=dict, repr=False)
    _units: dict[tuple[str | None, str], float] = field(default_factory=dict, repr=False)

    def team_of(self, user: str) -> str | None:
        return self.user_teams.get(user) or self.default_team

    def billing_int(self, team: str | None, tres: dict[str, int], tres_key: str) -> int:
        """Slurm's stored integer billing of one node with `tres` under the team's weights."""
        key = (team, tres_key)
        value = self._cache.get(key)
        if value is None:
            weights = weights_for_team(team, self.team_weights, self.default_weights)
            try:
                value = billing(weights, tres, self.flags).billing_int
            except ValueError:
                value = 0  # a TRES name Slurm would not track: bill it in money only
            self._cache[key] = value
        return value

    def billing_units(self, team: str | None, tres: dict[str, int], tres_key: str) -> float:
        """The untruncated billing (Slurm's billable_tres double), which fairshare accrues."""
        key = (team, tres_key)
        value = self._units.get(key)
        if value is None:
            weights = weights_for_team(team, self.team_weights, self.default_weights)
            try:
                value = billing(weights, tres, self.flags).billing_double
            except ValueError:
                value = 0.0
            self._units[key] = value
        return value


def parse_ledger_config(data: dict[str, Any], where: str = "config",
                        env: Mapping[str, str] | None = None) -> LedgerConfig:
    bill = data.get("billing") or {}
    if not isinstance(bill, dict):
        raise ConfigError(f"{where}: billing must be a mapping (weights, flags)")
    weights = bill.get("weights") or {}
    if isinstance(weights, str):
        weights = {"default": weights}
    if not isinstance(weights, dict):
        raise ConfigError(f"{where}: billing.weights must be a string or a mapping (default, teams)")
    try:
        default = parse_weights(str(weights.get("default") or ""))
        teams = {str(t): parse_weights(str(w)) for t, w in (weights.get("teams") or {}).items()}
        flags = str(bill.get("flags") or "")
        billing_mode(flags)
    except ValueError as exc:
        raise ConfigError(f"{where}: billing: {exc}") from None
    # The env/config part goes through the one settings pattern (events/settings.py): the
    # environment, then the file's `metering_tick_s`, then the default; 0 turns the tick off.
    tick_s = Sources(os.environ if env is None else env, data, where).seconds(
        TICK_ENV, DEFAULT_TICK_S, high=TICK_MAX_S, key="metering_tick_s")
    return LedgerConfig(
        default_weights=default, team_weights=teams, flags=flags,
        user_teams={str(u): str(t) for u, t in (data.get("teams") or {}).items()},
        default_team=str(data["team"]) if data.get("team") else None, tick_s=tick_s,
    )


def load_ledger_config() -> LedgerConfig:
    cfg = load_config()
    return parse_ledger_config(cfg.data, str(cfg.path))
