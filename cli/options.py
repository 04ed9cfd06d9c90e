"""The options `sky` gives several commands, defined once.

`launch`, `exec` and `jobs launch` take the same resource and task overrides (`ResourceFlags`,
`TaskFlags`); `with_flags` adds a flag set's options to a typer command, which receives one
dataclass per set. The single options many commands share (`--async/--no-async`,
`-u/--all-users`, `-w/--workspace`, `--wait-for`, `--graceful`, ...) are made by the functions
below, so their names and help read the same everywhere.

A `sky` flag that has no meaning for SkyPurza is accepted and says in one line on stderr why it
changes nothing (`unused`): a SkyPilot user never meets "No such option" for a flag of sky's.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeVar

import typer

from . import bounds

_RES = "Resources (override the task YAML)"
_TASK = "Task (override the task YAML)"

F = TypeVar("F", bound=Callable[..., Any])

DISK_TIERS = ("low", "medium", "high", "ultra", "best", "none")
NETWORK_TIERS = ("standard", "best")
WAIT_FOR = ("jobs_and_ssh", "jobs", "none")


def _opt(option: Any) -> dict[str, Any]:
    return {"option": option}


def _choice(flag: str, accepted: tuple[str, ...]) -> Callable[[Optional[str]], Optional[str]]:
    """A typer callback: the value, lower-cased, if it is one of `accepted`; else a usage error
    naming the flag, what was given and what is accepted."""

    def check(value: Optional[str]) -> Optional[str]:
        if value is None:
            return None
        if value.lower() not in accepted:
            shown = value if len(value) <= 40 else value[:37] + "..."
            raise typer.BadParameter(f"{shown!r} is not one of {', '.join(accepted)}", param_hint=flag)
        return value.lower()

    return check


def _ports(values: Optional[list[str]]) -> Optional[list[str]]:
    """--ports 8080 --ports 8000-8010,9090: each port or range checked (1..65535), at most
    limits.MAX_PORT_ENTRIES in all."""
    if not values:
        return values
    from skypurza.events import limits
    from skypurza.events.taskspec.values import normalize_port

    items = [p.strip() for v in values for p in str(v).split(",") if p.strip()]
    if len(items) > limits.MAX_PORT_ENTRIES:
        raise typer.BadParameter(f"at most {limits.MAX_PORT_ENTRIES} ports or ranges, found {len(items):,}",
                                 param_hint="--ports")
    out = []
    for item in items:
        try:
            out.append(normalize_port(item))
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--ports") from None
    return out


@dataclass(frozen=True)
class ResourceFlags:
    """`sky launch`'s resource overrides (also exec's and jobs launch's)."""

    infra: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--infra", help="aws, aws/REGION, aws/REGION/ZONE, aws/*/ZONE or local.", rich_help_panel=_RES)))
    cloud: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--cloud", hidden=True, help="Deprecated spelling of --infra CLOUD.", rich_help_panel=_RES)))
    region: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--region", hidden=True, help="Deprecated spelling of --infra CLOUD/REGION.", rich_help_panel=_RES)))
    zone: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--zone", hidden=True, help="Deprecated spelling of --infra CLOUD/REGION/ZONE.", rich_help_panel=_RES)))
    gpus: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--gpus", help="e.g. A100:8, or none.", rich_help_panel=_RES)))
    cpus: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--cpus", help="vCPUs per node: 4 (exactly) or 4+ (at least).", rich_help_panel=_RES)))
    memory: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--memory", help="GiB per node: 16 or 16+.", rich_help_panel=_RES)))
    instance_type: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "-t", "--instance-type", help="e.g. g5.xlarge, or none.", rich_help_panel=_RES)))
    use_spot: Optional[bool] = field(default=None, metadata=_opt(typer.Option(
        None, "--use-spot/--no-use-spot", help="Spot instances or not.", rich_help_panel=_RES)))
    num_nodes: Optional[int] = field(default=None, metadata=_opt(typer.Option(
        None, "--num-nodes", parser=bounds.NODES, help="Number of nodes.", rich_help_panel=_RES)))
    disk_size: Optional[int] = field(default=None, metadata=_opt(typer.Option(
        None, "--disk-size", parser=bounds.DISK_GB, help="OS disk size in GB.", rich_help_panel=_RES)))
    disk_tier: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--disk-tier", metavar="[low|medium|high|ultra|best|none]", callback=_choice("--disk-tier", DISK_TIERS),
        help="OS disk tier (none: the default, whatever the YAML says).", rich_help_panel=_RES)))
    network_tier: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--network-tier", metavar="[standard|best]", callback=_choice("--network-tier", NETWORK_TIERS),
        help="Network tier (best: EFA where the instance has it).", rich_help_panel=_RES)))
    image_id: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--image-id", help="Image (AMI) id, or none.", rich_help_panel=_RES)))
    local_disk: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--local-disk", help="Instance storage: nvme:SIZE, ssd:SIZE or SIZE (GB; SIZE+ for at least), or "
                                   "nvme / ssd.", rich_help_panel=_RES)))
    ports: Optional[list[str]] = field(default=None, metadata=_opt(typer.Option(
        None, "--ports", callback=_ports, help="Ports to open: 8080, 8000-8010 or 8080,9090 (repeatable).",
        rich_help_panel=_RES)))

    def infra_of(self) -> Optional[str]:
        """--infra, or --cloud/--region/--zone (SkyPilot's deprecated spelling) as one infra."""
        legacy = (self.cloud, self.region, self.zone)
        if not any(legacy):
            return self.infra
        if self.infra:
            raise typer.BadParameter("give --infra or --cloud/--region/--zone, not both "
                                     "(--cloud/--region/--zone are the deprecated spelling of --infra)",
                                     param_hint="--infra")
        parts = [p or "*" for p in legacy]
        while len(parts) > 1 and parts[-1] == "*":
            parts.pop()
        return "/".join(parts)


@dataclass(frozen=True)
class TaskFlags:
    """`sky launch`'s task overrides other than the name (jobs launch names the job with -n)."""

    env: list[str] = field(default_factory=list, metadata=_opt(typer.Option(
        [], "-e", "--env", metavar="NAME[=VALUE]", help="Set an env var (repeatable; NAME alone: from your shell).",
        rich_help_panel=_TASK)))
    env_file: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--env-file", metavar="FILE", help="A dotenv file of env vars (--env wins); its values also fill the "
        "task's declared secrets (--secret-file and --secret win).", rich_help_panel=_TASK)))
    secret: list[str] = field(default_factory=list, metadata=_opt(typer.Option(
        [], "--secret", metavar="NAME[=VALUE]", help="Set a secret (never stored in the log).",
        rich_help_panel=_TASK)))
    secret_file: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--secret-file", metavar="FILE", help="A dotenv file of secrets (--secret wins).",
        rich_help_panel=_TASK)))
    workdir: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--workdir", help="Directory synced to ~/sky_workdir.", rich_help_panel=_TASK)))
    git_url: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--git-url", help="A git repository cloned as the workdir.", rich_help_panel=_TASK)))
    git_ref: Optional[str] = field(default=None, metadata=_opt(typer.Option(
        None, "--git-ref", help="Branch, tag or commit of the git workdir.", rich_help_panel=_TASK)))


def with_flags(**sets: type) -> Callable[[F], F]:
    """Add the options of each flag-set dataclass to a typer command. The command declares a
    parameter per set (`res: ResourceFlags`); typer sees the set's options instead, and the
    command receives the dataclass built from them."""

    def deco(func: F) -> F:
        sig = inspect.signature(func, eval_str=True)
        own = [p for name, p in sig.parameters.items() if name not in sets]
        owner: dict[str, str] = {}
        added = []
        for keyword, cls in sets.items():
            hints = typing.get_type_hints(cls)
            for f in dataclasses.fields(cls):
                if f.name in owner or f.name in sig.parameters:
                    raise TypeError(f"{func.__name__}: option {f.name} is declared twice")
                owner[f.name] = keyword
                added.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                                               default=f.metadata["option"], annotation=hints[f.name]))

        @functools.wraps(func)
        def wrapper(**kwargs: Any) -> Any:
            grouped: dict[str, dict[str, Any]] = {keyword: {} for keyword in sets}
            for name, keyword in owner.items():
                grouped[keyword][name] = kwargs.pop(name)
            for keyword, cls in sets.items():
                kwargs[keyword] = cls(**grouped[keyword])
            return func(**kwargs)

        params = own + added
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return typing.cast(F, wrapper)

    return deco


def read_var_files(task: TaskFlags) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(envs, secrets, env-file values offered to declared secrets), merged as `sky launch` does:
    --env over --env-file, --secret over --secret-file."""
    from skypurza.events.taskspec import TaskSpecError
    from skypurza.events.taskspec.overrides import parse_var_flags

    from .context import fail
    from .dotenv import DotenvError, read_dotenv

    try:
        env_file = read_dotenv(task.env_file, "--env-file") if task.env_file else {}
        secret_file = read_dotenv(task.secret_file, "--secret-file") if task.secret_file else {}
    except DotenvError as exc:
        raise fail(str(exc), 2)
    try:
        envs = {**env_file, **parse_var_flags(task.env, os.environ, "--env")}
        secrets = {**secret_file, **parse_var_flags(task.secret, os.environ, "--secret")}
    except TaskSpecError as exc:
        raise fail("; ".join(f"{p.path}: {p.message}" for p in exc.problems), 2)
    return envs, secrets, env_file


def overrides_of(res: ResourceFlags, task: TaskFlags, *, name: str | None = None,
                 priority: str | None = None) -> Any:
    """The CliOverrides of a command's flags, each value checked at the edge (exit 2 naming the
    flag); the task model checks the rest once they are merged into the task."""
    from skypurza.events.taskspec import CliOverrides

    envs, secrets, env_file = read_var_files(task)
    bounds.check_var_flags(envs, secrets)
    if priority is not None:
        check_priority(priority)
    return CliOverrides(infra=res.infra_of(), gpus=res.gpus, cpus=res.cpus, memory=res.memory,
                        instance_type=res.instance_type, use_spot=res.use_spot, num_nodes=res.num_nodes,
                        disk_size=res.disk_size, image_id=res.image_id, envs=envs, secrets=secrets, name=name,
                        workdir=task.workdir, disk_tier=res.disk_tier, network_tier=res.network_tier,
                        local_disk=res.local_disk, ports=tuple(res.ports) if res.ports is not None else None,
                        priority=priority, git_url=task.git_url, git_ref=task.git_ref, env_file_secrets=env_file)


def check_priority(value: str) -> None:
    """--priority: an integer from -1000 to 1000, a priority class name, or none."""
    import re

    text = value.strip()
    if re.fullmatch(r"[+-]?\d{1,12}", text):
        if not -1000 <= int(text) <= 1000:
            raise typer.BadParameter(f"must be from -1000 to 1000, found {text}", param_hint="--priority")
    elif not re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", text):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise typer.BadParameter(f"expected an integer from -1000 to 1000, a priority class name or none, "
                                 f"found {shown!r}", param_hint="--priority")


# --------------------------------------------------------------------------- shared single options

def async_option(help: str = "Return as soon as the request is in the event log.") -> Any:
    return typer.Option(False, "--async/--no-async", show_default=False, help=help)


def yes_option() -> Any:
    return typer.Option(False, "-y", "--yes", help="Do not ask for confirmation.")


def all_users_option() -> Any:
    return typer.Option(False, "-u", "--all-users", help="Every user's, for reading, through an API server (acting on "
                                                         "another's is for admins); the embedded bus shows every "
                                                         "user's already.")


def workspace_option() -> Any:
    return typer.Option(None, "-w", "--workspace",
                        help="The workspace (a team: spz teams list) to run in; its allowed infras confine the "
                             "placement. Through an API server: your own team (an admin: any).")


def wait_for_option() -> Any:
    return typer.Option(None, "--wait-for", metavar="[jobs_and_ssh|jobs|none]",
                        callback=_choice("--wait-for", WAIT_FOR),
                        help="What resets the idle timer: jobs_and_ssh (default), jobs, or none (stop -i minutes "
                             "after it is set, whatever runs).")


def graceful_option() -> Any:
    return typer.Option(False, "--graceful", help="Cancel the running jobs first and wait for them to end.")


def graceful_timeout_option() -> Any:
    return typer.Option(None, "--graceful-timeout", parser=bounds.BoundedInt(1, 86_400, "a day"),
                        help="Seconds --graceful waits for the jobs to end (default: until they have).")


def priority_option() -> Any:
    return typer.Option(None, "--priority", help="Priority: an integer from -1000 to 1000, a priority class "
                                                 "name, or none.", rich_help_panel=_TASK)


# ----------------------------------------------------------------------------- flags that change nothing

def unused(flag: str, why: str) -> None:
    """One line on stderr: the sky flag was accepted and why it changes nothing here."""
    typer.echo(f"note: {flag} changes nothing in spz: {why}", err=True)


def all_users_note(all_users: bool) -> None:
    if all_users:
        unused("-u/--all-users", "every user's clusters and jobs of the stage are shown and acted on already "
                                 "(per-user views come with teams)")


def workspace_of(workspace: Optional[str]) -> Optional[str]:
    """`-w NAME` checked as a team name (a workspace is a team), exit 2 when it is not one."""
    if workspace is None:
        return None
    from skypurza.events.naming import check_principal_name

    try:
        return check_principal_name(workspace, "workspace (team) name")
    except ValueError as exc:
        raise typer.BadParameter(str(exc).removeprefix("invalid "), param_hint="-w/--workspace") from None


def with_workspace(cfg: Any, workspace: Optional[str]) -> Any:
    """The config with `-w` as the submission's team (events/config.py `Config.team_of`)."""
    import dataclasses

    return dataclasses.replace(cfg, workspace=workspace) if workspace else cfg


def workspace_note(workspace: Optional[str]) -> None:
    """For a command a workspace does not change (`spz check`): said in one line."""
    if workspace_of(workspace) is not None:
        unused("-w/--workspace", "this command reads the broker's infras; a workspace (a team, spz teams list) "
                                 "confines where its tasks are placed")


def quiet_flag_types() -> None:
    """`--help` shows no `<bool>` for a flag (it takes no value); other options keep their type."""
    from typer.core import TyperOption

    original = getattr(TyperOption, "display_type_rich", None)
    if original is None or getattr(original, "_spz_quiet", False):
        return  # a typer without the hook (then tests/test_cli_flags.py says so), or done already

    def display_type_rich(self: Any, ctx: Any) -> Optional[str]:
        if self.is_flag and self.metavar is None:
            return None
        return original(self, ctx)

    display_type_rich._spz_quiet = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


# ------------------------------------------------------------------------------------ time windows

_WINDOW_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
MAX_WINDOW_S = 100 * 366 * 86_400  # a century


def parse_window(value: str, flag: str = "--since") -> float:
    """`30m`, `48h`, `7d`, `2w` or a bare number of seconds (as `sky jobs queue --since`) -> seconds."""
    import re

    m = re.fullmatch(r"\s*(\d{1,12})\s*([smhdw]?)\s*", value or "")
    if not m:
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise typer.BadParameter(f"expected a number with s, m, h, d or w (30m, 48h, 7d, 2w; bare: seconds), "
                                 f"found {shown!r}", param_hint=flag)
    seconds = int(m[1]) * _WINDOW_UNITS[m[2] or "s"]
    if seconds > MAX_WINDOW_S:
        raise typer.BadParameter(f"at most a century, found {value.strip()}", param_hint=flag)
    return float(seconds)


def parse_local_time(value: str, flag: str) -> Any:
    """`2026-01-13` or `2026-01-13 15:30:00` in this machine's local time (as sky) -> an aware datetime."""
    from datetime import datetime

    try:
        t = datetime.fromisoformat(value.strip())
    except ValueError:
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise typer.BadParameter(f"expected a date (2026-01-13) or a local time (2026-01-13 15:30:00), found "
                                 f"{shown!r}", param_hint=flag) from None
    return t if t.tzinfo else t.astimezone()


# --------------------------------------------------------------------------------------- --config

def strip_sky_config(argv: list[str]) -> tuple[list[str], list[str]]:
    """sky's `--config PATH|KEY=VALUE` (on every command) taken out of the command line: spz reads
    its settings from the environment and ~/.skypurza/config.yaml. Returns (the rest, the values
    taken). Nothing after `--` is touched (it belongs to the task)."""
    rest: list[str] = []
    taken: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            rest += argv[i:]
            break
        if word == "--config" and i + 1 < len(argv):
            taken.append(argv[i + 1])
            i += 2
            continue
        if word.startswith("--config="):
            taken.append(word.partition("=")[2])
            i += 1
            continue
        rest.append(word)
        i += 1
    return rest, taken
