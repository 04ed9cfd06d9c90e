"""A stage's bus: three NATS JetStream nodes, one per zone, each on an EBS volume of its own that
outlives the instance (RETAIN), found by name in a private DNS zone (`n<i>.<zone>`)."""

from __future__ import annotations

from aws_cdk import RemovalPolicy, Size, Stack, aws_ec2 as ec2, aws_iam as iam, aws_route53 as route53, \
    aws_ssm as ssm
from constructs import Construct

from skypurza.events import naming

from . import busconfig
from .config import BUS_NODES, InfraConfig, StageConfig
from .network import NetworkStack

DATA_DEVICE = "/dev/sdf"  # Nitro instances show it as /dev/nvme1n1: the user-data looks for both


class BusStack(Stack):
    def __init__(self, scope: Construct, cfg: StageConfig, infra: InfraConfig, network: NetworkStack, **kw) -> None:
        super().__init__(scope, naming.stack_name(cfg.stage, "bus"),
                         stack_name=naming.stack_name(cfg.stage, "bus"), **kw)
        s = cfg.stage
        vpc = network.vpc
        source = infra.stage(cfg.mirror_of) if cfg.mirror_of else None
        leaf_listen = any(m.mirror_of == s for m in infra.mirrors)
        self.zone = route53.PrivateHostedZone(self, "Zone", zone_name=naming.bus_dns_zone(s), vpc=vpc)
        self.streams = ssm.StringParameter(self, "Streams", parameter_name=naming.parameter(s, "bus", "streams"),
                                           string_value=busconfig.streams_json(cfg),
                                           description="the bus's JetStream stream definitions")
        role = iam.Role(self, "NodeRole", role_name=naming.role_name(s, "bus", "node"),
                        assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
                        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(
                            "AmazonSSMManagedInstanceCore")])  # operators reach nodes without SSH
        self.streams.grant_read(role)
        image = ec2.MachineImage.latest_amazon_linux2023()
        private = vpc.private_subnets
        self.nodes: list[ec2.Instance] = []
        for node in range(1, BUS_NODES + 1):
            subnet = private[(node - 1) % len(private)]
            user_data = ec2.UserData.custom(busconfig.user_data(
                cfg, node, leaf_listen=leaf_listen, source=source, streams_parameter=self.streams.parameter_name,
                device=DATA_DEVICE))
            instance = ec2.Instance(
                self, f"Node{node}", instance_name=naming.name(s, "bus", f"n{node}"),
                instance_type=ec2.InstanceType(cfg.bus_instance_type), machine_image=image, vpc=vpc,
                vpc_subnets=ec2.SubnetSelection(subnets=[subnet]), security_group=network.bus_sg, role=role,
                user_data=user_data, require_imdsv2=True, detailed_monitoring=False,
                block_devices=[ec2.BlockDevice(device_name="/dev/xvda", volume=ec2.BlockDeviceVolume.ebs(
                    16, encrypted=True, volume_type=ec2.EbsDeviceVolumeType.GP3))])
            volume = ec2.Volume(
                self, f"Data{node}", volume_name=naming.name(s, "bus", f"n{node}"),
                availability_zone=subnet.availability_zone, size=Size.gibibytes(cfg.bus_volume_gib),
                volume_type=ec2.EbsDeviceVolumeType.GP3, encrypted=True, removal_policy=RemovalPolicy.RETAIN)
            ec2.CfnVolumeAttachment(self, f"Attach{node}", instance_id=instance.instance_id,
                                    volume_id=volume.volume_id, device=DATA_DEVICE)
            route53.ARecord(self, f"Record{node}", zone=self.zone, record_name=naming.bus_node_host(s, node) + ".",
                            target=route53.RecordTarget.from_ip_addresses(instance.instance_private_ip))
            self.nodes.append(instance)
