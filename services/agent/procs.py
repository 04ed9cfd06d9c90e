"""A job phase as an OS process the agent can lose and find again.

Each phase (setup or run of one job) is started as
    bash -c '<wrapper>' WORKDIR SCRIPT LOG EXIT
in a session of its own (so one signal reaches the whole process group), with its output
appended to a file in the agent's home and its exit status written to a file when it ends.
Nothing ties the job to the agent process: an agent that crashes and restarts finds the pid
file, reads the exit file if the job ended meanwhile, adopts it if it still runs, and reads
the log file on from where it had published.

Files of one phase, under `<state>/jobs/<job_id>/`: `<phase>.pid` (JSON), `<phase>.log`,
`<phase>.exit`, `<phase>.offset` (bytes of the log already published, then the number of
chunks they made: "OFFSET SEQ"), `<phase>.reported`
(its JobNodeFinished was published). `<state>/run/<job_id>-<phase>.pgid` holds the process
group id while it runs: whoever tears the node down kills every group listed there.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from skypurza.events.processes import group_alive, pid_alive  # noqa: F401  (used by the agent)

MAX_LINE_BYTES = 64 * 1024

# The phase's script always runs from its file (userenv.phase_script: the login prelude, then the
# user's script) in a bash of its own, so that an `exit` in it still lets us record the status.
_WRAPPER = (
    'cd "$1" || { echo "cannot cd to $1" >>"$3"; echo 1 >"$4"; exit 1; }; '
    '{ bash "$5"; } >>"$3" 2>&1 </dev/null; '
    'c=$?; printf "%s\\n" "$c" >"$4.tmp" && mv -f "$4.tmp" "$4"; exit "$c"'
)


@dataclass(frozen=True)
class PhaseFiles:
    state: Path
    job_id: int
    phase: str

    @property
    def dir(self) -> Path:
        return self.state / "jobs" / str(self.job_id)

    def _f(self, suffix: str) -> Path:
        return self.dir / f"{self.phase}.{suffix}"

    @property
    def script(self) -> Path:
        return self._f("sh")

    @property
    def log(self) -> Path:
        return self._f("log")

    @property
    def exit(self) -> Path:
        return self._f("exit")

    @property
    def pid(self) -> Path:
        return self._f("pid")

    @property
    def offset(self) -> Path:
        return self._f("offset")

    @property
    def reported(self) -> Path:
        return self._f("reported")

    @property
    def pgid_file(self) -> Path:
        return self.state / "run" / f"{self.job_id}-{self.phase}.pgid"

    def read_exit(self) -> int | None:
        try:
            return int(self.exit.read_text().strip())
        except (OSError, ValueError):
            return None

    def read_pid(self) -> dict | None:
        try:
            return json.loads(self.pid.read_text())
        except (OSError, ValueError):
            return None

    def read_offset(self) -> int:
        return self.read_position()[0]

    def read_position(self) -> tuple[int, int]:
        """(bytes of the log published, chunks they made). A file written before chunks were
        numbered holds the offset alone: the chunks are counted in the log (once)."""
        try:
            parts = self.offset.read_text().split()
            offset = max(0, int(parts[0])) if parts else 0
            if len(parts) > 1:
                return offset, max(0, int(parts[1]))
        except (OSError, ValueError):
            return 0, 0
        return offset, _count_lines(self.log, offset)

    def write_offset(self, offset: int, seq: int | None = None) -> None:
        _atomic_write(self.offset, str(offset) if seq is None else f"{offset} {seq}")

    def mark_reported(self, exit_code: int) -> None:
        _atomic_write(self.reported, str(exit_code))
        self.pgid_file.unlink(missing_ok=True)

    def is_reported(self) -> bool:
        return self.reported.exists()


def _next_break(buf: bytes, start: int) -> int:
    """The index of the next "\n" or "\r" at or after `start`, or -1."""
    n, r = buf.find(b"\n", start), buf.find(b"\r", start)
    if n < 0:
        return r
    return n if r < 0 else min(n, r)


def _count_lines(path: Path, upto: int) -> int:
    n = 0
    try:
        with open(path, "rb") as f:
            while upto > 0:
                block = f.read(min(upto, 1 << 20))
                if not block:
                    break
                n += block.count(b"\n")
                upto -= len(block)
    except OSError:
        return 0
    return n


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def spawn(files: PhaseFiles, script: str, workdir: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start one phase detached from the agent (own session); record its pid and process group."""
    files.dir.mkdir(parents=True, exist_ok=True)
    files.pgid_file.parent.mkdir(parents=True, exist_ok=True)
    for stale in (files.exit, files.offset, files.reported):
        stale.unlink(missing_ok=True)
    files.script.write_text(script)
    files.log.touch()
    proc = subprocess.Popen(
        ["bash", "-c", _WRAPPER, "spz-job", str(workdir), "@file", str(files.log), str(files.exit),
         str(files.script)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=env, start_new_session=True, close_fds=True,
    )
    _atomic_write(files.pid, json.dumps({"pid": proc.pid, "pgid": proc.pid, "started_at": time.time()}))
    _atomic_write(files.pgid_file, str(proc.pid))
    return proc


class ExitWatch:
    """Wakes its waiter the moment process `pid` exits (a pidfd, readable at the exit), so a
    phase's end is reported at once rather than at the next look; where a pidfd cannot be had
    (an old kernel, the process already gone) `wait` is the bounded pause it replaces."""

    def __init__(self, pid: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[None] = self._loop.create_future()
        self._fd: int | None = None
        try:
            self._fd = os.pidfd_open(pid)
            self._loop.add_reader(self._fd, self._wake)
        except (AttributeError, OSError):  # no pidfd here: the caller's bound is the wait
            self.close()

    def _wake(self) -> None:
        if not self._exited.done():
            self._exited.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until the process exits or `timeout` seconds pass, whichever is first."""
        await asyncio.wait({self._exited}, timeout=timeout)

    def close(self) -> None:
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def kill_group(pgid: int, grace_s: float = 10.0, poll_s: float = 0.05) -> bool:
    """SIGTERM to the whole group, SIGKILL after `grace_s` if anything is left. True if it had to SIGKILL."""
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return False
        await asyncio.sleep(poll_s)
    signal_group(pgid, signal.SIGKILL)
    return True


def exit_status(returncode: int) -> int:
    """Popen's returncode as a shell reports it (killed by signal N -> 128+N)."""
    return 128 - returncode if returncode < 0 else returncode


class Chunk(NamedTuple):
    """One piece of a phase's output as the agent publishes it: its number in the phase's output
    (from 0), the byte offset where it starts in the log file, its text, and how it ended:
    "\n" a line (also "\r\n"), "\r" a carriage return (a progress bar's state, which the next
    piece overwrites on a terminal), "" a partial line sent after a pause (its rest follows).
    All are positions, not times: the same bytes read again (by a restarted agent) are the same
    chunk."""

    seq: int
    offset: int
    line: str
    end: str = "\n"


class LogTail:
    """Output appended to a file since `offset` (bytes), cut at "\n", "\r\n" and "\r"; `seq`
    numbers the chunks on from where a previous reader stopped. An unterminated tail is kept
    until it ends, or handed out as it is when the caller asks (`flush_partial`: it has waited
    long enough, e.g. "Downloading... " before a long pause)."""

    def __init__(self, path: Path, offset: int = 0, seq: int = 0):
        self.path = path
        self.offset = offset
        self.seq = seq
        self._partial = b""

    @property
    def has_partial(self) -> bool:
        return bool(self._partial)

    def read_lines(self, final: bool = False) -> list[str]:
        return [c.line for c in self.read_chunks(final)]

    def read_chunks(self, final: bool = False, flush_partial: bool = False) -> list[Chunk]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            data = b""
        if not data and not ((final or flush_partial) and self._partial):
            return []
        start = self.offset - len(self._partial)  # where the buffer begins in the file
        buf = self._partial + data
        self.offset += len(data)
        pieces: list[tuple[bytes, str, int]] = []  # (text, end, bytes consumed)
        i = 0
        while True:
            j = _next_break(buf, i)
            if j < 0:
                break
            if buf[j] == 0x0D and j + 1 == len(buf) and not (final or flush_partial):
                break  # a "\r" at the very end may be the first half of "\r\n": wait for the next byte
            if buf[j] == 0x0D and buf[j + 1:j + 2] == b"\n":
                pieces.append((buf[i:j], "\n", j + 2 - i))
                i = j + 2
            else:
                pieces.append((buf[i:j], "\n" if buf[j] == 0x0A else "\r", j + 1 - i))
                i = j + 1
        self._partial = buf[i:]
        if (final or flush_partial) and self._partial:
            pieces.append((self._partial, "", len(self._partial)))
            self._partial = b""
        chunks: list[Chunk] = []
        for raw, end, used in pieces:
            line = raw[:MAX_LINE_BYTES] + b" [line cut]" if len(raw) > MAX_LINE_BYTES else raw
            chunks.append(Chunk(self.seq, start, line.decode("utf-8", errors="replace"), end))
            self.seq += 1
            start += used
        return chunks

    @property
    def committed(self) -> int:
        """The offset up to which every line was handed out (a partial line is read again)."""
        return self.offset - len(self._partial)
