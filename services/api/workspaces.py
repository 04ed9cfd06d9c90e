"""Which workspace (SkyPilot's name for a team) a submission runs in, and the labels it brings.

A team is a workspace: its allowed infras confine where its tasks are placed
(services/optimizer/workspace.py) and its labels are every task's defaults. A user is in one team
or several (UserJoinedTeam); `-w/--workspace NAME` (the request's `workspace`) picks one of them,
and leaving it out means their primary (first) team. The submission is stamped with that team
(events/principal.py), which is what the ledger bills and dispatch queues by. A member or viewer
cannot name a team they are not in (403 with their teams); an admin may submit into any team's
workspace. A job queued on a cluster that exists (`spz exec`) joins that cluster's team
(`for_cluster`). The principal returned carries the caller's role in that team (a member of ml may be a
viewer of cv), which is what authorizes the submission. Pure: the directory is passed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .identity import Directory, Principal
from .problems import forbidden, not_found


def resolve(who: Principal, workspace: str | None, directory: Directory) -> tuple[Principal, dict[str, str]]:
    """The principal to stamp (its team the workspace) and the workspace's default labels."""
    mine = who.in_teams
    team = workspace or who.team
    if team not in mine and not who.is_admin:
        raise forbidden(not_in_team(who, team))
    known = directory.teams.get(team)
    if known is None:
        if team in mine:  # their own team without a record (the embedded default's `local`): no defaults
            return _in(who, team), {}
        raise not_found(f"no workspace {team}: workspaces are teams (spz teams list)")
    return _in(who, team), dict(known.labels)


def not_in_team(who: Principal, team: str) -> str:
    """Why `who` may not submit into `team`: the reason a 403 gives, with the teams they may name."""
    mine = who.in_teams
    return (f"{who.user} is not in team {team}; their teams: {', '.join(mine)} (-w/--workspace names one of "
            f"them; left out, {mine[0]})")


def for_cluster(who: Principal, cluster_team: str | None) -> Principal:
    """The principal a job queued on an existing cluster is stamped with: the cluster's team when
    the caller is in it (or an admin), so the job is billed and queued with the cluster it runs
    on; else the caller's primary team (a member who has left the cluster's team since)."""
    if cluster_team and (who.is_admin or cluster_team in who.in_teams):
        return _in(who, cluster_team)
    return who


def _in(who: Principal, team: str) -> Principal:
    # The role goes with the team: the caller's role in the workspace is what authorizes the request.
    if team == who.team:
        return who
    return dataclasses.replace(who, team=team, teams=who.in_teams, role=who.role_in(team))


def with_default_labels(public: Mapping[str, Any], defaults: Mapping[str, str]) -> dict[str, Any]:
    """The task's public mapping with the workspace's labels under its own (the task's win)."""
    if not defaults:
        return dict(public)
    resources = dict(public.get("resources") or {})
    resources["labels"] = {**defaults, **(resources.get("labels") or {})}
    return {**public, "resources": resources}


