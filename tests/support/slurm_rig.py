"""A real Slurm 22.05 (Debian's slurm-wlm) in a temporary directory, with an sshd as its login node.

Installs nothing: the packages are on the machine (.ci/run, the README's test command). Starts
munged on a private socket, slurmctld and one slurmd per node on free ports, fake GPUs as char
devices (so GRES is real: a regular file is refused as `File=`), and an sshd on a free
127.0.0.1 port that takes one generated key. Everything lives under the rig's directory and is
stopped by pid at the end, so two test runs on one machine do not meet.

Two nodes: slurmd is started once per `NodeName` with its own port, spool and pid file (`-N`),
which is how Slurm documents several slurmd on one host.

`accounting=True` adds MariaDB (its own datadir, port and socket, no grant tables: nothing but
slurmdbd reaches it) and slurmdbd, so `sacct` answers, the GPUs are tracked TRES
(`AccountingStorageTRES`) and the gpu partition's TRESBillingWeights weigh them. Only the
billing test needs it (a few seconds more to start).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SLURM_USER = "slurm"
MUNGE_USER = "munge"
CLUSTER = "spztest"
PARTITION = "debug"
GPU_PARTITION = "gpu"
GPUS_PER_NODE = 2
NODES = ("n1", "n2")
READY_TIMEOUT_S = 30.0
GPU_WEIGHTS_ACCOUNTED = "CPU=1.0,Mem=0.25G,GRES/gpu=2.0,GRES/gpu:h100=4.0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def available() -> str:
    """Why the rig cannot run here ("" when it can)."""
    for binary in ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/sbin/sshd"):
        if not Path(binary).exists():
            return f"{binary} is not installed (apt-get install slurm-wlm munge openssh-server)"
    if os.geteuid() != 0:
        return "the Slurm rig runs slurmctld as the slurm user and needs root"
    return ""


@dataclass
class SlurmRig:
    root: Path
    ctld_port: int = field(default_factory=free_port)
    ssh_port: int = field(default_factory=free_port)
    node_ports: dict[str, int] = field(default_factory=lambda: {n: free_port() for n in NODES})
    pids: dict[str, int] = field(default_factory=dict)
    accounting: bool = False
    db_port: int = field(default_factory=free_port)
    dbd_port: int = field(default_factory=free_port)
    users: list[str] = field(default_factory=list)  # Unix accounts this rig made (removed at stop)

    # ------------------------------------------------------------------ paths

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def login_home(self) -> Path:
        """The login user's $HOME on the "cluster" (not root's own: what jobs write stays in the rig)."""
        return self.root / "home"

    @property
    def key(self) -> Path:
        return self.root / "ssh" / "id_ed25519"

    @property
    def env(self) -> dict[str, str]:
        """What a command on the control plane's side needs to run Slurm's tools directly."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def slurm_config(self, host: str = CLUSTER) -> str:
        """An SSH-config-style ~/.slurm/config naming the login node, as SkyPilot reads it."""
        return (f"Host {host}\n    HostName 127.0.0.1\n    Port {self.ssh_port}\n    User root\n"
                f"    IdentityFile {self.key}\n    StrictHostKeyChecking no\n"
                "    UserKnownHostsFile /dev/null\n")

    # ------------------------------------------------------------------ start and stop

    def start(self) -> "SlurmRig":
        for d in ("etc", "spool/ctld", "log", "run", "dev", "munge", "ssh", "home", "db", "dbrun"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        for n in NODES:
            (self.root / "spool" / f"d-{n}").mkdir(parents=True, exist_ok=True)
        self._fake_gpus()
        self._write_configs()
        self._chown_for_slurm()
        try:
            self._start_munge()
            if self.accounting:
                self._start_accounting()
            self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-f", str(self.conf)])
            for n in NODES:
                self._spawn(f"slurmd-{n}", ["/usr/sbin/slurmd", "-D", "-N", n, "-f", str(self.conf)])
            self._start_sshd()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def add_user(self, name: str) -> Path:
        """A real Unix account with its home under the rig, able to log in by key (useradd leaves
        the password locked, which sshd without PAM refuses: `usermod -p '*'`)."""
        home = self.root / "users" / name
        subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/bin/bash", name], check=True,
                       capture_output=True, timeout=30)
        self.users.append(name)
        subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True, timeout=30)
        home.mkdir(parents=True, exist_ok=True)
        (self.root / "users").chmod(0o755)
        shutil.chown(home, name, name)
        return home

    def stop(self) -> None:
        """End every job, then the daemons, then any step of this rig's jobs still alive.

        A batch step's slurmstepd is reparented to init when its slurmd goes and ignores SIGTERM,
        so the jobs are cancelled while slurmctld can still tell the steps to end, and whatever is
        left is killed: found by the SLURM_CONF it inherited from this rig's slurmd (job ids alone
        are not ours: every rig numbers its jobs from 1)."""
        if "slurmctld" in self.pids:
            self._cancel_all_jobs()
        for name in reversed(list(self.pids)):
            pid = self.pids.pop(name)
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.02)
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        # Jobs' steps (slurmstepd) outlive slurmd by design: end every one started for this rig.
        for pid in sorted(set(_pids_naming(str(self.root))) | set(self.leftover_pids())):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while self.users:
            subprocess.run(["userdel", self.users.pop()], capture_output=True, timeout=30)

    def _cancel_all_jobs(self, wait_s: float = 10.0) -> None:
        """scancel every job of this rig's slurmctld (all of them are the rig's) and wait, bounded,
        until squeue lists none, so their steps end while slurmd still runs."""
        def jobs() -> list[str]:
            try:
                r = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True,
                                   timeout=10)
            except (OSError, subprocess.SubprocessError):
                return []
            return [j for j in r.stdout.split() if j.isdigit()] if r.returncode == 0 else []

        ids = jobs()
        if not ids:
            return
        try:
            subprocess.run(["scancel", *ids], env=self.env, capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and jobs():
            time.sleep(0.1)

    def leftover_pids(self) -> list[int]:
        """Processes this rig started that are alive: its daemons by pid, anything naming its
        directory, and every process (slurmstepd, a job's own) that inherited its SLURM_CONF."""
        mine = f"SLURM_CONF={self.conf}".encode()
        found = {p for p in self.pids.values() if _alive(p)} | set(_pids_naming(str(self.root)))
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if mine in environ and _alive(int(entry)):
                found.add(int(entry))
        return sorted(found)

    def _fake_gpus(self) -> None:
        for i in range(GPUS_PER_NODE * len(NODES)):
            dev = self.root / "dev" / f"nvidia{i}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(195, i))

    def _write_configs(self) -> None:
        r = self.root
        node_lines = []
        gres_lines = ["AutoDetect=off"]
        for i, n in enumerate(NODES):
            node_lines.append(
                f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={self.node_ports[n]} CPUs=2 "
                f"Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=4000 "
                f"Gres=gpu:h100:{GPUS_PER_NODE} State=UNKNOWN")
            first, last = i * GPUS_PER_NODE, (i + 1) * GPUS_PER_NODE - 1
            gres_lines.append(f"NodeName={n} Name=gpu Type=h100 File={r}/dev/nvidia[{first}-{last}]")
        nodes = ",".join(NODES)
        self.conf.write_text("\n".join([
            f"ClusterName={CLUSTER}",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmUser={SLURM_USER}",
            f"SlurmctldPort={self.ctld_port}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={r}/spool/ctld",
            f"SlurmdSpoolDir={r}/spool/d-%n",
            f"SlurmctldPidFile={r}/run/slurmctld.pid",
            f"SlurmdPidFile={r}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "JobAcctGatherType=jobacct_gather/linux",
            *self._accounting_lines(),
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={r}/log/jobcomp.txt",
            "GresTypes=gpu",
            "SlurmdParameters=config_overrides",
            "MailProg=/bin/true",
            *node_lines,
            f"PartitionName={PARTITION} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP",
            f"PartitionName={GPU_PARTITION} Nodes={nodes} MaxTime=04:00:00 State=UP "
            f"TRESBillingWeights={self.gpu_weights}",
            "",
        ]))
        (r / "etc" / "gres.conf").write_text("\n".join(gres_lines) + "\n")

    @property
    def gpu_weights(self) -> str:
        # GRES weights count only for tracked TRES, and GPUs are tracked only with slurmdbd.
        return GPU_WEIGHTS_ACCOUNTED if self.accounting else "CPU=1.0,Mem=0.25G"

    def _accounting_lines(self) -> list[str]:
        if not self.accounting:
            return ["AccountingStorageType=accounting_storage/none"]
        return ["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=localhost",
                f"AccountingStoragePort={self.dbd_port}", "AccountingStorageTRES=gres/gpu,gres/gpu:h100",
                # The munge socket of the connection to slurmdbd (AuthInfo is the controller's).
                f"AccountingStoragePass={self.munge_socket}"]

    def _start_accounting(self) -> None:
        import pwd

        r = self.root
        mysql = pwd.getpwnam("mysql")
        for d in (r / "db", r / "dbrun"):
            os.chown(d, mysql.pw_uid, mysql.pw_gid)
        if not (r / "db" / "mysql").exists():
            subprocess.run(["mariadb-install-db", "--no-defaults", "--user=mysql", f"--datadir={r}/db",
                            "--skip-test-db", "--auth-root-authentication-method=normal"],
                           check=True, capture_output=True, timeout=120)
        self._spawn("mariadbd", [
            "/usr/sbin/mariadbd", "--no-defaults", "--user=mysql", f"--datadir={r}/db", f"--port={self.db_port}",
            "--bind-address=127.0.0.1", f"--socket={r}/dbrun/mysqld.sock", f"--pid-file={r}/dbrun/mysqld.pid",
            "--skip-grant-tables", f"--log-error={r}/log/mariadb.err", "--innodb-buffer-pool-size=16M",
            "--skip-log-bin", "--innodb-log-file-size=8M"])
        _wait(lambda: _port_open(self.db_port), "MariaDB", r / "log" / "mariadb.err")
        dbd = r / "etc" / "slurmdbd.conf"
        dbd.write_text("\n".join([
            "AuthType=auth/munge", f"AuthInfo=socket={self.munge_socket}", "DbdHost=localhost",
            "DbdAddr=127.0.0.1", f"DbdPort={self.dbd_port}", f"SlurmUser={SLURM_USER}",
            f"PidFile={r}/run/slurmdbd.pid", f"LogFile={r}/log/slurmdbd.log",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1", f"StoragePort={self.db_port}",
            "StorageUser=root", "StorageLoc=spz_acct_db", ""]))
        slurm = pwd.getpwnam(SLURM_USER)
        os.chown(dbd, slurm.pw_uid, slurm.pw_gid)
        dbd.chmod(0o600)
        self._spawn("slurmdbd", ["/usr/sbin/slurmdbd", "-D"])
        _wait(lambda: _port_open(self.dbd_port), "slurmdbd", r / "log" / "slurmdbd.log")

        def cluster_added() -> bool:
            res = subprocess.run(["sacctmgr", "-i", "add", "cluster", CLUSTER], env=self.env, capture_output=True,
                                 text=True, timeout=20)
            return res.returncode == 0 or "already exists" in res.stdout + res.stderr

        _wait(cluster_added, "sacctmgr add cluster", r / "log" / "slurmdbd.log")

    def _chown_for_slurm(self) -> None:
        import pwd

        slurm = pwd.getpwnam(SLURM_USER)
        munge = pwd.getpwnam(MUNGE_USER)
        for d in (self.root / "spool" / "ctld", self.root / "log", self.root / "run"):
            os.chown(d, slurm.pw_uid, slurm.pw_gid)
        os.chown(self.root / "munge", munge.pw_uid, munge.pw_gid)
        os.chmod(self.root, 0o755)

    def _start_munge(self) -> None:
        m = self.root / "munge"
        argv = ["/usr/sbin/munged", "-F", f"--socket={self.munge_socket}", f"--pid-file={m}/munged.pid",
                f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed", "--num-threads=2"]
        self._spawn("munged", ["runuser", "-u", MUNGE_USER, "--", *argv])
        _wait(lambda: self.munge_socket.exists(), "munged's socket", self.root / "munge" / "munged.log")

    def _start_sshd(self) -> None:
        s = self.root / "ssh"
        host_key = s / "host_ed25519"
        if not host_key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        shutil.copy(f"{self.key}.pub", s / "authorized_keys")
        Path("/run/sshd").mkdir(exist_ok=True)
        (s / "sshd_config").write_text("\n".join([
            f"Port {self.ssh_port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}",
            f"PidFile {s}/sshd.pid", f"AuthorizedKeysFile {s}/authorized_keys", "StrictModes no",
            "UsePAM no", "PermitRootLogin prohibit-password", "PasswordAuthentication no",
            f"SetEnv SLURM_CONF={self.conf} HOME={self.login_home}", "MaxStartups 100:30:200", "MaxSessions 100", "",
        ]))
        self._spawn("sshd", ["/usr/sbin/sshd", "-D", "-f", str(s / "sshd_config"), "-E", str(s / "sshd.log")])
        _wait(lambda: _port_open(self.ssh_port), "sshd", s / "sshd.log")

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "ab")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**self.env, "HOME": str(self.root / "home")}, start_new_session=True)
        out.close()
        self.pids[name] = proc.pid

    def _wait_ready(self) -> None:
        def idle() -> bool:
            r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True,
                               text=True, timeout=10)
            states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
            return r.returncode == 0 and all(states.get(n) == "idle" for n in NODES)

        _wait(idle, "the Slurm nodes to be idle", self.root / "log" / "slurmctld.log")

    def ssh(self, command: str, *, stdin: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
        """A command on the login node, as a user's ssh would run it."""
        return subprocess.run(
            ["ssh", "-i", str(self.key), "-p", str(self.ssh_port), "-o", "StrictHostKeyChecking=no",
             "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "root@127.0.0.1",
             command], input=stdin, capture_output=True, text=True, timeout=timeout)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie of ours is dead
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _pids_naming(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry))
    return found


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait(check, what: str, log_file: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
        time.sleep(0.05)
    try:
        tail = log_file.read_text(errors="replace")[-2000:]
    except OSError:
        tail = "(no log)"
    raise RuntimeError(f"timed out waiting for {what}; {log_file} ends:\n{tail}")


if __name__ == "__main__":  # a rig by hand: python tests/support/slurm_rig.py DIR
    import sys

    rig = SlurmRig(Path(sys.argv[1]).resolve()).start()
    print(rig.slurm_config(), flush=True)
    try:
        signal.pause()
    finally:
        rig.stop()
