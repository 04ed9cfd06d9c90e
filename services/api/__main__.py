"""`python -m skypurza.services.api --nats URL --stage S --host 127.0.0.1 --port P`: the API server.

One uvicorn process serving `create_app` (services/api/app.py). It checks that the bus answers
before it listens: a bus it cannot reach is one line and exit 1, never a traceback.

Tokens only, unless `--embedded` (the embedded control plane, `spz api start` without
--deploy): then a caller from loopback with no token is the OS user, as admin — as the CLI on the
embedded bus is. `--control-plane DIR` marks the process as a stage's (cli/planeprocs.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from skypurza.events import naming

DEFAULT_PORT = 46580
CONNECT_TIMEOUT_S = 5.0


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m skypurza.services.api", description="The SkyPurza API server.")
    p.add_argument("--nats", required=True, help="NATS URL of the stage's bus, e.g. nats://127.0.0.1:4222")
    p.add_argument("--stage", default=naming.DEFAULT_STAGE, help="The stage (default: dev).")
    p.add_argument("--host", default="127.0.0.1", help="Address to listen on (default: 127.0.0.1).")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"Port (default: {DEFAULT_PORT}).")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--embedded", action="store_true",
                   help="An unauthenticated caller from loopback is the OS user, as admin (spz api start).")
    p.add_argument("--control-plane", default=None, help="The stage's state directory (spz api stop finds us).")
    args = p.parse_args(argv)
    try:
        naming.check_stage(args.stage)
    except ValueError as exc:
        p.error(str(exc))
    if not 1 <= args.port <= 65535:
        p.error(f"--port must be from 1 to 65535, found {args.port}")
    return args


async def _bus_answers(url: str, stage: str) -> str | None:
    from skypurza.events.bus import Bus

    try:
        bus = await asyncio.wait_for(Bus.connect(url, stage, source="/api-check", max_reconnect_attempts=0,
                                                 connect_timeout=CONNECT_TIMEOUT_S), CONNECT_TIMEOUT_S * 2)
    except (asyncio.TimeoutError, TimeoutError):
        return f"no answer in {CONNECT_TIMEOUT_S:.0f} s"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    await bus.close()
    return None


def _os_principal():
    """The embedded default's principal: the OS user (SKYPURZA_USER / config) as admin."""
    from skypurza.events.config import load_config

    from .identity import Principal

    cfg = load_config()
    user = cfg.user
    team = cfg.team_of(user) or "local"
    try:
        naming.check_principal_name(user, "user")
        naming.check_principal_name(team, "team")
    except ValueError:  # an OS name the bus cannot carry as one token: a stable stand-in
        user, team = naming.subject_token(user.lower())[:63] or "local", "local"
    return Principal(user=user, team=team, role="admin")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    problem = asyncio.run(_bus_answers(args.nats, args.stage))
    if problem is not None:
        sys.stderr.write(f"error: cannot reach the bus at {args.nats}: {problem}\n")
        return 1
    import uvicorn

    from .app import ApiSettings, create_app
    from .routes_metrics import MIN_TOKEN_CHARS

    metrics_token = os.environ.get("SKYPURZA_API_METRICS_TOKEN") or None
    if metrics_token is not None and (len(metrics_token) < MIN_TOKEN_CHARS or len(metrics_token) > 512
                                      or any(c.isspace() for c in metrics_token)):
        sys.stderr.write(f"error: SKYPURZA_API_METRICS_TOKEN: {MIN_TOKEN_CHARS} to 512 characters, no spaces "
                         "(a scrape-only secret for GET /metrics)\n")
        return 2
    app = create_app(ApiSettings(nats_url=args.nats, stage=args.stage,
                                 local_admin=_os_principal() if args.embedded else None, metrics_token=metrics_token))
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
