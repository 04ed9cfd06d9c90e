"""Every declared contract, for `docs/events.md`: the open services' (by import path), the node
agent's, the CLI's own, and those of the platform services that joined through the
`skypurza.services` entry points (as `serve.py` finds them).

    python -m skypurza.cli.contracts > docs/events.md

The contracts are looked up by path, not imported here by name, so this module adds no import
of a service to the CLI and names no platform module (a service that is not installed is left
out of the table).
"""

from __future__ import annotations

import importlib
import sys

from skypurza.events.contract import Contract
from skypurza.events.docgen import render
from skypurza.events.models import (
    AutostopSet,
    CancelRequested,
    CapacityError,
    CleanupFailed,
    ClusterTerminated,
    DispatchPolicyApplied,
    DownRequested,
    JobCancelled,
    JobFailed,
    JobQueued,
    JobStarted,
    JobSucceeded,
    ManagedJobCancelRequested,
    ManagedJobStatusChanged,
    ManagedJobSubmitted,
    OrphanFound,
    PlacementChosen,
    PlacementFailed,
    ProvisionFailed,
    StartRequested,
    StopRequested,
    TaskSubmitted,
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

from .plugins import service_entry_points

# What `spz` itself publishes (its commands) and watches (progress, exit codes).
CLI = Contract(
    name="CLI",
    emits=(TaskSubmitted, DownRequested, StopRequested, StartRequested, AutostopSet, JobQueued, CancelRequested,
           ManagedJobSubmitted, ManagedJobCancelRequested, ClusterTerminated, OrphanFound, CleanupFailed,
           TeamAdded, TeamRemoved, TeamUpdated, UserAdded, UserRemoved, UserJoinedTeam, UserLeftTeam, TokenIssued,
           TokenRevoked, DispatchPolicyApplied, UserTeamRoleSet),
    consumes=(PlacementChosen, PlacementFailed, CapacityError, ProvisionFailed, CleanupFailed, JobStarted,
              JobSucceeded, JobFailed, JobCancelled, ManagedJobStatusChanged),
    emit_notes={TaskSubmitted: "`spz launch`", DownRequested: "`spz down`", StopRequested: "`spz stop`",
                StartRequested: "`spz start`", AutostopSet: "`spz autostop`", JobQueued: "`spz exec`, relaunch",
                CancelRequested: "`spz cancel`", ManagedJobSubmitted: "`spz jobs launch`",
                ManagedJobCancelRequested: "`spz jobs cancel`",
                ClusterTerminated: "`spz down --purge` (a failed teardown) or `spz reconcile` (vanished)",
                OrphanFound: "`spz reconcile`", CleanupFailed: "`spz reconcile` (its sweep)",
                TeamAdded: "`spz teams add`", TeamRemoved: "`spz teams remove`",
                TeamUpdated: "`spz teams update`", UserAdded: "`spz users add`",
                UserRemoved: "`spz users remove`",
                UserJoinedTeam: "`spz teams add-member`, `spz users add --team A --team B`",
                UserLeftTeam: "`spz teams remove-member`", UserTeamRoleSet: "`spz teams set-role`",
                TokenIssued: "`spz users add`, `spz users token`",
                TokenRevoked: "`spz users token` (the old token)",
                DispatchPolicyApplied: "`spz dispatch policy apply|clear`"},
    consume_notes={PlacementChosen: "progress", CapacityError: "progress", PlacementFailed: "exit 1",
                   CleanupFailed: "`spz down` warns, exit 3", JobSucceeded: "exit 0", JobFailed: "exit 1"},
)

# The open broker's, in the order the docs name them; the platform services' follow.
CONTRACTS: dict[str, str] = {
    "optimizer": "skypurza.services.optimizer.service:CONTRACT",
    "provisioner": "skypurza.services.provisioner.service:CONTRACT",
    "agent": "skypurza.services.agent.agent:CONTRACT",
    "recovery": "skypurza.services.recovery.service:CONTRACT",
    "status": "skypurza.services.status.service:CONTRACT",
    "api": "skypurza.services.api.contract:CONTRACT",
    "mirror": "skypurza.services.mirror.service:CONTRACT",
}


def load_contract(path: str) -> Contract:
    """A contract by "module:name": the contract itself, or a service class declaring one."""
    module_name, _, attr = path.partition(":")
    contract = getattr(importlib.import_module(module_name), attr)
    contract = getattr(contract, "contract", contract)
    if not isinstance(contract, Contract):
        raise TypeError(f"{path} is not a Contract")
    return contract


def all_contracts() -> list[Contract]:
    out = [CLI]
    for path in [*CONTRACTS.values(), *service_entry_points().values()]:
        try:
            out.append(load_contract(path))
        except ModuleNotFoundError:  # a service this install does not have: not in the table
            continue
    return out


def main() -> int:
    sys.stdout.write(render(all_contracts()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
