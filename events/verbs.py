"""What a verb on a cluster acts on: the decisions the CLI and the API server share.

`spz stop|start|down` and `POST /api/v1/clusters/{name}/{stop|start|down}` take a cluster in the
same states to the same goal; `spz cancel` and `POST .../jobs/cancel` pick the same jobs. Pure:
the callers read the cluster (cli/clusterlog.py, services/api/clusterview.py) and publish.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Lifecycle = Literal["stop", "start", "down"]

# The states a verb acts from (a cluster in another state is skipped: "already ...").
LIFECYCLE_FROM: Mapping[str, tuple[str, ...]] = {
    "stop": ("UP", "INIT"), "start": ("STOPPED",), "down": ("UP", "STOPPED", "INIT")}
# The state the verb's request ends in, when the provisioner has done it.
LIFECYCLE_GOAL: Mapping[str, str] = {"stop": "STOPPED", "start": "UP", "down": "TERMINATED"}


def stop_refusal(cluster: str, use_spot: bool) -> str | None:
    """Why `stop` cannot be asked of the cluster, or None: spot instances cannot be stopped."""
    if use_spot:
        return f"cluster {cluster} runs on spot instances, which cannot be stopped: spz down {cluster}"
    return None


@dataclass(frozen=True)
class CancelChoice:
    targets: tuple[int, ...]  # the jobs to cancel, in the order given
    ended: tuple[int, ...] = ()  # named, but already ended
    missing: tuple[int, ...] = ()  # named, but not jobs of the cluster


def cancel_targets(jobs: Mapping[int, Any], job_ids: Sequence[int] = (), all_: bool = False) -> CancelChoice:
    """The jobs a cancel acts on. `jobs`: job id -> anything with `.status` and `.terminal`.
    All unfinished ones with `all_`; the named ones that have not ended; with neither, the latest
    unfinished job that has started (else the latest pending one), as `sky cancel` does."""
    open_ids = [j for j in sorted(jobs) if not jobs[j].terminal]
    if all_:
        return CancelChoice(tuple(open_ids))
    if job_ids:
        missing = tuple(j for j in job_ids if j not in jobs)
        if missing:
            return CancelChoice((), missing=missing)
        ended = tuple(j for j in job_ids if jobs[j].terminal)
        return CancelChoice(tuple(j for j in dict.fromkeys(job_ids) if not jobs[j].terminal), ended)
    running = [j for j in open_ids if jobs[j].status != "PENDING"] or open_ids
    return CancelChoice(tuple(running[-1:]))


def retry_delay_s(attempt: int) -> float:
    """`launch -r/--retry-until-up`: seconds before submission `attempt + 1` (10 s, doubling, at
    most 5 minutes); the embedded launch and the one through an API server wait the same."""
    return float(min(10 * 2 ** min(attempt - 1, 10), 300))
