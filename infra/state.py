"""A stage's state on S3: checkpoints and ledger exports (encrypted, versioned, never public)."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack, aws_s3 as s3
from constructs import Construct

from skypurza.events import naming

from .config import StageConfig

BUCKETS = ("checkpoints", "exports")
NONCURRENT_DAYS = {"checkpoints": 30, "exports": 365}  # old checkpoint versions are dead weight


class StateStack(Stack):
    def __init__(self, scope: Construct, cfg: StageConfig, **kw) -> None:
        super().__init__(scope, naming.stack_name(cfg.stage, "state"),
                         stack_name=naming.stack_name(cfg.stage, "state"), **kw)
        self.buckets: dict[str, s3.Bucket] = {}
        for purpose in BUCKETS:
            self.buckets[purpose] = s3.Bucket(
                self, purpose.capitalize(), bucket_name=naming.infra_bucket(cfg.stage, purpose, cfg.account),
                encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True, versioned=True,
                block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
                removal_policy=RemovalPolicy.RETAIN,  # a bill's evidence outlives the stack
                lifecycle_rules=[s3.LifecycleRule(
                    noncurrent_version_expiration=Duration.days(NONCURRENT_DAYS[purpose]),
                    abort_incomplete_multipart_upload_after=Duration.days(7))])
