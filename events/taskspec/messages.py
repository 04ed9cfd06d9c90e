"""Pydantic errors -> messages a user can act on: what was found, what is accepted, did you mean."""

from __future__ import annotations

import datetime
import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ._base import TAG
from .values import AUTOSTOP_RE, DISK_SIZE_RE

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Finding:
    loc: Loc
    message: str
    at_key: bool = False  # point at the key itself (unknown keys), not its value


def describe(value: Any) -> str:
    """How a YAML value reads back: 'abc' (a string), 12, a mapping, null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length():,} bits"  # repr() refuses past 4,300 digits
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        text = value if len(value) <= 60 else value[:57] + "..."
        return repr(text)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, (set, frozenset)):
        return "a !!set"
    if isinstance(value, (datetime.date, datetime.datetime)):
        return f"a date ({value.isoformat()}); quote it to make it a string"
    if isinstance(value, bytes):
        return "binary data"
    return type(value).__name__


_TYPE_MESSAGES = {
    "string_type": "expected a string",
    "bool_type": "expected true or false",
    "int_type": "expected an integer",
    "int_from_float": "expected an integer",
    "int_parsing": "expected an integer",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
    "list_type": "expected a list",
    "none_required": "expected null",
}


# Patterns of the SkyPilot schema in words.
PATTERN_HELP = {
    AUTOSTOP_RE.pattern: "idle minutes like 10, or a duration like 10m, 2h, 1d, 1w",
    DISK_SIZE_RE.pattern: "a size like 256, 256GB, 1TB or 512Gi",
    r"^[0-9]+(b|k|m|g|t|p|B|K|M|G|T|P)?$": "a size like 64, 64M or 1G",
    r"^[a-zA-Z0-9._-][a-zA-Z0-9./_-]*$": "a relative path of letters, digits, . _ - and /",
    r"^(?:[-a-z0-9]+/)?[-a-z0-9]+$": "a VPC name like my-vpc or project/my-vpc",
    r"^[^\n]*$": "a single line",
}


def _accepted_keys(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _unknown_key(key: str | int, model: type[BaseModel] | None) -> str:
    text = f"unknown key '{key}'"
    if model is None:
        return text
    keys = _accepted_keys(model)
    public = [k for k in keys if not k.startswith("_")]
    close = difflib.get_close_matches(str(key), keys, n=1, cutoff=0.6)
    if key == "spot_recovery":
        close = ["job_recovery"]
        text += " (SkyPilot renamed it; 0.14.1 no longer accepts the old name)"
    if close:
        return f"{text}. Did you mean '{close[0]}'?"
    return f"{text}. Accepted keys: {', '.join(public)}"


def findings(errors: Sequence[Mapping[str, Any]], root: type[BaseModel]) -> list[Finding]:
    out: list[Finding] = []
    for err in errors:
        loc: Loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith(TAG)))
        on_key = bool(loc) and loc[-1] == "[key]"  # a dict key itself failed validation
        if on_key:
            loc = loc[:-1]
        kind = err["type"]
        ctx = err.get("ctx") or {}
        value = err.get("input")
        found = f", found {describe(value)}"
        if kind == "spz":
            loc = loc + tuple(ctx.get("subpath", ()))
            key = next((p for p in reversed(loc) if isinstance(p, str)), "")
            message = str(ctx.get("message", err["msg"])).replace("{key}", str(key))
            out.append(Finding(loc, message + (found if ctx.get("append_found") else ""), at_key=on_key))
        elif kind == "spz_choice":
            out.append(Finding(loc, err["msg"] + found))
        elif kind == "extra_forbidden":
            out.append(Finding(loc, _unknown_key(loc[-1], model_at(root, loc[:-1])), at_key=True))
        elif kind == "invalid_key":
            out.append(Finding(loc, f"keys must be strings, found {describe(value)}", at_key=True))
        elif kind == "missing":
            out.append(Finding(loc, f"missing required key '{loc[-1]}'"))
        elif kind in ("model_type", "model_attributes_type", "dict_type") and not loc:
            out.append(Finding(loc, "a task must be a mapping of keys (name, resources, run, ...)" + found))
        elif kind in _TYPE_MESSAGES:
            out.append(Finding(loc, _TYPE_MESSAGES[kind] + found))
        elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
            limit = next(iter(ctx.values()), "?")
            out.append(Finding(loc, f"must be {op} {limit}" + found))
        elif kind == "too_long":
            limit = ctx.get("max_length")
            allowed = "only one entry allowed" if limit == 1 else f"at most {limit} entries allowed"
            out.append(Finding(loc, f"{allowed}, found {_length(ctx, value)}"))
        elif kind == "too_short":
            out.append(Finding(loc, f"at least {ctx.get('min_length')} entries needed, found {_length(ctx, value)}"))
        elif kind == "string_too_short":
            out.append(Finding(loc, "must not be empty" if ctx.get("min_length") == 1 else err["msg"]))
        elif kind == "string_too_long":
            out.append(Finding(loc, f"at most {ctx.get('max_length')} characters allowed"))
        elif kind == "string_pattern_mismatch":
            pattern = str(ctx.get("pattern"))
            out.append(Finding(loc, f"expected {PATTERN_HELP.get(pattern, 'the form ' + pattern)}" + found))
        elif kind == "literal_error":
            out.append(Finding(loc, f"expected one of {ctx.get('expected')}" + found))
        elif kind == "recursion_loop":
            out.append(Finding(loc, "recursive structure"))
        else:
            out.append(Finding(loc, err["msg"] + found))
    return out


# ------------------------------------------------------------------- which model is at a path

def model_at(root: type[BaseModel], path: Loc) -> type[BaseModel] | None:
    current: Any = root
    for elem in path:
        current = _step(current, elem)
        if current is None:
            return None
    found = _models_in(current)
    return found[0] if found else None


def _models_in(tp: Any) -> list[Any]:
    """The model classes, dicts and lists a (possibly Annotated/Union) type can be."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(tp)[0])
    if origin is typing.Union or origin is types.UnionType:
        out: list[Any] = []
        for arg in typing.get_args(tp):
            out.extend(_models_in(arg))
        return out
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    if origin in (dict, list):
        return [tp]
    return []


def _step(tp: Any, elem: str | int) -> Any:
    for option in _models_in(tp):
        if isinstance(option, type) and issubclass(option, BaseModel):
            if isinstance(elem, str):
                for name, field in option.model_fields.items():
                    if (field.alias or name) == elem:
                        return field.annotation
        elif typing.get_origin(option) is dict and isinstance(elem, str):
            return typing.get_args(option)[1]
        elif typing.get_origin(option) is list and isinstance(elem, int):
            return typing.get_args(option)[0]
    return None


def _length(ctx: dict[str, Any], value: Any) -> Any:
    """How many entries were found: pydantic >= 2.14 stops counting at the limit (None in ctx)."""
    actual = ctx.get("actual_length")
    if actual is None and hasattr(value, "__len__"):
        actual = len(value)
    return actual
