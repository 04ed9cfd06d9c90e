"""The optimizer's setup: everything its pure deciders need, read once and passed in as values.

This is where the optimizer does I/O before it decides: the catalog file, the settings
(environment and config.yaml), which AWS credential files exist, this machine's CPUs and GPUs.
`decide.py` and `placement.py` read none of these; they get a `decide.World`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from skypurza.events.awsconfig import aws_config_files, aws_configured

from . import decide
from .catalog import Catalog, load_catalog
from .settings import OptimizerSettings


def aws_is_configured(env: Mapping[str, str] | None = None, home: Path | None = None) -> bool:
    """The "AWS is configured" rule (events/awsconfig.py) applied to this process: env and disk."""
    env = os.environ if env is None else env
    files = [p for p in aws_config_files(env, home or Path.home()) if p.is_file()]
    return aws_configured(env, files)


def enabled_infras_here(settings: OptimizerSettings, env: Mapping[str, str] | None = None) -> frozenset[str]:
    """Which infras placement may use in this process (`decide.enabled_infras` on what is here)."""
    forced = settings.enabled_infras or None
    return decide.enabled_infras(forced, False if forced else aws_is_configured(env), settings.allowed_infras)


def load_world(settings: OptimizerSettings, catalog: Catalog | None = None,
               enabled: frozenset[str] | None = None) -> decide.World:
    """Blocking (run it in a thread from async code): the World the optimizer places in."""
    catalog = catalog or load_catalog()
    enabled = enabled or enabled_infras_here(settings)
    local = None
    if "local" in enabled:
        from .local import detect_local_resources

        local = detect_local_resources(catalog.accelerators())
    return decide.World(catalog, enabled, local, settings.max_placement_attempts)
