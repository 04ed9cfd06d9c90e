"""Every open `spz` command: its name, the cli module whose `register(app)` adds it, and the
first paragraph of its help, as `spz --help` lists it (cli/lazyapp.py loads a module only when
its command runs). Order is the order of `spz --help`; typer lists the commands before the
sub-apps (`group=True`), so they are kept apart here too.

tests/test_cli_lazy.py builds every command and fails when an entry differs from the command
it names (help, hidden, kind, module), when a command is missing here, or when the lazy
`spz --help` is not byte for byte the one built from every module: change the help in the
command's docstring and here together.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Listed:
    name: str
    module: str    # cli/<module>.py: its register(app) adds the command
    help: str      # the first paragraph of the command's help
    group: bool = False   # a sub-app (`spz jobs ...`), not a command
    hidden: bool = False
    plugins: bool = False  # the platform plugins add to it: they load before it runs


COMMANDS: tuple[Listed, ...] = (
    # cluster verbs (cli/cmd_cluster.py lists them by family)
    Listed("launch", "cmd_launch", "Launch a cluster and run a task on it, streaming its output until it ends."),
    Listed("exec", "cmd_launch", "Run a task or command on an existing cluster: no provisioning, no setup."),
    Listed("status", "cmd_inspect", "Show clusters: status, where they run, what they cost per hour, autostop."),
    Listed("queue", "cmd_inspect", "Show the job queue of clusters: each job's id, name, user, times and status."),
    Listed("logs", "cmd_inspect", "Print a job's output (every node, prefixed by rank when there are several)."),
    Listed("cancel", "cmd_inspect",
           "Cancel jobs: their whole process groups get SIGTERM, then SIGKILL after a grace period."),
    Listed("stop", "cmd_lifecycle",
           "Stop clusters: nodes (and running jobs) stop, disks and homes are kept; spz start resumes."),
    Listed("start", "cmd_lifecycle", "Start stopped clusters again, in the same place."),
    Listed("down", "cmd_lifecycle",
           "Tear clusters down: every node is terminated and its disk (or local home) deleted; billing stops."),
    Listed("autostop", "cmd_lifecycle",
           "Stop (or, with --down, tear down) a cluster after it has been idle for -i minutes."),
    Listed("check-yaml", "cmd_taskspec",
           "Validate task YAMLs as SkyPilot 0.14.1 would: exit 0 when all are valid, 1 otherwise."),
    Listed("check", "cmd_catalog",
           "Which infras are enabled (AWS: credentials and an answering STS/EC2; local: always) and why not."),
    Listed("serve", "cmd_api", "SkyServe is not supported yet (`spz api serve` runs the control plane's services)."),
    Listed("reconcile", "cmd_provision",
           "Compare what the clouds hold for this stage with the live clusters in the event log.", hidden=True),
    Listed("audit", "cmd_audit", "Compare the live projections (status, and accounting where installed) with a "
           "fresh replay\nof the log, table by table.", plugins=True),
    # sub-apps
    Listed("jobs", "cmd_jobs", "Managed jobs: run to the end, recovered from spot preemption.", group=True),
    Listed("schema", "cmd_taskspec", "JSON Schemas of spz inputs, for editors.", group=True),
    Listed("gpus", "cmd_catalog", "GPU offerings and prices.", group=True),
    Listed("catalog", "cmd_catalog", "The instance and price catalog.", group=True),
    Listed("events", "cmd_events", "The event log: follow it, replay it, export its schemas.", group=True,
           plugins=True),
    Listed("api", "cmd_api", "The API server and the embedded control plane (nats-server, services) on this "
           "machine; log in to a team's server.", group=True),
    Listed("users", "cmd_identity", "Users of the API server: their teams, role and token.", group=True),
    Listed("teams", "cmd_identity", "Teams (SkyPilot's workspaces): allowed infras and default labels.", group=True),
)
