"""Running a job phase on a Slurm allocation: the agent's one seam for `--infra slurm`.

The agent of a Slurm node runs on the control plane's machine (the cluster gets no daemon and its
nodes never reach our bus). Everything it does for a phase stays the same — the detached local
process with its pid, log and exit files, the log tail, the kill of its process group — except
what that process runs: instead of the phase script, `executor_script` is a small bash script
that runs the phase as an `srun --overlap` step of the allocation through the login node:

    ssh -F ~/.slurm/config <cluster> 'srun --jobid=<alloc> --overlap -N1 -n1 -w <node> bash ...'

- The job's environment (the same `envcontract.py` variables, secrets included) is written by
  the executor from its own environment into the SSH session's stdin, then the phase script:
  values never go onto the control plane's disk or into a command line; on the compute node they
  live in a 0600 temporary file for the step's life.
- stdout and stderr of the step come back through ssh into the phase's log file: `spz logs`
  streams them as on any node. ssh's exit status is the step's (srun passes the task's on).
- The session's stdin then stays open: when the agent kills the executor (cancel, down), the
  connection closes, the login node's side sees end of input and ends the srun step.
- CUDA_VISIBLE_DEVICES is Slurm's (from the allocation's GRES), not ours.
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Iterable

from .envcontract import CUDA_VISIBLE_DEVICES
from .userenv import phase_script

SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15",
               "-o", "ServerAliveCountMax=4", "-o", "LogLevel=ERROR")
WORKDIR = "sky_workdir"


def ssh_argv(config: str, host: str) -> list[str]:
    return ["ssh", "-F", config, *SSH_OPTIONS, host]


def step_keys(keys: Iterable[str]) -> list[str]:
    """The job's variables the step gets: all of them but the GPUs Slurm assigns itself."""
    return [k for k in dict.fromkeys(keys) if k != CUDA_VISIBLE_DEVICES]


def remote_command(*, job: str, node: str, step_name: str, remote_dir: str, marker: str,
                   uid: str | None = None) -> str:
    """What the login node runs (its own shell): read the phase from stdin, run it as a step,
    end the step when our side of the connection goes away. With `uid` (submit_as_user) the step
    runs as that Unix account (srun started by `runuser`), in its own home: srun passes on the
    login identity's environment, so HOME, USER and LOGNAME are the account's again first."""
    as_user = ('u=$(id -un); export USER="$u" LOGNAME="$u" HOME="$(getent passwd "$u" | cut -d: -f6)"; '
               if uid else "")
    inner = (f'{as_user}W="$HOME"/{shlex.quote(remote_dir + "/" + WORKDIR)}; f=$(mktemp) || exit 1; cat > "$f"; '
             'mkdir -p "$W" && cd "$W" || exit 1; bash "$f" </dev/null; c=$?; rm -f "$f"; exit $c')
    # As the account: `srun --uid` from root fails the step's credential check in Slurm 22.05
    # ("Invalid job credential"), so the login node's root starts srun as the account instead.
    srun = [*(["runuser", "-u", uid, "--"] if uid else []), "srun", f"--jobid={job}", "--overlap", "--nodes=1",
            "--ntasks=1", f"--nodelist={node}", f"--job-name={step_name}", "--quiet", "--kill-on-bad-exit=1",
            "bash", "-c", inner]
    return "\n".join([
        f'd="$HOME"/{shlex.quote(remote_dir)}',
        'mkdir -p "$d" && lf=$(mktemp "$d/phase.XXXXXX") || exit 255',
        f"sed -n '/^{marker}$/q;p' > \"$lf\"",
        'exec 4<"$lf"; rm -f "$lf"',
        " ".join(shlex.quote(a) for a in srun) + " <&4 &",
        "p=$!; exec 4<&-",
        "{ cat >/dev/null 2>&1; kill -TERM $p; } >/dev/null 2>&1 </dev/stdin &",
        "wait $p",
    ])


def executor_script(user_script: str, keys: Iterable[str], *, config: str, host: str, job: str, node: str,
                    step_name: str, remote_dir: str, marker: str | None = None, uid: str | None = None) -> str:
    """The local bash script of one phase (see the module doc)."""
    marker = marker or f"__spz_end_{secrets.token_hex(12)}"
    names = step_keys(keys)
    phase = phase_script(user_script, _Here(), names)
    heredoc = f"__SPZ_PHASE_{secrets.token_hex(8)}"
    command = remote_command(job=job, node=node, step_name=step_name, remote_dir=remote_dir, marker=marker, uid=uid)
    return "\n".join([
        f"# Written by the SkyPurza node agent: this phase runs as an srun step of Slurm allocation {job} on {node}.",
        'hold=$(mktemp -u "${TMPDIR:-/tmp}/spz-hold.XXXXXX") && mkfifo -m 600 "$hold" || exit 255',
        'exec 3<>"$hold"; rm -f "$hold"',
        "{",
        f"  for k in {' '.join(names)}; do printf 'export %s=%q\\n' \"$k\" \"${{!k}}\"; done",
        f"  cat <<'{heredoc}'",
        phase.rstrip("\n"),
        heredoc,
        f"  printf '%s\\n' {shlex.quote(marker)}",
        "} >&3 &",
        "exec " + " ".join(shlex.quote(a) for a in ssh_argv(config, host)) + " " + shlex.quote(command) + " <&3",
        "",
    ])


class _Here:
    """phase_script's workdir: the step has already changed into the cluster's workdir."""

    def __str__(self) -> str:
        return "."


# ---------------------------------------------------------------------------------- workdir sync
# The job's workdir and file mounts are first put in place in the agent's own home (mounts.py,
# confined to it), then that home (but the agent's state) is copied to the cluster in one tar
# stream over SSH: the workdir into the cluster's directory, each `~/...` mount under the
# login user's home (the mapped account's, owned by it, with submit_as_user), as SkyPilot places them. The login and compute nodes share the home
# (as SkyPilot's Slurm backend assumes). Every node's agent syncs; one `flock` and a mark of the
# content's digest make the first do the copy and the others find it done, so no step ever
# reads a file another node is rewriting.

SYNC_TIMEOUT_S = 600.0
STATE_DIR = ".spz-agent"


def sync_command(remote_dir: str, digest: str, uid: str | None = None) -> str:
    """What the login node runs: under the lock, unpack stdin unless this content is there. With
    `uid` (submit_as_user) it runs as that account, in its home, where its steps run: what it
    unpacks is its own (the login identity is root there, as `sbatch --uid` needs)."""
    d = f'"$HOME"/{shlex.quote(remote_dir)}'
    mark = f"{d}/.synced-{digest}"
    body = "\n".join([
        f"mkdir -p {d} || exit 1",
        f"exec 9>{d}/.sync.lock && flock -w 600 9 || exit 1",
        f"if [ -e {mark} ]; then cat >/dev/null; exit 0; fi",
        'tar -xf - -C "$HOME" --no-same-owner || exit 1',
        f"touch {mark}",
    ])
    if not uid:
        return body
    home = 'export HOME="$(getent passwd "$(id -un)" | cut -d: -f6)"; [ -n "$HOME" ] && cd "$HOME" || exit 1'
    return f"exec runuser -u {shlex.quote(uid)} -- bash -c {shlex.quote(home + chr(10) + body)}"


def pack_command(home: str, remote_dir: str) -> list[str]:
    """The local tar of the agent's home: its state left out, the workdir renamed into the
    cluster's directory."""
    return ["tar", "-C", home, "--exclude", f"./{STATE_DIR}", "--sort=name", "--mtime=@0", "--owner=0",
            "--group=0", "--numeric-owner", "--transform", f"s,^\\./{WORKDIR}\\(/\\|$\\),./{remote_dir}/{WORKDIR}\\1,",
            "-cf", "-", "."]


def sync_home(home: str, *, config: str, host: str, remote_dir: str, timeout_s: float = SYNC_TIMEOUT_S,
              uid: str | None = None) -> None:
    """Copy the agent's home to the cluster (blocking, bounded); RuntimeError with ssh's words."""
    import hashlib
    import subprocess
    import tempfile

    with tempfile.TemporaryFile() as archive:
        packed = subprocess.run(pack_command(home, remote_dir), stdout=archive, stderr=subprocess.PIPE,
                                timeout=timeout_s)
        if packed.returncode != 0:
            raise RuntimeError(f"cannot pack the workdir: {packed.stderr.decode(errors='replace')[-300:]}")
        archive.seek(0)
        digest = hashlib.sha256()
        for block in iter(lambda: archive.read(1 << 20), b""):
            digest.update(block)
        archive.seek(0)
        sent = subprocess.run([*ssh_argv(config, host), sync_command(remote_dir, digest.hexdigest()[:32], uid)],
                              stdin=archive, capture_output=True, timeout=timeout_s)
    if sent.returncode != 0:
        raise RuntimeError(f"cannot copy the workdir to {host}: "
                           f"{sent.stderr.decode(errors='replace').strip()[-300:] or f'exit {sent.returncode}'}")
