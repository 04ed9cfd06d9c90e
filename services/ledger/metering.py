"""Usage metering: the intervals [start, end) that tile a node's lifetime, and their cost.

Why the shapes below:

- Boundaries are fixed points in time, not "every tick since the meter started": multiples of
  the tick counted from the Unix epoch, plus every UTC midnight. So the intervals a node gets
  do not depend on when the meter ran or restarted; a replay, a restarted meter and an
  uninterrupted meter all produce the same rows, and no interval crosses a day (or a month, the
  settlement period).
- Cost is never computed per interval on its own. The cumulative cost at elapsed time e since
  the node started is ``floor(price_micros_per_hour × e_µs / 3_600_000_000)``, and an interval
  costs the difference of the cumulative cost at its two ends. The sum over any tiling
  telescopes to the cumulative cost of the whole lifetime, exactly, in integer micro-dollars.
- The caller owns the state: it passes where the event log says metering stopped
  (``metered_until``), so a restarted meter resumes without gaps or double counting.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

__all__ = [
    "DEFAULT_TICK",
    "MeterInterval",
    "MeteredNode",
    "accrued_cost_micros",
    "advance",
    "cumulative_cost_micros",
    "instance_tres",
    "interval_billing_seconds",
    "interval_cost_micros",
    "next_boundary",
    "next_intervals",
]

DEFAULT_TICK = timedelta(seconds=60)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_US_PER_HOUR = 3_600_000_000
_US_PER_DAY = 86_400_000_000
_GPU_MODEL_RE = re.compile(r"^[a-z0-9_.\-]+$")


def _us(td: timedelta) -> int:
    return td // _US


def _utc(name: str, t: datetime) -> datetime:
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got naive {t.isoformat()}")
    return t.astimezone(UTC)


def _tick_us(tick: timedelta | int) -> int:
    us = tick * 1_000_000 if isinstance(tick, int) else _us(tick)
    if us <= 0:
        raise ValueError(f"tick must be positive, got {tick!r}")
    return us


def cumulative_cost_micros(hourly_price_micros: int, elapsed: timedelta) -> int:
    """Cost of running ``elapsed`` since the node started: floor(price × elapsed / 1 h)."""
    if not isinstance(hourly_price_micros, int) or hourly_price_micros < 0:
        raise ValueError(f"hourly price must be a non-negative int of micro-dollars, got {hourly_price_micros!r}")
    us = _us(elapsed)
    if us < 0:
        raise ValueError(f"elapsed time must be >= 0, got {elapsed}")
    return hourly_price_micros * us // _US_PER_HOUR


def interval_cost_micros(
    hourly_price_micros: int, lifetime_start: datetime, start: datetime, end: datetime
) -> int:
    """Cost of [start, end) within a lifetime that began at ``lifetime_start``.

    Negative when end < start (a correction that takes back over-metered time).
    """
    ls = _utc("lifetime_start", lifetime_start)
    return cumulative_cost_micros(hourly_price_micros, _utc("end", end) - ls) - cumulative_cost_micros(
        hourly_price_micros, _utc("start", start) - ls
    )


def interval_billing_seconds(
    billing_int: int, lifetime_start: datetime, start: datetime, end: datetime
) -> int:
    """Billing-seconds (Slurm's stored integer billing × seconds, sreport's basis) of
    [start, end), telescoping like the cost so the sum over ticks is the lifetime's exactly."""
    if not isinstance(billing_int, int) or billing_int < 0:
        raise ValueError(f"billing must be a non-negative int (the stored billing), got {billing_int!r}")
    ls = _utc("lifetime_start", lifetime_start)

    def cum(t: datetime) -> int:
        us = _us(_utc("time", t) - ls)
        if us < 0:
            raise ValueError(f"{t.isoformat()} is before the lifetime start {ls.isoformat()}")
        return billing_int * us // 1_000_000

    return cum(end) - cum(start)


def accrued_cost_micros(hourly_price_micros: int, start: datetime, at: datetime) -> int:
    """Cost so far of a node that started at ``start``, as of ``at`` (for live displays)."""
    s, a = _utc("start", start), _utc("at", at)
    return cumulative_cost_micros(hourly_price_micros, max(a - s, timedelta(0)))


def next_boundary(t: datetime, tick: timedelta | int = DEFAULT_TICK) -> datetime:
    """The first boundary strictly after ``t``: a multiple of ``tick`` from the epoch, or a UTC midnight."""
    us = _us(_utc("t", t) - _EPOCH)
    step = _tick_us(tick)
    by_tick = (us // step + 1) * step
    by_day = (us // _US_PER_DAY + 1) * _US_PER_DAY
    return _EPOCH + timedelta(microseconds=min(by_tick, by_day))


@dataclass(frozen=True)
class MeteredNode:
    """What the meter knows of one node's current run (one lifetime: from start to stop).

    A node that is stopped and started again begins a new lifetime with a new ``start``.
    ``metered_until`` is the end of the last interval already in the event log (None: nothing
    metered yet); ``finalized`` is True once the interval ending at the stop was recorded.
    """

    cluster: str
    rank: int
    instance_type: str | None
    region: str | None
    market: str
    hourly_price_micros: int
    tres: Mapping[str, int]
    start: datetime
    metered_until: datetime | None = None
    finalized: bool = False
    instance_id: str = ""
    zone: str | None = None


@dataclass(frozen=True)
class MeterInterval:
    cluster: str
    rank: int
    instance_type: str | None
    region: str | None
    market: str
    hourly_price_micros: int
    tres: Mapping[str, int]
    start: datetime
    end: datetime
    cost_micros: int
    final: bool = False  # ends at the node's stop/termination
    correction: bool = False  # [stop, metered_until): takes back time metered past a late-known stop
    instance_id: str = ""
    zone: str | None = None

    @property
    def seconds(self) -> Decimal:
        return Decimal(_us(self.end - self.start)) / 1_000_000


def _interval(node: MeteredNode, start: datetime, end: datetime, *, final: bool, correction: bool = False) -> MeterInterval:
    return MeterInterval(
        cluster=node.cluster,
        rank=node.rank,
        instance_type=node.instance_type,
        region=node.region,
        market=node.market,
        hourly_price_micros=node.hourly_price_micros,
        tres=dict(node.tres),
        start=start,
        end=end,
        # A correction takes back [start, end): the cost of that span, negated.
        cost_micros=interval_cost_micros(node.hourly_price_micros, node.start, start, end)
        * (-1 if correction else 1),
        final=final,
        correction=correction,
        instance_id=node.instance_id,
        zone=node.zone,
    )


def next_intervals(
    node: MeteredNode,
    now: datetime,
    *,
    stop: datetime | None = None,
    tick: timedelta | int = DEFAULT_TICK,
    limit: int | None = None,
) -> list[MeterInterval]:
    """The intervals to record next for ``node``, continuing from ``node.metered_until``.

    Without ``stop``: every whole interval that ended by ``now`` (none if the current one is
    still open). With ``stop`` (the node stopped or terminated then): the intervals up to the
    stop, the last one marked ``final`` (zero-length when the log already reaches the stop
    exactly). If the log already runs past the stop (the stop became known late), one
    ``correction`` interval [stop, metered_until) with negative cost brings the total back to
    the lifetime cost. ``limit`` caps how many are returned; call again with the new
    ``metered_until`` for the rest.
    """
    if node.finalized:
        return []
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    start = _utc("start", node.start)
    cursor = _utc("metered_until", node.metered_until) if node.metered_until else start
    if cursor < start:
        raise ValueError(f"metered_until {cursor.isoformat()} is before the node's start {start.isoformat()}")
    now_utc = _utc("now", now)
    _tick_us(tick)
    end_at = None
    if stop is not None:
        end_at = _utc("stop", stop)
        if end_at < start:
            raise ValueError(f"stop {end_at.isoformat()} is before the node's start {start.isoformat()}")
        if end_at < cursor:
            return [_interval(node, end_at, cursor, final=True, correction=True)]

    out: list[MeterInterval] = []
    while limit is None or len(out) < limit:
        nb = next_boundary(cursor, tick)
        if end_at is not None and nb >= end_at:
            out.append(_interval(node, cursor, end_at, final=True))
            break
        if end_at is None and nb > now_utc:
            break
        out.append(_interval(node, cursor, nb, final=False))
        cursor = nb
    return out


def advance(node: MeteredNode, intervals: list[MeterInterval]) -> MeteredNode:
    """The node's state after ``intervals`` were recorded (what replaying them would give)."""
    if not intervals:
        return node
    last = intervals[-1]
    until = last.start if last.correction else last.end
    return replace(node, metered_until=until, finalized=node.finalized or last.final)


def instance_tres(
    vcpus: int | float | Decimal,
    memory_gib: int | float | Decimal | str,
    gpu_model: str | None = None,
    gpu_count: int | float = 0,
) -> dict[str, int]:
    """The TRES one node of an instance type holds, as Slurm would record it.

    cpu = vCPUs, mem in MiB (GiB × 1024, rounded down to a whole MiB as Slurm's RealMemory is),
    node = 1, and with GPUs both gres/gpu and gres/gpu:<model lower-case>, since Slurm records
    a GPU allocation under both names.
    """
    cpu = Decimal(str(vcpus))
    if cpu <= 0 or cpu != cpu.to_integral_value():
        raise ValueError(f"vCPUs must be a positive whole number, got {vcpus!r}")
    mem = Decimal(str(memory_gib))
    if mem < 0:
        raise ValueError(f"memory must be >= 0 GiB, got {memory_gib!r}")
    gpus = Decimal(str(gpu_count))
    if gpus < 0 or gpus != gpus.to_integral_value():
        raise ValueError(f"GPU count must be a non-negative whole number, got {gpu_count!r}")
    out = {"cpu": int(cpu), "mem": int(mem * 1024), "node": 1}
    if gpus:
        out["gres/gpu"] = int(gpus)
        if gpu_model:
            model = gpu_model.strip().lower()
            if not _GPU_MODEL_RE.match(model):
                raise ValueError(
                    f"GPU model {gpu_model!r} cannot be a gres type name "
                    f"(letters, digits, '_', '.', '-')"
                )
            out[f"gres/gpu:{model}"] = int(gpus)
    return out
