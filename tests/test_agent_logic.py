"""The agent's and the cluster CLI's pure parts: the env contract, the event fold, the decisions,
log tailing, file-mount plans, GPU names, task submission helpers, job status and log lines."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from skypurza.cli.clusterlog import EXIT_CANCELLED, EXIT_FAILED, EXIT_NOT_FINISHED, EXIT_NOT_FOUND, exit_code_of, fold
from skypurza.cli.jobwatch import LogLine, format_line
from skypurza.cli.submit import SubmitError, cluster_name, load_task, localise, setup_changed
from skypurza.events.models import (
    AutostopSet,
    CancelRequested,
    Candidate,
    ClusterIdle,
    ClusterProvisioned,
    ClusterStarted,
    ClusterStopped,
    JobFailed,
    JobNodeFinished,
    JobQueued,
    JobStarted,
    JobSucceeded,
    NodeInfo,
)
from skypurza.events.payloads import TaskPayload
from skypurza.events.taskspec import CliOverrides
from skypurza.services.agent import envcontract as ec
from skypurza.services.agent.decide import (
    LOST_EXIT,
    SYNC_FAILED_EXIT,
    Kill,
    LocalState,
    PublishDown,
    PublishIdle,
    PublishOutcome,
    PublishStarted,
    Start,
    decide,
    job_outcome,
)
from skypurza.services.agent.gpus import parse_gpu_names, short_name
from skypurza.services.agent.mounts import Step, plan, remote_path
from skypurza.services.agent.procs import LogTail, exit_status
from skypurza.services.agent.view import ClusterView

T0 = datetime(2026, 11, 30, 15, 2, 11, 123456, tzinfo=timezone.utc)


# ------------------------------------------------------------------------------ env contract

def test_task_ids_have_skypilots_format():
    assert ec.cluster_task_id(T0, "mycluster", 3) == "sky-2026-11-30-15-02-11-123456_mycluster_3"
    assert ec.managed_task_id(T0, "train", 7, 0) == "sky-managed-2026-11-30-15-02-11-123456_train_7-0"
    assert ec.managed_task_id(T0, "pipe", 7, 1, "eval") == "sky-managed-2026-11-30-15-02-11-123456_pipe_eval_7-1"
    other_tz = T0.astimezone(timezone(timedelta(hours=5)))
    assert ec.cluster_task_id(other_tz, "c", 1) == ec.cluster_task_id(T0, "c", 1), "UTC: every node agrees"


def test_cluster_info_is_skypilots_json():
    assert ec.cluster_info("c", "aws", "us-east-1", "us-east-1a") == (
        '{"cluster_name": "c", "cloud": "AWS", "region": "us-east-1", "zone": "us-east-1a"}')
    assert json.loads(ec.cluster_info("c", "local", None, None)) == {
        "cluster_name": "c", "cloud": "Local", "region": None, "zone": None}


@pytest.mark.parametrize("resources,placed,expected", [
    ({}, None, 0),
    ({"cpus": "4+"}, {"A10G": 1}, 0),  # the task's demand, not the machine's
    ({"accelerators": "A100:8"}, None, 8),
    ({"accelerators": "A100:0.5"}, None, 1),
    ({"accelerators": "A100"}, None, 1),
    ({"accelerators": {"V100": 4}}, None, 4),
    ({"accelerators": ["V100:4", "A10G:1"]}, {"A10G": 1}, 1),
    ({"accelerators": "{V100:4, T4:2}"}, {"T4": 2}, 2),
    ({"any_of": [{"accelerators": "L4:2"}, {"accelerators": "A10G:3"}]}, {"A10G": 3}, 3),
    ({"gpus": "H100:8"}, None, 8),
    ({"accelerators": "tpu-v4-8"}, None, 0),
])
def test_gpus_per_node(resources, placed, expected):
    assert ec.gpus_per_node(TaskPayload.model_validate({"resources": resources}), placed) == expected


def _ctx(**kw):
    base = dict(cluster="c", job_id=4, rank=1, cluster_ips=("10.0.0.1", "10.0.0.2", "10.0.0.3"), job_num_nodes=2,
                task_id="sky-x_c_4", user="alice", infra="aws", region="us-east-1", zone="us-east-1a",
                gpus_per_node=8, envs={"A": "1", "SKYPILOT_NODE_RANK": "user value"})
    base.update(kw)
    return ec.JobContext(**base)


def test_run_environment():
    env = ec.job_environment(_ctx(), "run")
    assert env["SKYPILOT_NODE_RANK"] == "1", "the contract wins over a user env of the same name"
    assert env["SKYPILOT_NODE_IPS"] == "10.0.0.1\n10.0.0.2", "the job's nodes, head first"
    assert env["SKYPILOT_NUM_NODES"] == "2" and env["SKYPILOT_NUM_GPUS_PER_NODE"] == "8"
    assert env["SKYPILOT_INTERNAL_JOB_ID"] == "4" and env["SKYPILOT_USER"] == "alice"
    assert env["SKYPILOT_TASK_ID"] == "sky-x_c_4" and env["A"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert not any(k.startswith("SKYPILOT_SETUP_") for k in env)
    assert "SKYPILOT_MANAGED_JOB_ID" not in env and "SKYPILOT_TASK_IDS" not in env
    for k, v in env.items():
        if k.startswith("SKYPILOT_"):
            assert env["SKYPURZA_" + k[9:]] == v


def test_setup_environment():
    env = ec.job_environment(_ctx(), "setup")
    assert env["SKYPILOT_SETUP_NODE_RANK"] == "1"
    assert env["SKYPILOT_SETUP_NODE_IPS"] == "10.0.0.1\n10.0.0.2\n10.0.0.3", "every node of the cluster"
    assert env["SKYPILOT_SETUP_NUM_GPUS_PER_NODE"] == "8" and env["SKYPILOT_NUM_NODES"] == "2"
    assert "SKYPILOT_NODE_RANK" not in {k for k in ec.contract(_ctx(), "setup")}
    assert "SKYPILOT_INTERNAL_JOB_ID" not in env and env["SKYPURZA_SETUP_NODE_RANK"] == "1"


def test_managed_job_environment():
    env = ec.contract(_ctx(managed_job_id=9, managed_task_ids=("a", "b")), "run")
    assert (env["SKYPILOT_MANAGED_JOB_ID"], env["SKYPILOT_TASK_IDS"], env["SKYPILOT_JOB_RANK"],
            env["SKYPILOT_NUM_JOBS"]) == ("9", "a\nb", "0", "1")
    assert ec.contract(_ctx(managed_job_id=9), "run")["SKYPILOT_TASK_IDS"] == "sky-x_c_4"


# ------------------------------------------------------------------------------ fold and decisions

class Log:
    """A cluster's history for the pure functions: events with ids, times and sequences."""

    def __init__(self, nodes: int = 2):
        self.view = ClusterView("c", nodes)
        self.n = 0

    def add(self, event, at: datetime | None = None) -> str:
        self.n += 1
        eid = f"e{self.n}"
        self.view.apply(event, eid, at or T0 + timedelta(seconds=self.n), self.n)
        return eid

    def provision(self, nodes: int = 2, idle: int | None = None, down: bool = False) -> str:
        return self.add(ClusterProvisioned(
            cluster="c", task_id="t", placement_id="p", candidate=Candidate(infra="local"),
            nodes=[NodeInfo(rank=r, instance_id=f"i{r}") for r in range(nodes)], hourly_price_micros=0,
            launched_at=T0, idle_minutes=idle, down_when_idle=down))

    def queue(self, job_id: int, nodes: int = 2, setup: bool = True, down_after: bool = False) -> str:
        return self.add(JobQueued(cluster="c", job_id=job_id, task_id="t", task={"num_nodes": nodes, "run": "x"},
                                  run_setup=setup, down_after=down_after))

    def node(self, job_id: int, rank: int, phase: str, code: int) -> None:
        self.add(JobNodeFinished(cluster="c", job_id=job_id, rank=rank, phase=phase, exit_code=code))


def test_setup_on_every_node_then_run_and_the_head_decides():
    log = Log()
    log.provision()
    log.queue(1)
    head, worker = LocalState(), LocalState()
    assert decide(log.view, 0, head, T0) == [PublishStarted(1)], "the head admits; nothing starts before its echo"
    assert decide(log.view, 1, worker, T0) == [], "a node starts a job once its JobStarted is in the log"
    log.add(JobStarted(cluster="c", job_id=1, started_at=T0))
    assert decide(log.view, 0, head, T0) == [Start(1, "setup")]
    assert decide(log.view, 1, worker, T0) == [Start(1, "setup")]
    head.running, worker.running = {(1, "setup")}, {(1, "setup")}
    head.running, head.done[(1, "setup")] = set(), 0
    log.node(1, 0, "setup", 0)
    assert decide(log.view, 0, head, T0) == [], "run waits for every node's setup"
    worker.running = set()
    log.node(1, 1, "setup", 0)
    assert decide(log.view, 0, head, T0) == [Start(1, "run")]
    log.node(1, 0, "run", 0)
    assert decide(log.view, 0, LocalState(), T0) == []
    log.node(1, 1, "run", 0)
    assert decide(log.view, 0, LocalState(), T0) == [PublishOutcome(1, job_outcome(log.view.jobs[1], 2, False))]
    assert job_outcome(log.view.jobs[1], 2, False).status == "succeeded"
    assert decide(log.view, 1, LocalState(), T0) == [], "only the head publishes outcomes"


def test_failures_and_cancels():
    log = Log()
    log.provision()
    log.queue(1, setup=False)
    log.node(1, 1, "run", 3)
    # the head's run is still going: it must stop, and the outcome names node 1's failure
    head = LocalState(running=(1, "run"))
    actions = decide(log.view, 0, head, T0)
    assert Kill(1, "node 1 failed (run)") in actions
    out = [a for a in actions if isinstance(a, PublishOutcome)][0].outcome
    assert (out.status, out.phase, out.exit_code, out.failed_rank) == ("failed", "run", 3, 1)
    log.node(1, 0, "run", 143)  # the head's killed run does not become "the" failure
    assert job_outcome(log.view.jobs[1], 2, False).failed_rank == 1

    log.queue(2, setup=False)
    log.add(CancelRequested(cluster="c", job_id=2))
    assert job_outcome(log.view.jobs[2], 2, head_running_it=True) is None, "wait until the head's process is gone"
    assert job_outcome(log.view.jobs[2], 2, head_running_it=False).status == "cancelled"
    assert decide(log.view, 1, LocalState(running=(2, "run")), T0) == [Kill(2, "job 2 was cancelled")]

    lost = Log()
    lost.queue(1, setup=False)
    lost.node(1, 1, "run", LOST_EXIT)
    o = job_outcome(lost.view.jobs[1], 2, False)
    assert (o.status, o.phase, o.exit_code, o.failed_rank) == ("failed", "agent", None, 1)
    sync = Log()
    sync.queue(1)
    sync.node(1, 0, "setup", SYNC_FAILED_EXIT)
    assert job_outcome(sync.view.jobs[1], 2, False).phase == "setup"
    too_big = Log(nodes=1)
    too_big.queue(1, nodes=3)
    assert "cluster has 1" in job_outcome(too_big.view.jobs[1], 1, False).reason
    assert decide(too_big.view, 0, LocalState(), T0) == [PublishOutcome(1, job_outcome(too_big.view.jobs[1], 1, False))]


def test_jobs_start_in_queue_order_as_they_fit_and_ranks_outside_the_job_skip_run():
    log = Log(nodes=3)
    log.add(ClusterProvisioned(cluster="c", task_id="t", placement_id="p",
                               candidate=Candidate(infra="local", vcpus=1.0, num_nodes=3),
                               nodes=[NodeInfo(rank=r, instance_id=f"i{r}") for r in range(3)],
                               hourly_price_micros=0, launched_at=T0))
    log.queue(1, nodes=1, setup=False)
    log.queue(2, nodes=3, setup=False)
    log.add(JobQueued(cluster="c", job_id=3, task_id="t", task={"run": "x", "resources": {"cpus": 1}}))
    assert decide(log.view, 1, LocalState(), T0) == [], "a 1-node job runs on the head only"
    assert decide(log.view, 2, LocalState(), T0) == []
    # 0.5 + 0.5 CPU (SkyPilot's default demand) fit the head's 1 CPU; job 3's 1 CPU waits
    assert decide(log.view, 0, LocalState(), T0) == [PublishStarted(1), PublishStarted(2)]
    log.add(JobStarted(cluster="c", job_id=1, started_at=T0))
    log.add(JobStarted(cluster="c", job_id=2, started_at=T0))
    assert decide(log.view, 0, LocalState(), T0) == [Start(1, "run"), Start(2, "run")], "side by side"
    assert decide(log.view, 2, LocalState(), T0) == [Start(2, "run")]
    both = LocalState(running={(1, "run"), (2, "run")})
    assert decide(log.view, 0, both, T0) == [], "one phase per job; job 3 does not fit yet"
    log.node(1, 0, "run", 0)
    log.add(JobSucceeded(cluster="c", job_id=1, ended_at=T0))
    assert decide(log.view, 0, LocalState(running={(2, "run")}), T0) == [], "job 2 still holds half a CPU"
    # a job that ended while a node still ran it: stop it, and only it
    assert decide(log.view, 0, both, T0) == [Kill(1, "job 1 ended (succeeded)")]
    for r in range(3):
        log.node(2, r, "run", 0)
    log.add(JobSucceeded(cluster="c", job_id=2, ended_at=T0))
    assert decide(log.view, 0, LocalState(), T0) == [PublishStarted(3)]
    # a job that ended while a node still ran it: stop it
    assert decide(log.view, 2, LocalState(running=(1, "run")), T0)[0] == Kill(1, "job 1 ended (succeeded)")


def test_autostop_once_per_idle_period_and_never_while_busy():
    log = Log()
    log.provision(idle=10, down=True)
    now = T0 + timedelta(minutes=10, seconds=2)
    idle = [a for a in decide(log.view, 0, LocalState(), now) if isinstance(a, PublishIdle)]
    assert len(idle) == 1 and idle[0].down and idle[0].idle_minutes == 10
    assert decide(log.view, 0, LocalState(), T0 + timedelta(minutes=9)) == []
    assert decide(log.view, 1, LocalState(), now) == [], "only the head measures idleness"
    log.add(ClusterIdle(cluster="c", idle_since=T0, idle_minutes=10, down=True))
    assert decide(log.view, 0, LocalState(), now + timedelta(hours=1)) == [], "once per idle period"
    log.queue(1, setup=False)
    busy = T0 + timedelta(hours=5)
    assert not any(isinstance(a, PublishIdle) for a in decide(log.view, 0, LocalState(running=(1, "run")), busy))
    log.node(1, 0, "run", 0)
    log.node(1, 1, "run", 0)
    log.add(JobSucceeded(cluster="c", job_id=1, ended_at=busy), at=busy)
    assert not any(isinstance(a, PublishIdle) for a in decide(log.view, 0, LocalState(), busy + timedelta(minutes=9)))
    assert any(isinstance(a, PublishIdle) for a in decide(log.view, 0, LocalState(), busy + timedelta(minutes=11)))
    # autostop set resets the timer; cancelled: never idle; a stopped cluster is not idle
    log.add(AutostopSet(cluster="c", idle_minutes=30), at=busy + timedelta(minutes=11))
    assert decide(log.view, 0, LocalState(), busy + timedelta(minutes=12)) == []
    log.add(AutostopSet(cluster="c", idle_minutes=None), at=busy + timedelta(minutes=12))
    assert decide(log.view, 0, LocalState(), busy + timedelta(days=9)) == []
    log.add(AutostopSet(cluster="c", idle_minutes=0))
    log.add(ClusterStopped(cluster="c", stopped_at=T0))
    assert decide(log.view, 0, LocalState(), busy + timedelta(days=9)) == []
    log.add(ClusterStarted(cluster="c", started_at=T0), at=busy + timedelta(days=9))
    assert any(isinstance(a, PublishIdle) for a in decide(log.view, 0, LocalState(), busy + timedelta(days=9)))


def test_down_after_the_job_unless_down_was_requested():
    log = Log(nodes=1)
    log.queue(1, nodes=1, setup=False, down_after=True)
    log.node(1, 0, "run", 1)
    log.add(JobFailed(cluster="c", job_id=1, ended_at=T0, exit_code=1, failed_rank=0))
    assert decide(log.view, 0, LocalState(), T0) == [PublishDown(1)]
    assert decide(log.view, 0, LocalState(published={"down:1"}), T0) == []
    # launch -i 5 --down: down once idle 5 minutes, not right after the job
    log.add(AutostopSet(cluster="c", idle_minutes=5, down=True), at=T0)
    assert decide(log.view, 0, LocalState(), T0 + timedelta(minutes=1)) == []
    assert decide(log.view, 0, LocalState(), T0 + timedelta(minutes=6)) == [
        PublishIdle(log.view.activity_id, T0, 5, True)]


# ------------------------------------------------------------------------------ processes, files, GPUs

def test_log_tail_gives_whole_lines_once(tmp_path: Path):
    f = tmp_path / "run.log"
    f.write_bytes(b"one\ntw")
    tail = LogTail(f)
    assert tail.read_lines() == ["one"] and tail.committed == 4
    with open(f, "ab") as out:
        out.write(b"o\r\nthree")
    assert tail.read_lines() == ["two"]
    assert tail.read_lines() == []
    assert tail.read_lines(final=True) == ["three"] and tail.committed == f.stat().st_size
    again = LogTail(f, offset=4)  # a restarted agent goes on from its saved offset
    assert again.read_lines(final=True) == ["two", "three"]
    assert exit_status(-15) == 143 and exit_status(3) == 3


def test_file_mount_plan(tmp_path: Path):
    home = tmp_path / "home"
    steps = plan("/src/proj", {"~/data": "/src/data", "/abs/x": "s3://b/key", "rel": "~/f",
                               "/ckpt": {"source": "/src/ck"}, "/bucket": {"name": "my-bucket", "store": "s3"},
                               "/gs": "gs://b/x"}, home)
    assert steps[0] == Step("copy", "/src/proj", home / "sky_workdir")
    assert Step("copy", "/src/data", home / "data") in steps
    assert Step("s3", "s3://b/key", Path("/abs/x")) in steps
    assert Step("copy", str(Path("~/f").expanduser()), home / "rel") in steps
    assert Step("copy", "/src/ck", Path("/ckpt")) in steps and Step("s3", "s3://my-bucket", Path("/bucket")) in steps
    assert Step("unsupported", "gs://b/x", Path("/gs")) in steps
    assert plan({"url": "https://g/r.git", "ref": "v1"}, None, home) == [
        Step("git", "https://g/r.git", home / "sky_workdir", "v1")]
    assert remote_path("~", home) == home


def test_gpu_names():
    assert short_name("NVIDIA H100 80GB HBM3") == "H100"
    assert short_name("Tesla T4") == "T4" and short_name("NVIDIA A10G") == "A10G"
    assert short_name("NVIDIA A100-SXM4-40GB") == "A100-40GB"
    assert parse_gpu_names("NVIDIA A10G\nNVIDIA A10G\n\n") == {"A10G": 2}


# ------------------------------------------------------------------------------ CLI helpers

def test_submit_helpers(tmp_path: Path):
    (tmp_path / "proj").mkdir()
    (tmp_path / "data.txt").write_text("x")
    task = load_task(["echo", "hi"], CliOverrides(workdir="proj", name="t1"))
    assert task.run == "echo hi" and task.name == "t1"
    public = localise(task, task.public_dict(), tmp_path)
    assert public["workdir"] == str(tmp_path / "proj")
    yaml = tmp_path / "t.yaml"
    yaml.write_text("file_mounts:\n  ~/d.txt: data.txt\n  /x: s3://b/k\nrun: cat ~/d.txt\n")
    task = load_task([str(yaml)], CliOverrides())
    assert localise(task, task.public_dict(), tmp_path)["file_mounts"] == {"~/d.txt": str(tmp_path / "data.txt"),
                                                                          "/x": "s3://b/k"}
    with pytest.raises(SubmitError, match="missing.txt does not exist"):
        t = load_task(["true"], CliOverrides())
        bad = t.model_copy(update={"file_mounts": {"/m": "missing.txt"}})
        localise(bad, {"run": "true"}, tmp_path)
    with pytest.raises(SubmitError, match="give a task YAML"):
        load_task([], CliOverrides())
    with pytest.raises(SubmitError, match="file not found"):
        load_task(["nope.yaml"], CliOverrides())
    assert setup_changed("pip install x", "pip install x\n") is False and setup_changed("a", None) is True
    assert setup_changed(None, "") is False
    assert cluster_name("dev-1", "me") == "dev-1"
    assert cluster_name(None, "Jane.Doe").startswith("spz-") and cluster_name(None, "Jane.Doe").endswith("-janedoe")
    with pytest.raises(SubmitError, match="invalid cluster name"):
        cluster_name("-bad", "me")


def test_cluster_fold_and_exit_codes():
    evs = [
        ClusterProvisioned(cluster="c", task_id="t", placement_id="p", candidate=Candidate(infra="aws",
                           region="us-east-1", instance_type="g5.xlarge", hourly_price_micros=1_006_000),
                           nodes=[NodeInfo(rank=0, instance_id="i")], hourly_price_micros=1_006_000, launched_at=T0),
        JobQueued(cluster="c", job_id=1, task_id="t", task={"setup": "pip install x", "run": "x", "name": "a"}),
        JobStarted(cluster="c", job_id=1, started_at=T0),
        JobQueued(cluster="c", job_id=2, task_id="t2", task={"run": "y"}, run_setup=False),
        JobFailed(cluster="c", job_id=1, ended_at=T0, phase="setup", exit_code=2, failed_rank=0),
    ]
    c = fold("c", [(e, T0, i + 1) for i, e in enumerate(evs)])
    assert c.status == "UP" and c.as_dict()["hourly_price_micros"] == 1_006_000 and c.last_seq == 5
    assert c.jobs[1].status == "FAILED_SETUP" and c.jobs[1].name == "a" and c.jobs[2].status == "PENDING"
    assert c.last_job().job_id == 2 and c.jobs[1].setup == "pip install x"
    assert [exit_code_of(s) for s in ("SUCCEEDED", "FAILED_SETUP", "RUNNING", "CANCELLED", None)] == [
        0, EXIT_FAILED, EXIT_NOT_FINISHED, EXIT_CANCELLED, EXIT_NOT_FOUND]


def test_log_line_prefixes():
    line = LogLine(1, "2026-11-30T10:00:00+00:00", 1, "run", "hello")
    assert format_line(line, 1) == "hello"
    assert format_line(line, 2) == "(worker1, rank=1) hello"
    assert format_line(LogLine(1, "", 0, "setup", "pip"), 2) == "(setup, head, rank=0) pip"
    assert format_line(LogLine(1, "", 0, "setup", "pip"), 1) == "(setup) pip"
    assert format_line(LogLine(1, "t", 0, "agent", "[spz agent] x"), 2, timestamps=True) == "t [spz agent] x"
