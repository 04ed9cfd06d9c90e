"""The API server's certificate, where a domain is configured (validated in the hosted zone)."""

from __future__ import annotations

from aws_cdk import Stack, Tags, aws_certificatemanager as acm, aws_route53 as route53
from constructs import Construct

from skypurza.events import naming

from .config import Domain, StageConfig


def hosted_zone(scope: Construct, domain: Domain) -> route53.IHostedZone:
    return route53.HostedZone.from_hosted_zone_attributes(scope, "ApiZone", hosted_zone_id=domain.hosted_zone_id,
                                                         zone_name=domain.zone_name)


class DnsStack(Stack):
    def __init__(self, scope: Construct, cfg: StageConfig, **kw) -> None:
        assert cfg.domain is not None
        super().__init__(scope, naming.stack_name(cfg.stage, "dns"),
                         stack_name=naming.stack_name(cfg.stage, "dns"), **kw)
        self.certificate = acm.Certificate(self, "ApiCertificate", domain_name=cfg.domain.api_host,
                                           validation=acm.CertificateValidation.from_dns(
                                               hosted_zone(self, cfg.domain)))
        Tags.of(self.certificate).add(naming.TAG_NAME, naming.name(cfg.stage, "dns", "api"), priority=200)
