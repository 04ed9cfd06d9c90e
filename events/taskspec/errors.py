"""Validation problems: what is wrong, where (file, line, column, key path), as data.

A `TaskSpecError` carries every problem found in one pass, so a user fixes a file in one go.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    file: str | None
    line: int | None  # 1-based, None when not tied to a place in a file (a --env flag, say)
    column: int | None  # 1-based
    path: str  # key path inside the task document: "resources.accelerators", "" for the whole doc
    message: str
    # Index of the YAML document in a multi-document file (0-based); None for single documents.
    document: int | None = None
    # A warning that a launch turns into an error: what SkyPilot accepts when it reads the file
    # and refuses only when it launches (a storage mount whose bucket name is left empty).
    at_launch: bool = False

    def location(self) -> str:
        where = self.file or "<task>"
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return where

    def __str__(self) -> str:
        path = f" {self.path}:" if self.path else ""
        return f"{self.location()}:{path} {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TaskSpecError(ValueError):
    """Raised for any invalid task input; never a traceback for the user to read."""

    def __init__(self, problems: list[Problem]):
        if not problems:
            raise ValueError("TaskSpecError needs at least one problem")
        self.problems = list(problems)
        super().__init__(self._render())

    def _render(self) -> str:
        head = "invalid task" if len(self.problems) == 1 else f"invalid task ({len(self.problems)} problems)"
        return head + ":\n" + "\n".join(f"  {p}" for p in self.problems)
