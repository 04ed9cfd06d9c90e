"""Cluster verbs as `sky` has them: launch, exec, status, queue, logs, cancel, stop, start, down,
autostop.

Every verb is a client of the event log: it publishes what the user asks for (TaskSubmitted,
JobQueued, CancelRequested, StopRequested ...) and watches the log for what happened. The
embedded control plane is started on first use. `status` and `queue` ask the status
service's projections (request-reply) and read the log directly when it does not answer or with
`--refresh`; the verbs that act on one cluster always decide on the log itself.

The verbs live by family: cmd_launch.py (launch, exec), cmd_inspect.py (status, queue, logs,
cancel), cmd_lifecycle.py (stop, start, down, autostop); what they share is verbs.py. Each family
registers its own verbs; cli/commandtable.py lists them in the order of `spz --help`.
"""

from __future__ import annotations

import typer

from . import cmd_inspect, cmd_launch, cmd_lifecycle


def register(app: typer.Typer) -> None:
    """Add the cluster verbs to the spz app (each family's own `register`; `spz` itself loads
    one family at a time, cli/lazyapp.py)."""
    for family in (cmd_launch, cmd_inspect, cmd_lifecycle):
        family.register(app)
