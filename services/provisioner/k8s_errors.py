"""Why a gang of pods did not come up, as a Failure (pure: the pods and their Events as dicts in).

What Kubernetes says, and what the optimizer does with it:

| what the pods show | Failure | the optimizer |
|---|---|---|
| FailedScheduling "Insufficient nvidia.com/gpu" (or cpu, memory, pods, "Too many pods") | capacity | blocks that size in that context, fails over (another context, AWS) |
| FailedScheduling only "didn't match Pod's node affinity/selector" | invalid (fatal) | no node carries the GPU label asked for: a label to fix, not capacity |
| FailedScheduling "untolerated taint" | unsupported | blocks that candidate |
| a container waiting with ErrImagePull, ImagePullBackOff, InvalidImageName | invalid (fatal) | the image is wrong for every context |
| a pod Failed or Evicted while the gang comes up | capacity | fails over |
| still Pending at the provision timeout, nothing said | capacity (`LaunchTimeout`) | fails over |
| the API answers 401/403 | auth | blocks the infra |
| 422 (a manifest the server refuses), 404 namespace | invalid | the task fails |
| 429, 5xx, no answer | transient | retried |
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .adapter import Failure, FailureKind, FailureScope

_INSUFFICIENT = re.compile(r"Insufficient ([A-Za-z0-9./_-]+)|Too many pods", re.IGNORECASE)
_SELECTOR = re.compile(r"didn't match (Pod's )?node (affinity|selector)", re.IGNORECASE)
_TAINT = re.compile(r"untolerated taint|had taint", re.IGNORECASE)
_IMAGE = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
LABEL_HINT = ("no node of this context carries a label naming that GPU: label the GPU nodes "
              "(nvidia.com/gpu.product, or your cloud's accelerator label; docs/kubernetes.md)")


def _events_of(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    # By uid too: a pod of an earlier attempt had the same name, and its Events outlive it (an hour).
    meta = pod.get("metadata") or {}
    name, uid = meta.get("name"), meta.get("uid")
    return [e for e in events if (e.get("involvedObject") or {}).get("name") == name
            and (not uid or (e.get("involvedObject") or {}).get("uid") in (None, "", uid))]


def scheduling_failure(message: str) -> Failure:
    """One FailedScheduling message as a Failure."""
    if _INSUFFICIENT.search(message):
        return Failure(FailureKind.CAPACITY, FailureScope.REGION, "FailedScheduling", message)
    if _SELECTOR.search(message) and not _TAINT.search(message):
        return Failure(FailureKind.INVALID, FailureScope.REQUEST, "GpuLabelUnknown", message, hint=LABEL_HINT)
    if _TAINT.search(message):
        return Failure(FailureKind.UNSUPPORTED, FailureScope.REGION, "UntoleratedTaint", message,
                       hint="add a toleration in kubernetes.pod_config")
    return Failure(FailureKind.CAPACITY, FailureScope.REGION, "FailedScheduling", message)


def pod_failure(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> Failure | None:
    """What stops this pod from running, if anything says so yet (None: keep waiting)."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in _IMAGE:
            return Failure(FailureKind.INVALID, FailureScope.REQUEST, str(waiting["reason"]),
                           str(waiting.get("message") or ""), hint="check kubernetes.image (SKYPURZA_K8S_IMAGE)")
    if status.get("phase") == "Failed":
        reason = str(status.get("reason") or "PodFailed")
        return Failure(FailureKind.CAPACITY, FailureScope.REGION, reason, str(status.get("message") or reason))
    mine = _events_of(pod, events)
    failed = [e for e in mine if e.get("reason") == "FailedScheduling"]
    if failed:
        latest = max(failed, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        return scheduling_failure(str(latest.get("message") or ""))
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("message"):
            return scheduling_failure(str(cond["message"]))
    return None


def gang_failure(pods: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]) -> Failure | None:
    """The gang's failure: a fatal one first (it holds for every context), then the first other."""
    found = [f for p in pods if (f := pod_failure(p, events)) is not None]
    fatal = [f for f in found if f.fatal]
    return (fatal or found or [None])[0]


def timeout_failure(timeout_s: float, pending: Sequence[str]) -> Failure:
    names = ", ".join(pending[:5]) + (f" and {len(pending) - 5} more" if len(pending) > 5 else "")
    return Failure(FailureKind.CAPACITY, FailureScope.REGION, "LaunchTimeout",
                   f"pods not Running within {timeout_s:g}s: {names}")


def api_failure(status: int | None, reason: str, message: str) -> Failure:
    """An ApiException (or no answer: status None) as a Failure."""
    text = message or reason
    if status in (401, 403):
        return Failure(FailureKind.AUTH, FailureScope.CLOUD, f"Http{status}", text,
                       hint="the kubeconfig's user needs the Role in docs/kubernetes.md (RBAC)")
    if status in (400, 404, 422):
        return Failure(FailureKind.INVALID, FailureScope.REQUEST, reason or f"Http{status}", text)
    if status is None:
        return Failure(FailureKind.TRANSIENT, FailureScope.REQUEST, "Unreachable", text)
    return Failure(FailureKind.TRANSIENT, FailureScope.REQUEST, reason or f"Http{status}", text)
