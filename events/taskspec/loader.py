"""Load a task YAML file (one task, a pipeline, or a job group) as SkyPilot 0.14.1 does, and
report every problem at once with its file, line, column and key path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from skypurza.events.limits import MAX_NUM_JOBS, MAX_TIMEOUT_S

from .errors import Problem, TaskSpecError
from .jobgroup import delay_problems
from .messages import describe, findings
from .source import read_source
from .task import Task
from .values import JOB_GROUP_NAME_RE
from .warnings import launch_checks, task_warnings
from .yamlsrc import Document, locate, parse_documents

PIPELINE_HEADER_KEYS = frozenset({"name", "execution"})
JOB_GROUP_HEADER_KEYS = frozenset({"name", "execution", "primary_tasks", "termination_delay", "inter_connection"})
EXECUTIONS = ("serial", "parallel")


@dataclass
class TaskFile:
    """What a YAML file holds: a pipeline (serial chain, the default) or a job group (parallel)."""

    name: str | None
    tasks: list[Task]
    execution: str | None = None  # "serial", "parallel" (job group) or None (no header)
    header: dict[str, Any] = field(default_factory=dict)
    warnings: list[Problem] = field(default_factory=list)
    file: str | None = None

    @property
    def at_launch(self) -> list[Problem]:
        """The warnings a launch refuses (errors then, with their places)."""
        return [w for w in self.warnings if w.at_launch]

    @property
    def is_pipeline(self) -> bool:
        return len(self.tasks) > 1 and self.execution != "parallel"

    @property
    def is_job_group(self) -> bool:
        return self.execution == "parallel"


def load_tasks(
    path_or_text: str | os.PathLike[str],
    *,
    env_overrides: Mapping[str, str] | None = None,
    secret_overrides: Mapping[str, str] | None = None,
    filename: str | None = None,
) -> TaskFile:
    """Parse and validate a task YAML (a path ending in .yaml/.yml, or the text itself).

    `env_overrides` / `secret_overrides` are `--env` / `--secret` values: they replace or add to
    every task's envs/secrets before anything else (so they fill null envs and `$VAR`s).
    Raises TaskSpecError with every problem found.
    """
    text, shown = read_source(path_or_text, filename)
    docs, issues = parse_documents(text)
    multi = len(docs) + len(issues) > 1 or (len(docs) == 1 and docs[0].index > 0)
    problems = [Problem(shown, i.line, i.column, i.path, i.message, i.document if multi else None) for i in issues]
    docs = [d for d in docs if d.data is not None]  # empty documents are skipped
    if problems and not docs:
        raise TaskSpecError(problems)

    header: dict[str, Any] = {}
    execution: str | None = None
    task_docs: list[Document] = docs
    if docs and _is_header(docs[0].data, len(docs)):
        header_doc = docs[0]
        header = dict(header_doc.data)
        task_docs = docs[1:]
        execution, header_problems = _check_header(header, header_doc, shown, multi)
        problems += header_problems

    tasks: list[Task] = []
    warnings: list[Problem] = []
    for doc in task_docs:
        task, doc_problems, doc_warnings = load_document(
            doc.data, node=doc.node, file=shown, document=doc.index if multi else None,
            env_overrides=env_overrides, secret_overrides=secret_overrides)
        problems += doc_problems
        warnings += doc_warnings
        if task is not None:
            tasks.append(task)

    if execution == "parallel" and not problems:
        problems += _check_job_group(header, tasks, task_docs, shown, multi)
    if problems:
        raise TaskSpecError(sorted(problems, key=_position))
    if not task_docs:
        # A file with only a header (or nothing): one task, named by the header (as SkyPilot).
        only = {"name": header["name"]} if "name" in header else {}
        task, problems, warnings = load_document(only, node=docs[0].node if docs else None, file=shown,
                                                 env_overrides=env_overrides, secret_overrides=secret_overrides)
        if task is None:
            raise TaskSpecError(problems)
        tasks = [task]
    name = header.get("name") if header else (tasks[0].name if len(tasks) == 1 else None)
    return TaskFile(name=name, tasks=tasks, execution=execution, header=header, warnings=warnings, file=shown)


def _position(p: Problem) -> tuple[int, int, int]:
    return (p.document or 0, p.line or 0, p.column or 0)


def _is_header(data: Any, count: int) -> bool:
    if not isinstance(data, dict) or "name" not in data:
        return False
    keys = set(data)
    if data.get("execution") == "parallel":
        return keys <= JOB_GROUP_HEADER_KEYS
    # A lone `name: x` document is a task named x (SkyPilot makes it a header and then a task
    # of that name: the same thing).
    return keys <= PIPELINE_HEADER_KEYS and count > 1


def _check_header(header: dict[str, Any], doc: Document, file: str | None, multi: bool) -> tuple[str | None, list[Problem]]:
    problems: list[Problem] = []

    def add(path: Sequence[str | int], message: str) -> None:
        line, col = locate(doc.node, path)
        problems.append(Problem(file, line, col, ".".join(map(str, path)), message, doc.index if multi else None))

    name = header.get("name")
    if not isinstance(name, str):
        add(["name"], f"expected a string, found {describe(name)}")
    execution = header.get("execution", "serial")
    if execution not in EXECUTIONS:
        add(["execution"], f"execution must be serial (a pipeline) or parallel (a job group), found {describe(execution)}")
        return None, problems
    if execution == "parallel":
        if isinstance(name, str) and not JOB_GROUP_NAME_RE.match(name):
            add(["name"], f"invalid job group name {name!r}: use letters, digits, _ and -")
        primary = header.get("primary_tasks")
        if primary is not None and not (isinstance(primary, list) and all(isinstance(p, str) for p in primary)):
            add(["primary_tasks"], "expected a list of job names")
        delay = header.get("termination_delay")
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, (int, str, dict))):
            add(["termination_delay"], f"expected seconds, a duration or a mapping, found {describe(delay)}")
        elif isinstance(delay, int) and not isinstance(delay, bool) and not 0 <= delay <= MAX_TIMEOUT_S:
            add(["termination_delay"], f"termination_delay must be 0 to {MAX_TIMEOUT_S:,} seconds (a day), "
                                       f"found {describe(delay)}")
        elif isinstance(delay, str):
            for path, message in delay_problems(delay, []):
                add(path, message)
    return ("parallel" if execution == "parallel" else ("serial" if "execution" in header else None)), problems


def _check_job_group(header: dict[str, Any], tasks: list[Task], docs: list[Document], file: str | None,
                     multi: bool) -> list[Problem]:
    problems: list[Problem] = []
    if not tasks:
        return [Problem(file, None, None, "", "a job group needs at least one job after its header")]
    seen: dict[str, int] = {}
    for task, doc in zip(tasks, docs):
        line, col = locate(doc.node, ["name"])
        where = doc.index if multi else None
        if task.name is None:
            problems.append(Problem(file, line, col, "name", "every job of a job group needs a `name`", where))
        elif task.name in seen:
            problems.append(Problem(file, line, col, "name",
                                    f"job name {task.name!r} is used twice in the job group", where))
        else:
            seen[task.name] = doc.index
    for i, primary in enumerate(header.get("primary_tasks") or []):
        if isinstance(primary, str) and primary not in seen:
            problems.append(Problem(file, None, None, f"primary_tasks.{i}",
                                    f"primary task {primary!r} is not the name of a job in this group"))
    if isinstance(header.get("termination_delay"), dict):
        for path, message in delay_problems(header["termination_delay"], list(seen)):
            problems.append(Problem(file, None, None, ".".join(map(str, path)), message))
    if len(tasks) > MAX_NUM_JOBS:
        problems.append(Problem(file, None, None, "", f"a job group has {len(tasks):,} jobs; at most {MAX_NUM_JOBS:,}"))
    return problems


def load_document(
    data: Any,
    *,
    node: Any = None,
    file: str | None = None,
    document: int | None = None,
    env_overrides: Mapping[str, str] | None = None,
    secret_overrides: Mapping[str, str] | None = None,
) -> tuple[Task | None, list[Problem], list[Problem]]:
    """Validate one task document: (task or None, problems, warnings)."""
    data = apply_variable_overrides(data, env_overrides or {}, secret_overrides or {})
    try:
        task = Task.model_validate(data)
    except ValidationError as exc:
        problems = []
        for f in findings(exc.errors(include_url=False), Task):
            line, col = locate(node, f.loc, key=f.at_key)
            problems.append(Problem(file, line, col, ".".join(map(str, f.loc)), f.message, document))
        return None, problems, []
    warnings = []
    for loc, message in task_warnings(task):
        line, col = locate(node, loc, key=True)
        warnings.append(Problem(file, line, col, ".".join(map(str, loc)), message, document))
    for loc, message in launch_checks(task):
        line, col = locate(node, loc, key=True)
        warnings.append(Problem(file, line, col, ".".join(map(str, loc)), message, document, at_launch=True))
    return task, [], warnings


def apply_variable_overrides(data: Any, envs: Mapping[str, str], secrets: Mapping[str, str]) -> Any:
    """`--env`/`--secret` replace or add entries before validation (they fill nulls and $VARs)."""
    if not isinstance(data, dict) or not (envs or secrets):
        return data
    data = dict(data)
    for key, extra in (("envs", envs), ("secrets", secrets)):
        if not extra:
            continue
        current = data.get(key)
        if current is None:
            current = {}
        elif isinstance(current, list) and key == "secrets":
            current = {name: None for name in current if isinstance(name, str)}
        if isinstance(current, dict):
            data[key] = {**current, **dict(extra)}
    return data
