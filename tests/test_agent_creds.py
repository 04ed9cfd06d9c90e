"""Per-cluster bus credentials for node agents on remote machines (events/agentusers.py,
events/natsauth.py `cluster_agent_permissions`, the supervisor's reload, the provisioner's
mint / remove / re-derive), against a real nats-server started with the derived config.

A cluster's agent user publishes its own cluster's events, output and beats and is refused
another cluster's (the event never reaches the stream); it reads its own cluster's secrets and
last event by direct gets, and neither another cluster's secrets nor any event by sequence; once
the cluster is torn down its
credentials are refused at connect; a restarted control plane re-derives the users of the
clusters still up from the log.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import nats
import pytest
from leftovers import kill_stage
from bus_refusal import refused
from nats_fixtures import kill_processes_using

from skypurza.cli import busauth
from skypurza.cli.busaddr import BusAddressError, check_bus_host, local_host, parse_advertise
from skypurza.events import naming
from skypurza.events.agentusers import (
    AGENT_USERS_ENV,
    PER_CLUSTER,
    AgentUserStore,
    check_password,
    derive_password,
    fingerprint,
    plan_retain,
)
from skypurza.events.bus import Bus
from skypurza.events.models import (
    Candidate,
    ClusterProvisioned,
    ClusterTerminated,
    NodeInfo,
    NodeReady,
    PlacementChosen,
    TaskSubmitted,
)
from skypurza.events.natsauth import cluster_agent_permissions, durable_names
from skypurza.events.natscreds import (
    PASSWORD_ENV,
    USER_ENV,
    BusCredentials,
    CredentialsError,
    credentials_env,
    credentials_file,
    credentials_from_env,
    read_credentials,
)
from skypurza.events.natsserver import NatsServer, free_port
from skypurza.services.agent.agent import CONTRACT as AGENT

STAGE = "test"


def _agent_perms(cluster: str):
    contracts = busauth.deployment_contracts()
    return cluster_agent_permissions(AGENT, STAGE, cluster, durable_names(STAGE, contracts))


# ---------------------------------------------------------------- pure


@pytest.mark.parametrize("cluster", ["a1", "train.v2"])
def test_a_clusters_grants_are_the_agents_narrowed_to_its_subject_tokens(cluster: str) -> None:
    p = _agent_perms(cluster)
    tok = naming.subject_token(cluster)
    pre = naming.subject_prefix(STAGE)
    # Its events: exactly what the agent's contract emits, on this cluster's subjects only.
    evt = {s for s in p.publish if s.startswith(f"{pre}.evt.")}
    assert evt == {naming.event_subject(STAGE, "cluster", cluster, c.EVENT_NAME) for c in AGENT.emits}
    # Nothing that names a cluster names another (no wildcard in the cluster's place).
    for s in p.publish:
        for kind in (".evt.cluster.", ".log.", ".hb.", ".sample."):
            if kind in s:
                rest = s.split(kind, 1)[1]
                assert rest.split(".")[0] == tok, s
    assert f"{pre}.log.{tok}.>" in p.publish and f"{pre}.hb.{tok}.*" in p.publish
    assert f"{pre}.sample.{tok}.*" in p.publish
    # Consumers only with a filter inside its own cluster's events or logs.
    creates = [s for s in p.publish if ".CONSUMER.CREATE." in s and naming.events_stream(STAGE) in s]
    assert creates == [f"$JS.API.CONSUMER.CREATE.{naming.events_stream(STAGE)}.*."
                       f"{naming.aggregate_subjects(STAGE, 'cluster', cluster)}"]
    assert f"$JS.API.CONSUMER.CREATE.{naming.events_stream(STAGE)}" not in p.publish
    # Its own inbox, not the shared agent's; every durable still denied; never a stream managed.
    assert p.subscribe == (f"{naming.inbox_prefix(naming.cluster_agent_user(cluster))}.>",)
    assert p.deny_publish and all(".STREAM.DELETE." not in s and ".STREAM.PURGE." not in s
                                  for s in p.publish if naming.events_stream(STAGE) in s)
    assert naming.cluster_agent_user(cluster) == f"agent@{cluster}"


def test_a_clusters_grants_read_its_own_secrets_and_no_message_by_sequence() -> None:
    p = _agent_perms("train.v2")
    events, logs = naming.events_stream(STAGE), naming.logs_stream(STAGE)
    kv_stream = f"KV_{naming.secrets_bucket(STAGE)}"
    own_keys = f"$KV.{naming.secrets_bucket(STAGE)}.train=2Ev2.>"
    assert naming.secrets_cluster_keys(STAGE, "train.v2") == own_keys
    # Its secrets: a direct get naming a key under its cluster, and no other get of the bucket.
    assert [s for s in p.publish if kv_stream in s] == [f"$JS.API.STREAM.INFO.{kv_stream}",
                                                        f"$JS.API.DIRECT.GET.{kv_stream}.{own_keys}"]
    assert not [s for s in p.publish if s.startswith("$KV.")]  # reads only: never a put
    # No get by sequence on the log or the output: only direct gets that name its own subjects.
    for stream in (events, logs):
        gets = [s for s in p.publish if f".MSG.GET.{stream}" in s or f".DIRECT.GET.{stream}" in s]
        assert gets and all(g.startswith(f"$JS.API.DIRECT.GET.{stream}.") and ".train%2Ev2." in g for g in gets), gets
    # The key is one token a cluster name cannot forge ('.' and '=' are escaped).
    assert naming.secrets_key("t-1", "train.v2") == "train=2Ev2.t-1"
    assert naming.secrets_key("t-1", "a=2E") != naming.secrets_key("t-1", "a.")
    assert naming.secrets_key("t-1") == "t-1"  # as written before secrets were keyed by cluster


def test_an_agent_event_off_the_cluster_aggregate_cannot_be_narrowed() -> None:
    from dataclasses import replace

    with pytest.raises(ValueError, match="cluster aggregate"):
        cluster_agent_permissions(replace(AGENT, emits=(*AGENT.emits, TaskSubmitted)), STAGE, "a", {})


def test_a_clusters_password_is_derived_from_the_key_and_its_launch() -> None:
    key = b"k" * 43
    one = derive_password(key, STAGE, "a", "placement-1")
    assert one == derive_password(key, STAGE, "a", "placement-1")  # a redelivery: the same
    others = {derive_password(key, STAGE, "a", "placement-2"), derive_password(key, STAGE, "b", "placement-1"),
              derive_password(key, "prod", "a", "placement-1"), derive_password(b"x" * 43, STAGE, "a", "placement-1")}
    assert one not in others and len(others) == 4 and len(one) >= 43
    with pytest.raises(ValueError):
        derive_password(b"", STAGE, "a", "p")


def test_which_users_are_kept_minted_and_removed() -> None:
    files = {"up-same": "p1", "up-new-launch": "old", "down": "p3", "launching": "p4"}
    up = {"up-same": "p1", "up-new-launch": "p2", "up-lost-file": "p5"}
    plan = plan_retain(files, up, {"launching"})
    assert plan.mint == {"up-new-launch": "p2", "up-lost-file": "p5"}
    assert plan.remove == ("down",)
    assert plan_retain({}, {}, set()).remove == ()


def test_the_store_keeps_only_a_hash_0600_and_round_trips(tmp_path: Path) -> None:
    store = AgentUserStore(STAGE, tmp_path / "agents", tmp_path / "agents.key")
    creds = store.mint("a", "p1", "t1")
    assert creds.user == "agent@a" and "<hidden>" in repr(creds)
    f = tmp_path / "agents" / "a.json"
    text = f.read_text()
    assert creds.password not in text and (f.stat().st_mode & 0o777) == 0o600
    assert ((tmp_path / "agents.key").stat().st_mode & 0o777) == 0o600
    user = store.read("a")
    assert user is not None and user.task_id == "t1" and check_password(creds.password, user.password_hash)
    before = fingerprint(tmp_path / "agents")
    assert store.mint("a", "p1", "t1") == creds and fingerprint(tmp_path / "agents") == before  # kept as is
    assert store.mint("a", "p2").password != creds.password
    (tmp_path / "agents" / "b.json").write_text(text)  # renamed by hand: names another cluster
    (tmp_path / "agents" / "junk.json").write_text("{")
    assert set(store.users()) == {"a"}
    assert store.remove("a") and not store.remove("a") and store.users() == {}


def test_credentials_travel_in_the_environment_too(tmp_path: Path) -> None:
    creds = BusCredentials("agent@a", "pw")
    assert credentials_from_env(credentials_env(creds)) == creds
    assert credentials_from_env({}) is None
    with pytest.raises(CredentialsError, match="set both"):
        credentials_from_env({USER_ENV: "agent@a"})
    assert set(credentials_env(creds)) == {USER_ENV, PASSWORD_ENV}


def test_bus_addresses_are_checked_at_the_edge() -> None:
    assert parse_advertise("bus.example.com:4222") == "nats://bus.example.com:4222"
    assert parse_advertise("nats://10.0.0.5:4222") == "nats://10.0.0.5:4222"
    assert parse_advertise("[fd00::1]:4222") == "nats://[fd00::1]:4222"
    for bad in ("bus.example.com", "bus:0", "bus:99999", "0.0.0.0:4222", "user@bus:4222", "http://bus/x:1", ":4222",
                "bad host:4222"):
        with pytest.raises(BusAddressError, match="--bus-advertise"):
            parse_advertise(bad)
    assert check_bus_host("0.0.0.0", True) == "0.0.0.0" and check_bus_host("localhost", False) == "127.0.0.1"
    with pytest.raises(BusAddressError, match="needs --deploy"):
        check_bus_host("0.0.0.0", False)
    with pytest.raises(BusAddressError, match="not an IP"):
        check_bus_host("a b", True)
    assert local_host("0.0.0.0") == "127.0.0.1" and local_host("10.0.0.5") == "10.0.0.5"


def test_ec2_user_data_writes_the_clusters_credentials_0600_and_the_launcher_names_them(tmp_path: Path) -> None:
    """The boot script's own lines, run by bash: the file it writes is the agent user's alone
    and the launcher exports its path; without credentials it writes none."""
    import subprocess

    from skypurza.events.agentspec import AgentSpec
    from skypurza.events.natscreds import CREDS_ENV
    from skypurza.services.provisioner import userdata

    spec = AgentSpec(nats_url="nats://bus.example.com:4222", stage=STAGE, cluster="a", rank=0, num_nodes=2)
    creds = BusCredentials("agent@a", derive_password(b"k" * 43, STAGE, "a", "p1"))
    script = userdata.render(spec, install="skypurza", credentials=creds)
    assert userdata.agent_credentials(script) == creds
    assert userdata.agent_credentials(userdata.render(spec, install="skypurza")) is None
    assert "set -x" not in script
    # The credential lines and the launcher, as bash runs them, in a scratch root.
    lines = script.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("(umask 077"))
    end = next(i for i, ln in enumerate(lines) if ln.startswith("{ echo '#!/bin/bash'"))
    root = tmp_path / "opt"
    part = "\n".join(lines[start:end + 1]).replace("/opt/skypurza", str(root))
    root.mkdir()
    per_node = "SPZ_RANK=1 SPZ_INSTANCE_ID=i-1 SPZ_ZONE=z SPZ_HOME=/home/u\n"
    subprocess.run(["bash", "-c", "set -u\n" + per_node + part], check=True, timeout=10)
    written = root / "bus-credentials.json"
    assert (written.stat().st_mode & 0o777) == 0o600 and read_credentials(written) == creds
    assert f"export {CREDS_ENV}={root}/bus-credentials.json" in (root / "agent.sh").read_text()
    assert userdata.agent_argv(script, rank=1, instance_id="i-1")[-1] != creds.password  # not on the command line
    assert creds.password not in " ".join(userdata.agent_argv(script, rank=1, instance_id="i-1"))


# ---------------------------------------------------------------- a real nats-server


class Rig:
    """A secured nats-server whose authorization block the test writes as the supervisor does
    (busauth.prepare) and reloads with SIGHUP."""

    def __init__(self, tmp_path: Path) -> None:
        auth = busauth.prepare(STAGE)
        store = naming.nats_store_dir(STAGE)
        # Included by a path relative to nats.conf, as the supervisor does: a reload reads it again.
        include = f"include {json.dumps(os.path.relpath(auth, store))}\n"
        self.server = NatsServer(store_dir=store, port=free_port(), log_file=tmp_path / "nats.log",
                                 extra_blocks=(include,)).start()
        asyncio.run(busauth.set_up(self.server.url, STAGE))
        self.agents = AgentUserStore(STAGE)

    def reload(self) -> None:
        busauth.prepare(STAGE)
        self.server.process.send_signal(signal.SIGHUP)

    def log(self) -> str:
        return Path(self.server.log_file).read_text(errors="replace")


@pytest.fixture
def rig(tmp_path: Path, spz_home: Path):
    r = Rig(tmp_path)
    yield r
    r.server.stop()
    kill_processes_using(r.server.url)


def _control() -> BusCredentials:
    return read_credentials(credentials_file(naming.bus_credentials_dir(STAGE), naming.BUS_CONTROL_USER))


async def _live(url: str, creds: BusCredentials, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            nc = await nats.connect(url, user=creds.user, password=creds.password, allow_reconnect=False,
                                    connect_timeout=2)
            await nc.close()
            return
        # Not yet known: "Authorization Violation", or the reset of the socket the server closes
        # right after saying so, read before the -ERR line (as _refused_at_connect says).
        except (nats.errors.Error, OSError):
            assert asyncio.get_running_loop().time() < deadline, f"{creds.user} never became live"
            await asyncio.sleep(0.1)


def _node_ready(cluster: str) -> NodeReady:
    return NodeReady(cluster=cluster, rank=0, host="node-0", pid=1)


def test_a_clusters_agent_publishes_its_own_and_is_refused_anothers(rig: Rig) -> None:
    a = rig.agents.mint("a", "pa", "ta")
    b = rig.agents.mint("b", "pb", "tb")
    rig.reload()

    async def main():
        url = rig.server.url
        await _live(url, a)
        await _live(url, b)
        control = await Bus.connect(url, STAGE, source="/tests", credentials=_control())
        agent_a = await Bus.connect(url, STAGE, source="/tests/agent/a", credentials=a, max_reconnect_attempts=0)
        # A's own event, output and beat: stored / delivered.
        ack = await agent_a.publish(_node_ready("a"))
        assert ack.seq >= 1
        log_ack = await agent_a.publish_log("a", 1, 0, "hello from a", seq=1)
        assert log_ack.seq >= 1
        beats: list[str] = []

        async def on_beat(msg) -> None:
            beats.append(msg.subject)

        sub = await control.nc.subscribe(naming.heartbeats_filter(STAGE), cb=on_beat)
        await control.nc.flush()
        assert not await refused(url, a, lambda nc: nc.publish(naming.heartbeat_subject(STAGE, "a", 0), b"{}"))
        # It reads its own cluster's history (the agent's follow and replay).
        mine = [s.event async for s in agent_a.replay(filter_subject=naming.aggregate_subjects(STAGE, "cluster", "a"))]
        assert any(isinstance(e, NodeReady) for e in mine)
        last = await control.last_seq()
        # B's event, output, beat and sample; another aggregate; B's history; every cluster's.
        b_event = naming.event_subject(STAGE, "cluster", "b", NodeReady.EVENT_NAME)
        assert await refused(url, a, lambda nc: nc.jetstream().publish(b_event, _node_ready("b").model_dump_json()
                                                                        .encode(), timeout=1))
        assert await refused(url, a, lambda nc: nc.publish(b_event, b"{}"))
        assert await refused(url, a, lambda nc: nc.publish(naming.log_subject(STAGE, "b", 1, 0), b"x"))
        assert await refused(url, a, lambda nc: nc.publish(naming.heartbeat_subject(STAGE, "b", 0), b"{}"))
        assert await refused(url, a, lambda nc: nc.publish(naming.sample_subject(STAGE, "b", 0), b"{}"))
        assert await refused(url, a, lambda nc: nc.publish(
            naming.event_subject(STAGE, "task", "t9", TaskSubmitted.EVENT_NAME), b"{}"))
        assert await refused(url, a, lambda nc: nc.jetstream().pull_subscribe(
            naming.aggregate_subjects(STAGE, "cluster", "b"), stream=naming.events_stream(STAGE)))
        assert await refused(url, a, lambda nc: nc.jetstream().pull_subscribe(
            naming.all_events_subject(STAGE), stream=naming.events_stream(STAGE)))
        assert await refused(url, a, lambda nc: nc.subscribe(f"{naming.inbox_prefix(b.user)}.>"))
        assert await refused(url, a, lambda nc: nc.subscribe(f"{naming.inbox_prefix('agent')}.>"))
        # Nothing refused reached the stream: not one new event, none on B's subjects.
        assert await control.last_seq() == last
        assert await control.last_event(naming.aggregate_subjects(STAGE, "cluster", "b")) is None
        await asyncio.sleep(0.2)
        assert beats == [naming.heartbeat_subject(STAGE, "a", 0)]
        await sub.unsubscribe()
        # B's own user does publish B's event.
        agent_b = await Bus.connect(url, STAGE, source="/tests/agent/b", credentials=b, max_reconnect_attempts=0)
        assert (await agent_b.publish(_node_ready("b"))).seq > last
        for bus in (agent_a, agent_b, control):
            await bus.close()

    asyncio.run(main())
    # The refusals are the server's, named by user (and A's own work drew none).
    violations = [ln for ln in rig.log().splitlines() if "Violation" in ln]
    assert violations and all("agent@a" in ln for ln in violations), violations[:5]


def test_a_clusters_agent_reads_its_own_secrets_and_no_event_by_sequence(rig: Rig) -> None:
    a = rig.agents.mint("a", "pa", "ta")
    rig.reload()
    bucket = naming.secrets_bucket(STAGE)
    kv_stream, events = f"KV_{bucket}", naming.events_stream(STAGE)

    async def main():
        url = rig.server.url
        await _live(url, a)
        control = await Bus.connect(url, STAGE, source="/tests", credentials=_control())
        # A bucket an older version made without direct gets: set_up gives them (a stream update).
        info = await control.js.stream_info(kv_stream)
        await control.js.update_stream(replace(info.config, allow_direct=False))
        assert not (await control.js.stream_info(kv_stream)).config.allow_direct
        await busauth.set_up(url, STAGE)
        assert (await control.js.stream_info(kv_stream)).config.allow_direct
        await control.put_secrets("job-a", {"TOKEN": "for-a"}, "a")
        await control.put_secrets("job-b", {"TOKEN": "for-b"}, "b")
        await control.put_secrets("job-old", {"TOKEN": "keyed-by-id-only"})
        b_seq = (await control.publish(_node_ready("b"))).seq
        await control.publish(ClusterTerminated(cluster="a", terminated_at=datetime.now(timezone.utc), reason="down"))
        agent_a = await Bus.connect(url, STAGE, source="/tests/agent/a", credentials=a, max_reconnect_attempts=0)
        assert agent_a.user == a.user
        # Its own: the secret under its cluster, and its last event by a direct get of its subject.
        assert await agent_a.get_secrets("job-a", "a", legacy=False) == {"TOKEN": "for-a"}
        last = await agent_a.last_event(naming.event_subject(STAGE, "cluster", "a", ClusterTerminated.EVENT_NAME),
                                        direct=True)
        assert isinstance(last.event, ClusterTerminated)
        # B's secret, under B's key or asked for under A's name; a secret keyed by id alone.
        b_key = f"$JS.API.DIRECT.GET.{kv_stream}.$KV.{bucket}.{naming.secrets_key('job-b', 'b')}"
        assert await refused(url, a, lambda nc: nc.request(b_key, b"", timeout=1))
        assert await refused(url, a, lambda nc: nc.request(
            f"$JS.API.DIRECT.GET.{kv_stream}.$KV.{bucket}.job-old", b"", timeout=1))
        assert await refused(url, a, lambda nc: nc.request(
            f"$JS.API.DIRECT.GET.{kv_stream}.$KV.{bucket}.*.job-b", b"", timeout=1))
        assert await refused(url, a, lambda nc: nc.request(f"$JS.API.STREAM.MSG.GET.{kv_stream}",
                                                            json.dumps({"last_by_subj": b_key}).encode(), timeout=1))
        # B's event by its sequence: neither the stored get nor the direct get with a payload.
        assert await refused(url, a, lambda nc: nc.jetstream().get_msg(events, seq=b_seq))
        assert await refused(url, a, lambda nc: nc.jetstream().get_msg(events, seq=b_seq, direct=True))
        assert await refused(url, a, lambda nc: nc.jetstream().get_last_msg(
            events, naming.event_subject(STAGE, "cluster", "b", NodeReady.EVENT_NAME), direct=True))
        # The shared agent user (local clusters) still reads a secret keyed by id alone.
        shared = await Bus.connect(url, STAGE, source="/tests/agent", credentials=read_credentials(
            credentials_file(naming.bus_credentials_dir(STAGE), AGENT.name)))
        assert await shared.get_secrets("job-old", "local1") == {"TOKEN": "keyed-by-id-only"}
        for bus in (agent_a, shared, control):
            await bus.close()

    asyncio.run(main())
    violations = [ln for ln in rig.log().splitlines() if "Violation" in ln]
    assert violations and all("agent@a" in ln for ln in violations), violations[:5]


def test_a_torn_down_clusters_credentials_are_refused_at_connect(rig: Rig) -> None:
    a = rig.agents.mint("a", "pa", "ta")
    rig.reload()

    async def main():
        url = rig.server.url
        await _live(url, a)
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        connected = await nats.connect(url, user=a.user, password=a.password, allow_reconnect=False,
                                       error_cb=on_error, connect_timeout=3)
        assert rig.agents.remove("a")
        rig.reload()
        deadline = asyncio.get_running_loop().time() + 5
        while not connected.is_closed:  # the reload drops a connection whose user is gone
            assert asyncio.get_running_loop().time() < deadline, "a removed user's connection stayed open"
            await asyncio.sleep(0.05)
        await _refused_at_connect(url, a.user, a.password)
        # The same name launched again is another user: the old password stays dead.
        again = rig.agents.mint("a", "pa-2", "ta-2")
        rig.reload()
        await _live(url, again)
        await _refused_at_connect(url, a.user, a.password)

    asyncio.run(main())


async def _refused_at_connect(url: str, user: str, password: str, attempts: int = 3) -> None:
    """The server says Authorization Violation. It closes the socket right after saying so, and now
    and then the client reads the reset before the -ERR line: such an attempt is tried again, but a
    connect that succeeds fails the test at once, and so do `attempts` resets without the answer."""
    resets = []
    for _ in range(attempts):
        try:
            nc = await nats.connect(url, user=user, password=password, allow_reconnect=False, connect_timeout=3)
        except nats.errors.Error as exc:
            if "Authorization Violation" in str(exc):
                return
            resets.append(repr(exc))
        except (ConnectionResetError, BrokenPipeError) as exc:
            resets.append(repr(exc))
        else:
            await nc.close()
            pytest.fail(f"{user} connected with a removed password")
    pytest.fail(f"no Authorization Violation in {attempts} connects: {resets}")


def _provisioned(cluster: str, placement_id: str, infra: str) -> ClusterProvisioned:
    return ClusterProvisioned(cluster=cluster, task_id=f"t-{cluster}", placement_id=placement_id,
                              candidate=Candidate(infra=infra, region="us-east-1", instance_type="m5.large"),
                              nodes=[NodeInfo(instance_id=f"i-{cluster}", rank=0)], hourly_price_micros=1,
                              launched_at=datetime.now(timezone.utc))


def test_a_restarted_control_plane_re_derives_the_users_of_the_clusters_still_up(rig: Rig, monkeypatch) -> None:
    """What a crash leaves: a user for a cluster torn down meanwhile, none for a cluster that is
    up (its file lost), a launch in flight. The provisioner's start makes the set the log's."""
    from skypurza.services.provisioner.service import ProvisionerService
    from skypurza.services.provisioner.settings import ProvisionerSettings

    monkeypatch.setenv(AGENT_USERS_ENV, PER_CLUSTER)
    up_creds = rig.agents.credentials("up", "p-up")  # what the nodes of `up` were given
    rig.agents.mint("gone", "p-gone", "t-gone")
    rig.agents.mint("inflight", "p-fly", "t-inflight")
    gone_creds = rig.agents.credentials("gone", "p-gone")

    async def main():
        url = rig.server.url
        control = await Bus.connect(url, STAGE, source="/tests", credentials=_control())
        await control.publish(_provisioned("up", "p-up", "aws"))
        await control.publish(_provisioned("gone", "p-gone", "kubernetes"))
        await control.publish(ClusterTerminated(cluster="gone", terminated_at=datetime.now(timezone.utc),
                                                reason="down", instance_ids=["i-gone"]))
        await control.publish(_provisioned("local1", "p-local", "local"))  # the shared agent user's
        await control.publish(PlacementChosen(task_id="t-inflight", cluster="inflight", attempt=1,
                                              candidate=Candidate(infra="aws", region="us-east-1")))
        provisioner = await Bus.connect(url, STAGE, source="/tests/provisioner", credentials=read_credentials(
            credentials_file(naming.bus_credentials_dir(STAGE), "provisioner")))
        svc = ProvisionerService(ProvisionerSettings(reconcile_interval_s=0, cleanup_interval_s=0))
        await svc.start(provisioner)
        await asyncio.wait_for(svc._agent_sync, 20)
        assert set(rig.agents.users()) == {"up", "inflight"}
        rig.reload()
        await _live(url, up_creds)  # the nodes of `up` connect again with what they hold
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(url, user=gone_creds.user, password=gone_creds.password, allow_reconnect=False,
                               connect_timeout=3)
        await svc.close()
        await provisioner.close()
        await control.close()

    asyncio.run(main())


@pytest.mark.parametrize("mints", [False, True], ids=["no-users", "users-but-no-address"])
def test_a_remote_launch_whose_agents_could_not_join_is_refused_before_any_machine(rig: Rig, monkeypatch,
                                                                                  tmp_path: Path, mints: bool) -> None:
    """A secured bus whose deployment mints no per-cluster agent users (the CDK app): an EC2 or
    Kubernetes cluster's agents could never join it, so the provisioner refuses the launch at
    once (ProvisionFailed, error class auth: the optimizer blocks the whole infra) and never asks
    the backend; a local cluster is not refused. The same where users are minted but the
    deployment says remote agents need an address of their own and none is set (compose:
    SKYPURZA_AGENT_NATS_URL_REQUIRED without SKYPURZA_AGENT_NATS_URL)."""
    from skypurza.events.models import ProvisionFailed
    from skypurza.events.service import ServiceRunner
    from skypurza.services.provisioner.service import ProvisionerService
    from skypurza.services.provisioner.settings import ProvisionerSettings

    if mints:
        monkeypatch.setenv(AGENT_USERS_ENV, PER_CLUSTER)
        monkeypatch.setenv(naming.BUS_AGENTS_DIR_ENV, str(tmp_path / "agents-volume"))
    else:
        monkeypatch.delenv(AGENT_USERS_ENV, raising=False)
    code, says = ("NoAgentBusAddress", "SKYPURZA_AGENT_NATS_URL") if mints else ("NoAgentBusUser",
                                                                                   "spz api start --deploy")

    async def main():
        url = rig.server.url
        control = await Bus.connect(url, STAGE, source="/tests", credentials=_control())
        for cluster, infra in (("onaws", "aws"), ("onk8s", "kubernetes")):
            await control.publish(TaskSubmitted(task_id=f"t-{cluster}", cluster=cluster, task={"run": "echo hi"}))
            await control.publish(PlacementChosen(task_id=f"t-{cluster}", cluster=cluster, attempt=1,
                                                  candidate=Candidate(infra=infra, region="us-east-1",
                                                                      instance_type="m5.large")))
        provisioner = await Bus.connect(url, STAGE, source="/tests/provisioner", credentials=read_credentials(
            credentials_file(naming.bus_credentials_dir(STAGE), "provisioner")))
        asked: list[str] = []

        class Recorder:  # stands in for the EC2 and Kubernetes backends: anything asked of it is recorded
            def __getattr__(self, name: str):
                asked.append(name)
                raise AssertionError(f"the backend was asked for {name}")

        svc = ProvisionerService(ProvisionerSettings(reconcile_interval_s=0, cleanup_interval_s=0,
                                                     agent_nats_url_required=True),
                                 backends={"aws": Recorder(), "kubernetes": Recorder()})
        runner = ServiceRunner(provisioner, svc)
        task = asyncio.create_task(runner.run())
        failed: list[ProvisionFailed] = []
        try:
            for _ in range(200):
                failed = [s.event async for s in control.replay(
                    filter_subject=naming.event_filter(STAGE, "task", "provision_failed"))
                    if isinstance(s.event, ProvisionFailed)]
                if len(failed) == 2:
                    break
                await asyncio.sleep(0.1)
        finally:
            runner.stop()
            await asyncio.wait_for(task, 30)
        assert sorted(f.cluster for f in failed) == ["onaws", "onk8s"], failed
        assert all(f.code == code and f.error_class == "auth" and says in f.message for f in failed), failed
        assert asked == []  # no backend was asked: no machine was started
        assert not list((tmp_path / "agents-volume").glob("*.json"))  # nor a user minted
        assert svc._no_agent_bus("local") is None and svc._no_agent_bus("slurm") is None
        await provisioner.close()
        await control.close()

    asyncio.run(main())


# ---------------------------------------------------------------- end to end: spz api start --deploy


DEPLOY_STAGE = "agentcreds"


def _deploy_env(home: Path, kubeconfig: Path) -> dict[str, str]:
    env = {**os.environ, "SKYPURZA_HOME": str(home), "SKYPURZA_STAGE": DEPLOY_STAGE, "SKYPURZA_USER": "osuser",
           "SKYPURZA_KUBECONFIG": str(kubeconfig), "SKYPURZA_K8S_CONTEXTS": "roomy",
           "SKYPURZA_K8S_PROVISION_TIMEOUT_S": "30", "SKYPURZA_ENABLED_INFRAS": "kubernetes",
           "SKYPURZA_LIVE_SPOT_PRICES": "0", "SKYPURZA_RECONCILE_INTERVAL_S": "0", "SKYPURZA_CLEANUP_INTERVAL_S": "0",
           "SKYPURZA_AGENT_KILL_GRACE_S": "1", "COLUMNS": "200"}
    for var in ("SKYPURZA_NATS_URL", "SKYPURZA_NATS_PORT", "SKYPURZA_API_SERVER", "SKYPURZA_API_TOKEN",
                "SKYPILOT_API_SERVER_ENDPOINT", "SKYPILOT_API_SERVER_LOCAL_PORT", "SKYPURZA_NATS_CREDS",
                "SKYPURZA_AGENT_NATS_URL", USER_ENV, PASSWORD_ENV, AGENT_USERS_ENV):
        env.pop(var, None)
    return env


def _spz(env: dict[str, str], *args: str, timeout: float = 120):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def kube(tmp_path: Path):
    from kube_emulator import Kubelet, KubeCluster, write_kubeconfig

    roomy = KubeCluster("roomy").start()
    roomy.add_node("roomy-cpu", cpus=32, memory_gib=128)
    write_kubeconfig(tmp_path / "kubeconfig", {"roomy": roomy})
    scheduler = roomy.schedule(lambda pod: None)
    kubelet = Kubelet(roomy, tmp_path / "pods", env={"SKYPURZA_AGENT_HEARTBEAT_S": "1", "SKYPURZA_AGENT_SAMPLE_S": "0"})
    yield roomy, kubelet, tmp_path / "kubeconfig"
    kubelet.stop()
    scheduler.stop()
    rejected = roomy.rejected()
    roomy.stop()
    assert not rejected, rejected


@pytest.fixture
def deploy_home(tmp_path: Path):
    home = tmp_path / "home"
    yield home
    _spz(_deploy_env(home, tmp_path / "kubeconfig"), "api", "stop", timeout=90)
    sd = home / DEPLOY_STAGE
    kill_stage(home, DEPLOY_STAGE)
    try:
        kill_processes_using(f"nats://127.0.0.1:{(sd / 'nats.port').read_text().strip()}")
    except (OSError, ValueError):
        pass


def test_a_deployments_pods_carry_their_clusters_own_credentials(kube, deploy_home: Path) -> None:
    """`spz api start --deploy --bus-host 0.0.0.0 --bus-advertise ...` with a Kubernetes context:
    the pods' agents are given the advertised address and the cluster's own user (never the
    shared agent's or a service's), run the job with its secret with not one refusal, and their
    credentials die with the cluster."""
    import httpx

    roomy, kubelet, kubeconfig = kube
    env = _deploy_env(deploy_home, kubeconfig)
    port, nats_port = free_port(), free_port()
    advertised = f"127.0.0.1:{nats_port}"
    bad = _spz(env, "api", "start", "--deploy", "--bus-advertise", "nowhere", "--nats-port", str(nats_port))
    assert bad.returncode == 2 and "--bus-advertise 'nowhere'" in bad.stderr and "Traceback" not in bad.stderr
    open_bus = _spz(env, "api", "start", "--bus-host", "0.0.0.0")
    assert open_bus.returncode == 2 and "needs --deploy" in open_bus.stderr
    started = _spz(env, "api", "start", "--deploy", "--host", "127.0.0.1", "--port", str(port), "--nats-port",
                   str(nats_port), "--bus-host", "0.0.0.0", "--bus-advertise", advertised, "-o", "json")
    assert started.returncode == 0, started.stderr
    st = json.loads(started.stdout)
    api, admin = st["api_url"], st["admin"]["token"]
    sd = deploy_home / DEPLOY_STAGE
    assert f"listen: 0.0.0.0:{nats_port}" in (sd / "jetstream" / "nats.conf").read_text()
    shared = {f.stem: json.loads(f.read_text())["password"] for f in (sd / "bus-users").glob("*.json")}

    headers = {"Authorization": f"Bearer {admin}"}
    r = httpx.post(f"{api}/api/v1/tasks", headers=headers, timeout=20,
                   json={"task": {"resources": {"infra": "k8s", "cpus": 1}, "secrets": {"POD_TOKEN": "pod-s3cret"},
                                  # Succeeds only if the pod's agent read the secret under its own cluster.
                                  "run": 'test "$POD_TOKEN" = pod-s3cret && echo hello-from-a-pod'},
                         "cluster": "kc1"})
    assert r.status_code == 202, r.text

    control_creds = read_credentials(credentials_file(sd / "bus-users", naming.BUS_CONTROL_USER))

    async def job_succeeded() -> None:
        from skypurza.events.models import JobSucceeded

        bus = await Bus.connect(st["nats_url"], DEPLOY_STAGE, source="/tests", credentials=control_creds)
        try:
            deadline = asyncio.get_running_loop().time() + 90
            while True:
                seen = [s.event async for s in bus.replay(
                    filter_subject=naming.aggregate_subjects(DEPLOY_STAGE, "cluster", "kc1"))]
                if any(isinstance(e, JobSucceeded) for e in seen):
                    return
                assert asyncio.get_running_loop().time() < deadline, [type(e).__name__ for e in seen]
                await asyncio.sleep(0.3)
        finally:
            await bus.close()

    asyncio.run(job_succeeded())
    pods = roomy.pods()
    assert pods
    secret_name = naming.k8s_secret(DEPLOY_STAGE, "kc1")
    [secret] = [s for s in roomy.secrets() if s["metadata"]["name"] == secret_name]
    assert naming.k8s_labels(DEPLOY_STAGE, "kc1").items() <= secret["metadata"]["labels"].items()
    assert "stringData" not in secret  # stored as `data`, as the API server does
    ns = secret["metadata"]["namespace"]
    password = roomy.secret_value(ns, secret_name, PASSWORD_ENV)
    assert roomy.secret_value(ns, secret_name, USER_ENV) == naming.cluster_agent_user("kc1")
    assert password and password not in shared.values()
    for pod in pods:
        container = pod["spec"]["containers"][0]
        by_name = {e["name"]: e for e in container.get("env") or []}
        for key in (USER_ENV, PASSWORD_ENV):  # from the Secret, never a plain value in the pod spec
            assert "value" not in by_name[key]
            assert by_name[key]["valueFrom"] == {"secretKeyRef": {"name": secret_name, "key": key}}
        assert password not in json.dumps(pod)
        assert "SKYPURZA_NATS_CREDS" not in by_name
        assert container["command"][container["command"].index("--nats") + 1] == f"nats://{advertised}"
    pod_creds = BusCredentials(naming.cluster_agent_user("kc1"), password)
    assert (sd / "bus-agents" / "kc1.json").exists()

    down = httpx.post(f"{api}/api/v1/clusters/kc1/down", headers=headers, timeout=20)
    assert down.status_code == 202, down.text

    async def refused_after_teardown() -> None:
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            try:
                nc = await nats.connect(st["nats_url"], user=pod_creds.user, password=pod_creds.password,
                                        allow_reconnect=False, connect_timeout=2)
                await nc.close()
            except nats.errors.Error as exc:
                assert "Authorization Violation" in str(exc)
                return
            except (ConnectionResetError, BrokenPipeError):
                pass  # the server resets the socket right after its -ERR: the client may read the reset first
            assert asyncio.get_running_loop().time() < deadline, "the torn-down cluster's user still connects"
            await asyncio.sleep(0.3)

    asyncio.run(refused_after_teardown())
    assert not (sd / "bus-agents" / "kc1.json").exists()
    gone_by = time.monotonic() + 30  # the Secret goes with the cluster's pods: no orphan
    while any(s["metadata"]["name"] == secret_name for s in roomy.secrets()) and time.monotonic() < gone_by:
        time.sleep(0.2)
    assert [s["metadata"]["name"] for s in roomy.secrets()] == []
    assert roomy.pods() == []
    log = (sd / "logs" / "nats-server.log").read_text(errors="replace")
    refused = [ln for ln in log.splitlines() if "Publish Violation" in ln or "Subscription Violation" in ln]
    assert not refused, refused[:10]
    for f in (sd / "logs").glob("*.log"):
        assert pod_creds.password not in f.read_text(errors="replace"), f


def test_minters_drawing_the_key_at_once_all_get_the_one_key_never_an_empty_one(spz_home: Path) -> None:
    """The stage's key is drawn by whichever minter comes first; minters at the same moment (two
    provisioner handlers) must all get that one key, whole: an O_EXCL create of the key file let
    a second minter read it empty between the create and the write (seen in a CI run)."""
    import threading

    for round_ in range(20):
        stores = [AgentUserStore(f"race{round_}") for _ in range(12)]
        start = threading.Barrier(len(stores))
        keys: list[bytes] = []
        errors: list[BaseException] = []

        def draw(store: AgentUserStore) -> None:
            start.wait()
            try:
                keys.append(store._key())
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=draw, args=(s,)) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and len(keys) == len(stores) and len(set(keys)) == 1 and keys[0], (errors, set(keys))
        assert not list(stores[0].key_file.parent.glob("*.tmp"))  # no draw's file left behind


def test_the_supervisor_writes_the_block_and_reloads_once_for_two_provisions_at_once(spz_home: Path) -> None:
    """Two clusters minted at the same moment (two provisioner handlers): the supervisor's next
    look writes one block holding both and sends one SIGHUP; the look after finds nothing new."""
    import os as _os
    import threading

    from skypurza.cli.supervisor import Supervisor

    sup = Supervisor("sup", free_port(), "optimizer", deploy=True)
    env = {**_os.environ, "PYTHONUNBUFFERED": "1"}
    sup.nats.spawn(env)
    try:
        assert sup._wait_listening(10)
        store = AgentUserStore("sup")
        got: dict[str, BusCredentials] = {}
        threads = [threading.Thread(target=lambda c=c: got.__setitem__(c, store.mint(c, f"p-{c}", f"t-{c}")))
                   for c in ("x1", "x2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        block = naming.bus_auth_file("sup")
        assert "agent@x1" not in block.read_text()
        sup._next_agents_look = 0.0
        assert sup._reload_agent_users() is True
        text = block.read_text()
        assert "agent@x1" in text and "agent@x2" in text
        assert got["x1"].password not in text and got["x2"].password not in text  # hashes only
        sup._next_agents_look = 0.0
        assert sup._reload_agent_users() is False  # nothing new: no second reload

        async def both_live() -> None:
            for creds in got.values():
                await _live(sup.url, creds)

        asyncio.run(both_live())
        # The services process is told to mint per-cluster users (and nothing else is).
        assert sup.services.own_env[AGENT_USERS_ENV] == PER_CLUSTER
    finally:
        sup._stop_child(sup.nats)


def test_the_supervisor_refuses_a_bus_off_loopback_without_a_deployment(spz_home: Path, capsys) -> None:
    from skypurza.cli.supervisor import main

    assert main(["--stage", "sup2", "--port", str(free_port()), "--bus-host", "0.0.0.0",
                 "--control-plane", str(spz_home / "sup2")]) == 3
    assert "needs --deploy" in capsys.readouterr().out
    assert main(["--stage", "sup2", "--port", str(free_port()), "--deploy", "--bus-advertise", "0.0.0.0:1",
                 "--control-plane", str(spz_home / "sup2")]) == 3
    assert "not an address a node can reach" in capsys.readouterr().out
