"""A deployment's secured bus, derived from the declared contracts (pure: no I/O, no randomness).

Each actor with a contract (every service, the node agent, the API server, the mirror) is one
nats-server user whose permissions are what its contract declares and nothing more:

- publish: the subjects of the event types it `emits`, its dead-letter subject, and what its
  `bus` (events/contract.BusAccess) names: queries it asks, logs, secrets, objects, beats,
  samples, the public mirror, the dead letters and the consumer list it reads;
- its own durable consumer (a `ServiceContract`): create, info, fetch and `$JS.ACK` on it;
- reading the event log (replays, follows and direct gets, which every service does to decide:
  the contract's `reads`), but never another service's durable (denied by name, derived from
  the other contracts), and never a stream's create, update, delete or purge;
- subscribe: its own inbox (`naming.inbox_prefix`: replies of one user are not another's), the
  query subjects it answers, beats or samples it reads.

In a deployment each cluster on remote nodes gets its own agent user besides (`agent@<cluster>`,
`cluster_agent_permissions`): the agent's grants narrowed to that cluster's subject tokens.

Two users have no contract: `control` (the deployment's set-up on the server host: streams,
buckets, the first admin; full access) and `public` (outsiders: subscribe to the CloudEvents
mirror, publish nothing). The CLI has no user: laptops talk to the API server, never the bus.
Nobody is anonymous: `no_auth_user` is never set, so a client without a password is refused.

The text is nats-server's `authorization {}` block, in one (the global) account where the
streams live; a cluster's `cluster {}` block goes beside it (events/natsserver.py `extra_blocks`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from . import naming
from .contract import Contract, ServiceContract

JS_API = "$JS.API"


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_publish: tuple[str, ...] = ()
    deny_subscribe: tuple[str, ...] = ()
    allow_responses: bool = False  # may answer the requests it received (queries it serves)
    full: bool = False  # the control user: everything


@dataclass(frozen=True)
class BusUser:
    name: str
    permissions: Permissions


def _dedup(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def read_stream(stream: str) -> list[str]:
    """What reading a stream takes: its info, direct and stored gets, and consumers it names and
    deletes itself (replays, follows: `$JS.API.CONSUMER.CREATE.<stream>.<name>[.<filter>]`)."""
    return [f"{JS_API}.STREAM.INFO.{stream}", f"{JS_API}.DIRECT.GET.{stream}", f"{JS_API}.DIRECT.GET.{stream}.>",
            f"{JS_API}.STREAM.MSG.GET.{stream}", f"{JS_API}.CONSUMER.CREATE.{stream}",
            f"{JS_API}.CONSUMER.CREATE.{stream}.>", f"{JS_API}.CONSUMER.INFO.{stream}.*",
            f"{JS_API}.CONSUMER.DELETE.{stream}.*", f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.*"]


def durable(stage: str, stream: str, name: str) -> list[str]:
    """A durable consumer's own subjects: created (both APIs), read, fetched and acked."""
    return [f"{JS_API}.CONSUMER.CREATE.{stream}.{name}", f"{JS_API}.CONSUMER.CREATE.{stream}.{name}.>",
            f"{JS_API}.CONSUMER.DURABLE.CREATE.{stream}.{name}", f"{JS_API}.CONSUMER.INFO.{stream}.{name}",
            f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.{name}", f"$JS.ACK.{stream}.{name}.>"]


def others_durable(stream: str, name: str) -> list[str]:
    """Denied: any consumer API call on another service's durable, and acking its messages."""
    return [f"{JS_API}.CONSUMER.*.{stream}.{name}", f"{JS_API}.CONSUMER.*.{stream}.{name}.>",
            f"{JS_API}.CONSUMER.*.*.{stream}.{name}", f"$JS.ACK.{stream}.{name}.>"]


def _kv(bucket: str, access: str) -> list[str]:
    stream = f"KV_{bucket}"
    out = [f"{JS_API}.STREAM.INFO.{stream}", f"{JS_API}.DIRECT.GET.{stream}.>", f"{JS_API}.STREAM.MSG.GET.{stream}"]
    if access == "write":
        out.append(f"$KV.{bucket}.>")
    return out


def _objects(bucket: str, access: str) -> list[str]:
    stream = f"OBJ_{bucket}"
    out = read_stream(stream) + ["$JS.FC.>"]  # an object's chunks come through a consumer with flow control
    if access == "write":
        out += [f"$O.{bucket}.>", f"{JS_API}.STREAM.PURGE.{stream}"]  # a re-put purges the old chunks
    return out


def durable_names(stage: str, contracts: Iterable[Contract]) -> dict[str, str]:
    """Contract name -> its durable consumer (ServiceContracts only: a loop reads by itself)."""
    return {c.name: naming.consumer(stage, c.name) for c in contracts if isinstance(c, ServiceContract)}


def contract_permissions(contract: Contract, stage: str, durables: Mapping[str, str]) -> Permissions:
    """What `contract`'s user may do on `stage`'s bus: its contract, and nothing else."""
    p = naming.subject_prefix(stage)
    events, logs, dlq = naming.events_stream(stage), naming.logs_stream(stage), naming.dead_letter_stream(stage)
    access = contract.bus
    pub: list[str] = [naming.event_filter(stage, cls.AGGREGATE, cls.EVENT_NAME) for cls in contract.emits]
    pub += read_stream(events)
    # Every bus checks its streams on connect (`Bus.ensure_streams`): their info, never a create.
    pub += [f"{JS_API}.STREAM.INFO.{logs}", f"{JS_API}.STREAM.INFO.{dlq}"]
    pub.append(naming.dead_letter_subject(stage, contract.name))
    if contract.name in durables:
        pub += durable(stage, events, durables[contract.name])
    deny = [d for name, other in durables.items() if name != contract.name for d in others_durable(events, other)]
    sub: list[str] = [f"{naming.inbox_prefix(contract.name)}.>"]
    if access.answers:
        sub.append(f"{p}.query.{access.answers}.*")
    pub += [f"{p}.query.{svc}.*" for svc in access.asks]
    if access.logs:
        pub += read_stream(logs)
        if access.logs == "write":
            pub.append(naming.all_logs_subject(stage))
    if access.secrets:
        pub += _kv(naming.secrets_bucket(stage), access.secrets)
    if access.objects:
        pub += _objects(naming.objects_bucket(stage), access.objects)
    if access.dead_letters:  # only read: each service parks on its own subject (above)
        pub += read_stream(dlq)
    if access.consumers:  # every durable's state in one answer; never another's messages or acks
        pub += [f"{JS_API}.CONSUMER.LIST.{events}", f"{JS_API}.CONSUMER.NAMES.{events}"]
    for what, filt in (("beats", naming.heartbeats_filter(stage)), ("samples", naming.samples_filter(stage)),
                       ("public", naming.public_filter(stage))):
        level = getattr(access, what)
        if level == "write":
            pub.append(filt)
        elif level == "read":
            sub.append(filt)
    return Permissions(publish=_dedup(pub), subscribe=_dedup(sub), deny_publish=_dedup(deny),
                       allow_responses=bool(access.answers))


def cluster_agent_permissions(agent: Contract, stage: str, cluster: str, durables: Mapping[str, str]) -> Permissions:
    """The node agent's grants (its contract's, `contract_permissions`) narrowed to one cluster:
    the user a deployment gives that cluster's nodes (events/agentusers.py). Every subject that
    names a cluster gets this cluster's token: its events (`evt.cluster.<c>.<type>`), its job
    output (`log.<c>.>`), its beats and samples (`hb.<c>.*`, `sample.<c>.*`), the consumers it
    creates (only with a filter inside its own events or logs: nats-server checks that the
    filter in the request is the one in the subject), its own inbox, and its own secrets (the
    bucket's keys under its cluster, `naming.secrets_key`, by direct get). Gets by sequence
    (`STREAM.MSG.GET`, and the direct get whose request names what to read in its payload) are
    not granted on the event, output and secrets streams: they could read any subject. What
    names no cluster stays as the shared agent has it: stream info and the uploads store
    (content-addressed). A node can therefore never publish as another cluster's node, nor read
    another cluster's events, output or secrets."""
    tok = naming.subject_token(cluster)
    p = naming.subject_prefix(stage)
    events, logs = naming.events_stream(stage), naming.logs_stream(stage)
    kv = f"KV_{naming.secrets_bucket(stage)}"
    own_events = naming.aggregate_subjects(stage, "cluster", cluster)
    own_logs = naming.logs_subject_filter(stage, cluster)
    narrowed: dict[str, list[str]] = {
        naming.all_logs_subject(stage): [own_logs],
        naming.heartbeats_filter(stage): [f"{p}.hb.{tok}.*"],
        naming.samples_filter(stage): [f"{p}.sample.{tok}.*"],
        f"{JS_API}.DIRECT.GET.{events}.>": [f"{JS_API}.DIRECT.GET.{events}.{own_events}"],
        f"{JS_API}.DIRECT.GET.{logs}.>": [f"{JS_API}.DIRECT.GET.{logs}.{own_logs}"],
        f"{JS_API}.DIRECT.GET.{kv}.>": [f"{JS_API}.DIRECT.GET.{kv}.{naming.secrets_cluster_keys(stage, cluster)}"],
        # Gets whose subject names no subject (a sequence, or a filter, in the payload).
        f"{JS_API}.DIRECT.GET.{events}": [], f"{JS_API}.STREAM.MSG.GET.{events}": [],
        f"{JS_API}.DIRECT.GET.{logs}": [], f"{JS_API}.STREAM.MSG.GET.{logs}": [],
        f"{JS_API}.STREAM.MSG.GET.{kv}": [],
        # Unfiltered creates (`CONSUMER.CREATE.<stream>`, `.<name>`) would read every cluster.
        f"{JS_API}.CONSUMER.CREATE.{events}": [],
        f"{JS_API}.CONSUMER.CREATE.{events}.>": [f"{JS_API}.CONSUMER.CREATE.{events}.*.{own_events}"],
        f"{JS_API}.CONSUMER.CREATE.{logs}": [],
        f"{JS_API}.CONSUMER.CREATE.{logs}.>": [f"{JS_API}.CONSUMER.CREATE.{logs}.*.{own_logs}"],
    }
    for cls in agent.emits:
        if cls.AGGREGATE != "cluster":  # a new agent event elsewhere needs its own narrowing here
            raise ValueError(f"{agent.name} emits {cls.__name__} on aggregate {cls.AGGREGATE!r}: "
                             "a cluster's agent user can only be narrowed on the cluster aggregate")
        narrowed[naming.event_filter(stage, "cluster", cls.EVENT_NAME)] = [
            naming.event_filter(stage, "cluster", cls.EVENT_NAME, cluster)]
    base = contract_permissions(agent, stage, durables)
    inbox = {f"{naming.inbox_prefix(agent.name)}.>": [f"{naming.inbox_prefix(naming.cluster_agent_user(cluster))}.>"]}
    return Permissions(publish=_dedup(n for s in base.publish for n in narrowed.get(s, [s])),
                       subscribe=_dedup(n for s in base.subscribe for n in inbox.get(s, [s])),
                       deny_publish=base.deny_publish, allow_responses=False)


def cluster_agent_users(agent: Contract, stage: str, clusters: Iterable[str],
                        contracts: Sequence[Contract]) -> list[BusUser]:
    """One narrowed user per cluster (`naming.cluster_agent_user`), denied every durable as the
    shared agent is (`contracts`: the deployment's)."""
    durables = durable_names(stage, contracts)
    return [BusUser(naming.cluster_agent_user(c), cluster_agent_permissions(agent, stage, c, durables))
            for c in sorted(set(clusters))]


def public_permissions(stage: str) -> Permissions:
    """Outsiders: subscribe to the CloudEvents mirror; publish nothing at all (not even a request)."""
    return Permissions(publish=(), subscribe=(naming.public_filter(stage),), deny_publish=(">",))


def deployment_users(stage: str, contracts: Sequence[Contract]) -> list[BusUser]:
    """Every user of a deployment: one per contract (by its name), `control`, `public`."""
    names = [c.name for c in contracts]
    clash = {n for n in names if names.count(n) > 1} | ({naming.BUS_CONTROL_USER, naming.BUS_PUBLIC_USER} & set(names))
    if clash:
        raise ValueError(f"bus users must be unique: {', '.join(sorted(clash))}")
    durables = durable_names(stage, contracts)
    users = [BusUser(c.name, contract_permissions(c, stage, durables)) for c in contracts]
    users.append(BusUser(naming.BUS_CONTROL_USER, Permissions(publish=(">",), subscribe=(">",), full=True)))
    users.append(BusUser(naming.BUS_PUBLIC_USER, public_permissions(stage)))
    return users


def _list(items: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def _permissions_text(p: Permissions) -> str:
    if p.full:
        return "{publish: \">\", subscribe: \">\"}"
    pub = f"allow: {_list(p.publish)}" if p.publish else ""
    if p.deny_publish:
        pub += (", " if pub else "") + f"deny: {_list(p.deny_publish)}"
    sub = f"allow: {_list(p.subscribe)}"
    if p.deny_subscribe:
        sub += f", deny: {_list(p.deny_subscribe)}"
    responses = ", allow_responses: true" if p.allow_responses else ""
    return f"{{publish: {{{pub}}}, subscribe: {{{sub}}}{responses}}}"


def authorization_block(users: Sequence[BusUser], passwords: Mapping[str, str]) -> str:
    """nats-server's `authorization {}`: every user with its password and permissions. JSON
    strings are nats-server config strings (quoted, so `$JS` is no variable)."""
    missing = [u.name for u in users if not passwords.get(u.name)]
    if missing:
        raise ValueError(f"no password for bus user(s): {', '.join(missing)}")
    lines = ["authorization {", "  users: ["]
    for u in users:
        lines.append(f"    {{user: {json.dumps(u.name)}, password: {json.dumps(passwords[u.name])}, "
                     f"permissions: {_permissions_text(u.permissions)}}}")
    lines += ["  ]", "}", ""]
    return "\n".join(lines)
