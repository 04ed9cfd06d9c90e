"""The web console's files (services/api/console/: HTML, CSS, JavaScript modules), served at `/console/`.

They are prebuilt and committed, shipped as package data: `pip install` gives a working console
with no Node toolchain and no build step (docs/DESIGN.md, *The web console*). The page calls only
the public /api/v1 with the user's token, so the server adds nothing here but the files and a
strict Content-Security-Policy: scripts, styles and requests from this origin only, no inline
script, no framing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.staticfiles import StaticFiles

CONSOLE_DIR = Path(__file__).resolve().parent / "console"
CONSOLE_PATH = "/console"

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # an upgrade's files are picked up at once (they are small)
}


class ConsoleFiles(StaticFiles):
    """The console's static files, each with the security headers."""

    def __init__(self) -> None:
        super().__init__(directory=CONSOLE_DIR, html=True)

    async def get_response(self, path: str, scope: Any) -> Any:
        response = await super().get_response(path, scope)
        response.headers.update(SECURITY_HEADERS)
        return response
