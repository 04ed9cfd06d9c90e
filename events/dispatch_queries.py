"""Client side of the dispatch service's queries (NATS request-reply), for the CLI and the API.

The dispatch service (services/dispatch/, platform) answers on `naming.query_subject(stage,
"dispatch", <query>)` from the state it keeps current, so a read costs the same however long the
log is; docs/dispatch.md, *Reads*, has the shapes:

- `queue`: {policy, priority, pending: [...], queues: [...]}: the pending tasks in decision order
  with why each waits and its priority factors, and each queue's quota in use;
- `share` ({algorithm?}): {algorithm, rows}: the fairshare tree;
- `budgets`: {budgets: [...]}: each budget's spend in its period.

`min_seq` (every query): answer only once the service has folded every event it reads up to that
stream sequence (the caller's `last_seq`: as fresh as folding the log itself), waiting at most
`wait_s`; past the wait it answers an error, and the caller folds the log itself.
"""

from __future__ import annotations

from typing import Any

from .bus import Bus

SERVICE = "dispatch"
QUERIES = ("queue", "share", "budgets")
WAIT_S = 5.0  # how long the service waits to catch up to `min_seq` (it folds events in ms)


async def ask(bus: Bus, query: str, params: dict[str, Any] | None = None, min_seq: int | None = None,
              timeout: float = 10.0) -> dict[str, Any]:
    """One of QUERIES; raises when no dispatch service answers in `timeout` or it answers an error."""
    if query not in QUERIES:
        raise ValueError(f"no dispatch query {query!r} (one of {', '.join(QUERIES)})")
    payload = dict(params or {})
    if min_seq is not None:
        payload["min_seq"] = int(min_seq)
    body = await bus.request(SERVICE, query, payload, timeout=timeout)
    if not isinstance(body, dict):
        raise RuntimeError(f"dispatch {query}: an answer that is not an object")
    return body
