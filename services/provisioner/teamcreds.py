"""With which credentials a team's clusters are made: its references, folded from the log.

A team's workspace may name an AWS profile and a Kubernetes namespace (TeamAdded / TeamUpdated
`credentials`, events/team_credentials.py); a team without one, and a cluster of no team, use the
server's default credentials and the context's own namespace, as before. Which team: the submission's (the API server writes its stamp
there; on the embedded bus the CLI chose it), which ClusterProvisioned repeats.

A cluster is torn down, stopped and started with the credentials its team had when it was
launched (`as_of` its ClusterProvisioned's sequence): an admin moving a team to another account
must not leave the team's running nodes unreachable, nor have a teardown look for them in the new
account, find none and call the cluster gone while the old account bills on.

Reconciliation and the cleanup sweep look in every account a node of ours may be in: the
server's default and each profile any team has ever had (`profiles_ever`: a profile left behind
may still hold nodes). Pure, but for `load_history` and `load_all`, which read the teams' events
(a handful per team).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from skypurza.events import naming
from skypurza.events.bus import Bus, Stored
from skypurza.events.identity_events import TeamAdded, TeamRemoved, TeamUpdated
from skypurza.events.team_credentials import NO_CREDENTIALS, TeamCredentials

from .state import replay_all

TEAM_EVENTS = (TeamAdded, TeamUpdated, TeamRemoved)


@dataclass(frozen=True)
class TeamHistory:
    """(sequence, the team's credentials from then on), oldest first."""

    team: str
    changes: tuple[tuple[int, TeamCredentials], ...] = ()

    def as_of(self, seq: int | None = None) -> TeamCredentials:
        """The credentials in force at stream sequence `seq` (None: now)."""
        found = NO_CREDENTIALS
        for at, creds in self.changes:
            if seq is not None and at > seq:
                break
            found = creds
        return found

    def ever_aws(self) -> bool:
        """Whether the team's clusters may have been made with a profile of its own at some time."""
        return any(c.aws is not None for _, c in self.changes)

    def k8s_namespaces(self) -> set[str]:
        """Every namespace the team's pods may have been made in (reconciliation lists them all)."""
        return {c.kubernetes.namespace for _, c in self.changes if c.kubernetes is not None}


def fold(team: str, events: Iterable[Stored]) -> TeamHistory:
    """Pure: the team's credential changes from its events, in stream order (the directory's rules:
    an update of a removed team does not bring it back; a removed team has none)."""
    changes: list[tuple[int, TeamCredentials]] = []
    exists = False
    for s in sorted(events, key=lambda s: s.seq):
        ev = s.event
        if isinstance(ev, TeamAdded) or (isinstance(ev, TeamUpdated) and exists):
            exists = True
            changes.append((s.seq, ev.credentials or NO_CREDENTIALS))
        elif isinstance(ev, TeamRemoved):
            exists = False
            changes.append((s.seq, NO_CREDENTIALS))
    return TeamHistory(team, tuple(changes))


async def load_history(bus: Bus, team: str | None) -> TeamHistory:
    """The team's history from the log; an empty one for no team or a name no team can have
    (a submission's own `team` on the embedded bus is whatever the CLI wrote)."""
    try:
        naming.check_principal_name(team, "team")
    except ValueError:
        return TeamHistory(team or "")
    assert team is not None
    events: list[Stored] = []
    for event in TEAM_EVENTS:
        events += await replay_all(bus, naming.event_subject(bus.stage, "team", team, event.EVENT_NAME))
    return fold(team, events)


async def team_k8s_namespaces(bus: Bus) -> set[str]:
    """Every namespace any team has ever named (removed teams too: their pods may still be there),
    for reconciliation, which must find a team's orphans where its clusters were made."""
    events: list[Stored] = []
    for event in TEAM_EVENTS:
        events += await replay_all(bus, naming.event_filter(bus.stage, "team", event.EVENT_NAME))
    by_team: dict[str, list[Stored]] = {}
    for s in events:
        team = getattr(s.event, "team", None)
        if isinstance(team, str):
            by_team.setdefault(team, []).append(s)
    return {ns for team, evs in by_team.items() for ns in fold(team, evs).k8s_namespaces()}


def profiles_ever(histories: Iterable[TeamHistory]) -> list[str]:
    """Pure: every AWS profile any team has had, sorted (each is an account to list and sweep)."""
    return sorted({c.aws.profile for h in histories for _, c in h.changes if c.aws is not None})


def launched_in(histories: Mapping[str, TeamHistory], team: str | None, seq: int) -> str | None:
    """Pure: the AWS profile a cluster of `team` provisioned at stream sequence `seq` was made
    with (None: the server's default account)."""
    history = histories.get(team or "")
    creds = history.as_of(seq) if history is not None else NO_CREDENTIALS
    return creds.aws.profile if creds.aws is not None else None


def teams_with(histories: Mapping[str, TeamHistory], profile: str) -> list[str]:
    """Pure: the teams that have ever had `profile` (for a message naming who is concerned)."""
    return sorted(t for t, h in histories.items()
                  if any(c.aws is not None and c.aws.profile == profile for _, c in h.changes))


async def load_all(bus: Bus) -> dict[str, TeamHistory]:
    """Every team's history from the log (removed teams too: their profiles may still hold nodes)."""
    by_team: dict[str, list[Stored]] = {}
    for event in TEAM_EVENTS:
        for s in await replay_all(bus, naming.event_filter(bus.stage, "team", event.EVENT_NAME)):
            team = getattr(s.event, "team", None)
            if isinstance(team, str) and team:
                by_team.setdefault(team, []).append(s)
    return {team: fold(team, events) for team, events in by_team.items()}
