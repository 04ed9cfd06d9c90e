"""Which infras can take work here (`spz check`): AWS when credentials answer; local always.

I/O lives here (an STS call, nvidia-smi); the decision of what a task may use given these
answers is `placement.default_enabled_infras`, a pure function.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .placement import KNOWN_INFRAS, SUPPORTED_INFRAS


# What a plain `spz check` lists as "not supported yet" (a named infra is always answered).
_LISTED_UNSUPPORTED = ("azure", "gcp", "kubernetes", "slurm", "ssh")


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
    if wanted is None or "local" in wanted:
        out.append(check_local(local))
    others = sorted(_LISTED_UNSUPPORTED if wanted is None
                    else {w for w in wanted if w and w not in SUPPORTED_INFRAS})
    for name in others:
        why = "not supported yet" if name in KNOWN_INFRAS else "unknown infra"
        out.append(InfraStatus(name, False, f"{why}: SkyPurza runs aws and local today"))
    return out


def _short(e: BaseException) -> str:
    s = str(e).splitlines()[0] if str(e) else type(e).__name__
    return s[:200]
