"""A stage's log groups: one per service and one for the bus, with the stage's retention."""

from __future__ import annotations

from aws_cdk import RemovalPolicy, Stack, aws_logs as logs
from constructs import Construct

from skypurza.events import naming

from .config import API, RETENTION_DAYS, SERVICES, StageConfig

BUS = "bus"


def log_components() -> tuple[str, ...]:
    return (*SERVICES, API, BUS)


def retention_days(days: int) -> logs.RetentionDays:
    """CDK's enum member for a number of days (config.RETENTION_DAYS, CloudWatch's own list)."""
    members = [m for m in logs.RetentionDays if m is not logs.RetentionDays.INFINITE]
    assert len(members) == len(RETENTION_DAYS), "CDK's retention periods changed: update config.RETENTION_DAYS"
    return dict(zip(RETENTION_DAYS, members))[days]


class LogsStack(Stack):
    def __init__(self, scope: Construct, cfg: StageConfig, **kw) -> None:
        super().__init__(scope, naming.stack_name(cfg.stage, "logs"),
                         stack_name=naming.stack_name(cfg.stage, "logs"), **kw)
        retention = retention_days(cfg.log_retention_days)
        self.groups = {c: logs.LogGroup(self, c.capitalize(), log_group_name=naming.log_group(cfg.stage, c),
                                        retention=retention, removal_policy=RemovalPolicy.RETAIN)
                       for c in log_components()}
