"""The node's sample (events/nodesample.py): CPU, memory and disk from /proc and the home's
filesystem, each GPU from DCGM (`dcgmi`, when it is on PATH and its host engine answers) or
`nvidia-smi --query-gpu`, Xid errors from the kernel log (and DCGM's last Xid per GPU).

GPU source (`SKYPURZA_AGENT_GPU_SOURCE`): `auto` reads DCGM and falls back to nvidia-smi for a
sample where DCGM is absent, fails, hangs (killed after the tool timeout) or prints nothing
usable; a DCGM that failed is tried again only every DCGM_RETRY_EVERY samples (a hung one would
cost a timeout each time), and its failure is one warning in the agent's log per distinct
reason, never an exception. `dcgm` or `nvidia-smi` forces one (no fallback: what it cannot read
is the sample's `gpu_error`). Each sample says which source answered (`gpu_source`).

What the agent can see without root (docs/agent.md, *Node samples*):
- nvidia-smi's query needs no root: utilisation, memory, power, temperature, volatile
  uncorrected ECC errors, the active clock throttle reasons.
- Xid errors are not in nvidia-smi's query: the driver writes them to the kernel log
  (`NVRM: Xid (PCI:0000:3b:00): 79, ...`). `dmesg` reads it unless `kernel.dmesg_restrict` is 1
  (Debian and Ubuntu set it); `journalctl -k` reads it for members of `adm` or
  `systemd-journal` (Ubuntu's default user is one). The agent tries them in that order
  (`SKYPURZA_AGENT_XID_SOURCE` picks one or `none`) and says in the sample which worked; when
  neither does, `xid_source` is empty and the health manager cannot see Xids on that node.

Every command has a timeout and a cap on what is read; a command that fails is a note in the
sample, never an exception out of here.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from skypurza.events.nodesample import MAX_NOTE_CHARS, GpuSample, NodeSample, UnlistedDevice

from . import dcgm, smi

log = logging.getLogger("skypurza.agent")

MAX_OUTPUT_BYTES = 4 * 1024 * 1024
_XID_COMMANDS = {"dmesg": ("dmesg",), "journalctl": ("journalctl", "-k", "-b", "-q", "--no-pager", "-n", "20000")}
MIB = 1024 * 1024
GIB = 1024 * MIB
DCGM_RETRY_EVERY = 30  # samples between tries of a DCGM that failed (5 min at the default 10 s)


def _run(argv: tuple[str, ...], timeout_s: float) -> tuple[int, str]:
    path = shutil.which(argv[0])
    if not path:
        return 127, f"{argv[0]}: not found"
    try:
        # Its own session, so a timeout kills whatever the tool started too (a wrapper script's
        # children would otherwise live on, holding the pipes).
        proc = subprocess.Popen([path, *argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return 126, f"{argv[0]}: {exc}"
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return 124, f"{argv[0]}: no answer in {timeout_s:g} s"
    out = stdout[:MAX_OUTPUT_BYTES].decode("utf-8", "replace")
    if proc.returncode != 0:
        err = stderr[:MAX_NOTE_CHARS].decode("utf-8", "replace").strip()
        return proc.returncode, out or err
    return 0, out


run_tool = _run  # gpus.detect_gpus runs its tools the same way (timeout, own session, capped output)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    try:
        proc.communicate(timeout=2.0)  # reap it; the pipes close with the group
    except (subprocess.TimeoutExpired, OSError, ValueError):
        pass


@dataclass
class CpuTimes:
    busy: int = 0
    total: int = 0


def read_cpu_times(text: str) -> CpuTimes | None:
    """The first line of /proc/stat: `cpu user nice system idle iowait irq softirq steal ...`."""
    first = text.split("\n", 1)[0].split()
    if not first or first[0] != "cpu":
        return None
    try:
        vals = [int(v) for v in first[1:9]]
    except ValueError:
        return None
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return CpuTimes(busy=sum(vals) - idle, total=sum(vals))


def read_meminfo(text: str) -> tuple[float | None, float | None]:
    """(used MiB, total MiB) from /proc/meminfo (used = total - available)."""
    kib: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            kib[parts[0].rstrip(":")] = int(parts[1])
    total, avail = kib.get("MemTotal"), kib.get("MemAvailable")
    if total is None:
        return None, None
    return (round((total - avail) / 1024, 1) if avail is not None else None), round(total / 1024, 1)


class Sampler:
    """One per agent: keeps the previous CPU times (CPU % is a difference) and which Xid source works."""

    def __init__(self, home: Path, *, smi_exe: str = "nvidia-smi", dcgm_exe: str = "dcgmi",
                 gpu_source: str = "auto", xid_source: str = "auto", timeout_s: float = 10.0):
        self.home = home
        self.smi_exe = smi_exe
        self.dcgm_exe = dcgm_exe
        self.gpu_source = gpu_source
        self.xid_source = xid_source
        self.timeout_s = timeout_s
        self._cpu: CpuTimes | None = None
        self._xid_works: str | None = None if xid_source == "auto" else xid_source
        self._dcgm_skip = 0  # samples left before a DCGM that failed is tried again (auto)
        self._dcgm_warned = ""  # the last DCGM failure logged (each distinct one is logged once)
        self._gpu_source_used = ""
        self._dcgm_read = False  # this sample's GPUs (and last Xids) came from DCGM

    def sample(self, cluster: str, rank: int, instance_id: str | None, ts: str, *, expected_gpus: int,
               busy_gpus: list[int]) -> NodeSample:
        cpu_pct = self._cpu_pct()
        mem_used, mem_total = self._memory()
        disk_used, disk_total = self._disk()
        gpus, unlisted, error = self._gpus()
        return NodeSample(cluster=cluster, rank=rank, instance_id=instance_id, ts=ts, cpu_pct=cpu_pct,
                          memory_used_mib=mem_used, memory_total_mib=mem_total, disk_used_gib=disk_used,
                          disk_total_gib=disk_total, expected_gpus=expected_gpus, busy_gpus=sorted(busy_gpus),
                          gpus=gpus, unlisted=unlisted, gpu_error=error[:MAX_NOTE_CHARS],
                          gpu_source=self._gpu_source_used,
                          xid_source=self._xid_label())

    def _cpu_pct(self) -> float | None:
        try:
            now = read_cpu_times(Path("/proc/stat").read_text())
        except OSError:
            return None
        before, self._cpu = self._cpu, now
        if now is None or before is None or now.total <= before.total:
            return None
        return round(100.0 * (now.busy - before.busy) / (now.total - before.total), 1)

    def _memory(self) -> tuple[float | None, float | None]:
        try:
            return read_meminfo(Path("/proc/meminfo").read_text())
        except OSError:
            return None, None

    def _disk(self) -> tuple[float | None, float | None]:
        try:
            du = shutil.disk_usage(self.home)
        except OSError:
            return None, None
        return round(du.used / GIB, 2), round(du.total / GIB, 2)

    def _xid_label(self) -> str:
        kernel = self._xid_works if self._xid_works not in (None, "none") else ""
        if self._dcgm_read:
            return f"dcgm+{kernel}" if kernel else "dcgm"  # DCGM gives each GPU's last Xid
        return kernel or ""

    def _gpus(self) -> tuple[list[GpuSample], list[UnlistedDevice], str]:
        got = self._dcgm() if self.gpu_source in ("auto", "dcgm") else None
        self._dcgm_read = got is not None
        unreachable: list[UnlistedDevice] = []
        if got is not None:
            source, (gpus, unreachable, error) = "dcgm", got
        elif self.gpu_source == "dcgm":  # forced, and it did not answer: no fallback
            source, gpus, error = "dcgm", [], self._dcgm_warned or f"{self.dcgm_exe}: no answer"
        elif not shutil.which(self.smi_exe):
            self._gpu_source_used = ""
            return [], [], ""  # no NVIDIA driver: a CPU node (expected_gpus tells a lost driver apart)
        else:
            source, (gpus, error) = "nvidia-smi", self._smi()
        self._gpu_source_used = source
        xids = smi.parse_xids(self._kernel_log())
        return smi.with_xids(gpus, xids), smi.unlisted(xids, gpus, unreachable), error

    def _smi(self) -> tuple[list[GpuSample], str]:
        code, out = _run((self.smi_exe, *smi.QUERY_ARGS), self.timeout_s)
        reading = smi.parse_query(out)
        error = "" if code == 0 else (reading.errors[0] if reading.errors else out.strip().splitlines()[0]
                                      if out.strip() else f"{self.smi_exe} exited with {code}")
        return reading.gpus, error

    def _dcgm(self) -> tuple[list[GpuSample], list[UnlistedDevice], str] | None:
        """DCGM's reading, or None when it gave nothing usable (then nvidia-smi, in auto)."""
        forced = self.gpu_source == "dcgm"
        if not forced and self._dcgm_skip > 0:
            self._dcgm_skip -= 1
            return None
        if not shutil.which(self.dcgm_exe):
            if forced:
                self._dcgm_failed(f"{self.dcgm_exe}: not found")
            return None  # no DCGM on this node: nvidia-smi, quietly
        code, out = _run((self.dcgm_exe, *dcgm.DISCOVERY_ARGS), self.timeout_s)
        discovered, _ = dcgm.parse_discovery(out) if code == 0 else ({}, [])
        if code != 0 or not discovered:
            self._dcgm_failed(_first_line(out, f"{self.dcgm_exe} discovery exited with {code}")
                              if code != 0 else f"{self.dcgm_exe} discovery lists no GPU")
            return None
        code, out = _run((self.dcgm_exe, *dcgm.DMON_ARGS), self.timeout_s)
        reading = dcgm.parse_dmon(out, discovered) if code == 0 else dcgm.DcgmReading()
        if code != 0 or not reading.usable:
            why = _first_line(out, f"{self.dcgm_exe} dmon exited with {code}") if code != 0 else \
                f"{self.dcgm_exe} dmon: no GPU row in its output ({_first_line(out, 'empty')})"
            self._dcgm_failed(why)
            return None
        self._dcgm_warned = ""
        return reading.gpus, reading.unreachable, reading.errors[0] if reading.errors else ""

    def _dcgm_failed(self, why: str) -> None:
        why = why[:MAX_NOTE_CHARS]
        if why != self._dcgm_warned:
            fallback = "" if self.gpu_source == "dcgm" else "; reading nvidia-smi instead"
            log.warning("DCGM gave no GPU reading: %s%s", why, fallback)
        self._dcgm_warned = why
        if self.gpu_source != "dcgm":
            self._dcgm_skip = DCGM_RETRY_EVERY

    def _kernel_log(self) -> str:
        sources = ("dmesg", "journalctl") if self._xid_works is None else (self._xid_works,)
        for source in sources:
            if source == "none":
                return ""
            code, out = _run(_XID_COMMANDS[source], self.timeout_s)
            if code == 0:
                self._xid_works = source
                return out
        if self._xid_works is None:
            self._xid_works = "none"  # neither can read the kernel log here: stop trying every sample
        return ""


def _first_line(out: str, default: str) -> str:
    """A tool's first line for a note or a log line (control characters of garbage output shown as ?)."""
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    if not lines:
        return default
    return "".join(c if c.isprintable() else "?" for c in lines[0][:MAX_NOTE_CHARS])

