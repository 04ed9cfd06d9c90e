"""How clients reach the bus and how many copies the log keeps (events/settings.py's pattern).

    SKYPURZA_NATS_URL=nats://a:4222,nats://b:4222    # one server, or every node of a cluster
    SKYPURZA_REPLICAS=3                              # copies of each stream: 1 (one server), 3 in a cluster
    SKYPURZA_NATS_PLACEMENT_WAIT_S=30                # how long stream creation waits for the peers

A client is given every node of a cluster, not one: nats-py tries them in turn at connect and on
reconnect, so a node down when a command starts is not the command's failure. The replica count
is read where streams are created (`Bus.ensure_streams`); a stream already made keeps its own.
Why the placement wait: a cluster just started knows its peers only after its JetStream meta
leader is elected (0.25-5.3 s measured); until then a replicated stream is refused with "no
suitable peers for placement" (err 10005), so creation retries, bounded by this.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .settings import SettingsError, Sources

MAX_REPLICAS = 5  # JetStream's largest
MAX_SERVERS = 16
SCHEMES = ("nats", "tls")  # the bus speaks nats:// only (events/natslight.py): no websockets


@dataclass(frozen=True)
class BusSettings:
    replicas: int = 1
    placement_wait_s: float = 30.0

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None) -> "BusSettings":
        src = Sources.load(env, config, tolerate_broken_config=True)
        base = cls()
        return cls(
            replicas=src.integer("SKYPURZA_REPLICAS", base.replicas, low=1, high=MAX_REPLICAS, key="nats.replicas"),
            placement_wait_s=src.seconds("SKYPURZA_NATS_PLACEMENT_WAIT_S", base.placement_wait_s, high=600.0,
                                         key="nats.placement_wait_s"),
        )


def parse_servers(value: Any, where: str = "SKYPURZA_NATS_URL") -> list[str]:
    """The server URLs of one bus: a URL, comma-separated URLs, or a list of them. Each is
    nats:// or tls:// with a host (port 4222 when none is given), at most MAX_SERVERS, no
    repeats; anything else is a SettingsError naming it."""
    items: list[Any] = value.split(",") if isinstance(value, str) else list(value) \
        if isinstance(value, (list, tuple)) else [value]
    urls = [str(x).strip() for x in items if str(x).strip()]
    if not urls:
        raise SettingsError(f"{where}={value!r}: expected a NATS URL such as nats://127.0.0.1:4222")
    if len(urls) > MAX_SERVERS:
        raise SettingsError(f"{where}: {len(urls)} server URLs; at most {MAX_SERVERS}")
    out: list[str] = []
    for url in urls:
        if len(url) > 512:
            raise SettingsError(f"{where}: a server URL longer than 512 characters")
        try:
            parts = urlsplit(url if "://" in url else f"nats://{url}")
            port = parts.port
        except ValueError:
            raise SettingsError(f"{where}: {url!r} is not a URL (nats://host:port)") from None
        if parts.scheme not in SCHEMES or not parts.hostname:
            raise SettingsError(f"{where}: {url!r}: expected nats://host:port or tls://host:port")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise SettingsError(f"{where}: {url!r}: a server URL has no path or query")
        full = f"{parts.scheme}://{parts.netloc}" + ("" if port else ":4222")
        if full in out:
            raise SettingsError(f"{where}: {url!r} is listed twice")
        out.append(full)
    return out
