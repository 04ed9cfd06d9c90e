"""The CLI's publish check without importing its contract (issue 21).

`cli/contracts.CLI` names the event classes the CLI emits, so importing it imports nearly every
event module (and the docs renderer): ~0.1 s of every `spz launch`/`exec`/`down` for a check
that is one set lookup. The bus of a command checks the names here; an event not among them is
handed to the real contract, which raises `UndeclaredEmit` with its own message and records it,
as before. tests/test_cli_light.py checks that these names are the contract's.
"""

from __future__ import annotations

from typing import Any

CLI_EMITS = frozenset({
    "autostop_set", "cancel_requested", "cleanup_failed", "cluster_terminated", "dispatch_policy_applied",
    "down_requested", "job_queued", "managed_job_cancel_requested", "managed_job_submitted", "orphan_found",
    "start_requested", "stop_requested", "task_submitted", "team_added", "team_removed", "team_updated",
    "token_issued", "token_revoked", "user_added", "user_joined_team", "user_left_team", "user_removed",
    "user_team_role_set",
})


class CliDeclared:
    """Publish hooks (events/bus.PublishHooks) of the CLI's bus: what `declared_bus(bus, CLI)` did."""

    def before(self, env: Any) -> None:
        if env.event_name not in CLI_EMITS:
            from .contracts import CLI  # only on the way to an error: the contract's own raise

            CLI.check(env.event_name)

    def after(self, env: Any, ack: Any) -> None:
        pass
