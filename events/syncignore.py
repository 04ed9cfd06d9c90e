"""Which files of a synced directory stay behind: SkyPilot's `.skyignore`, else `.gitignore`.

As SkyPilot syncs a workdir or a file-mount directory:
- a `.skyignore` at the root of the directory, when there is one, is the only ignore file: its
  patterns (gitignore syntax) are relative to that root;
- otherwise every `.gitignore` in the tree applies to its own directory and below, a deeper
  file's patterns winning over a shallower one's (git's rule; SkyPilot's rsync `dir-merge`).

`ignore_for(root)` gives `shutil.copytree` its `ignore` callable; patterns are read lazily, once
per directory. The matching itself is pathspec's gitignore implementation.

Shared (here, not in the agent) because two places sync a directory by these rules: the agent
copying a local path on its node (services/agent/mounts.py) and the CLI packing a workdir for
the object store (events/workdir_archive.py): one rule, never two copies of it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pathspec

SKYIGNORE = ".skyignore"
GITIGNORE = ".gitignore"
MAX_IGNORE_BYTES = 1024 * 1024  # an ignore file larger than this is a mistake, not a rule set


def _spec(path: Path) -> pathspec.GitIgnoreSpec | None:
    try:
        if not path.is_file() or path.stat().st_size > MAX_IGNORE_BYTES:
            return None
        return pathspec.GitIgnoreSpec.from_lines(path.read_text(errors="replace").splitlines())
    except OSError:
        return None


def ignore_for(root: Path) -> Callable[[str, list[str]], set[str]]:
    """The names under each directory of `root` that are not to be copied."""
    root = Path(root)
    sky = _spec(root / SKYIGNORE)
    per_dir: dict[Path, pathspec.GitIgnoreSpec | None] = {}

    def specs_for(directory: Path) -> list[tuple[Path, pathspec.GitIgnoreSpec]]:
        if sky is not None:
            return [(root, sky)]
        chain = []
        d = directory
        while True:
            if d not in per_dir:
                per_dir[d] = _spec(d / GITIGNORE)
            spec = per_dir[d]
            if spec is not None:
                chain.append((d, spec))
            if d == root or root not in d.parents:
                break
            d = d.parent
        return list(reversed(chain))  # shallowest first: a deeper file decides last

    def ignore(directory: str, names: list[str]) -> set[str]:
        d = Path(directory)
        chain = specs_for(d)
        if not chain:
            return set()
        out = set()
        for name in names:
            is_dir = os.path.isdir(os.path.join(directory, name)) and not os.path.islink(os.path.join(directory, name))
            verdict = None
            for base, spec in chain:
                rel = (d / name).relative_to(base).as_posix() + ("/" if is_dir else "")
                result = spec.check_file(rel)
                if result.include is not None:
                    verdict = result.include
            if verdict:
                out.add(name)
        return out

    return ignore
