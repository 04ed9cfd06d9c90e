"""What one of our Slurm allocations used, read over SSH when it ends: a SlurmAllocationAccounted.

Two reads, both bounded and neither ever a blocker of a teardown:
- `facts` when the allocation starts running: the TRES Slurm gave it (`scontrol show job`), the
  partition's TRESBillingWeights and the cluster's PriorityFlags. Kept in the cluster's record:
  they are what the ledger bills with, and the fallback when the cluster keeps no accounting.
- `account` after the allocation ended (our `scancel`, or an end we learn of at teardown: a time
  limit, a node failure, an admin's `scancel`): `sacct` until its row is final (End set), at most
  `wait_s`. Without slurmdbd (sacct says accounting is disabled), or when the row never becomes
  final, the event says `source="spz"`: the TRES read at start and our own start and end.

What `account` read is kept on disk (`keep`) until the provisioner has published it (`forget`), so
a provisioner that dies in between publishes it at its next start, under the same event id.

The parsing is events/slurm_accounting.py (pure); the billing formula is the ledger's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from hashlib import sha256
from pathlib import Path
from typing import Any

from skypurza.events.models import SlurmAllocationAccounted
from skypurza.events.slurm_accounting import (accounting_disabled, job_fields, parse_sacct, parse_tres_counts,
                                              priority_flags, sacct_command, split_billing)
from skypurza.events.slurm_discovery import parse_partitions

log = logging.getLogger(__name__)

Run = Callable[[str], Awaitable[Any]]  # a command on the login node -> a slurm_ssh.Result
_CONFIG, _PARTS = "#spz-config", "#spz-partitions"


async def facts(run: Run, job_id: str) -> dict[str, Any]:
    """TRES, billing, partition, weights and flags of a running allocation ({} when unreadable)."""
    try:
        res = await run(f"scontrol show job -o {int(job_id)}; echo '{_CONFIG}'; scontrol show config; "
                        f"echo '{_PARTS}'; scontrol show partition -o")
        job_text, _, rest = res.stdout.partition(_CONFIG)
        config_text, _, parts_text = rest.partition(_PARTS)
        job = job_fields(job_text)
        tres, billing = split_billing(parse_tres_counts(job.get("TRES", "")))
        partition = job.get("Partition", "")
        weights = next((p.billing_weights for p in parse_partitions(parts_text) if p.name == partition), "")
        return {"alloc_tres": tres, "slurm_billing": billing, "partition": partition, "billing_weights": weights,
                "priority_flags": priority_flags(config_text)}
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # never a blocker of the launch: the ledger then bills by CPUs
        log.warning("slurm allocation %s: cannot read its TRES: %s", job_id, exc)
        return {}


async def account(run: Run, record: dict[str, Any], cluster: str, ended_at: datetime, *,
                  wait_s: float = 10.0, poll_s: float = 0.5) -> SlurmAllocationAccounted | None:
    """The allocation's accounting after it ended (None only when the record names no allocation)."""
    job_id = str(record.get("slurm_job_id") or "")
    if not job_id.isdigit():
        return None
    f = record.get("accounting") or {}
    common = {"cluster": cluster, "slurm_cluster": str(record.get("region") or ""), "slurm_job_id": int(job_id),
              "billing_weights": f.get("billing_weights", ""), "priority_flags": f.get("priority_flags", ""),
              "instance_ids": [n["instance_id"] for n in record.get("nodes", [])]}
    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        try:
            res = await run(sacct_command(int(job_id)))
            if accounting_disabled(f"{res.stderr}\n{res.stdout}"):
                break
            rows = [r for r in parse_sacct(res.stdout) if r.job_id == int(job_id)]
            row = rows[-1] if rows else None
            if row is not None and row.final and row.start is not None and row.end is not None:
                return SlurmAllocationAccounted(
                    **common, partition=row.partition, state=row.state, alloc_tres=row.alloc_tres,
                    slurm_billing=row.billing, elapsed_s=row.elapsed_s, start=row.start, end=row.end,
                    source="sacct")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the login node stopped answering: our own times below
            log.warning("slurm allocation %s: sacct failed: %s", job_id, exc)
            break
        if time.monotonic() >= deadline:
            log.warning("slurm allocation %s: no final sacct row after %.0f s; billing from our own times",
                        job_id, wait_s)
            break
        await asyncio.sleep(poll_s)
    started = datetime.fromisoformat(record["launched_at"]) if record.get("launched_at") else ended_at
    return SlurmAllocationAccounted(
        **common, partition=f.get("partition", "") or str(record.get("zone") or ""), state="CANCELLED",
        alloc_tres=f.get("alloc_tres", {}), slurm_billing=f.get("slurm_billing"),
        elapsed_s=max(0, int((ended_at - started).total_seconds())), start=started, end=max(ended_at, started),
        source="spz")



# ------------------------------------------------------------------ kept until published

def _kept_path(directory: Path, ev: SlurmAllocationAccounted) -> Path:
    # The Slurm cluster's name is a user's Host line: hashed, so it is never a path of its own.
    where = sha256(ev.slurm_cluster.encode()).hexdigest()[:16]
    return directory / f"{int(ev.slurm_job_id)}-{where}.json"


def keep(directory: Path, ev: SlurmAllocationAccounted) -> None:
    """Write the accounting (atomically) until the provisioner has published it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = _kept_path(directory, ev)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(ev.model_dump_json())
    tmp.replace(path)


def kept(directory: Path) -> list[SlurmAllocationAccounted]:
    """Every accounting kept and not yet forgotten (an unreadable file is logged and skipped)."""
    out = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        try:
            out.append(SlurmAllocationAccounted.model_validate_json(path.read_text()))
        except (OSError, ValueError) as exc:
            log.warning("slurm accounting %s unreadable: %s", path, exc)
    return out


def forget(directory: Path, events: Iterable[SlurmAllocationAccounted]) -> None:
    for ev in events:
        _kept_path(directory, ev).unlink(missing_ok=True)
