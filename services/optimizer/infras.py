"""Which infras can take work here (`spz check`): AWS when credentials answer; each enabled
Kubernetes context when its API server answers (with its free GPUs); local always.

I/O lives here (an STS call, nvidia-smi); the decision of what a task may use given these
answers is `placement.default_enabled_infras`, a pure function.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .placement import KNOWN_INFRAS, SUPPORTED_INFRAS


# What a plain `spz check` lists as "not supported yet" (a named infra is always answered).
_LISTED_UNSUPPORTED = ("azure", "gcp", "ssh")


@dataclass(frozen=True)
class InfraStatus:
    infra: str
    enabled: bool
    reason: str  # why (not): what to do when disabled
    detail: str = ""  # account, resources ...

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_aws(session: Any = None, endpoint_url: str | None = None, timeout_s: float = 5.0) -> InfraStatus:
    """Credentials found and STS (or, failing that, EC2) answers. Honours AWS_ENDPOINT_URL."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    sess = session or boto3.session.Session()
    try:
        creds = sess.get_credentials()
    except BotoCoreError as e:
        return InfraStatus("aws", False, f"AWS credentials could not be read: {e}")
    if creds is None:
        return InfraStatus("aws", False, "no AWS credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                                          "AWS_PROFILE, run `aws configure` or `aws sso login`")
    region = sess.region_name or "us-east-1"
    # One attempt each: STS then EC2 is already a second try, and `spz check` must answer quickly.
    cfg = Config(connect_timeout=timeout_s, read_timeout=timeout_s, retries={"max_attempts": 1, "mode": "standard"})
    errors = []
    try:
        ident = sess.client("sts", region_name=region, endpoint_url=endpoint_url, config=cfg).get_caller_identity()
        return InfraStatus("aws", True, "credentials found and STS answered",
                           f"account {ident.get('Account')} ({ident.get('Arn')})")
    except (BotoCoreError, ClientError) as e:
        errors.append(f"STS: {_short(e)}")
    try:
        sess.client("ec2", region_name=region, endpoint_url=endpoint_url, config=cfg).describe_regions()
        return InfraStatus("aws", True, "credentials found and EC2 answered", f"region {region}")
    except (BotoCoreError, ClientError) as e:
        errors.append(f"EC2: {_short(e)}")
    return InfraStatus("aws", False, "credentials found but AWS did not accept them or did not answer: "
                       + "; ".join(errors))


def check_kubernetes(contexts: Any = None) -> list[InfraStatus]:
    """One line per enabled context (`kubernetes/<context>`): reachable, and its free GPUs and CPUs."""
    from skypurza.events.k8s_config import KubernetesSettings, read_all_capacity

    settings = KubernetesSettings.load()
    if contexts is None:
        if not settings.configured():
            return [InfraStatus("kubernetes", False, f"no kubeconfig at {settings.kubeconfig_path()}: set "
                                "KUBECONFIG or kubernetes.kubeconfig, or run in a pod (SKYPURZA_K8S_IN_CLUSTER=1)")]
        contexts = read_all_capacity(settings)
    if not contexts:
        return [InfraStatus("kubernetes", False, "no context of the kubeconfig is enabled: "
                            "check kubernetes.allowed_contexts and the current context")]
    out = []
    for c in contexts:
        if not c.reachable:
            out.append(InfraStatus(f"kubernetes/{c.context}", False, f"the API server did not answer: {c.error}"))
            continue
        gpus = ", ".join(f"{g}:{n}" for g, n in sorted(c.gpus().items())) or "no GPU"
        out.append(InfraStatus(f"kubernetes/{c.context}", True, "the API server answered",
                               f"{len(c.nodes)} nodes ready; free: {c.cpus():g} CPUs, {gpus}"))
    return out


def check_slurm(clusters: Any = None) -> list[InfraStatus]:
    """One line per cluster of ~/.slurm/config (`slurm/<cluster>`): its login node answered, and
    its partitions with their nodes and GPUs."""
    from skypurza.events.slurmpath import slurm_config_path

    from .world import slurm_clusters

    if clusters is None:
        clusters = slurm_clusters(frozenset({"slurm"}))
    if not clusters:
        return [InfraStatus("slurm", False, f"no cluster in {slurm_config_path()} (or none in "
                            "slurm.allowed_clusters): add a Host per cluster, as for SkyPilot")]
    out = []
    for c in clusters:
        if not c.reachable:
            out.append(InfraStatus(f"slurm/{c.cluster}" if c.cluster != "*" else "slurm", False, c.error))
            continue
        parts = "; ".join(f"{o.partition}: {o.nodes} nodes, {o.cpus} CPUs"
                          + "".join(f", {k or 'gpu'}:{n}" for k, n in o.gpus.items()) for o in c.offers)
        out.append(InfraStatus(f"slurm/{c.cluster}", bool(c.offers), "the login node answered" if c.offers
                               else "the login node answered but no partition is up", parts))
    return out


def check_local(local: Any = None) -> InfraStatus:
    from .local import detect_local_resources

    res = local or detect_local_resources()
    return InfraStatus("local", True, "always available: this machine runs tasks with its own agent",
                       res.describe())


def check_infras(only: list[str] | None = None, *, session: Any = None, endpoint_url: str | None = None,
                 local: Any = None) -> list[InfraStatus]:
    from .placement import normalize_infra

    wanted = [normalize_infra(i) for i in only] if only else None
    out: list[InfraStatus] = []
    if wanted is None or "aws" in wanted:
        out.append(check_aws(session, endpoint_url))
    if wanted is None or "kubernetes" in wanted:
        out.extend(check_kubernetes())
    if wanted is None or "slurm" in wanted:
        out.extend(check_slurm())
    if wanted is None or "local" in wanted:
        out.append(check_local(local))
    others = sorted(_LISTED_UNSUPPORTED if wanted is None
                    else {w for w in wanted if w and w not in SUPPORTED_INFRAS})
    for name in others:
        why = "not supported yet" if name in KNOWN_INFRAS else "unknown infra"
        out.append(InfraStatus(name, False, f"{why}: SkyPurza runs aws, kubernetes, slurm and local today"))
    return out


def _short(e: BaseException) -> str:
    s = str(e).splitlines()[0] if str(e) else type(e).__name__
    return s[:200]
