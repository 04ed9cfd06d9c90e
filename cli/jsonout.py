"""A command's JSON document on stdout (`-o json`): one module that imports no typer, for the
commands cli/fastpath.py runs without it; cli/context.py re-exports it for every other command."""

from __future__ import annotations

import json
import sys
from typing import Any


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str, sort_keys=False) + "\n")
