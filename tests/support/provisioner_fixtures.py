"""Helpers for provisioner tests: publish a task and its placement, run the service, wait for events."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from aws_fixtures import FakeAws

from skypurza.events import naming
from skypurza.events.bus import Bus, Stored
from skypurza.events.envelope import Envelope
from skypurza.events.models import PlacementChosen, TaskSubmitted
from skypurza.events.service import ServiceRunner
from skypurza.events.types import Candidate
from skypurza.services.provisioner.aws import AwsAdapter
from skypurza.services.provisioner.aws_retry import RetryOptions
from skypurza.services.provisioner.service import ProvisionerService
from skypurza.services.provisioner.settings import ProvisionerSettings

STAGE = "test"
REGION = "us-east-1"
FAST_RETRY = RetryOptions(max_attempts=3, base_delay=0.01, max_delay=0.05)
SETTINGS = ProvisionerSettings(
    aws_regions=(REGION,), aws_poll_s=0.02, aws_retry_base_s=0.01, aws_max_attempts=3, concurrency=8,
    ack_wait_s=2.0, transient_attempts=2, transient_backoff_s=0.05, reconcile_interval_s=0,
    reconcile_grace_s=0, agent_nats_url="nats://broker.example:4222", node_install="skypurza==0.1.0",
)


def aws_env(aws: FakeAws, **extra: str) -> dict[str, str]:
    """Environment of a provisioner process talking to this fake account, quickly."""
    return {**aws.env, "SKYPURZA_AWS_REGIONS": REGION, "SKYPURZA_AWS_POLL_S": "0.02",
            "SKYPURZA_AWS_RETRY_BASE_S": "0.01", "SKYPURZA_AWS_MAX_ATTEMPTS": "3",
            "SKYPURZA_PROVISIONER_ACK_WAIT_S": "2", "SKYPURZA_RECONCILE_INTERVAL_S": "0",
            "SKYPURZA_PROVISIONER_TRANSIENT_BACKOFF_S": "0.05", **extra}


def adapter(aws: FakeAws) -> AwsAdapter:
    return AwsAdapter(session=aws.session(), endpoint_url=aws.endpoint_url, regions=(REGION,),
                      poll_interval=0.02, retry=FAST_RETRY)


def service(aws: FakeAws, **settings: Any) -> ProvisionerService:
    return ProvisionerService(replace(SETTINGS, **settings), backends={"aws": adapter(aws)})


def candidate(zone: str | None = "us-east-1a", instance_type: str = "m5.large", use_spot: bool = True,
              num_nodes: int = 2, **kw: Any) -> Candidate:
    return Candidate(infra="aws", region=REGION, zone=zone, instance_type=instance_type, use_spot=use_spot,
                     num_nodes=num_nodes, hourly_price_micros=kw.pop("price", 35_000), vcpus=2, memory_gib=8,
                     **kw)


async def submit(bus: Bus, task_id: str, cluster: str, *, num_nodes: int = 2, down: bool = False,
                 task: dict[str, Any] | None = None, idle_minutes: int | None = None) -> Envelope:
    env = bus.envelope(TaskSubmitted(task_id=task_id, cluster=cluster, num_nodes=num_nodes, down=down,
                                     task=task or {"name": "train", "run": "echo hi", "num_nodes": num_nodes},
                                     user="alice", team="ml", secrets_key=task_id, idle_minutes=idle_minutes))
    await bus.publish(env)
    return env


async def place(bus: Bus, task_id: str, cluster: str, cand: Candidate, attempt: int = 1) -> Envelope:
    env = bus.envelope(PlacementChosen(task_id=task_id, cluster=cluster, attempt=attempt, candidate=cand,
                                       num_nodes=cand.num_nodes))
    await bus.publish(env)
    return env


async def launch(bus: Bus, task_id: str, cluster: str, cand: Candidate, **kw: Any) -> Envelope:
    await submit(bus, task_id, cluster, num_nodes=cand.num_nodes, **kw)
    return await place(bus, task_id, cluster, cand)


async def wait_for(bus: Bus, subject: str, pred: Callable[[Stored], bool] = lambda s: True,
                   timeout: float = 30.0) -> Stored:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        last = await bus.last_event(subject)
        if last is not None and pred(last):
            return last
        if last is not None:
            for s in [s async for s in bus.replay(filter_subject=subject)]:
                if pred(s):
                    return s
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no event on {subject} within {timeout} s")
        await asyncio.sleep(0.05)


async def events_on(bus: Bus, subject: str) -> list[Stored]:
    if await bus.last_event(subject) is None:
        return []
    return [s async for s in bus.replay(filter_subject=subject)]


def subject(aggregate: str, id: str, event: str) -> str:
    return naming.event_subject(STAGE, aggregate, id, event)


@contextlib.asynccontextmanager
async def running(bus: Bus, svc: ProvisionerService) -> AsyncIterator[ServiceRunner]:
    runner = ServiceRunner(bus, svc, clock=svc.clock)  # one clock for both
    task = asyncio.create_task(runner.run())
    try:
        yield runner
    finally:
        runner.stop()
        await asyncio.wait_for(task, 15)
        await svc.close()
