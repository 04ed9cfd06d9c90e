"""Building blocks for the task models: strict bases, "present but not null", tagged unions and
errors that carry their own message and sub-path.

SkyPilot validates a task with JSON Schema: a key may be absent, but a key written as `null`
is only accepted where the schema says so. `NotNull` gives fields that behaviour while keeping
`None` as "not given" in Python.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Discriminator
from pydantic_core import PydanticCustomError, core_schema

# Tags of discriminated unions show up in pydantic error locations; this invisible prefix lets
# the error formatter drop them without confusing them with a user's own keys.
TAG = "\u2063"


def tag(name: str) -> str:
    return TAG + name


def spz_error(message: str, *subpath: str | int, found: bool = False) -> PydanticCustomError:
    """A validation error with our own message, located `subpath` below the field that raised it."""
    return PydanticCustomError("spz", "{message}", {"message": message, "subpath": tuple(subpath), "append_found": found})


def _what(tp: Any) -> str:
    """'a string', 'a mapping', ... for the types a field accepts (null aside)."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _what(typing.get_args(tp)[0])
    if origin is typing.Union or origin is types.UnionType:
        kinds = [_what(a) for a in typing.get_args(tp) if a is not type(None)]
        kinds = list(dict.fromkeys(kinds))
        return kinds[0] if len(kinds) == 1 else ", ".join(kinds[:-1]) + " or " + kinds[-1]
    if tp is str:
        return "a string"
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if origin is dict or tp is dict or (isinstance(tp, type) and issubclass(tp, BaseModel)):
        return "a mapping"
    if origin is list or tp is list:
        return "a list"
    return "a value"


class _RejectNull:
    """Refuses null where a key may only be absent. The callables a core schema holds are classes
    and module-level functions, never closures, so that a built schema can be pickled
    (events/taskspec/schemacache.py); pydantic-core names a validator by its `__name__`."""

    def __init__(self, expected: str) -> None:
        self.expected = expected
        self.__name__ = "reject_null"

    def __call__(self, value: Any) -> Any:
        if value is None:
            raise spz_error(f"expected {self.expected}, found null")
        return value


def _drop_null(schema: dict[str, Any]) -> dict[str, Any]:
    any_of = schema.get("anyOf")
    if isinstance(any_of, list):
        rest = [s for s in any_of if s != {"type": "null"}]
        if len(rest) != len(any_of):
            schema = {k: v for k, v in schema.items() if k != "anyOf"}
            if len(rest) == 1:
                schema.update(rest[0])
            else:
                schema["anyOf"] = rest
    return schema


class _NotNull:
    """Annotated marker: the key may be absent (None in Python), but not written as null."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_before_validator_function(_RejectNull(_what(source)), handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict[str, Any]:
        return _drop_null(handler(schema))


NotNull = _NotNull()


def choose(description: str, *branches: tuple[str, Callable[[Any], bool]]) -> Discriminator:
    """A discriminator picking the first branch whose predicate holds, else one clear error."""

    # The error type "spz_choice" tells the formatter to add what was found (the context must
    # stay empty: Annotated metadata has to be hashable).
    return Discriminator(_Pick(branches), custom_error_type="spz_choice", custom_error_message=f"expected {description}")


class _Pick:
    """A discriminator's callable: the tag of the first branch whose predicate holds (a class, not
    a closure, as _RejectNull; the predicates are module-level functions)."""

    def __init__(self, branches: tuple[tuple[str, Callable[[Any], bool]], ...]) -> None:
        self.branches = branches
        self.__name__ = "pick"

    def __call__(self, value: Any) -> str | None:
        for name, test in self.branches:
            if test(value):
                return tag(name)
        return None


def is_str(v: Any) -> bool:
    return isinstance(v, str)


def is_dict(v: Any) -> bool:
    # Models count too: discriminators also run when a validated model is dumped.
    return isinstance(v, (dict, BaseModel))


def is_list(v: Any) -> bool:
    return isinstance(v, list)


def is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def is_none(v: Any) -> bool:
    return v is None


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_enum(value: str, accepted: tuple[str, ...], what: str, *, case_sensitive: bool = False) -> str:
    """Case-insensitive enum check as SkyPilot's `case_insensitive_enum`; returns value as given."""
    from .values import did_you_mean

    hit = value in accepted if case_sensitive else value.lower() in {a.lower() for a in accepted}
    if not hit:
        hint = did_you_mean(value, accepted)
        raise spz_error(f"{what} must be one of {', '.join(accepted)}; found {value!r}" + (f".{hint}" if hint else ""))
    return value


# defer_build (both bases): a model's validator is built when it is first used, not at import:
# a command that imports the task models without validating a task does not pay for building
# them (issue 21). One that validates a task still builds the tree under Task: that is most of
# `spz check-yaml`'s time.


# The deferred build goes through model_rebuild; a cold process takes the validator a previous
# process built for the same code from schemacache.py instead (~5 ms rather than 30-50 ms).


class _CachedBuild(BaseModel):
    model_config = ConfigDict(defer_build=True)

    @classmethod
    def model_rebuild(cls, *, force: bool = False, raise_errors: bool = True, _parent_namespace_depth: int = 2,
                      _types_namespace: Any = None) -> bool | None:
        from . import schemacache

        if not force and schemacache.load(cls):
            return True
        built = super().model_rebuild(force=force, raise_errors=raise_errors,
                                      _parent_namespace_depth=_parent_namespace_depth + 1,
                                      _types_namespace=_types_namespace)
        if built and not force:
            schemacache.store(cls)
        return built


class Strict(_CachedBuild):
    """A mapping with a closed set of keys (SkyPilot: additionalProperties: false)."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_default=False, populate_by_name=False, defer_build=True)


class Open(_CachedBuild):
    """A mapping whose known keys are typed and whose other keys are carried as given."""

    model_config = ConfigDict(extra="allow", strict=True, validate_default=False, populate_by_name=False, defer_build=True)
