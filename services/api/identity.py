"""Who the caller is and what they may do: pure functions over the identity events.

- `Directory` is the fold of the `team` and `user` aggregates (events/identity_events.py): teams,
  users with their teams (the first their primary one: UserAdded's, then each UserJoinedTeam)
  and their role in each (UserJoinedTeam's `role`, UserTeamRoleSet; absent: the user's own role,
  UserAdded's; `admin` is deployment-wide), and each live token's id and sha256. A removed user's tokens
  are dead; a new personal token replaces the user's earlier personal ones.
- `issue_token` makes a token (shown once), its id and its sha256 (the only part on the log).
- `authenticate` finds the principal of a presented token: the digests are compared with
  `hmac.compare_digest`; the token itself is never kept, logged or put in an error.
- `authorize` says whether a principal may do an action on something a user and team own, and
  why not, by the principal's role in that team (`Principal.role_in`).

No I/O here: the API server (services/api/follower.py) and the CLI (cli/cmd_identity.py) read
the log and hand the events in.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from skypurza.events.identity_events import (
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
from skypurza.events.team_credentials import NO_CREDENTIALS, TeamCredentials

TOKEN_PREFIX = "spz"
# `spz_<id>_<secret>`: the id (16 hex digits, on the log) finds the record, the digest of the
# whole token proves it. 32 random bytes of secret: no search can find one.
_TOKEN_RE = re.compile(r"spz_([0-9a-f]{16})_[A-Za-z0-9_-]{43}")
MAX_TOKEN_CHARS = 128  # a presented token longer than this is not one of ours (and is not hashed)

Action = Literal["read", "logs", "secrets", "submit", "act", "manage"]
ACTIONS: tuple[Action, ...] = ("read", "logs", "secrets", "submit", "act", "manage")


@dataclass(frozen=True)
class Token:
    token_id: str
    sha256: str
    service_account: bool = False


_RANK: dict[str, int] = {"viewer": 0, "member": 1, "admin": 2}


@dataclass
class User:
    name: str
    team: str  # the primary team: always teams[0]
    role: Role  # the user's own role (UserAdded's): `admin` everywhere, else each team's default
    tokens: dict[str, Token] = field(default_factory=dict)  # token id -> token (live ones only)
    teams: tuple[str, ...] = ()  # every team the user is in, the primary first
    team_roles: dict[str, Role] = field(default_factory=dict)  # a team's own role, where one was given

    def __post_init__(self) -> None:
        if not self.teams:
            self.teams = (self.team,)

    def role_in(self, team: str) -> Role:
        # An admin is one in every team: admin is deployment-wide, never a team's.
        return "admin" if self.role == "admin" else self.team_roles.get(team, self.role)

    @property
    def roles(self) -> dict[str, Role]:
        """The user's role in each of their teams, the primary first."""
        return {t: self.role_in(t) for t in self.teams}

    @property
    def primary_role(self) -> Role:
        return self.role_in(self.team)

    def join(self, team: str, primary: bool, role: Role | None = None) -> None:
        if role is not None:
            self.team_roles[team] = role
        if team in self.teams and not primary:
            return
        rest = tuple(t for t in self.teams if t != team)
        self.teams = (team, *rest) if primary else (*rest, team)
        self.team = self.teams[0]

    def leave(self, team: str) -> None:
        if team in self.teams and len(self.teams) > 1:  # never in no team (the edge refuses it)
            self.teams = tuple(t for t in self.teams if t != team)
            self.team = self.teams[0]
            self.team_roles.pop(team, None)  # joining again starts from the user's own role

    def principal(self, token_id: str = "", service_account: bool = False) -> "Principal":
        return Principal(self.name, self.team, self.primary_role, token_id, service_account, self.teams,
                         tuple(self.roles.items()))


@dataclass(frozen=True)
class Team:
    name: str
    allowed_infras: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    credentials: TeamCredentials = NO_CREDENTIALS  # by reference (events/team_credentials.py)


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. `team` is the one a request is stamped with: the user's primary team,
    or the workspace `-w` chose (services/api/workspaces.py), and `role` their role in it; `teams`
    every team the user is in, `roles` their role in each (team, role) pairs, hashable: the listing
    cache keys by the whole principal)."""

    user: str
    team: str
    role: Role
    token_id: str = ""
    service_account: bool = False
    teams: tuple[str, ...] = ()  # empty: `team` only (a plug-in's principal may leave it out)
    roles: tuple[tuple[str, Role], ...] = ()  # empty: `role` in every team (a plug-in's may leave it out)

    @property
    def in_teams(self) -> tuple[str, ...]:
        return self.teams or (self.team,)

    @property
    def is_admin(self) -> bool:
        return self.role == "admin" or any(r == "admin" for _, r in self.roles)

    def role_in(self, team: str | None) -> Role:
        """The caller's role where a request acts: in a team of theirs, that team's; outside them
        (another team's clusters, which members read; what belongs to no team), the highest of their
        roles: a member anywhere reads as a member, and nobody gains a role inside a team by it."""
        if self.is_admin:
            return "admin"
        per_team = dict(self.roles)
        if team is not None and team in self.in_teams:
            return per_team.get(team, self.role)
        return max((*per_team.values(), self.role), key=_RANK.__getitem__)

    def roles_map(self) -> dict[str, Role]:
        """The caller's role in each of their teams (health's caller, `spz api info`)."""
        return {t: self.role_in(t) for t in self.in_teams}


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str


@dataclass
class Directory:
    """Teams, users and live tokens, as the identity events left them.

    `subject_seq` is the stream sequence of the newest event of each aggregate instance
    (("user", name) or ("team", name)): what a writer passes as `expected_last_seq` so that two
    writers never both add the same user. `applied` is the newest sequence applied per aggregate
    ("team", "user"): how the API server knows it has caught up with the log."""

    teams: dict[str, Team] = field(default_factory=dict)
    users: dict[str, User] = field(default_factory=dict)
    token_owner: dict[str, str] = field(default_factory=dict)  # live token id -> user
    subject_seq: dict[tuple[str, str], int] = field(default_factory=dict)
    applied: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, events: Iterable[tuple[int, Event]]) -> "Directory":
        d = cls()
        for seq, event in events:
            d.apply(event, seq)
        return d

    def apply(self, event: Event, seq: int = 0) -> None:
        """Fold one event (in log order within its aggregate). Other event types are ignored."""
        if event.AGGREGATE not in ("team", "user"):
            return
        key = (event.AGGREGATE, event.aggregate_id())
        self.subject_seq[key] = max(seq, self.subject_seq.get(key, 0))
        self.applied[event.AGGREGATE] = max(seq, self.applied.get(event.AGGREGATE, 0))
        if isinstance(event, (TeamAdded, TeamUpdated)):
            if isinstance(event, TeamUpdated) and event.team not in self.teams:
                return  # an update of a team removed meanwhile does not bring it back
            self.teams[event.team] = Team(event.team, tuple(event.allowed_infras), tuple(sorted(event.labels.items())),
                                          event.credentials or NO_CREDENTIALS)
        elif isinstance(event, TeamRemoved):
            self.teams.pop(event.team, None)
        elif isinstance(event, UserAdded):
            old = self.users.get(event.user)
            # Added again while present: the team (and only it) and role change, the tokens stay.
            self.users[event.user] = User(event.user, event.team, event.role, dict(old.tokens) if old else {})
        elif isinstance(event, UserJoinedTeam):
            if event.user in self.users:
                self.users[event.user].join(event.team, event.primary, event.role)
        elif isinstance(event, UserTeamRoleSet):
            user = self.users.get(event.user)
            if user is not None and event.team in user.teams:  # not theirs (left meanwhile): nothing to set
                user.team_roles[event.team] = event.role
        elif isinstance(event, UserLeftTeam):
            if event.user in self.users:
                self.users[event.user].leave(event.team)
        elif isinstance(event, UserRemoved):
            gone = self.users.pop(event.user, None)
            for token_id in (gone.tokens if gone else {}):
                self.token_owner.pop(token_id, None)
        elif isinstance(event, TokenIssued):
            self._issue(event)
        elif isinstance(event, TokenRevoked):
            user = self.users.get(event.user)
            if user is not None and user.tokens.pop(event.token_id, None) is not None:
                self.token_owner.pop(event.token_id, None)

    def _issue(self, event: TokenIssued) -> None:
        user = self.users.get(event.user)
        if user is None or event.token_id in self.token_owner:  # no such user; an id is never reused
            return
        if not event.service_account:  # a new personal token replaces the old one
            for old in [t for t in user.tokens.values() if not t.service_account]:
                del user.tokens[old.token_id]
                self.token_owner.pop(old.token_id, None)
        user.tokens[event.token_id] = Token(event.token_id, event.token_sha256, event.service_account)
        self.token_owner[event.token_id] = event.user

    def saw(self, aggregate: str, name: str, seq: int) -> None:
        """An event of that user or team this code cannot fold (unreadable, newer): a writer must
        still expect it as the newest on the subject."""
        key = (aggregate, name)
        self.subject_seq[key] = max(seq, self.subject_seq.get(key, 0))

    def members(self, team: str) -> list[str]:
        return sorted(u.name for u in self.users.values() if team in u.teams)

    def seq_of(self, aggregate: str, name: str) -> int:
        """The sequence to expect as the last one of that user or team (0: it has no event yet)."""
        return self.subject_seq.get((aggregate, name), 0)


# ---------------------------------------------------------------- tokens


@dataclass(frozen=True)
class IssuedToken:
    token: str  # shown once to the person it is for; never logged, never on the log
    token_id: str
    sha256: str

    def __repr__(self) -> str:  # a traceback or a debug print shows no token
        return f"IssuedToken(token_id={self.token_id!r}, token=<hidden>)"

    __str__ = __repr__


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue_token() -> IssuedToken:
    token_id = secrets.token_hex(8)
    token = f"{TOKEN_PREFIX}_{token_id}_{secrets.token_urlsafe(32)}"
    return IssuedToken(token, token_id, token_digest(token))


_NO_DIGEST = token_digest("")


def authenticate(directory: Directory, presented: str | None) -> Principal | None:
    """The principal a presented token belongs to, or None (unknown, revoked, malformed, or its
    user removed). The digests are compared in constant time."""
    if not presented or len(presented) > MAX_TOKEN_CHARS:
        return None
    m = _TOKEN_RE.fullmatch(presented)
    owner = directory.token_owner.get(m.group(1)) if m else None
    user = directory.users.get(owner) if owner else None
    token = user.tokens.get(m.group(1)) if (user is not None and m) else None
    expected = token.sha256 if token is not None else _NO_DIGEST
    # Compared even when nothing matched, so a miss takes as long as a wrong secret.
    same = hmac.compare_digest(token_digest(presented), expected)
    if token is None or user is None or not same:
        return None
    return user.principal(token.token_id, token.service_account)


# ---------------------------------------------------------------- authorization


def visible(principal: Principal, rows: Iterable[dict[str, Any]], all_users: bool) -> list[dict[str, Any]]:
    """The rows (clusters, jobs: each with its owner's `user` and `team`) a listing shows: an
    admin's every row; otherwise their own (in a team where they are a viewer: the team's), or with
    `all_users` every row they may read. The role is the caller's in each row's team."""
    mine_only = not all_users and not principal.is_admin
    shown = []
    for row in rows:
        owner, team = row.get("user") or "", row.get("team")
        viewer_here = principal.role_in(team) == "viewer"
        if mine_only and (owner != principal.user if not viewer_here else team not in principal.in_teams):
            continue
        if authorize(principal, "read", owner, team).allowed:
            shown.append(row)
    return shown


def authorize(principal: Principal, action: Action, owner_user: str | None = None,
              owner_team: str | None = None) -> Decision:
    """May `principal` do `action` on what `owner_user` of `owner_team` owns?

    admin: everything. member: submits and acts on their own, reads everyone's clusters and
    jobs, sees their own team's logs and their own secrets. viewer: reads their own team's
    clusters, jobs and logs, nothing else. The role is the caller's in `owner_team` (a user may be a
    member of one team and a viewer of another; `Principal.role_in`); admin is deployment-wide. A
    user in several teams has each one's reads ("their own team" is any of `principal.in_teams`).
    Another team's logs and secrets: admins only. Identity (users, teams): admins only."""
    role, me, my_teams = principal.role_in(owner_team), principal.user, principal.in_teams
    mine = ", ".join(my_teams)
    owner = owner_user or "(nobody)"
    if role == "admin":
        return Decision(True, "admins may do everything")
    if action == "manage":
        return Decision(False, "managing users and teams is for admins")
    if role == "viewer":
        if action in ("submit", "act"):
            if owner_team in my_teams:
                return Decision(False, f"{me} is a viewer in team {owner_team}: viewers read only (an admin can "
                                       f"make you a member there: spz teams set-role {owner_team} {me} member)")
            return Decision(False, f"{me} is a viewer: viewers read only (an admin can make you a member)")
        if action == "secrets":
            return Decision(False, "secrets are for their owner and admins; viewers see none")
        if owner_team in my_teams:
            return Decision(True, "viewers read their own team's clusters, jobs and logs")
        return Decision(False, f"viewers read their own team's ({mine}) only; this is {owner}'s of team "
                               f"{owner_team or '(none)'}")
    # member
    if action == "submit":
        if owner_user in (None, me):
            return Decision(True, "members submit as themselves")
        return Decision(False, f"members submit as themselves, not as {owner}")
    if action == "act":
        if owner_user == me:
            return Decision(True, "members act on their own clusters and jobs")
        return Decision(False, f"this is {owner}'s; acting on another user's clusters and jobs is for admins")
    if action == "read":
        return Decision(True, "members read everyone's clusters and jobs")
    if action == "logs":
        if owner_team in my_teams:
            return Decision(True, "members see their own team's logs")
        return Decision(False, f"these logs are team {owner_team or '(none)'}'s; another team's logs are for admins")
    if owner_user == me:  # secrets
        return Decision(True, "members see their own secrets")
    return Decision(False, f"these secrets are {owner}'s; another user's secrets are for admins")
