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
    SKYPURZA_PROVISIONER_TRANSIENT_BACKOFF_S=2  # wait between those tries
    SKYPURZA_RECONCILE_INTERVAL_S=300           # 0 turns periodic reconciliation off
    SKYPURZA_RECONCILE_GRACE_S=600              # younger nodes are never orphans (launching)
    SKYPURZA_RECONCILE_TERMINATE=0              # 1: the periodic pass also terminates orphans
    SKYPURZA_RECONCILE_INFRAS=aws               # reconciled even with no live cluster there
    SKYPURZA_CLEANUP_INTERVAL_S=60              # background sweep of unused resources; 0: off
    SKYPURZA_CLEANUP_ATTEMPTS=5                 # tries per resource that cannot be released
    SKYPURZA_CLEANUP_BACKOFF_S=60               # try n waits backoff * 2**(n-1) after the last
    SKYPURZA_CLEANUP_WAIT_S=20                  # a teardown's own release, before ClusterTerminated
    SKYPURZA_AGENT_NATS_URL=nats://host:4222    # the NATS address EC2 nodes can reach
    SKYPURZA_AGENT_NATS_URL_REQUIRED=0          # 1: refuse aws/kubernetes launches while it is unset
                                                # (compose: its nodes' own names reach no EC2 node)
    SKYPURZA_NODE_INSTALL='skypurza==0.1.0'     # pip requirement installed on EC2 nodes
    SKYPURZA_LOCAL_SPARE=1                      # 0: no pre-started agent for the next local node

Each value is checked where it is read (events/settings.py): a number outside its range, or a
word where a number belongs, stops the provisioner with one line naming the variable, the value
and what it accepts (docs/provisioner.md lists the ranges). A config.yaml that is not valid YAML
is ignored here, as before: the environment and the defaults still apply.

AWS credentials and the endpoint are botocore's own (AWS_ACCESS_KEY_ID, AWS_PROFILE,
AWS_ENDPOINT_URL ...): the adapter passes nothing, so botocore reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skypurza import __version__
from skypurza.events.settings import Sources


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
    agent_nats_url_required: bool = False
    node_install: str = f"skypurza=={__version__}"
    local_root: str | None = None
    local_spare: bool = True
    cleanup_interval_s: float = 60.0
    cleanup_attempts: int = 5
    cleanup_backoff_s: float = 60.0
    cleanup_wait_s: float = 20.0

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None) -> ProvisionerSettings:
        """Every value through events/settings.py: environment, then config.yaml (`aws.*`,
        `provisioner.*`), then the default; a value out of its range is a SettingsError."""
        # A config file that is not valid YAML must not stop the provisioner (env and defaults apply).
        src = Sources.load(env, config, tolerate_broken_config=True)
        base = cls()
        day = 86400.0
        return cls(
            aws_regions=src.names("SKYPURZA_AWS_REGIONS", key="aws.regions"),
            aws_poll_s=src.seconds("SKYPURZA_AWS_POLL_S", base.aws_poll_s, low=0.001, high=600, key="aws.poll_s"),
            aws_launch_timeout_s=src.seconds("SKYPURZA_AWS_LAUNCH_TIMEOUT_S", base.aws_launch_timeout_s,
                                             low=1, high=day, key="aws.launch_timeout_s"),
            aws_retry_base_s=src.seconds("SKYPURZA_AWS_RETRY_BASE_S", base.aws_retry_base_s, high=600,
                                         key="aws.retry_base_s"),
            aws_max_attempts=src.integer("SKYPURZA_AWS_MAX_ATTEMPTS", base.aws_max_attempts, low=1, high=100,
                                         key="aws.max_attempts"),
            concurrency=src.integer("SKYPURZA_PROVISIONER_CONCURRENCY", base.concurrency, low=1, high=1024,
                                    key="provisioner.concurrency"),
            ack_wait_s=src.seconds("SKYPURZA_PROVISIONER_ACK_WAIT_S", base.ack_wait_s, low=1, high=day,
                                   key="provisioner.ack_wait_s"),
            transient_attempts=src.integer("SKYPURZA_PROVISIONER_TRANSIENT_ATTEMPTS", base.transient_attempts,
                                           low=1, high=100, key="provisioner.transient_attempts"),
            transient_backoff_s=src.seconds("SKYPURZA_PROVISIONER_TRANSIENT_BACKOFF_S", base.transient_backoff_s,
                                            high=3600, key="provisioner.transient_backoff_s"),
            reconcile_interval_s=src.seconds("SKYPURZA_RECONCILE_INTERVAL_S", base.reconcile_interval_s,
                                             high=day, key="provisioner.reconcile_interval_s"),
            reconcile_grace_s=src.seconds("SKYPURZA_RECONCILE_GRACE_S", base.reconcile_grace_s, high=7 * day,
                                          key="provisioner.reconcile_grace_s"),
            reconcile_terminate=src.flag("SKYPURZA_RECONCILE_TERMINATE", base.reconcile_terminate,
                                         key="provisioner.reconcile_terminate"),
            reconcile_infras=src.names("SKYPURZA_RECONCILE_INFRAS", key="provisioner.reconcile_infras"),
            agent_nats_url=src.text("SKYPURZA_AGENT_NATS_URL", key="provisioner.agent_nats_url") or None,
            agent_nats_url_required=src.flag("SKYPURZA_AGENT_NATS_URL_REQUIRED", base.agent_nats_url_required,
                                             key="provisioner.agent_nats_url_required"),
            node_install=src.text("SKYPURZA_NODE_INSTALL", base.node_install, key="provisioner.node_install")
            or base.node_install,
            local_root=src.text("SKYPURZA_LOCAL_ROOT", key="provisioner.local_root"),
            local_spare=src.flag("SKYPURZA_LOCAL_SPARE", base.local_spare, key="provisioner.local_spare"),
            cleanup_interval_s=src.seconds("SKYPURZA_CLEANUP_INTERVAL_S", base.cleanup_interval_s, high=day,
                                           key="provisioner.cleanup_interval_s"),
            cleanup_attempts=src.integer("SKYPURZA_CLEANUP_ATTEMPTS", base.cleanup_attempts, low=1, high=100,
                                         key="provisioner.cleanup_attempts"),
            cleanup_backoff_s=src.seconds("SKYPURZA_CLEANUP_BACKOFF_S", base.cleanup_backoff_s, high=day,
                                          key="provisioner.cleanup_backoff_s"),
            cleanup_wait_s=src.seconds("SKYPURZA_CLEANUP_WAIT_S", base.cleanup_wait_s, high=3600,
                                       key="provisioner.cleanup_wait_s"),
        )
