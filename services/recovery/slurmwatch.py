"""Slurm's word on the allocations of live managed clusters: a Looker for InstanceWatch.

A Slurm cluster's node agents run on the control plane, so their heartbeats go on when the
allocation is gone: only Slurm can say that it ended. Per cluster, one SSH command to the login
node (`~/.slurm/config`, as everywhere): `squeue` lists what is alive; an allocation of ours it
does not list, or lists in a final state, has ended, and `sacct` (where accounting exists) says
why. The reading is `events/slurm_accounting.allocation_end` (pure): PREEMPTED is a preemption,
NODE_FAIL, a cancel by someone else (an admin's `scancel`), a time limit or plain gone is a lost
node. The recovery service then recovers the job as after an EC2 preemption.

A login node that does not answer, or a `squeue` that fails, is no finding (never a false loss).
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections import defaultdict
from pathlib import Path

from skypurza.events.slurm_accounting import allocation_end, parse_job_states
from skypurza.events.slurmpath import slurm_config_path

from . import detect
from .ec2watch import Target

log = logging.getLogger("skypurza.recovery")

SSH_TIMEOUT_S = 30.0
_SEP = "#spz-sacct"


def look_command(job_ids: list[int]) -> str:
    ids = ",".join(str(int(j)) for j in sorted(set(job_ids)))
    return (f"squeue -h -o '%i|%T' && echo '{_SEP}' && "
            f"{{ sacct -X -n -P -j {shlex.quote(ids)} -o JobIDRaw,State 2>/dev/null || true; }}")


def findings(targets: list[Target], text: str) -> list[tuple[Target, detect.Finding]]:
    """Pure: the targets whose allocation ended, from `look_command`'s output."""
    alive_text, sep, sacct_text = text.partition(_SEP)
    if not sep:
        return []  # the command did not run to its end: no word on anything
    alive = parse_job_states(alive_text)
    why = parse_job_states(sacct_text)
    out = []
    for t in targets:
        head = t.instance_id.split(".")[0]
        if not head.isdigit():
            continue
        job = int(head)
        state = alive.get(job)
        kind = allocation_end(state)
        if kind is None:
            continue
        if state is None:  # gone from squeue: sacct says how it ended, if it keeps accounting
            kind = allocation_end(why.get(job)) or "node_lost"
        evidence = {"slurm_job_id": job, "state": f"Slurm allocation {job} {why.get(job) or state or 'gone'}",
                    "squeue": state or "gone", "sacct": why.get(job, "")}
        out.append((t, detect.Finding(kind, t.instance_id, evidence)))
    return out


class SlurmWatch:
    """Looker over SSH (asyncio subprocess, bounded)."""

    def __init__(self, config_path: Path | None = None, *, timeout_s: float = SSH_TIMEOUT_S):
        self.config_path = config_path or slurm_config_path()
        self.timeout_s = timeout_s

    async def look(self, targets: list[Target]) -> list[tuple[Target, detect.Finding]]:
        by_cluster: dict[str, list[Target]] = defaultdict(list)
        for t in targets:
            by_cluster[t.region].append(t)
        out: list[tuple[Target, detect.Finding]] = []
        for cluster, ts in sorted(by_cluster.items()):
            jobs = [int(t.instance_id.split(".")[0]) for t in ts if t.instance_id.split(".")[0].isdigit()]
            if not jobs:
                continue
            text = await self._run(cluster, look_command(jobs))
            if text is not None:
                out += findings(ts, text)
        return out

    async def _run(self, cluster: str, command: str) -> str | None:
        argv = ["ssh", "-F", str(self.config_path), "-o", "BatchMode=yes", "-o",
                f"ConnectTimeout={int(self.timeout_s)}", "-o", "LogLevel=ERROR", cluster, command]
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            log.warning("slurm %s: cannot run ssh: %s", cluster, exc)
            return None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            log.warning("slurm %s: squeue over ssh took over %.0f s", cluster, self.timeout_s)
            return None
        if proc.returncode != 0:
            log.warning("slurm %s: squeue failed: %s", cluster, err.decode(errors="replace").strip()[-300:])
            return None
        return out.decode(errors="replace")[:4_000_000]

    async def close(self) -> None:
        return None
