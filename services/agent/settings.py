"""The node agent's settings, read through events/settings.py like every service's.

    SKYPURZA_AGENT_HEARTBEAT_S=5        # heartbeat interval; 0.05-3600
    SKYPURZA_AGENT_KILL_GRACE_S=10      # SIGTERM -> SIGKILL grace when stopping a job; 0-3600
    SKYPURZA_AGENT_LOG_LEVEL=INFO       # the agent's own log: DEBUG, INFO, WARNING, ERROR, CRITICAL
    SKYPURZA_CHECKPOINT_SYNC_S=30       # upload interval of checkpoint buckets; 0.05-86400
    SKYPURZA_BUCKET_STORE=s3|dir        # where checkpoint buckets live (unset: storage.store_kind)
    SKYPURZA_AGENT_SAMPLE_S=10          # node samples (CPU, memory, disk, GPUs); 0 (off) or 0.2-3600
    SKYPURZA_AGENT_XID_SOURCE=auto      # where Xid errors are read: auto, dmesg, journalctl, none
    SKYPURZA_AGENT_GPU_SOURCE=auto      # where GPUs are read: auto (DCGM, else nvidia-smi), dcgm, nvidia-smi
    SKYPURZA_AGENT_TOOL_TIMEOUT_S=10    # each sampling command (dcgmi, nvidia-smi, dmesg) is killed after; 0.2-120

The environment only: a node is started with the environment it needs (the local backend's
processes inherit it, EC2 user-data sets it) and has no `~/.skypurza/config.yaml` of the
user's, so the agent never reads one. A value outside its range is a SettingsError naming the
variable, the value and what is accepted; `python -m skypurza.services.agent` prints that one
line and exits 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from skypurza.events.settings import SettingsError, Sources

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
BUCKET_STORES = ("s3", "dir")
HOUR_S = 3600.0
DAY_S = 86400.0
MIN_SAMPLE_S = 0.2
XID_SOURCES = ("auto", "dmesg", "journalctl", "none")
GPU_SOURCES = ("auto", "dcgm", "nvidia-smi")


@dataclass(frozen=True)
class AgentSettings:
    heartbeat_s: float = 5.0
    kill_grace_s: float = 10.0
    log_level: str = "INFO"
    checkpoint_sync_s: float = 30.0
    bucket_store: str | None = None  # None: S3 when AWS is configured (storage.store_kind)
    # Bounded below: each sample runs nvidia-smi and reads the kernel log, and every node sends
    # one to the control plane (docs/DESIGN.md, *Node samples*).
    sample_s: float = 10.0
    xid_source: str = "auto"
    gpu_source: str = "auto"
    tool_timeout_s: float = 10.0

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None) -> AgentSettings:
        src = Sources.load(env, {})  # environment only (see above)
        base = cls()
        return cls(
            heartbeat_s=src.seconds("SKYPURZA_AGENT_HEARTBEAT_S", base.heartbeat_s, low=0.05, high=HOUR_S),
            kill_grace_s=src.seconds("SKYPURZA_AGENT_KILL_GRACE_S", base.kill_grace_s, high=HOUR_S),
            log_level=src.choice("SKYPURZA_AGENT_LOG_LEVEL", base.log_level, LOG_LEVELS, fold=str.upper) or "INFO",
            checkpoint_sync_s=src.seconds("SKYPURZA_CHECKPOINT_SYNC_S", base.checkpoint_sync_s, low=0.05,
                                          high=DAY_S),
            bucket_store=src.choice("SKYPURZA_BUCKET_STORE", None, BUCKET_STORES, fold=str.lower),
            sample_s=_sample_s(src.seconds("SKYPURZA_AGENT_SAMPLE_S", base.sample_s, high=HOUR_S)),
            xid_source=src.choice("SKYPURZA_AGENT_XID_SOURCE", base.xid_source, XID_SOURCES, fold=str.lower)
            or "auto",
            gpu_source=src.choice("SKYPURZA_AGENT_GPU_SOURCE", base.gpu_source, GPU_SOURCES, fold=str.lower)
            or "auto",
            tool_timeout_s=src.seconds("SKYPURZA_AGENT_TOOL_TIMEOUT_S", base.tool_timeout_s, low=MIN_SAMPLE_S,
                                       high=120.0),
        )


def _sample_s(value: float) -> float:
    if 0 < value < MIN_SAMPLE_S:
        raise SettingsError(f"SKYPURZA_AGENT_SAMPLE_S={value:g}: expected 0 (off) or {MIN_SAMPLE_S:g} to "
                            f"{HOUR_S:g} seconds")
    return value
