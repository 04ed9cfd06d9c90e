"""A team's infra credentials, by reference: which of the server's own accounts its clusters use.

Modelled on SkyPilot 0.14.1's `workspaces:` config (`aws: {profile: NAME}`, `kubernetes:
{namespace: NAME}`, `slurm: {account: NAME}`): a reference names something the server already
holds (a profile of its AWS shared credentials/config files, a namespace its kubeconfig's contexts
can reach, a Slurm account), never a secret, so it may be on the log (TeamAdded / TeamUpdated `credentials`). The models stay
lenient, as every event model does (a newer writer's key is ignored); `check_credentials` is the
edge's rule (CLI, API server), with a message that names the key and what it accepts.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

# AWS's own profile names are letters, digits and `-_.` in practice (`aws configure --profile`);
# 64 is far above any real one and keeps a log line bounded.
AWS_PROFILE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
AWS_PROFILE_RULE = "1-64 letters, digits, '-', '_' or '.', starting with a letter or digit"
_AWS_PROFILE_RE = re.compile(AWS_PROFILE_PATTERN)

# A Kubernetes namespace name is an RFC 1123 label (the API server refuses anything else).
K8S_NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
K8S_NAMESPACE_RULE = "an RFC 1123 label: 1-63 lower-case letters, digits or '-', starting and ending with a letter or digit"
_K8S_NAMESPACE_RE = re.compile(K8S_NAMESPACE_PATTERN)

# Slurm keeps account names in lower case (sacctmgr folds them); the value goes onto sbatch's
# command line, so nothing but these characters.
SLURM_ACCOUNT_PATTERN = r"^[a-z0-9_][a-z0-9_.-]{0,63}$"
SLURM_ACCOUNT_RULE = "1-64 lower-case letters, digits, '_', '.' or '-', starting with a letter, digit or '_'"
_SLURM_ACCOUNT_RE = re.compile(SLURM_ACCOUNT_PATTERN)


class AwsCredentials(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    profile: str  # a named profile of the server's AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE


class KubernetesCredentials(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    namespace: str  # the team's pods, Services and Secrets go here instead of the context's namespace


class SlurmCredentials(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")
    account: str  # the Slurm account the team's allocations are charged to (sbatch --account)


class TeamCredentials(BaseModel):
    """Per infra, the reference a team's clusters are made with; an infra left out: the server's default."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    aws: AwsCredentials | None = None
    kubernetes: KubernetesCredentials | None = None
    slurm: SlurmCredentials | None = None

    def is_empty(self) -> bool:
        return self.aws is None and self.kubernetes is None and self.slurm is None


NO_CREDENTIALS = TeamCredentials()


def check_aws_profile(value: object) -> str:
    """An AWS profile name, checked at the edge; ValueError names the key and what is accepted."""
    if not isinstance(value, str) or not _AWS_PROFILE_RE.fullmatch(value):
        raise ValueError(f"invalid credentials.aws.profile {_shown(value)}: use {AWS_PROFILE_RULE}")
    return value


def _shown(value: object) -> str:
    return repr(value) if not isinstance(value, str) or len(value) <= 70 else repr(value[:67] + "...")


def check_k8s_namespace(value: object) -> str:
    """A Kubernetes namespace name, checked at the edge; ValueError names the key and the rule."""
    if not isinstance(value, str) or not _K8S_NAMESPACE_RE.fullmatch(value):
        raise ValueError(f"invalid credentials.kubernetes.namespace {_shown(value)}: use {K8S_NAMESPACE_RULE}")
    return value


def with_k8s_namespace(creds: TeamCredentials | None, namespace: str | None) -> TeamCredentials:
    """`creds` with the Kubernetes namespace set (`""`: removed, the context's own again; None: kept)."""
    creds = creds or NO_CREDENTIALS
    if namespace is None:
        return creds
    if namespace == "":
        return creds.model_copy(update={"kubernetes": None})
    return creds.model_copy(update={"kubernetes": KubernetesCredentials(namespace=check_k8s_namespace(namespace))})


def check_slurm_account(value: object) -> str:
    """A Slurm account name, checked at the edge; ValueError names the key and the rule."""
    if not isinstance(value, str) or not _SLURM_ACCOUNT_RE.fullmatch(value):
        raise ValueError(f"invalid credentials.slurm.account {_shown(value)}: use {SLURM_ACCOUNT_RULE}")
    return value


def with_slurm_account(creds: TeamCredentials | None, account: str | None) -> TeamCredentials:
    """`creds` with the Slurm account set (`""`: removed, the cluster's configured one again; None: kept)."""
    creds = creds or NO_CREDENTIALS
    if account is None:
        return creds
    if account == "":
        return creds.model_copy(update={"slurm": None})
    return creds.model_copy(update={"slurm": SlurmCredentials(account=check_slurm_account(account))})


def with_aws_profile(creds: TeamCredentials | None, profile: str | None) -> TeamCredentials:
    """`creds` with the AWS profile set (`""`: removed, the server's default again; None: kept)."""
    creds = creds or NO_CREDENTIALS
    if profile is None:
        return creds
    if profile == "":
        return creds.model_copy(update={"aws": None})
    return creds.model_copy(update={"aws": AwsCredentials(profile=check_aws_profile(profile))})


def to_dict(creds: TeamCredentials | None) -> dict[str, Any]:
    """The credentials as a listing shows them (SkyPilot's shape): `{"aws": {"profile": ...},
    "kubernetes": {"namespace": ...}, "slurm": {"account": ...}}`."""
    return (creds or NO_CREDENTIALS).model_dump(exclude_none=True)
