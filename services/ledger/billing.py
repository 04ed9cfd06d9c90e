"""Slurm billing units: TRESBillingWeights, PriorityFlags MAX_TRES / MAX_TRES_GRES, and the
two "billing" numbers one allocation has.

Semantics follow docs/billing.md (from Slurm's tres and priority_multifactor pages and its source):

- A weight applies to one TRES. A TRES without a weight weighs 0; the ``billing`` TRES itself is
  never weighted (it is the result). With no weights at all, billing is the CPU count.
- A ``K|M|G|T|P`` suffix on a weight *divides* it by that unit, measured from the TRES's base
  unit: MiB for mem and bb, a plain count for everything else. So ``Mem=0.25G`` is 0.25 per
  GiB, while ``Mem=0.25K`` and ``Mem=0.25M`` are both 0.25 per MiB (K is below the base unit).
- SUM (default): Σ count×weight. MAX_TRES: MAX over node TRES (cpu, mem, node, every gres) plus
  Σ over the rest. MAX_TRES_GRES (Slurm 25.05+): MAX(cpu, mem, node) + Σ gres + Σ the rest.
- Slurm computes the value as a C double (the job's ``billable_tres``, which fairshare RawUsage
  accrues) and stores ``AllocTRES billing=`` as that double truncated to an integer (which
  sreport and GrpTRESMins/GrpTRESRaw accrue). We return the exact decimal value, the double as
  Slurm's arithmetic produces it, and that integer. They can disagree: CPU=0.29 on 100 CPUs is
  exactly 29, but the double is 28.999999999999996 and Slurm stores 28.

Everything here is pure: text or numbers in, frozen values out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Context, Decimal, Inexact, InvalidOperation, Overflow, Rounded
from enum import Enum

__all__ = [
    "BillingMode",
    "BillingResult",
    "BillingTerm",
    "BillingWeights",
    "TresVector",
    "Weight",
    "billing",
    "billing_mode",
    "billing_seconds",
    "double_counted_gres",
    "fairshare_usage",
    "grp_tres_minutes",
    "normalize_tres_key",
    "parse_priority_flags",
    "parse_tres",
    "parse_weights",
    "tres_group",
    "weights_for_team",
]

# Exact arithmetic: weights are decimals divided by powers of 1024, counts are integers, so every
# value has a finite decimal expansion. A wide context with Inexact trapped proves no rounding.
_EXACT = Context(prec=400, traps=[Inexact, Rounded, InvalidOperation, Overflow])

# Slurm's fixed TRES ids 1..8, in id order: the order its double arithmetic adds them in.
_DEFAULT_ORDER = ("cpu", "mem", "energy", "node", "billing", "fs/disk", "vmem", "pages")

# Types that stand alone, and types that need a "/name".
_PLAIN_TYPES = frozenset({"cpu", "mem", "energy", "node", "billing", "vmem", "pages"})
_NAMED_TYPES = frozenset({"gres", "license", "bb", "fs", "ic"})
_FIXED_NAMES = {"fs": frozenset({"disk", "lustre"}), "ic": frozenset({"ofed", "sysfs"})}
_ACCEPTED_KEYS = (
    "cpu, mem, node, energy, vmem, pages, billing, gres/<name>[:<type>], license/<name>, "
    "bb/<name>, fs/disk, fs/lustre, ic/ofed, ic/sysfs"
)

# Base unit index of a TRES type in Slurm's "\0KMGTP" scale: MiB (2) for mem and bb, else none (0).
_UNITS = "KMGTP"
_MIB_BASED = frozenset({"mem", "bb"})

_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+(:[A-Za-z0-9_.\-]+)?$")
_NUMBER_RE = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_INT_RE = re.compile(r"^\d+$")
_MEM_RE = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)([KMGTPkmgtp]?)$")

_KNOWN_FLAGS = frozenset(
    {
        "ACCRUE_ALWAYS",
        "CALCULATE_RUNNING",
        "DEPTH_OBLIVIOUS",
        "FAIR_TREE",
        "INCR_ONLY",
        "MAX_TRES",
        "MAX_TRES_GRES",
        "NO_FAIR_TREE",
        "NO_NORMAL_ALL",
        "NO_NORMAL_ASSOC",
        "NO_NORMAL_PART",
        "NO_NORMAL_QOS",
        "NO_NORMAL_TRES",
        "SMALL_RELATIVE_TO_TIME",
    }
)


class BillingMode(str, Enum):
    SUM = "SUM"
    MAX_TRES = "MAX_TRES"
    MAX_TRES_GRES = "MAX_TRES_GRES"


# --------------------------------------------------------------------------------------------
# TRES keys


def normalize_tres_key(text: str) -> str:
    """``GRES/gpu:H100`` -> ``gres/gpu:h100``; ValueError for anything Slurm would not track.

    Slurm compares TRES types and names case-insensitively, so keys are lower-cased.
    """
    raw = text.strip()
    if not raw:
        raise ValueError(f"empty TRES name; accepted: {_ACCEPTED_KEYS}")
    kind, sep, name = raw.partition("/")
    kind = kind.lower()
    if not sep:
        if kind in _PLAIN_TYPES:
            return kind
        if kind in _NAMED_TYPES:
            raise ValueError(f"TRES {raw!r} needs a name ({kind}/<name>); accepted: {_ACCEPTED_KEYS}")
        raise ValueError(f"unknown TRES {raw!r}; accepted: {_ACCEPTED_KEYS}")
    if kind in _PLAIN_TYPES:
        raise ValueError(f"TRES {raw!r}: {kind} takes no name; accepted: {_ACCEPTED_KEYS}")
    if kind not in _NAMED_TYPES:
        raise ValueError(f"unknown TRES type {kind!r} in {raw!r}; accepted: {_ACCEPTED_KEYS}")
    if not _NAME_RE.match(name) or (kind != "gres" and ":" in name):
        raise ValueError(
            f"TRES {raw!r}: bad name {name!r} (letters, digits, '_', '.', '-'; "
            f"gres may add ':<type>', e.g. gres/gpu:h100)"
        )
    name = name.lower()
    if kind in _FIXED_NAMES and name not in _FIXED_NAMES[kind]:
        allowed = ", ".join(f"{kind}/{n}" for n in sorted(_FIXED_NAMES[kind]))
        raise ValueError(f"TRES {raw!r}: {kind} must be one of {allowed}")
    return f"{kind}/{name}"


def tres_group(key: str) -> str:
    """'node' for cpu/mem/node, 'gres' for gres/*, 'global' for everything else."""
    if key in ("cpu", "mem", "node"):
        return "node"
    if key.startswith("gres/"):
        return "gres"
    return "global"


def _base_unit(key: str) -> int:
    return 2 if key.split("/", 1)[0] in _MIB_BASED else 0


# --------------------------------------------------------------------------------------------
# Weights


@dataclass(frozen=True)
class Weight:
    key: str
    text: str  # the value as written, e.g. "0.25G"
    exact: Decimal  # per base unit, after the suffix division
    double: float  # what Slurm holds: strtod(value) / convert_val


@dataclass(frozen=True)
class BillingWeights:
    """A parsed TRESBillingWeights. ``defined`` is False for an empty string (bill CPUs)."""

    text: str
    weights: Mapping[str, Weight] = field(default_factory=dict)

    @property
    def defined(self) -> bool:
        return bool(self.weights)

    def exact(self, key: str) -> Decimal:
        w = self.weights.get(key)
        return w.exact if w else Decimal(0)

    def double(self, key: str) -> float:
        w = self.weights.get(key)
        return w.double if w else 0.0


def _unit_divisor(key: str, unit: str, token: str) -> int:
    """Slurm's get_convert_unit_val: 1024 per step from the base unit up; 0 steps -> no division."""
    steps = (_UNITS.index(unit) + 1) - _base_unit(key)
    if steps <= 0:
        return 1
    if steps >= 4:
        # Slurm computes 1024**steps in a C int: 1024**4 overflows, so a T or P suffix on a
        # count TRES gives a compiler-dependent result. Refuse rather than guess.
        raise ValueError(
            f"weight {token!r}: suffix {unit} on a count TRES overflows Slurm's unit "
            f"conversion; use K, M or G (or T/P only on mem and bb)"
        )
    return 1024**steps


def _parse_weight_value(key: str, value: str, token: str) -> Weight:
    m = _NUMBER_RE.match(value)
    if not m:
        raise ValueError(
            f"weight {token!r}: {value!r} is not a number; write a decimal such as 1, 0.25 "
            f"or 2.5e-1, optionally followed by one of K, M, G, T, P"
        )
    number = m.group(0)
    rest = value[m.end() :]
    unit = ""
    if rest:
        if len(rest) != 1 or rest.upper() not in _UNITS:
            raise ValueError(
                f"weight {token!r}: unknown unit {rest!r} after {number!r}; accepted: "
                f"one of K, M, G, T, P (case-insensitive), e.g. Mem=0.25G"
            )
        unit = rest.upper()
    divisor = _unit_divisor(key, unit, token) if unit else 1
    exact = _EXACT.divide(Decimal(number), Decimal(divisor))
    double = float(number)
    if divisor > 1:
        double = double / divisor
    return Weight(key=key, text=value, exact=exact, double=double)


def parse_weights(text: str) -> BillingWeights:
    """Parse a TRESBillingWeights string, e.g. ``CPU=1.0,Mem=0.25G,GRES/gpu=2.0,license/licA=1.5``.

    Like Slurm: comma-separated, empty items skipped, a later weight for the same TRES wins,
    surrounding double quotes (as in slurm.conf) are dropped. Unlike Slurm, which reads only the
    first letter after the number, anything but a single unit letter is refused as a likely typo.
    """
    stripped = text.strip()
    if len(stripped) >= 2 and stripped[0] == stripped[-1] == '"':
        stripped = stripped[1:-1].strip()
    weights: dict[str, Weight] = {}
    for raw in stripped.split(","):
        token = raw.strip()
        if not token:
            continue
        name, eq, value = token.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise ValueError(
                f"invalid TRES weight entry {token!r}: expected <TRES>=<weight>, "
                f"e.g. CPU=1.0 or Mem=0.25G or GRES/gpu:h100=4"
            )
        key = normalize_tres_key(name)
        weights[key] = _parse_weight_value(key, value.strip(), token)
    return BillingWeights(text=text, weights=dict(weights))


def weights_for_team(
    team: str | None,
    table: Mapping[str, BillingWeights | str],
    default: BillingWeights | str = "",
) -> BillingWeights:
    """The weights configured for ``team``, else ``default`` (both may be given as text)."""
    chosen = table.get(team, default) if team is not None else default
    return parse_weights(chosen) if isinstance(chosen, str) else chosen


def double_counted_gres(weights: BillingWeights) -> list[tuple[str, str]]:
    """Pairs (gres/X, gres/X:T) that both carry a non-zero weight.

    Slurm records an untyped ``--gres=gpu:1`` as both gres/gpu=1 and gres/gpu:<type>=1, so
    weighting both bills each GPU twice. Slurm does exactly that; this lets callers warn.
    """
    pairs = []
    for key, w in sorted(weights.weights.items()):
        if not key.startswith("gres/") or ":" not in key or w.exact == 0:
            continue
        untyped = key.split(":", 1)[0]
        if weights.exact(untyped) != 0:
            pairs.append((untyped, key))
    return pairs


# --------------------------------------------------------------------------------------------
# TRES vectors


@dataclass(frozen=True)
class TresVector:
    """Allocated TRES counts by normalized key; mem and bb in MiB. Counts are whole numbers."""

    counts: Mapping[str, int] = field(default_factory=dict)

    def get(self, key: str) -> int:
        return self.counts.get(key, 0)

    @classmethod
    def of(cls, counts: Mapping[str, int | float | Decimal]) -> TresVector:
        """Build from a mapping (keys normalized; counts must be non-negative whole numbers)."""
        out: dict[str, int] = {}
        for raw_key, raw in counts.items():
            key = normalize_tres_key(raw_key)
            value = Decimal(str(raw)) if isinstance(raw, float) else Decimal(raw)
            if value < 0 or value != value.to_integral_value():
                raise ValueError(f"TRES {raw_key}={raw}: counts are non-negative whole numbers")
            out[key] = int(value)
        return cls(counts=out)

    def to_text(self) -> str:
        """Slurm's AllocTRES style: fixed TRES in id order, then the rest sorted; mem as <n>M."""
        keys = [k for k in _DEFAULT_ORDER if k in self.counts]
        keys += sorted(k for k in self.counts if k not in _DEFAULT_ORDER)
        parts = []
        for k in keys:
            v = self.counts[k]
            parts.append(f"{k}={v}M" if _base_unit(k) == 2 else f"{k}={v}")
        return ",".join(parts)


def _parse_mib(key: str, value: str, token: str) -> int:
    m = _MEM_RE.match(value)
    if not m:
        raise ValueError(
            f"TRES {token!r}: {key} takes a size such as 8192, 8192M, 8G or 1T "
            f"(MiB when there is no suffix; K, M, G, T, P are powers of 1024)"
        )
    number, unit = Decimal(m.group(1)), m.group(2).upper()
    scale = {"": 1, "K": Decimal(1) / 1024, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}[unit]
    mib = _EXACT.multiply(number, Decimal(scale))
    if mib != mib.to_integral_value():
        raise ValueError(
            f"TRES {token!r} is {mib.normalize()} MiB; Slurm counts {key} in whole MiB, "
            f"write it as an integer number of M, e.g. {key}={int(mib)}M"
        )
    return int(mib)


def parse_tres(text: str) -> TresVector:
    """Parse ``cpu=4,mem=8G,node=1,gres/gpu=2,gres/gpu:h100=2,license/NAME=1``.

    Also reads sacct's AllocTRES (``billing=13,cpu=2,mem=16000M,...``): a ``billing`` entry is
    kept but never weighted. Memory and bb accept the sizes Slurm prints (``8192M``, ``8G``);
    a bare number is MiB. Every other count is a plain non-negative integer.
    """
    counts: dict[str, int] = {}
    for raw in text.split(","):
        token = raw.strip()
        if not token:
            continue
        name, eq, value = token.partition("=")
        value = value.strip()
        if not eq or not name.strip() or not value:
            raise ValueError(
                f"invalid TRES entry {token!r}: expected <TRES>=<count>, "
                f"e.g. cpu=4, mem=8G, gres/gpu:h100=2"
            )
        key = normalize_tres_key(name)
        if key in counts:
            raise ValueError(f"TRES {key} given twice in {text!r}")
        if _base_unit(key) == 2:
            counts[key] = _parse_mib(key, value, token)
        elif _INT_RE.match(value):
            counts[key] = int(value)
        else:
            raise ValueError(f"TRES {token!r}: {key} takes a non-negative integer count")
    return TresVector(counts=counts)


# --------------------------------------------------------------------------------------------
# Flags


def parse_priority_flags(text: str | Iterable[str]) -> frozenset[str]:
    """PriorityFlags as upper-case names; unknown names are refused."""
    items = text.split(",") if isinstance(text, str) else list(text)
    flags = set()
    for raw in items:
        flag = raw.strip().upper()
        if not flag:
            continue
        if flag not in _KNOWN_FLAGS:
            raise ValueError(
                f"unknown PriorityFlags value {raw.strip()!r}; accepted: "
                + ", ".join(sorted(_KNOWN_FLAGS))
            )
        flags.add(flag)
    return frozenset(flags)


def billing_mode(flags: str | Iterable[str] | BillingMode = "") -> BillingMode:
    """The billing formula a set of PriorityFlags selects (other flags do not affect billing)."""
    if isinstance(flags, BillingMode):
        return flags
    parsed = parse_priority_flags(flags)
    if {"MAX_TRES", "MAX_TRES_GRES"} <= parsed:
        # Slurm's documentation defines each flag alone; which wins together is not documented.
        raise ValueError("PriorityFlags MAX_TRES and MAX_TRES_GRES are alternatives; set one")
    if "MAX_TRES" in parsed:
        return BillingMode.MAX_TRES
    if "MAX_TRES_GRES" in parsed:
        return BillingMode.MAX_TRES_GRES
    return BillingMode.SUM


# --------------------------------------------------------------------------------------------
# The formula


@dataclass(frozen=True)
class BillingTerm:
    key: str
    count: int
    weight: Decimal
    value: Decimal  # count × weight, exact
    role: str  # "max" (competes in the MAX) or "sum" (added)


@dataclass(frozen=True)
class BillingResult:
    billing: Decimal  # exact value of the formula (what fairshare RawUsage means to accrue)
    billing_double: float  # the double Slurm's arithmetic produces (job billable_tres)
    billing_int: int  # what Slurm stores as AllocTRES billing= (the double, truncated)
    mode: BillingMode
    terms: tuple[BillingTerm, ...] = ()


def _role(mode: BillingMode, key: str) -> str:
    group = tres_group(key)
    if mode is BillingMode.MAX_TRES and group in ("node", "gres"):
        return "max"
    if mode is BillingMode.MAX_TRES_GRES and group == "node":
        return "max"
    return "sum"


def _order(keys: Iterable[str], tres_order: Iterable[str] | None) -> list[str]:
    seen: dict[str, None] = {}
    for k in _DEFAULT_ORDER:
        seen[k] = None
    for k in [normalize_tres_key(k) for k in tres_order or ()]:
        seen.setdefault(k, None)
    for k in keys:
        seen.setdefault(k, None)
    return list(seen)


def _tidy(value: Decimal) -> Decimal:
    """Drop trailing zeros without switching to exponent form: 3.000 -> 3, 16.250 -> 16.25."""
    if value == value.to_integral_value():
        return Decimal(int(value))
    return value.normalize(_EXACT) if value.adjusted() > -7 else value


def billing(
    weights: BillingWeights | str,
    tres: TresVector | str | Mapping[str, int],
    flags: str | Iterable[str] | BillingMode = "",
    *,
    tres_order: Iterable[str] | None = None,
) -> BillingResult:
    """Billing of one allocation under a partition's weights and the cluster's PriorityFlags.

    ``tres_order`` only matters for ``billing_double``'s last bits: Slurm adds TRES in database
    id order (cpu, mem, energy, node, billing, fs/disk, vmem, pages, then the configured
    AccountingStorageTRES in creation order). Without it, other TRES follow in the order the
    weights and then the TRES vector name them.
    """
    w = parse_weights(weights) if isinstance(weights, str) else weights
    if isinstance(tres, str):
        t = parse_tres(tres)
    elif isinstance(tres, TresVector):
        t = tres
    else:
        t = TresVector.of(tres)
    mode = billing_mode(flags)

    if not w.defined:
        cpus = t.get("cpu")
        return BillingResult(
            billing=Decimal(cpus),
            billing_double=float(cpus),
            billing_int=cpus,
            mode=mode,
            terms=(BillingTerm("cpu", cpus, Decimal(1), Decimal(cpus), "sum"),),
        )

    keys = _order(list(w.weights) + list(t.counts), tres_order)
    terms: list[BillingTerm] = []
    exact_max = Decimal(0)
    exact_sum = Decimal(0)
    # Slurm: to_bill_node starts at 0.0 and takes MAX; to_bill_global accumulates in id order.
    dbl_max = 0.0
    dbl_sum = 0.0
    for key in keys:
        if key == "billing":
            continue
        count = t.get(key)
        weight = w.exact(key)
        value = _EXACT.multiply(Decimal(count), weight)
        dvalue = float(count) * w.double(key)
        role = _role(mode, key)
        if role == "max":
            exact_max = max(exact_max, value)
            dbl_max = dbl_max if dbl_max > dvalue else dvalue
        else:
            exact_sum = _EXACT.add(exact_sum, value)
            dbl_sum += dvalue
        if key in w.weights or count:
            terms.append(BillingTerm(key, count, weight, _tidy(value), role))

    exact = _tidy(_EXACT.add(exact_max, exact_sum))
    dbl = dbl_max + dbl_sum
    if dbl < 0:
        raise ValueError(
            f"billing is negative ({exact}); Slurm stores billing in an unsigned 64-bit "
            f"integer, so negative weights must not outweigh the rest"
        )
    return BillingResult(
        billing=exact,
        billing_double=dbl,
        billing_int=math.trunc(dbl),
        mode=mode,
        terms=tuple(terms),
    )


# --------------------------------------------------------------------------------------------
# The two usage quantities


def fairshare_usage(
    result: BillingResult, seconds: int | Decimal, usage_factor: Decimal | int | str = 1
) -> Decimal:
    """Undecayed fairshare RawUsage a run adds: the *untruncated* billing × seconds × UsageFactor.

    sshare prints RawUsage as an integer (truncated), e.g. billing 5.25 for 15 s -> 78.
    """
    return _EXACT.multiply(
        _EXACT.multiply(result.billing, Decimal(seconds)), Decimal(str(usage_factor))
    )


def billing_seconds(result: BillingResult, seconds: int) -> int:
    """What sreport and GrpTRESRaw accrue: the *stored integer* billing × elapsed seconds."""
    if seconds < 0:
        raise ValueError(f"elapsed seconds must be >= 0, got {seconds}")
    return result.billing_int * seconds


def grp_tres_minutes(total_billing_seconds: int) -> int:
    """GrpTRESRaw / GrpTRESMins billing: whole TRES-minutes (1030 billing-seconds -> 17)."""
    return total_billing_seconds // 60
