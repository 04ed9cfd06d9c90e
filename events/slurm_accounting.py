"""What Slurm says an allocation used: `sacct` rows, `scontrol show job` TRES, PriorityFlags. Pure.

The provisioner reads these over SSH when one of our allocations ends and publishes the facts
as a SlurmAllocationAccounted event; the ledger bills them with the partition's
TRESBillingWeights (services/ledger/billing.py). The ledger never talks to Slurm, so nothing
here needs more than the text Slurm printed.

Why the commands look as they do (docs/slurm.md, *Billing*):
- `sacct -X -n -P --noconvert`: one row per allocation (no steps), no header, `|`-separated, and
  memory in MiB as stored (without `--noconvert` sacct rounds 15994M to `15.62G`, which is not a
  whole number of MiB).
- `scontrol show job -o` gives the same TRES while the job runs, with or without slurmdbd: the
  fallback when the cluster keeps no accounting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = [
    "SACCT_FIELDS",
    "SacctRow",
    "accounting_disabled",
    "allocation_end",
    "parse_job_states",
    "job_fields",
    "parse_sacct",
    "parse_slurm_time",
    "parse_tres_counts",
    "priority_flags",
    "sacct_command",
    "split_billing",
]

SACCT_FIELDS = ("JobIDRaw", "State", "AllocTRES", "ElapsedRaw", "Start", "End", "Partition")
MAX_TRES_ITEMS = 64  # more TRES than any site tracks: the text is not what we asked for
MAX_COUNT = 10**15  # a TRES count (mem in MiB) beyond any machine
MAX_ELAPSED_S = 10 * 366 * 86_400  # ten years: an allocation's elapsed time past this is garbage
_KEY_RE = re.compile(r"^[a-z][a-z0-9_]*(/[a-z0-9_.\-]+(:[a-z0-9_.\-]+)?)?$")
_COUNT_RE = re.compile(r"^(\d+)([KMGTP]?)$")
_UNIT = {"": 1, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}  # to MiB (K is not a whole MiB)
_FINAL_STATES = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                           "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED"})


def sacct_command(job_id: int) -> str:
    return f"sacct -X -n -P --noconvert -j {int(job_id)} -o {','.join(SACCT_FIELDS)}"


@dataclass(frozen=True)
class SacctRow:
    job_id: int
    state: str  # the first word: "CANCELLED by 0" is CANCELLED
    alloc_tres: dict[str, int]  # without billing; mem in MiB
    billing: int | None  # the billing Slurm stored (AllocTRES billing=), None when not shown
    elapsed_s: int
    start: datetime | None
    end: datetime | None
    partition: str

    @property
    def final(self) -> bool:
        """The allocation has ended and its row will not change (End is set)."""
        return self.state in _FINAL_STATES and self.end is not None


def parse_tres_counts(text: str) -> dict[str, int]:
    """`cpu=2,mem=2000M,node=1,billing=5,gres/gpu:h100=1` → counts, memory in MiB.

    Refuses (ValueError) anything that is not a whole count per key: what Slurm printed must be
    read exactly or not at all, since billing is a function of it.
    """
    out: dict[str, int] = {}
    text = text.strip()
    if not text:
        return out
    items = text.split(",")
    if len(items) > MAX_TRES_ITEMS:
        raise ValueError(f"{len(items)} TRES items, more than {MAX_TRES_ITEMS}")
    for item in items:
        key, eq, value = item.strip().partition("=")
        key = key.strip().lower()
        if not eq or not _KEY_RE.match(key):
            raise ValueError(f"not a TRES item: {item!r}")
        m = _COUNT_RE.match(value.strip())
        if not m:
            raise ValueError(f"{key}: not a whole count: {value!r}")
        count = int(m.group(1))
        unit = m.group(2)
        if unit and key not in ("mem", "vmem") and not key.startswith("bb/"):
            raise ValueError(f"{key}: a unit ({unit}) on a count")
        if unit not in _UNIT:
            raise ValueError(f"{key}={value}: not a whole number of MiB")
        count *= _UNIT[unit]
        if count > MAX_COUNT:
            raise ValueError(f"{key}={value}: beyond any machine")
        out[key] = count
    return out


def split_billing(tres: dict[str, int]) -> tuple[dict[str, int], int | None]:
    """The TRES without `billing`, and the billing Slurm stored (None when absent)."""
    rest = {k: v for k, v in tres.items() if k != "billing"}
    return rest, tres.get("billing")


def parse_slurm_time(text: str) -> datetime | None:
    """sacct's `2026-12-01T20:05:20` (the cluster's local time; our rigs and most sites run UTC).

    `Unknown`, `None` and empty are None (a job that has not started or ended)."""
    text = text.strip()
    if text in ("", "Unknown", "None", "N/A"):
        return None
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def parse_sacct(text: str) -> list[SacctRow]:
    """Rows of `sacct_command` output. A line that is not one (a warning sacct printed) is skipped."""
    rows = []
    for line in text.splitlines()[:1000]:
        parts = line.strip().split("|")
        if len(parts) != len(SACCT_FIELDS) or not parts[0].isdigit():
            continue
        job, state, tres, elapsed, start, end, partition = parts
        if not elapsed.isdigit() or int(elapsed) > MAX_ELAPSED_S:
            continue
        try:
            counts, billing = split_billing(parse_tres_counts(tres))
            row = SacctRow(job_id=int(job), state=(state.split() or [""])[0], alloc_tres=counts,
                           billing=billing, elapsed_s=int(elapsed), start=parse_slurm_time(start),
                           end=parse_slurm_time(end), partition=partition.strip())
        except ValueError:
            continue
        rows.append(row)
    return rows


def accounting_disabled(text: str) -> bool:
    """sacct's answer on a cluster without slurmdbd (accounting_storage/none)."""
    t = text.lower()
    return "accounting storage is disabled" in t or ("slurmdbd" in t and "connect" in t)


def job_fields(text: str) -> dict[str, str]:
    """`scontrol show job -o` (one line of Key=Value) → its fields. Values hold no spaces but
    Command=/WorkDir= may; only the first line is read."""
    line = (text.strip().splitlines() or [""])[0]
    out: dict[str, str] = {}
    for token in line.split():
        key, eq, value = token.partition("=")
        if eq and key and key not in out:
            out[key] = value
    return out


def priority_flags(config_text: str) -> str:
    """PriorityFlags from `scontrol show config` ("" when unset or "(null)")."""
    for line in config_text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "PriorityFlags":
            value = value.strip()
            return "" if value in ("(null)", "None") else value
    return ""


# ---------------------------------------------------------------------------------- an allocation's end

# What an allocation's end means to a managed job on it (recovery): "preempted" (requeue-like:
# Slurm took the nodes for another job), "node_lost" (a node failed, or the allocation was ended
# by someone else: an admin's scancel, a time limit), None while it runs.
_ALIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "RESIZING", "REQUEUED", "REQUEUE_HOLD",
                    "REQUEUE_FED", "SIGNALING", "STAGE_OUT"})


def allocation_end(state: str | None) -> str | None:
    """The finding for an allocation in this squeue/sacct state (None: still alive). A job
    squeue no longer lists (state None) has ended too."""
    if state is None:
        return "node_lost"
    word = (state.split() or [""])[0].upper().rstrip("+")
    if word in _ALIVE:
        return None
    if word == "PREEMPTED":
        return "preempted"
    # COMPLETING too: our allocations never complete on their own (the script holds them until
    # scancel), so one that is completing was ended, and its steps fail a moment before it is gone.
    return "node_lost"


def parse_job_states(text: str) -> dict[int, str]:
    """`squeue -h -o '%i|%T'` (or sacct's `JobIDRaw|State`) lines → job id → state."""
    out: dict[int, str] = {}
    for line in text.splitlines()[:10_000]:
        job, _, state = line.strip().partition("|")
        if job.isdigit() and state:
            out[int(job)] = state.split("|")[0].strip()
    return out
