"""What the warm CLI worker (cli/warmworker.py) and its client (cli/workerclient.py) agree on:
which commands go through it, the framing of their messages, and the pure decisions.

Stdlib only and cheap to import: the client imports it on every allowlisted command, before it
knows whether a worker answers. Messages are a 4-byte big-endian length and a JSON object; the
request carries the client's fds 0/1/2 and its working directory as SCM_RIGHTS.

The conversation (docs/cli.md, *The warm worker*):

    client → worker   request {argv, env, umask, path, stdio, ...} + fds 0, 1, 2, cwd
    worker → client   {"cold": reason}      nothing ran: the client runs the command itself
                      {"ready": pid}        a child is set up and waits for the word
    client → worker   {"go": true}          from here on the client waits for the status
    worker → client   {"exit": code} | {"signal": number}

Anything before `go` that goes wrong leaves the client free to run cold; after it, never.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing's, without importing typing (~3 ms of every command)
if TYPE_CHECKING:
    import socket

# json, socket and struct are imported where a message is framed: a command with no worker to
# talk to (no plane, or not allowlisted) pays for none of them.

PROTOCOL = 1
# The client gives up on a worker that has not said `ready` by then, and runs cold.
HANDSHAKE_S = 0.5
MAX_MESSAGE_BYTES = 1 << 20  # argv + the whole environment; far above any real one
MAX_FDS = 4  # 0, 1, 2 and the working directory
OFF_VALUES = ("0", "false", "no", "off")
ENV_SWITCH = "SKYPURZA_CLI_WORKER"

# Commands that behave the same in a forked child of the worker as in their own process. Not
# `api *` (it starts and stops the plane the worker belongs to) and nothing that must be the
# caller's own process (a login that stores a token, the console).
ALLOWED = frozenset({"status", "queue", "exec", "launch", "logs", "check-yaml", "cost-report",
                     "down", "stop", "start", "cancel", "autostop"})
ALLOWED_GROUPS = {"jobs": frozenset({"queue", "launch"})}

# Signals the client passes on to the command (its process group), as a terminal would.
FORWARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
# Dispositions a child takes from the client: an ignored one (nohup, a background job) stays
# ignored, as it would in a process the client's parent started.
INHERITED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGPIPE", "SIGTSTP", "SIGTTIN",
                     "SIGTTOU", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGCHLD", "SIGWINCH")


def wanted(argv: list[str], env: dict[str, str] | os._Environ) -> bool:
    """Whether this command line may go through a warm worker (argv without the program)."""
    if str(env.get(ENV_SWITCH, "")).strip().lower() in OFF_VALUES:
        return False
    if not argv:
        return False
    if argv[0] in ALLOWED:
        return True
    group = ALLOWED_GROUPS.get(argv[0])
    return bool(group) and len(argv) > 1 and argv[1] in group


def peer_allowed(peer_uid: int, own_uid: int) -> bool:
    """Only the worker's own user may run commands in it (root included: it is not root's)."""
    return peer_uid == own_uid


def interpreter_facts() -> dict:
    """What makes two Python processes run the same code the same way; a client whose facts
    differ from the worker's (another Python, `-X importtime`, `-I`, UTF-8 mode) runs cold."""
    return {"executable": sys.executable, "version": sys.version, "flags": list(sys.flags),
            "xoptions": sorted(f"{k}={v}" for k, v in sys._xoptions.items()), "warnoptions": list(sys.warnoptions),
            "fsencoding": sys.getfilesystemencoding(), "prefix": sys.prefix}


def env_mismatch(worker_env: dict[str, str], client_env: dict[str, str], read_at_import: frozenset[str]) -> str | None:
    """Why a client's environment cannot be served by a worker whose modules were imported
    under `worker_env`, or None. Pure. Every variable a pre-imported module read at import
    (recorded by the worker) must be the same: its value may be baked into a module. So must
    every PYTHON* variable (hash seed, path, I/O encoding, buffering: fixed at start)."""
    if "*" in read_at_import:
        return "a pre-imported module read the whole environment" if worker_env != client_env else None
    keys = set(read_at_import) | {k for k in (*worker_env, *client_env) if k.startswith("PYTHON")}
    for key in sorted(keys):
        if worker_env.get(key) != client_env.get(key):
            return f"the environment differs in {key}"
    return None


def exit_status(waitstatus: int) -> dict:
    """The message that ends a request, from `os.waitpid`'s status. Pure."""
    code = os.waitstatus_to_exitcode(waitstatus)
    return {"signal": -code} if code < 0 else {"exit": code}


# ------------------------------------------------------------------------------------ framing

def send(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    import json
    import socket
    import struct

    body = json.dumps(message, separators=(",", ":")).encode()
    data = struct.pack("!I", len(body)) + body
    if fds:
        sent = socket.send_fds(sock, [data], list(fds))
        if sent < len(data):
            sock.sendall(data[sent:])
    else:
        sock.sendall(data)


class ProtocolError(Exception):
    pass


def recv(sock: socket.socket, max_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One message and the fds that came with it; (None, []) when the peer closed first."""
    import json
    import socket
    import struct

    fds: list[int] = []
    if max_fds:
        data, fds, _flags, _addr = socket.recv_fds(sock, 65536, max_fds)
    else:
        data = sock.recv(65536)
    if not data:
        return None, fds
    buf = bytearray(data)
    try:
        while len(buf) < 4:
            more = sock.recv(4 - len(buf))
            if not more:
                raise ProtocolError("the message ended early")
            buf += more
        (size,) = struct.unpack("!I", bytes(buf[:4]))
        if size > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"a message of {size} bytes")
        while len(buf) < 4 + size:
            more = sock.recv(min(65536, 4 + size - len(buf)))
            if not more:
                raise ProtocolError("the message ended early")
            buf += more
        if len(buf) != 4 + size:
            raise ProtocolError("more than one message at once")
        message = json.loads(bytes(buf[4:]))
        if not isinstance(message, dict):
            raise ProtocolError("a message that is not an object")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return message, fds


def connect(path: str, timeout: float) -> socket.socket:
    """A connected socket to `path`, even past AF_UNIX's 107-byte limit (through its folder,
    opened as /proc/self/fd/N: no chdir, so nothing else of the process moves)."""
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        if len(os.fsencode(path)) < 100:
            sock.connect(path)
        else:
            folder, name = os.path.split(path)
            dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                sock.connect(f"/proc/self/fd/{dfd}/{name}")
            finally:
                os.close(dfd)
    except BaseException:
        sock.close()
        raise
    return sock
