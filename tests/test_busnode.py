"""cli/busnode.py, a compose NATS node's keeper, without nats-server: what it reads and refuses,
the block it writes, and that a change of the agents' directory is one rewrite (the keeper run
with real nats-server processes is in tests/test_compose_secured.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from skypurza.cli.busauth import deployment_contracts, node_users_text
from skypurza.cli.busnode import NodeKeeper, NodeUsersError, node_block, read_node_users
from skypurza.events import naming
from skypurza.events.agentusers import AgentUserStore, hash_password, list_users
from skypurza.events.natsauth import deployment_users

STAGE = "nodekeep"


def _users_file(tmp_path: Path, drop: str = "") -> Path:
    names = [u.name for u in deployment_users(STAGE, deployment_contracts()) if u.name != drop]
    path = tmp_path / "nats-node-users.json"
    path.write_text(node_users_text(STAGE, {n: hash_password(f"pw-{n}") for n in names}))
    return path


@pytest.mark.parametrize("text, says", [
    ("not json", "is not JSON"),
    ("[]", "is not a node users file of format 1"),
    (json.dumps({"format": 1, "stage": STAGE, "password_hashes": {"api": "plain"}}), "bcrypt hash"),
    (json.dumps({"format": 1, "stage": "Bad Stage!", "password_hashes": {}}), "stage"),
])
def test_a_users_file_it_cannot_use_is_one_line_naming_the_file(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "users.json"
    path.write_text(text)
    with pytest.raises(NodeUsersError) as err:
        read_node_users(path)
    assert says in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(NodeUsersError, match="cannot read"):
        read_node_users(tmp_path / "missing.json")


def test_a_users_file_it_may_not_read_says_to_chown(tmp_path: Path, monkeypatch) -> None:
    """As a node container meets root-owned 0600 secrets (the suite runs as root, which reads any
    file, so the kernel's refusal is stood in for at the file system's edge)."""
    path = _users_file(tmp_path)
    real_stat = Path.stat

    def refusing_stat(self: Path, *a, **k):
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, *a, **k)

    monkeypatch.setattr(Path, "stat", refusing_stat)
    with pytest.raises(NodeUsersError, match=f"sudo chown -R {os.getuid()}"):
        read_node_users(path)


def test_the_block_has_every_user_by_hash_and_each_agent_narrowed(tmp_path: Path, monkeypatch) -> None:
    users = read_node_users(_users_file(tmp_path))
    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(naming.BUS_AGENTS_DIR_ENV, str(tmp_path / "agents"))
    store = AgentUserStore(STAGE)
    creds = store.mint("gpu-a", "p1")
    block = node_block(users, list_users(store.directory))
    assert block.startswith("authorization {")
    assert all(json.dumps(h) in block for h in users.hashes.values())
    assert "pw-" not in block and creds.password not in block  # hashes only
    agent_line = next(line for line in block.splitlines() if json.dumps(creds.user) in line)
    assert "evt.cluster.gpu-a." in agent_line and "evt.cluster.gpu-b." not in agent_line
    # a deployment user without a hash (secrets drawn by an older version): refused, not left out
    with pytest.raises(NodeUsersError, match="no hash for optimizer"):
        node_block(read_node_users(_users_file(tmp_path, drop="optimizer")), {})


def test_the_agents_directory_must_be_absolute(monkeypatch) -> None:
    monkeypatch.setenv(naming.BUS_AGENTS_DIR_ENV, "relative/agents")
    with pytest.raises(ValueError, match="absolute"):
        naming.bus_agent_users_dir(STAGE)


def test_a_change_of_the_agents_is_one_rewrite_and_a_broken_users_file_keeps_the_last_block(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path / "home"))
    agents = tmp_path / "agents"
    monkeypatch.setenv(naming.BUS_AGENTS_DIR_ENV, str(agents))
    conf = tmp_path / "nats.conf"
    conf.write_text(f'listen: 127.0.0.1:4222\ninclude "{naming.BUS_AUTH_FILE_NAME}"\n')
    users = _users_file(tmp_path)
    keeper = NodeKeeper(conf, users, agents, tmp_path / "work")
    copy = keeper.prepare()
    assert copy.read_text() == conf.read_text() and stat.S_IMODE(keeper.auth_file.stat().st_mode) == 0o600
    assert not keeper.look()  # nothing changed
    store = AgentUserStore(STAGE)
    store.mint("gpu-a", "p1")
    store.mint("gpu-b", "p2")
    assert keeper.look() and not keeper.look() and keeper.reloads == 1
    assert json.dumps(naming.cluster_agent_user("gpu-b")) in keeper.auth_file.read_text()
    last = keeper.auth_file.read_text()
    users.write_text("garbled")
    store.remove("gpu-a")
    assert not keeper.look() and keeper.auth_file.read_text() == last  # the last good block stays

    open_conf = tmp_path / "open.conf"
    open_conf.write_text("listen: 127.0.0.1:4222\n")
    with pytest.raises(NodeUsersError, match="its bus would be open"):
        NodeKeeper(open_conf, _users_file(tmp_path), agents, tmp_path / "work2").prepare()


def test_two_nodes_sharing_a_home_keep_their_configs_apart(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path / "home"))
    one, two = tmp_path / "n1" / "nats.conf", tmp_path / "n2" / "nats.conf"
    assert naming.bus_node_dir(STAGE, one) != naming.bus_node_dir(STAGE, two)
    assert naming.bus_node_dir(STAGE, one) == naming.bus_node_dir(STAGE, one)
    for conf, port in ((one, 4222), (two, 4223)):
        conf.parent.mkdir()
        conf.write_text(f'listen: 127.0.0.1:{port}\ninclude "{naming.BUS_AUTH_FILE_NAME}"\n')
        NodeKeeper(conf, _users_file(tmp_path), tmp_path / "agents", naming.bus_node_dir(STAGE, conf)).prepare()
    assert "4222" in (naming.bus_node_dir(STAGE, one) / "nats.conf").read_text()
    assert "4223" in (naming.bus_node_dir(STAGE, two) / "nats.conf").read_text()
