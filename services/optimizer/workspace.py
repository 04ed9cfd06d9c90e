"""A team's workspace on placement: where its tasks may land (pure: a fold and two decisions).

A team's `allowed_infras` (TeamAdded / TeamUpdated, events/identity_events.py; `spz teams add|update
--allowed-infras`) are entries `infra`, `infra/region` or `infra/region/zone`; none means every
infra the broker has. The optimizer folds the team events of the log into `TeamInfras` and, for a
task, narrows its World to the team's infras before ranking and keeps only the candidates an entry
admits. The team is the API server's stamp on the submission (events/principal.py), else the
event's own `team` (the embedded bus, where the CLI chose it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from skypurza.events.identity_events import TeamAdded, TeamRemoved, TeamUpdated
from skypurza.events.registry import Event

from .placement import Candidate, normalize_infra

Entry = tuple[str, str | None, str | None]  # (infra, region or None, zone or None)


def parse_entries(values: Iterable[str]) -> tuple[Entry, ...]:
    """`aws`, `aws/us-east-1`, `aws/us-east-1/us-east-1a` as (infra, region, zone); blanks dropped."""
    out: list[Entry] = []
    for v in values:
        parts = [p.strip() for p in str(v).split("/")]
        infra = normalize_infra(parts[0])
        if infra is None:
            continue
        region = parts[1] or None if len(parts) > 1 else None
        zone = parts[2] or None if len(parts) > 2 else None
        out.append((infra, region, zone))
    return tuple(out)


@dataclass
class TeamInfras:
    """The fold: each team's allowed-infra entries as the log holds them now."""

    teams: dict[str, tuple[Entry, ...]] = field(default_factory=dict)

    def apply(self, event: Event) -> None:
        if isinstance(event, TeamAdded) or (isinstance(event, TeamUpdated) and event.team in self.teams):
            # (an update of a team removed meanwhile does not bring it back: the directory's rule)
            self.teams[event.team] = parse_entries(event.allowed_infras)
        elif isinstance(event, TeamRemoved):
            self.teams.pop(event.team, None)

    def of(self, team: str | None) -> tuple[Entry, ...]:
        """The team's entries; () for no team, an unknown team or one that allows every infra."""
        return self.teams.get(team, ()) if team else ()


def infras_of(entries: Sequence[Entry]) -> frozenset[str]:
    return frozenset(e[0] for e in entries)


def narrows_by_place(entries: Sequence[Entry]) -> bool:
    """True when an entry names a region or zone: candidates are filtered after ranking."""
    return any(e[1] or e[2] for e in entries)


def admits(entries: Sequence[Entry], c: Candidate) -> bool:
    """An entry admits `c` when its infra matches and its region and zone (where it names them) do."""
    if not entries:
        return True
    for infra, region, zone in entries:
        if infra != normalize_infra(c.infra):
            continue
        if region is not None and region != c.region:
            continue
        if zone is not None and not (c.zone == zone or (c.zone is None and zone in c.zones)):
            continue
        return True
    return False


def label(entries: Sequence[Entry]) -> str:
    return ", ".join("/".join(p for p in e if p) for e in entries)


def refusal(team: str, entries: Sequence[Entry], why: str) -> str:
    """The PlacementFailed reason when the team's workspace leaves nowhere to place."""
    return (f"team {team} may run only on {label(entries)} (its allowed infras; an admin changes them with "
            f"spz teams update {team} --allowed-infras ...): {why}")


def restrict(entries: Sequence[Entry], c: Candidate) -> Candidate | None:
    """`c` as the workspace admits it (an on-demand candidate keeps only an allowed zone), or None."""
    if not entries:
        return c
    for infra, region, zone in entries:
        if infra != normalize_infra(c.infra) or (region is not None and region != c.region):
            continue
        if zone is None:
            return c
        if c.zone == zone:
            return c
        if c.zone is None and zone in c.zones:
            return c._replace(zones=(zone,))
    return None
