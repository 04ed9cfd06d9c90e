"""The dispatch policy file: YAML -> `DispatchPolicy` (events/dispatch_policy.py), every problem
positioned (file, line, column, the key's path) with what is accepted there.

Checked here, beyond the model's types and bounds: unknown keys (a typo must not silently
mean "no limit"), unique names, references (a quota's flavor, a cohort's parent), no cycle
among cohorts, one queue per team, a lending limit within the nominal quota (Kueue's rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from skypurza.events.dispatch_policy import (
    AwsReservation, Budget, Cohort, DispatchPolicy, Flavor, FlavorQuota, Preemption, PriorityClass, PriorityConfig,
    PriorityWeights, Queue, Reservation, ResourceQuota, SlurmReservation, TeamShares, UserLimit,
)
from skypurza.events.taskspec.yamlsrc import locate, parse_documents

MAX_POLICY_BYTES = 1 << 20  # a policy for a thousand teams is well under this

# Which key of which model holds which nested model: the unknown-key walk follows it.
_NESTED: dict[type[BaseModel], dict[str, tuple[str, type[BaseModel]]]] = {
    DispatchPolicy: {"flavors": ("list", Flavor), "cohorts": ("list", Cohort), "queues": ("list", Queue),
                     "budgets": ("list", Budget), "priority": ("one", PriorityConfig)},
    PriorityConfig: {"weights": ("one", PriorityWeights), "shares": ("list", TeamShares),
                     "classes": ("list", PriorityClass)},
    Cohort: {"quotas": ("list", FlavorQuota)},
    Queue: {"quotas": ("list", FlavorQuota), "users": ("list", UserLimit), "preemption": ("one", Preemption)},
    FlavorQuota: {"resources": ("dict", ResourceQuota)},
    Flavor: {"reservation": ("one", Reservation)},
    Reservation: {"aws": ("one", AwsReservation), "aws_capacity_block": ("one", AwsReservation),
                  "slurm": ("one", SlurmReservation)},
}


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    column: int | None
    key: str
    message: str

    def __str__(self) -> str:
        where = self.file + (f":{self.line}:{self.column}" if self.line else "")
        return f"{where}: {self.key + ': ' if self.key else ''}{self.message}"


class PolicyError(Exception):
    def __init__(self, problems: list[Problem]):
        super().__init__("\n".join(map(str, problems)))
        self.problems = problems


def load_policy_file(path: str | Path) -> DispatchPolicy:
    p = Path(path)
    try:
        if p.stat().st_size > MAX_POLICY_BYTES:
            raise PolicyError([Problem(str(p), None, None, "", f"larger than {MAX_POLICY_BYTES} bytes")])
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError([Problem(str(p), None, None, "", f"cannot read it: {exc}")]) from None
    return load_policy(text, str(p))


def load_policy(text: str, file: str = "<policy>") -> DispatchPolicy:
    if len(text.encode("utf-8", "replace")) > MAX_POLICY_BYTES:
        raise PolicyError([Problem(file, None, None, "", f"larger than {MAX_POLICY_BYTES} bytes")])
    docs, issues = parse_documents(text)
    if issues:
        raise PolicyError([Problem(file, i.line, i.column, i.path, i.message) for i in issues])
    if len(docs) != 1 or not isinstance(docs[0].data, dict):
        raise PolicyError([Problem(file, 1, 1, "", "a policy is one YAML mapping (keys: "
                                   + ", ".join(DispatchPolicy.model_fields) + ")")])
    root, data = docs[0].node, docs[0].data

    def problem(path: tuple[Any, ...], message: str, key: bool = False) -> Problem:
        line, col = locate(root, [p for p in path], key=key)
        return Problem(file, line, col, _dotted(path), message)

    found = [problem(path, msg, key=True) for path, msg in _unknown_keys(DispatchPolicy, data, ())]
    if found:
        raise PolicyError(found)
    try:
        policy = DispatchPolicy.model_validate(data, strict=True)
    except ValidationError as exc:
        raise PolicyError([problem(tuple(e["loc"]), _message(e)) for e in exc.errors()]) from None
    found = [problem(path, msg) for path, msg in semantic_problems(policy)]
    if found:
        raise PolicyError(found)
    return policy


def _dotted(path: tuple[Any, ...]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _message(err: dict[str, Any]) -> str:
    msg = str(err.get("msg", "invalid"))
    if err.get("type") == "literal_error":
        msg = msg.replace("Input should be", "accepted:")
    return msg


def _unknown_keys(model: type[BaseModel], data: Any, path: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], str]]:
    if not isinstance(data, dict):
        return []  # the model's validation names the wrong type
    out: list[tuple[tuple[Any, ...], str]] = []
    accepted = list(model.model_fields)
    for key, value in data.items():
        if key not in model.model_fields:
            out.append((path + (key,), f"unknown key; accepted here: {', '.join(accepted)}"))
            continue
        nested = _NESTED.get(model, {}).get(key)
        if nested is None:
            continue
        shape, inner = nested
        if shape == "one":
            out += _unknown_keys(inner, value, path + (key,))
        elif shape == "list" and isinstance(value, list):
            for i, item in enumerate(value):
                out += _unknown_keys(inner, item, path + (key, i))
        elif shape == "dict" and isinstance(value, dict):
            for k, item in value.items():
                out += _unknown_keys(inner, item, path + (key, k))
    return out


def semantic_problems(policy: DispatchPolicy) -> list[tuple[tuple[Any, ...], str]]:
    """What the types cannot say: names, references, cycles, limits (pure)."""
    out: list[tuple[tuple[Any, ...], str]] = []
    for section in ("flavors", "cohorts", "queues"):
        seen: set[str] = set()
        for i, item in enumerate(getattr(policy, section)):
            if item.name in seen:
                out.append(((section, i, "name"), f"{item.name!r} is defined twice in {section}"))
            seen.add(item.name)
    for i, f in enumerate(policy.flavors):
        out += [(("flavors", i, "reservation") + path, msg) for path, msg in reservation_problems(f)]
    flavors = {f.name for f in policy.flavors}
    cohorts = {c.name: c for c in policy.cohorts}

    def check_quotas(base: tuple[Any, ...], quotas: list[FlavorQuota]) -> None:
        for j, fq in enumerate(quotas):
            if fq.flavor not in flavors:
                out.append((base + (j, "flavor"), f"unknown flavor {fq.flavor!r}; defined: "
                            + (", ".join(sorted(flavors)) or "none (add it under flavors:)")))
            for res, q in fq.resources.items():
                if q.lending_limit is not None and q.lending_limit > q.nominal:
                    out.append((base + (j, "resources", res, "lending_limit"),
                                f"{q.lending_limit:g} is more than the nominal quota {q.nominal:g}"))

    for i, c in enumerate(policy.cohorts):
        if c.parent is not None and c.parent not in cohorts:
            out.append((("cohorts", i, "parent"), f"unknown cohort {c.parent!r}; defined: "
                        + (", ".join(sorted(cohorts)) or "none")))
        check_quotas(("cohorts", i, "quotas"), c.quotas)
        cur, hops = c.parent, 0
        while cur in cohorts and hops <= len(cohorts):
            if cur == c.name:
                out.append((("cohorts", i, "parent"), f"cohort {c.name!r} is its own ancestor (a cycle)"))
                break
            cur, hops = cohorts[cur].parent, hops + 1
    teams: dict[str, str] = {}
    for i, q in enumerate(policy.queues):
        if q.team in teams:
            out.append((("queues", i, "team"), f"team {q.team!r} already has queue {teams[q.team]!r}"))
        teams.setdefault(q.team, q.name)
        check_quotas(("queues", i, "quotas"), q.quotas)
    for i, b in enumerate(policy.budgets):
        if b.on_limit == "stop" and not b.hard:
            out.append((("budgets", i, "on_limit"), "`stop` cancels running work at 100%, which a soft budget "
                        "(hard: false) never enforces; set hard: true or on_limit: hold"))
    if policy.priority is not None:
        out += _priority_problems(policy.priority)
    return out


def _priority_problems(pr: PriorityConfig) -> list[tuple[tuple[Any, ...], str]]:
    out: list[tuple[tuple[Any, ...], str]] = []
    for section, attr in (("shares", "team"), ("classes", "name")):
        seen: set[str] = set()
        for i, item in enumerate(getattr(pr, section)):
            name = getattr(item, attr)
            if name in seen:
                out.append((("priority", section, i, attr), f"{name!r} is given twice in priority.{section}"))
            seen.add(name)
    return out


RESERVATION_KINDS = ("aws", "aws_capacity_block", "slurm")


def reservation_kind(r: Reservation) -> str | None:
    """The one kind a reservation names (None: none or several; reservation_problems says)."""
    given = [k for k in RESERVATION_KINDS if getattr(r, k) is not None]
    return given[0] if len(given) == 1 else None


def reservation_problems(f: Flavor) -> list[tuple[tuple[Any, ...], str]]:
    """A flavor's reservation: one kind, an infra and market that agree with it, a zone in its region."""
    r = f.reservation
    if r is None:
        return []
    given = [k for k in RESERVATION_KINDS if getattr(r, k) is not None]
    if len(given) != 1:
        return [((), f"name exactly one of {', '.join(RESERVATION_KINDS)}; found "
                 + (", ".join(given) or "none"))]
    kind = given[0]
    out: list[tuple[tuple[Any, ...], str]] = []
    infra = "slurm" if kind == "slurm" else "aws"
    if f.infra is not None and f.infra != infra:
        out.append(((kind,), f"a {kind} reservation is on infra {infra}, but the flavor says infra {f.infra!r}"))
    if f.market == "spot":
        out.append(((kind,), "a reservation is not a spot market: leave `market` out or say on-demand"))
    aws = getattr(r, kind)
    if isinstance(aws, AwsReservation) and "-az" not in aws.zone and not aws.zone.startswith(aws.region):
        out.append(((kind, "zone"), f"zone {aws.zone!r} is not in region {aws.region!r} "
                    "(a zone name such as us-east-1a, or a zone id such as use1-az4)"))
    return out
