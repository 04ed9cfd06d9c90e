"""Job groups and `--num-jobs` (issue 12 §3): the pure parts (the plan of a launch, a group's
termination decision, the env contract, termination_delay), then end to end on the `local`
infra as a user types them: real control plane, real agents, real processes."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from local_cli import local_cli, spz

from skypurza.cli.fanout import plan_jobs
from skypurza.cli.submit import SubmitError
from skypurza.events.managed_events import JobGroupMember, ManagedJobSubmitted
from skypurza.events.taskspec import TaskSpecError, load_tasks
from skypurza.events.taskspec.jobgroup import delay_of, delay_seconds
from skypurza.services.agent.envcontract import JobContext, contract
from skypurza.services.recovery import machine as m

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)

GROUP = """\
name: duo
execution: parallel
primary_tasks: [trainer]
termination_delay: {delay}
---
name: trainer
run: echo trainer
---
name: helper
run: sleep 600
"""


# ---------------------------------------------------------------- the plan of a launch

def test_num_jobs_plans_n_jobs_with_ranks_and_a_group_one_job_per_task():
    one = load_tasks("name: shard\nrun: echo x\n")
    plans = plan_jobs("shard", one.tasks, {}, 3)
    assert [(p.name, p.job_rank, p.num_jobs, p.group) for p in plans] == [("shard", r, 3, None) for r in range(3)]
    assert [(p.job_rank, p.num_jobs) for p in plan_jobs("shard", one.tasks, {}, 1)] == [(0, 1)]
    group = load_tasks(GROUP.format(delay="1m"))
    plans = plan_jobs("duo", group.tasks, dict(group.header), 1)
    assert [p.name for p in plans] == ["duo/trainer", "duo/helper"]
    assert [(p.group.index, p.group.size, p.group.primaries, p.group.primary) for p in plans] == \
        [(0, 2, [0], True), (1, 2, [0], False)]
    assert [p.group.termination_delay_s for p in plans] == [60, 60]
    with pytest.raises(SubmitError, match="job group's jobs are its tasks"):
        plan_jobs("duo", group.tasks, dict(group.header), 2)
    with pytest.raises(SubmitError, match="1 to 1,000"):
        plan_jobs("shard", one.tasks, {}, 1001)


def test_termination_delay_forms():
    assert [delay_seconds(v) for v in (0, 30, "30", "30s", "5m", "2h", "1 min")] == [0, 30, 30, 30, 300, 7200, 60]
    assert delay_of({"default": "10s", "helper": 90}, "helper") == 90
    assert delay_of({"default": "10s", "helper": 90}, "other") == 10
    assert delay_of(None, "x") == 0
    for bad in ("soon", True, -1, 24 * 3600 + 1, "2d"):
        with pytest.raises(ValueError):
            delay_seconds(bad)


# ---------------------------------------------------------------- check-yaml verdicts

@pytest.mark.parametrize("text", [
    GROUP.format(delay="30s"),
    GROUP.format(delay="{default: 10, helper: 1m}"),
    "name: g\nexecution: parallel\n---\nname: a\nrun: echo\n---\nname: b\nrun: echo\n",
])
def test_job_groups_skypilot_accepts(text):
    loaded = load_tasks(text)
    assert loaded.is_job_group and all(t.name for t in loaded.tasks)


@pytest.mark.parametrize("text,message", [
    ("name: g\nexecution: parallel\n---\nrun: echo\n", "every job of a job group needs a `name`"),
    ("name: g\nexecution: parallel\n---\nname: a\nrun: x\n---\nname: a\nrun: y\n", "used twice"),
    ("name: g\nexecution: parallel\n---\n", "at least one job"),
    (GROUP.format(delay="soon"), "expected seconds or a duration"),
    (GROUP.format(delay="{nobody: 3}"), "not the name of a job in this group"),
    ("name: 'g g'\nexecution: parallel\n---\nname: a\nrun: x\n", "invalid job group name"),
])
def test_job_groups_skypilot_rejects(text, message):
    with pytest.raises(TaskSpecError) as err:
        load_tasks(text)
    assert message in str(err.value)


# ---------------------------------------------------------------- the env contract

def _ctx(**kw) -> JobContext:
    return JobContext(cluster="c", job_id=1, rank=0, cluster_ips=("10.0.0.1",), job_num_nodes=1, task_id="t",
                      user="u", infra="local", managed_job_id=4, **kw)


def test_env_contract_of_ranks_and_groups():
    plain = contract(_ctx(), "run")
    assert (plain["SKYPILOT_JOB_RANK"], plain["SKYPILOT_NUM_JOBS"]) == ("0", "1")
    assert "SKYPILOT_JOBGROUP_NAME" not in plain and "SKYPILOT_ROOT_JOB_ID" not in plain
    ranked = contract(_ctx(job_rank=2, num_jobs=3), "run")
    assert (ranked["SKYPILOT_JOB_RANK"], ranked["SKYPILOT_NUM_JOBS"]) == ("2", "3")
    member = contract(_ctx(job_group="duo", root_job_id=4), "run")
    assert (member["SKYPILOT_JOBGROUP_NAME"], member["SKYPILOT_ROOT_JOB_ID"]) == ("duo", "4")
    assert "SKYPILOT_JOBGROUP_NAME" not in contract(_ctx(job_group="duo", root_job_id=4), "setup")


# ---------------------------------------------------------------- the group's termination, pure

def member(job_id: int, index: int, *, primaries=(0,), delay=0, size=2) -> m.JobState:
    ev = ManagedJobSubmitted(managed_job_id=job_id, name=f"duo/t{index}", tasks=[{"name": f"t{index}", "run": "x"}],
                             group=JobGroupMember(name="duo", root_job_id=10, index=index, size=size,
                                                  primaries=list(primaries), termination_delay_s=delay))
    s = m.apply(None, ev, seq=1, at=T0)
    assert s is not None
    return s


def step(s: m.JobState, fact: m.Fact, at: datetime = T0) -> m.JobState:
    t = m.decide(s, fact)
    assert t is not None, f"{fact} changed nothing in {s.status}"
    out = m.apply(s, t.event(s.job_id), seq=s.last_seq + 1, at=at)
    assert out is not None
    return out


def running(s: m.JobState) -> m.JobState:
    s = step(s, m.Kick())
    return step(s, m.JobStartedF(s.cluster))


def test_the_others_are_cancelled_after_the_delay_once_the_primary_tasks_end():
    trainer, helper = running(member(10, 0, delay=30)), running(member(11, 1, delay=30))
    assert trainer.group.primary and not helper.group.primary
    # While the primary runs, nothing ends the helper.
    assert m.group_end(helper, [m.peer_of(trainer), m.peer_of(helper)]) is None
    ended = T0 + timedelta(minutes=5)
    trainer = step(trainer, m.JobSucceededF(trainer.cluster), at=ended)
    assert trainer.status == "SUCCEEDED"
    end = m.group_end(helper, [m.peer_of(trainer), m.peer_of(helper)])
    assert end is not None and end.due_at == ended + timedelta(seconds=30)
    assert "primary task (t0) ended" in end.detail
    # A primary never ends on its group's account; an unknown primary (a cut-short submission) keeps it running.
    assert m.group_end(trainer, [m.peer_of(trainer)]) is None
    assert m.group_end(helper, [m.peer_of(helper)]) is None
    helper = step(helper, m.GroupEnded(end.detail))
    assert helper.status == "CANCELLING" and helper.reason.startswith("cancelling: the job group's primary task")
    assert m.clusters_to_tear_down(helper) == [helper.cluster]
    assert m.group_end(helper, [m.peer_of(trainer)]) is None  # asked once
    helper = step(helper, m.TerminatedF(helper.cluster))
    assert helper.status == "CANCELLED"


def test_a_failed_primary_ends_the_group_too_and_a_pending_member_is_cancelled_at_once():
    a = running(member(10, 0, primaries=(0, 1), size=3))
    b = running(member(11, 1, primaries=(0, 1), size=3))
    c = member(12, 2, primaries=(0, 1), size=3)  # still PENDING
    a = step(a, m.JobFailedF(a.cluster, "run", 1))
    assert a.status == "FAILED"
    assert m.group_end(c, [m.peer_of(x) for x in (a, b, c)]) is None  # b, a primary, still runs
    b = step(b, m.JobSucceededF(b.cluster), at=T0 + timedelta(seconds=9))
    end = m.group_end(c, [m.peer_of(x) for x in (a, b, c)])
    assert end is not None and end.due_at == T0 + timedelta(seconds=9) and "primary tasks (t0, t1)" in end.detail
    c = step(c, m.GroupEnded(end.detail))
    assert (c.status, c.cluster) == ("CANCELLED", None)


def test_without_primary_tasks_every_task_runs_to_its_own_end():
    a, b = running(member(10, 0, primaries=())), running(member(11, 1, primaries=()))
    a = step(a, m.JobSucceededF(a.cluster))
    assert m.group_end(b, [m.peer_of(a), m.peer_of(b)]) is None
    # A member recovers on its own: a preemption of b does not touch a.
    b = step(b, m.LostF(b.cluster, "preempted"))
    assert (b.status, b.recoveries) == ("RECOVERING", 1)


# ---------------------------------------------------------------- end to end on the local infra

RANKS = """\
resources: {infra: local}
run: echo "rank=$SKYPILOT_JOB_RANK of=$SKYPILOT_NUM_JOBS"
"""

# Each task writes its mark, then waits for the other's: both succeed only if they ran at the
# same time (bounded: a task alone fails after its wait).
PARALLEL = """\
name: pair
execution: parallel
---
name: left
resources: {{infra: local}}
run: |
  echo "group=$SKYPILOT_JOBGROUP_NAME root=$SKYPILOT_ROOT_JOB_ID"
  touch {dir}/left
  for i in $(seq 1 600); do [ -f {dir}/right ] && echo saw-right && exit 0; sleep 0.1; done; exit 7
---
name: right
resources: {{infra: local}}
run: |
  echo "group=$SKYPILOT_JOBGROUP_NAME root=$SKYPILOT_ROOT_JOB_ID"
  touch {dir}/right
  for i in $(seq 1 600); do [ -f {dir}/left ] && echo saw-left && exit 0; sleep 0.1; done; exit 7
"""

PRIMARY = """\
name: lead
execution: parallel
primary_tasks: [main]
termination_delay: 1
---
name: main
resources: {infra: local}
run: echo main-done
---
name: sidecar
resources: {infra: local}
run: sleep 600
"""


@pytest.mark.timeout(600)
def test_num_jobs_and_parallel_groups_end_to_end(tmp_path: Path):
    with local_cli(tmp_path, "jgtest") as env:
        task = tmp_path / "ranks.yaml"
        task.write_text(RANKS)
        r = spz(env, "jobs", "launch", "-y", "--num-jobs", "3", "-n", "shard", str(task), "-o", "json", timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        jobs = json.loads(r.stdout)
        assert [j["job_rank"] for j in jobs] == [0, 1, 2] and {j["status"] for j in jobs} == {"SUCCEEDED"}
        assert len({j["id"] for j in jobs}) == 3
        for j in jobs:
            out = spz(env, "jobs", "logs", str(j["id"]), "--no-follow")
            assert f"rank={j['job_rank']} of=3" in out.stdout, out.stdout + out.stderr
        queued = json.loads(spz(env, "jobs", "queue", "-o", "json").stdout)
        assert sorted(q["id"] for q in queued if q["name"] == "shard") == sorted(j["id"] for j in jobs)

        marks = tmp_path / "marks"
        marks.mkdir()
        group = tmp_path / "pair.yaml"
        group.write_text(PARALLEL.format(dir=marks))
        r = spz(env, "jobs", "launch", "-y", str(group), "-o", "json", timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        members = json.loads(r.stdout)
        assert [m_["name"] for m_ in members] == ["pair/left", "pair/right"]
        assert {m_["status"] for m_ in members} == {"SUCCEEDED"}
        root = members[0]["id"]
        assert {m_["root_job_id"] for m_ in members} == {root}
        assert "(left) saw-right" in r.stderr and "(right) saw-left" in r.stderr, r.stderr
        assert f"(left) group=pair root={root}" in r.stderr and f"(right) group=pair root={root}" in r.stderr

        lead = tmp_path / "lead.yaml"
        lead.write_text(PRIMARY)
        r = spz(env, "jobs", "launch", "-y", str(lead), "-o", "json", timeout=300)
        members = {m_["name"]: m_ for m_ in json.loads(r.stdout)}
        assert members["lead/main"]["status"] == "SUCCEEDED", r.stdout + r.stderr
        assert members["lead/sidecar"]["status"] == "CANCELLED", r.stdout + r.stderr
        assert r.returncode == 103  # the first job that did not succeed decides
        history = spz(env, "jobs", "logs", str(members["lead/sidecar"]["id"]), "--controller").stdout
        assert "CANCELLING" in history and "primary task (main) ended" in history, history
        # `jobs cancel -n GROUP` reaches every member: nothing of this group is left to cancel.
        r = spz(env, "jobs", "cancel", "-y", "-n", "lead")
        assert r.returncode == 0 and "Nothing to cancel" in r.stdout, r.stdout + r.stderr

        sleepers = tmp_path / "sleepers.yaml"
        sleepers.write_text("name: naps\nexecution: parallel\n---\nname: a\nresources: {infra: local}\nrun: sleep 600\n"
                            "---\nname: b\nresources: {infra: local}\nrun: sleep 600\n")
        r = spz(env, "jobs", "launch", "-y", "-d", str(sleepers), "-o", "json")
        assert r.returncode == 0 and {m_["status"] for m_ in json.loads(r.stdout)} == {"PENDING"}, r.stdout + r.stderr
        r = spz(env, "jobs", "cancel", "-y", "-n", "naps", timeout=200)
        assert r.returncode == 0 and r.stdout.count("CANCELLED") == 2, r.stdout + r.stderr

        bad = tmp_path / "unnamed.yaml"
        bad.write_text("name: g\nexecution: parallel\n---\nrun: echo\n")
        r = spz(env, "jobs", "launch", "-y", str(bad))
        assert r.returncode != 0 and "needs a `name`" in r.stderr and "Traceback" not in r.stderr
        r = spz(env, "jobs", "launch", "-y", "--num-jobs", "0", "echo x")
        assert r.returncode == 2 and "1 to 1,000" in r.stderr
        r = spz(env, "jobs", "launch", "-y", "--job-group", "7", "echo x")
        assert r.returncode == 2 and "not supported" in r.stderr
