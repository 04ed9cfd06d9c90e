"""Provisioner benchmark through a real nats-server and the fault-injecting fake AWS (moto).

Prints:
- the time from PlacementChosen to ClusterProvisioned (both as stored in the log) for gangs
  of 1, 8 and 64 nodes (the provisioner service in this process, AWS adapter polling every
  --poll seconds);
- the failover time: from a CapacityError stored in the log to the provisioner's next
  RunInstances call for that task (optimizer and provisioner services in this process; every
  task's first zone has no spot capacity), p50 and p99;
- a new local node (issue 21): PlacementChosen -> NodeReady -> ClusterProvisioned, each from the
  events' own store times on the log (the provisioner service in this process, the local
  backend starting a real agent process per node), with the backend's pre-started agent (the
  spare: services/agent/spare.py) beside a cold agent start (`spare=False`: the old path), same run.

    python bench/provision.py [--rounds 5] [--failovers 50] [--poll 0.05] [--skip aws,local]

The adapter is timed by a subclass that notes when it sends RunInstances (bench-only).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from aws_fixtures import FakeAws, start_fakeaws, stop_fakeaws  # noqa: E402

from skypurza.events import naming  # noqa: E402
from skypurza.events.bus import Bus  # noqa: E402
from skypurza.events.models import PlacementChosen, TaskSubmitted  # noqa: E402
from skypurza.events.natsserver import NatsServer, free_port  # noqa: E402
from skypurza.events.service import ServiceRunner  # noqa: E402
from skypurza.events.types import Candidate  # noqa: E402
from skypurza.services.optimizer import decide  # noqa: E402
from skypurza.services.optimizer.catalog import load_catalog  # noqa: E402
from skypurza.services.optimizer.service import OptimizerService  # noqa: E402
from skypurza.services.provisioner.aws import AwsAdapter  # noqa: E402
from skypurza.services.provisioner.aws_retry import RetryOptions  # noqa: E402
from skypurza.services.provisioner.adapter import ClusterRef  # noqa: E402
from skypurza.services.provisioner.local import LocalAdapter  # noqa: E402
from skypurza.services.provisioner.service import ProvisionerService  # noqa: E402
from skypurza.services.provisioner.settings import ProvisionerSettings  # noqa: E402

STAGE = "bench"
REGION = "us-east-1"


class TimedAws(AwsAdapter):
    """Notes the wall-clock time of every RunInstances call, by cluster tag."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.run_calls: list[tuple[float, str]] = []

    async def _call(self, where: Any, method: str, **params: Any) -> dict[str, Any]:
        if method == "run_instances":
            tags = {t["Key"]: t["Value"] for t in params["TagSpecifications"][0]["Tags"]}
            self.run_calls.append((time.time(), tags.get(naming.TAG_CLUSTER, "")))
        return await super()._call(where, method, **params)


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


async def wait_last(bus: Bus, subject: str, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await bus.last_event(subject)
        if found is not None:
            return found
        await asyncio.sleep(0.01)
    raise TimeoutError(subject)


async def provision_times(url: str, aws: FakeAws, rounds: int, poll: float) -> dict[int, list[float]]:
    bus = await Bus.connect(url, STAGE, source="/bench")
    adapter = TimedAws(session=aws.session(), endpoint_url=aws.endpoint_url, regions=(REGION,),
                       poll_interval=poll, retry=RetryOptions(base_delay=0.05))
    settings = ProvisionerSettings(aws_regions=(REGION,), reconcile_interval_s=0, concurrency=8)
    svc = ProvisionerService(settings, backends={"aws": adapter})
    runner = ServiceRunner(bus, svc)
    task = asyncio.create_task(runner.run())
    out: dict[int, list[float]] = {}
    try:
        # Warm-up: the stage's security group and key pair are created on the first launch.
        for n, label in [(1, "warmup")] + [(n, f"r{r}") for n in (1, 8, 64) for r in range(rounds)]:
            cluster = f"c{n}-{label}"
            await bus.publish(TaskSubmitted(task_id=cluster, cluster=cluster, num_nodes=n,
                                            task={"run": "true", "num_nodes": n}))
            cand = Candidate(infra="aws", region=REGION, zone="us-east-1a", instance_type="m5.large",
                             use_spot=True, num_nodes=n, hourly_price_micros=30_000)
            await bus.publish(PlacementChosen(task_id=cluster, cluster=cluster, attempt=1, candidate=cand, num_nodes=n))
            placed = await wait_last(bus, naming.event_subject(STAGE, "task", cluster, "placement_chosen"))
            prov = await wait_last(bus, naming.event_subject(STAGE, "cluster", cluster, "cluster_provisioned"))
            assert len(prov.event.nodes) == n
            if label != "warmup":
                out.setdefault(n, []).append((prov.timestamp - placed.timestamp).total_seconds())
    finally:
        runner.stop()
        await task
        await svc.close()
        await bus.close()
    return out


async def failover_times(url: str, aws: FakeAws, count: int, poll: float) -> list[float]:
    bus = await Bus.connect(url, STAGE, source="/bench")
    adapter = TimedAws(session=aws.session(), endpoint_url=aws.endpoint_url, regions=(REGION,),
                       poll_interval=poll, retry=RetryOptions(base_delay=0.05))
    task_spec = {"run": "true", "resources": {"infra": "aws/us-east-1", "instance_type": "m5.large", "use_spot": True}}
    # The zone the optimizer tries first gets no spot capacity, for every task.
    world = decide.World(load_catalog(), frozenset({"aws"}), None)
    first = decide.first_placement(TaskSubmitted(task_id="x", cluster="x", task=task_spec), world).candidate
    zones = aws.client(first.region).describe_availability_zones()["AvailabilityZones"]
    zone = next(z["ZoneName"] for z in zones if first.zone in (z["ZoneName"], z["ZoneId"]))
    aws.add_fault("InsufficientInstanceCapacity", region=first.region, zone=zone, instance_type="m5.large",
                  market="spot")
    services = [OptimizerService(enabled=frozenset({"aws"}), live_spot_prices=False),
                ProvisionerService(ProvisionerSettings(aws_regions=(REGION,), reconcile_interval_s=0),
                                   backends={"aws": adapter})]
    runners = [ServiceRunner(bus, s) for s in services]
    tasks = [asyncio.create_task(r.run()) for r in runners]
    samples: list[float] = []
    try:
        for i in range(count):
            cluster = f"f{i}"
            await bus.publish(TaskSubmitted(task_id=cluster, cluster=cluster, task=task_spec))
            err = await wait_last(bus, naming.event_subject(STAGE, "task", cluster, "capacity_error"))
            await wait_last(bus, naming.event_subject(STAGE, "cluster", cluster, "cluster_provisioned"))
            calls = [t for t, c in adapter.run_calls if c == cluster]
            assert len(calls) == 2, calls
            samples.append(calls[1] - err.timestamp.timestamp())
    finally:
        for r in runners:
            r.stop()
        await asyncio.gather(*tasks)
        await services[1].close()
        await bus.close()
    return samples


async def local_node_times(url: str, root: Path, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Per new 1-node local cluster, with a spare and cold (alternating rounds, same run):
    PlacementChosen -> NodeReady and NodeReady -> ClusterProvisioned (seconds between the events'
    store times); each cluster is torn down before the next."""
    bus = await Bus.connect(url, STAGE, source="/bench")
    adapter = LocalAdapter(url, STAGE, root)
    svc = ProvisionerService(ProvisionerSettings(reconcile_interval_s=0, cleanup_interval_s=0),
                             backends={"local": adapter})
    runner = ServiceRunner(bus, svc)
    task = asyncio.create_task(runner.run())
    out: dict[str, dict[str, list[float]]] = {
        way: {"PlacementChosen -> NodeReady": [], "NodeReady -> ClusterProvisioned": []}
        for way in ("spare", "cold (old path)")}
    try:
        # The first launch starts cold whatever the setting (the spare is made after it): not counted.
        for i, way in enumerate(["warmup"] + ["spare", "cold (old path)"] * rounds):
            adapter.spare = way != "cold (old path)"
            if not adapter.spare:
                await adapter.drop_spare()
            elif way == "spare":
                adapter.warm()
                await wait_spare(adapter)
            cluster = f"l{i}"
            spare_pid = adapter.spare_pid()
            await bus.publish(TaskSubmitted(task_id=cluster, cluster=cluster, task={"run": "true"}))
            await bus.publish(PlacementChosen(task_id=cluster, cluster=cluster, attempt=1,
                                              candidate=Candidate(infra="local", num_nodes=1), num_nodes=1))
            await wait_last(bus, naming.event_subject(STAGE, "cluster", cluster, "cluster_provisioned"))
            # Store times from a replay (the reply subject's nanoseconds): last_event's may be the reader's clock.
            at = {s.subject.rsplit(".", 1)[-1]: s.timestamp async for s in bus.replay(filter_subjects=[
                naming.aggregate_subjects(STAGE, "task", cluster), naming.aggregate_subjects(STAGE, "cluster", cluster)])}
            placed, ready, prov = (at["placement_chosen"], at["node_ready"], at["cluster_provisioned"])
            ready_ev = await wait_last(bus, naming.event_subject(STAGE, "cluster", cluster, "node_ready"))
            if way == "spare" and ready_ev.event.pid != spare_pid:
                print(f"  (round {i}: the spare was not used)", file=sys.stderr)
            if way != "warmup":
                out[way]["PlacementChosen -> NodeReady"].append((ready - placed).total_seconds())
                out[way]["NodeReady -> ClusterProvisioned"].append((prov - ready).total_seconds())
            await adapter.terminate(ClusterRef(stage=STAGE, cluster=cluster, infra="local"))
    finally:
        runner.stop()
        await task
        await svc.close()
        await bus.close()
    return out


async def wait_spare(adapter: LocalAdapter) -> None:
    """A spare is made after a launch and imports for ~0.3 s: a user's next launch comes later
    than that; the bench waits for it to be idle (its CPU time stops growing), bounded."""
    deadline = time.monotonic() + 10
    last = -1.0
    while time.monotonic() < deadline:
        pid = adapter.spare_pid()
        if pid is not None:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[-1].split()
            cpu = int(fields[11]) + int(fields[12])
            if cpu == last:
                return
            last = cpu
        await asyncio.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--failovers", type=int, default=50)
    ap.add_argument("--poll", type=float, default=0.05, help="adapter poll interval (s)")
    ap.add_argument("--skip", default="", help="comma-separated: aws,local")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as d:
        import os

        os.environ["SKYPURZA_HOME"] = str(Path(d) / "home")  # the key pair's file lands here
        server = NatsServer(Path(d) / "js", free_port()).start()
        fake = start_fakeaws() if "aws" not in skip else None
        try:
            if fake is not None:
                aws = FakeAws(fake, account_id="210987654321")
                times = asyncio.run(provision_times(server.url, aws, a.rounds, a.poll))
                print(f"PlacementChosen -> ClusterProvisioned (bus + fake AWS, poll {a.poll} s, {a.rounds} rounds):")
                for n, vals in times.items():
                    print(f"  {n:>3} node(s): p50 {statistics.median(vals) * 1000:7.0f} ms   "
                          f"min {min(vals) * 1000:7.0f} ms   max {max(vals) * 1000:7.0f} ms")
                aws = FakeAws(fake, account_id="210987654322")
                samples = asyncio.run(failover_times(server.url, aws, a.failovers, a.poll))
                print(f"CapacityError stored -> next RunInstances call ({len(samples)} failovers, "
                      "optimizer + provisioner):")
                print(f"  p50 {pct(samples, 50) * 1000:.1f} ms   p99 {pct(samples, 99) * 1000:.1f} ms   "
                      f"max {max(samples) * 1000:.1f} ms")
            if "local" not in skip:
                local = asyncio.run(local_node_times(server.url, Path(d) / "local", a.rounds))
                print(f"a new local node, from the events' store times ({a.rounds} rounds each, alternating; "
                      f"load {os.getloadavg()[0]:.2f}):")
                for way, rows in local.items():
                    for what, vals in rows.items():
                        print(f"  {way:<16} {what:<32} p50 {statistics.median(vals) * 1000:7.0f} ms   "
                              f"min {min(vals) * 1000:7.0f} ms   max {max(vals) * 1000:7.0f} ms")
        finally:
            if fake is not None:
                stop_fakeaws(fake)
            server.stop()

if __name__ == "__main__":
    main()
