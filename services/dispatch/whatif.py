"""What-if inputs for policy authors: a share tree or a job's priority factors from a JSON file,
checked at the edge (every bad value is a `WhatIfError` naming the file, the key and what is
accepted), and the answers as the JSON `spz dispatch share|prio -o json` prints.

Shapes (docs/dispatch.md, *What-if*):
- tree: `{"name": "root", "children": [{"name": "teama", "shares": 40, "children": [{"name":
  "alice", "user": true, "shares": 1, "usage": 91.5}]}]}`;
- explain: `{"weights": {...}, "factors": {...}, "jobsize_inputs": {...}, "tres_weights":
  {...}, "tres_factors": {...}}`, any key absent.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from skypurza.events.limits import MAX_YAML_FILE_BYTES

from . import fairshare, priority

MAX_TREE_NODES = 100_000
MAX_TREE_DEPTH = 32
MAX_NAME_CHARS = 64
MAX_TRES = 64
MAX_USAGE = 1e30  # billing-seconds; far above any cluster's, far below a double's overflow
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]*$")
MAX_NICE = 2147483645
MAX_SITE = 0xFFFFFFFF


class WhatIfError(ValueError):
    """A bad what-if file: `file: key: what is wrong; accepted: ...` (one line, no traceback)."""


# ------------------------------------------------------------------ reading


def read_json(path: str | Path) -> Any:
    p = Path(path)
    try:
        if p.is_dir():
            raise WhatIfError(f"{p}: is a directory; accepted: a JSON file")
        if not p.is_file():
            raise WhatIfError(f"{p}: no such file (or not a regular file)")
        size = p.stat().st_size
        if size > MAX_YAML_FILE_BYTES:
            raise WhatIfError(f"{p}: {size} bytes; accepted: at most {MAX_YAML_FILE_BYTES}")
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WhatIfError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise WhatIfError(f"{p}: cannot be read ({exc.strerror or exc})") from None

    def no_constant(name: str) -> Any:
        raise WhatIfError(f"{p}: {name} is not a number JSON allows; accepted: finite numbers")

    try:
        return json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise WhatIfError(f"{p}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise WhatIfError(f"{p}: nested too deeply; accepted: at most {MAX_TREE_DEPTH} levels") from None


def _where(file: str, key: str) -> str:
    return f"{file}: {key}" if key else file


def _number(v: Any, file: str, key: str, lo: float, hi: float, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise WhatIfError(f"{_where(file, key)}: {json.dumps(v)[:60]} is not accepted; accepted: {what}")
    return float(v)


def _whole(v: Any, file: str, key: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        if isinstance(v, float) and v.is_integer() and lo <= v <= hi:
            return int(v)
        raise WhatIfError(f"{_where(file, key)}: {json.dumps(v)[:60]} is not accepted; "
                          f"accepted: a whole number from {lo} to {hi}")
    return v


def _object(v: Any, file: str, key: str, allowed: tuple[str, ...] | None) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise WhatIfError(f"{_where(file, key) or file}: {type(v).__name__} is not accepted; accepted: an object")
    if allowed is not None:
        for k in v:
            if k not in allowed:
                raise WhatIfError(f"{_where(file, f'{key}.{k}' if key else k)}: unknown key; "
                                  f"accepted: {', '.join(allowed)}")
    return v


# ------------------------------------------------------------------ share tree

_NODE_KEYS = ("name", "shares", "usage", "user", "children")


def parse_tree(data: Any, file: str = "tree") -> fairshare.Node:
    """The tree as given; the root's shares and usage are not read (the root's usage is the sum)."""
    count = [0]
    return _node(data, file, "", 0, count, is_root=True)


def _node(v: Any, file: str, key: str, depth: int, count: list[int], is_root: bool = False) -> fairshare.Node:
    if depth > MAX_TREE_DEPTH:
        raise WhatIfError(f"{_where(file, key)}: nested {depth} levels deep; accepted: at most {MAX_TREE_DEPTH}")
    count[0] += 1
    if count[0] > MAX_TREE_NODES:
        raise WhatIfError(f"{file}: more than {MAX_TREE_NODES} associations; accepted: at most {MAX_TREE_NODES}")
    obj = _object(v, file, key or "", _NODE_KEYS)
    k = (lambda name: f"{key}.{name}" if key else name)
    name = obj.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS or not NAME_RE.match(name):
        raise WhatIfError(f"{_where(file, k('name'))}: {json.dumps(name)[:80]} is not accepted; accepted: "
                          f"1 to {MAX_NAME_CHARS} letters, digits, '_', '.', '@', '-' (not starting with '.', '@' or '-')")
    user = obj.get("user", False)
    if not isinstance(user, bool):
        raise WhatIfError(f"{_where(file, k('user'))}: {json.dumps(user)[:40]} is not accepted; accepted: true or false")
    if is_root and user:
        raise WhatIfError(f"{_where(file, k('user'))}: the root cannot be a user; accepted: false")
    shares = _whole(obj.get("shares", 1), file, k("shares"), 0, 0xFFFFFFFE) if not is_root else 1
    raw_children = obj.get("children", [])
    if not isinstance(raw_children, list):
        raise WhatIfError(f"{_where(file, k('children'))}: {type(raw_children).__name__} is not accepted; "
                          "accepted: a list of associations")
    if user and raw_children:
        raise WhatIfError(f"{_where(file, k('children'))}: a user has no children; accepted: an account "
                          "(\"user\": false) for a subtree")
    children = tuple(_node(c, file, f"{k('children')}[{i}]", depth + 1, count) for i, c in enumerate(raw_children))
    seen: dict[tuple[str, bool], int] = {}
    for i, c in enumerate(children):
        if (c.name, c.user) in seen:
            raise WhatIfError(f"{_where(file, k('children') + f'[{i}].name')}: {c.name!r} appears twice "
                              f"under {name!r} (also children[{seen[(c.name, c.user)]}]); accepted: unique names")
        seen[(c.name, c.user)] = i
    usage = 0.0
    if "usage" in obj:
        usage = _number(obj["usage"], file, k("usage"), 0, MAX_USAGE, f"a number from 0 to {MAX_USAGE:g}")
    if children:
        total = math.fsum(c.usage for c in children)
        if "usage" in obj and not is_root and not math.isclose(usage, total, rel_tol=1e-9, abs_tol=1e-9):
            raise WhatIfError(f"{_where(file, k('usage'))}: {obj['usage']} is not the sum of its children's usage "
                              f"({total:g}); accepted: that sum, or leave it out (an account's usage is its children's)")
        usage = total
    return fairshare.Node(name=name, shares=shares, usage=usage, user=user, children=children)


def share_rows(root: fairshare.Node, algorithm: str = "fair_tree") -> list[dict[str, Any]]:
    if algorithm not in fairshare.ALGORITHMS:
        raise WhatIfError(f"--algorithm {algorithm!r}; accepted: {', '.join(fairshare.ALGORITHMS)}")
    rows = fairshare.compute(root, algorithm)  # type: ignore[arg-type]
    return [{
        "path": r.path,
        # sshare's Account column: a user's account, or the account itself
        "account": (r.path.rsplit("/", 2)[-2] or root.name) if r.user else r.name,
        "user": r.name if r.user else None,
        "raw_shares": r.raw_shares,
        "norm_shares": r.norm_shares,
        "raw_usage": r.raw_usage,
        "norm_usage": r.norm_usage,
        "effectv_usage": r.effectv_usage,
        "level_fs": _json_float(r.level_fs),
        "fairshare": r.fairshare,
    } for r in rows]


def _json_float(v: float | None) -> float | str | None:
    if v is None:
        return None
    return "inf" if math.isinf(v) else v


# ------------------------------------------------------------------ priority explain

_EXPLAIN_KEYS = ("weights", "factors", "jobsize_inputs", "tres_weights", "tres_factors", "nice", "site_factor")
_JOBSIZE_KEYS = ("min_nodes", "nodes_total", "cpus", "cpus_total", "favor_small", "small_relative_to_time",
                 "time_limit_min")


def parse_explain(data: Any, file: str = "explain") -> tuple[priority.Weights, priority.Factors]:
    obj = _object(data, file, "", _EXPLAIN_KEYS)
    w = _object(obj.get("weights", {}), file, "weights", priority.FACTORS)
    f = _object(obj.get("factors", {}), file, "factors", priority.FACTORS)
    weights = {n: _whole(w.get(n, 0), file, f"weights.{n}", 0, priority.UINT32_MAX) for n in priority.FACTORS}
    factors = {n: _number(f.get(n, 0.0), file, f"factors.{n}", 0.0, 1.0, "a number from 0 to 1")
               for n in priority.FACTORS}
    if "jobsize_inputs" in obj:
        if "jobsize" in f:
            raise WhatIfError(f"{file}: factors.jobsize: given with jobsize_inputs; accepted: one of the two")
        factors["jobsize"] = _jobsize(_object(obj["jobsize_inputs"], file, "jobsize_inputs", _JOBSIZE_KEYS), file)
    tw = _object(obj.get("tres_weights", {}), file, "tres_weights", None)
    tf = _object(obj.get("tres_factors", {}), file, "tres_factors", None)
    for key, table in (("tres_weights", tw), ("tres_factors", tf)):
        if len(table) > MAX_TRES:
            raise WhatIfError(f"{file}: {key}: {len(table)} TRES; accepted: at most {MAX_TRES}")
        for name in table:
            if not 1 <= len(name) <= MAX_NAME_CHARS or not re.match(r"^[a-z][a-z0-9_]*(/[A-Za-z0-9_.:-]+)?$", name):
                raise WhatIfError(f"{file}: {key}.{name}: not a TRES name; accepted: cpu, mem, node, "
                                  "gres/gpu, gres/gpu:a100, license/NAME, ...")
    tres_weights = {n: _number(v, file, f"tres_weights.{n}", 0.0, float(priority.UINT32_MAX),
                               f"a number from 0 to {priority.UINT32_MAX}") for n, v in tw.items()}
    tres_factors = {n: _number(v, file, f"tres_factors.{n}", 0.0, 1.0, "a number from 0 to 1") for n, v in tf.items()}
    for n in tres_factors:
        if n not in tres_weights:
            raise WhatIfError(f"{file}: tres_factors.{n}: no weight in tres_weights; accepted: a TRES that "
                              f"tres_weights names ({', '.join(tres_weights) or 'none'})")
    nice = _whole(obj.get("nice", 0), file, "nice", -MAX_NICE, MAX_NICE)
    site = _whole(obj.get("site_factor", 0), file, "site_factor", 0, MAX_SITE)
    return (priority.Weights(tres=tres_weights, **weights),
            priority.Factors(tres=tres_factors, site=site, nice=nice, **factors))


def _jobsize(js: dict[str, Any], file: str) -> float:
    k = "jobsize_inputs."
    nodes_total = _whole(js.get("nodes_total", 1), file, k + "nodes_total", 1, 10_000_000)
    cpus_total = _whole(js.get("cpus_total", 1), file, k + "cpus_total", 1, 2**32 - 1)
    min_nodes = _whole(js.get("min_nodes", 1), file, k + "min_nodes", 0, nodes_total)
    cpus = _whole(js.get("cpus", 0), file, k + "cpus", 0, cpus_total)
    flags = {}
    for name in ("favor_small", "small_relative_to_time"):
        v = js.get(name, False)
        if not isinstance(v, bool):
            raise WhatIfError(f"{file}: {k}{name}: {json.dumps(v)[:40]} is not accepted; accepted: true or false")
        flags[name] = v
    limit = js.get("time_limit_min")
    if limit is not None:
        limit = _whole(limit, file, k + "time_limit_min", 1, 2**32 - 2)
    return priority.jobsize_factor(min_nodes, nodes_total, cpus, cpus_total, favor_small=flags["favor_small"],
                                   relative_to_time=flags["small_relative_to_time"], time_limit_min=limit)


def explain(weights: priority.Weights, factors: priority.Factors) -> dict[str, Any]:
    """`sprio -l` for one job: the priority, each weighted factor, and the factors themselves."""
    p = priority.priority(weights, factors)
    return {
        "priority": p.priority,
        "site": p.site,
        "age": p.weighted["age"],
        "assoc": p.weighted["assoc"],
        "fairshare": p.weighted["fairshare"],
        "jobsize": p.weighted["jobsize"],
        "partition": p.weighted["partition"],
        "qos": p.weighted["qos"],
        "nice": p.nice,
        "tres": p.weighted_tres,
        "factors": {**{n: getattr(factors, n) for n in priority.FACTORS}, "tres": dict(factors.tres)},
    }
