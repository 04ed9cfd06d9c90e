"""The metrics endpoint's settings (events/settings.py pattern: environment, config.yaml, default)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skypurza.events.settings import Sources, SettingsError

from .goodput import DEFAULT_BUSY_PCT

DEFAULT_PORT = 9464  # the port OpenTelemetry's Prometheus exporter uses: free on most hosts
DEFAULT_HOST = "127.0.0.1"  # loopback: a wider bind is the operator's explicit choice
DEFAULT_MAX_SERIES = 100  # distinct values kept per label (clusters, users...), the rest is "other"


@dataclass(frozen=True)
class MetricsSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_series: int = DEFAULT_MAX_SERIES
    query_timeout_s: float = 5.0  # one scrape never waits longer on a projection's answer
    busy_pct: float = DEFAULT_BUSY_PCT  # goodput: a GPU at or above this utilisation is doing work

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None) -> "MetricsSettings":
        src = Sources.load(env, config)
        host = src.text("SKYPURZA_METRICS_HOST", DEFAULT_HOST, key="observability.metrics_host") or DEFAULT_HOST
        if len(host) > 253 or any(c.isspace() for c in host):
            raise SettingsError(f"SKYPURZA_METRICS_HOST={host!r}: expected a host name or address")
        return cls(
            host=host,
            # 0: any free port (tests); the URL in use is what `spz api status -o json` shows.
            port=src.integer("SKYPURZA_METRICS_PORT", DEFAULT_PORT, low=0, high=65535, key="observability.metrics_port"),
            max_series=src.integer("SKYPURZA_METRICS_MAX_SERIES", DEFAULT_MAX_SERIES, low=1, high=10_000,
                                   key="observability.max_series"),
            query_timeout_s=src.seconds("SKYPURZA_METRICS_QUERY_TIMEOUT_S", 5.0, low=0.1, high=60.0,
                                        key="observability.query_timeout_s"),
            busy_pct=src.number("SKYPURZA_GOODPUT_BUSY_PCT", DEFAULT_BUSY_PCT, low=0.1, high=100.0,
                                key="observability.goodput_busy_pct"),
        )
