"""httpx without what the CLI never uses: importing this module imports httpx so that httpcore's
`import trio` and httpx's own command line (`httpx._main`: click, rich's syntax and progress,
pygments) find nothing.

Why: trio alone cost about 0.5 s of every `spz` command that talks to an API server (httpcore
probes it at import for its async backends), and the CLI's client is httpx's synchronous one,
which needs neither. Both packages already run without them (`trio = None`, a stub `main`);
this makes the same true when they are installed. trio stays importable afterwards: only the
copies these modules hold are None. Import it before anything else of httpx
(cli/apitransport.py does, first), as events/natslight.py does for nats-py.
"""

from __future__ import annotations

import sys

_SKIPPED = ("trio", "httpx._main")


def _import_httpx_lean() -> None:
    if "httpx" in sys.modules or "httpcore" in sys.modules:
        return  # too late: nothing to save
    blocked = [name for name in _SKIPPED if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]  # `import NAME` raises ImportError
    try:
        import httpcore  # noqa: F401  (httpx imports it only when a client is made: here, under the block)
        import httpx  # noqa: F401
    finally:
        for name in blocked:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


_import_httpx_lean()
