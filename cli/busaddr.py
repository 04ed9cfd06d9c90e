"""Where a deployment's bus listens and the address remote node agents are given (pure; checked
at the edge: `spz api start --bus-host/--bus-advertise` and the supervisor's own argv).

The bus listens on loopback unless told (`--bus-host`, a deployment only: a bus off loopback
takes its users only). Remote agents (EC2 user-data, Kubernetes pods) are handed the
*advertised* address (`--bus-advertise HOST:PORT`): what they can reach, which a wildcard bind
(0.0.0.0) or a NAT cannot say by itself. It becomes the provisioner's SKYPURZA_AGENT_NATS_URL.
"""

from __future__ import annotations

import ipaddress
import re

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


class BusAddressError(ValueError):
    """An address a person gave that cannot be used (the message says what to give instead)."""


def _host_ok(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return bool(_HOSTNAME.match(host))


def check_bus_host(host: str, deploy: bool) -> str:
    """The interface nats-server listens on; another than loopback needs a deployment."""
    host = host.strip()
    if not host or not _host_ok(host):
        raise BusAddressError(f"--bus-host {host!r} is not an IP address or host name (e.g. 0.0.0.0 or 10.0.0.5)")
    if host not in LOOPBACK_HOSTS and not deploy:
        raise BusAddressError(f"--bus-host {host} needs --deploy: without it the bus has no users, and anyone who "
                              "reaches it could publish anything")
    return "127.0.0.1" if host == "localhost" else host


def local_host(bind: str) -> str:
    """The address a client on this machine connects to (a wildcard bind is reached on loopback)."""
    return "127.0.0.1" if bind in WILDCARD_HOSTS or bind in LOOPBACK_HOSTS else bind


def parse_advertise(value: str) -> str:
    """`HOST:PORT` (or `nats://HOST:PORT`, `[v6]:PORT`) -> `nats://HOST:PORT`."""
    text = value.strip()
    body = text[len("nats://"):] if text.startswith("nats://") else text
    host, sep, port = body.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    hint = "give HOST:PORT, the address remote nodes reach the bus at (e.g. bus.example.com:4222)"
    if not sep or not host or "/" in body or "@" in body:
        raise BusAddressError(f"--bus-advertise {value!r}: {hint}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise BusAddressError(f"--bus-advertise {value!r}: the port must be from 1 to 65535; {hint}")
    if not _host_ok(host) or host in WILDCARD_HOSTS:
        raise BusAddressError(f"--bus-advertise {value!r}: {host!r} is not an address a node can reach; {hint}")
    shown = f"[{host}]" if ":" in host else host
    return f"nats://{shown}:{int(port)}"
