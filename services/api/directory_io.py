"""The identity directory on the bus: read it from the log, and change it with optimistic concurrency.

Each change is decided on the directory as the log holds it and published with the sequence of
the aggregate's newest event as `expected_last_seq`: when another writer got there first
(two `spz users add alice` at once) the append is refused, the directory is read again and the
decision made again, so one of them adds alice and the other is told she exists. Used by the
CLI's `spz users` / `spz teams` (cli/cmd_identity.py) on the embedded bus.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from skypurza.events import naming
from skypurza.events.bus import Bus, ConcurrencyConflict
from skypurza.events.identity_events import (
    TEAM_ROLES,
    Role,
    TeamAdded,
    TeamRemoved,
    TeamUpdated,
    TokenIssued,
    TokenRevoked,
    UserAdded,
    UserJoinedTeam,
    UserLeftTeam,
    UserRemoved,
    UserTeamRoleSet,
)
from skypurza.events.registry import Event
from skypurza.events.team_credentials import TeamCredentials, with_aws_profile, with_k8s_namespace, with_slurm_account

from .identity import Directory, IssuedToken, issue_token

OCC_ATTEMPTS = 8
MAX_TEAMS_PER_USER = 32  # a bound on what a principal carries into every request


class IdentityError(Exception):
    """A change the directory refuses (an unknown team, a user who exists ...): said to the user."""


async def load_directory(bus: Bus) -> Directory:
    """The directory as the log holds it now (teams and users are few: their whole history)."""
    stored = []
    for subject in naming.identity_filters(bus.stage):
        stored += [s async for s in bus.replay(filter_subject=subject)]
    stored.sort(key=lambda s: s.seq)
    directory = Directory.of((s.seq, s.event) for s in stored if s.event is not None)
    for s in stored:
        if s.event is None:  # unreadable or newer: not folded, but the next write must expect it
            parts = s.subject.split(".")
            if len(parts) >= 6:
                directory.saw(parts[3], parts[4], s.seq)
    return directory


@dataclass(frozen=True)
class _Change:
    events: list[Event]
    result: Any = None


async def _change(bus: Bus, aggregate: str, name: str, decide: Callable[[Directory], _Change]) -> Any:
    """Decide on the current directory and publish; on a concurrent write, read and decide again."""
    for _ in range(OCC_ATTEMPTS):
        directory = await load_directory(bus)
        change = decide(directory)  # raises IdentityError when refused
        expected = directory.seq_of(aggregate, name)
        try:
            for event in change.events:
                ack = await bus.publish(event, expected_last_seq=expected)
                expected = ack.seq
        except ConcurrencyConflict:
            continue
        return change.result
    raise IdentityError(f"{aggregate} {name} kept changing while this ran ({OCC_ATTEMPTS} tries); try again")


async def add_team(bus: Bus, team: str, allowed_infras: list[str], labels: dict[str, str],
                   credentials: TeamCredentials | None = None) -> None:
    def decide(d: Directory) -> _Change:
        if team in d.teams:
            raise IdentityError(f"team {team} exists (spz teams list)")
        given = None if credentials is None or credentials.is_empty() else credentials
        return _Change([TeamAdded(team=team, allowed_infras=allowed_infras, labels=labels, credentials=given)])

    await _change(bus, "team", team, decide)


async def update_team(bus: Bus, team: str, allowed_infras: list[str] | None = None,
                      labels: dict[str, str] | None = None,
                      aws_profile: str | None = None, *,
                      k8s_namespace: str | None = None,
                      slurm_account: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The team's allowed infras, labels, AWS profile, Kubernetes namespace and/or Slurm account
    replaced (None: kept; a reference `""`: removed, the default again); returns infras and labels
    as they now are."""
    def decide(d: Directory) -> _Change:
        if team not in d.teams:
            raise IdentityError(f"no team {team} (spz teams list)")
        t = d.teams[team]
        infras = list(t.allowed_infras) if allowed_infras is None else allowed_infras
        new_labels = dict(t.labels) if labels is None else labels
        # TeamUpdated carries the whole new value of each field (the fold never merges).
        creds = with_slurm_account(with_k8s_namespace(with_aws_profile(t.credentials, aws_profile), k8s_namespace),
                                   slurm_account)
        return _Change([TeamUpdated(team=team, allowed_infras=infras, labels=new_labels,
                                    credentials=None if creds.is_empty() else creds)], (infras, new_labels))

    return await _change(bus, "team", team, decide)


async def remove_team(bus: Bus, team: str) -> None:
    def decide(d: Directory) -> _Change:
        if team not in d.teams:
            raise IdentityError(f"no team {team} (spz teams list)")
        members = d.members(team)
        if members:
            raise IdentityError(f"team {team} still has {len(members)} user(s): {', '.join(members)}; "
                                f"take them out first (spz teams remove-member {team} NAME, or spz users remove NAME)")
        return _Change([TeamRemoved(team=team)])

    await _change(bus, "team", team, decide)


def _known_team(d: Directory, team: str) -> None:
    if team not in d.teams:
        known = ", ".join(sorted(d.teams)) or "none yet"
        raise IdentityError(f"no team {team} (teams: {known}); add it first: spz teams add {team}")


async def add_user(bus: Bus, user: str, team: str, role: Role, more_teams: Sequence[str] = ()) -> IssuedToken:
    """A user in `team` (their primary one) and `more_teams`, with their first token."""
    token = issue_token()
    others = [t for t in dict.fromkeys(more_teams) if t != team]

    def decide(d: Directory) -> _Change:
        if user in d.users:
            raise IdentityError(f"user {user} exists (teams {', '.join(d.users[user].teams)}); a new token: "
                                f"spz users token {user}; another team: spz teams add-member TEAM {user}")
        if 1 + len(others) > MAX_TEAMS_PER_USER:
            raise IdentityError(f"{1 + len(others)} teams; a user is in at most {MAX_TEAMS_PER_USER}")
        for t in (team, *others):
            _known_team(d, t)
        joined: list[Event] = [UserJoinedTeam(user=user, team=t) for t in others]
        return _Change([UserAdded(user=user, team=team, role=role), *joined,
                        TokenIssued(user=user, token_id=token.token_id, token_sha256=token.sha256)], token)

    return await _change(bus, "user", user, decide)


def _team_role(d: Directory, user: str, role: str | None) -> None:
    """A role in one team is member or viewer; admin is deployment-wide (a user's own role)."""
    if role is None:
        return
    if role not in TEAM_ROLES:
        raise IdentityError(f"{role!r} is not a role in a team (member or viewer): admin is deployment-wide, a "
                            f"user's own role (spz users add NAME --role admin)")
    if d.users[user].role == "admin":
        raise IdentityError(f"{user} is an admin, which is deployment-wide: an admin is one in every team, so a "
                            f"team's role would change nothing")


async def add_member(bus: Bus, team: str, user: str, primary: bool = False,
                     role: str | None = None) -> tuple[str, ...]:
    """`user` joins `team` (`primary`: it becomes their first team) with `role` there (None: their
    own role, UserAdded's); returns their teams now."""
    def decide(d: Directory) -> _Change:
        if user not in d.users:
            raise IdentityError(f"no user {user} (spz users list)")
        _known_team(d, team)
        _team_role(d, user, role)
        teams = d.users[user].teams
        if team in teams and (not primary or teams[0] == team):
            raise IdentityError(f"{user} is already in team {team} (teams: {', '.join(teams)})")
        if team not in teams and len(teams) >= MAX_TEAMS_PER_USER:
            raise IdentityError(f"{user} is in {len(teams)} teams, the most a user may be in")
        now = (team, *[t for t in teams if t != team]) if primary else (*teams, team)
        joined = UserJoinedTeam(user=user, team=team, primary=primary, role=role)  # type: ignore[arg-type]
        return _Change([joined], now)

    return await _change(bus, "user", user, decide)


async def set_role(bus: Bus, team: str, user: str, role: str) -> dict[str, Role]:
    """`user`'s role in `team`, one of theirs, set (UserTeamRoleSet); returns their role in each
    team now. The same role again publishes nothing."""
    def decide(d: Directory) -> _Change:
        if user not in d.users:
            raise IdentityError(f"no user {user} (spz users list)")
        _known_team(d, team)
        u = d.users[user]
        if team not in u.teams:
            raise IdentityError(f"{user} is not in team {team} (teams: {', '.join(u.teams)}); add them first: "
                                f"spz teams add-member {team} {user} --role {role}")
        _team_role(d, user, role)
        roles = {**u.roles, team: role}
        if u.role_in(team) == role:
            return _Change([], roles)
        return _Change([UserTeamRoleSet(user=user, team=team, role=role)], roles)  # type: ignore[arg-type]

    return await _change(bus, "user", user, decide)


async def remove_member(bus: Bus, team: str, user: str) -> tuple[str, ...]:
    """`user` leaves `team`; refused for their last team. Returns their teams now."""
    def decide(d: Directory) -> _Change:
        if user not in d.users:
            raise IdentityError(f"no user {user} (spz users list)")
        teams = d.users[user].teams
        if team not in teams:
            raise IdentityError(f"{user} is not in team {team} (teams: {', '.join(teams)})")
        if len(teams) == 1:
            raise IdentityError(f"team {team} is {user}'s only team, and a user is always in one: add another "
                                f"first (spz teams add-member TEAM {user}), or remove the user (spz users remove {user})")
        return _Change([UserLeftTeam(user=user, team=team)], tuple(t for t in teams if t != team))

    return await _change(bus, "user", user, decide)


async def reissue_token(bus: Bus, user: str, service_account: bool = False) -> IssuedToken:
    """A new token for `user`; a personal one revokes the user's earlier personal tokens."""
    token = issue_token()

    def decide(d: Directory) -> _Change:
        if user not in d.users:
            raise IdentityError(f"no user {user} (spz users list)")
        old = [t.token_id for t in d.users[user].tokens.values() if not t.service_account]
        issued: list[Event] = [TokenIssued(user=user, token_id=token.token_id, token_sha256=token.sha256,
                                           service_account=service_account)]
        revoked: list[Event] = [] if service_account else [
            TokenRevoked(user=user, token_id=t, reason="replaced by a new token") for t in old]
        return _Change(issued + revoked, token)

    return await _change(bus, "user", user, decide)


async def remove_user(bus: Bus, user: str) -> None:
    def decide(d: Directory) -> _Change:
        if user not in d.users:
            raise IdentityError(f"no user {user} (spz users list)")
        return _Change([UserRemoved(user=user)])

    await _change(bus, "user", user, decide)


async def revoke_token(bus: Bus, user: str, token_id: str, by: str = "") -> None:
    """One of `user`'s live tokens revoked (the console's admin page); unknown or dead: refused."""
    def decide(d: Directory) -> _Change:
        if user not in d.users:
            raise IdentityError(f"no user {user} (spz users list)")
        if token_id not in d.users[user].tokens:
            raise IdentityError(f"no live token {token_id} of {user} (GET /api/v1/users/{user}/tokens)")
        reason = f"revoked by {by}" if by else "revoked"
        return _Change([TokenRevoked(user=user, token_id=token_id, reason=reason)])

    await _change(bus, "user", user, decide)
