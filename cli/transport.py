"""The CLI's transport seam: a verb talks to the embedded bus, or to the API server configured
(`spz api login`, SKYPURZA_API_SERVER / SKYPILOT_API_SERVER_ENDPOINT with SKYPURZA_API_TOKEN;
cli/apiclient.py `resolve` decides).

`api()` is None on the embedded default: the verb runs as it always has, on the bus. Otherwise it
is an `ApiTransport` (cli/apitransport.py, over httpx) and the verb goes through the server's
routes (cli/via_api.py), printing the same lines and exiting with the same codes. httpx is only
imported once a server is configured: `spz --help` and every embedded command stay light.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .context import fail

if TYPE_CHECKING:
    from .apiclient import Endpoint
    from .apitransport import ApiTransport


def endpoint() -> "Endpoint | None":
    """The configured API server, or None; a malformed configuration is one line and exit 1."""
    from .apiclient import ApiClientError, load_login, resolve

    try:
        return resolve(os.environ, load_login())
    except ApiClientError as exc:
        raise fail(str(exc))


def api() -> "ApiTransport | None":
    ep = endpoint()
    if ep is None:
        return None
    from .apitransport import ApiTransport

    return ApiTransport(ep)
