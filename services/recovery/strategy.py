"""Recovery strategies as pure functions: what a task's `job_recovery` says, and what the next
launch of a preempted task may use.

SkyPilot 0.14.1 (../shared/reference/skypilot-contract.md §4.7):
- FAILOVER: relaunch pinned to the previous cloud and region; if that fails, relaunch with the
  task's own constraints.
- EAGER_NEXT_REGION (the default): relaunch with the previous region blocked; then with the
  task's own constraints. SkyPilot's blocking branch never fires (it tests a region that is
  always set), so its "next region" is in fact any region. Here the block is real: it goes in
  the new TaskSubmitted's `initial_blocks`, and the optimizer honours it.
- `max_restarts_on_errors` (default 0) restarts after user-code failures, counted;
  `recover_on_exit_codes` restarts on those exit codes without counting.

Here FAILOVER also blocks the preempted zone's spot market (or, on demand, the zone) inside the
pinned region, so the first retry lands in another zone of the same region when one exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EAGER_NEXT_REGION = "EAGER_NEXT_REGION"
FAILOVER = "FAILOVER"
NONE = "NONE"
DEFAULT_STRATEGY = EAGER_NEXT_REGION


@dataclass(frozen=True)
class Recovery:
    strategy: str = DEFAULT_STRATEGY
    max_restarts_on_errors: int = 0
    recover_on_exit_codes: frozenset[int] = frozenset()

    def restart_counted(self, exit_code: int | None, restarts_so_far: int) -> bool | None:
        """After a user-code failure: None (do not restart), False (restart, not counted), True
        (restart, counted)."""
        if exit_code is not None and exit_code in self.recover_on_exit_codes:
            return False
        if restarts_so_far < self.max_restarts_on_errors:
            return True
        return None


def recovery_of(task: dict[str, Any]) -> Recovery:
    """The task's job_recovery (from its resources, or the first alternative that sets one)."""
    resources = task.get("resources") or {}
    value = resources.get("job_recovery")
    if value is None:
        for key in ("ordered", "any_of"):
            for alt in resources.get(key) or []:
                if isinstance(alt, dict) and alt.get("job_recovery") is not None:
                    value = alt["job_recovery"]
                    break
            if value is not None:
                break
    if value is None:
        return Recovery()
    if isinstance(value, str):
        return Recovery(strategy=_strategy(value))
    if isinstance(value, dict):
        codes = value.get("recover_on_exit_codes")
        if isinstance(codes, int):
            codes = [codes]
        return Recovery(
            strategy=_strategy(value.get("strategy")),
            max_restarts_on_errors=int(value.get("max_restarts_on_errors") or 0),
            recover_on_exit_codes=frozenset(int(c) for c in (codes or [])),
        )
    return Recovery()


def _strategy(name: Any) -> str:
    if name is None:
        return DEFAULT_STRATEGY
    text = str(name).strip().upper()
    return NONE if text == "NONE" else text


@dataclass(frozen=True)
class Placed:
    """Where a lost cluster ran (from its ClusterProvisioned candidate)."""

    infra: str
    region: str | None
    zone: str | None
    instance_type: str | None
    use_spot: bool


@dataclass(frozen=True)
class LaunchPlan:
    """What one launch of a task may use: a task (maybe pinned to a region) and the blocks."""

    task: dict[str, Any]
    blocks: tuple[dict[str, Any], ...] = ()
    note: str = ""


def _block(scope: str, infra: str, region: str | None = None, zone: str | None = None,
           instance_type: str | None = None, use_spot: bool | None = None, error_class: str = "preempted"
           ) -> dict[str, Any]:
    # The optimizer's Block.to_dict() shape (services/optimizer/placement.py).
    return {"scope": scope, "infra": infra, "region": region, "zone": zone, "instance_type": instance_type,
            "use_spot": use_spot, "quota_class": None, "error_class": error_class}


def recovery_launch(task: dict[str, Any], strategy: str, lost: Placed | None, phase: int) -> LaunchPlan:
    """The launch after a preemption or node loss. `phase` 1 is the strategy's first try;
    phase 2 is the task's own constraints (what both strategies fall back to)."""
    if lost is None or phase >= 2 or lost.infra == "local" or strategy == NONE:
        return LaunchPlan(task, (), "the task's own constraints")
    if strategy == FAILOVER and lost.region:
        blocks: tuple[dict[str, Any], ...] = ()
        if lost.zone:
            blocks = (_block("spot_market", lost.infra, lost.region, lost.zone, lost.instance_type, True),) \
                if lost.use_spot else (_block("zone", lost.infra, lost.region, lost.zone, lost.instance_type),)
        return LaunchPlan(pin_region(task, lost.infra, lost.region), blocks,
                          f"same region first ({lost.infra}/{lost.region}), not zone {lost.zone}")
    if lost.region:
        return LaunchPlan(task, (_block("region", lost.infra, lost.region),),
                          f"region {lost.infra}/{lost.region} blocked")
    return LaunchPlan(task, (), "the task's own constraints")


def pin_region(task: dict[str, Any], infra: str, region: str) -> dict[str, Any]:
    """The task with every resource alternative limited to `infra/region` (a narrower pin that
    the task already has, such as a zone, is kept)."""
    out = dict(task)
    resources = dict(task.get("resources") or {})
    resources = _pin(resources, infra, region)
    for key in ("ordered", "any_of"):
        if isinstance(resources.get(key), list):
            resources[key] = [_pin(dict(a), infra, region, only_if_located=True) if isinstance(a, dict) else a
                              for a in resources[key]]
    out["resources"] = resources
    return out


def _pin(res: dict[str, Any], infra: str, region: str, only_if_located: bool = False) -> dict[str, Any]:
    current = res.get("infra")
    if current is None and any(k in res for k in ("cloud", "region", "zone")):
        current = "/".join(str(res.get(k) or "*") for k in ("cloud", "region", "zone")).rstrip("/*") or None
    for k in ("cloud", "region", "zone"):
        res.pop(k, None)
    if current is None:
        if not only_if_located:
            res["infra"] = f"{infra}/{region}"
        return res
    parts = str(current).split("/")
    if len(parts) >= 2 and parts[1] not in ("", "*"):
        res["infra"] = current  # already pinned to a region (or a zone): keep it
    else:
        res["infra"] = f"{infra}/{region}" + (f"/{parts[2]}" if len(parts) > 2 else "")
    return res
