"""Events of the `team` and `user` aggregates: who may use the broker, in which team, with what role.

Emitted by: `spz teams add|update|remove|add-member|remove-member`, `spz users add|token|remove`
(the embedded control plane's admin, the OS user) and the API server's identity endpoints. Folded by the API server
(services/api/identity.py `Directory`) to authenticate and authorize its callers.

A token is never on the log: TokenIssued carries its id and the sha256 of the token, which is
all `authenticate` needs. Names (user, team) are checked at the edge with
`naming.check_principal_name`; the models stay lenient, as every event model does, so the log
stays readable.

The API server stamps the caller on every envelope it publishes as two CloudEvents extension
attributes, `spzuser` and `spzteam` (events/principal.py): services and the ledger
trust the stamp, never what a task claims (docs/team.md).
"""

from __future__ import annotations

from typing import Literal

from .registry import Event, register
from .team_credentials import TeamCredentials

Role = Literal["admin", "member", "viewer"]
ROLES: tuple[Role, ...] = ("admin", "member", "viewer")
# A role in one team. `admin` is not one: it is deployment-wide, a user's own role (UserAdded's),
# and an admin is an admin in every team.
TeamRole = Literal["member", "viewer"]
TEAM_ROLES: tuple[TeamRole, ...] = ("member", "viewer")

# CloudEvents extension attribute names: lower-case letters and digits, at most 20 characters
# (CloudEvents 1.0, "Attribute Naming Convention").
EXT_USER = "spzuser"
EXT_TEAM = "spzteam"


class _TeamEvent(Event):
    AGGREGATE = "team"
    AGGREGATE_KEY = "team"
    team: str


class _UserEvent(Event):
    AGGREGATE = "user"
    AGGREGATE_KEY = "user"
    user: str


@register
class TeamAdded(_TeamEvent):
    """A team (SkyPilot's workspace): where its users may run, and the labels its tasks get."""

    EVENT_NAME = "team_added"
    allowed_infras: list[str] = []  # empty: every infra the broker has
    labels: dict[str, str] = {}
    # By reference, never a secret (events/team_credentials.py); None (older events): the server's default.
    credentials: TeamCredentials | None = None


@register
class TeamUpdated(_TeamEvent):
    """A team's allowed infras, default labels and credentials replaced (`spz teams update`): the
    whole new value of each, so a fold never merges. The optimizer enforces `allowed_infras` on
    placement; the provisioner makes the team's clusters with `credentials`."""

    EVENT_NAME = "team_updated"
    allowed_infras: list[str] = []  # empty: every infra the broker has
    labels: dict[str, str] = {}
    credentials: TeamCredentials | None = None  # None (older events): the server's default


@register
class TeamRemoved(_TeamEvent):
    EVENT_NAME = "team_removed"


@register
class UserAdded(_UserEvent):
    EVENT_NAME = "user_added"
    team: str
    role: Role


@register
class UserJoinedTeam(_UserEvent):
    """`user` is in one more team (`spz teams add-member`, `spz users add --team A --team B`): a
    workspace they may submit into with `-w`. A user's first team is their primary one, stamped on
    a submission without `-w`; `primary` makes this one it (an existing membership moves first).
    `role` is the user's role in this team; absent (every event before per-team roles), the user's
    own role (UserAdded's), so an old log means what it meant."""

    EVENT_NAME = "user_joined_team"
    team: str
    primary: bool = False
    role: TeamRole | None = None


@register
class UserLeftTeam(_UserEvent):
    """`user` is no longer in `team` (`spz teams remove-member`). A user is always in one team at
    least: leaving the last one is refused where it is asked, and a fold ignores it."""

    EVENT_NAME = "user_left_team"
    team: str


@register
class UserTeamRoleSet(_UserEvent):
    """`user`'s role in one team of theirs changed (`spz teams set-role`, `PATCH
    /api/v1/teams/{team}/members/{user}`): what they may do in that team's workspace and on its
    clusters and jobs from the next request on (their token stays). Not for an admin: admin is
    deployment-wide. A fold ignores it for a team the user is not in."""

    EVENT_NAME = "user_team_role_set"
    team: str
    role: TeamRole


@register
class UserRemoved(_UserEvent):
    """The user is gone, and every token of theirs with them."""

    EVENT_NAME = "user_removed"


@register
class TokenIssued(_UserEvent):
    """A token for `user`: its id and sha256 only (the token itself is shown once, never stored).

    A personal token (`service_account` false) replaces the user's earlier personal tokens; a
    service-account token stands beside them until it is revoked or the user removed."""

    EVENT_NAME = "token_issued"
    token_id: str
    token_sha256: str
    service_account: bool = False


@register
class TokenRevoked(_UserEvent):
    EVENT_NAME = "token_revoked"
    token_id: str
    reason: str = ""

