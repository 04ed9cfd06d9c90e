"""A command that waits on the control plane notices when it is gone, and says so in one line.

Every command runs its async part through `context.run_async`, that is under `guarded()`.
The buses it connects (`control.connect_bus` registers each with `watch`) are looked at every
POLL_S: once one has been disconnected for the reconnect grace (RECONNECT_GRACE_S, 5 s;
`SKYPURZA_CLI_RECONNECT_GRACE_S`), the command is cancelled and the user reads what happened
and what still runs (the hint a command gave with `still_running`), exit code
EXIT_LOST_CONTROL_PLANE. A server that is back within the grace (a restart) is simply
reconnected to and the command goes on. A connection error that ends the command by itself
(nats-py's, or the socket's) becomes the same message rather than a traceback.

The client pings every PING_INTERVAL_S, so even a server that hangs without closing the
connection is noticed (two missed pings, then the grace).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")

# sysexits.h EX_UNAVAILABLE: the service a command needs is not there. Distinct from the job
# codes (0, 100-103), from 1 (bad input, refused requests) and from 130 (Ctrl-C).
EXIT_LOST_CONTROL_PLANE = 69
RECONNECT_GRACE_S = 5.0
MAX_RECONNECT_GRACE_S = 600.0
PING_INTERVAL_S = 5.0
POLL_S = 0.2
CANCEL_WAIT_S = 3.0
CONNECT_TIMEOUT_S = 10.0
GRACE_ENV = "SKYPURZA_CLI_RECONNECT_GRACE_S"

DEFAULT_HINT = ("what was already submitted is in the event log and goes on when the control plane is back; "
                "check with spz status")


class LostControlPlane(Exception):
    """The command gave up on the control plane; str() is the message for the user."""


class _Watched:
    def __init__(self) -> None:
        self.buses: list[Any] = []
        self.hint: str | None = None


_watched = _Watched()  # one command per process


async def bounded_connect(connect: Coroutine[Any, Any, T], url: str) -> T:
    """The first connection, within CONNECT_TIMEOUT_S (nats-py alone, told to reconnect for
    ever, also tries to connect for ever)."""
    try:
        return await asyncio.wait_for(connect, timeout=CONNECT_TIMEOUT_S)
    except (asyncio.TimeoutError, TimeoutError):
        raise LostControlPlane(f"cannot reach the control plane: nothing answered at {url} within "
                               f"{CONNECT_TIMEOUT_S:.0f} s. Check it with spz api status (with SKYPURZA_NATS_URL: "
                               "is that NATS server up?)") from None


def watch(bus: Any) -> Any:
    """Register a bus of this command; returns it."""
    _watched.buses.append(bus)
    return bus


def still_running(hint: str) -> None:
    """What keeps running if the command has to give up from now on (one clause, no period)."""
    _watched.hint = hint


def reset() -> None:
    _watched.buses.clear()
    _watched.hint = None


def grace_s(env: dict[str, str] | None = None) -> float:
    raw = (os.environ if env is None else env).get(GRACE_ENV, "")
    try:
        value = float(raw) if raw.strip() else RECONNECT_GRACE_S
    except ValueError:
        return RECONNECT_GRACE_S
    if value != value:  # NaN
        return RECONNECT_GRACE_S
    return min(max(value, 0.5), MAX_RECONNECT_GRACE_S)


def is_connection_error(exc: BaseException) -> bool:
    """An error that means the NATS server is not there (or not answering), not a refusal.
    NoRespondersError is not one: the server answered that no *service* listens on a request
    subject (one service down while NATS is up), which `top_level_error` says as such."""
    import nats.errors as ne
    from nats.js.errors import NoStreamResponseError

    connection = (ne.ConnectionClosedError, ne.NoServersError, ne.StaleConnectionError, ne.TimeoutError,
                  ne.FlushTimeoutError, ne.OutboundBufferLimitError,
                  ne.ConnectionReconnectingError, ne.ConnectionDrainingError, ne.SecureConnFailedError,
                  NoStreamResponseError)
    return isinstance(exc, (ConnectionError, TimeoutError, asyncio.TimeoutError, *connection))


def lost_message(*, url: str | None, down_s: float | None, hint: str | None, cause: BaseException | None = None) -> str:
    where = f"the NATS server at {url}" if url else "the NATS server"
    if down_s is None or down_s == float("inf"):
        what = f"{where} closed the connection"
    else:
        what = f"no answer from {where} for {down_s:.0f} s"
    if cause is not None:
        what += f": {type(cause).__name__}" + (f": {cause}" if str(cause) else "")
    then = (hint or DEFAULT_HINT).rstrip(".")
    again = ("Once that NATS server is back, run the command again." if _external() else
             "Start it again with spz api start (any spz command starts it).")
    return f"lost the control plane ({what}). {then[:1].upper()}{then[1:]}. {again}"


def stopped(what: str) -> LostControlPlane:
    """The control plane was seen stopped (not only unreachable): the same exit, its own reason."""
    then = (_watched.hint or DEFAULT_HINT).rstrip(".")
    return LostControlPlane(f"lost the control plane ({what}). {then[:1].upper()}{then[1:]}. "
                            "Start it again with spz api start (any spz command starts it).")


def _external() -> bool:
    """The CLI talks to a NATS it did not start (SKYPURZA_NATS_URL, `nats_url` in the config)."""
    try:
        from skypurza.events.config import load_config

        return bool(load_config().nats_url)
    except Exception:
        return bool(os.environ.get("SKYPURZA_NATS_URL"))


def _url(bus: Any) -> str | None:
    try:
        server = bus.nc.connected_url or bus.nc._current_server.uri  # noqa: SLF001 (only for the message)
        return f"{server.scheme}://{server.hostname}:{server.port}"
    except Exception:
        return None


def _most_unreachable() -> tuple[Any, float]:
    worst, down = None, 0.0
    for bus in _watched.buses:
        try:
            d = bus.unreachable_for()
        except Exception:
            continue
        if d > down:
            worst, down = bus, d
    return worst, down


async def _cancel(task: asyncio.Future) -> None:
    task.cancel()
    await asyncio.wait({task}, timeout=CANCEL_WAIT_S)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: what a cancelled command raised on its way out is no news


async def _close_all() -> None:
    for bus in list(_watched.buses):
        if bus.nc.is_closed:
            continue
        try:
            await asyncio.wait_for(bus.nc.close(), timeout=2.0)
        except BaseException:  # closing what is lost: nothing left to do
            pass


def _say(text: str) -> None:
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except OSError:
        pass


async def guarded(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; raise LostControlPlane when its control plane is gone."""
    grace = grace_s()
    main = asyncio.ensure_future(coro)
    warned = False
    try:
        while True:
            done, _ = await asyncio.wait({main}, timeout=POLL_S)
            if done:
                break
            bus, down = _most_unreachable()
            if bus is None:
                if warned:
                    _say("… connected to the control plane again")
                warned = False
                continue
            if not warned and down != float("inf"):
                warned = True
                _say(f"… lost the connection to the control plane; waiting up to {grace:.0f} s for it to come back")
            if down >= grace:
                url = _url(bus)
                await _cancel(main)
                raise LostControlPlane(lost_message(url=url, down_s=down, hint=_watched.hint))
        try:
            return main.result()
        except LostControlPlane:
            raise
        except Exception as exc:
            if is_connection_error(exc):
                bus, down = _most_unreachable()
                raise LostControlPlane(lost_message(url=_url(bus) if bus else None, down_s=down or None,
                                                    hint=_watched.hint, cause=exc)) from None
            raise
    finally:
        if not main.done():
            await _cancel(main)
        await _close_all()
        reset()


def top_level_error(exc: BaseException) -> tuple[int, str]:
    """What `spz` prints, and exits with, for an exception no command handled (never a traceback)."""
    if isinstance(exc, LostControlPlane):
        return EXIT_LOST_CONTROL_PLANE, str(exc)
    if is_connection_error(exc):
        detail = f"{type(exc).__name__}" + (f": {exc}" if str(exc) else "")
        return EXIT_LOST_CONTROL_PLANE, (f"cannot talk to the control plane ({detail}). Check it with spz api status; "
                                         "start it with spz api start.")
    import nats.errors as ne

    if isinstance(exc, ne.NoRespondersError):
        return 1, ("no service answered the request (NATS is up, but the service that answers it is not running); "
                   "see spz api status and spz api logs")
    if isinstance(exc, ne.Error):
        return 1, f"the control plane refused the request: {type(exc).__name__}: {exc}"
    if type(exc).__name__ == "ControlPlaneError":
        return 1, str(exc)
    from skypurza.events.bus import CANNOT_CONNECT

    # SKYPURZA_NATS_CREDS names a missing or broken file (which, and why), or a user the bus refuses.
    if isinstance(exc, CANNOT_CONNECT):
        return 1, str(exc)
    from skypurza.events.config import ConfigError

    if isinstance(exc, ConfigError):  # a broken config.yaml or a bad setting: its own line says where
        return 1, str(exc)
    return 1, (f"internal error: {type(exc).__name__}: {exc} (set SKYPURZA_DEBUG=1 to see where; "
               "please report it)")
