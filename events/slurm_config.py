"""Where the Slurm clusters are and how they are priced: pure parsing, and the one read of
~/.slurm/config (`read_targets`).

- `~/.slurm/config` is an SSH-config-style file, read as SkyPilot reads it (paramiko's
  SSHConfig): `Host` blocks (several patterns, `*`/`?` globs, `!` negation), keywords case
  insensitive, `Key Value` or `Key=Value`, the first value obtained for a keyword wins, `~` in
  IdentityFile expanded by the caller. Each Host without a glob is one cluster.
- `slurm:` in ~/.skypurza/config.yaml (as in SkyPilot's config): `allowed_clusters`, `pricing`
  (`cpu` per CPU-hour, `memory` per GiB-hour, `accelerators: {V100: 2.5}` per GPU-hour), and
  `cluster_configs: {<cluster>: {pricing, sbatch_options, gres, gpu_directive, submit_as_user,
  partitions: {<partition>: {pricing, sbatch_options}}}}`; `sbatch_options`, `gres` and
  `gpu_directive` may also stand at the top. A value we cannot use is a SlurmConfigError
  naming its dotted key.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

MAX_CONFIG_LINES = 10_000
MAX_PRICE_PER_HOUR = 1_000_000.0  # dollars per unit-hour: anything above is a typo
GPU_DIRECTIVES = ("gres", "gpus-per-node")
# How submit_as_user acts (docs/slurm.md, *Identity*): `uid`, sbatch/srun --uid from a login
# identity Slurm lets do so (root or SlurmUser); `ssh_keys`, log in as the user with their key.
SUBMIT_MODES = ("uid", "ssh_keys")
_UNIX_NAME_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
DEFAULT_PORT = 22


class SlurmConfigError(ValueError):
    pass


@dataclass(frozen=True)
class SshTarget:
    """How to reach one cluster's login node."""

    cluster: str
    hostname: str
    port: int = DEFAULT_PORT
    user: str | None = None
    identity_files: tuple[str, ...] = ()
    proxy_command: str | None = None
    proxy_jump: str | None = None
    strict_host_key_checking: bool = True  # `StrictHostKeyChecking no` turns it off
    known_hosts_files: tuple[str, ...] = ()  # UserKnownHostsFile; () means ~/.ssh/known_hosts


@dataclass(frozen=True)
class _Block:
    patterns: tuple[str, ...]
    options: tuple[tuple[str, str], ...]  # (lower-case keyword, value), in file order
    line: int


_LINE = re.compile(r"^\s*([A-Za-z]+)\s*(?:=|\s)\s*(.*?)\s*$")


def _split(line: str) -> tuple[str, str] | None:
    """(keyword, value) of one line; None for a blank line or a comment (ssh_config(5) syntax)."""
    if not line.strip() or line.lstrip().startswith("#"):
        return None
    m = _LINE.match(line)
    if m is None:
        return line.strip().lower(), ""
    value = m.group(2)
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return m.group(1).lower(), value


def parse_ssh_config(text: str, where: str = "~/.slurm/config") -> list[_Block]:
    lines = text.splitlines()
    if len(lines) > MAX_CONFIG_LINES:
        raise SlurmConfigError(f"{where}: {len(lines):,} lines; at most {MAX_CONFIG_LINES:,}")
    blocks: list[_Block] = [_Block(("*",), (), 0)]  # options before any Host apply to every host
    for n, raw in enumerate(lines, 1):
        parsed = _split(raw)
        if parsed is None:
            continue
        key, value = parsed
        if key == "host":
            try:
                patterns = tuple(shlex.split(value))
            except ValueError as exc:
                raise SlurmConfigError(f"{where}:{n}: Host {value!r}: {exc}") from None
            if not patterns:
                raise SlurmConfigError(f"{where}:{n}: Host needs at least one name")
            blocks.append(_Block(patterns, (), n))
        elif key == "match":
            blocks.append(_Block(("!*",), (), n))  # Match criteria are not evaluated: the block never applies
        else:
            if not value:
                raise SlurmConfigError(f"{where}:{n}: {key} has no value")
            last = blocks[-1]
            blocks[-1] = _Block(last.patterns, (*last.options, (key, value)), last.line)
    return blocks


def _matches(patterns: tuple[str, ...], host: str) -> bool:
    hit = False
    for p in patterns:
        if p.startswith("!"):
            if fnmatch.fnmatchcase(host, p[1:]):
                return False
        elif fnmatch.fnmatchcase(host, p):
            hit = True
    return hit


def cluster_names(blocks: list[_Block]) -> list[str]:
    """Every Host name without a glob or negation, in file order: the clusters."""
    out: list[str] = []
    for b in blocks[1:]:
        for p in b.patterns:
            if not any(c in p for c in "*?!") and p not in out:
                out.append(p)
    return out


def lookup(blocks: list[_Block], cluster: str, where: str = "~/.slurm/config") -> SshTarget:
    """The login node of `cluster`, the first value of each keyword winning (ssh_config(5))."""
    got: dict[str, str] = {}
    identities: list[str] = []
    for b in blocks:
        if not _matches(b.patterns, cluster):
            continue
        for key, value in b.options:
            if key == "identityfile":
                identities.append(value)  # IdentityFile accumulates, like ssh
            else:
                got.setdefault(key, value)
    port_text = got.get("port", str(DEFAULT_PORT))
    try:
        port = int(port_text)
    except ValueError:
        raise SlurmConfigError(f"{where}: Host {cluster}: Port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise SlurmConfigError(f"{where}: Host {cluster}: Port {port} is outside 1-65535")
    return SshTarget(cluster=cluster, hostname=got.get("hostname", cluster), port=port, user=got.get("user"),
                     identity_files=tuple(identities), proxy_command=got.get("proxycommand"),
                     proxy_jump=got.get("proxyjump"),
                     strict_host_key_checking=got.get("stricthostkeychecking", "yes").lower() not in ("no", "off"),
                     known_hosts_files=tuple(got["userknownhostsfile"].split()) if "userknownhostsfile" in got
                     else ())


# ---------------------------------------------------------------------------------- slurm: config


@dataclass(frozen=True)
class Pricing:
    """Dollars per hour: per CPU, per GiB of memory, per accelerator by name. Unset: $0.00, as sky."""

    cpu: float = 0.0
    memory: float = 0.0
    accelerators: Mapping[str, float] = field(default_factory=dict)

    def hourly_micros(self, cpus: float, memory_gib: float, accelerator: str | None, count: float) -> int:
        price = self.cpu * cpus + self.memory * memory_gib
        if accelerator:
            price += self.accelerators.get(accelerator, self.accelerators.get(accelerator.upper(), 0.0)) * count
        return round(price * 1_000_000)


@dataclass(frozen=True)
class ClusterConfig:
    pricing: Pricing = Pricing()
    sbatch_options: Mapping[str, Any] = field(default_factory=dict)
    gres: Mapping[str, str] = field(default_factory=dict)  # accelerator name -> GRES type
    gpu_directive: str = "gres"
    submit_as_user: Mapping[str, str] = field(default_factory=dict)  # spz user -> Unix account
    partitions: Mapping[str, "ClusterConfig"] = field(default_factory=dict)
    submit_mode: str = "uid"  # SUBMIT_MODES
    user_keys: Mapping[str, str] = field(default_factory=dict)  # Unix account -> its IdentityFile (ssh_keys)

    def unix_user(self, spz_user: str) -> str | None:
        """The Unix account the spz user's allocations run as (None: the login identity's own)."""
        return self.submit_as_user.get(spz_user) if spz_user else None

    def for_partition(self, partition: str | None) -> "ClusterConfig":
        """The partition's settings over the cluster's (a partition's pricing replaces the cluster's)."""
        p = self.partitions.get(partition or "")
        if p is None:
            return self
        return ClusterConfig(pricing=p.pricing if p.pricing != Pricing() else self.pricing,
                             sbatch_options={**self.sbatch_options, **p.sbatch_options},
                             gres={**self.gres, **p.gres}, gpu_directive=p.gpu_directive or self.gpu_directive,
                             submit_as_user=self.submit_as_user, submit_mode=self.submit_mode,
                             user_keys=self.user_keys)


@dataclass(frozen=True)
class SlurmUserConfig:
    allowed_clusters: tuple[str, ...] | None = None  # None: every cluster of ~/.slurm/config
    defaults: ClusterConfig = ClusterConfig()
    clusters: Mapping[str, ClusterConfig] = field(default_factory=dict)

    def cluster(self, name: str) -> ClusterConfig:
        c = self.clusters.get(name)
        if c is None:
            return self.defaults
        d = self.defaults
        return ClusterConfig(pricing=c.pricing if c.pricing != Pricing() else d.pricing,
                             sbatch_options={**d.sbatch_options, **c.sbatch_options}, gres={**d.gres, **c.gres},
                             gpu_directive=c.gpu_directive, submit_as_user={**d.submit_as_user, **c.submit_as_user},
                             partitions=c.partitions, submit_mode=c.submit_mode,
                             user_keys={**d.user_keys, **c.user_keys})

    def allowed(self, clusters: list[str]) -> list[str]:
        if self.allowed_clusters is None:
            return list(clusters)
        return [c for c in clusters if c in self.allowed_clusters]


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SlurmConfigError(f"{where}: expected a mapping, found {type(value).__name__}")
    return value


def _price(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SlurmConfigError(f"{where}: expected a price in dollars per hour, found {value!r}")
    if not 0 <= float(value) <= MAX_PRICE_PER_HOUR:
        raise SlurmConfigError(f"{where}: {value} is outside 0-{MAX_PRICE_PER_HOUR:g} dollars per hour")
    return float(value)


def _pricing(value: Any, where: str) -> Pricing:
    m = _mapping(value, where)
    unknown = set(m) - {"cpu", "memory", "accelerators"}
    if unknown:
        raise SlurmConfigError(f"{where}.{sorted(unknown)[0]}: unknown key (cpu, memory, accelerators)")
    accs = _mapping(m.get("accelerators"), f"{where}.accelerators")
    return Pricing(cpu=_price(m.get("cpu", 0), f"{where}.cpu"), memory=_price(m.get("memory", 0), f"{where}.memory"),
                   accelerators={str(k): _price(v, f"{where}.accelerators.{k}") for k, v in accs.items()})


def _strings(value: Any, where: str) -> Mapping[str, str]:
    m = _mapping(value, where)
    for k, v in m.items():
        if not isinstance(v, str) or not v or any(c.isspace() for c in v):
            raise SlurmConfigError(f"{where}.{k}: expected one word, found {v!r}")
    return {str(k): v for k, v in m.items()}


def _unix_names(m: Mapping[str, str], where: str) -> Mapping[str, str]:
    # A Unix account goes onto a command line (sbatch --uid): only what useradd accepts.
    for k, v in m.items():
        if not _UNIX_NAME_RE.match(v):
            raise SlurmConfigError(f"{where}.{k}: {v!r} is not a Unix account name")
    return m


def _submit_mode(value: Any, where: str) -> str:
    if value not in SUBMIT_MODES:
        raise SlurmConfigError(f"{where}: {value!r}; expected one of {', '.join(SUBMIT_MODES)}")
    return str(value)


_CLUSTER_KEYS = {"pricing", "sbatch_options", "gres", "gpu_directive", "submit_as_user", "partitions", "submit_mode",
                 "user_keys"}
_CLUSTER_ONLY = {"partitions", "submit_as_user", "submit_mode", "user_keys"}


def _cluster(value: Any, where: str, *, partition: bool = False) -> ClusterConfig:
    m = _mapping(value, where)
    allowed = _CLUSTER_KEYS - (_CLUSTER_ONLY if partition else set())
    for k in m:
        if k not in allowed:
            raise SlurmConfigError(f"{where}.{k}: unknown key ({', '.join(sorted(allowed))})")
    directive = m.get("gpu_directive", "gres")
    if directive not in GPU_DIRECTIVES:
        raise SlurmConfigError(f"{where}.gpu_directive: {directive!r}; expected one of {', '.join(GPU_DIRECTIVES)}")
    options = _mapping(m.get("sbatch_options"), f"{where}.sbatch_options")
    parts = _mapping(m.get("partitions"), f"{where}.partitions")
    return ClusterConfig(
        pricing=_pricing(m.get("pricing"), f"{where}.pricing"), sbatch_options=dict(options),
        gres=_strings(m.get("gres"), f"{where}.gres"), gpu_directive=directive,
        submit_as_user=_unix_names(_strings(m.get("submit_as_user"), f"{where}.submit_as_user"),
                                   f"{where}.submit_as_user"),
        submit_mode=_submit_mode(m.get("submit_mode", "uid"), f"{where}.submit_mode"),
        user_keys=_strings(m.get("user_keys"), f"{where}.user_keys"),
        partitions={str(p): _cluster(v, f"{where}.partitions.{p}", partition=True) for p, v in parts.items()})


def parse_user_config(value: Any, where: str = "slurm") -> SlurmUserConfig:
    """The `slurm:` mapping of config.yaml (None or absent: the defaults)."""
    m = _mapping(value, where)
    allowed = m.get("allowed_clusters")
    if allowed is not None and (not isinstance(allowed, list) or not all(isinstance(c, str) for c in allowed)):
        raise SlurmConfigError(f"{where}.allowed_clusters: expected a list of cluster names, found {allowed!r}")
    top = {k: v for k, v in m.items() if k not in ("allowed_clusters", "cluster_configs")}
    defaults = _cluster(top, where)
    clusters = _mapping(m.get("cluster_configs"), f"{where}.cluster_configs")
    return SlurmUserConfig(
        allowed_clusters=tuple(allowed) if allowed is not None else None, defaults=defaults,
        clusters={str(c): _cluster(v, f"{where}.cluster_configs.{c}") for c, v in clusters.items()})


# ---------------------------------------------------------------------------------- reading the file

def read_targets(path: Path) -> dict[str, SshTarget]:
    """Every cluster of ~/.slurm/config (empty when there is none); a file too big or broken is
    a SlurmConfigError naming it."""
    try:
        if path.stat().st_size > MAX_CONFIG_LINES * 200:
            raise SlurmConfigError(f"{path}: more than {MAX_CONFIG_LINES * 200:,} bytes")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    blocks = parse_ssh_config(text, str(path))
    return {c: lookup(blocks, c, str(path)) for c in cluster_names(blocks)}
