"""Secondary resources after the nodes are gone: report what could not be released, retry it.

Security groups, the stage's key pair and placement groups cost nothing (or next to nothing)
once no node uses them, so releasing them never keeps a cluster alive: ClusterTerminated is
published whatever happens here. Each resource that cannot be released becomes a CleanupFailed
warning (the resource and the cloud's error), and a background sweep tries again:

- the sweep covers every region the stage touched (a PlacementChosen or CapacityError named it,
  or a cluster lives there), so a region where every launch failed is cleaned too;
- each resource gets at most `attempts` tries, the n-th no sooner than `backoff_s * 2**(n-1)`
  after the previous failure; an operation the cloud does not offer (a bare moto_server has no
  placement groups) is given up at once: asking again cannot make it exist;
- what was tried, and how often, is read from the log (CleanupFailed events), never kept in
  memory; a failure's id is derived from (stage, resource, attempt), so two sweepers record it once;
- a team's own AWS account is swept as the default one is: its key is `aws@PROFILE`
  (backends.credentials_key), which is its failures' `infra` and part of their resource key (a
  key pair has the stage's name in every account); `with_accounts` gives each account the
  regions the stage touched. A profile the server no longer has is reported, never a crash.

The decisions (`attempts_by_key`, `skip_keys`, `failure_event`) are pure; `sweep` does the I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from skypurza.events import naming
from skypurza.events.bus import Bus, Stored
from skypurza.events.clock import SYSTEM_CLOCK, Clock
from skypurza.events.envelope import derive_id
from skypurza.events.models import CapacityError, CleanupFailed, ClusterProvisioned, PlacementChosen

from .adapter import CleanupFailure
from .backends import Backends, CredentialsNotFound, split_key
from .state import replay_all

log = logging.getLogger(__name__)

SWEEP_CLUSTER = "?"  # the cluster of a failure the background sweep found
INFRAS_WITH_SHARED_RESOURCES = ("aws",)  # local clusters keep nothing beside their nodes


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    backoff_s: float = 60.0


def resource_key(region: str | None, resource_type: str, resource: str, resource_id: str = "",
                 infra: str = "aws") -> str:
    """One resource (one creation of a name, where the cloud gives it an id) in one region (of a
    team's account: `infra` `aws@PROFILE`)."""
    account = f"{infra}:" if infra not in ("aws", "") else ""
    return f"{account}{region or '-'}/{resource_type}/{resource_id or resource}"


def key_of(ev: CleanupFailed) -> str:
    return resource_key(ev.region, ev.resource_type, ev.resource, ev.resource_id, ev.infra)


def with_accounts(regions: Mapping[str, Iterable[str]], accounts: Iterable[str]) -> dict[str, set[str]]:
    """Pure: `regions` ({infra: regions}) with each team account (`aws@PROFILE`) given the
    regions the stage touched in AWS as well: which account a failed launch used is not known."""
    out = {infra: set(rs) for infra, rs in regions.items()}
    for account in accounts:
        out.setdefault(account, set()).update(out.get("aws", set()))
    return out


def attempts_by_key(failures: Iterable[CleanupFailed]) -> dict[str, CleanupFailed]:
    """Pure: the newest failure (highest attempt) of each resource."""
    out: dict[str, CleanupFailed] = {}
    for ev in failures:
        k = key_of(ev)
        if k not in out or ev.attempt >= out[k].attempt:
            out[k] = ev
    return out


def skip_keys(last: Mapping[str, CleanupFailed], region: str, policy: RetryPolicy, now: datetime,
              infra: str = "aws") -> set[str]:
    """Pure: what the adapter must not try in `region` (of `infra`'s account) now: given up, or
    still backing off. Entries are resource ids (or names), and `<type>:*` for a listing."""
    out: set[str] = set()
    for ev in last.values():
        if ev.region != region or (ev.infra or "aws") != infra:
            continue
        due = _aware(ev.failed_at) + timedelta(seconds=policy.backoff_s * 2 ** max(0, ev.attempt - 1))
        if not ev.will_retry or ev.attempt >= policy.attempts or due > now:
            out.add(f"{ev.resource_type}:*" if ev.resource == "*" else (ev.resource_id or ev.resource))
    return out


def failure_event(f: CleanupFailure, last: CleanupFailed | None, policy: RetryPolicy, *, cluster: str,
                  infra: str, now: datetime) -> CleanupFailed:
    """Pure: the warning for one failed release, numbered after the resource's earlier failures."""
    attempt = (last.attempt + 1) if last is not None else 1
    return CleanupFailed(
        cluster=cluster, infra=infra, region=f.region or infra, resource_type=f.resource_type,
        resource=f.resource, resource_id=f.resource_id, code=f.failure.code,
        message=(f.failure.message + (f" ({f.failure.hint})" if f.failure.hint else ""))[:2000],
        attempt=attempt, will_retry=f.retryable and attempt < policy.attempts, failed_at=now,
    )


@dataclass
class SweepReport:
    regions: dict[str, list[str]] = field(default_factory=dict)  # infra -> regions swept
    deleted: list[str] = field(default_factory=list)
    failed: list[CleanupFailed] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # account -> why it was not swept


async def recorded_failures(bus: Bus) -> list[CleanupFailed]:
    found = await replay_all(bus, naming.event_filter(bus.stage, "cluster", CleanupFailed.EVENT_NAME))
    return [s.event for s in found if isinstance(s.event, CleanupFailed)]


async def sweep(bus: Bus, backends: Backends, regions: Mapping[str, Iterable[str]], policy: RetryPolicy, *,
                cluster: str = SWEEP_CLUSTER, now: datetime | None = None, clock: Clock = SYSTEM_CLOCK
                ) -> SweepReport:
    """Release unused per-stage resources in `regions` ({infra: regions}); publish a CleanupFailed
    for each one that could not be. Callers in one process serialise sweeps (the attempt count
    is read from the log first). `now` (else `clock.now()`) decides which retries are due and
    stamps the failures."""
    now = now or clock.now()
    last = attempts_by_key(await recorded_failures(bus))
    report = SweepReport()
    for key, wanted in sorted(regions.items()):
        infra, credentials = split_key(key)  # `aws@PROFILE`: a team's account
        if infra not in INFRAS_WITH_SHARED_RESOURCES:
            continue
        try:
            backend = backends.get(infra, credentials)
        except CredentialsNotFound as exc:  # a profile gone from the server: reported, the others swept
            log.warning("cleanup: %s not swept: %s", key, exc)
            report.errors[key] = str(exc)
            continue
        chosen = sorted({r for r in wanted if r})
        report.regions[key] = chosen
        for region in chosen:
            result = await backend.release_unused(bus.stage, [region],
                                                  skip=skip_keys(last, region, policy, now, infra=key))
            report.deleted += result.deleted
            for f in result.failures:
                k = resource_key(f.region, f.resource_type, f.resource, f.resource_id, key)
                ev = failure_event(f, last.get(k), policy, cluster=cluster, infra=key, now=now)
                await _publish(bus, ev, key=k)
                last[k] = ev
                report.failed.append(ev)
                log.warning("cleanup: %s %s in %s not released (attempt %d%s): %s: %s", ev.resource_type,
                            ev.resource, ev.region, ev.attempt, "" if ev.will_retry else ", giving up",
                            ev.code, ev.message)
    return report


async def _publish(bus: Bus, ev: CleanupFailed, *, key: str) -> None:
    # One id per (resource, attempt), whoever tried (a teardown, a sweep, another process): the
    # same failure is stored once, and the attempt count in the log stays true.
    await bus.publish(bus.envelope(ev, id=derive_id(f"{bus.stage}/{key}", "cleanup", str(ev.attempt))))


class TouchedRegions:
    """Every region the stage's log names for each infra: placements, capacity errors, clusters.

    Read incrementally (only events after the last read), so a periodic sweep does not replay
    the whole log each time; a fresh instance (a restart) reads it all once."""

    _EVENTS: Sequence[tuple[str, str]] = (("task", PlacementChosen.EVENT_NAME), ("task", CapacityError.EVENT_NAME),
                                          ("cluster", ClusterProvisioned.EVENT_NAME))

    def __init__(self) -> None:
        self.regions: dict[str, set[str]] = {}
        self._next_seq = 1

    async def update(self, bus: Bus) -> dict[str, set[str]]:
        end = await bus.last_seq()
        if end >= self._next_seq:
            for aggregate, name in self._EVENTS:
                subject = naming.event_filter(bus.stage, aggregate, name)
                newest = await bus.last_event(subject)
                if newest is None or newest.seq < self._next_seq:
                    continue  # nothing new (a replay of nothing would wait out its fetch timeout)
                async for s in bus.replay(filter_subject=subject, start_seq=self._next_seq, until_seq=end):
                    self._add(s)
            self._next_seq = end + 1
        return {infra: set(regions) for infra, regions in self.regions.items()}

    def _add(self, s: Stored) -> None:
        candidate = getattr(s.event, "candidate", None)
        if candidate is not None and candidate.region:
            self.regions.setdefault(candidate.infra, set()).add(candidate.region)


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
