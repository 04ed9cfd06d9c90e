"""nats-py without its websocket transport: importing this module imports nats-py so that its
`import aiohttp` (only the ws:// transport needs it) finds nothing.

Why: aiohttp costs 100-170 ms of every command's start (it builds an SSL context at import), and
the bus only speaks nats:// over TCP. nats-py already runs without aiohttp installed
(`nats/aio/transport.py`: `aiohttp = None`); this makes the same true when it is installed.
aiohttp itself stays importable afterwards (aiobotocore needs it): only nats-py's copy of the
name is None. Import it before anything else of nats-py (events/bus.py does, first).
"""

from __future__ import annotations

import sys


def _import_nats_without_aiohttp() -> None:
    if "nats.aio.transport" in sys.modules or "aiohttp" in sys.modules:
        return  # too late, or aiohttp is loaded anyway: nothing to save
    sys.modules["aiohttp"] = None  # type: ignore[assignment]  # `import aiohttp` raises ImportError
    try:
        import nats.aio.transport  # noqa: F401
    finally:
        if sys.modules.get("aiohttp", 0) is None:
            del sys.modules["aiohttp"]


_import_nats_without_aiohttp()
