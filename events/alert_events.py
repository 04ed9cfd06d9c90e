"""Alerts, on the `alert` aggregate (keyed by the alert's de-dup key).

Emitted by the alerts service (platform: services/observability/alerts/, docs/observability.md
*Alerts*): AlertRaised when a condition begins, AlertResolved when it ends, AlertDelivered once
per (raise or resolve, webhook) when a webhook took the message or the service gave up on it, and
AlertDeliveryClaimed before a post: with several alerts instances running, the one whose claim
the log stored first posts the message, and the others take it over only once that claim lapses.
`spz alerts list` reads them back from the log. The key names one condition ("gpu_unhealthy:
gpubox:0:0:xid:79"), so one condition is one alert until it is resolved; a later raise of the
same key is a new occurrence (`occurrence` counts them).

Webhook URLs never enter the log (a Slack URL is a credential): a delivery names its webhook by
`webhook_id`, a digest of the URL (services/observability/alerts/settings.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from .registry import Event, register

# The built-in conditions (services/observability/alerts/rules.py).
AlertKind = Literal["cluster_idle", "job_pending", "managed_job_recoveries", "dead_letters", "orphan",
                    "gpu_unhealthy", "budget"]
AlertSeverity = Literal["critical", "warning", "info"]


class _AlertEvent(Event):
    AGGREGATE = "alert"
    AGGREGATE_KEY = "key"
    key: str  # the de-dup key: one condition, one alert until resolved


@register
class AlertRaised(_AlertEvent):
    EVENT_NAME = "alert_raised"
    kind: AlertKind
    subject: str  # what it is about, for people: a cluster, "cluster/job", a managed job, a service
    severity: AlertSeverity = "warning"
    summary: str = ""  # one line: "cluster dev-1 idle for 3.2 h with no autostop"
    evidence: dict[str, Any] = {}
    occurrence: int = 1  # 1 the first time this key fires, +1 each time it fires again after a resolve
    raised_at: datetime


@register
class AlertResolved(_AlertEvent):
    EVENT_NAME = "alert_resolved"
    kind: AlertKind
    subject: str
    occurrence: int = 1
    reason: str = ""  # why it ended: "a job started", "the cluster was terminated"
    resolved_at: datetime


@register
class AlertDelivered(_AlertEvent):
    EVENT_NAME = "alert_delivered"
    occurrence: int = 1
    what: Literal["raised", "resolved"] = "raised"
    webhook_id: str  # "slack-<digest>" | "json-<digest>": never the URL
    outcome: Literal["delivered", "gave_up"]
    attempts: int = 1
    error: str = ""  # the last failure, for a give-up (one line, cut)
    at: datetime


@register
class AlertDeliveryClaimed(_AlertEvent):
    """One alerts instance takes one message for one webhook before posting it. The claim's id
    is derived from the message, the webhook and `round`, so of several instances claiming at
    once the log stores one (the others' appends come back as duplicates and they wait); a claim
    with no AlertDelivered by `until` lapses, and the next instance to look claims `round` + 1."""

    EVENT_NAME = "alert_delivery_claimed"
    occurrence: int = 1
    what: Literal["raised", "resolved"] = "raised"
    webhook_id: str
    claimant: str  # the claiming process: a random id each start, so a restart never mistakes an old claim for its own
    round: int = 1
    until: datetime  # the claim lapses then: past the longest a delivery's bounded retries can take
    at: datetime
