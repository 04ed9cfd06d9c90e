"""A stage's bus: three NATS JetStream nodes, one per zone, each on an EBS volume of its own that
outlives the instance (RETAIN), found by name in a private DNS zone (`n<i>.<zone>`).

Secured: one Secrets Manager secret per deployment user (busconfig.bus_users), its password drawn
by Secrets Manager at deploy time (never in a template), `{"user", "password"}`. The nodes fill
the authorization block's template (an SSM parameter) from them at boot; each ECS service reads
its own user's secret only (infra/services.py, infra/iam.py).

A stage with mirrors (prod) has one more secret, the leaf user's (`naming.BUS_LEAF_USER`), which
its leaf node listener admits; Secrets Manager replicates it to each mirror's region, where the
mirror's nodes read the replica (their role may read that one and no other secret of the source)
to connect as that user. A replica keeps its primary's name, ARN suffix and value, and a rotation
of the primary reaches it."""

from __future__ import annotations

import json

from aws_cdk import RemovalPolicy, Size, Stack, aws_ec2 as ec2, aws_iam as iam, aws_route53 as route53, \
    aws_secretsmanager as secretsmanager, aws_ssm as ssm
from constructs import Construct

from skypurza.events import naming

from . import busconfig
from .config import BUS_NODES, InfraConfig, StageConfig
from .network import NetworkStack

DATA_DEVICE = "/dev/sdf"  # Nitro instances show it as /dev/nvme1n1: the user-data looks for both


def leaf_replica_arn(cfg: StageConfig, source: StageConfig) -> str:
    """The mirror's region's replica of its source's leaf secret: the source's account (a replica
    stays in its primary's), the mirror's region; `-??????` is Secrets Manager's suffix, which
    the replica shares with its primary, and nothing longer (no other secret's name)."""
    return (f"arn:aws:secretsmanager:{cfg.region}:{source.account}:secret:"
            f"{naming.bus_user_secret(source.stage, naming.BUS_LEAF_USER)}-??????")


class BusStack(Stack):
    def __init__(self, scope: Construct, cfg: StageConfig, infra: InfraConfig, network: NetworkStack, **kw) -> None:
        super().__init__(scope, naming.stack_name(cfg.stage, "bus"),
                         stack_name=naming.stack_name(cfg.stage, "bus"), **kw)
        s = cfg.stage
        vpc = network.vpc
        source = infra.stage(cfg.mirror_of) if cfg.mirror_of else None
        mirrors = [m for m in infra.mirrors if m.mirror_of == s]
        leaf_listen = bool(mirrors)
        self.zone = route53.PrivateHostedZone(self, "Zone", zone_name=naming.bus_dns_zone(s), vpc=vpc)
        self.streams = ssm.StringParameter(self, "Streams", parameter_name=naming.parameter(s, "bus", "streams"),
                                           string_value=busconfig.streams_json(cfg),
                                           description="the bus's JetStream stream definitions")
        role = iam.Role(self, "NodeRole", role_name=naming.role_name(s, "bus", "node"),
                        assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
                        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(
                            "AmazonSSMManagedInstanceCore")])  # operators reach nodes without SSH
        self.streams.grant_read(role)
        self.user_secrets: dict[str, secretsmanager.Secret] = {}
        for user in busconfig.bus_users(cfg):
            secret = secretsmanager.Secret(
                self, f"User{user.name.capitalize()}", secret_name=naming.bus_user_secret(s, user.name),
                description=f"the {user.name} user of the bus (its password drawn by Secrets Manager)",
                generate_secret_string=secretsmanager.SecretStringGenerator(
                    secret_string_template=json.dumps({"user": user.name}), generate_string_key="password",
                    # Letters and digits: a nats-server config string and a URL need no escaping.
                    exclude_punctuation=True, password_length=48))
            secret.grant_read(role)  # the nodes fill every user's password into the block
            self.user_secrets[user.name] = secret
        # Not in user_secrets: no ECS task connects as the leaf user (the services stack exports those).
        self.leaf_secret: secretsmanager.Secret | None = None
        if leaf_listen:
            self.leaf_secret = secretsmanager.Secret(
                self, "UserLeaf", secret_name=naming.bus_user_secret(s, naming.BUS_LEAF_USER),
                description=f"the {naming.BUS_LEAF_USER} user of the bus's leaf node listener, with which "
                            f"{', '.join(m.stage for m in mirrors)} connect (replicated to their regions)",
                generate_secret_string=secretsmanager.SecretStringGenerator(
                    secret_string_template=json.dumps({"user": naming.BUS_LEAF_USER}),
                    generate_string_key="password", exclude_punctuation=True, password_length=48),
                # The mirror reads it in its own region: it works on when this one is down, which is
                # when it matters (a mirror restarting after prod's region is lost keeps its password).
                replica_regions=[secretsmanager.ReplicaRegion(region=r)
                                 for r in sorted({m.region for m in mirrors})])
            self.leaf_secret.grant_read(role)
        if source is not None:
            # The replica of the source's leaf secret, in this region, by name: it is another stack's
            # (another region's) resource, so no reference; nothing else of the source is readable.
            role.add_to_policy(iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"],
                                                   resources=[leaf_replica_arn(cfg, source)]))
        self.auth = ssm.StringParameter(self, "Auth", parameter_name=naming.parameter(s, "bus", "auth"),
                                        string_value=busconfig.auth_parameter_value(cfg, leaf_listen=leaf_listen),
                                        description="the bus's authorization block, a slot per password "
                                                    "(gzip, base64: infra/bus_auth.py)")
        self.auth.grant_read(role)
        image = ec2.MachineImage.latest_amazon_linux2023()
        private = vpc.private_subnets
        self.nodes: list[ec2.Instance] = []
        for node in range(1, BUS_NODES + 1):
            subnet = private[(node - 1) % len(private)]
            user_data = ec2.UserData.custom(busconfig.user_data(
                cfg, node, streams_parameter=self.streams.parameter_name, auth_parameter=self.auth.parameter_name,
                device=DATA_DEVICE))
            instance = ec2.Instance(
                self, f"Node{node}", instance_name=naming.name(s, "bus", f"n{node}"),
                instance_type=ec2.InstanceType(cfg.bus_instance_type), machine_image=image, vpc=vpc,
                vpc_subnets=ec2.SubnetSelection(subnets=[subnet]), security_group=network.bus_sg, role=role,
                user_data=user_data, require_imdsv2=True, detailed_monitoring=False,
                block_devices=[ec2.BlockDevice(device_name="/dev/xvda", volume=ec2.BlockDeviceVolume.ebs(
                    16, encrypted=True, volume_type=ec2.EbsDeviceVolumeType.GP3))])
            # Its first start reads every user's secret (the leaf user's too): made before the node boots.
            instance.node.add_dependency(*self.user_secrets.values(),
                                         *([self.leaf_secret] if self.leaf_secret else []))
            volume = ec2.Volume(
                self, f"Data{node}", volume_name=naming.name(s, "bus", f"n{node}"),
                availability_zone=subnet.availability_zone, size=Size.gibibytes(cfg.bus_volume_gib),
                volume_type=ec2.EbsDeviceVolumeType.GP3, encrypted=True, removal_policy=RemovalPolicy.RETAIN)
            ec2.CfnVolumeAttachment(self, f"Attach{node}", instance_id=instance.instance_id,
                                    volume_id=volume.volume_id, device=DATA_DEVICE)
            route53.ARecord(self, f"Record{node}", zone=self.zone, record_name=naming.bus_node_host(s, node) + ".",
                            target=route53.RecordTarget.from_ip_addresses(instance.instance_private_ip))
            self.nodes.append(instance)
