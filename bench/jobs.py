"""Managed-jobs benchmark: submissions, recovery time, control-plane memory.

Prints, through a real nats-server started here:
1. managed jobs accepted per second: ManagedJobSubmitted appended with a log-allocated id
   (sequential, and from many concurrent submitters racing for ids), and how fast the recovery
   service turns them into first launches (STARTING + TaskSubmitted);
2. time from a spot preemption to the replacement running, through the fake AWS (moto behind
   the fault-injecting proxy): the real optimizer, provisioner, recovery service and agent
   processes; with the EC2 poll interval given (the default deployment polls every 15 s);
3. memory of the control plane with N jobs in flight: the recovery service in its own process
   (`python -m skypurza.cli.serve --services recovery`) and nats-server, RSS after every job is
   RUNNING.

    python bench/jobs.py [--jobs 1000] [--concurrency 50] [--preemptions 3] [--poll 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from skypurza.events import naming  # noqa: E402
from skypurza.events.bus import Bus  # noqa: E402
from skypurza.events.natsserver import NatsServer, free_port  # noqa: E402
from skypurza.events.service import ServiceRunner  # noqa: E402
from skypurza.services.recovery.service import RecoveryService  # noqa: E402
from skypurza.services.recovery.settings import RecoverySettings  # noqa: E402
from skypurza.services.recovery.submit import read_jobs, submit_managed_job  # noqa: E402

STAGE = "bench"
TASK = {"name": "bench", "run": "true", "resources": {"use_spot": True}}


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def count_launches(bus: Bus) -> int:
    info = await bus.js.stream_info(bus.events_stream, subjects_filter=naming.event_filter(STAGE, "task", "task_submitted"))
    return sum((info.state.subjects or {}).values()) if info.state.subjects else 0


# ------------------------------------------------------------------------------------- 1. accepted

async def bench_accept(url: str, n: int, concurrency: int) -> None:
    bus = await Bus.connect(url, STAGE, source="/bench/jobs")
    svc = RecoveryService(RecoverySettings(ec2_poll_s=0, heartbeat_timeout_s=0, reconcile_s=3600), bucket_store="dir")
    seq_n = max(1, n // 4)
    t = time.perf_counter()
    for _ in range(seq_n):
        await submit_managed_job(bus, name="bench", tasks=[TASK])
    seq_rate = seq_n / (time.perf_counter() - t)

    sem = asyncio.Semaphore(concurrency)

    async def one() -> int:
        async with sem:
            return (await submit_managed_job(bus, name="bench", tasks=[TASK])).managed_job_id

    t = time.perf_counter()
    ids = await asyncio.gather(*(one() for _ in range(n)))
    conc_rate = n / (time.perf_counter() - t)
    assert len(set(ids)) == n, "duplicate managed job ids"
    total = seq_n + n
    # The recovery service turns every submission into a first launch.
    runner = ServiceRunner(bus, svc)
    t = time.perf_counter()
    task = asyncio.create_task(runner.run())
    while await count_launches(bus) < total:
        await asyncio.sleep(0.05)
    started_rate = total / (time.perf_counter() - t)
    runner.stop()
    await task
    await svc.close()
    await bus.close()
    print(f"1. managed jobs accepted: {seq_rate:,.0f}/s one submitter at a time; "
          f"{conc_rate:,.0f}/s with {concurrency} concurrent submitters racing for ids ({n} jobs, ids unique)")
    print(f"   first launches by the recovery service (STARTING + TaskSubmitted): {started_rate:,.0f} jobs/s "
          f"({total} jobs from a standing start)")


# ------------------------------------------------------------------------------------ 2. recovery

async def bench_preemption(url: str, work: Path, rounds: int, poll: float) -> None:
    import aws_fixtures
    from ec2_agents import Ec2Agents

    from skypurza.services.optimizer.catalog.model import Catalog, InstanceType, Offering, ZoneOffer
    from skypurza.services.optimizer.service import OptimizerService
    from skypurza.services.provisioner.aws import AwsAdapter
    from skypurza.services.provisioner.aws_retry import RetryOptions
    from skypurza.services.provisioner.service import ProvisionerService
    from skypurza.services.provisioner.settings import ProvisionerSettings

    regions = ("us-east-1", "us-west-2")
    catalog = Catalog.from_parts(
        cloud="aws", built_at="2026-11-30T00:00:00Z", source="bench",
        types=[InstanceType("m5.large", 2, 8, None, 0, None, "x86_64")],
        offerings=[Offering("m5.large", "us-east-1", 96_000, (ZoneOffer("us-east-1a", 30_000),
                                                              ZoneOffer("us-east-1b", 31_000))),
                   Offering("m5.large", "us-west-2", 96_000, (ZoneOffer("us-west-2a", 35_000),))])
    server = aws_fixtures.start_fakeaws(work / "fakeaws.log")
    aws = aws_fixtures.FakeAws(server, account_id="210987654321")
    saved = dict(os.environ)
    os.environ.update({**aws.env, "SKYPURZA_CHECKPOINT_SYNC_S": "1"})
    bus = await Bus.connect(url, STAGE, source="/bench/jobs")
    adapter = AwsAdapter(session=aws.session(), endpoint_url=aws.endpoint_url, regions=regions, poll_interval=0.1,
                         retry=RetryOptions(max_attempts=3, base_delay=0.01, max_delay=0.05))
    prov = ProvisionerService(replace(ProvisionerSettings(), aws_regions=regions, aws_poll_s=0.1, concurrency=8,
                                      ack_wait_s=10.0, reconcile_interval_s=0), backends={"aws": adapter})
    rec = RecoveryService(RecoverySettings(ec2_poll_s=poll, heartbeat_timeout_s=0, reconcile_s=30),
                          aws_session=aws.session(), endpoint_url=aws.endpoint_url, bucket_store="s3")
    services = [OptimizerService(catalog=catalog, enabled=frozenset({"aws"})), prov, rec]
    runners = [ServiceRunner(bus, s) for s in services]
    tasks = [asyncio.create_task(r.run()) for r in runners]
    agents = await Ec2Agents(bus, url, work / "nodes", aws).start()
    task = {"name": "spot", "resources": {"infra": "aws", "instance_type": "m5.large", "use_spot": True},
            "run": "sleep 600"}
    samples = []
    try:
        for _ in range(rounds):
            job = await submit_managed_job(bus, name="spot", tasks=[task])
            jid = job.managed_job_id

            async def running(count: int) -> float:
                while True:
                    got = [e for e in await _statuses(bus, jid) if e.status == "RUNNING"]
                    if len(got) >= count:
                        return time.perf_counter()
                    await asyncio.sleep(0.02)

            await running(1)
            node = next(n for n in agents.nodes.values() if n.cluster == f"spot-{jid}-1")
            t0 = time.perf_counter()
            aws.preempt(node.instance_id, region=node.region)
            t_running = await running(2)
            evs = await _statuses(bus, jid)
            samples.append(t_running - t0)
            assert [e.status for e in evs][-2:] == ["RECOVERING", "RUNNING"]
            from skypurza.services.recovery.submit import request_cancel

            await request_cancel(bus, jid)
            while not (await read_jobs(bus, [jid]))[jid].terminal:
                await asyncio.sleep(0.05)
    finally:
        await agents.stop()
        for r in runners:
            r.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        await rec.close()
        await prov.close()
        await bus.close()
        aws_fixtures.stop_fakeaws(server)
        os.environ.clear()
        os.environ.update(saved)
    samples.sort()
    print(f"2. preemption -> replacement RUNNING (fake AWS, EC2 poll every {poll:g} s, new agent process "
          f"included): median {samples[len(samples) // 2]:.2f} s, min {samples[0]:.2f} s, max {samples[-1]:.2f} s "
          f"over {len(samples)} preemptions")


async def _statuses(bus: Bus, job_id: int):
    from skypurza.events.models import ManagedJobStatusChanged

    subject = naming.event_subject(STAGE, "mjob", str(job_id), ManagedJobStatusChanged.EVENT_NAME)
    if await bus.last_event(subject) is None:
        return []
    return [s.event async for s in bus.replay(filter_subject=subject)]


# -------------------------------------------------------------------------------------- 3. memory

async def bench_memory(url: str, server: NatsServer, n: int, work: Path) -> None:
    from managed_fixtures import Stand

    env = {**os.environ, "SKYPURZA_HOME": str(work / "home"), "SKYPURZA_RECOVERY_EC2_POLL_S": "0",
           "SKYPURZA_BUCKET_STORE": "dir", "PYTHONUNBUFFERED": "1"}
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID"):
        env.pop(k, None)
    log = open(work / "serve.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "skypurza.cli.serve", "--nats", url, "--stage", STAGE,
                             "--services", "recovery"], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 30
        while b"services ready" not in (work / "serve.log").read_bytes():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError((work / "serve.log").read_text()[-2000:])
            await asyncio.sleep(0.1)
        idle = rss_mib(proc.pid)
        bus = await Bus.connect(url, STAGE, source="/bench/jobs")
        stand = await Stand(bus, default="hold").start()  # plays provisioner + agents: clusters up, jobs running
        before = len((await read_jobs(bus)))
        sem = asyncio.Semaphore(50)

        async def one() -> None:
            async with sem:
                await submit_managed_job(bus, name="inflight", tasks=[TASK])

        await asyncio.gather(*(one() for _ in range(n)))
        t = time.perf_counter()
        while True:
            jobs = await read_jobs(bus)
            running = sum(1 for s in jobs.values() if s.status == "RUNNING")
            if running >= n:
                break
            if time.perf_counter() - t > 300:
                raise RuntimeError(f"only {running} of {n} running")
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.0)
        loaded = rss_mib(proc.pid)
        nats_rss = rss_mib(server.process.pid) if server.process else 0.0
        await stand.stop()
        await bus.close()
        print(f"3. control plane with {n} managed jobs in flight (RUNNING, {before} earlier jobs in the log): "
              f"recovery service RSS {loaded:.0f} MiB (idle {idle:.0f} MiB, "
              f"{(loaded - idle) * 1024 / n:.1f} KiB per job); nats-server RSS {nats_rss:.0f} MiB")
    finally:
        proc.terminate()
        proc.wait(15)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--preemptions", type=int, default=3)
    p.add_argument("--poll", type=float, default=1.0, help="EC2 poll interval of the recovery service (s)")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: accept,preempt,memory")
    args = p.parse_args()
    import logging

    logging.basicConfig(level=logging.ERROR)
    skip = set(args.skip.split(",")) - {""}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["SKYPURZA_HOME"] = str(work / "home")
        server = NatsServer(store_dir=work / "js", port=free_port(), log_file=work / "nats.log").start()
        try:
            if "accept" not in skip:
                await bench_accept(server.url, args.jobs, args.concurrency)
            if "preempt" not in skip:
                await bench_preemption(server.url, work, args.preemptions, args.poll)
            if "memory" not in skip:
                await bench_memory(server.url, server, args.jobs, work)
        finally:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
