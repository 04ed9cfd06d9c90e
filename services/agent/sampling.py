"""The node's sample (events/nodesample.py): CPU, memory and disk from /proc and the home's
filesystem, each GPU from `nvidia-smi --query-gpu`, Xid errors from the kernel log.

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

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from skypurza.events.nodesample import MAX_NOTE_CHARS, GpuSample, NodeSample

from . import smi

MAX_OUTPUT_BYTES = 4 * 1024 * 1024
_XID_COMMANDS = {"dmesg": ("dmesg",), "journalctl": ("journalctl", "-k", "-b", "-q", "--no-pager", "-n", "20000")}
MIB = 1024 * 1024
GIB = 1024 * MIB


def _run(argv: tuple[str, ...], timeout_s: float) -> tuple[int, str]:
    path = shutil.which(argv[0])
    if not path:
        return 127, f"{argv[0]}: not found"
    try:
        res = subprocess.run([path, *argv[1:]], capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]}: no answer in {timeout_s:g} s"
    except (OSError, subprocess.SubprocessError) as exc:
        return 126, f"{argv[0]}: {exc}"
    out = res.stdout[:MAX_OUTPUT_BYTES].decode("utf-8", "replace")
    if res.returncode != 0:
        err = res.stderr[:MAX_NOTE_CHARS].decode("utf-8", "replace").strip()
        return res.returncode, out or err
    return 0, out


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

    def __init__(self, home: Path, *, smi_exe: str = "nvidia-smi", xid_source: str = "auto",
                 timeout_s: float = 10.0):
        self.home = home
        self.smi_exe = smi_exe
        self.xid_source = xid_source
        self.timeout_s = timeout_s
        self._cpu: CpuTimes | None = None
        self._xid_works: str | None = None if xid_source == "auto" else xid_source

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
                          xid_source=self._xid_works if self._xid_works not in (None, "none") else "")

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

    def _gpus(self) -> tuple[list[GpuSample], list, str]:
        if not shutil.which(self.smi_exe):
            return [], [], ""  # no NVIDIA driver: a CPU node (expected_gpus tells a lost driver apart)
        code, out = _run((self.smi_exe, *smi.QUERY_ARGS), self.timeout_s)
        reading = smi.parse_query(out)
        error = "" if code == 0 else (reading.errors[0] if reading.errors else out.strip().splitlines()[0]
                                      if out.strip() else f"{self.smi_exe} exited with {code}")
        xids = smi.parse_xids(self._kernel_log())
        return smi.with_xids(reading.gpus, xids), smi.unlisted(xids, reading.gpus), error

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
