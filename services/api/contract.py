"""What the API server publishes on its callers' behalf, and what it follows (docs/events.md).

It is not run by `spz api serve` (a plain `Contract`, like the CLI's and the node agent's): it is a
process of its own (`python -m skypurza.services.api`), and its bus is checked against this.
"""

from __future__ import annotations

from skypurza.events.contract import BusAccess, Contract
from skypurza.events.identity_events import (
    TeamAdded,
    TeamUpdated,
    TeamRemoved,
    TokenIssued,
    TokenRevoked,
    UserAdded,
    UserJoinedTeam,
    UserLeftTeam,
    UserRemoved,
    UserTeamRoleSet,
)
from skypurza.events.cluster_events import (
    AutostopSet,
    ClusterTerminated,
    DownRequested,
    StartRequested,
    StopRequested,
)
from skypurza.events.job_events import CancelRequested, JobQueued
from skypurza.events.managed_events import ManagedJobCancelRequested, ManagedJobSubmitted
from skypurza.events.task_events import TaskSubmitted
from skypurza.events.dispatch_events import DispatchPolicyApplied

CONTRACT = Contract(
    name="api",
    emits=(TaskSubmitted, JobQueued, StopRequested, StartRequested, DownRequested, ClusterTerminated, AutostopSet,
           CancelRequested, ManagedJobSubmitted, ManagedJobCancelRequested, TeamAdded, TeamRemoved, TeamUpdated, UserAdded,
           UserRemoved, UserJoinedTeam, UserLeftTeam, UserTeamRoleSet, TokenIssued, TokenRevoked, DispatchPolicyApplied),
    consumes=(TeamAdded, TeamUpdated, TeamRemoved, UserAdded, UserJoinedTeam, UserLeftTeam, UserTeamRoleSet, UserRemoved,
              TokenIssued, TokenRevoked),
    emit_notes={TaskSubmitted: "`POST /api/v1/tasks`, the envelope stamped with the caller: `spzuser`, `spzteam`",
                JobQueued: "`POST /api/v1/clusters/{name}/jobs` (spz exec, spz launch -c on a cluster that is up): the "
                           "next job id by optimistic concurrency, stamped",
                StopRequested: "`POST /api/v1/clusters/{name}/stop`, stamped",
                StartRequested: "`POST /api/v1/clusters/{name}/start`, stamped",
                DownRequested: "`POST /api/v1/clusters/{name}/down`, stamped",
                ClusterTerminated: "`POST /api/v1/clusters/{name}/purge` (`reason: purged`: spz down --purge after a "
                                   "teardown failed or was not confirmed), stamped",
                AutostopSet: "`POST /api/v1/clusters/{name}/autostop` (and `start` or `jobs` with `idle_minutes`), "
                             "stamped",
                CancelRequested: "`POST /api/v1/clusters/{name}/jobs/.../cancel`, stamped",
                ManagedJobSubmitted: "`POST /api/v1/jobs`, stamped",
                ManagedJobCancelRequested: "`POST /api/v1/jobs/{id}/cancel`, stamped",
                UserAdded: "`POST /api/v1/users`, admins only", UserRemoved: "`DELETE /api/v1/users/{name}`, admins only",
                UserJoinedTeam: "`POST /api/v1/teams/{name}/members` and `POST /api/v1/users` with `other_teams`, "
                                "admins only",
                UserLeftTeam: "`DELETE /api/v1/teams/{name}/members/{user}`, admins only",
                UserTeamRoleSet: "`PATCH /api/v1/teams/{name}/members/{user}`, admins only",
                TokenIssued: "`POST /api/v1/users` and `/users/{name}/token`, admins only",
                TokenRevoked: "`POST /api/v1/users/{name}/token` (the old one) and "
                              "`DELETE /api/v1/users/{name}/tokens/{id}`, admins only",
                TeamAdded: "`POST /api/v1/teams`, admins only", TeamRemoved: "`DELETE /api/v1/teams/{name}`, admins only",
                TeamUpdated: "`PATCH /api/v1/teams/{name}`, admins only",
                DispatchPolicyApplied: "`PUT` and `DELETE /api/v1/dispatch/policy`, admins only, stamped"},
    consume_notes={TokenIssued: "who a bearer token is", UserRemoved: "the user's tokens die",
                   TeamAdded: "teams", TeamUpdated: "a team's allowed infras and labels",
                   UserJoinedTeam: "a user's teams: the workspaces -w may name", UserLeftTeam: "a user's teams",
                   UserTeamRoleSet: "a user's role in one team"},
    # The status, ledger, metrics, GPU health and dispatch queries it answers requests with, the provisioner's reconcile
    # (spz status -r), jobs' output (SSE), a task's secrets and uploads (the secured bus's grants).
    bus=BusAccess(asks=("status", "ledger", "observability", "gpuhealth", "provisioner", "dispatch"), logs="read",
                  secrets="write", objects="write"),
)
