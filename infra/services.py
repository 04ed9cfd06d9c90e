"""A stage's services and API server: one ECS service per SkyPurza service, each a container of
the repository's Dockerfile (`spz api serve --services <name>`, as compose.yaml runs them), on
EC2 container hosts, with counts from the config; the API server behind a load balancer.

Each container connects to the secured bus as its own user (the service's contract name; the
API server's is `api`): ECS reads that one secret into SKYPURZA_NATS_USER and
SKYPURZA_NATS_PASSWORD (events/natscreds.py), never another's, and its execution role may read
that one only (infra/iam.py). The alerts container gets its webhooks too, from a secret of their
own (a Slack URL is a credential): made here with empty `slack` and `json` keys, which the
operator fills (docs/deploy.md, *Alert webhooks*)."""

from __future__ import annotations

from pathlib import Path

import json

from aws_cdk import CfnOutput, Duration, Stack, aws_autoscaling as autoscaling, aws_ec2 as ec2, aws_ecs as ecs, \
    aws_elasticloadbalancingv2 as elbv2, aws_iam as iam, aws_logs as logs, aws_route53 as route53, \
    aws_route53_targets as targets, aws_secretsmanager as secretsmanager
from constructs import Construct

from skypurza.events import naming
from skypurza.events.natscreds import PASSWORD_ENV, USER_ENV
from skypurza.services.observability.alerts.settings import WEBHOOKS_SECRET_KEYS

from . import dns, iam as spziam
from .bus import BusStack
from .config import ALERTS, API, BUS_NODES, SERVICES, SINGLE_WRITERS, StageConfig
from .network import API_PORT, NetworkStack

REPO = Path(__file__).resolve().parent.parent
# What the Dockerfile copies: the image asset is staged from these alone, not the whole checkout.
IMAGE_FILES = ("Dockerfile", "pyproject.toml", "README.md", "__init__.py", "events", "services", "cli")
# A soft reservation (ECS places tasks by it; no hard limit is set). Mirror, dispatch and alerts
# keep a fold of the log: ~40 MiB resident each on an empty log (a local probe), so 256 MiB leaves
# them room, while the default 512 would put a one-host stage (bake_usw2: 7,424 MiB with 256)
# past the 8 GiB of its m6i.large.
MEMORY_MIB = {"provisioner": 1024, "status": 1024, "ledger": 1024, API: 768, "mirror": 256, "dispatch": 256,
              "alerts": 256}
DEFAULT_MEMORY_MIB = 512
STATE_VOLUME = "state"


def image_excludes() -> list[str]:
    return ["*", *(f"!{f}" for f in IMAGE_FILES), "**/__pycache__"]


def service_command(service: str, cfg: StageConfig) -> list[str]:
    if service == API:
        return ["python", "-m", "skypurza.services.api", "--nats", nats_url(cfg), "--stage", cfg.serves,
                "--host", "0.0.0.0", "--port", str(API_PORT)]
    return ["spz", "api", "serve", "--services", service]


def nats_url(cfg: StageConfig) -> str:
    from . import busconfig

    return ",".join(f"nats://{naming.bus_node_host(cfg.stage, n)}:{busconfig.CLIENT_PORT}"
                    for n in range(1, BUS_NODES + 1))


def bus_secrets(bus: BusStack, service: str) -> dict[str, ecs.Secret]:
    """The service's own bus user, from its secret's JSON keys (the ARN is the bus stack's: ECS
    takes a JSON key only with the full ARN, which the name alone does not give)."""
    secret = bus.user_secrets.get(service)
    if secret is None:  # a service without a contract would connect as nobody: refused by the bus
        raise ValueError(f"service {service!r} has no bus user: no contract declares it (cli/contracts.py)")
    return {USER_ENV: ecs.Secret.from_secrets_manager(secret, "user"),
            PASSWORD_ENV: ecs.Secret.from_secrets_manager(secret, "password")}


def alerts_webhooks_secrets(secret: secretsmanager.ISecret) -> dict[str, ecs.Secret]:
    """The alerts container's webhook variables, each from its key of the webhooks' secret (an
    empty key is no webhook: events/settings.py counts an empty variable as unset)."""
    return {env: ecs.Secret.from_secrets_manager(secret, key) for key, env in WEBHOOKS_SECRET_KEYS.items()}


def environment(cfg: StageConfig) -> dict[str, str]:
    return {"SKYPURZA_NATS_URL": nats_url(cfg), "SKYPURZA_STAGE": cfg.serves,
            "SKYPURZA_REPLICAS": str(BUS_NODES),  # streams a service creates are R3 (events/bus.py)
            "AWS_DEFAULT_REGION": cfg.region}


class ServicesStack(Stack):
    def __init__(self, scope: Construct, cfg: StageConfig, network: NetworkStack, bus: BusStack,
                 certificate_stack: "dns.DnsStack | None", **kw) -> None:
        super().__init__(scope, naming.stack_name(cfg.stage, "services"),
                         stack_name=naming.stack_name(cfg.stage, "services"), **kw)
        s = cfg.stage
        vpc = network.vpc
        self.cluster = ecs.Cluster(self, "Cluster", cluster_name=naming.name(s, "services", "cluster"), vpc=vpc)
        host_role = iam.Role(self, "HostRole", role_name=naming.role_name(s, "services", "host"),
                             assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
                             managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(
                                 "AmazonSSMManagedInstanceCore")])
        template = ec2.LaunchTemplate(
            self, "HostTemplate", launch_template_name=naming.name(s, "services", "host"),
            instance_type=ec2.InstanceType(cfg.service_instance_type),
            machine_image=ecs.EcsOptimizedImage.amazon_linux2023(), user_data=ec2.UserData.for_linux(),
            role=host_role, security_group=network.services_sg, require_imdsv2=True,
            block_devices=[ec2.BlockDevice(device_name="/dev/xvda", volume=ec2.BlockDeviceVolume.ebs(
                40, encrypted=True, volume_type=ec2.EbsDeviceVolumeType.GP3))])
        asg = autoscaling.AutoScalingGroup(
            self, "Hosts", vpc=vpc, launch_template=template, min_capacity=cfg.service_instances,
            max_capacity=cfg.service_instances, vpc_subnets=ec2.SubnetSelection(
                subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS))
        provider = ecs.AsgCapacityProvider(self, "Capacity", auto_scaling_group=asg,
                                           capacity_provider_name=naming.name(s, "services", "capacity"),
                                           enable_managed_termination_protection=False)
        self.cluster.add_asg_capacity_provider(provider)

        # The keys exist from the start (ECS refuses to start a task whose secret lacks one), empty;
        # Secrets Manager draws the value of one more, `unused`, so that no value is in the template.
        self.alerts_webhooks = secretsmanager.Secret(
            self, "AlertsWebhooks", secret_name=naming.alerts_webhooks_secret(s),
            description="the alerts service's webhook URLs: comma-separated under slack and json (docs/deploy.md)",
            generate_secret_string=secretsmanager.SecretStringGenerator(
                secret_string_template=json.dumps({key: "" for key in WEBHOOKS_SECRET_KEYS}),
                generate_string_key="unused", exclude_punctuation=True, password_length=8))
        image = ecs.ContainerImage.from_asset(str(REPO), exclude=image_excludes())
        self.services: dict[str, ecs.Ec2Service] = {}
        for service in (*SERVICES, API):
            task = ecs.Ec2TaskDefinition(
                self, f"{service.capitalize()}Task", family=naming.name(s, service, "task"),
                network_mode=ecs.NetworkMode.BRIDGE,
                task_role=iam.Role.from_role_arn(self, f"{service.capitalize()}TaskRole", spziam.role_arn(
                    cfg, spziam.task_role_name(s, service)), mutable=False),
                execution_role=iam.Role.from_role_arn(self, f"{service.capitalize()}ExecRole", spziam.role_arn(
                    cfg, spziam.exec_role_name(s, service)), mutable=False))
            if service in ("status", "ledger"):  # its DuckDB file: rebuilt from the log if the host goes
                task.add_volume(name=STATE_VOLUME, docker_volume_configuration=ecs.DockerVolumeConfiguration(
                    scope=ecs.Scope.SHARED, autoprovision=True, driver="local"))
            container = task.add_container(
                "app", image=image, command=service_command(service, cfg) if service != API else None,
                entry_point=service_command(service, cfg) if service == API else None,
                memory_reservation_mib=MEMORY_MIB.get(service, DEFAULT_MEMORY_MIB),
                environment=environment(cfg), secrets={**bus_secrets(bus, service), **(
                    alerts_webhooks_secrets(self.alerts_webhooks) if service == ALERTS else {})},
                logging=ecs.LogDrivers.aws_logs(stream_prefix=service, log_group=logs.LogGroup.from_log_group_name(
                    self, f"{service.capitalize()}Logs", naming.log_group(s, service))))
            if service in ("status", "ledger"):
                container.add_mount_points(ecs.MountPoint(container_path="/home/skypurza/.skypurza",
                                                          source_volume=STATE_VOLUME, read_only=False))
            if service == API:
                container.add_port_mappings(ecs.PortMapping(container_port=API_PORT, host_port=0))
            single = service in SINGLE_WRITERS
            self.services[service] = ecs.Ec2Service(
                self, f"{service.capitalize()}Service", service_name=naming.name(s, service, "service"),
                cluster=self.cluster, task_definition=task, desired_count=cfg.running(service),
                min_healthy_percent=0 if single else 50, max_healthy_percent=100 if single else 200,
                circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
                capacity_provider_strategies=[ecs.CapacityProviderStrategy(
                    capacity_provider=provider.capacity_provider_name, weight=1)])
            self.services[service].node.add_dependency(bus)
        self._api(cfg, network, certificate_stack)

    def _api(self, cfg: StageConfig, network: NetworkStack, certificate_stack: "dns.DnsStack | None") -> None:
        s = cfg.stage
        public = cfg.domain is not None
        alb = elbv2.ApplicationLoadBalancer(
            self, "ApiLb", load_balancer_name=naming.load_balancer(s, "api"), vpc=network.vpc,
            internet_facing=public, security_group=network.alb_sg, drop_invalid_header_fields=True,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC if public
                                            else ec2.SubnetType.PRIVATE_WITH_EGRESS))
        if public:
            assert certificate_stack is not None and cfg.domain is not None
            listener = alb.add_listener("Https", port=443, open=False, certificates=[
                elbv2.ListenerCertificate.from_certificate_manager(certificate_stack.certificate)],
                ssl_policy=elbv2.SslPolicy.RECOMMENDED_TLS)
        else:
            listener = alb.add_listener("Http", port=80, open=False)
        listener.add_targets("Api", target_group_name=naming.load_balancer(s, "apitg"), port=API_PORT,
                             protocol=elbv2.ApplicationProtocol.HTTP, targets=[self.services[API]],
                             deregistration_delay=Duration.seconds(30),
                             health_check=elbv2.HealthCheck(path="/api/v1/health", healthy_http_codes="200"))
        if public:
            assert cfg.domain is not None
            route53.ARecord(self, "ApiRecord", zone=dns.hosted_zone(self, cfg.domain),
                            record_name=cfg.domain.api_host + ".",
                            target=route53.RecordTarget.from_alias(targets.LoadBalancerTarget(alb)))
            url = f"https://{cfg.domain.api_host}"
        else:
            url = f"http://{alb.load_balancer_dns_name}"
        CfnOutput(self, "ApiUrl", value=url, description="the API server (spz api login)")
