"""Least privilege per service: each service's task role holds only what its code calls, and each
execution role pulls the image and writes its own log group. The provisioner's EC2 rights are
conditioned on the Stage tag of the stage it serves (aws:RequestTag/Stage when it creates,
aws:ResourceTag/Stage when it acts), so no stage can touch another stage's machines.

Every ARN is built from the naming module's names: this stack refers to no other stack.
"""

from __future__ import annotations

from aws_cdk import DefaultStackSynthesizer, Stack, aws_iam as iam
from constructs import Construct

from skypurza.events import naming

from .config import ALERTS, API, SERVICES, StageConfig

ECS_TASKS = "ecs-tasks.amazonaws.com"

# What the provisioner's AWS backend calls (services/provisioner/aws*.py).
EC2_READ = ("ec2:DescribeInstances", "ec2:DescribeInstanceStatus", "ec2:DescribeImages", "ec2:DescribeSubnets",
            "ec2:DescribeVpcs", "ec2:DescribeSecurityGroups", "ec2:DescribeKeyPairs", "ec2:DescribePlacementGroups",
            "ec2:DescribeAvailabilityZones", "ec2:DescribeInstanceTypes", "ec2:DescribeInstanceTypeOfferings",
            "ec2:DescribeSpotPriceHistory", "ec2:DescribeRegions")
EC2_CREATE = ("ec2:RunInstances", "ec2:CreateSecurityGroup", "ec2:CreateKeyPair", "ec2:CreatePlacementGroup")
EC2_ACT = ("ec2:TerminateInstances", "ec2:StopInstances", "ec2:StartInstances", "ec2:DeleteSecurityGroup",
           "ec2:DeleteKeyPair", "ec2:DeletePlacementGroup", "ec2:AuthorizeSecurityGroupIngress")
# The resources a RunInstances also names, which carry no tag of ours when it is called.
EC2_LAUNCH_INPUTS = ("image", "subnet", "network-interface", "security-group", "key-pair", "placement-group")
RECOVERY_READ = ("ec2:DescribeInstances", "ec2:DescribeInstanceStatus")


def stage_tag_key(kind: str) -> str:
    return f"aws:{kind}/{naming.TAG_STAGE}"


def role_arn(cfg: StageConfig, role: str) -> str:
    return f"arn:aws:iam::{cfg.account}:role/{role}"


def task_role_name(stage: str, service: str) -> str:
    return naming.role_name(stage, service, "task")


def exec_role_name(stage: str, service: str) -> str:
    return naming.role_name(stage, service, "exec")


def provisioner_statements(cfg: StageConfig) -> list[iam.PolicyStatement]:
    ec2_arn = f"arn:aws:ec2:*:{cfg.account}"
    served = cfg.serves
    return [
        iam.PolicyStatement(sid="Describe", actions=list(EC2_READ), resources=["*"]),  # Describe* takes no ARN
        iam.PolicyStatement(
            sid="CreateTaggedForStage", actions=list(EC2_CREATE),
            resources=[f"{ec2_arn}:instance/*", f"{ec2_arn}:volume/*", f"{ec2_arn}:security-group/*",
                       f"{ec2_arn}:key-pair/*", f"{ec2_arn}:placement-group/*"],
            conditions={"StringEquals": {stage_tag_key("RequestTag"): served}}),
        iam.PolicyStatement(
            sid="LaunchInputs", actions=["ec2:RunInstances", "ec2:CreateSecurityGroup"],
            resources=[f"arn:aws:ec2:*::image/*", *(f"{ec2_arn}:{kind}/*" for kind in EC2_LAUNCH_INPUTS
                                                    if kind != "image"), f"{ec2_arn}:vpc/*"]),
        iam.PolicyStatement(
            sid="TagOnCreate", actions=["ec2:CreateTags"], resources=[f"{ec2_arn}:*/*"],
            conditions={"StringEquals": {stage_tag_key("RequestTag"): served,
                                         "ec2:CreateAction": list(EC2_CREATE)}}),
        iam.PolicyStatement(
            sid="ActOnStage", actions=[*EC2_ACT, "ec2:CreateTags"], resources=[f"{ec2_arn}:*/*"],
            conditions={"StringEquals": {stage_tag_key("ResourceTag"): served}}),
    ]


def bucket_statements(cfg: StageConfig, purpose: str, *, write: bool) -> list[iam.PolicyStatement]:
    arn = f"arn:aws:s3:::{naming.infra_bucket(cfg.stage, purpose, cfg.account)}"
    actions = ["s3:GetObject", "s3:GetObjectVersion"] + (["s3:PutObject", "s3:AbortMultipartUpload"] if write else [])
    return [iam.PolicyStatement(actions=["s3:ListBucket"], resources=[arn]),
            iam.PolicyStatement(actions=actions, resources=[f"{arn}/*"])]


def task_statements(cfg: StageConfig, service: str) -> list[iam.PolicyStatement]:
    """What each service's own code calls on AWS; none for those that only talk to the bus."""
    if service == "provisioner":
        return provisioner_statements(cfg)
    if service == "recovery":  # instance watch (EC2 polling) and the checkpoints bucket
        return [iam.PolicyStatement(sid="WatchInstances", actions=list(RECOVERY_READ), resources=["*"]),
                *bucket_statements(cfg, "checkpoints", write=True)]
    if service == "ledger":  # `spz events export` to the exports bucket
        return bucket_statements(cfg, "exports", write=True)
    return []


def secret_arn(cfg: StageConfig, name: str) -> str:
    """A stage's secret by its name: Secrets Manager appends `-` and six random characters to a
    secret's ARN, which `??????` matches and nothing longer (a secret `api-x` is not `api`'s)."""
    return f"arn:aws:secretsmanager:{cfg.region}:{cfg.account}:secret:{name}-??????"


def bus_user_secret_arn(cfg: StageConfig, user: str) -> str:
    """A bus user's secret (infra/bus.py)."""
    return secret_arn(cfg, naming.bus_user_secret(cfg.stage, user))


def exec_statements(cfg: StageConfig, service: str) -> list[iam.PolicyStatement]:
    """Pull the image from the bootstrap's asset repository; write the service's own log group;
    read the service's own bus user's secret (ECS puts it in the container's environment), and
    the alerts service the webhooks' secret as well."""
    repo = DefaultStackSynthesizer.DEFAULT_IMAGE_ASSETS_REPOSITORY_NAME.replace(
        "${Qualifier}", DefaultStackSynthesizer.DEFAULT_QUALIFIER).replace(
        "${AWS::AccountId}", cfg.account).replace("${AWS::Region}", cfg.region)
    group = f"arn:aws:logs:{cfg.region}:{cfg.account}:log-group:{naming.log_group(cfg.stage, service)}"
    return [
        iam.PolicyStatement(actions=["ecr:GetAuthorizationToken"], resources=["*"]),
        iam.PolicyStatement(actions=["ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer",
                                     "ecr:BatchGetImage"],
                            resources=[f"arn:aws:ecr:{cfg.region}:{cfg.account}:repository/{repo}"]),
        iam.PolicyStatement(actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[f"{group}:*"]),
        iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"],
                            resources=[bus_user_secret_arn(cfg, service)]
                            + ([secret_arn(cfg, naming.alerts_webhooks_secret(cfg.stage))] if service == ALERTS
                               else [])),
    ]


class IamStack(Stack):
    def __init__(self, scope: Construct, cfg: StageConfig, **kw) -> None:
        super().__init__(scope, naming.stack_name(cfg.stage, "iam"),
                         stack_name=naming.stack_name(cfg.stage, "iam"), **kw)
        self.task_roles: dict[str, iam.Role] = {}
        self.exec_roles: dict[str, iam.Role] = {}
        for service in (*SERVICES, API):
            task = iam.Role(self, f"{service.capitalize()}Task", role_name=task_role_name(cfg.stage, service),
                            assumed_by=iam.ServicePrincipal(ECS_TASKS),
                            description=f"the {service} service's own AWS calls")
            for st in task_statements(cfg, service):
                task.add_to_policy(st)
            exec_ = iam.Role(self, f"{service.capitalize()}Exec", role_name=exec_role_name(cfg.stage, service),
                             assumed_by=iam.ServicePrincipal(ECS_TASKS),
                             description=f"ECS starting the {service} service's container")
            for st in exec_statements(cfg, service):
                exec_.add_to_policy(st)
            self.task_roles[service], self.exec_roles[service] = task, exec_
