"""Slurm allocations billed as Slurm bills them: sacct's AllocTRES × ElapsedRaw under the
partition's TRESBillingWeights (docs/slurm.md, *Billing*).

The pure parts first (sacct and scontrol text, the billing of an accounted allocation, the
ledger's fold and meter), then a real Slurm with slurmdbd and MariaDB: `spz launch` and `spz
down` on it, and the ledger's billing-seconds for the allocation equal sacct's `billing` TRES ×
ElapsedRaw, the allocation ended by autostop.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from skypurza.events.envelope import make_envelope
from skypurza.events.models import ClusterProvisioned, ClusterTerminated, SlurmAllocationAccounted
from skypurza.events.slurm_accounting import (accounting_disabled, job_fields, parse_sacct, parse_tres_counts,
                                              priority_flags, sacct_command)
from skypurza.events.types import Candidate, NodeInfo
from skypurza.services.ledger.ledgerconfig import parse_ledger_config
from skypurza.services.ledger.meter import due_usage
from skypurza.services.ledger.pipeline import Projector
from skypurza.services.ledger.slurm_usage import allocation_billing

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


# ------------------------------------------------------------------------------ what Slurm prints

def test_tres_text_is_read_exactly_or_refused() -> None:
    assert parse_tres_counts("billing=13,cpu=2,gres/gpu:h100=1,gres/gpu=1,mem=2000M,node=1") == {
        "billing": 13, "cpu": 2, "gres/gpu:h100": 1, "gres/gpu": 1, "mem": 2000, "node": 1}
    assert parse_tres_counts("cpu=4,mem=8G") == {"cpu": 4, "mem": 8192}
    assert parse_tres_counts("") == {}
    for bad in ("mem=15.62G", "cpu=2K", "mem=512K", "cpu", "cpu=-1", "Bad Key=1"):
        with pytest.raises(ValueError):
            parse_tres_counts(bad)


def test_sacct_rows_and_the_commands_text() -> None:
    assert sacct_command(42) == ("sacct -X -n -P --noconvert -j 42 -o "
                                 "JobIDRaw,State,AllocTRES,ElapsedRaw,Start,End,Partition")
    rows = parse_sacct(
        "sacct: warning: something\n"
        "42|CANCELLED by 0|billing=6,cpu=1,gres/gpu:h100=1,gres/gpu=1,mem=1024M,node=1|17|"
        "2026-12-01T10:00:00|2026-12-01T10:00:17|gpu\n"
        "43|RUNNING|billing=1,cpu=1,mem=1024M,node=1|3|2026-12-01T10:00:00|Unknown|debug\n"
        "44|COMPLETED|mem=1.5G|3|2026-12-01T10:00:00|2026-12-01T10:00:03|debug\n")  # unreadable TRES: skipped
    assert [r.job_id for r in rows] == [42, 43]
    first, running = rows
    assert first.state == "CANCELLED" and first.billing == 6 and first.final
    assert first.alloc_tres == {"cpu": 1, "gres/gpu:h100": 1, "gres/gpu": 1, "mem": 1024, "node": 1}
    assert first.elapsed_s == 17 and first.end == datetime(2026, 12, 1, 10, 0, 17, tzinfo=UTC)
    assert not running.final and running.end is None
    assert accounting_disabled("sacct: error: Slurm accounting storage is disabled")
    assert not accounting_disabled("")
    job = job_fields("JobId=7 JobName=x Partition=gpu TRES=cpu=1,mem=1024M,node=1,billing=3 Command=(null)")
    assert job["Partition"] == "gpu" and job["TRES"] == "cpu=1,mem=1024M,node=1,billing=3"
    assert priority_flags("PriorityType = priority/basic\nPriorityFlags = MAX_TRES,FAIR_TREE\n") == \
        "MAX_TRES,FAIR_TREE"
    assert priority_flags("PriorityFlags = (null)\n") == ""


# ------------------------------------------------------------------------------ the billing

def _accounted(tres: dict[str, int], weights: str, flags: str = "", elapsed: int = 15,
               slurm_billing: int | None = None, job: int = 42) -> SlurmAllocationAccounted:
    return SlurmAllocationAccounted(
        cluster="sl", slurm_cluster="spztest", slurm_job_id=job, partition="gpu", state="CANCELLED",
        alloc_tres=tres, slurm_billing=slurm_billing, elapsed_s=elapsed, start=T0,
        end=T0 + timedelta(seconds=elapsed), billing_weights=weights, priority_flags=flags,
        instance_ids=[f"{job}.0"])


@pytest.mark.parametrize("tres,weights,flags,billing_int", [
    # slurm-accounting.md §1.1: a suffix divides the weight
    ({"cpu": 1, "mem": 8192, "node": 1}, "Mem=0.25", "", 2048),
    ({"cpu": 1, "mem": 8192, "node": 1}, "Mem=0.25G", "", 2),
    # an untyped --gres=gpu:1 is recorded as both gres/gpu and gres/gpu:h100: both weights apply
    ({"cpu": 1, "mem": 1024, "node": 1, "gres/gpu": 1, "gres/gpu:h100": 1},
     "CPU=1.0,Mem=0.25G,GRES/gpu=2.0,GRES/gpu:h100=4.0", "", 1 + 0 + 2 + 4),
    # MAX_TRES: the largest node TRES (gres included), not the sum
    ({"cpu": 2, "mem": 4096, "node": 1, "gres/gpu": 2}, "CPU=1.0,Mem=0.25G,GRES/gpu=2.0", "", 2 + 1 + 4),
    ({"cpu": 2, "mem": 4096, "node": 1, "gres/gpu": 2}, "CPU=1.0,Mem=0.25G,GRES/gpu=2.0", "MAX_TRES", 4),
    # licenses are global: summed beside the MAX
    ({"cpu": 2, "node": 1, "license/lica": 2}, "CPU=1.0,license/licA=1.5", "MAX_TRES", 2 + 3),
    # the stored integer is the double truncated (5.25 is stored as 5)
    ({"cpu": 3, "node": 1}, "CPU=1.75", "", 5),
    # no weights: billing is the CPUs
    ({"cpu": 3, "mem": 4000, "node": 1}, "", "", 3),
])
def test_an_accounted_allocation_bills_as_slurm_does(tres, weights, flags, billing_int) -> None:
    b = allocation_billing(_accounted(tres, weights, flags))
    assert b.billing_int == billing_int and not b.error
    assert b.billing_seconds == billing_int * 15  # sreport's basis: the integer × ElapsedRaw


def test_weights_we_cannot_read_fall_back_to_slurms_own_billing() -> None:
    b = allocation_billing(_accounted({"cpu": 2, "node": 1}, "CPU=1T", slurm_billing=9))
    assert b.billing_int == 9 and b.billing_seconds == 9 * 15 and "Slurm's stored billing" in b.error
    b = allocation_billing(_accounted({"cpu": 2, "node": 1}, "CPU=1T"))
    assert b.billing_int == 2 and "CPUs" in b.error


# ------------------------------------------------------------------------------ the ledger's fold and meter

def _line(ev, n: int, at: datetime) -> bytes:
    return make_envelope(ev, source="/tests/slurm-billing", id=f"00000000-0000-4000-8000-{n:012d}", time=at).to_json()


def test_the_ledger_bills_an_accounted_allocation_once_and_its_ticks_carry_money_only(tmp_path: Path) -> None:
    cand = Candidate(infra="slurm", region="spztest", zone="gpu", instance_type="1cpu-1024mb-H100x1",
                     accelerators={"H100": 1}, vcpus=1, memory_gib=1, hourly_price_micros=3_600_000, num_nodes=1)
    prov = ClusterProvisioned(cluster="sl", task_id="t", placement_id="p", candidate=cand,
                              nodes=[NodeInfo(rank=0, instance_id="42.0")], hourly_price_micros=3_600_000,
                              launched_at=T0, user="alice", team="ml")
    acc = _accounted({"cpu": 1, "mem": 1024, "node": 1, "gres/gpu": 1, "gres/gpu:h100": 1},
                     "CPU=1.0,Mem=0.25G,GRES/gpu=2.0,GRES/gpu:h100=4.0", elapsed=17, slurm_billing=7)
    end = T0 + timedelta(seconds=20)
    lines = [_line(prov, 1, T0), _line(acc, 2, end), _line(acc, 3, end),  # a re-read copy changes nothing
             _line(ClusterTerminated(cluster="sl", terminated_at=end), 4, end)]
    cfg = parse_ledger_config({"billing": {"weights": {"default": "CPU=1.0"}}})
    proj = Projector(tmp_path / "l.duckdb")
    try:
        proj.write(proj.apply_raw([(i + 1, 0, line) for i, line in enumerate(lines)])[0])
        due = due_usage(proj.state, end + timedelta(minutes=1), timedelta(seconds=10), cfg, {})
        ticks = [ev for _, ev in due if ev.lifetime_id]
        bills = [ev for _, ev in due if not ev.lifetime_id]
        assert sum(ev.cost_micros for ev in ticks) == 20_000  # $3.60/h × 20 s of our own times: 2 cents
        assert all(ev.billing_seconds == 0 for ev in ticks)  # a Slurm node's ticks carry money only
        assert len(bills) == 1 and bills[0].billing_seconds == 7 * 17 and bills[0].cost_micros == 0
        assert bills[0].start == bills[0].end == acc.end and bills[0].team == "ml" and bills[0].zone == "gpu"
        # Published and read back: billed; the meter proposes it no more, even after a reload.
        usage = [make_envelope(ev, source="/tests/meter", id=eid, time=end).to_json() for eid, ev in due]
        proj.write(proj.apply_raw([(len(lines) + i + 1, 0, line) for i, line in enumerate(usage + usage[-1:])])[0])
        assert not [ev for _, ev in due_usage(proj.state, end + timedelta(minutes=2), timedelta(seconds=10), cfg, {})
                    if not ev.lifetime_id]
        row = proj.state.rows["slurm_allocations"][("sl", 42)]
        assert row["billed"] and row["billing_int"] == 7 and row["slurm_billing"] == 7 and row["source"] == "sacct"
        con = proj.con
        total = con.execute("SELECT sum(billing_seconds), count(*) FROM usage WHERE cluster = 'sl'").fetchone()
        assert total == (7 * 17, len(due))  # the repeated copy is one row
    finally:
        proj.close()
    reopened = Projector(tmp_path / "l.duckdb")
    try:
        assert not reopened.state.slurm_unbilled
        assert reopened.state.rows["slurm_allocations"][("sl", 42)]["billed"]
    finally:
        reopened.close()


# ------------------------------------------------------------------------------ a real Slurm with slurmdbd

def _sacct(rig, job: str) -> tuple[int, int, str]:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "--noconvert", "-j", job, "-o", "AllocTRES,ElapsedRaw,State"],
                         env=rig.env, capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[-1]
    tres, elapsed, state = out.split("|")
    # AllocTRES is empty until the job is allocated (the loops below poll until it is final)
    billing = dict(item.split("=", 1) for item in tres.split(",") if "=" in item).get("billing", "0")
    return int(billing), int(elapsed or 0), state


def test_autostop_ends_a_real_allocation_and_spz_billing_of_it_equals_saccts(slurm_accounted_rig,
                                                                            tmp_path: Path) -> None:
    from local_cli import local_cli, spz
    from slurm_rig import CLUSTER, GPU_PARTITION

    from skypurza.events import naming

    rig = slurm_accounted_rig
    config = tmp_path / "slurm-config"
    config.write_text(rig.slurm_config())
    with local_cli(tmp_path, "slurmbill") as env:
        env.update(SKYPURZA_SLURM_CONFIG=str(config), SKYPURZA_ENABLED_INFRAS="slurm", SKYPURZA_METERING_TICK_S="1")
        r = spz(env, "launch", "-c", "bl", "--infra", f"slurm/{CLUSTER}/{GPU_PARTITION}", "--gpus", "H100:1", "-y",
                "echo hi")
        assert r.returncode == 0, r.stdout + r.stderr
        job = subprocess.run(["squeue", "-h", "-n", naming.slurm_job_name("slurmbill", "bl"), "-o", "%i"],
                             env=rig.env, capture_output=True, text=True, timeout=10).stdout.strip()
        assert job.isdigit(), job
        # Autostop on Slurm: idle (the job ended) for 0 minutes with --down ends the allocation (scancel).
        auto = spz(env, "autostop", "bl", "-i", "0", "--down", "-y")
        assert auto.returncode == 0, auto.stdout + auto.stderr
        left = job
        for _ in range(120):
            left = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], env=rig.env, capture_output=True,
                                  text=True, timeout=10).stdout.strip()
            if not left:
                break
            subprocess.run(["sleep", "0.25"])
        assert left == "", "autostop did not end the allocation"
        status = None
        for _ in range(60):  # ClusterTerminated follows the scancel once sacct has the final row
            status = spz(env, "status", "-o", "json")
            if '"bl"' not in status.stdout:
                break
            subprocess.run(["sleep", "0.5"])
        assert status is not None and '"bl"' not in status.stdout, status.stdout  # torn down, as --down says
        billing, elapsed, state = _sacct(rig, job)
        # GPU weights apply (they need slurmdbd): 1 CPU + 0.25 × 1 GiB + 2 (gres/gpu) + 4 (gres/gpu:h100)
        assert billing == 7 and state.startswith("CANCELLED"), (billing, state)
        report = {}
        for _ in range(60):
            rep = spz(env, "cost-report", "--by", "cluster", "-o", "json")
            assert rep.returncode == 0, rep.stdout + rep.stderr
            report = json.loads(rep.stdout)
            lines = [ln for ln in report["lines"] if ln["key"] == "bl"]
            if lines and lines[0]["billing_seconds"]:
                break
            subprocess.run(["sleep", "0.5"])
        assert [ln["billing_seconds"] for ln in report["lines"] if ln["key"] == "bl"] == [billing * elapsed], report
        # From sacct (not our own times), with the partition's weights as the event carried them.
        replayed = tmp_path / "replayed.duckdb"
        rep = spz(env, "events", "replay", "--into", str(replayed))
        assert rep.returncode == 0, rep.stdout + rep.stderr
    import duckdb

    con = duckdb.connect(str(replayed), read_only=True)
    try:
        row = con.execute("SELECT source, slurm_billing, billing_int, elapsed_s, billing_weights, billed "
                          "FROM slurm_allocations WHERE slurm_job_id = ?", [int(job)]).fetchone()
    finally:
        con.close()
    assert row == ("sacct", billing, billing, elapsed, rig.gpu_weights, True), row


# ------------------------------------------------------------------------------ an allocation we did not end

def test_a_managed_job_whose_allocation_someone_else_cancels_is_recovered_and_the_old_one_billed_from_sacct(
        slurm_accounted_rig, nats_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An admin's scancel (not ours): recovery runs the job again on a new allocation, and the old
    allocation is still billed from sacct, once, as Slurm bills it."""
    import asyncio
    from dataclasses import replace

    from managed_fixtures import wait_status
    from nats_fixtures import connect_bus
    from slurm_rig import CLUSTER

    from skypurza.events import naming
    from skypurza.events.service import ServiceRunner
    from skypurza.services.optimizer.service import OptimizerService
    from skypurza.services.provisioner.service import ProvisionerService
    from skypurza.services.provisioner.settings import ProvisionerSettings
    from skypurza.services.recovery.service import RecoveryService
    from skypurza.services.recovery.settings import RecoverySettings
    from skypurza.services.recovery.submit import submit_managed_job

    rig = slurm_accounted_rig
    config = tmp_path / "slurm-config"
    config.write_text(rig.slurm_config())
    monkeypatch.setenv("SKYPURZA_SLURM_CONFIG", str(config))
    monkeypatch.setenv("SKYPURZA_AGENT_KILL_GRACE_S", "1")
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    marks = tmp_path / "first-run-marks"
    marks.mkdir()
    run = (f'if [ -f {marks}/first ]; then echo "second run"; exit 0; fi\n'
           f'touch {marks}/first\nsleep 120\n')
    prefix = naming.slurm_job_name("test", "x")[:-1]

    def ours() -> dict[str, str]:
        out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T"], env=rig.env, capture_output=True, text=True,
                             timeout=10).stdout
        return {i: s for i, n, s in (line.split("|") for line in out.splitlines() if line.strip())
                if n.startswith(prefix)}

    async def main():
        bus = await connect_bus(nats_server)
        prov = ProvisionerService(replace(ProvisionerSettings.load(), reconcile_interval_s=0, ack_wait_s=5.0,
                                          local_root=str(tmp_path / "state")))
        rec = RecoveryService(RecoverySettings(ec2_poll_s=0, heartbeat_timeout_s=0, reconcile_s=5, slurm_poll_s=1))
        services = [OptimizerService(enabled=frozenset({"slurm"})), prov, rec]
        runners = [ServiceRunner(bus, s) for s in services]
        tasks = [asyncio.create_task(r.run()) for r in runners]
        try:
            task = {"name": "train", "resources": {"infra": f"slurm/{CLUSTER}/gpu"}, "run": run}
            await submit_managed_job(bus, name="train", tasks=[task])
            await wait_status(bus, 1, "RUNNING", timeout=60)
            for _ in range(300):
                if (marks / "first").exists():
                    break
                await asyncio.sleep(0.1)
            first = ours()
            # Slurm bills whole seconds of elapsed time: an allocation cancelled in its first second
            # has nothing to bill, and the billing checked below would be zero.
            for alloc in first:
                for _ in range(100):
                    try:
                        if _sacct(rig, alloc)[1] >= 1:
                            break
                    except (IndexError, ValueError):  # no accounting row yet
                        pass
                    await asyncio.sleep(0.1)
            # Someone else (an admin) ends the allocation: not spz's scancel.
            for alloc in first:
                subprocess.run(["scancel", alloc], env=rig.env, check=True, timeout=10)
            got = await wait_status(bus, 1, "SUCCEEDED", timeout=90)
            logs = [m.data.decode() async for m in bus.replay_raw(stream=bus.logs_stream)]
            for _ in range(100):  # the old allocation's accounting follows its teardown
                raw = [m.data async for m in bus.replay_raw()]
                if {str(a["data"]["slurm_job_id"]) for a in _accounted_of(raw)} & set(first):
                    break
                await asyncio.sleep(0.2)
            return first, got, logs, raw
        finally:
            for r in runners:
                r.stop()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
            await rec.close()
            await prov.close()
            await bus.close()

    first, got, logs, raw = asyncio.run(main())
    assert len(first) == 1, first
    statuses = [e.status for e in got]
    assert statuses[:3] == ["STARTING", "RUNNING", "RECOVERING"] and statuses[-2:] == ["RUNNING", "SUCCEEDED"], statuses
    assert got[2].reason.startswith("node_lost") and "Slurm allocation" in got[2].reason, got[2].reason
    assert any("second run" in line for line in logs)  # ran again, on a new allocation
    assert not set(ours()) & set(first)
    # The ledger, fed the log: the old allocation billed once, from sacct, as Slurm bills it.
    old = int(next(iter(first)))
    billing, elapsed, state = _sacct(rig, str(old))
    assert state.startswith("CANCELLED") and billing >= 1 and elapsed >= 1, (billing, elapsed, state)
    events = [a for a in _accounted_of(raw) if a["data"]["slurm_job_id"] == old]
    assert len(events) == 1 and events[0]["data"]["source"] == "sacct", events  # published once, from sacct
    proj = Projector(tmp_path / "l.duckdb")
    try:
        proj.write(proj.apply_raw([(i + 1, 0, line) for i, line in enumerate(raw)])[0])
        rows = [(k, v) for k, v in proj.state.rows["slurm_allocations"].items() if k[1] == old]
        assert len(rows) == 1, rows
        (_, row), = rows
        assert row["source"] == "sacct" and row["billing_int"] == billing and row["elapsed_s"] == elapsed, row
        cfg = parse_ledger_config({})
        due = due_usage(proj.state, datetime.now(UTC) + timedelta(minutes=1), timedelta(seconds=10), cfg, {})
        bills = [ev for _, ev in due if not ev.lifetime_id and ev.billing_seconds and ev.cluster == rows[0][0][0]]
        olds = [b for b in bills if b.billing_seconds == billing * elapsed]
        assert len(olds) == 1, bills  # once
    finally:
        proj.close()


def _accounted_of(raw: list[bytes]) -> list[dict]:
    envs = [json.loads(line) for line in raw]
    return [e for e in envs if e["type"] == f"io.skypurza.{SlurmAllocationAccounted.EVENT_NAME}.v1"]


def test_accountings_a_dead_provisioner_left_are_published_at_the_next_start_once(
        slurm_accounted_rig, nats_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ways to die: after the scancel and before sacct was read (the record says `ending`),
    and after sacct was read and before it was published (kept on disk). The next provisioner
    publishes both from sacct, under the allocation's id; the one after publishes nothing."""
    import asyncio
    import os
    from dataclasses import replace

    from nats_fixtures import connect_bus
    from slurm_rig import CLUSTER

    from skypurza.events import naming
    from skypurza.services.provisioner import slurm_account
    from skypurza.services.provisioner.service import ProvisionerService, accounted_id
    from skypurza.services.provisioner.settings import ProvisionerSettings

    rig = slurm_accounted_rig
    config = tmp_path / "slurm-config"
    config.write_text(rig.slurm_config())
    monkeypatch.setenv("SKYPURZA_SLURM_CONFIG", str(config))
    state = tmp_path / "state"

    def submit(cluster: str) -> int:
        out = subprocess.run(["sbatch", "--parsable", "-J", naming.slurm_job_name("test", cluster), "-p", "debug",
                              "-o", os.devnull, "--wrap", "exec sleep infinity"], env=rig.env, capture_output=True,
                             text=True, timeout=20, cwd=rig.login_home)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip().split(";")[0])

    def record(cluster: str, job: int, **extra) -> dict:
        return {"cluster": cluster, "stage": "test", "region": CLUSTER, "zone": "debug", "slurm_job_id": str(job),
                "state": "running", "nodes": [], "accounting": {}, "launched_at": datetime.now(UTC).isoformat(),
                **extra}

    # The rig is this file's: an allocation an earlier test left (its teardown still under way when
    # its services stopped) holds the nodes, and a job that never starts has no sacct row to bill.
    rig._cancel_all_jobs(wait_s=30)
    ending, kept = submit("ending"), submit("kept")
    for _ in range(150):
        running = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i"], env=rig.env, capture_output=True,
                                 text=True, timeout=10).stdout.split()
        if {str(ending), str(kept)} <= set(running):
            break
        subprocess.run(["sleep", "0.2"])
    else:
        queue = subprocess.run(["squeue", "-o", "%i %j %T %R"], env=rig.env, capture_output=True, text=True,
                               timeout=10).stdout
        raise AssertionError(f"jobs {ending} and {kept} did not both start:\n{queue}")
    subprocess.run(["sleep", "1.1"])  # at least a second of ElapsedRaw
    # The first died after its scancel: the record, marked before the scancel, is all there is.
    cdir = state / "slurm" / naming.subject_token("ending")
    cdir.mkdir(parents=True)
    from skypurza.services.provisioner.local import RECORD

    (cdir / RECORD).write_text(json.dumps(record("ending", ending, ending=True)))
    subprocess.run(["scancel", str(ending), str(kept)], env=rig.env, check=True, timeout=10)
    # The second died after reading sacct: what it read is kept.
    for _ in range(100):
        _, _, st = _sacct(rig, str(kept))
        if st.startswith("CANCELLED"):
            break
        subprocess.run(["sleep", "0.2"])
    # (slurmdbd writes the final row on its own time: a loaded machine took over 10 s once)
    read = asyncio.run(slurm_account.account(_login_runner(rig), record("kept", kept), "kept", datetime.now(UTC),
                                             wait_s=45, poll_s=0.2))
    assert read is not None and read.source == "sacct"
    slurm_account.keep(state / "slurm-accounts", read)

    async def one_start() -> list:
        bus = await connect_bus(nats_server)
        prov = ProvisionerService(replace(ProvisionerSettings.load(), reconcile_interval_s=0, cleanup_interval_s=0,
                                          local_root=str(state)))
        try:
            await prov.start(bus)
            assert prov._settler is not None
            await asyncio.wait_for(asyncio.shield(prov._settler), 60)
            return [(e.id, e.data) async for e in _replay_accounted(bus)]
        finally:
            await prov.close()
            await bus.close()

    first = asyncio.run(one_start())
    by_job = {ev.slurm_job_id: (eid, ev) for eid, ev in first}
    assert len(first) == 2 and set(by_job) == {ending, kept}, first
    for job in (ending, kept):
        eid, ev = by_job[job]
        billing, elapsed, st = _sacct(rig, str(job))
        assert ev.source == "sacct" and ev.state == "CANCELLED" and st.startswith("CANCELLED")
        assert ev.slurm_billing == billing and ev.elapsed_s == elapsed >= 1, (ev, billing, elapsed)
        assert eid == accounted_id("test", ev)  # the allocation's own id: any repeat is a duplicate
    assert not cdir.exists() and not list((state / "slurm-accounts").glob("*.json"))
    assert len(asyncio.run(one_start())) == 2  # the next start publishes nothing more


def _login_runner(rig):
    from skypurza.services.provisioner.slurm_ssh import Result

    async def run(command: str):
        out = rig.ssh(command)
        return Result(out.returncode, out.stdout, out.stderr)
    return run


async def _replay_accounted(bus):
    async for stored in bus.replay():
        if isinstance(stored.event, SlurmAllocationAccounted):
            yield stored.envelope
