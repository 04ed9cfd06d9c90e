"""Splitting a task into what may be logged forever and the secret values that may not.

`public_dict` keeps secret names with null values, keeps `$VAR` templates instead of filled-in
values, and replaces any other occurrence of a secret value in a string by `${NAME}`.
`merge_secrets` puts the values back; the round trip gives the same task.

Both work on plain data (the task's YAML dict and its secret values), not on `Task`, so the
task model can import them at the top (task.py -> public.py, never back).
"""

from __future__ import annotations

from typing import Any

# Secret values shorter than this are not searched for in free text (a one-letter "secret"
# would otherwise rewrite every word); they can only reach other fields through `$VAR`
# substitution, which the kept templates already undo.
MIN_SCRUB_LENGTH = 4

# Keys a task payload carries on the bus that are no part of the SkyPilot task: `uploads`, the
# object-store digests of its local sources (events/payloads.py UploadRef).
TRANSPORT_KEYS = ("uploads",)


def public_dict(yaml_dict: dict[str, Any], values: dict[str, str]) -> dict[str, Any]:
    """`yaml_dict` (a task's `to_yaml_dict(json_safe=True)`) without the secret `values`."""
    out = yaml_dict
    if isinstance(out.get("secrets"), dict):
        out["secrets"] = {name: None for name in out["secrets"]}
    scrub = sorted(((v, k) for k, v in values.items() if len(v) >= MIN_SCRUB_LENGTH), key=lambda p: -len(p[0]))
    if not scrub:
        return out
    return {key: (value if key == "secrets" else _scrub(value, scrub)) for key, value in out.items()}


def _scrub(value: Any, scrub: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        for secret, name in scrub:
            value = value.replace(secret, "${" + name + "}")
        return value
    if isinstance(value, dict):
        return {_scrub(k, scrub): _scrub(v, scrub) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, scrub) for v in value]
    return value


def merge_secrets(public: dict[str, Any], secrets: dict[str, str]) -> dict[str, Any]:
    """`public` with secret values filled back in (names not in `public` are added)."""
    data = dict(public)
    current = data.get("secrets")
    if isinstance(current, list):
        merged: dict[str, str | None] = {name: None for name in current}
    else:
        merged = dict(current or {})
    if not secrets and current is not None and not isinstance(current, dict):
        return data
    merged.update(secrets)
    if merged or "secrets" in data:
        data["secrets"] = merged
    return data
