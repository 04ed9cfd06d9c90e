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
A malformed file is reported with its path and line, never a traceback.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import naming


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Config:
    path: Path
    data: dict[str, Any] = field(default_factory=dict)

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
    import yaml

    path = path or config_path()
    if not path.exists():
        return Config(path, {})
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys, found {type(data).__name__}")
    return Config(path, data)
