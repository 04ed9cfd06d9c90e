"""Kubernetes as SkyPurza reads it: the settings the optimizer and the provisioner share, and the
one way a client for a kubeconfig context is made.

A kubeconfig context is a "region" of the `kubernetes` infra (`--infra k8s/<context>`).
Settings, environment first, then `~/.skypurza/config.yaml`'s `kubernetes:` (SkyPilot's keys),
then the default (events/settings.py):

    SKYPURZA_KUBECONFIG / KUBECONFIG        kubernetes.kubeconfig     (~/.kube/config)
    SKYPURZA_K8S_CONTEXTS                   kubernetes.allowed_contexts  (the current context)
    SKYPURZA_K8S_NAMESPACE                  kubernetes.namespace      (the context's, else default)
    SKYPURZA_K8S_IMAGE                      kubernetes.image          (python:3.11-slim)
    SKYPURZA_K8S_PROVISION_TIMEOUT_S        kubernetes.provision_timeout  (600 s; 1-86400)
    SKYPURZA_K8S_GPU_HOURLY_USD             kubernetes.gpu_hourly_usd (0: SkyPilot prices k8s at $0)
    SKYPURZA_K8S_CPU_HOURLY_USD             kubernetes.cpu_hourly_usd (0)
    SKYPURZA_K8S_PLACEMENT                  kubernetes.placement      (by_price; before_cloud, after_cloud)
                                            kubernetes.pod_config     (config only: merged into each pod)
    SKYPURZA_K8S_IN_CLUSTER=1               use the pod's service account (context "in-cluster")

Nothing here runs at import; `client_for` imports the `kubernetes` package only when called.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .settings import SettingsError, Sources, parse_choice

if TYPE_CHECKING:
    from .k8s_capacity import ContextCapacity

IN_CLUSTER = "in-cluster"
DEFAULT_IMAGE = "python:3.11-slim"
DEFAULT_PROVISION_TIMEOUT_S = 600.0
MAX_POD_CONFIG_BYTES = 256 * 1024  # a pod_config is a pod spec fragment, never megabytes
CAPACITY_TIMEOUT_S = 10.0  # `spz check` and a placement never wait longer on one context
# Where the optimizer ranks contexts against the other infras: by price (SkyPilot's way, and $0
# by default so first), or ahead of / behind every other infra whatever the prices.
PLACEMENTS = ("by_price", "before_cloud", "after_cloud")


@dataclass(frozen=True)
class KubernetesSettings:
    kubeconfig: str = ""  # "" : ~/.kube/config
    allowed_contexts: tuple[str, ...] = ()  # empty: the kubeconfig's current context
    namespace: str | None = None
    image: str = DEFAULT_IMAGE
    provision_timeout_s: float = DEFAULT_PROVISION_TIMEOUT_S
    gpu_hourly_usd: float = 0.0
    cpu_hourly_usd: float = 0.0
    pod_config: Mapping[str, Any] = field(default_factory=dict)
    in_cluster: bool = False
    placement: str = "by_price"  # one of PLACEMENTS

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None) -> "KubernetesSettings":
        src = Sources.load(env, config, tolerate_broken_config=True)
        base = cls()
        kubeconfig = src.text("SKYPURZA_KUBECONFIG", key="kubernetes.kubeconfig") or src.text("KUBECONFIG") or ""
        pod_config = src.raw(None, "kubernetes.pod_config")
        if pod_config is not None and not isinstance(pod_config[0], Mapping):
            raise SettingsError(f"{pod_config[1]}={pod_config[0]!r}: expected a mapping (a pod spec fragment)")
        pc = dict(pod_config[0]) if pod_config is not None else {}
        placement = src.located("SKYPURZA_K8S_PLACEMENT", "kubernetes.placement",
                                lambda value, where: parse_choice(value, where, PLACEMENTS, fold=str.lower))
        if len(repr(pc)) > MAX_POD_CONFIG_BYTES:
            raise SettingsError(f"kubernetes.pod_config: larger than {MAX_POD_CONFIG_BYTES} bytes")
        return cls(
            kubeconfig=kubeconfig.split(os.pathsep)[0],
            allowed_contexts=src.names("SKYPURZA_K8S_CONTEXTS", key="kubernetes.allowed_contexts"),
            namespace=src.text("SKYPURZA_K8S_NAMESPACE", key="kubernetes.namespace"),
            image=src.text("SKYPURZA_K8S_IMAGE", base.image, key="kubernetes.image") or base.image,
            provision_timeout_s=src.seconds("SKYPURZA_K8S_PROVISION_TIMEOUT_S", base.provision_timeout_s, low=1,
                                            high=86400, key="kubernetes.provision_timeout"),
            gpu_hourly_usd=src.number("SKYPURZA_K8S_GPU_HOURLY_USD", 0.0, low=0, high=10000,
                                      key="kubernetes.gpu_hourly_usd"),
            cpu_hourly_usd=src.number("SKYPURZA_K8S_CPU_HOURLY_USD", 0.0, low=0, high=10000,
                                      key="kubernetes.cpu_hourly_usd"),
            pod_config=pc,
            in_cluster=src.flag("SKYPURZA_K8S_IN_CLUSTER", False, key="kubernetes.in_cluster"),
            placement=placement or base.placement,
        )

    def kubeconfig_path(self, home: Path | None = None) -> Path:
        return Path(self.kubeconfig).expanduser() if self.kubeconfig else (home or Path.home()) / ".kube" / "config"

    def configured(self, home: Path | None = None) -> bool:
        """A cheap guess, like events/awsconfig.py: a kubeconfig file exists or we run in a pod."""
        return self.in_cluster or self.kubeconfig_path(home).is_file()


def contexts_of(kubeconfig: Mapping[str, Any]) -> tuple[list[str], str | None]:
    """The context names of a parsed kubeconfig and its current context (pure)."""
    names = [str(c.get("name")) for c in kubeconfig.get("contexts") or [] if isinstance(c, Mapping) and c.get("name")]
    current = kubeconfig.get("current-context")
    return names, str(current) if current else None


def namespace_of(kubeconfig: Mapping[str, Any], context: str) -> str | None:
    for c in kubeconfig.get("contexts") or []:
        if isinstance(c, Mapping) and c.get("name") == context:
            return (c.get("context") or {}).get("namespace")
    return None


def choose_contexts(available: list[str], current: str | None, allowed: tuple[str, ...]) -> list[str]:
    """SkyPilot's rule: `allowed_contexts` when set (those that exist, in that order), else the
    current context (pure)."""
    if allowed:
        return [c for c in allowed if c in available]
    return [current] if current and current in available else available[:1]


def read_kubeconfig(settings: KubernetesSettings) -> dict[str, Any]:
    """The kubeconfig file, parsed with the bounded YAML loader; {} when there is none."""
    if settings.in_cluster:
        return {"contexts": [{"name": IN_CLUSTER, "context": {}}], "current-context": IN_CLUSTER}
    path = settings.kubeconfig_path()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return {}
    from .config import parse_config

    return parse_config(text, str(path))


def enabled_contexts(settings: KubernetesSettings) -> list[str]:
    kc = read_kubeconfig(settings)
    available, current = contexts_of(kc)
    return choose_contexts(available, current, settings.allowed_contexts)


def client_for(settings: KubernetesSettings, context: str, *, timeout_s: float = 10.0) -> Any:
    """An ApiClient for one context (the kubernetes package's own kubeconfig loader, so exec
    plugins, tokens and certificates work as with kubectl)."""
    try:
        import kubernetes
    except ModuleNotFoundError:
        raise SettingsError("the kubernetes package is not installed: pip install 'skypurza[kubernetes]'") from None

    if context == IN_CLUSTER:
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_incluster_config(client_configuration=cfg)
    else:
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(settings.kubeconfig_path()), context=context,
                                           client_configuration=cfg, persist_config=False)
    cfg.retries = 1  # every call is bounded by our own timeouts; urllib3's retries would hide an outage
    client = kubernetes.client.ApiClient(cfg)
    client.rest_client.pool_manager.connection_pool_kw["timeout"] = timeout_s
    return client


def namespace_for(settings: KubernetesSettings, context: str) -> str:
    if settings.namespace:
        return settings.namespace
    if context == IN_CLUSTER:
        try:
            return Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip() or "default"
        except OSError:
            return "default"
    return namespace_of(read_kubeconfig(settings), context) or "default"


def read_capacity(client: Any, context: str) -> "ContextCapacity":
    """Blocking: one context's nodes and pods through `client`, as events/k8s_capacity reads them."""
    import kubernetes

    from .k8s_capacity import context_capacity

    core = kubernetes.client.CoreV1Api(client)
    nodes = core.list_node(_request_timeout=CAPACITY_TIMEOUT_S)
    pods = core.list_pod_for_all_namespaces(_request_timeout=CAPACITY_TIMEOUT_S)
    plain = client.sanitize_for_serialization
    return context_capacity(context, [plain(n) for n in nodes.items], [plain(p) for p in pods.items])


def read_all_capacity(settings: KubernetesSettings) -> tuple["ContextCapacity", ...]:
    """Blocking: every enabled context's capacity, priced from the settings; one that does not
    answer is there as unreachable, with why (never an exception: `spz check` shows it)."""
    from dataclasses import replace

    from .k8s_capacity import ContextCapacity

    out = []
    try:
        contexts = enabled_contexts(settings)
    except Exception as exc:  # a broken kubeconfig is a line in `spz check`, never a stopped optimizer
        return (ContextCapacity(str(settings.kubeconfig_path()), (), reachable=False, error=_short(exc)),)
    for context in contexts:
        try:
            client = client_for(settings, context, timeout_s=CAPACITY_TIMEOUT_S)
            try:
                cap = read_capacity(client, context)
            finally:
                client.close()
        except Exception as exc:  # any failure of one context is that context's state, not ours
            first = _short(exc)
            cap = ContextCapacity(context, (), reachable=False, error=first)
        out.append(replace(cap, gpu_hourly_usd=settings.gpu_hourly_usd, cpu_hourly_usd=settings.cpu_hourly_usd,
                           placement=settings.placement))
    return tuple(out)


def _short(exc: BaseException) -> str:
    """One short line: urllib3 nests the reason ("[Errno 111] Connection refused") deep inside."""
    import re

    text = str(exc) or type(exc).__name__
    errno = re.search(r"\[Errno -?\d+\][^'\")]*", text)
    if errno:
        return errno.group(0).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:200]
