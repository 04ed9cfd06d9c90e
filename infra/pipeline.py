"""The delivery pipeline (stage `ci`): Beta -> BakeUsw2 (a canary check) -> Prod, then each mirror
of Prod (DR) deployed from the same synthesized assembly, so DR always runs Prod's version."""

from __future__ import annotations

import shlex

from aws_cdk import Environment, Stack, aws_iam as iam, pipelines
from constructs import Construct

from skypurza.events import naming

from .aspects import name_and_tag
from .config import InfraConfig, StageConfig
from .stage import SkypurzaStage

HEALTH_PATH = "/api/v1/health"
CANARY_ATTEMPTS = 30  # x 10 s: a fresh API server behind a new load balancer takes minutes


def synth_commands() -> list[str]:
    return ["npm install -g aws-cdk", "pip install -e . aws-cdk-lib constructs", "cd infra && cdk synth"]


def canary_commands(cfg: StageConfig) -> list[str]:
    """The canary: the stage's API server answers its health check with the stage it serves."""
    assert cfg.domain is not None
    url = shlex.quote(f"https://{cfg.domain.api_host}{HEALTH_PATH}")
    want = shlex.quote(cfg.serves)
    return [
        f"curl --fail --silent --show-error --max-time 10 --retry {CANARY_ATTEMPTS} --retry-delay 10 "
        f"--retry-all-errors -o health.json {url}",
        f"python3 -c \"import json,sys; d=json.load(open('health.json')); "
        f"sys.exit(0 if d.get('stage')=={want!r} else 'canary: wrong stage '+str(d.get('stage')))\"",
    ]


def mirror_deploy_commands(mirror: StageConfig) -> list[str]:
    return ["npm install -g aws-cdk",
            f"cdk deploy --app . {shlex.quote(naming.stage_id(mirror.stage) + '/*')} --require-approval never"]


class PipelineStack(Stack):
    def __init__(self, scope: Construct, infra: InfraConfig) -> None:
        ci = naming.DELIVERY_STAGE
        p = infra.pipeline
        super().__init__(scope, naming.stack_name(ci, "pipeline"), stack_name=naming.stack_name(ci, "pipeline"),
                         env=Environment(account=p.account, region=p.region))
        source = pipelines.CodePipelineSource.connection(p.repository, p.branch, connection_arn=p.connection_arn)
        synth = pipelines.ShellStep("Synth", input=source, commands=synth_commands(),
                                    primary_output_directory="infra/cdk.out")
        accounts = {s.account for s in infra.stages} | {p.account}
        regions = {infra.stage(s).region for s in p.promotion} | {p.region}
        if len(regions) > 1:
            raise ValueError("the promoted stages deploy in the pipeline's region; a stage elsewhere is a mirror")
        self.pipeline = pipelines.CodePipeline(
            self, "Pipeline", pipeline_name=naming.name(ci, "pipeline", "main"), synth=synth,
            cross_account_keys=len(accounts) > 1)
        self.stages: dict[str, SkypurzaStage] = {}
        for stage in p.promotion:
            cfg = infra.stage(stage)
            st = SkypurzaStage(self, cfg, infra)
            self.stages[stage] = st
            pre: list[pipelines.Step] = []
            post: list[pipelines.Step] = []
            if stage == p.promotion[-1] and p.approve_prod:
                pre.append(pipelines.ManualApprovalStep(f"Approve{naming.stage_label(stage)}"))
            if stage == p.canary:
                post.append(pipelines.ShellStep(f"Canary{naming.stage_label(stage)}", commands=canary_commands(cfg)))
            for mirror in infra.mirrors:
                if mirror.mirror_of == stage:
                    post.append(pipelines.CodeBuildStep(
                        f"Deploy{naming.stage_label(mirror.stage)}", input=synth.primary_output,
                        commands=mirror_deploy_commands(mirror),
                        role_policy_statements=[iam.PolicyStatement(
                            actions=["sts:AssumeRole"],
                            resources=[f"arn:aws:iam::{mirror.account}:role/cdk-*-{mirror.account}-{mirror.region}"])]))
            self.pipeline.add_stage(st, pre=pre, post=post)
        self.pipeline.build_pipeline()
        name_and_tag(self, ci, "pipeline")
