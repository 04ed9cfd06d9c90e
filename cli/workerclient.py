"""The client of the warm CLI worker (cli/warmworker.py): hand a command to it, or say "cold".

Stdlib only (it runs before anything else of `spz`): find the stage's socket, send the command
line, the whole environment, the umask, and fds 0/1/2 + the working directory; once a child is
ready say `go`, pass SIGINT/SIGTERM/SIGHUP/SIGQUIT on to its process group (Ctrl-Z stops it
and `fg` resumes it), and end as it ended: its exit code, or the signal that killed it, raised
again on this process with the default disposition (what a shell expects).

`run(argv)` returns only when nothing ran (no socket, refused, stale, busy, a protocol error,
no `ready` within HANDSHAKE_S): the caller then runs the command in-process, as it always did.
After `go` it never returns: a command runs once, in one place.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from . import workerproto as proto

TYPE_CHECKING = False  # typing's, without importing typing (~3 ms of every command)
if TYPE_CHECKING:
    import socket

STATS_ENV = "SKYPURZA_CLI_WORKER_STATS"
_CONFIG_STAGE = rb"^stage:[ \t]*['\"]?([A-Za-z0-9-]+)['\"]?[ \t]*(#.*)?$"


def stage_of(env: os._Environ | dict[str, str]) -> str:
    """The stage the command will use, as events/config.py finds it (SKYPURZA_STAGE, else
    config.yaml's top-level `stage:`, else the default), without YAML: which worker to ask. The
    child finds the stage again itself, so a guess that differs only picks another stage's
    worker (the same code), never another stage's data."""
    from skypurza.events import naming

    if env.get("SKYPURZA_STAGE"):
        return env["SKYPURZA_STAGE"]
    try:
        with open(naming.home_dir() / "config.yaml", "rb") as f:
            text = f.read(65536)
    except OSError:
        return naming.DEFAULT_STAGE
    import re

    found = re.search(_CONFIG_STAGE, text, re.M)
    return found.group(1).decode() if found else naming.DEFAULT_STAGE


def socket_path(env: os._Environ | dict[str, str]) -> Path | None:
    from skypurza.events import naming

    try:
        return naming.cli_worker_socket(stage_of(env))
    except ValueError:  # a stage the CLI will refuse: it says so, cold
        return None


def _stdio_spec() -> list[dict] | None:
    """How this interpreter set up sys.stdin/stdout/stderr (the child builds the same)."""
    spec = []
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        if stream is None or not hasattr(stream, "encoding"):
            return None
        spec.append({"encoding": stream.encoding, "errors": stream.errors,
                     "line_buffering": bool(stream.line_buffering),
                     "write_through": bool(getattr(stream, "write_through", False))})
    return spec


def _ignored_signals() -> list[str]:
    out = []
    for name in proto.INHERITED_SIGNALS:
        if signal.getsignal(getattr(signal, name)) is signal.SIG_IGN:
            out.append(name)
    return out


def request(argv0: str, argv: list[str]) -> dict | None:
    stdio = _stdio_spec()
    if stdio is None:
        return None
    umask = os.umask(0)
    os.umask(umask)
    main = sys.modules.get("__main__")
    return {"protocol": proto.PROTOCOL, "argv": [argv0, *argv], "env": dict(os.environ), "umask": umask,
            "path": list(sys.path), "main_package": getattr(main, "__package__", None), "stdio": stdio,
            "ignored": _ignored_signals(),
            "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
            "interpreter": proto.interpreter_facts()}


def run(argv: list[str]) -> None:
    """Run `spz argv` in the warm worker and exit as it did; return when it could not start."""
    if not proto.wanted(argv, os.environ):
        return
    path = socket_path(os.environ)
    if path is None or not os.path.exists(path):  # no plane, or one without a worker: cold, at no cost
        return
    try:
        os.fstat(0), os.fstat(1), os.fstat(2)
        cwd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # a closed std fd or a working directory that is gone: cold says what it says
        return
    try:
        started = _handshake(str(path), sys.argv[0], argv, cwd)
    finally:
        os.close(cwd)
    if started is None:
        return
    _wait(started)  # never returns


def _handshake(path: str, argv0: str, argv: list[str], cwd: int) -> tuple[socket.socket, int] | None:
    try:
        sock = proto.connect(path, proto.HANDSHAKE_S)
    except OSError:
        return None
    try:
        message = request(argv0, argv)
        if message is None:
            sock.close()
            return None
        proto.send(sock, message, (0, 1, 2, cwd))
        answer, _ = proto.recv(sock)
        if not answer or not isinstance(answer.get("ready"), int) or answer["ready"] <= 1:
            sock.close()
            return None
        pid = answer["ready"]
        before = _install_forwarding(pid)
        try:
            proto.send(sock, {"go": True})
        except BaseException:
            for sig, handler in before.items():
                signal.signal(sig, handler)
            raise
    except (OSError, ValueError, proto.ProtocolError):  # timeout included: nothing ran yet
        sock.close()
        return None
    except KeyboardInterrupt:  # Ctrl-C before the command started: as a Ctrl-C during start-up
        sock.close()
        _die_of(signal.SIGINT)
    sock.settimeout(None)  # committed: the command runs as long as it runs
    return sock, pid


def _install_forwarding(pid: int) -> dict:
    """Pass the terminal's signals on to the command's process group; the handlers replaced."""
    before = {}

    def forward(signum: int, _frame: object) -> None:
        try:
            os.killpg(pid, signum)
        except ProcessLookupError:
            pass

    for name in proto.FORWARDED_SIGNALS:
        sig = getattr(signal, name)
        if signal.getsignal(sig) is not signal.SIG_IGN:
            before[sig] = signal.signal(sig, forward)
    if signal.getsignal(signal.SIGTSTP) is not signal.SIG_IGN:
        def suspend(_signum: int, _frame: object) -> None:
            # Ctrl-Z: the command stops with this process, and goes on when `fg` continues it.
            try:
                os.killpg(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
            signal.signal(signal.SIGTSTP, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTSTP)
            signal.signal(signal.SIGTSTP, suspend)
            try:
                os.killpg(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

        before[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, suspend)
    return before


def _wait(handshake: tuple[socket.socket, int]) -> None:
    sock, _pid = handshake
    try:
        answer, _ = proto.recv(sock)
    except (OSError, ValueError, proto.ProtocolError):
        answer = None
    if answer is None:  # the worker's child was killed under us: no status to give
        os.write(2, b"error: the CLI worker's child went away without an exit status (SKYPURZA_CLI_WORKER=0 runs commands in-process)\n")
        os._exit(1)
    _note(answer)
    if isinstance(answer.get("signal"), int):
        _die_of(answer["signal"])
    code = answer.get("exit")
    os._exit(code if isinstance(code, int) and 0 <= code <= 255 else 1)


def _note(answer: dict) -> None:
    """With SKYPURZA_CLI_WORKER_STATS=FILE, one JSON line per command the worker ran (its exit
    and CPU seconds): how tests and bench/latency.py know the warm path was taken."""
    path = os.environ.get(STATS_ENV)
    if not path:
        return
    import json

    try:
        with open(path, "a") as f:
            f.write(json.dumps({"argv": sys.argv[1:], **answer}) + "\n")
    except OSError:
        pass


def _die_of(signum: int) -> None:
    """End as a process killed by `signum` (what the shell prints and `$?` is: 128+n)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    try:
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
    except (OSError, ValueError):
        pass
    os._exit(128 + signum)
