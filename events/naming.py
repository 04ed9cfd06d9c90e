"""The one naming module: every stream, subject, consumer, bucket, file, cloud resource and tag.

`name(stage, component, purpose)` gives `skypurza-<stage>-<component>-<purpose>`; everything
else here is built from it (or, for NATS subjects, which use dots, from `subject_prefix`).
No other module writes a resource name: a test greps the tree for literal `skypurza-`.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

PROJECT = "skypurza"
DEFAULT_STAGE = "dev"

_STAGE_RE = re.compile(r"^[a-z0-9][a-z0-9_]{0,23}$")
_PART_RE = re.compile(r"^[a-z0-9][a-z0-9_.]*$")


def check_stage(stage: str) -> str:
    """A stage is a short lower-case token: it ends up in stream, bucket and AWS names."""
    if not _STAGE_RE.match(stage):
        raise ValueError(
            f"invalid stage {stage!r}: use 1-24 lower-case letters, digits or '_', starting with a letter or digit"
        )
    return stage


# Clusters: SkyPilot's rule; a cluster's name is a subject token and part of resource names.
# The CLI (-c), the API server and generated names all use these (cli/bounds.py, cli/submit.py,
# services/api/tasks.py).
CLUSTER_NAME_RE = re.compile(r"[a-zA-Z]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?")
MAX_CLUSTER_NAME_CHARS = 63  # = events/limits.MAX_CLUSTER_NAME_CHARS (a DNS label)
CLUSTER_NAME_RULE = ("use letters, digits, '-', '_' and '.', starting with a letter and ending with a letter or "
                     f"digit (at most {MAX_CLUSTER_NAME_CHARS})")


def valid_cluster_name(value: str) -> bool:
    return len(value) <= MAX_CLUSTER_NAME_CHARS and CLUSTER_NAME_RE.fullmatch(value) is not None


def generated_cluster_name(user: str, token: str) -> str:
    """A made-up cluster name, like SkyPilot's `sky-<hex>-<user>`: `token` is a few random hex
    digits (the caller draws them), `user` is reduced to what a name may hold."""
    who = re.sub(r"[^a-z0-9]", "", user.lower())[:12] or "user"
    return f"spz-{token}-{who}"


# Users and teams (events/identity_events.py): one subject token each, so no '.', '*', '>', '/',
# spaces or upper case; short enough for a CloudEvents extension value and a DuckDB key.
PRINCIPAL_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"  # also the API server's path and body rule
_PRINCIPAL_RE = re.compile(PRINCIPAL_NAME_PATTERN)
PRINCIPAL_NAME_RULE = "1-63 lower-case letters, digits, '-' or '_', starting with a letter or digit"


def check_principal_name(value: object, what: str = "name") -> str:
    """A user or team name, checked at the edge (CLI, API server); ValueError says what is accepted."""
    if not isinstance(value, str) or not _PRINCIPAL_RE.fullmatch(value):  # `$` would pass a trailing newline
        shown = repr(value) if not isinstance(value, str) or len(value) <= 70 else repr(value[:67] + "...")
        raise ValueError(f"invalid {what} {shown}: use {PRINCIPAL_NAME_RULE} (no '.', '*', '>', '/' or spaces)")
    return value


def name(stage: str, component: str, purpose: str) -> str:
    """`skypurza-<stage>-<component>-<purpose>`: the one shape of every resource name."""
    check_stage(stage)
    for part in (component, purpose):
        if not _PART_RE.match(part):
            raise ValueError(f"invalid name part {part!r}")
    return f"{PROJECT}-{stage}-{component}-{purpose}"


# ---------------------------------------------------------------- NATS: streams, subjects, consumers

def events_stream(stage: str) -> str:
    return name(stage, "bus", "events")


def logs_stream(stage: str) -> str:
    return name(stage, "bus", "logs")


def dead_letter_stream(stage: str) -> str:
    return name(stage, "bus", "deadletters")


def nats_cluster_name(stage: str) -> str:
    """The `cluster { name }` every node of a stage's JetStream cluster shares (events/natscluster.py)."""
    return name(stage, "bus", "cluster")


def nats_server_name(stage: str, index: int) -> str:
    """One node's `server_name` (1-based): unique in the cluster, stable across its restarts
    (JetStream's RAFT groups know a peer by it)."""
    if not isinstance(index, int) or isinstance(index, bool) or not 1 <= index <= 99:
        raise ValueError(f"invalid NATS node index {index!r}: 1 to 99")
    return name(stage, "bus", f"n{index}")


def consumer(stage: str, service: str, purpose: str = "main") -> str:
    """Durable consumer name of a service (NATS allows '-' and '_' but not '.')."""
    return name(stage, service, purpose).replace(".", "_")


def secrets_bucket(stage: str) -> str:
    return name(stage, "secrets", "kv")


_KV_TOKEN_UNSAFE = re.compile(r"[^-_a-zA-Z0-9]")


def kv_token(value: str) -> str:
    """`value` as one token of a KV key (nats-py takes `[-/_=.a-zA-Z0-9]`, and '.' and '/' would
    split it): anything else is escaped as `=XX` per UTF-8 byte, and '=' never stands for itself."""
    if value == "":
        raise ValueError("empty KV key token")
    return _KV_TOKEN_UNSAFE.sub(lambda m: "".join(f"={b:02X}" for b in m.group(0).encode()), value)


def secrets_key(key: str, cluster: str | None = None) -> str:
    """The secrets bucket's key of a job's secrets: `<cluster>.<key>`, so a cluster's own bus
    user can be granted its cluster's keys only (natsauth `cluster_agent_permissions`). With no
    cluster (a managed job's, before any launch: the recovery service copies them to each
    launch's cluster), and as written before secrets were keyed by cluster: `<key>` alone."""
    return f"{kv_token(cluster)}.{kv_token(key)}" if cluster else subject_token(key)


def secrets_cluster_keys(stage: str, cluster: str) -> str:
    """The KV subjects of one cluster's secrets (`$KV.<bucket>.<cluster>.>`)."""
    return f"$KV.{secrets_bucket(stage)}.{kv_token(cluster)}.>"


def objects_bucket(stage: str) -> str:
    """JetStream object store of the stage's uploaded workdirs and file-mount sources."""
    return name(stage, "objects", "store")


def upload_object(digest: str) -> str:
    """An upload's object name: its content digest (`sha256:<hex>` -> `sha256-<hex>`), so the same
    content is one object, whoever sent it and whatever its path."""
    algo, _, hexdigest = digest.partition(":")
    if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexdigest):
        raise ValueError(f"invalid upload digest {digest!r}: expected sha256:<64 hex digits>")
    return f"{algo}-{hexdigest}"


@functools.lru_cache(maxsize=64)  # on every publish's subject: the stage is checked once
def subject_prefix(stage: str) -> str:
    check_stage(stage)
    return f"{PROJECT}.{stage}"


_TOKEN_SAFE = re.compile(r"[^A-Za-z0-9_\-]")


def subject_token(value: str) -> str:
    """Make an id safe as one NATS subject token: '.', '*', '>' and spaces are escaped as `%XX`."""
    if value == "":
        raise ValueError("empty subject token")
    return _TOKEN_SAFE.sub(lambda m: "%" + format(ord(m.group(0)), "02X"), value)


def event_subject(stage: str, aggregate: str, aggregate_id: str, event_type: str) -> str:
    """`skypurza.<stage>.evt.<aggregate>.<id>.<event_type>`: one aggregate's history is one wildcard."""
    return f"{subject_prefix(stage)}.evt.{aggregate}.{subject_token(aggregate_id)}.{event_type}"


def event_filter(stage: str, aggregate: str, event_type: str = "*", aggregate_id: str | None = None) -> str:
    """Subject filter for consumers: one event type (or `*`) of every (or one) aggregate instance."""
    agg = "*" if aggregate_id is None else subject_token(aggregate_id)
    return f"{subject_prefix(stage)}.evt.{aggregate}.{agg}.{event_type}"


def aggregate_subjects(stage: str, aggregate: str, aggregate_id: str) -> str:
    return f"{subject_prefix(stage)}.evt.{aggregate}.{subject_token(aggregate_id)}.>"


def identity_filters(stage: str) -> tuple[str, str]:
    """The subjects of who may do what (teams, users and their tokens): the API server follows them."""
    return aggregate_events_subject(stage, "team"), aggregate_events_subject(stage, "user")


def all_events_subject(stage: str) -> str:
    return f"{subject_prefix(stage)}.evt.>"


def aggregate_events_subject(stage: str, aggregate: str) -> str:
    return f"{subject_prefix(stage)}.evt.{aggregate}.>"


def log_subject(stage: str, cluster: str, job_id: int | str, rank: int | str) -> str:
    return f"{subject_prefix(stage)}.log.{subject_token(cluster)}.{subject_token(str(job_id))}.{rank}"


def logs_subject_filter(stage: str, cluster: str | None = None, job_id: int | str | None = None) -> str:
    if cluster is None:
        return f"{subject_prefix(stage)}.log.>"
    if job_id is None:
        return f"{subject_prefix(stage)}.log.{subject_token(cluster)}.>"
    return f"{subject_prefix(stage)}.log.{subject_token(cluster)}.{subject_token(str(job_id))}.*"


def all_logs_subject(stage: str) -> str:
    return f"{subject_prefix(stage)}.log.>"


def dead_letter_subject(stage: str, service: str) -> str:
    return f"{subject_prefix(stage)}.dlq.{subject_token(service)}"


def query_subject(stage: str, service: str, query: str) -> str:
    """Request-reply subject of a query a service answers (e.g. the ledger's `status`)."""
    return f"{subject_prefix(stage)}.query.{service}.{query}"


def heartbeat_subject(stage: str, cluster: str, rank: int | str) -> str:
    return f"{subject_prefix(stage)}.hb.{subject_token(cluster)}.{rank}"


def heartbeats_filter(stage: str) -> str:
    return f"{subject_prefix(stage)}.hb.>"


def sample_subject(stage: str, cluster: str, rank: int | str) -> str:
    """Core NATS subject of a node's samples (events/nodesample.py): not the log."""
    return f"{subject_prefix(stage)}.sample.{subject_token(cluster)}.{rank}"


def samples_filter(stage: str) -> str:
    return f"{subject_prefix(stage)}.sample.>"


def public_subject(stage: str, aggregate: str, aggregate_id: str, event_type: str) -> str:
    """`skypurza.<stage>.public.<aggregate>.<id>.<event_type>`: the CloudEvents mirror
    (services/mirror/) an outsider's read-only credential may subscribe to, and nothing else."""
    return f"{subject_prefix(stage)}.public.{aggregate}.{subject_token(aggregate_id)}.{event_type}"


def public_filter(stage: str) -> str:
    return f"{subject_prefix(stage)}.public.>"


def inbox_prefix(user: str) -> str:
    """A secured bus user's reply subjects (`_INBOX.<user>.>`): one user cannot read another's
    replies (JetStream acks, fetched messages, query answers)."""
    return f"_INBOX.{subject_token(user)}"


# The users of a deployment's secured bus (events/natsauth.py) besides the services, agent and
# API server, which are users by their contract's name.
BUS_CONTROL_USER = "control"  # the deployment's own set-up (streams, buckets, the first admin)
BUS_PUBLIC_USER = "public"  # outsiders: the CloudEvents mirror, read only
# A DR stage's bus nodes, connecting to their source stage's as a NATS leaf node (infra/busconfig.py):
# a user of the source's `leafnodes {}` listener, not of its `authorization {}` block, so no contract
# or deployment user may take the name (busconfig refuses one).
BUS_LEAF_USER = "leaf"
# A cluster's own node agent user in a deployment (events/agentusers.py): `agent@<cluster>`. No
# contract name holds an `@`, so it never clashes with a service's user.
BUS_CLUSTER_AGENT_PREFIX = "agent@"


def cluster_agent_user(cluster: str) -> str:
    """The bus user of one cluster's node agents in a deployment."""
    return f"{BUS_CLUSTER_AGENT_PREFIX}{cluster}"


# ---------------------------------------------------------------- metrics

METRICS_PREFIX = PROJECT  # every Prometheus metric is `skypurza_<name>` (docs/observability.md)


def metric(name_: str) -> str:
    """A Prometheus metric name under the one prefix (`[a-z_][a-z0-9_]*`)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name_):
        raise ValueError(f"invalid metric name {name_!r}")
    return f"{METRICS_PREFIX}_{name_}"


def dashboard_uid(name_: str) -> str:
    """A Grafana dashboard's uid (and file name stem): `skypurza-<name>` (at most 40 characters,
    Grafana's limit)."""
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", name_):
        raise ValueError(f"dashboard name {name_!r}: lower-case letters, digits and '-'")
    return f"{PROJECT}-{name_}"


# ---------------------------------------------------------------- local files

def state_dir(stage: str, home: Path | None = None) -> Path:
    """`~/.skypurza/<stage>/` (SKYPURZA_HOME overrides `~/.skypurza`)."""
    import os

    check_stage(stage)
    root = Path(os.environ["SKYPURZA_HOME"]) if "SKYPURZA_HOME" in os.environ and home is None else (
        home or Path.home() / f".{PROJECT}"
    )
    return root / stage


def home_dir() -> Path:
    import os

    return Path(os.environ.get("SKYPURZA_HOME") or Path.home() / f".{PROJECT}")


def cache_dir() -> Path:
    """What the CLI may rebuild at any time (its rendered `spz --help`): `$SKYPURZA_HOME/cache`
    where SKYPURZA_HOME is set, else the user's cache dir (`$XDG_CACHE_HOME/skypurza`)."""
    import os

    if os.environ.get("SKYPURZA_HOME"):
        return Path(os.environ["SKYPURZA_HOME"]) / "cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / PROJECT


def help_cache_file(key: str) -> Path:
    return cache_dir() / f"help-{key}.json"


def schema_cache_file(key: str) -> Path:
    """A task model's built validator (events/taskspec/schemacache.py)."""
    return cache_dir() / f"taskspec-{key}.pickle"


def projections_file(stage: str) -> Path:
    return state_dir(stage) / f"{name(stage, 'ledger', 'projections')}.duckdb"


def status_db_file(stage: str) -> Path:
    """The status service's projections (clusters, nodes, jobs, managed jobs: services/status/)."""
    return state_dir(stage) / f"{name(stage, 'status', 'projections')}.duckdb"


def metrics_endpoint_file(stage: str) -> Path:
    """Where the stage's metrics endpoint listens (written by the observability service)."""
    return state_dir(stage) / "metrics.json"


def nats_store_dir(stage: str) -> Path:
    return state_dir(stage) / "jetstream"


def control_state_file(stage: str) -> Path:
    """What the embedded control plane runs where (written by its supervisor)."""
    return state_dir(stage) / "api.json"


def cli_worker_socket(stage: str) -> Path:
    """The warm CLI worker's AF_UNIX socket (cli/warmworker.py; 0600, its own user only)."""
    return state_dir(stage) / "cli-worker.sock"


def cli_worker_state_file(stage: str) -> Path:
    """What the warm CLI worker has served (its pid, requests served, the last cold reason)."""
    return state_dir(stage) / "cli-worker.json"


def control_lock_file(stage: str) -> Path:
    """Held exclusively while the stage's control plane is started, stopped or restarted."""
    return state_dir(stage) / "control.lock"


def nats_port_file(stage: str) -> Path:
    """The stage's NATS port, chosen once (local agents reconnect to it after a restart)."""
    return state_dir(stage) / "nats.port"


# The names of a deployment's bus secrets, the same under a stage's state directory and in a
# compose deployment's secrets directory (below).
BUS_USERS_DIR_NAME = "bus-users"
BUS_AUTH_FILE_NAME = "nats-auth.conf"


def bus_credentials_dir(stage: str) -> Path:
    """A deployment's bus credentials, one 0600 file per user (events/natscreds.py)."""
    return state_dir(stage) / BUS_USERS_DIR_NAME


def bus_auth_file(stage: str) -> Path:
    """A deployment's nats-server `authorization {}` block (0600: it holds the passwords)."""
    return state_dir(stage) / BUS_AUTH_FILE_NAME


# A compose deployment's bus secrets (`spz api compose-secrets`): a directory next to compose.yaml,
# by default this one (compose.yaml reads it as ${SKYPURZA_BUS_SECRETS:-./bus-secrets}).
COMPOSE_SECRETS_DIR = "bus-secrets"


def compose_credentials_dir(root: Path) -> Path:
    """One 0600 credentials file per bus user, each handed to its own container only."""
    return root / BUS_USERS_DIR_NAME


def compose_node_users_file(root: Path) -> Path:
    """Each bus user's bcrypt hash and the stage (0600): what every compose NATS node renders its
    `authorization {}` block from, with the per-cluster agent users (cli/busnode.py)."""
    return root / "nats-node-users.json"


def compose_stage_file(root: Path) -> Path:
    """The stage the secrets were drawn for (their subjects name it): compose's set-up container
    refuses to run a deployment of another stage with them."""
    return root / "stage"


def compose_secrets_lock_file(root: Path) -> Path:
    """Held while the secrets are written: two runs at once draw one set of passwords."""
    return root / ".lock"


BUS_AGENTS_DIR_ENV = "SKYPURZA_BUS_AGENTS_DIR"


def bus_agent_users_dir(stage: str) -> Path:
    """A deployment's per-cluster agent users, one 0600 file per cluster holding only its bcrypt
    hash (events/agentusers.py); the supervisor renders them into the authorization block.
    SKYPURZA_BUS_AGENTS_DIR (an absolute path) puts them elsewhere: compose's provisioner writes
    them to a volume every NATS node reads (cli/busnode.py)."""
    import os

    moved = os.environ.get(BUS_AGENTS_DIR_ENV, "")
    if moved:
        if not os.path.isabs(moved):
            raise ValueError(f"{BUS_AGENTS_DIR_ENV} must be an absolute path, not {moved!r}")
        return Path(moved)
    return state_dir(stage) / "bus-agents"


def bus_node_dir(stage: str, config: Path) -> Path:
    """Where a compose NATS node's keeper writes its config copy and authorization block: one
    directory per node config, so two keepers sharing a home never write each other's."""
    import hashlib

    return state_dir(stage) / "bus-node" / hashlib.sha256(str(config.absolute()).encode()).hexdigest()[:16]


def bus_agent_key_file(stage: str) -> Path:
    """The deployment's key (0600) every cluster's agent password is derived from."""
    return state_dir(stage) / "bus-agents.key"


def control_logs_dir(stage: str) -> Path:
    return state_dir(stage) / "logs"


# sky's default API server port (SKYPILOT_API_SERVER_LOCAL_PORT overrides it there, and here).
DEFAULT_API_PORT = 46580


def api_settings_file(stage: str) -> Path:
    """The stage's API server settings (host, port, deploy) as the last `spz api start` chose them:
    a control plane started on first use, or restarted, serves the same way on the same port."""
    return state_dir(stage) / "api-server.json"


def admin_token_file(stage: str) -> Path:
    """A deployment's first admin token (mode 0600), written once by `spz api start --deploy`."""
    return state_dir(stage) / "admin-token"


def api_login_file() -> Path:
    """Which API server this user's CLI talks to, and its token (mode 0600): `spz api login`."""
    return home_dir() / "api-login.json"


def services_health_file(stage: str) -> Path:
    """Per-service health of the stage's services process (written by its supervisor, cli/serve.py)."""
    return state_dir(stage) / "services.health.json"


def ssh_key_file(stage: str, region: str) -> Path:
    """Private key of the stage's EC2 key pair in one region (key pairs are regional)."""
    return state_dir(stage) / "keys" / f"{key_pair(stage)}.{_cloud_part(region)}.pem"


# ---------------------------------------------------------------- cloud resources and tags

TAG_PROJECT = "Project"
TAG_STAGE = "Stage"
TAG_NAME = "Name"
TAG_CLUSTER = f"{PROJECT}:cluster"
TAG_JOB = f"{PROJECT}:job"
TAG_RANK = f"{PROJECT}:node-rank"
TAG_LAUNCH_TOKEN = f"{PROJECT}:launch-token"
TAG_LAUNCH_FAILURE = f"{PROJECT}:launch-failure"  # why a rolled-back launch failed


def base_tags(stage: str) -> dict[str, str]:
    return {TAG_PROJECT: PROJECT, TAG_STAGE: check_stage(stage)}


def instance_name(stage: str, cluster: str, rank: int) -> str:
    return name(stage, "node", f"{_cloud_part(cluster)}.{rank}".replace(".", "_"))


def security_group(stage: str, cluster: str | None = None) -> str:
    return name(stage, "sg", _cloud_part(cluster) if cluster else "shared")


def key_pair(stage: str, cluster: str | None = None) -> str:
    return name(stage, "key", _cloud_part(cluster) if cluster else "shared")


def placement_group(stage: str, cluster: str) -> str:
    return name(stage, "pg", _cloud_part(cluster))


def bucket(stage: str, purpose: str) -> str:
    """S3 bucket names: lower case, digits, '-' and '.', 3-63 characters."""
    n = name(stage, "bucket", _cloud_part(purpose))
    return n.replace("_", "-")[:63]


def slurm_job_name(stage: str, cluster: str) -> str:
    """The sbatch --job-name of a cluster's allocation (squeue/scancel find ours by it)."""
    return name(stage, "slurm", _cloud_part(cluster))


def slurm_dir(stage: str, cluster: str) -> str:
    """The cluster's directory on a Slurm site, relative to the login user's home: the
    allocation's output file and nothing else (no daemon, no install)."""
    # Not under `.skypurza/<stage>`: where the cluster's login is this machine's own user (a
    # laptop's test cluster) that is the control plane's state directory.
    return f".{PROJECT}-slurm/{check_stage(stage)}/{_cloud_part(cluster)}"


def _cloud_part(value: str) -> str:
    return re.sub(r"[^a-z0-9_.]", "_", value.lower()).strip("_.") or "x"


# ---------------------------------------------------------------- infrastructure as code (infra/)
# The control plane on AWS (infra/, docs/deploy.md): stacks `Skypurza<Stage><Component>`, physical
# names `skypurza-<stage>-<component>-<purpose>`, roles `skypurza-<stage>-*`, log groups
# `/skypurza/<stage>/...`. infra/ writes no name of its own: tests/test_infra.py walks every
# synthesized template and refuses any name these functions do not make.

# The stacks of one stage, and the delivery stage's pipeline (`ci`: the account's own stage).
INFRA_COMPONENTS = ("network", "bus", "state", "iam", "logs", "services", "dns", "pipeline")
DELIVERY_STAGE = "ci"


def stage_label(stage: str) -> str:
    """`bake_usw2` -> `BakeUsw2`: a stage as CloudFormation and CDK construct ids spell it."""
    return "".join(part.capitalize() for part in check_stage(stage).split("_") if part)


def stage_id(stage: str) -> str:
    """The CDK Stage (cloud assembly) of a stage: `SkypurzaBakeUsw2`."""
    return f"{PROJECT.capitalize()}{stage_label(stage)}"


def stack_name(stage: str, component: str) -> str:
    """`Skypurza<Stage><Component>`: one of INFRA_COMPONENTS (a stack name is an account-wide id)."""
    if component not in INFRA_COMPONENTS:
        raise ValueError(f"unknown infrastructure component {component!r}")
    return f"{stage_id(stage)}{component.capitalize()}"


def role_name(stage: str, component: str, purpose: str) -> str:
    """`skypurza-<stage>-<component>-<purpose>` for an IAM role (at most 64 characters: a long
    purpose is cut and keeps a digest, so two long ones stay apart)."""
    return _bounded(name(stage, component, purpose), 64)


def infra_bucket(stage: str, purpose: str, account: str) -> str:
    """A stage's S3 bucket: `skypurza-<stage>-state-<purpose>-<account>`. Bucket names are global
    to all of S3, so the account keeps two organisations' stages apart; '_' is not allowed."""
    if not re.fullmatch(r"[0-9]{12}", account):
        raise ValueError(f"invalid AWS account {account!r}: 12 digits")
    return f"{name(stage, 'state', purpose)}-{account}".replace("_", "-")[:63]


def load_balancer(stage: str, purpose: str) -> str:
    """Load balancers and target groups: letters, digits and '-', at most 32 characters."""
    return _bounded(name(stage, "lb", purpose).replace("_", "-").replace(".", "-"), 32)


def log_group(stage: str, component: str) -> str:
    """`/skypurza/<stage>/<component>`: one log group per service (and per bus, pipeline step)."""
    check_stage(stage)
    if not _PART_RE.match(component):
        raise ValueError(f"invalid name part {component!r}")
    return f"/{PROJECT}/{stage}/{component}"


def parameter(stage: str, component: str, purpose: str) -> str:
    """An SSM parameter: `/skypurza/<stage>/<component>/<purpose>`."""
    if not _PART_RE.match(purpose):
        raise ValueError(f"invalid name part {purpose!r}")
    return f"{log_group(stage, component)}/{purpose}"


def alerts_webhooks_secret(stage: str) -> str:
    """The Secrets Manager secret of a deployment's alert webhooks (infra/services.py):
    `/skypurza/<stage>/alerts/webhooks`, its value `{"slack": "URL,...", "json": "URL,..."}`, which
    ECS hands the alerts container as its two webhook variables (a Slack URL is a credential)."""
    return parameter(stage, "alerts", "webhooks")


def bus_user_secret(stage: str, user: str) -> str:
    """The Secrets Manager secret of one user of a stage's secured bus (infra/bus.py):
    `/skypurza/<stage>/bus/users/<user>`, its value `{"user": ..., "password": ...}` (the shape of
    a credentials file, events/natscreds.py). A user is a contract's name, `control` or `public`;
    a cluster's own agent user (`agent@<cluster>`) has none: the provisioner makes those."""
    if not _PART_RE.match(user):
        raise ValueError(f"invalid bus user for a secret name {user!r}")
    return f"{parameter(stage, 'bus', 'users')}/{user}"


def bus_dns_zone(stage: str) -> str:
    """The private DNS zone of a stage's bus nodes (`n1.<zone>`): a DNS name has no '_'."""
    return f"{check_stage(stage).replace('_', '-')}.bus.{PROJECT}.internal"


def bus_node_host(stage: str, node: int) -> str:
    return f"n{int(node)}.{bus_dns_zone(stage)}"


def infra_name_patterns(stage: str) -> tuple[re.Pattern[str], ...]:
    """Every shape of name the functions above give a stage's resources (what the naming walk of
    tests/test_infra.py accepts)."""
    s = re.escape(check_stage(stage))
    dash = re.escape(stage.replace("_", "-"))
    part = r"[a-z0-9][a-z0-9_.]*"
    return (
        # name(), role_name(); CDK derives a few from one (the pipeline's `...-main-selfupdate`)
        re.compile(rf"{PROJECT}-{s}-{part}-{part}(-[0-9a-f]{{6}})?(-[a-z0-9]+)?"),
        re.compile(rf"{PROJECT}-{dash}-state-[a-z0-9.-]+-[0-9]{{12}}"),            # infra_bucket()
        re.compile(rf"{PROJECT}-{dash}-lb-[a-z0-9-]+"),                            # load_balancer()
        re.compile(rf"/{PROJECT}/{s}/{part}(/[a-z0-9_.]+)?"),                      # log_group(), parameter()
        re.compile(rf"/{PROJECT}/{s}/bus/users/{part}"),                            # bus_user_secret()
        re.compile(rf"(n[0-9]+\.)?{re.escape(bus_dns_zone(stage))}\.?"),           # bus_dns_zone()
    )


def _bounded(value: str, limit: int) -> str:
    if len(value) <= limit:
        return value
    import hashlib

    digest = hashlib.sha256(value.encode()).hexdigest()[:6]
    return f"{value[:limit - 7].rstrip('-_.')}-{digest}"


# ---------------------------------------------------------------- Kubernetes objects and labels

# Label keys: `<prefix>/<name>`, the prefix a DNS subdomain (the project's name is one).
K8S_LABEL_STAGE = f"{PROJECT}/stage"
K8S_LABEL_CLUSTER = f"{PROJECT}/cluster"
K8S_LABEL_RANK = f"{PROJECT}/node-rank"
K8S_LABEL_LAUNCH_TOKEN = f"{PROJECT}/launch-token"
K8S_LABEL_JOB = f"{PROJECT}/job"
K8S_CONTAINER = "agent"


def _dns_label(value: str, limit: int = 63) -> str:
    """A DNS-1123 label (lower case, digits, '-'; letter first for a Service): too long, it keeps
    a readable head and a hash of the whole, so two long names never collide."""
    import hashlib

    clean = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-") or "x"
    if len(clean) <= limit:
        return clean
    digest = hashlib.sha256(value.encode()).hexdigest()[:10]
    return f"{clean[:limit - 11].rstrip('-')}-{digest}"


def _k8s_part(cluster: str) -> str:
    """The cluster's name as a DNS label part; when that loses something ("a.b", "A_b" and
    "a-b" would all be "a-b"), a hash of the name keeps two clusters' objects apart."""
    import hashlib

    clean = re.sub(r"[^a-z0-9]+", "_", cluster.lower()).strip("_") or "x"  # a name part; '_' becomes '-'
    if clean.replace("_", "-") == cluster:
        return clean
    return f"{clean}_{hashlib.sha256(cluster.encode()).hexdigest()[:6]}"


def k8s_service(stage: str, cluster: str) -> str:
    """The cluster's headless Service (its pods' DNS subdomain)."""
    return _dns_label(name(stage, "svc", _k8s_part(cluster)))


def k8s_pod(stage: str, cluster: str, rank: int) -> str:
    """Node `rank` of a cluster: the pod's name and hostname."""
    base = _dns_label(name(stage, "node", _k8s_part(cluster)), 63 - len(str(rank)) - 1)
    return f"{base}-{rank}"


def k8s_secret(stage: str, cluster: str) -> str:
    """The cluster's Secret: its agents' own bus user and password, read by the pods'
    `valueFrom.secretKeyRef` (never a plain value in the pod spec); deleted with the cluster."""
    return _dns_label(name(stage, "creds", _k8s_part(cluster)))


def k8s_labels(stage: str, cluster: str) -> dict[str, str]:
    """What every object of a cluster carries (the listing selector is the stage's part)."""
    return {K8S_LABEL_STAGE: check_stage(stage), K8S_LABEL_CLUSTER: cluster}
