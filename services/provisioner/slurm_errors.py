"""Slurm's own error text (sbatch, srun, scontrol over SSH) -> a classified Failure, as
aws_errors.py does for EC2: pure, one table.

A partition is a zone and the cluster its region: a partition that cannot take this shape
blocks the zone (the optimizer tries the next partition, cluster or cloud); a policy limit
(QOS, association) blocks the cluster; an unreachable login node is the cluster's capacity
gone for now (fail over, as SkyPilot does when a cluster does not answer).
"""

from __future__ import annotations

import re

from .adapter import Failure, FailureKind, FailureScope

K, S = FailureKind, FailureScope

# (pattern in the message, kind, scope, code, hint): the first that matches wins.
_RULES: tuple[tuple[str, FailureKind, FailureScope, str, str], ...] = (
    (r"Requested node configuration is not available", K.CAPACITY, S.ZONE, "SlurmNodeConfigUnavailable",
     "no node of this partition has that many CPUs, that much memory or those GPUs"),
    (r"Node count specification invalid", K.CAPACITY, S.ZONE, "SlurmNodeCountInvalid",
     "the partition has fewer nodes than the task asks for"),
    (r"Memory required by task is not available", K.CAPACITY, S.ZONE, "SlurmMemoryUnavailable", ""),
    (r"More processors requested than permitted", K.CAPACITY, S.ZONE, "SlurmTooManyCpus", ""),
    (r"Requested time limit is invalid", K.UNSUPPORTED, S.ZONE, "SlurmTimeLimitInvalid",
     "the time asked for exceeds the partition's MaxTime"),
    (r"Invalid partition name specified", K.UNSUPPORTED, S.ZONE, "SlurmInvalidPartition",
     "see `sinfo` on the login node for the partitions"),
    (r"Invalid generic resource \(gres\) specification|Invalid GRES", K.UNSUPPORTED, S.ZONE, "SlurmInvalidGres",
     "map the accelerator to this site's GRES type: slurm.cluster_configs.<cluster>.gres"),
    (r"Invalid feature specification", K.UNSUPPORTED, S.ZONE, "SlurmInvalidFeature", ""),
    (r"Partition is down|partition .* is in state DOWN", K.CAPACITY, S.ZONE, "SlurmPartitionDown", ""),
    (r"QOSMax\w+Limit|Job violates accounting/QOS policy|AssocMax\w+Limit", K.QUOTA, S.REGION, "SlurmPolicyLimit",
     "an account or QOS limit of the site; ask its administrators or use another account"),
    (r"Invalid account or account/partition combination", K.AUTH, S.REGION, "SlurmInvalidAccount",
     "set slurm.sbatch_options.account to an account you belong to (sacctmgr show assoc user=$USER)"),
    (r"Access/permission denied|User's group not permitted|Invalid user id", K.AUTH, S.REGION,
     "SlurmPermissionDenied", "the login identity may not submit here (see submit_as_user in docs/slurm.md)"),
    (r"Permission denied \(publickey|Authentication failed|Host key verification failed", K.AUTH, S.REGION,
     "SlurmSshAuthFailed", "check User and IdentityFile for this cluster in ~/.slurm/config"),
    (r"unrecognized option|invalid option|Invalid --|invalid argument|Invalid job array", K.INVALID, S.REQUEST,
     "SlurmInvalidOption", "check slurm.sbatch_options"),
    (r"Unable to contact slurm controller|Socket timed out|temporarily unable to accept job|"
     r"Slurm backup controller in standby mode|Zero Bytes were transmitted", K.TRANSIENT, S.REQUEST,
     "SlurmControllerBusy", ""),
    (r"Connection refused|Connection timed out|No route to host|Could not resolve hostname|Connection reset|"
     r"Connection closed|Network is unreachable|timed out", K.CAPACITY, S.REGION, "SlurmUnreachable",
     "the cluster's login node does not answer over SSH"),
    (r"command not found|sbatch: not found", K.UNSUPPORTED, S.REGION, "SlurmNotInstalled",
     "the login node has no Slurm commands on the PATH of a non-interactive SSH session"),
)


def classify(message: str, code: str = "") -> Failure:
    """The Failure of Slurm's (or ssh's) message; unknown text is UNKNOWN (retried, then given up)."""
    text = (message or "").strip()
    for pattern, kind, scope, rule_code, hint in _RULES:
        if re.search(pattern, text, re.IGNORECASE):
            return Failure(kind, scope, rule_code, _short(text), hint)
    return Failure(K.UNKNOWN, S.REQUEST, code or "SlurmError", _short(text) or "sbatch failed with no message")


def _short(text: str, limit: int = 2000) -> str:
    """The lines that say what failed (sbatch prefixes them `sbatch: error:`), bounded."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()] or lines
    return "\n".join(errors)[:limit]
