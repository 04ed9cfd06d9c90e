"""Which workspace (SkyPilot's name for a team) a submission runs in, and the labels it brings.

A user belongs to one team today, and a team is a workspace: its allowed infras confine where its
tasks are placed (services/optimizer/workspace.py) and its labels are every task's defaults.
`-w/--workspace NAME` (the request's `workspace`) names it: for a member or viewer it must be
their own team (leaving it out means the same); an admin may submit into any team's workspace,
and the submission is then stamped with that team. Pure: the directory is passed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .identity import Directory, Principal
from .problems import forbidden, not_found


def resolve(who: Principal, workspace: str | None, directory: Directory) -> tuple[Principal, dict[str, str]]:
    """The principal to stamp (its team the workspace) and the workspace's default labels."""
    team = workspace or who.team
    if team != who.team and who.role != "admin":
        raise forbidden(f"{who.user} works in workspace {who.team} only (a user's team is their workspace); "
                        f"leave out -w/--workspace or give -w {who.team}")
    known = directory.teams.get(team)
    if known is None:
        if team == who.team:  # their own team without a record (the embedded default's `local`): no defaults
            return who, {}
        raise not_found(f"no workspace {team}: workspaces are teams (spz teams list)")
    stamped = who if team == who.team else dataclasses.replace(who, team=team)
    return stamped, dict(known.labels)


def with_default_labels(public: Mapping[str, Any], defaults: Mapping[str, str]) -> dict[str, Any]:
    """The task's public mapping with the workspace's labels under its own (the task's win)."""
    if not defaults:
        return dict(public)
    resources = dict(public.get("resources") or {})
    resources["labels"] = {**defaults, **(resources.get("labels") or {})}
    return {**public, "resources": resources}


