"""Cluster verbs as `sky` has them: launch, exec, status, queue, logs, cancel, stop, start, down,
autostop.

Every verb is a client of the event log: it publishes what the user asks for (TaskSubmitted,
JobQueued, CancelRequested, StopRequested ...) and watches the log for what happened. The
embedded control plane is started on first use. `status` and `queue` ask the status
service's projections (request-reply) and read the log directly when it does not answer or with
`--refresh`; the verbs that act on one cluster always decide on the log itself.

The verbs live by family: cmd_launch.py (launch, exec), cmd_inspect.py (status, queue, logs,
cancel), cmd_lifecycle.py (stop, start, down, autostop); what they share is verbs.py. This module
registers them, in the order `spz --help` lists them.
"""

from __future__ import annotations

import typer

from . import cmd_inspect, cmd_launch, cmd_lifecycle


def register(app: typer.Typer) -> None:
    """Add the cluster verbs to the spz app."""
    app.command("launch")(cmd_launch.launch_command)
    app.command("exec")(cmd_launch.exec_command)
    app.command("status")(cmd_inspect.status_command)
    app.command("queue")(cmd_inspect.queue_command)
    app.command("logs")(cmd_inspect.logs_command)
    app.command("cancel")(cmd_inspect.cancel_command)
    app.command("stop")(cmd_lifecycle.stop_command)
    app.command("start")(cmd_lifecycle.start_command)
    app.command("down")(cmd_lifecycle.down_command)
    app.command("autostop")(cmd_lifecycle.autostop_command)
