"""Whether a secured bus refuses an action of a user: the check the secured-bus tests share
(tests/test_agent_creds.py, tests/test_compose_secured.py, tests/test_secured_bus.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import nats

from skypurza.events import naming
from skypurza.events.natscreds import BusCredentials

VIOLATION = "permissions violation"


async def refused(url: str, creds: BusCredentials, action: Any) -> bool:
    """Whether the server refuses `action` of `creds`'s user, on a connection of its own (nats-py
    closes one the server sent a permissions error on): a violation, or a JetStream request that
    got no reply because the server dropped it. `url`: one server or a comma-separated cluster."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(url.split(","), user=creds.user, password=creds.password,
                            inbox_prefix=naming.inbox_prefix(creds.user), error_cb=on_error, allow_reconnect=False,
                            connect_timeout=3)
    failed = ""
    try:
        await asyncio.wait_for(action(nc), 3)
        await nc.flush(timeout=2)
        await asyncio.sleep(0.3)
    except Exception as exc:
        failed = f"{type(exc).__name__} {exc}"
    said = " ".join([*errors, str(nc.last_error or ""), failed]).lower()
    if not nc.is_closed:
        await nc.close()
    return VIOLATION in said or "timeout" in said
