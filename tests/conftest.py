"""Shared fixtures: a real nats-server per test (ephemeral port), fake AWS, temp state dirs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "support"))

pytest_plugins = ["nats_fixtures", "aws_fixtures"]
