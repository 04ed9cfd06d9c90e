"""SSH to a Slurm cluster's login node (asyncssh): one reused connection per cluster, every
wait bounded. The only I/O of the Slurm backend besides the agents it starts.

A command that does not finish within its timeout is abandoned (its channel closed) and raises
SlurmSshError; a dropped connection is made again on the next command. Nothing is installed or
left running on the cluster by this module.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

from skypurza.events.slurm_config import SshTarget

CONNECT_TIMEOUT_S = 15.0
COMMAND_TIMEOUT_S = 60.0
MAX_OUTPUT_CHARS = 4 * 1024 * 1024


class SlurmSshError(Exception):
    """The login node could not be reached, or a command did not end in time."""


@dataclass(frozen=True)
class Result:
    exit_status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


def identity_paths(target: SshTarget) -> list[str]:
    return [os.path.expanduser(p) for p in target.identity_files if Path(os.path.expanduser(p)).exists()]


class SlurmSsh:
    def __init__(self, target: SshTarget, *, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 command_timeout_s: float = COMMAND_TIMEOUT_S) -> None:
        self.target = target
        self.connect_timeout_s = connect_timeout_s
        self.command_timeout_s = command_timeout_s
        self._conn = None
        self._lock = asyncio.Lock()
        self.connects = 0  # how many connections were made (the bench reads it: reuse works)

    async def _connection(self):
        import asyncssh

        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            t = self.target
            known: object = None
            if t.strict_host_key_checking:
                files = [os.path.expanduser(f) for f in t.known_hosts_files] or [os.path.expanduser(
                    "~/.ssh/known_hosts")]
                known = [f for f in files if Path(f).exists()] or ()
            options = dict(host=t.hostname, port=t.port, username=t.user or None, known_hosts=known,
                           client_keys=identity_paths(t) or None, connect_timeout=self.connect_timeout_s,
                           keepalive_interval=30, keepalive_count_max=3)
            if t.proxy_command:
                options["proxy_command"] = t.proxy_command
            elif t.proxy_jump:
                options["tunnel"] = t.proxy_jump
            try:
                self._conn = await asyncio.wait_for(asyncssh.connect(**options), self.connect_timeout_s + 5)
            except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
                raise SlurmSshError(f"cannot reach the login node of {t.cluster} ({t.user or ''}@{t.hostname}:"
                                    f"{t.port}): {_text(exc)}") from None
            self.connects += 1
            return self._conn

    async def run(self, command: str, *, input: str | None = None, timeout: float | None = None) -> Result:
        import asyncssh

        conn = await self._connection()
        limit = timeout if timeout is not None else self.command_timeout_s
        try:
            done = await asyncio.wait_for(conn.run(command, input=input, check=False), limit)
        except asyncio.TimeoutError:
            raise SlurmSshError(f"{self.target.cluster}: `{command.split()[0]}` did not finish within "
                                f"{limit:g}s (timed out)") from None
        except (OSError, asyncssh.Error) as exc:
            self._conn = None
            raise SlurmSshError(f"{self.target.cluster}: the connection to the login node broke: {_text(exc)}") \
                from None
        out = done.stdout if isinstance(done.stdout, str) else (done.stdout or b"").decode(errors="replace")
        err = done.stderr if isinstance(done.stderr, str) else (done.stderr or b"").decode(errors="replace")
        status = done.exit_status if done.exit_status is not None else 255
        return Result(status, out[:MAX_OUTPUT_CHARS], err[:MAX_OUTPUT_CHARS])

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            try:
                await asyncio.wait_for(conn.wait_closed(), 5)
            except (asyncio.TimeoutError, OSError):
                pass


def _text(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
