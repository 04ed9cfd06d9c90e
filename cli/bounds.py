"""Bounded values of command-line flags: a value out of range is a usage error (exit 2) naming
the flag and what it accepts, before anything is read or published.

The bounds are `skypurza.events.limits`; the task model checks the same ones in YAML files.
"""

from __future__ import annotations

import re
from typing import Any

import typer

from skypurza.events import limits, naming

# A plain decimal integer of at most 19 digits: "1e20", "0x10" and 100,000-digit numbers are
# refused as text, before Python tries to build them.
_INT_RE = re.compile(r"^[+-]?[0-9]{1,19}$")


class BoundedInt:
    """A typer `parser`: an integer from `low` to `high`; the message says why the bound is there."""

    def __init__(self, low: int, high: int, why: str = "") -> None:
        self.low, self.high, self.why = low, high, why

    def fail(self, message: str) -> None:
        # typer's own usage error (not ValueError, which pydantic would prefix with "Value error").
        raise typer.BadParameter(message)

    def __call__(self, value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
            shown = str(value)
        else:
            shown = str(value).strip()
            if not _INT_RE.match(shown):
                text = shown if len(shown) <= 40 else f"{shown[:20]}...({len(shown):,} characters)"
                self.fail(f"expected a whole number from {self.low} to {self.high:,}, found {text!r}")
            number = int(shown)
        if not self.low <= number <= self.high:
            why = f" ({self.why})" if self.why else ""
            self.fail(f"must be from {self.low} to {self.high:,}{why}, found {shown}")
        return number


NODES = BoundedInt(1, limits.MAX_NODES, "nodes of one cluster")
NUM_JOBS = BoundedInt(1, limits.MAX_NUM_JOBS, "managed jobs of one launch")
IDLE_MINUTES = BoundedInt(0, limits.MAX_IDLE_MINUTES, "a year; leave autostop off for never")
DISK_GB = BoundedInt(1, limits.MAX_DISK_GB, "GB; EBS's largest volume is 64 TiB")
JOB_ID = BoundedInt(1, limits.MAX_JOB_ID, "job ids are positive 32-bit integers")
TAIL_LINES = BoundedInt(0, limits.MAX_TAIL_LINES, "lines")
DAYS = BoundedInt(1, limits.MAX_DAYS, "days")



def check_cluster_name(value: str | None, flag: str = "-c/--cluster", *, pattern: bool = True) -> str | None:
    """A cluster name: 1..63 characters, letters, digits, - _ ., starting with a letter and ending
    with a letter or digit. None (not given) passes; '' is refused (no name is invented for it)."""
    if value is None:
        return None
    if value == "" or not value.strip():
        raise typer.BadParameter("the cluster name is empty; give a name, or leave -c out to have one made up",
                                 param_hint=flag)
    if len(value) > limits.MAX_CLUSTER_NAME_CHARS:
        raise typer.BadParameter(f"invalid cluster name of {len(value):,} characters: at most "
                                 f"{limits.MAX_CLUSTER_NAME_CHARS}", param_hint=flag)
    if pattern and not naming.CLUSTER_NAME_RE.fullmatch(value):
        raise typer.BadParameter(f"invalid cluster name {value!r}: {naming.CLUSTER_NAME_RULE}", param_hint=flag)
    return value


def cluster_option(value: str | None) -> str | None:
    """typer callback of -c/--cluster."""
    return check_cluster_name(value)


def cluster_argument(value: str | None) -> str | None:
    """typer callback of a CLUSTER argument naming an existing cluster (not empty, not too long)."""
    return check_cluster_name(value, "CLUSTER", pattern=False)


def check_var_flags(envs: dict[str, str], secrets: dict[str, str]) -> None:
    """--env/--secret: the counts and sizes the task model bounds, as usage errors naming the flag."""
    for flag, values in (("--env", envs), ("--secret", secrets)):
        if len(values) > limits.MAX_ENV_VARS:
            raise typer.BadParameter(f"at most {limits.MAX_ENV_VARS} values allowed, found {len(values):,}",
                                     param_hint=flag)
        for key, value in values.items():
            if len(key) > limits.MAX_ENV_NAME_CHARS:
                raise typer.BadParameter(f"a name of {len(key):,} characters: at most {limits.MAX_ENV_NAME_CHARS}",
                                         param_hint=flag)
            size = len(value.encode(errors="surrogateescape"))
            if size > limits.MAX_ENV_VALUE_BYTES:
                raise typer.BadParameter(f"the value of {key} is {size:,} bytes; at most "
                                         f"{limits.MAX_ENV_VALUE_BYTES:,}", param_hint=flag)
    total = sum(len(k.encode(errors="surrogateescape")) + len(v.encode(errors="surrogateescape")) + 2
                for values in (envs, secrets) for k, v in values.items())
    if total > limits.MAX_ENV_TOTAL_BYTES:
        raise typer.BadParameter(f"--env and --secret values together are {total:,} bytes; at most "
                                 f"{limits.MAX_ENV_TOTAL_BYTES:,}", param_hint="--env/--secret")
