"""What the API server reads of dispatch beyond its fold (services/api/dispatch_reads.py, the
`skypurza.dispatch_reads` entry points): the fairshare tree `spz dispatch share` prints, over the
same fold of the log, so the console's dispatch page shows what the CLI does.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from skypurza.events.dispatch_policy import PriorityConfig

from . import order
from .state import DispatchState
from .whatif import share_rows as _rows


def share_rows(state: DispatchState, now: datetime) -> dict[str, Any]:
    """The fairshare tree (root -> team -> user) at `now`, as `spz dispatch share -o json` rows,
    and the algorithm it was computed with (the policy's; fair_tree without a priority section)."""
    cfg = (state.policy.priority if state.policy is not None else None) or PriorityConfig()
    usage = state.fs_usage.at(now.timestamp())
    return {"algorithm": cfg.algorithm, "rows": _rows(order.share_tree(cfg, state.members, usage), cfg.algorithm)}
