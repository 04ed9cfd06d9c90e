"""From the command line to a task ready for the log: load, override, localise paths.

Pure helpers (no bus) shared by `spz launch` and `spz exec`:
- `load_task` reads a YAML file or takes the words of a command, with `sky launch`'s overrides;
- `localise` makes the workdir and file-mount sources absolute (relative to the directory the
  command runs in, as SkyPilot resolves them) and checks that they exist, because the nodes read
  them later from elsewhere;
- `setup_changed` says whether a relaunch must run setup again.
"""

from __future__ import annotations

import os
import secrets as _secrets
from pathlib import Path
from typing import Any

from skypurza.events import naming


class SubmitError(Exception):
    """Bad input from the user: printed as is, exit 1 (2: only command-line flags are at fault)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _from_spec_error(exc: Any) -> SubmitError:
    from skypurza.events.taskspec.overrides import COMMAND_LINE

    usage = all(p.file == COMMAND_LINE for p in exc.problems)
    return SubmitError(str(exc), code=2 if usage else 1)


def load_task(entrypoint: list[str], overrides: Any) -> Any:
    """The one task an entrypoint names (a YAML file, or a command), with the overrides applied."""
    from skypurza.events.taskspec import TaskSpecError, apply_overrides, is_yaml_entrypoint, load_tasks
    from skypurza.events.taskspec.overrides import task_from_command

    words = [w for w in entrypoint if w.strip()]
    if not words:
        raise SubmitError("give a task YAML file or a command to run (e.g. spz launch task.yaml, "
                          "spz launch 'echo hello')")
    text = " ".join(words)
    try:
        if len(words) == 1 and is_yaml_entrypoint(text):
            loaded = load_tasks(text, env_overrides=dict(overrides.envs), secret_overrides=dict(overrides.secrets))
            if loaded.at_launch:
                raise TaskSpecError(loaded.at_launch)
            if len(loaded.tasks) != 1:
                raise SubmitError(f"{text} holds {len(loaded.tasks)} tasks (a pipeline or job group); "
                                  "a cluster runs one task at a time: use spz jobs launch")
            return apply_overrides(loaded.tasks[0], overrides)
        return task_from_command(text, overrides)
    except TaskSpecError as exc:
        raise _from_spec_error(exc) from None


def _local_source(value: Any) -> bool:
    return isinstance(value, str) and "://" not in value


def localise(task: Any, public: dict[str, Any], cwd: Path) -> dict[str, Any]:
    """`public` with local paths made absolute; SubmitError when one does not exist."""
    out = dict(public)
    secret_values = [v for v in task.secret_values().values() if v]
    problems: list[str] = []

    def resolve(value: str, what: str, must_be_dir: bool = False) -> str:
        path = Path(os.path.expanduser(value))
        path = path if path.is_absolute() else (cwd / path)
        path = Path(os.path.normpath(path))
        if not path.exists():
            problems.append(f"{what}: {value} does not exist" + (f" (looked for {path})" if str(path) != value else ""))
        elif must_be_dir and not path.is_dir():
            problems.append(f"{what}: {value} is not a directory")
        return str(path)

    def keep_template(resolved: str) -> bool:
        return any(v in resolved for v in secret_values)

    if isinstance(task.workdir, str):
        resolved = resolve(task.workdir, "workdir", must_be_dir=True)
        if not keep_template(resolved):
            out["workdir"] = resolved
    mounts = dict(out.get("file_mounts") or {})
    for dst, src in (task.file_mounts or {}).items():
        if _local_source(src):
            resolved = resolve(src, f"file_mounts.{dst}")
            if not keep_template(resolved):
                mounts[dst] = resolved
        elif hasattr(src, "source") and _local_source(getattr(src, "source", None)):
            resolved = resolve(src.source, f"file_mounts.{dst}.source")
            entry = dict(mounts.get(dst) or {})
            if not keep_template(resolved):
                entry["source"] = resolved
                mounts[dst] = entry
    if mounts:
        out["file_mounts"] = mounts
    if problems:
        raise SubmitError("; ".join(problems))
    return out


def setup_changed(new_setup: str | None, last_setup: str | None) -> bool:
    """A relaunch runs setup again only when the setup script differs from the cluster's last job's
    (the one rule, events/queueplan.py)."""
    from skypurza.events.queueplan import setup_changed as changed

    return changed(new_setup, last_setup)


def cluster_name(given: str | None, user: str) -> str:
    """The -c name, checked; or a generated one like SkyPilot's `sky-<hex>-<user>`."""
    if given:
        if not naming.valid_cluster_name(given):
            raise SubmitError(f"invalid cluster name {given!r}: {naming.CLUSTER_NAME_RULE}")
        return given
    return naming.generated_cluster_name(user, _secrets.token_hex(2))
