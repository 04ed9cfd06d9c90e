"""Every service `spz api serve` knows, from the code, for the tests that check a deployment runs
each one (tests/test_compose_secured.py for compose.yaml, tests/test_infra.py for the CDK app)."""

from __future__ import annotations

import tomllib
from importlib.metadata import entry_points
from pathlib import Path

from skypurza.cli.serve import OPEN_SERVICES

ROOT = Path(__file__).resolve().parents[2]


def every_service() -> set[str]:
    """cli/serve.py's open services and the `skypurza.services` entry points, both as installed
    and as pyproject.toml declares them (one added but not yet installed counts too). Read from
    the metadata, not `cli.serve.SERVICES`: SKYPURZA_NO_PLUGINS must not shorten the list."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["skypurza.services"]
    installed = {ep.name for ep in entry_points(group="skypurza.services")}
    assert installed and declared, "the platform services' entry points are missing: pip install -e ."
    return set(OPEN_SERVICES) | installed | set(declared)
