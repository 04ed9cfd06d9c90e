"""The recovery service's settings (environment variables; defaults for a real deployment).

    SKYPURZA_RECOVERY_EC2_POLL_S=15          # how often EC2 is asked about managed clusters' nodes
                                            # (0 turns the EC2 watch off; default on when AWS is configured)
    SKYPURZA_RECOVERY_HEARTBEAT_TIMEOUT_S=60 # silence after which a node that has beaten is lost
                                            # (0 turns the heartbeat watch off)
    SKYPURZA_RECOVERY_RECONCILE_S=60         # how often unfinished jobs are looked at again
    SKYPURZA_RECOVERY_MISSING_POLLS=2        # polls an instance may be absent from EC2 before it is lost
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class RecoverySettings:
    ec2_poll_s: float = 15.0
    heartbeat_timeout_s: float = 60.0
    reconcile_s: float = 60.0
    missing_polls: int = 2
    # Terminal jobs whose clusters are checked again at start (a crash right after the end).
    recheck_ended_s: float = 3600.0

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None) -> "RecoverySettings":
        env = os.environ if env is None else env
        aws = any(env.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_ENDPOINT_URL"))

        def num(key: str, default: float) -> float:
            value = env.get(key)
            return float(value) if value not in (None, "") else default

        return cls(
            ec2_poll_s=num("SKYPURZA_RECOVERY_EC2_POLL_S", 15.0 if aws else 0.0),
            heartbeat_timeout_s=num("SKYPURZA_RECOVERY_HEARTBEAT_TIMEOUT_S", 60.0),
            reconcile_s=num("SKYPURZA_RECOVERY_RECONCILE_S", 60.0),
            missing_polls=int(num("SKYPURZA_RECOVERY_MISSING_POLLS", 2)),
        )
