"""A stage's network: the VPC (public and private subnets in three zones) and its security groups."""

from __future__ import annotations

from aws_cdk import Stack, Tags, aws_ec2 as ec2
from constructs import Construct

from skypurza.events import naming

from . import busconfig
from .config import InfraConfig, StageConfig

API_PORT = naming.DEFAULT_API_PORT


class NetworkStack(Stack):
    def __init__(self, scope: Construct, cfg: StageConfig, infra: InfraConfig, **kw) -> None:
        super().__init__(scope, naming.stack_name(cfg.stage, "network"),
                         stack_name=naming.stack_name(cfg.stage, "network"), **kw)
        s = cfg.stage
        # Zones are named, not looked up: synth stays offline and deterministic.
        self.vpc = ec2.Vpc(
            self, "Vpc", vpc_name=naming.name(s, "net", "vpc"), ip_addresses=ec2.IpAddresses.cidr(cfg.cidr),
            availability_zones=list(cfg.azs), nat_gateways=cfg.nat_gateways,
            restrict_default_security_group=False,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=20),
            ])
        for kind, subnets in (("public", self.vpc.public_subnets), ("private", self.vpc.private_subnets)):
            for i, subnet in enumerate(subnets, 1):
                Tags.of(subnet).add(naming.TAG_NAME, naming.name(s, "net", f"{kind}{i}"), priority=200)

        self.alb_sg = ec2.SecurityGroup(self, "AlbSg", vpc=self.vpc, security_group_name=naming.name(s, "net", "alb"),
                                        description="the API server load balancer", allow_all_outbound=False)
        self.services_sg = ec2.SecurityGroup(self, "ServicesSg", vpc=self.vpc,
                                             security_group_name=naming.name(s, "net", "services"),
                                             description="the services container hosts")
        self.bus_sg = ec2.SecurityGroup(self, "BusSg", vpc=self.vpc, security_group_name=naming.name(s, "net", "bus"),
                                        description="the bus nodes")
        if cfg.domain is not None:  # public, TLS only
            self.alb_sg.add_ingress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to the API server")
        else:  # no certificate: reachable from inside the network only, never plain HTTP on the internet
            self.alb_sg.add_ingress_rule(ec2.Peer.ipv4(cfg.cidr), ec2.Port.tcp(80), "HTTP inside the VPC")
        self.alb_sg.add_egress_rule(self.services_sg, ec2.Port.tcp_range(32768, 65535), "to the API containers")
        self.services_sg.add_ingress_rule(self.alb_sg, ec2.Port.tcp_range(32768, 65535), "from the load balancer")
        self.bus_sg.add_ingress_rule(self.services_sg, ec2.Port.tcp(busconfig.CLIENT_PORT), "clients")
        self.bus_sg.add_ingress_rule(self.services_sg, ec2.Port.tcp(busconfig.MONITOR_PORT), "monitoring")
        self.bus_sg.add_ingress_rule(self.bus_sg, ec2.Port.tcp(busconfig.CLUSTER_PORT), "cluster routes")
        self.bus_sg.add_ingress_rule(self.bus_sg, ec2.Port.tcp(busconfig.CLIENT_PORT), "stream bootstrap")
        for mirror in infra.mirrors:
            if mirror.mirror_of == s:  # the DR bus's leaf node connection (its VPC peered with this one)
                self.bus_sg.add_ingress_rule(ec2.Peer.ipv4(mirror.cidr), ec2.Port.tcp(busconfig.LEAF_PORT),
                                             f"leaf node of the {mirror.stage} mirror")
