"""A deployment's secured bus, against a real nats-server started with the generated config.

Anonymous clients are refused; each service's user can do what its contract says and nothing
else; the public user reads the CloudEvents mirror and nothing else; the services, each with its
own user (and local node agents with theirs), run a job end to end with not one permission
violation in the server's log.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import nats
import pytest
from bus_refusal import refused
from nats_fixtures import kill_processes_using

from skypurza.cli import busauth
from skypurza.cli.serve import serve
from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.contract import ServiceContract
from skypurza.events.models import Candidate, JobSucceeded, PlacementChosen, TaskSubmitted
from skypurza.events.natsauth import deployment_users
from skypurza.events.natscreds import CREDS_ENV, credentials_file, read_credentials
from skypurza.events.natsserver import NatsServer, free_port
from skypurza.events.principal import stamp
from skypurza.services.mirror.cloudevent import CONTENT_TYPE

STAGE = "test"


@pytest.fixture
def secured(tmp_path: Path, spz_home: Path):
    auth = busauth.prepare(STAGE)
    server = NatsServer(store_dir=tmp_path / "js", port=free_port(), log_file=tmp_path / "nats.log",
                        extra_blocks=(auth.read_text(),)).start()
    asyncio.run(busauth.set_up(server.url, STAGE))
    yield server
    server.stop()
    kill_processes_using(server.url)


def creds(user: str):
    return read_credentials(credentials_file(naming.bus_credentials_dir(STAGE), user))


class Client:
    """A raw nats-py client as one user. `refused(action)` runs one publish or subscribe on a
    connection of its own (nats-py closes a connection the server sent a permissions error on)
    and says whether the server refused it: a permissions violation, or a JetStream request
    that got no reply because the server dropped it."""

    def __init__(self) -> None:
        self.url = ""
        self.user = ""
        self.nc = None

    async def _open(self) -> tuple[object, list[str]]:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        c = creds(self.user)
        nc = await nats.connect(self.url, user=c.user, password=c.password, inbox_prefix=naming.inbox_prefix(c.user),
                                error_cb=on_error, allow_reconnect=False, connect_timeout=3)
        return nc, errors

    async def connect(self, url: str, user: str) -> "Client":
        self.url, self.user = url, user
        self.nc, _ = await self._open()
        return self

    async def refused(self, action) -> bool:
        return await refused(self.url, creds(self.user), action)

    async def close(self) -> None:
        await self.nc.close()


def test_the_grants_are_derived_from_the_contracts():
    """Pure: a service may publish exactly the subjects of what it emits; its own durable is its
    own, every other durable is denied; nobody but the control user may manage a stream."""
    from skypurza.services.optimizer.service import CONTRACT as OPTIMIZER

    users = {u.name: u.permissions for u in deployment_users(STAGE, busauth.deployment_contracts())}
    assert "CLI" not in users  # laptops hold no bus credentials
    opt = users["optimizer"]
    event_subjects = {s for s in opt.publish if s.startswith(naming.subject_prefix(STAGE) + ".evt.")}
    assert event_subjects == {naming.event_filter(STAGE, c.AGGREGATE, c.EVENT_NAME) for c in OPTIMIZER.emits}
    events = naming.events_stream(STAGE)
    own = naming.consumer(STAGE, "optimizer")
    assert f"$JS.ACK.{events}.{own}.>" in opt.publish
    others = [naming.consumer(STAGE, c.name) for c in busauth.deployment_contracts()
              if isinstance(c, ServiceContract) and c.name != "optimizer"]
    assert others and all(f"$JS.ACK.{events}.{d}.>" in opt.deny_publish for d in others)
    for name, p in users.items():
        if name != naming.BUS_CONTROL_USER:
            assert not any(".STREAM.DELETE." in s or ".STREAM.CREATE." in s or ".STREAM.UPDATE." in s or s == ">"
                           for s in p.publish), name
    assert users[naming.BUS_PUBLIC_USER].publish == ()
    assert users[naming.BUS_PUBLIC_USER].subscribe == (naming.public_filter(STAGE),)
    assert users["status"].allow_responses and not opt.allow_responses
    # The passwords are drawn at random, and their files are the user's alone.
    d = naming.bus_credentials_dir(STAGE)
    busauth.prepare(STAGE)
    files = sorted(d.glob("*.json"))
    assert len(files) == len(users)
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    assert naming.bus_auth_file(STAGE).stat().st_mode & 0o777 == 0o600
    assert len({json.loads(f.read_text())["password"] for f in files}) == len(files)
    assert "password=<hidden>" in repr(creds("optimizer"))


def test_anonymous_and_wrong_passwords_are_refused(secured):
    async def main():
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(secured.url, allow_reconnect=False, connect_timeout=3)
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(secured.url, user="optimizer", password="guess", allow_reconnect=False,
                               connect_timeout=3)

    asyncio.run(main())


def test_each_service_does_what_its_contract_says_and_nothing_else(secured):
    async def main():
        control = await Bus.connect(secured.url, STAGE, source="/tests", credentials=creds("control"))
        opt = await Bus.connect(secured.url, STAGE, source="/tests/optimizer", credentials=creds("optimizer"))
        # Its own event type: stored.
        ack = await opt.publish(PlacementChosen(task_id="t1", cluster="c1", attempt=1,
                                                candidate=Candidate(infra="local")))
        assert ack.seq >= 1
        last = await control.last_seq()
        raw = await Client().connect(secured.url, "optimizer")
        # Another service's event, the secrets, the stream itself, another's durable: refused.
        job_subject = naming.event_subject(STAGE, "cluster", "c1", "job_succeeded")
        assert await raw.refused(lambda nc: nc.publish(job_subject, b"{}"))
        assert await raw.refused(lambda nc: nc.publish(f"$KV.{naming.secrets_bucket(STAGE)}.k", b"x"))
        assert await raw.refused(lambda nc: nc.subscribe(f"$KV.{naming.secrets_bucket(STAGE)}.>"))
        assert await raw.refused(lambda nc: nc.subscribe(naming.all_events_subject(STAGE)))
        assert await raw.refused(lambda nc: nc.jetstream().delete_stream(naming.events_stream(STAGE)))
        assert await raw.refused(lambda nc: nc.jetstream().purge_stream(naming.events_stream(STAGE)))
        provisioner = naming.consumer(STAGE, "provisioner")
        assert await raw.refused(lambda nc: nc.jetstream().delete_consumer(naming.events_stream(STAGE), provisioner))
        assert await raw.refused(lambda nc: nc.subscribe("_INBOX.api.>"))  # another's replies
        assert await control.last_seq() == last  # nothing refused was stored
        assert (await control.js.stream_info(naming.events_stream(STAGE))).config.name
        # It reads the log (its decisions do): a replay works.
        assert [s.event for s in [x async for x in opt.replay()] if isinstance(s.event, PlacementChosen)]
        await raw.close()
        # The agent writes job output; it may not submit tasks.
        agent = await Client().connect(secured.url, "agent")
        assert not await agent.refused(lambda nc: nc.publish(naming.log_subject(STAGE, "c1", 1, 0), b"{}"))
        assert await agent.refused(lambda nc: nc.publish(naming.event_subject(STAGE, "task", "t2", "task_submitted"),
                                                         b"{}"))
        await agent.close()
        # The status service answers its queries, and only its own.
        status = await Client().connect(secured.url, "status")
        assert not await status.refused(lambda nc: nc.subscribe(naming.query_subject(STAGE, "status", "queue")))
        assert await status.refused(lambda nc: nc.subscribe(naming.query_subject(STAGE, "ledger", "cost_report")))
        await status.close()
        await opt.close()
        await control.close()

    asyncio.run(main())


def test_the_public_user_reads_the_mirror_and_nothing_else(secured):
    async def main():
        public = await Client().connect(secured.url, naming.BUS_PUBLIC_USER)
        assert not await public.refused(lambda nc: nc.subscribe(naming.public_filter(STAGE)))
        assert await public.refused(lambda nc: nc.publish(naming.public_subject(STAGE, "cluster", "c", "x"), b"{}"))
        assert await public.refused(lambda nc: nc.subscribe(naming.all_events_subject(STAGE)))
        assert await public.refused(lambda nc: nc.subscribe(naming.all_logs_subject(STAGE)))
        assert await public.refused(lambda nc: nc.subscribe(f"$KV.{naming.secrets_bucket(STAGE)}.>"))
        assert await public.refused(lambda nc: nc.jetstream().stream_info(naming.events_stream(STAGE)))
        assert await public.refused(lambda nc: nc.publish(naming.event_subject(STAGE, "task", "t", "task_submitted"),
                                                          b"{}"))
        await public.close()

    asyncio.run(main())


def test_the_services_with_their_own_users_run_a_job_and_outsiders_read_it(secured, monkeypatch, tmp_path):
    """optimizer, provisioner, status, recovery and the mirror, each as its own user; local node
    agents as the agent user (the provisioner's environment); a task submitted as the API server
    publishes it, stamped; the public user reads the job's end as a CloudEvent."""
    monkeypatch.setenv(CREDS_ENV, str(credentials_file(naming.bus_credentials_dir(STAGE), "agent")))
    monkeypatch.setenv("SKYPURZA_AGENT_KILL_GRACE_S", "1")

    async def main():
        public = await Client().connect(secured.url, naming.BUS_PUBLIC_USER)
        seen: list[tuple[str, dict, str]] = []

        async def on_public(msg) -> None:
            seen.append((msg.subject, json.loads(msg.data), (msg.headers or {}).get("Content-Type", "")))

        await public.nc.subscribe(naming.public_filter(STAGE), cb=on_public)
        stop, ready = asyncio.Event(), asyncio.Event()
        services = asyncio.create_task(serve(secured.url, STAGE, ["optimizer", "provisioner", "status", "recovery",
                                                                    "mirror"], stop, ready,
                                             credentials_dir=naming.bus_credentials_dir(STAGE)))
        await asyncio.wait_for(ready.wait(), 30)
        api = await Bus.connect(secured.url, STAGE, source=f"/skypurza/{STAGE}/api", credentials=creds("api"))
        env = stamp(api.envelope(TaskSubmitted(task_id="t-sec", cluster="sec1", user="alice",
                                               task={"resources": {"infra": "local"}, "run": "echo secured"})),
                    "alice", "research")
        await api.publish(env)
        control = await Bus.connect(secured.url, STAGE, source="/tests", credentials=creds("control"))
        deadline = time.monotonic() + 40
        done = None
        while done is None:
            assert time.monotonic() < deadline, [s.event for s in [x async for x in control.replay()]][-5:]
            done = next((s.event for s in [x async for x in control.replay(
                filter_subject=naming.aggregate_subjects(STAGE, "cluster", "sec1"))]
                if isinstance(s.event, JobSucceeded)), None)
            await asyncio.sleep(0.2)
        deadline = time.monotonic() + 10
        while not any(c["type"].startswith("io.skypurza.job_succeeded") for _, c, _ in seen):
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.1)
        subject, ce, content_type = next(x for x in seen if x[1]["type"].startswith("io.skypurza.job_succeeded"))
        assert content_type == CONTENT_TYPE
        assert subject == naming.public_subject(STAGE, "cluster", "sec1", "job_succeeded")
        assert {"specversion", "id", "source", "type", "subject", "time", "datacontenttype", "data",
                "sequence"} <= set(ce)
        assert ce["specversion"] == "1.0" and ce["datacontenttype"] == "application/json"
        assert (ce["spzuser"], ce["spzteam"]) == ("alice", "research")  # the stamp, not the task's claim
        assert ce["data"]["cluster"] == "sec1" and int(ce["sequence"]) >= 1
        submitted = next(c for _, c, _ in seen if c["type"].startswith("io.skypurza.task_submitted"))
        assert "task" not in submitted["data"]  # the task's commands and environment are not public
        await api.close()
        await control.close()
        await public.close()
        stop.set()
        await asyncio.wait_for(services, 30)

    try:
        asyncio.run(main())
    finally:
        log = Path(secured.log_file).read_text(errors="replace")
    # nats-server logs each refusal as `... "$G/user:<name>" - Publish Violation - Subject "..."`.
    violations = [line for line in log.splitlines() if "Publish Violation" in line or "Subscription Violation" in line]
    assert not violations, violations[:10]
