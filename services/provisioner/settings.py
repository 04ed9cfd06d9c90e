"""The provisioner's settings: environment first, then `~/.skypurza/config.yaml`, then defaults.

    SKYPURZA_AWS_REGIONS=us-east-1,us-west-2   # enabled regions (config: aws.regions);
                                                # unset: the regions EC2's DescribeRegions lists
    SKYPURZA_AWS_POLL_S=2                       # how often a launch polls for `running`
    SKYPURZA_AWS_LAUNCH_TIMEOUT_S=900
    SKYPURZA_AWS_RETRY_BASE_S=0.5               # back-off base of retried (transient) AWS calls
    SKYPURZA_AWS_MAX_ATTEMPTS=6
    SKYPURZA_PROVISIONER_CONCURRENCY=8          # launches/terminations handled at once
    SKYPURZA_PROVISIONER_ACK_WAIT_S=30          # redelivery delay after a provisioner died
    SKYPURZA_PROVISIONER_TRANSIENT_ATTEMPTS=3   # launch tries on transient failures
    SKYPURZA_RECONCILE_INTERVAL_S=300           # 0 turns periodic reconciliation off
    SKYPURZA_RECONCILE_GRACE_S=600              # younger nodes are never orphans (launching)
    SKYPURZA_RECONCILE_TERMINATE=0              # 1: the periodic pass also terminates orphans
    SKYPURZA_RECONCILE_INFRAS=aws               # reconciled even with no live cluster there
    SKYPURZA_CLEANUP_INTERVAL_S=60              # background sweep of unused resources; 0: off
    SKYPURZA_CLEANUP_ATTEMPTS=5                 # tries per resource that cannot be released
    SKYPURZA_CLEANUP_BACKOFF_S=60               # try n waits backoff * 2**(n-1) after the last
    SKYPURZA_CLEANUP_WAIT_S=20                  # a teardown's own release, before ClusterTerminated
    SKYPURZA_AGENT_NATS_URL=nats://host:4222    # the NATS address EC2 nodes can reach
    SKYPURZA_NODE_INSTALL='skypurza==0.1.0'     # pip requirement installed on EC2 nodes

AWS credentials and the endpoint are botocore's own (AWS_ACCESS_KEY_ID, AWS_PROFILE,
AWS_ENDPOINT_URL ...): the adapter passes nothing, so botocore reads them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skypurza import __version__


@dataclass(frozen=True)
class ProvisionerSettings:
    aws_regions: tuple[str, ...] = ()  # empty: ask EC2 which regions are enabled
    aws_poll_s: float = 2.0
    aws_launch_timeout_s: float = 900.0
    aws_retry_base_s: float = 0.5
    aws_max_attempts: int = 6
    concurrency: int = 8
    ack_wait_s: float = 30.0
    transient_attempts: int = 3
    transient_backoff_s: float = 2.0
    reconcile_interval_s: float = 300.0
    reconcile_grace_s: float = 600.0
    reconcile_terminate: bool = False
    reconcile_infras: tuple[str, ...] = ()
    agent_nats_url: str | None = None
    node_install: str = f"skypurza=={__version__}"
    local_root: str | None = None
    cleanup_interval_s: float = 60.0
    cleanup_attempts: int = 5
    cleanup_backoff_s: float = 60.0
    cleanup_wait_s: float = 20.0

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None) -> ProvisionerSettings:
        env = os.environ if env is None else env
        if config is None:
            try:
                from skypurza.events.config import load_config

                config = load_config().data
            except Exception:  # a broken config file must not stop the provisioner
                config = {}
        aws = dict(config.get("aws") or {})
        prov = dict(config.get("provisioner") or {})

        def pick(var: str, *keys: tuple[Mapping[str, Any], str]) -> Any:
            if env.get(var) not in (None, ""):
                return env[var]
            for section, key in keys:
                if section.get(key) not in (None, ""):
                    return section[key]
            return None

        def num(var: str, default: float, *keys: tuple[Mapping[str, Any], str]) -> float:
            value = pick(var, *keys)
            return default if value is None else float(value)

        def names(value: Any) -> tuple[str, ...]:
            if value is None:
                return ()
            items = value.split(",") if isinstance(value, str) else list(value)
            return tuple(str(v).strip() for v in items if str(v).strip())

        base = cls()
        return cls(
            aws_regions=names(pick("SKYPURZA_AWS_REGIONS", (aws, "regions"))),
            aws_poll_s=num("SKYPURZA_AWS_POLL_S", base.aws_poll_s, (aws, "poll_s")),
            aws_launch_timeout_s=num("SKYPURZA_AWS_LAUNCH_TIMEOUT_S", base.aws_launch_timeout_s,
                                     (aws, "launch_timeout_s")),
            aws_retry_base_s=num("SKYPURZA_AWS_RETRY_BASE_S", base.aws_retry_base_s, (aws, "retry_base_s")),
            aws_max_attempts=int(num("SKYPURZA_AWS_MAX_ATTEMPTS", base.aws_max_attempts, (aws, "max_attempts"))),
            concurrency=int(num("SKYPURZA_PROVISIONER_CONCURRENCY", base.concurrency, (prov, "concurrency"))),
            ack_wait_s=num("SKYPURZA_PROVISIONER_ACK_WAIT_S", base.ack_wait_s, (prov, "ack_wait_s")),
            transient_attempts=int(num("SKYPURZA_PROVISIONER_TRANSIENT_ATTEMPTS", base.transient_attempts,
                                       (prov, "transient_attempts"))),
            transient_backoff_s=num("SKYPURZA_PROVISIONER_TRANSIENT_BACKOFF_S", base.transient_backoff_s,
                                    (prov, "transient_backoff_s")),
            reconcile_interval_s=num("SKYPURZA_RECONCILE_INTERVAL_S", base.reconcile_interval_s,
                                     (prov, "reconcile_interval_s")),
            reconcile_grace_s=num("SKYPURZA_RECONCILE_GRACE_S", base.reconcile_grace_s, (prov, "reconcile_grace_s")),
            reconcile_terminate=str(pick("SKYPURZA_RECONCILE_TERMINATE", (prov, "reconcile_terminate")) or "")
            .lower() in ("1", "true", "yes"),
            reconcile_infras=names(pick("SKYPURZA_RECONCILE_INFRAS", (prov, "reconcile_infras"))),
            agent_nats_url=pick("SKYPURZA_AGENT_NATS_URL", (prov, "agent_nats_url")),
            node_install=str(pick("SKYPURZA_NODE_INSTALL", (prov, "node_install")) or base.node_install),
            local_root=pick("SKYPURZA_LOCAL_ROOT", (prov, "local_root")),
            cleanup_interval_s=num("SKYPURZA_CLEANUP_INTERVAL_S", base.cleanup_interval_s,
                                   (prov, "cleanup_interval_s")),
            cleanup_attempts=int(num("SKYPURZA_CLEANUP_ATTEMPTS", base.cleanup_attempts, (prov, "cleanup_attempts"))),
            cleanup_backoff_s=num("SKYPURZA_CLEANUP_BACKOFF_S", base.cleanup_backoff_s, (prov, "cleanup_backoff_s")),
            cleanup_wait_s=num("SKYPURZA_CLEANUP_WAIT_S", base.cleanup_wait_s, (prov, "cleanup_wait_s")),
        )
