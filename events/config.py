"""User configuration: `~/.skypurza/config.yaml` (SKYPURZA_HOME moves `~/.skypurza`).

Keys (all optional):
    nats_url: nats://host:4222     # use an existing NATS instead of the embedded control plane
    stage: dev                     # default namespace (SKYPURZA_STAGE and --stage override)
    allowed_infras: [aws, local]   # infras tasks may be placed on
    user: alice                    # who submissions are attributed to (default: the OS user)
    team: ml-research              # default team for showback
    project: llm                   # default project
    teams: {alice: ml-research}    # user -> team
    billing: {weights: {default: "CPU=1.0,Mem=0.25G,GRES/gpu=2.0"}, flags: ""}
    metering_tick_s: 60

Environment variables win over the file: SKYPURZA_NATS_URL, SKYPURZA_STAGE, SKYPURZA_USER.

The file is read by the task spec's bounded YAML loader (events/taskspec/yamlsrc.py: PyYAML's
safe loader with node, alias and depth bounds, duplicate keys refused) and at most
`limits.MAX_YAML_FILE_BYTES`; anything wrong with it is a ConfigError naming the file, line
and column (`~/.skypurza/config.yaml:3:7: not valid YAML: ...`), never a traceback.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import naming
from .limits import MAX_YAML_FILE_BYTES


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Config:
    path: Path
    data: dict[str, Any] = field(default_factory=dict)
    # `-w/--workspace` of this command: the team (a workspace) a submission is made in, before
    # any label or config (cli/options.py `with_workspace`).
    workspace: str | None = None

    @property
    def nats_url(self) -> str | None:
        return os.environ.get("SKYPURZA_NATS_URL") or self.data.get("nats_url") or None

    @property
    def stage(self) -> str:
        return os.environ.get("SKYPURZA_STAGE") or self.data.get("stage") or naming.DEFAULT_STAGE

    @property
    def allowed_infras(self) -> list[str] | None:
        v = self.data.get("allowed_infras")
        return [str(x).lower() for x in v] if v else None

    @property
    def user(self) -> str:
        if os.environ.get("SKYPURZA_USER"):
            return os.environ["SKYPURZA_USER"]
        if self.data.get("user"):
            return str(self.data["user"])
        try:
            return getpass.getuser()
        except Exception:
            return "unknown"

    def team_of(self, user: str, labels: dict[str, str] | None = None) -> str | None:
        if self.workspace:
            return self.workspace
        if labels and labels.get("team"):
            return labels["team"]
        teams = self.data.get("teams") or {}
        return teams.get(user) or self.data.get("team")

    def project_of(self, labels: dict[str, str] | None = None) -> str | None:
        if labels and labels.get("project"):
            return labels["project"]
        return self.data.get("project")

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


def config_path() -> Path:
    return naming.home_dir() / "config.yaml"


def load_config(path: Path | None = None) -> Config:
    path = path or config_path()
    if not path.exists():
        return Config(path, {})
    return Config(path, parse_config(_read(path), str(path)))


def parse_config(text: str, where: str = "config.yaml") -> dict[str, Any]:
    """The config file's mapping (empty for an empty file); a ConfigError at `where:line:col`."""
    from .taskspec.yamlsrc import parse_documents  # PyYAML only when there is a file to read

    docs, issues = parse_documents(text)
    if issues:
        first = issues[0]
        at = f":{first.line}:{first.column}" if first.line is not None and first.column is not None else ""
        message = first.message.removeprefix("YAML syntax error: ")
        raise ConfigError(f"{where}{at}: not valid YAML: {message}")
    docs = [d for d in docs if d.data is not None]
    if len(docs) > 1:
        raise ConfigError(f"{where}: expected one YAML document, found {len(docs)}")
    data = docs[0].data if docs else {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of keys, found {type(data).__name__}")
    return data


def key_position(path: str | Path, dotted: str) -> tuple[int, int] | None:
    """1-based (line, column) of the value of `dotted` (`kubernetes.placement`) in the config
    file at `path`; None when the file or the key cannot be found (a message then names the key only)."""
    from .taskspec.yamlsrc import locate, parse_documents

    try:
        docs, issues = parse_documents(_read(Path(path)))
    except ConfigError:
        return None
    if issues or len(docs) != 1:
        return None
    line, column = locate(docs[0].node, dotted.split("."))
    return (line, column) if line is not None and column is not None else None


def _read(path: Path) -> str:
    """The file's text, bounded; a file that cannot be read is a ConfigError with its path."""
    try:
        if not path.is_file():
            raise ConfigError(f"{path}: not a regular file")
        size = path.stat().st_size
        if size > MAX_YAML_FILE_BYTES:
            raise ConfigError(f"{path}: the file is {size:,} bytes; at most {MAX_YAML_FILE_BYTES:,}")
        with path.open("rb") as f:
            data = f.read(MAX_YAML_FILE_BYTES + 1)
        if len(data) > MAX_YAML_FILE_BYTES:
            raise ConfigError(f"{path}: the file has more than {MAX_YAML_FILE_BYTES:,} bytes")
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc.reason}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
