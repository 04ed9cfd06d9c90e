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

from skypurza.events.payloads import BlockScope, FailoverBlock, ResourcesPayload, TaskPayload

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


def recovery_of(task: TaskPayload) -> Recovery:
    """The task's job_recovery (from its resources, or the first alternative that sets one)."""
    res = task.resources
    if res is None:
        return Recovery()
    value = res.job_recovery
    if value is None:
        value = next((a.job_recovery for a in res.alternatives() if a.job_recovery is not None), None)
    if value is None:
        return Recovery()
    if isinstance(value, str):
        return Recovery(strategy=_strategy(value))
    return Recovery(strategy=_strategy(value.strategy), max_restarts_on_errors=value.max_restarts_on_errors or 0,
                    recover_on_exit_codes=value.exit_codes())


def _strategy(name: str | None) -> str:
    if name is None:
        return DEFAULT_STRATEGY
    text = name.strip().upper()
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

    task: TaskPayload
    blocks: tuple[FailoverBlock, ...] = ()
    note: str = ""


def _block(scope: BlockScope, infra: str, region: str | None = None, zone: str | None = None,
           instance_type: str | None = None, use_spot: bool | None = None, error_class: str = "preempted"
           ) -> FailoverBlock:
    # Every key given (nulls too): the log has always carried the optimizer's whole Block.
    return FailoverBlock(scope=scope, infra=infra, region=region, zone=zone, instance_type=instance_type,
                         use_spot=use_spot, quota_class=None, error_class=error_class)


def recovery_launch(task: TaskPayload, strategy: str, lost: Placed | None, phase: int) -> LaunchPlan:
    """The launch after a preemption or node loss. `phase` 1 is the strategy's first try;
    phase 2 is the task's own constraints (what both strategies fall back to)."""
    if lost is None or phase >= 2 or lost.infra == "local" or strategy == NONE:
        return LaunchPlan(task, (), "the task's own constraints")
    if strategy == FAILOVER and lost.region:
        blocks: tuple[FailoverBlock, ...] = ()
        if lost.zone:
            blocks = (_block("spot_market", lost.infra, lost.region, lost.zone, lost.instance_type, True),) \
                if lost.use_spot else (_block("zone", lost.infra, lost.region, lost.zone, lost.instance_type),)
        return LaunchPlan(pin_region(task, lost.infra, lost.region), blocks,
                          f"same region first ({lost.infra}/{lost.region}), not zone {lost.zone}")
    if lost.region:
        return LaunchPlan(task, (_block("region", lost.infra, lost.region),),
                          f"region {lost.infra}/{lost.region} blocked")
    return LaunchPlan(task, (), "the task's own constraints")


def pin_region(task: TaskPayload, infra: str, region: str) -> TaskPayload:
    """The task with every resource alternative limited to `infra/region` (a narrower pin that
    the task already has, such as a zone, is kept)."""
    resources = _pin(task.resources or ResourcesPayload(), infra, region)
    alternatives = {key: [_pin(a, infra, region, only_if_located=True).to_dict() for a in alts]
                    for key, alts in (("ordered", resources.ordered), ("any_of", resources.any_of)) if alts is not None}
    if alternatives:
        resources = resources.edited(**alternatives)
    return task.edited(resources=resources.to_dict())


_LOCATION = ("cloud", "region", "zone")  # the deprecated spelling of `infra`


def _pin(res: ResourcesPayload, infra: str, region: str, only_if_located: bool = False) -> ResourcesPayload:
    current = res.infra
    if current is None and any(v is not None for v in (res.cloud, res.region, res.zone)):
        current = "/".join(v or "*" for v in (res.cloud, res.region, res.zone)).rstrip("/*") or None
    if current is None:
        return res.edited(drop=_LOCATION, **({} if only_if_located else {"infra": f"{infra}/{region}"}))
    parts = current.split("/")
    if len(parts) >= 2 and parts[1] not in ("", "*"):
        pinned = current  # already pinned to a region (or a zone): keep it
    else:
        pinned = f"{infra}/{region}" + (f"/{parts[2]}" if len(parts) > 2 else "")
    return res.edited(drop=_LOCATION, infra=pinned)
