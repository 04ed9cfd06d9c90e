"""What a deployment is made of: the stages, their accounts, regions, sizes and service counts.

Read from cdk.json's `skypurza` context (a user edits that file, or passes `-c`), checked here at
the edge: a typo is one line naming the field, never a half-built template. Pure: no CDK import.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from skypurza.events import naming

CDK_JSON = Path(__file__).with_name("cdk.json")
CONTEXT_KEY = "skypurza"

# The API server is a service of its own in a deployment (services/api/), beside those `spz api
# serve --services <name>` runs (cli/serve.py's open services and the platform entry points).
API = "api"
# Every one of them (tests/test_infra.py checks it against cli/serve.py and the entry points): one
# left out here means what it alone emits never comes (dispatch's TaskAdmitted: once a dispatch
# policy is applied, the optimizer would wait for every task for ever).
ALERTS = "alerts"  # the one service given a secret besides its bus user's: its webhooks (infra/services.py)
SERVICES = ("optimizer", "provisioner", "recovery", "status", "mirror", "ledger", "dispatch", "observability",
            "gpuhealth", ALERTS)
# Each is the one writer of its state (the launches, a DuckDB file) or, dispatch, decides from a
# fold of only the events handed to it (services/dispatch/service.py): never two tasks at once.
SINGLE_WRITERS = ("provisioner", "status", "ledger", "dispatch")

# CloudWatch accepts only these retention periods (days).
RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922,
                  3288, 3653)
BUS_NODES = 3  # a 3-node JetStream cluster: R3 streams survive the loss of one node (one zone)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Domain(_Strict):
    """The API server's public name: an HTTPS listener with an ACM certificate validated in the zone."""

    zone_name: str = Field(pattern=r"^[a-z0-9.-]{1,253}$")
    hosted_zone_id: str = Field(pattern=r"^Z[A-Z0-9]{1,31}$")
    api_host: str = Field(pattern=r"^[a-z0-9.-]{1,253}$")

    @model_validator(mode="after")
    def _in_zone(self) -> "Domain":
        if not (self.api_host == self.zone_name or self.api_host.endswith("." + self.zone_name)):
            raise ValueError(f"api_host {self.api_host!r} is not in the zone {self.zone_name!r}")
        return self


class StageConfig(_Strict):
    stage: str
    account: str = Field(pattern=r"^[0-9]{12}$")
    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]$")
    cidr: str
    nat_gateways: int = Field(default=1, ge=1, le=3)
    bus_instance_type: str = "m6i.large"
    bus_volume_gib: int = Field(default=100, ge=20, le=16384)
    service_instance_type: str = "m6i.large"
    service_instances: int = Field(default=2, ge=1, le=20)
    services: dict[str, int] = Field(default_factory=lambda: {**{s: 1 for s in SERVICES}, API: 2})
    log_retention_days: int = 30
    domain: Domain | None = None
    # A disaster-recovery stage: its bus sources the event stream of this stage (JetStream
    # sourcing over a leaf node connection) and its services stay at 0 until a failover.
    mirror_of: str | None = None
    failed_over: bool = False

    @field_validator("stage")
    @classmethod
    def _stage(cls, v: str) -> str:
        return naming.check_stage(v)

    @field_validator("cidr")
    @classmethod
    def _cidr(cls, v: str) -> str:
        net = ipaddress.ip_network(v)
        if net.version != 4 or not 16 <= net.prefixlen <= 20 or not net.is_private:
            raise ValueError(f"cidr {v!r}: a private IPv4 /16 to /20")
        return v

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, v: int) -> int:
        if v not in RETENTION_DAYS:
            raise ValueError(f"log_retention_days {v}: one of {RETENTION_DAYS}")
        return v

    @field_validator("services")
    @classmethod
    def _services(cls, v: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(v) - {*SERVICES, API})
        if unknown:
            raise ValueError(f"unknown services {unknown}: known are {[*SERVICES, API]}")
        bad = {k: n for k, n in v.items() if not 0 <= n <= 10}
        if bad:
            raise ValueError(f"service counts must be 0-10: {bad}")
        if any(v.get(s, 0) > 1 for s in SINGLE_WRITERS):
            raise ValueError(f"{', '.join(SINGLE_WRITERS[:-1])} and {SINGLE_WRITERS[-1]} run at most one task each")
        return v

    @property
    def azs(self) -> tuple[str, ...]:
        return tuple(f"{self.region}{z}" for z in "abc")[:BUS_NODES]

    @property
    def serves(self) -> str:
        """The stage whose log this stage's services act on: its own, or the one it mirrors."""
        return self.mirror_of or self.stage

    def running(self, service: str) -> int:
        """Tasks to run: a mirror that has not failed over runs none (it would act twice)."""
        if self.mirror_of and not self.failed_over:
            return 0
        return self.services.get(service, 0)


class PipelineConfig(_Strict):
    account: str = Field(pattern=r"^[0-9]{12}$")
    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]$")
    repository: str = Field(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    branch: str = Field(default="main", pattern=r"^[A-Za-z0-9_./-]{1,100}$")
    connection_arn: str = Field(pattern=r"^arn:aws:(codestar-connections|codeconnections):[a-z0-9-]+:[0-9]{12}:connection/[a-f0-9-]+$")
    promotion: tuple[str, ...] = ("beta", "bake_usw2", "prod")
    canary: str = "bake_usw2"
    approve_prod: bool = True


class InfraConfig(_Strict):
    pipeline: PipelineConfig
    stages: tuple[StageConfig, ...]

    @model_validator(mode="after")
    def _consistent(self) -> "InfraConfig":
        names = [s.stage for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"a stage is listed twice: {names}")
        if naming.DELIVERY_STAGE in names:
            raise ValueError(f"{naming.DELIVERY_STAGE!r} is the pipeline's own stage")
        by = {s.stage: s for s in self.stages}
        p = self.pipeline
        missing = [s for s in p.promotion if s not in by]
        if missing:
            raise ValueError(f"pipeline.promotion names unknown stages {missing}")
        if p.canary not in p.promotion:
            raise ValueError(f"pipeline.canary {p.canary!r} is not in the promotion")
        if by[p.canary].domain is None:
            raise ValueError(f"the canary stage {p.canary!r} needs a domain: its check calls the API over HTTPS")
        for s in self.stages:
            if s.mirror_of is not None:
                if s.mirror_of not in by or by[s.mirror_of].mirror_of is not None:
                    raise ValueError(f"{s.stage}.mirror_of {s.mirror_of!r}: a stage that is not itself a mirror")
                if by[s.mirror_of].region == s.region:
                    raise ValueError(f"{s.stage} mirrors {s.mirror_of} in the same region: it would not survive it")
                if s.stage in p.promotion:
                    raise ValueError(f"{s.stage} is a mirror: it follows its stage's deployment, not the promotion")
        nets = [ipaddress.ip_network(s.cidr) for s in self.stages]
        for i, a in enumerate(nets):
            for b in nets[i + 1:]:
                if a.overlaps(b):  # the DR leaf node connection needs the mirror's VPC peered with its source's
                    raise ValueError(f"stage networks overlap: {a} and {b}")
        return self

    def stage(self, stage: str) -> StageConfig:
        return next(s for s in self.stages if s.stage == stage)

    @property
    def mirrors(self) -> tuple[StageConfig, ...]:
        return tuple(s for s in self.stages if s.mirror_of)


def parse(context: Any) -> InfraConfig:
    return InfraConfig.model_validate(context)


def load(path: Path = CDK_JSON) -> InfraConfig:
    return parse(json.loads(path.read_text())["context"][CONTEXT_KEY])
