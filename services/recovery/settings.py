"""The recovery service's settings: environment first, then `~/.skypurza/config.yaml`
(`recovery.*`), then the defaults (of a real deployment); read through events/settings.py.

    SKYPURZA_RECOVERY_EC2_POLL_S=15          # how often EC2 is asked about managed clusters' nodes
                                            # (0 turns the EC2 watch off; default on when AWS is
                                            # configured: events/awsconfig.py, 0 otherwise); 0-3600
    SKYPURZA_RECOVERY_HEARTBEAT_TIMEOUT_S=60 # silence after which a node that has beaten is lost
                                            # (0 turns the heartbeat watch off); 0-86400
    SKYPURZA_RECOVERY_RECONCILE_S=60         # how often unfinished jobs are looked at again; 0.1-86400
    SKYPURZA_RECOVERY_MISSING_POLLS=2        # polls an instance may be absent from EC2 before it is lost; 1-100
    SKYPURZA_BUCKET_STORE=s3|dir             # where checkpoint buckets are created (environment only: the
                                            # node agents read the same variable); unset: buckets.store_kind

A value outside its range is a SettingsError naming the variable, the value and the range.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from skypurza.events.awsconfig import aws_config_files, aws_configured
from skypurza.events.settings import Sources
from skypurza.events.slurmpath import slurm_config_path

DAY_S = 86400.0


@dataclass(frozen=True)
class RecoverySettings:
    ec2_poll_s: float = 15.0
    slurm_poll_s: float = 10.0  # squeue over SSH (slurmwatch.py); 0 when no ~/.slurm/config names a cluster
    heartbeat_timeout_s: float = 60.0
    reconcile_s: float = 60.0
    missing_polls: int = 2
    bucket_store: str | None = None  # None: S3 when AWS is configured (buckets.store_kind)
    # Terminal jobs whose clusters are checked again at start (a crash right after the end).
    recheck_ended_s: float = 3600.0

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, config: Mapping[str, Any] | None = None,
             aws_files: tuple[Path, ...] | None = None) -> "RecoverySettings":
        """`aws_files`: which of the AWS credential files exist (looked up here when None)."""
        # It never needed the config file before `recovery.*`: one that is not valid YAML must not stop it.
        src = Sources.load(env, config, tolerate_broken_config=True)
        if aws_files is None:  # the I/O of the "AWS is configured" rule, done at the edge
            aws_files = tuple(p for p in aws_config_files(src.env, Path.home()) if p.is_file())
        aws = aws_configured(src.env, aws_files)
        base = cls()
        return cls(
            ec2_poll_s=src.seconds("SKYPURZA_RECOVERY_EC2_POLL_S", base.ec2_poll_s if aws else 0.0, high=3600,
                                   key="recovery.ec2_poll_s"),
            slurm_poll_s=src.seconds("SKYPURZA_RECOVERY_SLURM_POLL_S",
                                     base.slurm_poll_s if slurm_config_path(src.env).is_file() else 0.0, high=3600,
                                     key="recovery.slurm_poll_s"),
            heartbeat_timeout_s=src.seconds("SKYPURZA_RECOVERY_HEARTBEAT_TIMEOUT_S", base.heartbeat_timeout_s,
                                            high=DAY_S, key="recovery.heartbeat_timeout_s"),
            reconcile_s=src.seconds("SKYPURZA_RECOVERY_RECONCILE_S", base.reconcile_s, low=0.1, high=DAY_S,
                                    key="recovery.reconcile_s"),
            missing_polls=src.integer("SKYPURZA_RECOVERY_MISSING_POLLS", base.missing_polls, low=1, high=100,
                                      key="recovery.missing_polls"),
            bucket_store=src.choice("SKYPURZA_BUCKET_STORE", None, ("s3", "dir"), fold=str.lower),
        )
