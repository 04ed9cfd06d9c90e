"""Command-line overrides as `sky launch` has them, and inline-command tasks.

A resource flag (`--gpus`, `--infra`, `--cpus`, ...) replaces that key in every alternative
of the task (SkyPilot copies each candidate Resources with the override), so here it is set
on `resources` and removed from every `any_of`/`ordered` entry. "none" for --gpus,
--instance-type, --image-id, --disk-tier and --priority removes the key, as in SkyPilot.
`--git-url`/`--git-ref` make the workdir a git mapping `{url, ref}`; values of `--env-file` also
fill the secrets the task declares (below `--secret-file` and `--secret`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from .errors import Problem, TaskSpecError
from .loader import apply_variable_overrides
from .messages import findings
from .task import Task

# SkyPilot names an inline-command task "sky-cmd"; ours reads the same way.
INLINE_TASK_NAME = "spz-cmd"
COMMAND_LINE = "<command line>"

_RESETTABLE = {"gpus", "instance_type", "image_id", "disk_tier", "priority"}
# YAML key -> flag, for problems in values that came from the command line.
FLAGS = {
    "infra": "--infra", "accelerators": "--gpus", "cpus": "--cpus", "memory": "--memory",
    "instance_type": "--instance-type", "use_spot": "--use-spot", "disk_size": "--disk-size",
    "image_id": "--image-id", "num_nodes": "--num-nodes", "name": "--name", "workdir": "--workdir",
    "envs": "--env", "secrets": "--secret", "disk_tier": "--disk-tier", "network_tier": "--network-tier",
    "local_disk": "--local-disk", "ports": "--ports", "priority": "--priority", "priority_class": "--priority",
}
_LOCATION_KEYS = ("infra", "cloud", "region", "zone")


@dataclass
class CliOverrides:
    infra: str | None = None
    gpus: str | None = None
    cpus: str | None = None
    memory: str | None = None
    instance_type: str | None = None
    use_spot: bool | None = None
    num_nodes: int | None = None
    disk_size: int | None = None
    image_id: str | None = None
    envs: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict)
    name: str | None = None
    workdir: str | None = None
    disk_tier: str | None = None
    network_tier: str | None = None
    local_disk: str | None = None
    ports: tuple[str, ...] | None = None
    priority: str | None = None  # an integer -1000..1000, a priority class name, or "none"
    git_url: str | None = None
    git_ref: str | None = None
    # --env-file values, offered to the secrets the task declares (below --secret-file/--secret)
    env_file_secrets: Mapping[str, str] = field(default_factory=dict)

    def resource_overrides(self) -> dict[str, Any]:
        """YAML resource key -> value (None: remove the key)."""
        out: dict[str, Any] = {}
        for attr, key in (("infra", "infra"), ("gpus", "accelerators"), ("cpus", "cpus"), ("memory", "memory"),
                          ("instance_type", "instance_type"), ("use_spot", "use_spot"),
                          ("disk_size", "disk_size"), ("image_id", "image_id"), ("disk_tier", "disk_tier"),
                          ("network_tier", "network_tier"), ("local_disk", "local_disk"), ("priority", "priority")):
            value = getattr(self, attr)
            if value is None:
                continue
            if attr in _RESETTABLE and isinstance(value, str) and value.lower() == "none":
                out[key] = None
            elif attr == "priority":
                # SkyPilot: an integer is the priority, anything else the name of a priority class.
                text = str(value).strip()
                out["priority" if _is_int(text) else "priority_class"] = int(text) if _is_int(text) else text
            else:
                out[key] = value
        if self.ports is not None:
            out["ports"] = list(self.ports)
        return out


def _is_int(text: str) -> bool:
    return text.lstrip("+-").isdigit() and len(text) <= 12


def _same_keys(key: str) -> tuple[str, ...]:
    """The keys one override replaces: gpus/accelerators are one key; infra replaces cloud/region/zone."""
    if key == "accelerators":
        return ("accelerators", "gpus")
    if key == "infra":
        return _LOCATION_KEYS
    if key in ("priority", "priority_class"):
        return ("priority", "priority_class")
    return (key,)


def override_dict(data: dict[str, Any], overrides: CliOverrides) -> dict[str, Any]:
    """The task's YAML data with the overrides applied (pure)."""
    data = dict(data)
    res_over = overrides.resource_overrides()
    if res_over:
        resources = dict(data.get("resources") or {})
        for key, value in res_over.items():
            for same in _same_keys(key):
                resources.pop(same, None)
            if value is not None:
                resources[key] = value
            for alt_key in ("any_of", "ordered"):
                if isinstance(resources.get(alt_key), list):
                    resources[alt_key] = [
                        {k: v for k, v in entry.items() if k not in _same_keys(key)} if isinstance(entry, dict) else entry
                        for entry in resources[alt_key]
                    ]
        data["resources"] = resources
    for key in ("num_nodes", "name", "workdir"):
        value = getattr(overrides, key)
        if value is not None:
            data[key] = value
    if overrides.git_url is not None or overrides.git_ref is not None:
        data["workdir"] = _git_workdir(data.get("workdir"), overrides.git_url, overrides.git_ref)
    secrets = dict(overrides.secrets)
    if overrides.env_file_secrets:
        declared = data.get("secrets")
        names = list(declared) if isinstance(declared, (dict, list)) else []
        for name in names:
            if isinstance(name, str) and name in overrides.env_file_secrets and name not in secrets:
                secrets[name] = overrides.env_file_secrets[name]
    out: dict[str, Any] = apply_variable_overrides(data, dict(overrides.envs), secrets)
    return out


def _git_workdir(current: Any, url: str | None, ref: str | None) -> Any:
    """--git-url/--git-ref as SkyPilot reads them: the workdir becomes `{url, ref}`; --git-ref
    alone changes the ref of a workdir that is already a git mapping."""
    if url is None:
        if isinstance(current, dict):
            return {**current, "ref": ref}
        return current  # no git workdir to give a ref to: the model says what is wrong, if anything
    out: dict[str, Any] = {"url": url}
    if ref is not None:
        out["ref"] = ref
    return out


def apply_overrides(task: Task, overrides: CliOverrides) -> Task:
    """A new task with the command-line overrides applied; TaskSpecError names the flag at fault."""
    data = override_dict(task.to_yaml_dict(), overrides)
    try:
        return Task.model_validate(data)
    except ValidationError as exc:
        raise TaskSpecError(_flag_problems(exc, overrides)) from None


def _flag_problems(exc: ValidationError, overrides: CliOverrides) -> list[Problem]:
    res_keys = set(overrides.resource_overrides())
    top_keys = {k for k in ("num_nodes", "name", "workdir") if getattr(overrides, k) is not None}
    if overrides.git_url is not None or overrides.git_ref is not None:
        top_keys.add("workdir")
    var_keys = {k for k, given in (("envs", overrides.envs), ("secrets", overrides.secrets)) if given}
    problems = []
    for f in findings(exc.errors(include_url=False), Task):
        path = ".".join(map(str, f.loc))
        flag = None
        if len(f.loc) >= 2 and f.loc[0] == "resources" and f.loc[1] in res_keys:
            flag = FLAGS[str(f.loc[1])]
        elif f.loc and (f.loc[0] in top_keys or (f.loc[0] in var_keys and len(f.loc) > 1)):
            flag = FLAGS[str(f.loc[0])]
        if flag:
            problems.append(Problem(COMMAND_LINE, None, None, flag, f.message))
        else:
            problems.append(Problem(None, None, None, path, f.message))
    return problems


def task_from_command(cmd: str, overrides: CliOverrides | None = None) -> Task:
    """`spz launch 'echo hi'`: a task that runs the command, with default resources."""
    task = Task.model_validate({"name": INLINE_TASK_NAME, "run": cmd})
    return apply_overrides(task, overrides) if overrides else task


def parse_var_flags(values: list[str], environ: Mapping[str, str], flag: str = "--env") -> dict[str, str]:
    """`--env K=V` / `--env K` (value from the local environment), as `sky launch` reads them."""
    out: dict[str, str] = {}
    problems = []
    for item in values:
        key, sep, value = item.partition("=")
        if not key:
            problems.append(Problem(COMMAND_LINE, None, None, flag, f"expected NAME=VALUE or NAME, found {item!r}"))
            continue
        if not sep:
            if key not in environ:
                problems.append(Problem(COMMAND_LINE, None, None, flag,
                                        f"{key} has no value here: write {flag} {key}=VALUE, or set {key} in your shell"))
                continue
            value = environ[key]
        out[key] = value
    if problems:
        raise TaskSpecError(problems)
    return out
