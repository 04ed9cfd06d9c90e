"""Scripted inputs for the replay regression net (tests/test_replay_net.py), for the cases the
golden log lacks: failover chains, attempt limits, infeasible tasks, recovery episodes.

The golden log (tests/golden/events.jsonl) is history and stays byte-for-byte; what is here is
input only. Where a decider's next input depends on its own last output (a CapacityError names
the candidate the optimizer chose; a recovery fact names the cluster the machine launched), the
script says *what happens* and the replay fills in *where* from the decider's own decision, as
the real services would. Every value is fixed: no clock, no random, no environment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from skypurza.events.managed_events import ManagedJobSubmitted
from skypurza.events.models import TaskSubmitted
from skypurza.services.optimizer.local import LocalResources
from skypurza.services.recovery import machine
from skypurza.services.recovery.strategy import Placed

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


# ---------------------------------------------------------------- optimizer


@dataclass(frozen=True)
class OptimizerCase:
    """A task, then one CapacityError (of these classes, in order) for each candidate chosen."""

    submitted: TaskSubmitted
    errors: tuple[str, ...] = ()
    max_attempts: int = 64
    # Where it may place (the World's enabled infras), and this machine's resources (fixed here:
    # the service detects them once, at setup; the decider only gets them).
    infras: frozenset[str] = frozenset({"aws"})
    local: LocalResources | None = None


def _task(task_id: str, resources: dict[str, Any], **kw: Any) -> TaskSubmitted:
    return TaskSubmitted(task_id=task_id, cluster=f"c-{task_id}", task={"run": "x", "resources": resources}, **kw)


OPTIMIZER_CASES: dict[str, OptimizerCase] = {
    "spot-a10g": OptimizerCase(_task("spot-a10g", {"accelerators": "A10G:1", "use_spot": True}),
                               ("spot_capacity", "spot_capacity", "capacity")),
    "a100x8-gang-best-network": OptimizerCase(
        _task("a100x8", {"accelerators": "A100:8", "network_tier": "best"}, num_nodes=2), ("capacity", "quota")),
    "cpu-ports-labels-disk": OptimizerCase(
        _task("cpu", {"cpus": "4+", "memory": "16+", "ports": 8080, "disk_size": 256,
                      "labels": {"team": "infra", "purpose": "serve"}}), ("unsupported",)),
    "any-of-l4": OptimizerCase(
        _task("l4", {"any_of": [{"accelerators": "L4:1", "use_spot": True}, {"accelerators": "L4:1"}]}),
        ("spot_capacity", "spot_capacity")),
    "ordered-h100-then-a100": OptimizerCase(
        _task("ordered", {"ordered": [{"accelerators": "H100:8"}, {"accelerators": "A100:8"}]}), ("capacity",)),
    "pinned-type-gives-up": OptimizerCase(
        _task("pinned", {"instance_type": "p4d.24xlarge", "infra": "aws/us-east-1"}),
        ("capacity", "capacity", "capacity"), max_attempts=3),
    "infeasible": OptimizerCase(_task("infeasible", {"accelerators": "H100:16"})),
    "local-machine": OptimizerCase(_task("local", {"cpus": "2+"}), ("capacity",), infras=frozenset({"local"}),
                                   local=LocalResources(cpus=8, memory_gib=31.5, gpus={})),
    "local-too-small": OptimizerCase(_task("local-big", {"accelerators": "A100:1"}), infras=frozenset({"local"}),
                                     local=LocalResources(cpus=8, memory_gib=31.5, gpus={})),
    "recovery-region-blocked": OptimizerCase(
        _task("blocked", {"accelerators": "A10G:1", "use_spot": True}, kind="managed", managed_job_id=7,
              initial_blocks=[{"scope": "region", "infra": "aws", "region": "us-east-2", "zone": None,
                               "instance_type": None, "use_spot": None, "quota_class": None,
                               "error_class": "preempted"}]), ("spot_capacity",)),
}


# ---------------------------------------------------------------- recovery machine

# A fact built from the job's state at the time (the cluster it names is the machine's own).
FactOf = Callable[[machine.JobState], machine.Fact]


def current(cls: type, *args: Any) -> FactOf:
    return lambda s: cls(s.cluster or "", *args)


def previous(cls: type, *args: Any) -> FactOf:
    """A late fact about the job's previous cluster (stale: it must change nothing)."""
    return lambda s: cls(s.clusters[-2] if len(s.clusters) >= 2 else "", *args)


def plain(fact: machine.Fact) -> FactOf:
    return lambda s: fact


@dataclass(frozen=True)
class RecoveryCase:
    submitted: ManagedJobSubmitted
    facts: tuple[tuple[str, FactOf], ...]  # (what it is, for the record; the fact)
    # Where each lost cluster ran (its ClusterProvisioned candidate), for the recovery launch plan.
    placed: Placed = field(default=Placed("aws", "us-east-1", "us-east-1a", "g5.xlarge", True))


def _job(job_id: int, name: str, *tasks: dict[str, Any]) -> ManagedJobSubmitted:
    return ManagedJobSubmitted(managed_job_id=job_id, name=name, tasks=list(tasks), user="carol", team="research",
                               skypilot_task_ids=[f"sky-managed-golden_{name}_{job_id}-{i}" for i in range(len(tasks))])


SPOT = {"run": "python train.py", "resources": {"accelerators": "A10G:1", "use_spot": True}}
F = machine

RECOVERY_CASES: dict[str, RecoveryCase] = {
    "spot-preempted-fallback-succeeds": RecoveryCase(_job(11, "Spot Train", SPOT), (
        ("kick", plain(F.Kick())),
        ("started", current(F.JobStartedF)),
        ("preempted", current(F.LostF, "preempted", "node 0 (i-1): spot interruption")),
        ("late start of the lost cluster", previous(F.JobStartedF)),
        ("no placement under the strategy", current(F.PlacementFailedF, "no candidate has capacity\n1) ...")),
        ("started", current(F.JobStartedF)),
        ("lost node", current(F.LostF, "node_lost", "node 0 (i-2): no heartbeat for 90 s")),
        ("started", current(F.JobStartedF)),
        ("succeeded", current(F.JobSucceededF)),
        ("late failure after the end", current(F.JobFailedF, "run", 1)),
    )),
    "failover-strategy-then-no-resource": RecoveryCase(
        _job(12, "fo", {"run": "x", "resources": {"accelerators": "A10G:1", "use_spot": True,
                                                  "job_recovery": "FAILOVER"}}), (
            ("kick", plain(F.Kick())),
            ("started", current(F.JobStartedF)),
            ("preempted", current(F.LostF, "preempted", "node 0: spot interruption")),
            ("no placement under the strategy", current(F.PlacementFailedF, "none in us-east-1")),
            ("no placement at all", current(F.PlacementFailedF, "none anywhere")),
        )),
    "restarts-and-exit-codes": RecoveryCase(
        _job(13, "retry", {"run": "x", "resources": {"job_recovery": {"max_restarts_on_errors": 1,
                                                                      "recover_on_exit_codes": [42]}}}), (
            ("kick", plain(F.Kick())),
            ("started", current(F.JobStartedF)),
            ("exit 42: recover, not counted", current(F.JobFailedF, "run", 42, "exit 42")),
            ("started", current(F.JobStartedF)),
            ("exit 1: counted restart", current(F.JobFailedF, "run", 1, "exit 1")),
            ("started", current(F.JobStartedF)),
            ("exit 1 again: restarts used up", current(F.JobFailedF, "run", 1, "exit 1")),
        )),
    "pipeline-setup-fails-on-task-1": RecoveryCase(_job(14, "pipe", {"run": "a"}, {"setup": "false", "run": "b"}), (
        ("kick", plain(F.Kick())),
        ("started", current(F.JobStartedF)),
        ("task 0 succeeded", current(F.JobSucceededF)),
        ("started", current(F.JobStartedF)),
        ("setup failed", current(F.JobFailedF, "setup", 1, "setup failed on node 0")),
    )),
    "agent-lost-and-strategy-none": RecoveryCase(
        _job(15, "none", {"run": "x", "resources": {"job_recovery": "none"}}), (
            ("kick", plain(F.Kick())),
            ("a terminated of another cluster: stale", previous(F.TerminatedF, "x")),
            ("started", current(F.JobStartedF)),
            ("cluster terminated under it", current(F.TerminatedF, "cluster terminated (user)")),
        )),
    "driver-lost": RecoveryCase(_job(16, "drv", {"run": "x"}), (
        ("kick", plain(F.Kick())),
        ("started", current(F.JobStartedF)),
        ("process lost with its agent", current(F.JobFailedF, "agent", None, "ended while its agent was down")),
    )),
    "provision-failed": RecoveryCase(_job(17, "pf", {"run": "x"}), (
        ("kick", plain(F.Kick())),
        ("provision failed", current(F.ProvisionFailedF, "UnauthorizedOperation: not allowed")),
    )),
    "cancel-while-running": RecoveryCase(_job(18, "cr", SPOT), (
        ("kick", plain(F.Kick())),
        ("started", current(F.JobStartedF)),
        ("cancel", plain(F.Cancel())),
        ("job cancelled on the cluster (still cancelling)", current(F.JobCancelledF)),
        ("cluster terminated", current(F.TerminatedF, "cluster terminated (managed_job_done)")),
    )),
    "cancel-before-up": RecoveryCase(_job(19, "cb", SPOT), (
        ("kick", plain(F.Kick())),
        ("cancel", plain(F.Cancel())),
        ("nothing was up", lambda s: F.NothingToCancel(s.cluster)),
    )),
    "cancel-pending": RecoveryCase(_job(20, "cp", SPOT), (
        ("cancel", plain(F.Cancel())),
        ("kick after the end", plain(F.Kick())),
    )),
}
