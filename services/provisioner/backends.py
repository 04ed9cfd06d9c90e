"""Which backend runs a placement: one instance per infra, made on first use.

`aws` is the AwsAdapter configured from the settings (botocore reads credentials and
AWS_ENDPOINT_URL itself); `local` is the LocalAdapter, imported only when a local placement
arrives, so this module works in builds without it. A team whose workspace names an AWS profile
(teamcreds.py) gets an AwsAdapter of its own over `aioboto3.Session(profile_name=...)`, one per
profile, kept like the others; one whose workspace names a Kubernetes namespace gets a
KubernetesAdapter of its own that makes (and finds) its objects in that namespace, one per namespace.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from skypurza.events.team_credentials import TeamCredentials

from .adapter import ComputeBackend
from .settings import ProvisionerSettings

log = logging.getLogger(__name__)

KNOWN = ("aws", "local", "kubernetes", "slurm")
K8S_NAMES = ("kubernetes", "k8s")


class UnsupportedInfra(Exception):
    pass


class CredentialsNotFound(Exception):
    """A team's credentials reference names nothing this server holds (an AWS profile not in its
    shared credentials/config files): its clusters cannot be made, and no other place fixes it."""

    def __init__(self, team: str, what: str, hint: str) -> None:
        super().__init__(f"team {team}'s {what} is not on this server: {hint}")
        self.team = team


class Backends:
    def __init__(self, settings: ProvisionerSettings, *, stage: str, nats_url: str = "",
                 overrides: Mapping[str, ComputeBackend] | None = None) -> None:
        self.settings = settings
        self.stage = stage
        self.nats_url = nats_url
        # Given backends (tests, benches) are owned from here on: close() closes them too.
        self._made: dict[str, ComputeBackend] = dict(overrides or {})
        self._regions: tuple[str, ...] | None = None

    def has(self, infra: str) -> bool:
        return infra in self._made

    def get(self, infra: str, credentials: TeamCredentials | None = None, *, team: str = "") -> ComputeBackend:
        """The backend of `infra`, made with a team's `credentials` where they name some for it
        (one backend per reference, kept: an AWS profile is one aioboto3 Session); else the
        server's default. CredentialsNotFound when the reference names nothing here."""
        key = credentials_key(infra, credentials)
        backend = self._made.get(key)
        if backend is None:
            backend = self._make(infra) if key == infra else self._make_for(infra, credentials, team)
            self._made[key] = backend
        return backend

    def is_default(self, infra: str, credentials: TeamCredentials | None) -> bool:
        return credentials_key(infra, credentials) == infra

    def _make_for(self, infra: str, credentials: TeamCredentials | None, team: str) -> ComputeBackend:
        if infra in K8S_NAMES:
            assert credentials is not None and credentials.kubernetes is not None
            # Derived from the default one (its settings, clients' factory, bus), in another namespace.
            default = self.get(infra)
            in_namespace = getattr(default, "in_namespace", None)
            if in_namespace is None:
                raise UnsupportedInfra(f"the {infra} backend here cannot place a team's pods in a namespace")
            return in_namespace(credentials.kubernetes.namespace)  # type: ignore[no-any-return]
        assert infra == "aws" and credentials is not None and credentials.aws is not None
        import aioboto3
        from botocore.exceptions import ProfileNotFound

        profile = credentials.aws.profile
        try:
            session = aioboto3.Session(profile_name=profile)
        except ProfileNotFound:
            raise CredentialsNotFound(
                team or "?", f"AWS profile {profile}",
                "add it to the server's AWS credentials file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials) "
                f"or config file, or change the team's: spz teams update {team or 'TEAM'} --aws-profile NAME "
                "('' for the server's default)") from None
        return self._aws(session)

    def _make(self, infra: str) -> ComputeBackend:
        s = self.settings
        if infra == "aws":
            return self._aws(None)
        if infra == "local":
            try:
                from .local import LocalAdapter  # type: ignore[import-not-found]
            except ModuleNotFoundError as exc:
                raise UnsupportedInfra("the local backend is not available in this build") from exc
            root = Path(s.local_root) if s.local_root else None
            return LocalAdapter(self.nats_url, self.stage, root, spare=s.local_spare)  # type: ignore[no-any-return]
        if infra in K8S_NAMES:
            return self._kubernetes()
        if infra == "slurm":
            from skypurza.events.config import ConfigError, load_config
            from skypurza.events.slurm_config import SlurmConfigError, parse_user_config

            from .slurm import SlurmAdapter

            try:
                user = parse_user_config(load_config().get("slurm"))
            except (SlurmConfigError, ConfigError) as exc:
                raise UnsupportedInfra(f"the slurm: settings cannot be used: {exc}") from None
            root = Path(s.local_root) if s.local_root else None
            return SlurmAdapter(self.nats_url, self.stage, root, user_config=user)
        raise UnsupportedInfra(f"infra {infra!r} has no backend here (known: {', '.join(KNOWN)})")

    def _kubernetes(self) -> ComputeBackend:
        import os

        from skypurza.events.agentspec import agent_settings_env
        from skypurza.events.k8s_config import KubernetesSettings

        from .k8s import KubernetesAdapter

        # Pods reach the bus the deployment configures (agent_nats_url), as EC2 nodes do, and
        # get the agent settings local agents inherit (pod_config's env still wins).
        return KubernetesAdapter(KubernetesSettings.load(), nats_url=self.settings.agent_nats_url or self.nats_url,
                                 stage=self.stage, agent_env=agent_settings_env(os.environ))

    def _aws(self, session: Any) -> ComputeBackend:
        from .aws import AwsAdapter
        from .aws_retry import RetryOptions

        s = self.settings
        return AwsAdapter(session=session, regions=s.aws_regions, poll_interval=s.aws_poll_s,
                          launch_timeout=s.aws_launch_timeout_s,
                          retry=RetryOptions(max_attempts=s.aws_max_attempts, base_delay=s.aws_retry_base_s))

    async def aws_regions(self) -> tuple[str, ...]:
        """The enabled AWS regions: configured, else those EC2 lists for the account."""
        if self.settings.aws_regions:
            return self.settings.aws_regions
        if self._regions is None:
            self._regions = await _describe_regions()
        return self._regions

    async def close(self) -> None:
        for infra in list(self._made):
            backend = self._made.pop(infra)
            try:
                await backend.close()
            except Exception:  # closing must not hide the reason we are shutting down
                log.exception("closing the %s backend failed", infra)


def credentials_key(infra: str, credentials: TeamCredentials | None) -> str:
    """Pure: which backend instance serves `infra` with these credentials (`aws@PROFILE`,
    `kubernetes@NAMESPACE`, else `infra`)."""
    if infra == "aws" and credentials is not None and credentials.aws is not None:
        return f"aws@{credentials.aws.profile}"
    if infra in K8S_NAMES and credentials is not None and credentials.kubernetes is not None:
        return f"{infra}@{credentials.kubernetes.namespace}"
    return infra


def aws_account(profile: str | None) -> TeamCredentials | None:
    """Pure: the credentials that reach one AWS account: a profile's, or (None) the server's default."""
    from skypurza.events.team_credentials import AwsCredentials

    return TeamCredentials(aws=AwsCredentials(profile=profile)) if profile else None


def split_key(key: str) -> tuple[str, TeamCredentials | None]:
    """Pure: the AWS side of `credentials_key`'s inverse (`aws@PROFILE` -> ("aws", that profile's
    credentials)); any other key is its infra with the default credentials."""
    infra, sep, profile = key.partition("@")
    return (infra, aws_account(profile)) if sep and infra == "aws" and profile else (key, None)


async def _describe_regions() -> tuple[str, ...]:
    import aioboto3

    session = aioboto3.Session()
    region = session.region_name or "us-east-1"
    async with session.client("ec2", region_name=region) as ec2:
        reply: dict[str, Any] = await asyncio.wait_for(ec2.describe_regions(AllRegions=False), 30)
    return tuple(sorted(r["RegionName"] for r in reply.get("Regions", [])))
