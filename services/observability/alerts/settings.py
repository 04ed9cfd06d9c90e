"""The alerts service's thresholds and webhooks (events/settings.py: environment, then
`config.yaml`'s `alerts.*`, then the default). docs/observability.md (*Alerts*) lists them.

    SKYPURZA_ALERTS_IDLE_S=14400             alerts.idle_s              a cluster idle (no autostop) this long; 60-2592000
    SKYPURZA_ALERTS_PENDING_S=3600           alerts.pending_s           a job pending this long; 10-2592000
    SKYPURZA_ALERTS_MAX_RECOVERIES=3         alerts.max_recoveries      a managed job recovered more often; 0-10000
    SKYPURZA_ALERTS_DEAD_LETTER_WINDOW_S=3600 alerts.dead_letter_window_s  a dead letter fires for this long; 10-604800
    SKYPURZA_ALERTS_EVAL_S=30                alerts.eval_s              how often the rules are judged; 0.05-3600
    SKYPURZA_ALERTS_SLACK_WEBHOOKS=          alerts.slack_webhooks      URLs given Slack's {"text", "blocks"}
    SKYPURZA_ALERTS_JSON_WEBHOOKS=           alerts.json_webhooks       URLs given the plain JSON form
    SKYPURZA_ALERTS_ATTEMPTS=5               alerts.attempts            tries per message and webhook; 1-20
    SKYPURZA_ALERTS_BACKOFF_S=2              alerts.backoff_s           first retry delay, doubled each time (cap 300 s); 0.01-300
    SKYPURZA_ALERTS_TIMEOUT_S=10             alerts.timeout_s           one POST; 0.5-60
    SKYPURZA_ALERTS_NOTIFY_RESOLVED=true     alerts.notify_resolved     also send a message when an alert resolves
"""

from __future__ import annotations

import hashlib
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skypurza.events.settings import SettingsError, Sources

SLACK_WEBHOOKS_ENV = "SKYPURZA_ALERTS_SLACK_WEBHOOKS"
JSON_WEBHOOKS_ENV = "SKYPURZA_ALERTS_JSON_WEBHOOKS"
# The keys of a deployment's webhooks secret (naming.alerts_webhooks_secret; infra/services.py),
# each handed to the alerts container as the variable beside it.
WEBHOOKS_SECRET_KEYS = {"slack": SLACK_WEBHOOKS_ENV, "json": JSON_WEBHOOKS_ENV}
MONTH_S = 30 * 86400.0
MAX_WEBHOOKS = 10
MAX_URL = 2048


@dataclass(frozen=True)
class Webhook:
    url: str
    form: str  # slack | json

    @property
    def id(self) -> str:
        """What the log and the logs name it by: a digest, never the URL (Slack's holds its token)."""
        return f"{self.form}-{hashlib.sha256(self.url.encode()).hexdigest()[:12]}"


def check_url(url: str, where: str) -> str:
    if len(url) > MAX_URL:
        raise SettingsError(f"{where}: a webhook URL longer than {MAX_URL} characters")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        # Never echo the URL: it may be a credential.
        raise SettingsError(f"{where}: expected http:// or https:// URLs with a host")
    return url


def _webhooks(src: Sources, var: str, key: str, form: str) -> tuple[Webhook, ...]:
    urls = src.names(var, key=key)
    return tuple(Webhook(check_url(u, var), form) for u in urls)


@dataclass(frozen=True)
class AlertSettings:
    idle_s: float = 4 * 3600.0
    pending_s: float = 3600.0
    max_recoveries: int = 3
    dead_letter_window_s: float = 3600.0
    eval_s: float = 30.0
    webhooks: tuple[Webhook, ...] = ()
    attempts: int = 5
    backoff_s: float = 2.0
    timeout_s: float = 10.0
    notify_resolved: bool = True

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None) -> AlertSettings:
        src = Sources.load(env, config)
        b = cls()
        hooks = (_webhooks(src, SLACK_WEBHOOKS_ENV, "alerts.slack_webhooks", "slack")
                 + _webhooks(src, JSON_WEBHOOKS_ENV, "alerts.json_webhooks", "json"))
        if len(hooks) > MAX_WEBHOOKS:
            raise SettingsError(f"alerts: {len(hooks)} webhooks; at most {MAX_WEBHOOKS}")
        return cls(
            idle_s=src.seconds("SKYPURZA_ALERTS_IDLE_S", b.idle_s, low=60, high=MONTH_S, key="alerts.idle_s"),
            pending_s=src.seconds("SKYPURZA_ALERTS_PENDING_S", b.pending_s, low=10, high=MONTH_S,
                                  key="alerts.pending_s"),
            max_recoveries=src.integer("SKYPURZA_ALERTS_MAX_RECOVERIES", b.max_recoveries, low=0, high=10_000,
                                       key="alerts.max_recoveries"),
            dead_letter_window_s=src.seconds("SKYPURZA_ALERTS_DEAD_LETTER_WINDOW_S", b.dead_letter_window_s, low=10,
                                             high=7 * 86400, key="alerts.dead_letter_window_s"),
            eval_s=src.seconds("SKYPURZA_ALERTS_EVAL_S", b.eval_s, low=0.05, high=3600, key="alerts.eval_s"),
            webhooks=tuple({h.id: h for h in hooks}.values()),  # the same URL twice is one webhook
            attempts=src.integer("SKYPURZA_ALERTS_ATTEMPTS", b.attempts, low=1, high=20, key="alerts.attempts"),
            backoff_s=src.seconds("SKYPURZA_ALERTS_BACKOFF_S", b.backoff_s, low=0.01, high=300, key="alerts.backoff_s"),
            timeout_s=src.seconds("SKYPURZA_ALERTS_TIMEOUT_S", b.timeout_s, low=0.5, high=60, key="alerts.timeout_s"),
            notify_resolved=src.flag("SKYPURZA_ALERTS_NOTIFY_RESOLVED", b.notify_resolved,
                                     key="alerts.notify_resolved"),
        )
