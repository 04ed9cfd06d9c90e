"""The meter: which UsageRecorded events are due, from the projected node runs and the clock.

Pure: projected state, an overlay of what this process already published (the projection reads
it back a moment later), the time and the tick in; events out. Each event's id is derived from
the node run (the ClusterProvisioned/ClusterStarted event that began it), the rank and the
interval's start, so an interval published twice (a restarted meter, two meters) is one event:
the stream's de-duplication drops the copy, and the usage table is keyed by event id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from skypurza.events.envelope import derive_id
from skypurza.events.models import UsageRecorded

from .ledgerconfig import LedgerConfig
from .metering import MeteredNode, MeterInterval, interval_billing_seconds, next_intervals
from .projector import State
from .slurm_usage import billing_usage

# The overlay key of an accounted Slurm allocation's billing row: (cluster, SLURM_RANK, usage id).
SLURM_RANK = -1

HANDLER = "ledger-meter"


@dataclass
class Published:
    """What this process published for one node run and the projection may not show yet."""

    metered_until: datetime | None
    finalized: bool


def usage_id(lifetime_id: str, rank: int, iv: MeterInterval) -> str:
    kind = "correction" if iv.correction else "usage"
    return derive_id(lifetime_id, HANDLER, f"{rank}|{iv.start.isoformat()}|{kind}")


def _node(m: dict[str, Any], overlay: Published | None) -> MeteredNode | None:
    until, finalized = m["metered_until"], m["finalized"]
    if overlay is not None:
        if overlay.finalized:
            return None
        if overlay.metered_until is not None and (until is None or overlay.metered_until > until):
            until = overlay.metered_until
    if finalized:
        return None
    return MeteredNode(
        cluster=m["cluster"], rank=m["rank"], instance_type=m["instance_type"], region=m["region"],
        market=m["market"], hourly_price_micros=m["hourly_price_micros"] or 0,
        tres=json.loads(m["tres"] or "{}"), start=m["lifetime_start"], metered_until=until,
        finalized=False, instance_id=m["instance_id"] or "", zone=m["zone"])


def due_usage(state: State, now: datetime, tick: timedelta, cfg: LedgerConfig,
              overlay: dict[tuple[str, int, str], Published], *,
              limit_per_node: int = 10_000) -> list[tuple[str, UsageRecorded]]:
    """(event id, event) of every interval due by `now`, node run by node run, in a stable order.

    `overlay` is updated with what is returned (the caller publishes it); at most
    `limit_per_node` intervals per run (a ledger that was down long catches up over passes).
    """
    out: list[tuple[str, UsageRecorded]] = []
    for key in sorted(state.unfinalized):
        m = state.rows["meters"][key]
        node = _node(m, overlay.get(key))
        if node is None:
            continue
        intervals = next_intervals(node, now, stop=m["stop_at"], tick=tick, limit=limit_per_node)
        if not intervals:
            continue
        team = m["team"] or cfg.team_of(m["user"] or "")
        tres = node.tres
        # A Slurm node's billing-seconds come from Slurm's accounting of the whole allocation, in
        # one row when it ends (slurm_usage.py); its intervals carry the money.
        b = 0 if m["infra"] == "slurm" else cfg.billing_int(team, dict(tres), m["tres"] or "{}")
        units = cfg.billing_units(team, dict(tres), m["tres"] or "{}")
        for iv in intervals:
            seconds = interval_billing_seconds(b, node.start, iv.start, iv.end)
            ev = UsageRecorded(
                cluster=iv.cluster, rank=iv.rank, instance_id=iv.instance_id, start=iv.start, end=iv.end,
                instance_type=iv.instance_type, infra=m["infra"] or "aws", region=iv.region, zone=iv.zone,
                market="spot" if iv.market == "spot" else "on-demand",
                hourly_price_micros=iv.hourly_price_micros, cost_micros=iv.cost_micros, tres=dict(tres),
                billing_seconds=-seconds if iv.correction else seconds, billing=units, user=m["user"] or "", team=team,
                project=m["project"], final=iv.final, correction=iv.correction, lifetime_id=key[2])
            out.append((usage_id(key[2], iv.rank, iv), ev))
        last = intervals[-1]
        overlay[key] = Published(last.start if last.correction else last.end, last.final)
    out.extend(due_slurm_billing(state, cfg, overlay))
    return out


def due_slurm_billing(state: State, cfg: LedgerConfig,
                      overlay: dict[tuple[str, int, str], Published]) -> list[tuple[str, UsageRecorded]]:
    """The billing row of every accounted Slurm allocation not in `usage` yet."""
    out: list[tuple[str, UsageRecorded]] = []
    for uid, key in sorted(state.slurm_unbilled.items(), key=lambda kv: kv[1]):
        okey = (key[0], SLURM_RANK, uid)
        if okey in overlay:
            continue
        row = state.rows["slurm_allocations"][key]
        cluster = state.rows["clusters"].get(row["cluster"])
        team = (cluster or {}).get("team") or cfg.team_of((cluster or {}).get("user") or "")
        out.append((uid, billing_usage(row, cluster, team)))
        overlay[okey] = Published(None, True)
    return out


def forget_applied(state: State, overlay: dict[tuple[str, int, str], Published]) -> None:
    """Drop overlay entries the projection has caught up with."""
    for key in list(overlay):
        if key[1] == SLURM_RANK:
            if key[2] not in state.slurm_unbilled:
                del overlay[key]
            continue
        m = state.rows["meters"].get(key)
        pub = overlay[key]
        if m is None or m["finalized"] or (
                not pub.finalized and m["metered_until"] is not None and pub.metered_until is not None
                and m["metered_until"] >= pub.metered_until):
            del overlay[key]
