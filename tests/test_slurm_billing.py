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
    billing = dict(item.split("=") for item in tres.split(","))["billing"]
    return int(billing), int(elapsed), state


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
