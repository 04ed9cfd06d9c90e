"""A deployment's secured bus: the users of every declared contract (cli/contracts.py), their
credentials and the server's authorization block written under the stage's state directory
(events/natsauth.py decides, events/natscreds.py writes). The CLI's own contract is left out: a
laptop never holds bus credentials; it talks to the API server.
"""

from __future__ import annotations

from pathlib import Path

from skypurza.events import naming
from skypurza.events.contract import Contract
from skypurza.events.agentusers import list_users
from skypurza.events.natsauth import authorization_block, cluster_agent_users, deployment_users
from skypurza.events.natscreds import CREDS_ENV, credentials_file, write_deployment

from .contracts import CLI, all_contracts


AGENT_CONTRACT = "agent"  # the node agent's contract, whose grants each cluster's user narrows


def deployment_contracts() -> list[Contract]:
    return [c for c in all_contracts() if c is not CLI]


def prepare(stage: str) -> Path:
    """Write (or keep) every user's credentials; return the authorization block's path. The
    block also holds each cluster's own agent user (events/agentusers.py) as the provisioner left
    them: their bcrypt hashes only, no credentials file (the nodes hold the passwords). The
    supervisor is the one caller: the one writer of the block."""
    contracts = deployment_contracts()
    users = deployment_users(stage, contracts)
    agents = list_users(naming.bus_agent_users_dir(stage))
    agent = next(c for c in contracts if c.name == AGENT_CONTRACT)
    agent_users = cluster_agent_users(agent, stage, agents, contracts) if agents else []
    hashes = {naming.cluster_agent_user(c): u.password_hash for c, u in agents.items()}
    return write_deployment([u.name for u in users],
                            lambda passwords: authorization_block([*users, *agent_users], {**passwords, **hashes}),
                            directory=naming.bus_credentials_dir(stage), auth_file=naming.bus_auth_file(stage))


def env_for(stage: str, user: str) -> dict[str, str]:
    """The environment that makes a child process's buses connect as `user`."""
    return {CREDS_ENV: str(credentials_file(naming.bus_credentials_dir(stage), user))}


async def connect_as(url: str, stage: str, user: str, source: str):
    """A Bus connected as `user` of `stage`'s deployment (its 0600 file under the state dir; a
    missing or broken one is a CredentialsError, one line)."""
    from skypurza.events.bus import Bus
    from skypurza.events.natscreds import read_credentials

    creds = read_credentials(credentials_file(naming.bus_credentials_dir(stage), user))
    return await Bus.connect(url, stage, source=source, credentials=creds, max_reconnect_attempts=0)


async def set_up(url: str, stage: str) -> None:
    """As the `control` user: the streams, the secrets bucket and the uploads store, which no
    service's user may create (they only check them on connect). A secrets bucket an older
    version made is given direct gets here: a cluster's agent user reads its keys no other way."""
    from skypurza.events import uploads

    bus = await connect_as(url, stage, naming.BUS_CONTROL_USER, f"/skypurza/{stage}/setup")
    try:
        await bus.ensure_secrets_bucket()
        await uploads.object_store(bus)
    finally:
        await bus.close()
