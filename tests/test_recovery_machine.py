"""The managed-job state machine and the recovery strategies, as pure functions."""

from __future__ import annotations

from datetime import datetime, timezone

from skypurza.events.managed_events import ManagedJobCancelRequested, ManagedJobStatusChanged, ManagedJobSubmitted
from skypurza.events.payloads import FailoverBlock, StorageMount, TaskPayload
from skypurza.services.recovery import machine as m
from skypurza.services.recovery.buckets import checkpoint_buckets, is_checkpoint_mount
from skypurza.services.recovery.detect import classify_instance, silent_nodes
from skypurza.services.recovery.strategy import (
    FAILOVER,
    Placed,
    recovery_launch,
    recovery_of,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


def submitted(tasks=None, name="train", job_id=7) -> m.JobState:
    ev = ManagedJobSubmitted(managed_job_id=job_id, name=name, tasks=tasks or [{"name": name, "run": "echo hi"}],
                             skypilot_task_ids=[f"sky-managed-x_{name}_{job_id}-{i}" for i in range(len(tasks or [1]))])
    s = m.apply(None, ev, seq=1, at=T0)
    assert s is not None
    return s


def step(s: m.JobState, fact: m.Fact) -> m.JobState:
    """Decide and fold the transition, as the service does."""
    t = m.decide(s, fact)
    assert t is not None, f"{fact} changed nothing in {s.status}"
    out = m.apply(s, t.event(s.job_id), seq=s.last_seq + 1, at=T0)
    assert out is not None
    return out


def test_happy_path_one_task():
    s = step(submitted(), m.Kick())
    assert (s.status, s.cluster, s.why) == ("STARTING", "train-7-1", "launch")
    launch = m.wanted_launch(s)
    assert launch is not None and launch.number == 1 and launch.task_id(7) == m.launch_task_id(7, 1)
    s = step(s, m.JobStartedF("train-7-1"))
    assert s.status == "RUNNING" and m.wanted_launch(s) is None
    s = step(s, m.JobSucceededF("train-7-1"))
    assert s.status == "SUCCEEDED" and s.terminal
    assert m.clusters_to_tear_down(s) == ["train-7-1"]
    assert m.decide(s, m.LostF("train-7-1", "preempted")) is None  # nothing follows an end


def test_preemption_recovers_on_a_new_cluster_and_stale_facts_change_nothing():
    s = step(step(step(submitted(), m.Kick()), m.JobStartedF("train-7-1")), m.LostF("train-7-1", "preempted", "x"))
    assert (s.status, s.cluster, s.recoveries, s.episode, s.phase) == ("RECOVERING", "train-7-2", 1, "preempted", 1)
    assert s.lost_cluster == "train-7-1"
    assert m.clusters_to_tear_down(s) == ["train-7-1"]
    # The old cluster's later events (its termination, a heartbeat loss) are stale.
    assert m.decide(s, m.TerminatedF("train-7-1")) is None
    assert m.decide(s, m.LostF("train-7-1", "node_lost")) is None
    assert m.decide(s, m.JobFailedF("train-7-1", "run", 137)) is None
    s = step(s, m.JobStartedF("train-7-2"))
    assert s.status == "RUNNING" and s.recoveries == 1
    s = step(s, m.JobSucceededF("train-7-2"))
    assert s.status == "SUCCEEDED" and m.clusters_to_tear_down(s) == ["train-7-1", "train-7-2"]


def test_the_strategy_first_try_falls_back_once_then_fails_with_no_resource():
    s = step(step(step(submitted(), m.Kick()), m.JobStartedF("train-7-1")), m.LostF("train-7-1", "preempted"))
    s = step(s, m.PlacementFailedF("train-7-2", "region blocked; attempts:\n1) a"))
    assert (s.status, s.cluster, s.why, s.phase, s.episode) == ("RECOVERING", "train-7-3", "fallback", 2, "preempted")
    assert s.lost_cluster == "train-7-1"  # still the loss that began the episode
    s = step(s, m.PlacementFailedF("train-7-3", "every candidate was tried; attempts:\n1) b\n2) c"))
    assert s.status == "FAILED_NO_RESOURCE" and "2) c" in s.reason


def test_no_capacity_on_the_first_launch_is_failed_no_resource_at_once():
    s = step(step(submitted(), m.Kick()), m.PlacementFailedF("train-7-1", "all 3 tried"))
    assert s.status == "FAILED_NO_RESOURCE" and s.reason.startswith("no_resource:")


def test_user_failures_restart_counted_and_on_exit_codes_uncounted():
    task = {"name": "t", "run": "x", "resources": {"job_recovery": {"max_restarts_on_errors": 1,
                                                                     "recover_on_exit_codes": [33]}}}
    s = step(step(step(submitted([task], name="t"), m.Kick()), m.JobStartedF("t-7-1")), m.JobFailedF("t-7-1", "run", 33))
    assert (s.status, s.why, s.restarts_on_errors, s.cluster) == ("RECOVERING", "exit_code", 0, "t-7-2")
    s = step(step(s, m.JobStartedF("t-7-2")), m.JobFailedF("t-7-2", "run", 1))
    assert (s.status, s.why, s.restarts_on_errors, s.task_restarts) == ("RECOVERING", "restart", 1, 1)
    s = step(step(s, m.JobStartedF("t-7-3")), m.JobFailedF("t-7-3", "run", 1))
    assert s.status == "FAILED" and "run exited with 1" in s.reason
    s2 = step(step(submitted([task], name="t"), m.Kick()), m.JobFailedF("t-7-1", "setup", 1))
    assert s2.status == "RECOVERING"  # setup failures restart too (SkyPilot: user-code failure states)
    no_restarts = step(step(submitted(), m.Kick()), m.JobFailedF("train-7-1", "setup", 2))
    assert no_restarts.status == "FAILED_SETUP"


def test_pipeline_runs_each_task_in_turn_on_its_own_cluster():
    tasks = [{"name": "prep", "run": "a"}, {"name": "train", "run": "b"}]
    s = step(step(submitted(tasks, name="pipe"), m.Kick()), m.JobStartedF("pipe-7-1"))
    s = step(s, m.JobSucceededF("pipe-7-1"))
    assert (s.status, s.task_index, s.cluster) == ("STARTING", 1, "pipe-7-2")
    assert m.wanted_launch(s).task_index == 1 and m.clusters_to_tear_down(s) == ["pipe-7-1"]
    s = step(step(s, m.JobStartedF("pipe-7-2")), m.JobSucceededF("pipe-7-2"))
    assert s.status == "SUCCEEDED"


def test_cancel_paths():
    pending = submitted()
    pending = m.apply(pending, ManagedJobCancelRequested(managed_job_id=7), seq=2)
    assert m.decide(pending, m.Kick()).status == "CANCELLED"
    s = step(step(submitted(), m.Kick()), m.JobStartedF("train-7-1"))
    s = m.apply(s, ManagedJobCancelRequested(managed_job_id=7), seq=s.last_seq + 1)
    # A preemption seen after the cancel request does not recover: the cancel wins.
    s = step(s, m.LostF("train-7-1", "preempted"))
    assert s.status == "CANCELLING" and m.clusters_to_tear_down(s) == ["train-7-1"]
    assert m.decide(s, m.TerminatedF("other")) is None
    assert step(s, m.TerminatedF("train-7-1")).status == "CANCELLED"
    assert step(s, m.NothingToCancel("train-7-1")).status == "CANCELLED"
    # CANCELLING is the cancel's, whoever's fact comes next (a foreign writer's CANCELLING included).
    foreign = m.apply(step(step(submitted(), m.Kick()), m.JobStartedF("train-7-1")),
                      ManagedJobStatusChanged(managed_job_id=7, status="CANCELLING", kind="cancelling", cluster="train-7-1",
                                              reason="cancelling: x"), seq=9)
    assert not foreign.cancel_requested and m.decide(foreign, m.LostF("train-7-1", "preempted")) is None
    assert step(foreign, m.NothingToCancel("train-7-1")).status == "CANCELLED"


def test_current_cluster_terminated_under_a_running_job_is_a_loss():
    s = step(step(step(submitted(), m.Kick()), m.JobStartedF("train-7-1")), m.TerminatedF("train-7-1", "user down"))
    assert s.status == "RECOVERING" and s.episode == "node_lost" and s.recoveries == 1


def test_fold_of_foreign_writer_and_duplicate_terminal_events():
    s = step(step(submitted(), m.Kick()), m.JobStartedF("train-7-1"))
    done = m.apply(s, ManagedJobStatusChanged(managed_job_id=7, status="SUCCEEDED", kind="succeeded", cluster="train-7-1",
                                              reason="succeeded: x"), seq=10, at=T0)
    again = m.apply(done, ManagedJobStatusChanged(managed_job_id=7, status="RECOVERING", kind="preempted", cluster="train-7-9",
                                                  reason="preempted: late"), seq=11)
    assert again.status == "SUCCEEDED" and again.last_seq == 11 and "train-7-9" not in again.clusters


def test_cluster_names_are_short_and_safe():
    assert m.cluster_name("My Job!!", 12, 3) == "my-job-12-3"
    assert m.cluster_name("", 1, 1) == "job-1-1"
    assert len(m.cluster_name("x" * 80, 123456, 99)) <= 24 + 12


def test_strategies_block_or_pin():
    task = TaskPayload.model_validate({"run": "x", "resources": {"infra": "aws", "use_spot": True, "cpus": 2}})
    lost = Placed("aws", "us-east-1", "us-east-1a", "m5.large", True)
    eager = recovery_launch(task, "EAGER_NEXT_REGION", lost, phase=1)
    assert eager.task == task
    # Every key of the block is written, nulls too (the shape the log has always carried).
    assert [b.to_dict() for b in eager.blocks] == [{"scope": "region", "infra": "aws", "region": "us-east-1",
                                                    "zone": None, "instance_type": None, "use_spot": None,
                                                    "quota_class": None, "error_class": "preempted"}]
    fo = recovery_launch(task, FAILOVER, lost, phase=1)
    assert fo.task.resources.infra == "aws/us-east-1" and task.resources.infra == "aws"
    assert fo.task.to_dict() == {"run": "x", "resources": {"infra": "aws/us-east-1", "cpus": 2, "use_spot": True}}
    assert [(b.scope, b.zone, b.use_spot) for b in fo.blocks] == [("spot_market", "us-east-1a", True)]
    assert all(isinstance(b, FailoverBlock) for b in fo.blocks)
    assert recovery_launch(task, FAILOVER, lost, phase=2).blocks == ()
    assert recovery_launch(task, "EAGER_NEXT_REGION", lost, phase=2).blocks == ()
    # A zone pin the task already has is narrower than the region: kept. Legacy keys fold in.
    pinned = recovery_launch(TaskPayload.model_validate({"resources": {"infra": "aws/us-east-1/us-east-1b"}}),
                             FAILOVER, lost, 1)
    assert pinned.task.resources.infra == "aws/us-east-1/us-east-1b"
    legacy = recovery_launch(TaskPayload.model_validate(
        {"resources": {"cloud": "aws", "any_of": [{"use_spot": True}, {"region": "x"}]}}), FAILOVER, lost, 1).task.resources
    assert legacy.infra == "aws/us-east-1" and "cloud" not in legacy.to_dict()
    # An alternative without a location inherits the pin; one with its own region keeps it.
    assert legacy.to_dict()["any_of"] == [{"use_spot": True}, {"infra": "*/x"}]
    local = recovery_launch(task, "EAGER_NEXT_REGION", Placed("local", None, None, "local", False), 1)
    assert local.blocks == ()


def test_job_recovery_forms():
    def of(task):
        return recovery_of(TaskPayload.model_validate(task))

    assert of({}).strategy == "EAGER_NEXT_REGION"
    assert of({"resources": {"job_recovery": "failover"}}).strategy == "FAILOVER"
    r = of({"resources": {"job_recovery": {"strategy": None, "max_restarts_on_errors": 2, "recover_on_exit_codes": 7}}})
    assert (r.strategy, r.max_restarts_on_errors, r.recover_on_exit_codes) == ("EAGER_NEXT_REGION", 2, frozenset({7}))
    assert of({"resources": {"job_recovery": {"recover_on_exit_codes": [3, 4]}}}).recover_on_exit_codes == {3, 4}
    assert of({"resources": {"any_of": [{"job_recovery": "none"}]}}).strategy == "NONE"
    assert of({"resources": {"ordered": [{"cpus": 2}, {"job_recovery": "FAILOVER"}]}}).strategy == "FAILOVER"
    assert r.restart_counted(7, 5) is False and r.restart_counted(1, 1) is True and r.restart_counted(1, 2) is None


def test_checkpoint_buckets_named_once_per_job_and_mount():
    task = TaskPayload.model_validate({"file_mounts": {"/ckpt": {"store": "s3", "name": "mine", "mode": "MOUNT"},
                                                      "~/out": {"store": "S3", "source": "./out"},
                                                      "/data": {"source": "s3://public-data", "store": "s3"},
                                                      "/etc/x": "./x"}})
    out, named = checkpoint_buckets(task, "dev", 42)
    assert named["/ckpt"] == "mine"
    assert named["~/out"] == "skypurza-dev-bucket-job42-out" and out.file_mounts["~/out"].name == named["~/out"]
    assert out.to_dict()["file_mounts"]["~/out"] == {"source": "./out", "store": "S3", "name": named["~/out"]}
    assert "/data" not in named and "/etc/x" not in named and out.file_mounts["/etc/x"] == "./x"
    assert checkpoint_buckets(task, "dev", 42) == (out, named)  # the same names on every launch
    assert is_checkpoint_mount(StorageMount(store="s3", name="b", source="s3://b"))
    assert not is_checkpoint_mount(StorageMount(store="gcs", name="b"))
    assert not is_checkpoint_mount("./x")


def test_detection_readings():
    running = {"InstanceId": "i-1", "State": {"Name": "running"}}
    assert classify_instance(running) is None
    spot = {"InstanceId": "i-2", "State": {"Name": "terminated"}, "InstanceLifecycle": "spot",
            "StateReason": {"Code": "Server.SpotInstanceTermination", "Message": "Spot instance termination"}}
    f = classify_instance(spot, {"InstanceStatus": {"Status": "not-applicable"}, "Events": []})
    assert f.kind == "preempted" and f.evidence["state_reason_code"] == "Server.SpotInstanceTermination"
    assert f.evidence["status"]["instance_status"] == "not-applicable"
    gone = {"InstanceId": "i-3", "State": {"Name": "stopped"}, "StateReason": {"Code": "Client.UserInitiatedShutdown"}}
    assert classify_instance(gone).kind == "node_lost"
    beats = {("c", 0): 100.0, ("c", 1): 10.0}
    silent = silent_nodes(beats, [("c", 0, "i-a"), ("c", 1, "i-b"), ("c", 2, "i-c")], now=105.0, timeout=30)
    assert [(x.rank, x.instance_id) for x in silent] == [(1, "i-b")]  # rank 2 never beat: not judged


def test_a_failure_without_an_exit_code_reads_as_one():
    s = step(step(submitted(), m.Kick()),
             m.JobFailedF("train-7-1", "setup", None, "the workdir could not be put in place on node 0"))
    assert s.status == "FAILED_SETUP"
    assert s.reason.endswith(": setup failed (the workdir could not be put in place on node 0)"), s.reason
    assert "None" not in s.reason
