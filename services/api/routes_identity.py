"""Users and teams over HTTP (`spz users|teams`): admins only, 403 with the reason for anyone else.

Changes go through services/api/directory_io.py (optimistic concurrency on the log), as the CLI's
do. A new token is in the answer of the POST that made it, once: the log holds only its digest
and no listing shows one.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

from fastapi import APIRouter, Depends, Path
from pydantic import BaseModel, ConfigDict, Field

from skypurza.events import naming
from skypurza.events.identity_events import Role, TeamRole
from skypurza.events.team_credentials import AWS_PROFILE_PATTERN, AWS_PROFILE_RULE, with_aws_profile
from skypurza.events.team_credentials import K8S_NAMESPACE_PATTERN, K8S_NAMESPACE_RULE, with_k8s_namespace
from skypurza.events.team_credentials import SLURM_ACCOUNT_PATTERN, SLURM_ACCOUNT_RULE, with_slurm_account
from skypurza.events.team_credentials import to_dict as credentials_dict

from . import directory_io
from .deps import ApiDeps
from .identity import Principal, authorize
from .problems import Problem, forbidden, not_found

_NAME = naming.PRINCIPAL_NAME_PATTERN  # the CLI's rule: every name it made can be named here
Name = Annotated[str, Path(min_length=1, max_length=63, pattern=_NAME,
                           description="A user's or team's name (lower-case letters, digits, - _).")]
_BodyName = Annotated[str, Field(min_length=1, max_length=63, pattern=_NAME)]
# An infra like aws, aws/us-east-1 or local (the CLI's rule, cli/cmd_identity.py): no subject metacharacter.
_Infra = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9_./-]{0,127}$")]


class UserRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: _BodyName
    team: _BodyName = Field(description="The user's primary team: a submission without a workspace is stamped with it.")
    other_teams: list[_BodyName] = Field(default_factory=list, max_length=directory_io.MAX_TEAMS_PER_USER - 1,
                                         description="More teams the user is in (workspaces they may pick with -w).")
    role: Role = "member"


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    service_account: bool = Field(False, description="An extra token for a program; the user's own token stays.")


class MemberRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    user: _BodyName
    primary: bool = Field(False, description="Make this the user's primary team (already in it: it moves first).")
    role: Optional[TeamRole] = Field(None, description="The user's role in this team (member or viewer); left out: "
                                                       "their own role. Admin is deployment-wide, not a team's.")


class MemberRoleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    role: TeamRole = Field(description="The user's role in this team: member or viewer (admin is deployment-wide).")


class AwsCredentialsBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    profile: str = Field(min_length=1, max_length=64, pattern=AWS_PROFILE_PATTERN,
                         description=f"A named profile of the server's AWS credentials/config files ({AWS_PROFILE_RULE}).")


class KubernetesCredentialsBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    namespace: str = Field(min_length=1, max_length=63, pattern=K8S_NAMESPACE_PATTERN,
                           description=f"The namespace the team's pods, Services and Secrets go in ({K8S_NAMESPACE_RULE}).")


class SlurmCredentialsBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    account: str = Field(min_length=1, max_length=64, pattern=SLURM_ACCOUNT_PATTERN,
                         description=f"The Slurm account the team's allocations are charged to ({SLURM_ACCOUNT_RULE}).")


class CredentialsBody(BaseModel):
    """A team's credentials BY REFERENCE (SkyPilot's workspace keys): never a secret. On PATCH a
    key left out is kept and a key given as null goes back to the server's default."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    aws: AwsCredentialsBody | None = Field(None, description="The team's EC2 clusters are made with this profile; "
                                                             "null: the server's default credentials.")
    kubernetes: KubernetesCredentialsBody | None = Field(
        None, description="The team's Kubernetes clusters are made in this namespace; null: each context's own.")
    slurm: SlurmCredentialsBody | None = Field(
        None, description="The team's Slurm allocations are charged to this account (sbatch --account); "
                          "null: the cluster's sbatch_options decide.")


class TeamRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: _BodyName
    allowed_infras: list[_Infra] = Field(default_factory=list, max_length=100)
    labels: dict[Annotated[str, Field(max_length=63)], Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict, max_length=64)
    credentials: CredentialsBody | None = None


class TeamUpdate(BaseModel):
    """What `PATCH /api/v1/teams/{name}` replaces; a field left out is kept."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    allowed_infras: list[_Infra] | None = Field(default=None, max_length=100)
    labels: dict[Annotated[str, Field(max_length=63)], Annotated[str, Field(max_length=256)]] | None = Field(
        default=None, max_length=64)
    credentials: CredentialsBody | None = Field(
        None, description="The credentials to change, per infra key (left out: kept; a key null: the default).")


def _profile_of(body: CredentialsBody | None) -> str | None:
    """directory_io's aws_profile: None kept, "" the server's default, else the profile."""
    if body is None or "aws" not in body.model_fields_set:
        return None
    return body.aws.profile if body.aws is not None else ""


def _namespace_of(body: CredentialsBody | None) -> str | None:
    """directory_io's k8s_namespace: None kept, "" each context's own, else the namespace."""
    if body is None or "kubernetes" not in body.model_fields_set:
        return None
    return body.kubernetes.namespace if body.kubernetes is not None else ""


def _account_of(body: CredentialsBody | None) -> str | None:
    """directory_io's slurm_account: None kept, "" the cluster's own options, else the account."""
    if body is None or "slurm" not in body.model_fields_set:
        return None
    return body.slurm.account if body.slurm is not None else ""


def _refused(exc: directory_io.IdentityError) -> Problem:
    text = str(exc)
    if text.startswith("no user") or text.startswith("no team "):
        return not_found(text)
    return Problem(409, "conflict", "Conflict", text)


def router(deps: ApiDeps) -> APIRouter:
    r = APIRouter(prefix="/api/v1", tags=["identity"])

    async def admin(who: Principal = Depends(deps.principal)) -> Principal:
        decision = authorize(who, "manage")
        if not decision.allowed:
            raise forbidden(decision.reason)
        return who

    only_admin = Depends(admin)

    @r.get("/users", summary="Users, their team and role (spz users list); no tokens")
    async def users(who: Principal = only_admin) -> dict[str, Any]:
        d = await directory_io.load_directory(deps.bus())
        # `role` is the primary team's (as before per-team roles); `roles` each team's.
        return {"users": [{"name": u.name, "team": u.team, "teams": list(u.teams), "role": u.primary_role,
                           "roles": u.roles,
                           "tokens": len(u.tokens), "token_ids": sorted(u.tokens),
                           "service_account_token_ids": sorted(t.token_id for t in u.tokens.values()
                                                               if t.service_account)}
                          for u in sorted(d.users.values(), key=lambda u: u.name)]}

    @r.post("/users", status_code=201, summary="Add a user; the answer holds their token, once (spz users add)")
    async def add_user(body: UserRequest, who: Principal = only_admin) -> dict[str, Any]:
        try:
            token = await directory_io.add_user(deps.bus(), body.name, body.team, body.role, body.other_teams)
        except directory_io.IdentityError as exc:
            raise _refused(exc)
        teams = list(dict.fromkeys([body.team, *body.other_teams]))
        return {"name": body.name, "team": body.team, "teams": teams, "role": body.role,
                "roles": {t: body.role for t in teams}, "token": token.token, "token_id": token.token_id}

    @r.delete("/users/{name}", summary="Remove a user; their tokens die (spz users remove)")
    async def remove_user(name: Name, who: Principal = only_admin) -> dict[str, Any]:
        try:
            await directory_io.remove_user(deps.bus(), name)
        except directory_io.IdentityError as exc:
            raise _refused(exc)
        return {"name": name, "removed": True}

    @r.post("/users/{name}/token", status_code=201,
            summary="A new token for the user, the old one revoked; in this answer once (spz users token)")
    async def new_token(name: Name, body: Optional[TokenRequest] = None, who: Principal = only_admin) -> dict[str, Any]:
        service_account = body is not None and body.service_account
        try:
            token = await directory_io.reissue_token(deps.bus(), name, service_account)
        except directory_io.IdentityError as exc:
            raise _refused(exc)
        return {"name": name, "token": token.token, "token_id": token.token_id, "service_account": service_account}

    @r.get("/teams", summary="Teams and their members (spz teams list): an admin's every team, anyone else's "
                             "their own teams (their workspaces and credentials references) only")
    async def teams(who: Principal = Depends(deps.principal)) -> dict[str, Any]:
        d = await directory_io.load_directory(deps.bus())
        # A reference is no secret, but which accounts other teams use is for admins to see.
        mine = None if authorize(who, "manage").allowed else set(who.in_teams)
        return {"teams": [{"name": t.name, "allowed_infras": list(t.allowed_infras), "labels": dict(t.labels),
                           "credentials": credentials_dict(t.credentials), "members": d.members(t.name)}
                          for t in sorted(d.teams.values(), key=lambda t: t.name) if mine is None or t.name in mine]}

    @r.post("/teams", status_code=201, summary="Add a team (spz teams add)")
    async def add_team(body: TeamRequest, who: Principal = only_admin) -> dict[str, Any]:
        try:
            creds = with_slurm_account(with_k8s_namespace(with_aws_profile(None, _profile_of(body.credentials)),
                                                          _namespace_of(body.credentials)),
                                       _account_of(body.credentials))
            await directory_io.add_team(deps.bus(), body.name, list(body.allowed_infras), dict(body.labels), creds)
        except directory_io.IdentityError as exc:
            raise _refused(exc)
        return {"name": body.name, "allowed_infras": list(body.allowed_infras), "labels": dict(body.labels),
                "credentials": credentials_dict(creds)}

    @r.patch("/teams/{name}", summary="Replace a team's allowed infras and/or labels (spz teams update)")
    async def update_team(name: Name, body: TeamUpdate, who: Principal = only_admin) -> dict[str, Any]:
        try:
            infras, labels = await directory_io.update_team(
                deps.bus(), name, None if body.allowed_infras is None else list(body.allowed_infras),
                None if body.labels is None else dict(body.labels), _profile_of(body.credentials),
                k8s_namespace=_namespace_of(body.credentials), slurm_account=_account_of(body.credentials))
        except directory_io.IdentityError as exc:
            raise _refused(exc)
        return {"name": name, "allowed_infras": infras, "labels": labels}

    @r.post("/teams/{name}/members", status_code=201,
            summary="A user joins the team, one more workspace for -w (spz teams add-member)")
    async def add_member(name: Name, body: MemberRequest, who: Principal = only_admin) -> dict[str, Any]:
        try:
            teams = await directory_io.add_member(deps.bus(), name, body.user, body.primary, body.role)
        except directory_io.IdentityError as exc:
            raise _refused(exc)
        return {"team": name, "user": body.user, "teams": list(teams)}

    @r.patch("/teams/{name}/members/{user}",
             summary="Set a member's role in this team: member or viewer (spz teams set-role)")
    async def set_role(name: Name, user: Name, body: MemberRoleRequest, who: Principal = only_admin) -> dict[str, Any]:
        try:
            roles = await directory_io.set_role(deps.bus(), name, user, body.role)
        except directory_io.IdentityError as exc:
            raise _refused(exc)
        return {"team": name, "user": user, "role": body.role, "roles": roles}

    @r.delete("/teams/{name}/members/{user}",
              summary="A user leaves the team; not their last one (spz teams remove-member)")
    async def remove_member(name: Name, user: Name, who: Principal = only_admin) -> dict[str, Any]:
        try:
            teams = await directory_io.remove_member(deps.bus(), name, user)
        except directory_io.IdentityError as exc:
            raise _refused(exc)
        return {"team": name, "user": user, "removed": True, "teams": list(teams)}

    @r.delete("/teams/{name}", summary="Remove a team without users (spz teams remove)")
    async def remove_team(name: Name, who: Principal = only_admin) -> dict[str, Any]:
        try:
            await directory_io.remove_team(deps.bus(), name)
        except directory_io.IdentityError as exc:
            raise _refused(exc)
        return {"name": name, "removed": True}

    return r
