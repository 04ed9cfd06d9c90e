"""The warm CLI worker (`python -m skypurza.cli.warmworker`): `spz` without Python's imports.

Why: every `spz` command paid ~0.25-0.35 s of CPU for the interpreter and typer, click, rich,
pydantic, nats-py and our models before it did anything. While a stage's control plane runs,
its supervisor (cli/supervisor.py) also runs this process: it imports all of that once, listens
on the stage's AF_UNIX socket (naming.cli_worker_socket, 0600, its own user only), and forks per
command, as build tools' daemons do. The client is cli/workerclient.py (docs/cli.md).

Per request, single-threaded and with no event loop before a fork:
- refused unless the peer is this user (SO_PEERCRED); "stale" (then this process exits and the
  supervisor starts a fresh one) when a loaded skypurza file, the package or a sys.path folder
  changed since start; "cold" when the client's interpreter differs, or its environment differs
  in a variable a pre-imported module read at import (recorded here: its value may be baked into
  a module) or any PYTHON* variable; "busy" past MAX_RUNNING. The client then runs cold.
- else a monitor is forked: it becomes the client (its fds 0/1/2, working directory, whole
  environment, umask, sys.path, sys.argv, standard streams as the client's interpreter built
  them) and forks the command, in a process group of its own, with the client's signal
  dispositions and mask. The command waits for the client's `go` (sent only after `ready`:
  nothing runs twice), then runs `app()` as cli/script.py does and exits as a Python process
  does. The monitor reports the exit code or the signal, and if the client goes away (killed,
  terminal closed) it sends the command's group SIGINT, as a Ctrl-C, then SIGKILL after
  KILL_GRACE_S: no orphaned command keeps running. Monitors outlive this process (a restart
  for stale code never cuts a command short).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import select
import signal
import socket
import struct
import sys
from datetime import datetime, timezone
from pathlib import Path

from skypurza.events import naming

from . import workerproto as proto
from .planeprocs import CONTROL_PLANE_FLAG

MAX_RUNNING = 32
WATCH_ENV = "SKYPURZA_CLI_WORKER_WATCH"
REQUEST_TIMEOUT_S = 0.5  # a client that does not send its request within this is dropped
KILL_GRACE_S = 3.0
REAP_EVERY_S = 1.0
COMMAND_NAME = b"spz-command"  # /proc/<pid>/comm of a command and its monitor (cli/planeprocs.py)
MONITOR_NAME = b"spz-monitor"

# Pre-imported: the libraries every command needs, then every module of skypurza.cli and
# skypurza.events (own_modules). Each is checked for purity at import by recording the
# environment variables it reads (env_mismatch).
PREIMPORT = (
    "typer", "typer.rich_utils", "click", "rich.console", "rich.table", "rich.text", "rich.markup",
    "rich.progress", "rich.live", "rich._emoji_codes", "pydantic", "pydantic.type_adapter", "yaml", "asyncio",
    "json", "urllib.request", "http.client", "concurrent.futures.thread", "queue", "pwd",
    "skypurza.cli.main",
)
# Not pre-imported: the projections' DuckDB starts a thread at import (a process with threads
# must not fork), this module, and what runs as a program.
NOT_PREIMPORTED = ("skypurza.events.projection", "skypurza.cli.warmworker", "skypurza.cli.__main__")


def _log(message: str) -> None:
    sys.stderr.write(f"{datetime.now(timezone.utc).isoformat()} {message}\n")
    sys.stderr.flush()


# ------------------------------------------------------------------------ pre-import, audited

class _Recording(os._Environ):  # type: ignore[name-defined]
    """os.environ while the worker imports: every variable read is noted."""

    read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        _Recording.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        _Recording.read.add(str(key))
        return super().__contains__(key)

    def __iter__(self):
        _Recording.read.add("*")
        return super().__iter__()


def preimport(modules: tuple[str, ...] = PREIMPORT) -> frozenset[str]:
    """Import `modules` and the allowlisted commands' modules; the environment variables read
    meanwhile. A module that fails to import is skipped (the command imports it, and fails, as
    it would cold)."""
    import importlib

    from .commandtable import COMMANDS

    commands = sorted({e.module for e in COMMANDS if e.name in proto.ALLOWED or e.name in proto.ALLOWED_GROUPS})
    names = list(modules) + [f"{__package__}.{m}" for m in commands] + own_modules()
    real = os.environ.__class__
    os.environ.__class__ = _Recording
    try:
        for full in names:
            try:
                importlib.import_module(full)
            except Exception as exc:  # noqa: BLE001 - one line in the worker's log
                _log(f"not pre-imported: {full}: {type(exc).__name__}: {exc}")
        # typer's build of each command (a pydantic TypeAdapter per parameter): once, here; every
        # child starts from these click commands (cli/lazyapp.py keeps them per process).
        from .main import catalog

        for name in sorted(proto.ALLOWED | set(proto.ALLOWED_GROUPS)):
            try:
                catalog.build(name)
            except Exception as exc:  # noqa: BLE001
                _log(f"not pre-built: {name}: {type(exc).__name__}: {exc}")
        _keep_root_group()
    finally:
        os.environ.__class__ = real
    return frozenset(_Recording.read)


def _keep_root_group() -> None:
    """`app()` builds spz's root click group on every call (typer.main.get_command), and with
    every pre-registered module that is all their commands again (~0.2 s): build it once here.
    Only for spz's app, in this process and its children; the group is typer's own."""
    import typer.main

    from .main import app

    built = typer.main.get_command(app)
    build = typer.main.get_command

    def get_command(typer_instance):  # noqa: ANN001, ANN202 - typer's signature
        return built if typer_instance is app else build(typer_instance)

    typer.main.get_command = get_command


def own_modules() -> list[str]:
    """Every module of skypurza.cli and skypurza.events but NOT_PREIMPORTED (found on disk,
    nothing imported to list them)."""
    import pkgutil

    import skypurza

    found: list[str] = []

    def walk(path: list[str], prefix: str) -> None:
        for info in pkgutil.iter_modules(path, prefix):
            if info.name.startswith(NOT_PREIMPORTED):
                continue
            found.append(info.name)
            if info.ispkg:
                walk([os.path.join(path[0], info.name.rsplit(".", 1)[1])], info.name + ".")

    root = os.path.dirname(skypurza.__file__)
    for sub in ("events", "cli"):
        walk([os.path.join(root, sub)], f"skypurza.{sub}.")
    return found


def threads() -> int:
    """This process's threads (a fork copies one: a worker with more must not fork)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


# ------------------------------------------------------------------------------- stale code

def fingerprint() -> dict[str, tuple[int, int]]:
    """(mtime_ns, size) of every loaded skypurza file and of every sys.path folder a module
    was loaded from (an install or upgrade of any package changes its folder)."""
    import skypurza

    root = os.path.dirname(skypurza.__file__) + os.sep
    paths = {f for m in list(sys.modules.values())
             if isinstance(f := getattr(m, "__file__", None), str) and f.startswith(root)}
    # The folders modules were loaded from (site-packages: an install or upgrade changes them).
    entries = sorted((p for p in sys.path if p and os.path.isdir(p)), key=len, reverse=True)
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if isinstance(f, str):
            paths |= {next((e for e in entries if f.startswith(e + os.sep)), root)}
    out = {}
    for p in sorted(paths):
        try:
            st = os.stat(p)
            out[p] = (st.st_mtime_ns, st.st_size)
        except OSError:
            out[p] = (-1, -1)
    return out


def watched_too(env: dict[str, str]) -> list[str]:
    """SKYPURZA_CLI_WORKER_WATCH: more files whose change makes the worker stale (os.pathsep
    between them; tests watch a file of their own instead of touching the package)."""
    return [p for p in env.get(WATCH_ENV, "").split(os.pathsep) if p]


def changed(before: dict[str, tuple[int, int]]) -> str | None:
    """The first file whose stat differs from `before`, or None."""
    for p, seen in before.items():
        try:
            st = os.stat(p)
            now = (st.st_mtime_ns, st.st_size)
        except OSError:
            now = (-1, -1)
        if now != seen:
            return p
    return None


# ----------------------------------------------------------------------------------- worker

class _Command(BaseException):
    """Raised in a freshly forked command process: unwinds the worker's frames to main()."""

    def __init__(self, go_fd: int, message: dict) -> None:
        self.go_fd, self.message = go_fd, message


class Worker:
    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.pid = os.getpid()
        self.socket_path = naming.cli_worker_socket(stage)
        self.state_path = naming.cli_worker_state_file(stage)
        self.env = dict(os.environ)
        self.read_at_import = preimport()
        self.facts = proto.interpreter_facts()
        self.files = fingerprint()
        for extra in watched_too(self.env):
            try:
                st = os.stat(extra)
                self.files[extra] = (st.st_mtime_ns, st.st_size)
            except OSError:
                self.files[extra] = (-1, -1)
        # Everything imported so far is shared with every child: out of the collector's sight, so
        # a child's collection neither walks the whole heap nor copies its pages (copy-on-write).
        import gc

        gc.collect()
        gc.freeze()
        self.running: set[int] = set()
        self.served = 0
        self.cold: dict[str, int] = {}
        self.last_cold: str | None = None
        self.started_at = datetime.now(timezone.utc).isoformat()
        self.listener: socket.socket | None = None
        self.bound: tuple[int, int] | None = None

    # -------------------------------------------------------------------- the socket
    def bind(self) -> None:
        path = self.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            try:
                proto.connect(str(path), 0.5).close()
            except OSError:
                path.unlink(missing_ok=True)  # a dead worker's: nobody answers on it
            else:
                raise RuntimeError(f"another CLI worker answers on {path}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                sock.bind(f"/proc/self/fd/{dfd}/{path.name}")  # past AF_UNIX's 107-byte limit too
            finally:
                os.close(dfd)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(64)
        st = os.stat(path)
        self.bound = (st.st_dev, st.st_ino)
        self.listener = sock

    def unbind(self) -> None:
        """Remove the socket file if it is still this worker's (a successor may own it)."""
        if os.getpid() != self.pid or self.bound is None:
            return
        try:
            st = os.stat(self.socket_path)
            if (st.st_dev, st.st_ino) == self.bound:
                self.socket_path.unlink()
        except OSError:
            pass
        self.bound = None

    def write_state(self) -> None:
        state = {"pid": self.pid, "started_at": self.started_at, "served": self.served, "cold": self.cold,
                 "last_cold": self.last_cold, "running": len(self.running), "files": len(self.files),
                 "read_at_import": sorted(self.read_at_import)}
        tmp = self.state_path.with_name(self.state_path.name + f".{self.pid}.tmp")
        try:
            tmp.write_text(json.dumps(state, indent=2))
            tmp.replace(self.state_path)
        except OSError as exc:
            _log(f"cannot write {self.state_path}: {exc}")

    # -------------------------------------------------------------------- the loop
    def run(self) -> int:
        self.bind()
        self.write_state()
        _log(f"cli worker {self.pid} listening on {self.socket_path} ({len(self.files)} files watched; "
             f"read at import: {', '.join(sorted(self.read_at_import)) or 'nothing'})")
        try:
            while True:
                self.reap()
                ready, _, _ = select.select([self.listener], [], [], REAP_EVERY_S)
                if not ready:
                    continue
                try:
                    conn, _ = self.listener.accept()
                except OSError:
                    continue
                if self.handle(conn) == "stale":
                    return 0
        finally:
            self.unbind()

    def reap(self) -> None:
        while self.running:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.running.clear()
                return
            if pid == 0:
                return
            self.running.discard(pid)

    def refuse(self, conn: socket.socket, reason: str) -> None:
        key = reason.split(":")[0]
        self.cold[key] = self.cold.get(key, 0) + 1
        self.last_cold = reason
        try:
            proto.send(conn, {"cold": reason})
        except OSError:
            pass
        conn.close()
        self.write_state()

    def handle(self, conn: socket.socket) -> str:
        conn.settimeout(REQUEST_TIMEOUT_S)
        fds: list[int] = []
        try:
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
            if not proto.peer_allowed(uid, os.getuid()):
                _log(f"refused a client of uid {uid}")
                self.refuse(conn, f"refused: uid {uid}")
                return "refused"
            message, fds = proto.recv(conn, proto.MAX_FDS)
            if message is None:  # connected and left (a probe of whether this worker answers)
                conn.close()
                return "dropped"
            reason = self.decide(message, fds)
            if reason:
                for fd in fds:
                    os.close(fd)
                self.refuse(conn, reason)
                if reason.startswith("stale"):
                    _log(f"{reason}: exiting for a fresh worker")
                    self.unbind()
                    return "stale"
                return "cold"
        except (OSError, ValueError, proto.ProtocolError) as exc:
            for fd in fds:
                os.close(fd)
            conn.close()
            _log(f"dropped a request: {type(exc).__name__}: {exc}")
            return "dropped"
        pid = os.fork()
        if pid == 0:
            self._monitor(conn, message, fds)  # raises _Command in the command, exits otherwise
        self.running.add(pid)
        for fd in fds:
            os.close(fd)
        conn.close()
        self.served += 1
        self.write_state()
        return "served"

    def decide(self, message: dict | None, fds: list[int]) -> str | None:
        """Why this request runs cold, or None to serve it."""
        if message is None:
            return "protocol: nothing sent"
        if message.get("protocol") != proto.PROTOCOL:
            return "protocol: another version"
        if len(fds) != proto.MAX_FDS:
            return "protocol: fds missing"
        stale = changed(self.files)
        if stale:
            return f"stale: {stale} changed"
        if message.get("interpreter") != self.facts:
            return "interpreter: another Python or other flags"
        env = message.get("env")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            return "protocol: no environment"
        why = proto.env_mismatch(self.env, env, self.read_at_import)
        if why:
            return f"environment: {why}"
        if not isinstance(message.get("argv"), list) or not all(isinstance(a, str) for a in message["argv"]):
            return "protocol: no argv"
        if not proto.wanted(message["argv"][1:], env):
            return "protocol: not an allowlisted command"
        if threads() != 1:
            return "unsafe: a pre-imported module started a thread"
        if len(self.running) >= MAX_RUNNING:
            return f"busy: {len(self.running)} commands running"
        return None

    # -------------------------------------------------------------------- per request
    def _monitor(self, conn: socket.socket, message: dict, fds: list[int]) -> None:
        """The forked monitor of one request. Never returns (the command raises _Command)."""
        try:
            self.listener.close()
            # A session of its own: what signals or stops the control plane's processes (its
            # process group, `spz api stop`) never cuts a user's command short; cold, it would
            # not either.
            os.setsid()
            _set_name(MONITOR_NAME)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            log_fd = os.dup(2)
            become(message, fds)
            go_r, go_w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(go_w)
                os.close(log_fd)
                os.close(conn.detach())  # the monitor keeps its own
                raise _Command(go_r, message)
            os.close(go_r)
        except _Command:
            raise
        except BaseException as exc:  # noqa: BLE001 - nothing ran: the client runs cold
            try:
                proto.send(conn, {"cold": f"setup: {type(exc).__name__}: {exc}"})
            except OSError:
                pass
            os._exit(0)
        try:
            _watch(conn, pid, go_w)
        except BaseException as exc:  # noqa: BLE001
            try:
                os.write(log_fd, f"monitor of {pid}: {type(exc).__name__}: {exc}\n".encode())
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(0)


def _set_name(name: bytes) -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name, 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _watch(conn: socket.socket, pid: int, go_w: int) -> None:
    """The monitor: `ready`, wait for `go`, then the command's end or the client's."""
    try:
        os.setpgid(pid, pid)  # also done by the command itself: whichever runs first
    except OSError:
        pass
    conn.settimeout(None)
    proto.send(conn, {"ready": pid})
    try:
        go, _ = proto.recv(conn)
    except (OSError, ValueError, proto.ProtocolError):
        go = None
    if not go or go.get("go") is not True:  # the client gave up (its timeout) or died: nothing ran
        os.close(go_w)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return
    os.write(go_w, b"g")
    os.close(go_w)
    pidfd = os.pidfd_open(pid)
    while True:
        readable, _, _ = select.select([conn, pidfd], [], [])
        if pidfd in readable:
            _, status, usage = os.wait4(pid, 0)
            try:  # with the command's CPU seconds (bench/latency.py reports them)
                proto.send(conn, {**proto.exit_status(status), "cpu_s": round(usage.ru_utime + usage.ru_stime, 4)})
            except OSError:
                pass
            return
        try:
            data = conn.recv(1)
        except OSError:
            data = b""
        if not data:  # the client is gone: a Ctrl-C, then a kill after the grace
            _signal_group(pid, signal.SIGINT)
            if not select.select([pidfd], [], [], KILL_GRACE_S)[0]:
                _signal_group(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _stream(fd: int, spec: dict, name: str, write: bool) -> io.TextIOWrapper:
    """A standard stream as the client's interpreter built it (Python/pylifecycle.c create_stdio)."""
    raw = io.FileIO(fd, "wb" if write else "rb", closefd=False)
    raw.name = name  # type: ignore[misc]
    unbuffered = write and spec.get("write_through")
    buffered = raw if unbuffered else (io.BufferedWriter(raw) if write else io.BufferedReader(raw))
    return io.TextIOWrapper(buffered, encoding=spec["encoding"], errors=spec["errors"], newline="\n",
                            line_buffering=spec["line_buffering"], write_through=bool(spec.get("write_through")))


def become(message: dict, fds: list[int]) -> None:
    """This process takes the client's place: fds 0/1/2, working directory, environment, umask,
    sys.path/argv, `__main__`'s package (click names the program from it), standard streams."""
    stdin, stdout, stderr, cwd = fds
    for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
        os.dup2(fd, target)
    os.fchdir(cwd)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(message["env"])
    os.umask(int(message["umask"]))
    sys.path[:] = [str(p) for p in message["path"]]
    sys.argv[:] = message["argv"]
    main = sys.modules.get("__main__")
    if main is not None:
        main.__package__ = message.get("main_package")
    try:
        import locale

        locale.setlocale(locale.LC_CTYPE, "")
    except Exception:  # noqa: BLE001 - an unknown locale: Python's start-up ignores it too
        pass
    spec = message["stdio"]
    sys.stdin = sys.__stdin__ = _stream(0, spec[0], "<stdin>", write=False)
    sys.stdout = sys.__stdout__ = _stream(1, spec[1], "<stdout>", write=True)
    sys.stderr = sys.__stderr__ = _stream(2, spec[2], "<stderr>", write=True)


def _python_default(sig: int):
    if sig == signal.SIGINT:
        return signal.default_int_handler
    if sig in (signal.SIGPIPE, signal.SIGXFSZ):
        return signal.SIG_IGN
    return signal.SIG_DFL


def run_command(go_fd: int, message: dict) -> None:
    """In the command process: the client's signals, the word `go`, then `spz` itself."""
    os.setpgid(0, 0)
    _set_name(COMMAND_NAME)
    every = [getattr(signal, n) for n in proto.INHERITED_SIGNALS] + [signal.SIGXFSZ]
    signal.pthread_sigmask(signal.SIG_BLOCK, every)
    ignored = {getattr(signal, n) for n in message.get("ignored", []) if hasattr(signal, n)}
    for sig in every:
        signal.signal(sig, signal.SIG_IGN if sig in ignored else _python_default(sig))
    go = os.read(go_fd, 1)
    os.close(go_fd)
    if go != b"g":
        os._exit(0)
    blocked = {signal.Signals(s) for s in message.get("blocked", []) if 0 < s < signal.NSIG}
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        from .main import app
    except KeyboardInterrupt:  # a Ctrl-C that came before the command began
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        raise
    app()  # the same entry as cli/script.py: it exits as `spz` does (SystemExit, or a signal)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m skypurza.cli.warmworker", description=__doc__.splitlines()[0])
    p.add_argument("--stage", required=True)
    p.add_argument(CONTROL_PLANE_FLAG, dest="control_plane", default="",
                   help="the stage's state directory (how `spz api stop` recognises this process)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # `python -m` put the supervisor's working directory first on sys.path: never import from it
    # (`spz` itself never does), and hold no directory of the user's open.
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    os.chdir("/")
    try:
        worker = Worker(naming.check_stage(args.stage))
        try:
            return worker.run()
        except RuntimeError as exc:
            _log(str(exc))  # nothing to undo: the other worker keeps its socket
            return 3
    except _Command as command:
        run_command(command.go_fd, command.message)
        return 0


if __name__ == "__main__":
    sys.exit(main())
