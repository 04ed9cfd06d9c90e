"""A deployment's per-cluster node agent users: minted when a cluster is provisioned, removed when
it is torn down, rebuilt from the log after a crash (docs/team.md, *How the bus is secured*).

Each cluster on remote nodes (EC2 instances, Kubernetes pods) gets the bus user
`naming.cluster_agent_user(cluster)`, whose grants events/natsauth.py narrows to the cluster's
subjects (`cluster_agent_permissions`). Its password is **derived**, not stored:
HMAC-SHA256(deployment key, stage, cluster, placement id), base64url. The key is drawn once with
`secrets.token_urlsafe` (256 bits, `naming.bus_agent_key_file`, 0600); the placement id is the
launch token, which `ClusterProvisioned` carries. So:
- a redelivered placement (the provisioner died mid-launch and its backend adopts the nodes it
  had launched) yields the same password those nodes were given;
- a new launch under the same name yields another one: a torn-down cluster's password is dead;
- the users of the clusters that are up are rebuilt from the log and the key alone
  (`plan_retain`, run by the provisioner at start and after reconciliation).

On disk is only each user's bcrypt hash, one 0600 file per cluster under
`naming.bus_agent_users_dir` (nats-server takes `$2a$`/`$2b$` passwords in its config and
checks them itself), so the authorization block holds no usable agent password. The provisioner
writes and removes these files (one writer per cluster: its deliveries are ordered per cluster);
the supervisor is the one writer of the authorization block and reloads nats-server when the set
changes (`fingerprint`, polled: two provisions at once are one reload).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from . import naming
from .natscreds import BusCredentials, write_private

# Set by the supervisor on a deployment's services process: the provisioner mints per-cluster
# users. Unset (the embedded default, tests, compose), agents keep the shared `agent` user.
AGENT_USERS_ENV = "SKYPURZA_AGENT_BUS_USERS"
PER_CLUSTER = "per-cluster"
# Infras whose agents run off the control plane's host: they get a cluster's own user. Local
# (and Slurm, whose agents run on the control plane: docs/slurm.md) keep the shared one.
REMOTE_INFRAS = frozenset({"aws", "kubernetes"})
# bcrypt's cost guards low-entropy passwords; these are 256 random bits, so the lowest cost is
# as safe and keeps each agent's connect cheap on the server (which checks it every connect).
BCRYPT_ROUNDS = 4
_MAX_FILE_BYTES = 4096


def per_cluster(environ: Mapping[str, str]) -> bool:
    return environ.get(AGENT_USERS_ENV, "") == PER_CLUSTER


def derive_password(key: bytes, stage: str, cluster: str, placement_id: str) -> str:
    """A cluster's agent password (pure): the same inputs, the same password."""
    if not key or not cluster or not placement_id:
        raise ValueError("a cluster's agent password needs the key, the cluster and its placement id")
    mac = hmac.new(key, f"{stage}\n{cluster}\n{placement_id}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def hash_password(password: str) -> str:
    import bcrypt  # only the control plane hashes; nodes never import it

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(BCRYPT_ROUNDS)).decode()


def check_password(password: str, hashed: str) -> bool:
    import bcrypt

    try:
        return bcrypt.checkpw(password.encode(), hashed.encode())
    except ValueError:
        return False


@dataclass(frozen=True)
class AgentUser:
    """One cluster's user as its file holds it: never a password, only its hash."""

    cluster: str
    placement_id: str
    password_hash: str
    task_id: str = ""  # whose placement: at start, a launch with no outcome yet keeps its user

    @property
    def user(self) -> str:
        return naming.cluster_agent_user(self.cluster)


@dataclass(frozen=True)
class RetainPlan:
    mint: dict[str, str]  # cluster -> placement id: up, but no (or another placement's) file
    remove: tuple[str, ...]  # files of clusters that are not up and have nothing in flight


def plan_retain(files: Mapping[str, str], up: Mapping[str, str], in_flight: frozenset[str] | set[str]) -> RetainPlan:
    """Which users a deployment should have (pure). `files`: cluster -> placement id on disk;
    `up`: cluster -> placement id of the clusters the log says are up on a remote infra;
    `in_flight`: clusters whose launch has no outcome yet (their file is kept: the placement is
    redelivered and its nodes hold that password)."""
    mint = {c: pid for c, pid in up.items() if files.get(c) != pid}
    remove = tuple(sorted(c for c in files if c not in up and c not in in_flight))
    return RetainPlan(mint=mint, remove=remove)


class AgentUserStore:
    """The per-cluster users of one stage on this host (the provisioner's side)."""

    def __init__(self, stage: str, directory: Path | None = None, key_file: Path | None = None) -> None:
        self.stage = stage
        self.directory = directory or naming.bus_agent_users_dir(stage)
        self.key_file = key_file or naming.bus_agent_key_file(stage)

    def _key(self) -> bytes:
        try:
            key = self.key_file.read_bytes().strip()
            if key:
                return key
        except FileNotFoundError:
            pass
        # Drawn once; a concurrent first draw is harmless only if one wins. The key is written whole
        # to a file of this draw's own, then linked into place: the link fails for the loser, and
        # nobody ever reads the key file before its key is in it (an O_EXCL create of the key file
        # itself let a second minter read it empty between the create and the write).
        self.key_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.key_file.with_name(f"{self.key_file.name}.{secrets.token_hex(8)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(secrets.token_urlsafe(32))
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, self.key_file)
            except FileExistsError:
                pass  # another draw won: its key is the key
        finally:
            tmp.unlink(missing_ok=True)
        return self.key_file.read_bytes().strip()

    def _file(self, cluster: str) -> Path:
        return self.directory / f"{naming.subject_token(cluster)}.json"

    def credentials(self, cluster: str, placement_id: str) -> BusCredentials:
        return BusCredentials(naming.cluster_agent_user(cluster),
                              derive_password(self._key(), self.stage, cluster, placement_id))

    def mint(self, cluster: str, placement_id: str, task_id: str = "") -> BusCredentials:
        """The cluster's credentials, its hash written (kept when this placement's is there)."""
        creds = self.credentials(cluster, placement_id)
        current = self.read(cluster)
        if current is None or current.placement_id != placement_id:
            record = {"cluster": cluster, "placement_id": placement_id, "task_id": task_id,
                      "password_hash": hash_password(creds.password)}
            write_private(self._file(cluster), json.dumps(record))
        return creds

    def remove(self, cluster: str) -> bool:
        try:
            self._file(cluster).unlink()
            return True
        except FileNotFoundError:
            return False

    def read(self, cluster: str) -> AgentUser | None:
        return _read(self._file(cluster))

    def users(self) -> dict[str, AgentUser]:
        return list_users(self.directory)

    def retain(self, up: Mapping[str, str], in_flight: set[str] | frozenset[str] = frozenset()) -> RetainPlan:
        """Make the files what `plan_retain` says; returns what it did."""
        plan = plan_retain({c: u.placement_id for c, u in self.users().items()}, up, in_flight)
        for cluster, placement_id in plan.mint.items():
            self.mint(cluster, placement_id)
        for cluster in plan.remove:
            self.remove(cluster)
        return plan


def _read(path: Path) -> AgentUser | None:
    try:
        if path.stat().st_size > _MAX_FILE_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    cluster, pid, hashed = data.get("cluster"), data.get("placement_id"), data.get("password_hash")
    if not all(isinstance(v, str) and v for v in (cluster, pid, hashed)) or not str(hashed).startswith("$2"):
        return None
    if path.name != f"{naming.subject_token(str(cluster))}.json":
        return None  # a file renamed by hand names another cluster than it grants
    task_id = data.get("task_id")
    return AgentUser(str(cluster), str(pid), str(hashed), task_id if isinstance(task_id, str) else "")


def list_users(directory: Path) -> dict[str, AgentUser]:
    """Every well-formed user file (a broken or foreign file is skipped: it grants nothing)."""
    out: dict[str, AgentUser] = {}
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return out
    for path in paths:
        user = _read(path)
        if user is not None:
            out[user.cluster] = user
    return out


def fingerprint(directory: Path) -> tuple[tuple[str, int, int], ...]:
    """What changes when a user is added, replaced or removed (the supervisor polls it)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return ()
    out = []
    for e in entries:
        if not e.name.endswith(".json"):
            continue  # a write in progress (`.tmp`) is not a change yet
        try:
            st = e.stat()
        except OSError:
            continue
        out.append((e.name, st.st_mtime_ns, st.st_size))
    return tuple(sorted(out))
