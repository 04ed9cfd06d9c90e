"""Upper bounds of every count, size and duration a user gives (task YAML and command line).

One module so that the task model, the YAML loader and the CLI refuse the same values with the
same numbers, and `docs/task-yaml.md` / `docs/cli.md` ("Bounds") can list them. Each bound is
far above what a real task needs and low enough that no value within it can exhaust a service:
a value past a bound is refused at the edge (file:line:col, or the flag) before any event
carries it. Constants only: importing this costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB

# ---------------------------------------------------------------------- the YAML file itself

# A task file is a few KiB; 4 MiB of YAML takes PyYAML (pure Python, so that we keep every
# node's position) a few seconds, which is the most a check may cost.
MAX_YAML_FILE_BYTES = 4 * MIB
# Nodes of a document counting every alias expansion: what pydantic, the dumps and the events
# would walk. Billion-laughs files expand to 10^9 and are refused before anything walks them.
MAX_YAML_NODES = 200_000
# Nesting depth: PyYAML's composer, our checks and pydantic recurse; a task nests ~6 deep.
MAX_YAML_DEPTH = 64

# ------------------------------------------------------------------------------ the task

# Nodes of one cluster (num_nodes, --num-nodes). Each node is an agent, a heartbeat every few
# seconds and a NodeReady; 1,024 is past the largest gangs SkyPilot users run.
MAX_NODES = 1024
# Idle minutes before autostop (resources.autostop, -i): one year. Larger values mean "never"
# (leave autostop off) and would overflow the agents' deadlines.
MAX_IDLE_MINUTES = 365 * 24 * 60
# OS disk (disk_size, --disk-size, resources.volumes[].disk_size), GB: EBS's largest volume is
# 64 TiB.
MAX_DISK_GB = 65_536
# vCPUs and memory per node: the largest instances have 896 vCPUs and 32 TiB.
MAX_CPUS = 4096
MAX_MEMORY_GIB = 65_536
MAX_MEMORY_RATIO = 1024  # memory "4x": GiB per vCPU
# Accelerators per node: the largest nodes have 16 GPUs (TPU slices are named, count 1).
MAX_ACCELERATOR_COUNT = 1024
# Entries of resources.ports: a security group takes 60 inbound rules by default.
MAX_PORT_ENTRIES = 100
# Choices that multiply into resource requests (any_of/ordered entries, accelerator choices):
# placement ranks their product.
MAX_RESOURCE_ALTERNATIVES = 64
# Managed-job restarts on user-code failures (job_recovery.max_restarts_on_errors).
MAX_RESTARTS = 1000
# Seconds-valued knobs of a task (autostop.hook_timeout, a job group's termination_delay): a day.
MAX_TIMEOUT_S = 24 * 3600
# Managed jobs one `spz jobs launch --num-jobs N` submits, and jobs of one job group: each is
# a managed job with clusters of its own, and a launch follows them all.
MAX_NUM_JOBS = 1000
# max_hourly_cost, dollars per hour (micro-dollars stay well inside int64).
MAX_HOURLY_COST = 1_000_000

# envs and secrets: exported into every job's environment. Linux refuses one "NAME=value"
# string over 128 KiB (MAX_ARG_STRLEN) and a whole environment near 2 MiB (ARG_MAX).
MAX_ENV_VARS = 1000  # envs and secrets, each
MAX_ENV_NAME_CHARS = 256
MAX_ENV_VALUE_BYTES = 64 * KIB
MAX_ENV_TOTAL_BYTES = 1 * MIB  # every name and value of envs + secrets together
# setup/run scripts: travel inside events (the stream takes 8 MiB messages).
MAX_SCRIPT_BYTES = 1 * MIB
# file_mounts, volumes, managed_secrets, resources.volumes, labels, volume_mounts: entries each.
MAX_MOUNTS = 256
MAX_LABELS = 64
# Names: task/job names (a task name is part of ids and log subjects) and cluster names
# (-c: part of resource names and tags; 63 as a DNS label).
MAX_TASK_NAME_CHARS = 128
MAX_CLUSTER_NAME_CHARS = 63

# A local workdir or file-mount source sent to cloud nodes (events/uploads.py): its files, in
# bytes. It travels through the bus's object store, to every node of every job; data sets
# belong in a bucket (file_mounts: s3://...), and .skyignore keeps the rest at home.
MAX_UPLOAD_BYTES = 1024 * MIB

# --------------------------------------------------------------------------- the CLI only

# Job ids (spz logs/cancel, spz jobs logs/cancel): allocated one by one from 1; 2^31 - 1 keeps
# every id a 32-bit integer in every projection.
MAX_JOB_ID = 2**31 - 1
# Lines of --tail (spz logs, spz api logs).
MAX_TAIL_LINES = 1_000_000
# Days of cost-report --days: 100 years.
MAX_DAYS = 36_500


@dataclass(frozen=True)
class Bound:
    """A bound as the docs show it: what is bounded, the limit, and why."""

    what: str
    limit: str
    why: str


def bounds() -> list[Bound]:
    """Every bound above, for `docs/task-yaml.md` and `docs/cli.md` (a test keeps them in step)."""
    return [
        Bound("YAML file size", f"{MAX_YAML_FILE_BYTES // MIB} MiB", "a check stays within seconds"),
        Bound("YAML nodes (aliases expanded)", f"{MAX_YAML_NODES:,}", "alias bombs refused before anything walks them"),
        Bound("YAML nesting depth", str(MAX_YAML_DEPTH), "parsers and validators recurse"),
        Bound("YAML integers", "64-bit (±9.2e18)", "Python will not build a 4,300-digit int"),
        Bound("num_nodes, --num-nodes", f"1..{MAX_NODES}", "one agent per node"),
        Bound("autostop idle minutes, -i", f"0..{MAX_IDLE_MINUTES:,} (a year)", "longer means never"),
        Bound("disk_size, --disk-size", f"1..{MAX_DISK_GB:,} GB", "EBS's largest volume"),
        Bound("cpus", f"up to {MAX_CPUS}", "largest instances"),
        Bound("memory", f"up to {MAX_MEMORY_GIB:,} GiB, or {MAX_MEMORY_RATIO}x", "largest instances"),
        Bound("accelerator count", f"up to {MAX_ACCELERATOR_COUNT}", "largest nodes have 16"),
        Bound("ports entries", str(MAX_PORT_ENTRIES), "security group rules"),
        Bound("any_of/ordered entries, accelerator choices", str(MAX_RESOURCE_ALTERNATIVES), "placement ranks their product"),
        Bound("max_restarts_on_errors", str(MAX_RESTARTS), "restarts cost money"),
        Bound("hook_timeout, termination_delay", f"{MAX_TIMEOUT_S:,} s (a day)", "nothing waits for ever"),
        Bound("--num-jobs, jobs of a job group", f"1..{MAX_NUM_JOBS:,}", "each a managed job of its own"),
        Bound("max_hourly_cost", f"{MAX_HOURLY_COST:,} $/h", "micro-dollars stay in int64"),
        Bound("envs, secrets (each)", f"{MAX_ENV_VARS} entries", "exported into every job"),
        Bound("env/secret name", f"{MAX_ENV_NAME_CHARS} characters", "exported into every job"),
        Bound("env/secret value", f"{MAX_ENV_VALUE_BYTES:,} bytes", "under Linux MAX_ARG_STRLEN (128 KiB)"),
        Bound("envs + secrets together", f"{MAX_ENV_TOTAL_BYTES // MIB} MiB", "Linux ARG_MAX"),
        Bound("setup, run", f"{MAX_SCRIPT_BYTES // MIB} MiB each", "carried in events"),
        Bound("file_mounts, volumes, managed_secrets, volume_mounts, resources.volumes", f"{MAX_MOUNTS} entries each",
              "synced per node"),
        Bound("labels", f"{MAX_LABELS} entries", "cloud tags"),
        Bound("workdir / local file-mount source sent to cloud nodes", f"{MAX_UPLOAD_BYTES // MIB:,} MiB of files",
              "sent through the bus to every node"),
        Bound("task / job name", f"{MAX_TASK_NAME_CHARS} characters", "part of ids and subjects"),
        Bound("cluster name, -c", f"1..{MAX_CLUSTER_NAME_CHARS} characters", "a DNS label; part of resource names"),
        Bound("job ids", f"1..{MAX_JOB_ID:,}", "32-bit ids"),
        Bound("--tail", f"0..{MAX_TAIL_LINES:,} lines", "kept in memory"),
        Bound("cost-report --days", f"1..{MAX_DAYS:,}", "a century"),
    ]
