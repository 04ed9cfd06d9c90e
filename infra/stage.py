"""One stage of the control plane: its stacks, in the order they depend on each other."""

from __future__ import annotations

from aws_cdk import Environment, Stage
from constructs import Construct

from skypurza.events import naming

from .aspects import name_and_tag
from .bus import BusStack
from .config import InfraConfig, StageConfig
from .dns import DnsStack
from .iam import IamStack
from .logs import LogsStack
from .network import NetworkStack
from .services import ServicesStack
from .state import StateStack


class SkypurzaStage(Stage):
    def __init__(self, scope: Construct, cfg: StageConfig, infra: InfraConfig) -> None:
        super().__init__(scope, naming.stage_id(cfg.stage), env=Environment(account=cfg.account, region=cfg.region))
        self.cfg = cfg
        self.network = NetworkStack(self, cfg, infra)
        self.state = StateStack(self, cfg)
        self.logs = LogsStack(self, cfg)
        self.iam = IamStack(self, cfg)
        self.bus = BusStack(self, cfg, infra, self.network)
        self.dns = DnsStack(self, cfg) if cfg.domain is not None else None
        self.services = ServicesStack(self, cfg, self.network, self.bus, self.dns)
        self.services.add_dependency(self.iam, "task and execution roles are referred to by name")
        self.services.add_dependency(self.logs, "log groups are referred to by name")
        self.iam.add_dependency(self.state, "bucket policies name the buckets")
        for component, stack in self.stacks().items():
            name_and_tag(stack, cfg.stage, component)

    def stacks(self) -> dict[str, "object"]:
        out = {"network": self.network, "state": self.state, "logs": self.logs, "iam": self.iam, "bus": self.bus,
               "services": self.services}
        if self.dns is not None:
            out["dns"] = self.dns
        return out
