"""The one settings pattern of every service: environment first, then `~/.skypurza/config.yaml`,
then the default; typed, and each value checked at the edge against a bounded range.

A service's settings are a frozen dataclass with a `load(env=None, config=None)` classmethod
that reads every value through one `Sources`:

    src = Sources.load(env, config)
    concurrency = src.integer("SKYPURZA_PROVISIONER_CONCURRENCY", 8, low=1, high=1024,
                              key="provisioner.concurrency")

`key` is the value's dotted path in config.yaml (None: environment only; `var` None: config
only). A value that cannot be used is a `SettingsError` naming where it came from (the variable,
or the file and key), the value and what is accepted, e.g.

    SKYPURZA_PROVISIONER_CONCURRENCY='abc': expected a whole number from 1 to 1024

`SettingsError` is a `ConfigError`, so the CLI and the services supervisor (cli/serve.py) report
it as one line. The I/O (os.environ, the config file) is in `Sources.load` only; everything else
here is a pure function of the mappings it is given, which is how tests drive it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import ConfigError, load_config

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class SettingsError(ConfigError):
    """A setting whose value is outside what it accepts (the message says which, and why)."""


def _fmt(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class Sources:
    """Where settings come from: an environment mapping and the config file's data."""

    env: Mapping[str, str] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    config_path: str = "config.yaml"  # for messages

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None, *,
             tolerate_broken_config: bool = False) -> "Sources":
        """The process's environment and config file unless given. With `tolerate_broken_config`
        a config file that is not valid YAML counts as empty (the environment and defaults still
        apply); without it, it is the `ConfigError` `load_config` raises."""
        path = "config.yaml"
        if config is None:
            try:
                cfg = load_config()
                config, path = cfg.data, str(cfg.path)
            except ConfigError:
                if not tolerate_broken_config:
                    raise
                config = {}
        return cls(os.environ if env is None else env, config, path)

    # ------------------------------------------------------------------ lookup

    def raw(self, var: str | None, key: str | None) -> tuple[Any, str] | None:
        """The value and where it came from (for messages), or None when neither has it.
        An empty string counts as unset, as it always has for these variables."""
        if var is not None and self.env.get(var) not in (None, ""):
            return self.env[var], var
        if key is not None:
            node: Any = self.config
            for part in key.split("."):
                node = node.get(part) if isinstance(node, Mapping) else None
            if node not in (None, ""):
                return node, f"{self.config_path}: {key}"
        return None

    def located(self, var: str | None, key: str | None, parse: Callable[[Any, str], Any]) -> Any:
        """`parse(value, where)` of the value, None when unset. A value from the config file that
        `parse` refuses is refused at its line and column there
        (`~/.skypurza/config.yaml:4:14: kubernetes.placement=...`), to be fixed in an editor; the
        file is read again only then."""
        got = self.raw(var, key)
        if got is None:
            return None
        try:
            return parse(*got)
        except SettingsError:
            if key is None or got[1] == var:
                raise
            from .config import key_position

            at = key_position(self.config_path, key)
            if at is None:
                raise
            return parse(got[0], f"{self.config_path}:{at[0]}:{at[1]}: {key}")  # raises, placed

    # ------------------------------------------------------------------ typed values

    def number(self, var: str | None, default: float, *, low: float, high: float,
               key: str | None = None, what: str = "a number") -> float:
        """A finite number in [low, high]."""
        got = self.raw(var, key)
        if got is None:
            return default
        return parse_number(got[0], got[1], low=low, high=high, what=what)

    def seconds(self, var: str | None, default: float, *, low: float = 0.0, high: float,
                key: str | None = None) -> float:
        return self.number(var, default, low=low, high=high, key=key, what="a number of seconds")

    def integer(self, var: str | None, default: int, *, low: int, high: int, key: str | None = None) -> int:
        got = self.raw(var, key)
        if got is None:
            return default
        return parse_integer(got[0], got[1], low=low, high=high)

    def flag(self, var: str | None, default: bool, *, key: str | None = None) -> bool:
        got = self.raw(var, key)
        if got is None:
            return default
        return parse_flag(got[0], got[1])

    def names(self, var: str | None, *, key: str | None = None,
              default: tuple[str, ...] = ()) -> tuple[str, ...]:
        """A comma-separated string or a list of names (empty items dropped)."""
        got = self.raw(var, key)
        if got is None:
            return default
        return parse_names(got[0], got[1])

    def choice(self, var: str | None, default: str | None, choices: Sequence[str], *, key: str | None = None,
               fold: Callable[[str], str] = str) -> str | None:
        """One of `choices` (compared after `fold`, e.g. `str.lower`: the value returned is folded)."""
        got = self.raw(var, key)
        if got is None:
            return default
        return parse_choice(got[0], got[1], choices, fold=fold)

    def text(self, var: str | None, default: str | None = None, *, key: str | None = None) -> str | None:
        got = self.raw(var, key)
        if got is None:
            return default
        value, where = got
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise SettingsError(f"{where}={value!r}: expected a string")
        return str(value)


# ---------------------------------------------------------------------- parsers (pure)

def parse_number(value: Any, where: str, *, low: float, high: float, what: str = "a number") -> float:
    accepted = f"expected {what} from {_fmt(low)} to {_fmt(high)}"
    if isinstance(value, bool):  # YAML `true` is not 1 second
        raise SettingsError(f"{where}={value!r}: {accepted}")
    try:
        x = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise SettingsError(f"{where}={value!r}: {accepted}") from None
    if not math.isfinite(x) or not low <= x <= high:
        raise SettingsError(f"{where}={value!r}: {accepted}")
    return x


def parse_integer(value: Any, where: str, *, low: int, high: int) -> int:
    accepted = f"expected a whole number from {low} to {high}"
    if isinstance(value, bool):
        raise SettingsError(f"{where}={value!r}: {accepted}")
    try:
        if isinstance(value, str):
            n = int(value.strip())
        elif isinstance(value, float) and value.is_integer():
            n = int(value)
        elif isinstance(value, int):
            n = value
        else:
            raise ValueError
    except (TypeError, ValueError):
        raise SettingsError(f"{where}={value!r}: {accepted}") from None
    if not low <= n <= high:
        raise SettingsError(f"{where}={value!r}: {accepted}")
    return n


def parse_flag(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise SettingsError(f"{where}={value!r}: expected one of {', '.join(TRUE_WORDS + FALSE_WORDS)}")


def parse_choice(value: Any, where: str, choices: Sequence[str], *, fold: Callable[[str], str] = str) -> str:
    word = fold(value.strip()) if isinstance(value, str) else None
    if word is None or word not in choices:
        raise SettingsError(f"{where}={value!r}: expected one of {', '.join(choices)}")
    return word


def parse_names(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        items: list[Any] = value.split(",")
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise SettingsError(f"{where}={value!r}: expected a comma-separated string or a list of names")
    if any(isinstance(v, (dict, list, tuple)) for v in items):
        raise SettingsError(f"{where}={value!r}: expected a comma-separated string or a list of names")
    return tuple(str(v).strip() for v in items if str(v).strip())
