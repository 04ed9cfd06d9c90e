"""The optimizer's setup: everything its pure deciders need, read once and passed in as values.

This is where the optimizer does I/O before it decides: the catalog file, the settings
(environment and config.yaml), which AWS credential files exist, this machine's CPUs and GPUs.
`decide.py` and `placement.py` read none of these; they get a `decide.World`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from skypurza.events.awsconfig import aws_config_files, aws_configured
from skypurza.events.k8s_config import KubernetesSettings, read_all_capacity

from . import placement
from .catalog import Catalog, load_catalog
from .settings import OptimizerSettings

if TYPE_CHECKING:  # imported where used: a dry run with no Slurm or Kubernetes pays for neither (issue 21)
    from skypurza.events.k8s_capacity import ContextCapacity
    from skypurza.events.slurm_discovery import SlurmCluster

    from . import decide


def aws_is_configured(env: Mapping[str, str] | None = None, home: Path | None = None) -> bool:
    """The "AWS is configured" rule (events/awsconfig.py) applied to this process: env and disk."""
    env = os.environ if env is None else env
    files = [p for p in aws_config_files(env, home or Path.home()) if p.is_file()]
    return aws_configured(env, files)


def enabled_infras_here(settings: OptimizerSettings, env: Mapping[str, str] | None = None) -> frozenset[str]:
    """Which infras placement may use in this process (`placement.enabled_infras` on what is here)."""
    forced = settings.enabled_infras or None
    kube = False if forced else KubernetesSettings.load(env).configured()
    return placement.enabled_infras(forced, False if forced else aws_is_configured(env), settings.allowed_infras,
                                 kubernetes_configured=kube,
                                 slurm_configured=False if forced else slurm_configured(env))


def slurm_configured(env: Mapping[str, str] | None = None) -> bool:
    """~/.slurm/config names at least one cluster (SkyPilot enables Slurm the same way)."""
    from skypurza.events.slurmpath import slurm_config_path

    path = slurm_config_path(env)
    if not path.exists():  # most machines: no parser imported for a cold dry run (issue 21)
        return False
    from skypurza.events.slurm_config import SlurmConfigError, read_targets

    try:
        return bool(read_targets(path))
    except (SlurmConfigError, OSError, UnicodeDecodeError):
        return False


SLURM_DISCOVERY_TIMEOUT_S = 20.0


def slurm_clusters(enabled: frozenset[str], env: Mapping[str, str] | None = None,
                   timeout_s: float = SLURM_DISCOVERY_TIMEOUT_S) -> tuple[SlurmCluster, ...]:
    """Blocking, bounded: each allowed cluster's partitions over SSH (`scontrol show partition|node
    -o` on its login node, all clusters at once), or why not; read when the optimizer starts."""
    if "slurm" not in enabled:
        return ()
    from concurrent.futures import ThreadPoolExecutor

    from skypurza.events.config import ConfigError, load_config
    from skypurza.events.slurm_config import SlurmConfigError, parse_user_config, read_targets
    from skypurza.events.slurmpath import slurm_config_path
    from skypurza.events.slurm_discovery import SlurmCluster

    path = slurm_config_path(env)
    try:
        user = parse_user_config(load_config().get("slurm"))
        names = user.allowed(list(read_targets(path)))
    except (SlurmConfigError, ConfigError, OSError, UnicodeDecodeError) as exc:
        return (SlurmCluster("*", error=str(exc)),)

    def one(name: str) -> SlurmCluster:
        import subprocess

        from skypurza.events.slurm_discovery import parse_nodes, parse_partitions, zone_offers

        config = user.cluster(name)
        argv = ["ssh", "-F", str(path), "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(timeout_s)}",
                "-o", "LogLevel=ERROR", name, "scontrol show partition -o && echo '#nodes' && scontrol show node -o"]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            return SlurmCluster(name, error=f"ssh {name}: {exc}", config=config)
        if res.returncode != 0:
            why = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1][:300]
            return SlurmCluster(name, error=f"ssh {name}: {why}", config=config)
        parts, _, nodes = res.stdout.partition("#nodes")
        try:
            offers = zone_offers(name, parse_partitions(parts), parse_nodes(nodes))
        except ValueError as exc:
            return SlurmCluster(name, error=f"{name}: scontrol output not understood: {exc}", config=config)
        return SlurmCluster(name, tuple(offers), config=config)

    if not names:
        return ()
    with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
        return tuple(pool.map(one, names))


def kubernetes_contexts(enabled: frozenset[str]) -> tuple[ContextCapacity, ...]:
    """Blocking: each enabled context's free capacity (an unreachable one says why), when
    Kubernetes is enabled; read again by the service before placing (a TTL, service.py)."""
    if not enabled & {"kubernetes", "k8s"}:
        return ()
    return read_all_capacity(KubernetesSettings.load())


def load_world(settings: OptimizerSettings, catalog: Catalog | None = None,
               enabled: frozenset[str] | None = None) -> decide.World:
    """Blocking (run it in a thread from async code): the World the optimizer places in."""
    from . import decide  # the event models: the service needs them, `--dryrun` does not

    catalog = catalog or load_catalog()
    enabled = enabled or enabled_infras_here(settings)
    local = None
    if "local" in enabled:
        from .local import detect_local_resources

        local = detect_local_resources(catalog.accelerators())
    return decide.World(catalog, enabled, local, settings.max_placement_attempts, kubernetes_contexts(enabled),
                        slurm_clusters(enabled))
