"""A deployment's secured bus: the users of every declared contract (cli/contracts.py), their
credentials and the server's authorization block written under the stage's state directory
(events/natsauth.py decides, events/natscreds.py writes). The CLI's own contract is left out: a
laptop never holds bus credentials; it talks to the API server.

A compose deployment (compose.yaml) gets the same users in a directory next to the compose file
(`compose_secrets`, `spz api compose-secrets`): their credentials, and their bcrypt hashes from
which each NATS node renders its own block (cli/busnode.py); its one-shot set-up container makes
the streams as `control` (`compose_set_up`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from skypurza.events import naming
from skypurza.events.contract import Contract
from skypurza.events.agentusers import AgentUser, list_users
from skypurza.events.natsauth import authorization_block, cluster_agent_users, deployment_users
from skypurza.events.natscreds import (CREDS_ENV, BusCredentials, CredentialsError, credentials_file,
                                       read_credentials, write_deployment)

from .contracts import CLI, all_contracts
from .planelock import LockTimeout, exclusive


AGENT_CONTRACT = "agent"  # the node agent's contract, whose grants each cluster's user narrows


def deployment_contracts() -> list[Contract]:
    return [c for c in all_contracts() if c is not CLI]


def prepare(stage: str) -> Path:
    """Write (or keep) every user's credentials; return the authorization block's path. The
    block also holds each cluster's own agent user (events/agentusers.py) as the provisioner left
    them: their bcrypt hashes only, no credentials file (the nodes hold the passwords). The
    supervisor is the one caller: the one writer of the block."""
    agents = list_users(naming.bus_agent_users_dir(stage))
    return write_deployment([u.name for u in deployment_users(stage, deployment_contracts())],
                            lambda passwords: block_with_agents(stage, passwords, agents),
                            directory=naming.bus_credentials_dir(stage), auth_file=naming.bus_auth_file(stage))


def block_with_agents(stage: str, passwords: Mapping[str, str], agents: Mapping[str, AgentUser]) -> str:
    """The `authorization {}` block of a deployment (pure): every deployment user with its
    password (or bcrypt hash: compose's nodes, cli/busnode.py), and each remote cluster's own
    agent user with its hash, narrowed to its cluster."""
    contracts = deployment_contracts()
    users = deployment_users(stage, contracts)
    agent = next(c for c in contracts if c.name == AGENT_CONTRACT)
    agent_users = cluster_agent_users(agent, stage, agents, contracts) if agents else []
    hashes = {naming.cluster_agent_user(c): u.password_hash for c, u in agents.items()}
    return authorization_block([*users, *agent_users], {**passwords, **hashes})


def env_for(stage: str, user: str) -> dict[str, str]:
    """The environment that makes a child process's buses connect as `user`."""
    return {CREDS_ENV: str(credentials_file(naming.bus_credentials_dir(stage), user))}


async def connect_as(url: str, stage: str, user: str, source: str, credentials: BusCredentials | None = None):
    """A Bus connected as `user` of `stage`'s deployment (its 0600 file under the state dir, or
    `credentials` where they were read elsewhere; a missing or broken file is a CredentialsError,
    one line)."""
    from skypurza.events.bus import Bus

    creds = credentials or read_credentials(credentials_file(naming.bus_credentials_dir(stage), user))
    return await Bus.connect(url, stage, source=source, credentials=creds, max_reconnect_attempts=0)


async def set_up(url: str, stage: str, credentials: BusCredentials | None = None) -> None:
    """As the `control` user: the streams, the secrets bucket and the uploads store, which no
    service's user may create (they only check them on connect). A secrets bucket an older
    version made is given direct gets here: a cluster's agent user reads its keys no other way.
    `credentials`: control's, where they are not under the state dir (a compose container's)."""
    from skypurza.events import uploads

    bus = await connect_as(url, stage, naming.BUS_CONTROL_USER, f"/skypurza/{stage}/setup", credentials)
    try:
        await bus.ensure_secrets_bucket()
        await uploads.object_store(bus)
    finally:
        await bus.close()


# ---------------------------------------------------------------- compose (compose.yaml)

COMPOSE_LOCK_TIMEOUT_S = 30.0
# Above the placement wait (events/bussettings.py, 30 s by default) a cluster just started may need.
COMPOSE_SETUP_TIMEOUT_S = 90.0
# The image's `skypurza` user (Dockerfile: useradd --uid): Compose mounts a secret file with its
# host owner and mode, so this uid must own the 0600 credentials files its containers read.
COMPOSE_CONTAINER_UID = 1000


class ComposeSecretsError(Exception):
    """What stops a compose deployment's secrets from being written or used (one line)."""


def compose_secrets(root: Path, stage: str) -> dict[str, Path]:
    """Write (or keep) a compose deployment's bus secrets under `root`: every user's credentials
    (0600, one file each: compose hands each container its own), the users' bcrypt hashes every
    NATS node renders its authorization block from (`naming.compose_node_users_file`: a node holds
    no usable password; cli/busnode.py adds each cluster's agent user the provisioner mints), and
    the stage they were drawn for (the grants name its subjects). The users are the supervisor's
    (`deployment_users`). Passwords already there are kept (their hashes are drawn again, with new
    salts: as good); two runs at once take turns on a lock, so they write one set. Returns user -> file."""
    from skypurza.events.agentusers import hash_password

    naming.check_stage(stage)
    users = deployment_users(stage, deployment_contracts())
    names = [u.name for u in users]
    try:
        # 0700: the lock file is made before write_private makes the directory (0700) itself.
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        with exclusive(naming.compose_secrets_lock_file(root), COMPOSE_LOCK_TIMEOUT_S, f"the bus secrets in {root}"):
            write_deployment(names, lambda passwords: node_users_text(stage, {u: hash_password(p)
                                                                              for u, p in passwords.items()}),
                             directory=naming.compose_credentials_dir(root),
                             auth_file=naming.compose_node_users_file(root))
            naming.compose_stage_file(root).write_text(stage + "\n", encoding="utf-8")
    except LockTimeout as exc:
        raise ComposeSecretsError(str(exc)) from None
    except OSError as exc:
        raise ComposeSecretsError(f"cannot write the bus secrets in {root}: {exc.strerror or exc}") from None
    return {n: credentials_file(naming.compose_credentials_dir(root), n) for n in names}


NODE_USERS_FORMAT = 1  # of `naming.compose_node_users_file` (cli/busnode.py reads it)


def node_users_text(stage: str, hashes: Mapping[str, str]) -> str:
    """What each compose NATS node renders its block from: the stage and every user's hash."""
    import json

    return json.dumps({"format": NODE_USERS_FORMAT, "stage": stage, "password_hashes": dict(sorted(hashes.items()))},
                      indent=1) + "\n"


def drawn_stage(stage_file: Path) -> str:
    """The stage a compose deployment's secrets were drawn for (their stage file)."""
    try:
        return naming.check_stage(stage_file.read_text(encoding="utf-8").strip())
    except OSError as exc:
        raise ComposeSecretsError(f"cannot read {stage_file}: {exc.strerror or exc} "
                                  "(run `spz api compose-secrets` before `docker compose up`)") from None
    except ValueError as exc:
        raise ComposeSecretsError(f"{stage_file}: {exc}") from None


def compose_set_up(url: str, stage: str, stage_file: Path, credentials: BusCredentials | None) -> None:
    """What compose's one-shot set-up container runs before any service starts: refuse a stage
    the secrets were not drawn for (every service user's grants name the drawn stage's subjects,
    so they would be refused everything), then make the streams and buckets as `control`."""
    import asyncio

    drawn = drawn_stage(stage_file)
    if drawn != stage:
        raise ComposeSecretsError(
            f"the bus secrets were drawn for stage {drawn!r} but this deployment runs stage {stage!r}: "
            f"run `SKYPURZA_STAGE={stage} spz api compose-secrets` again, or set SKYPURZA_STAGE={drawn} for compose")
    if credentials is None or credentials.user != naming.BUS_CONTROL_USER:
        raise ComposeSecretsError(f"the set-up connects as the {naming.BUS_CONTROL_USER!r} user: set {CREDS_ENV} to "
                                  f"its credentials file (compose.yaml's set-up service does)")
    try:  # bounded: nats-py retries a node that does not answer, and a one-shot container must end
        asyncio.run(asyncio.wait_for(set_up(url, stage, credentials), COMPOSE_SETUP_TIMEOUT_S))
    except asyncio.TimeoutError:
        raise TimeoutError(f"the bus at {url} did not let {naming.BUS_CONTROL_USER} set it up within "
                           f"{COMPOSE_SETUP_TIMEOUT_S:.0f} s (are its nodes up and clustered?)") from None


def read_control_credentials() -> BusCredentials | None:
    """The set-up container's user, from SKYPURZA_NATS_CREDS (one line when it cannot be used)."""
    from skypurza.events.natscreds import credentials_from_env

    try:
        return credentials_from_env()
    except CredentialsError as exc:
        raise ComposeSecretsError(str(exc)) from None
