"""The warm CLI worker (cli/warmworker.py, cli/workerclient.py): a command forked from it
behaves as the same command run in its own process (SKYPURZA_CLI_WORKER=0).

Real processes throughout: `spz api start` (its supervisor runs nats-server, the services, the
API server and the worker), local node agents, the `spz` CLI as a user runs it. Each warm run
writes a line to SKYPURZA_CLI_WORKER_STATS (the client, once the worker's child ended), so every
test knows which path a command took: a client that silently always ran cold fails them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from local_cli import REPO, local_cli

from skypurza.cli import workerproto as proto
from skypurza.events import naming

STAGE = "cliworker"
BAD_TASK = "name: x\nresources:\n  cpus: lots\nrun: echo\n"
JOB_ID = re.compile(r"\bJob \d+\b")


def steady(text: str) -> str:
    """A job's narrative without what depends on timing: its id, and the progress lines ("… Job
    N: queued (starting)" shows only when the node was slow to pick it up)."""
    return "\n".join(line for line in JOB_ID.sub("Job N", text).splitlines() if not line.startswith("… "))


@dataclass
class Plane:
    env: dict[str, str]
    home: Path
    stats: Path
    watched: Path
    tmp: Path

    @property
    def state_dir(self) -> Path:
        return self.home / STAGE

    def worker(self) -> dict:
        try:
            return json.loads((self.state_dir / naming.cli_worker_state_file(STAGE).name).read_text())
        except (OSError, ValueError):
            return {}

    def warm_lines(self) -> list[dict]:
        return [json.loads(line) for line in self.stats.read_text().splitlines()] if self.stats.exists() else []


def spz(env: dict[str, str], *args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=env, cwd=REPO, input=input,
                          capture_output=True, text=True, timeout=timeout,
                          **({} if input is not None else {"stdin": subprocess.DEVNULL}))


def cold(env: dict[str, str]) -> dict[str, str]:
    return {**env, "SKYPURZA_CLI_WORKER": "0"}


def _answers(path: Path) -> bool:
    try:
        proto.connect(str(path), 1.0).close()
        return True
    except OSError:
        return False


def wait_for_worker(plane: Plane, other_than: int | None = None, timeout: float = 90) -> int:
    deadline = time.monotonic() + timeout
    sock = plane.state_dir / naming.cli_worker_socket(STAGE).name
    while time.monotonic() < deadline:
        pid = plane.worker().get("pid")
        if pid and pid != other_than and _answers(sock):
            return pid
        time.sleep(0.1)
    raise AssertionError(f"no CLI worker answered on {sock}: {plane.worker()}")


@pytest.fixture(scope="module")
def plane(tmp_path_factory) -> Plane:
    tmp = tmp_path_factory.mktemp("cliworker")
    watched = tmp / "watched.txt"
    watched.write_text("one\n")
    with local_cli(tmp, STAGE) as env:
        env = {**env, "SKYPURZA_NO_PLUGINS": "1", "SKYPURZA_CLI_WORKER_WATCH": str(watched)}
        env.pop("SKYPURZA_CLI_WORKER", None)
        r = spz(env, "api", "start", timeout=150)
        assert r.returncode == 0, r.stderr
        p = Plane({**env, "SKYPURZA_CLI_WORKER_STATS": str(tmp / "warm.jsonl")}, tmp / "home",
                  tmp / "warm.jsonl", watched, tmp)
        wait_for_worker(p)
        try:
            yield p
        finally:
            spz(cold(p.env), "down", "-a", "-y", timeout=120)


def both(plane: Plane, *args: str, env: dict[str, str] | None = None, input: str | None = None,
         warm: bool = True) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The command through the worker, then cold; asserts which path the first one took."""
    env = env or plane.env
    for _attempt in range(4):
        pid = wait_for_worker(plane)
        before = len(plane.warm_lines())
        through = spz(env, *args, input=input)
        lines = plane.warm_lines()[before:]
        # Another engineer's edit of the package made the worker stale (it must not run old code):
        # that command ran cold, rightly; the next worker has the new code.
        stale_meanwhile = not lines and ((plane.worker().get("last_cold") or "").startswith("stale")
                                         or plane.worker().get("pid") != pid)
        if not (warm and stale_meanwhile):
            break
    if warm:
        assert [line["argv"] for line in lines] == [list(args)], f"{args} did not run in the worker: {plane.worker()}"
        assert lines[0].get("exit") == through.returncode
    else:
        assert lines == [], f"{args} ran in the worker, expected cold: {lines}"
    in_process = spz(cold(env), *args, input=input)
    assert len(plane.warm_lines()) == before + len(lines), "SKYPURZA_CLI_WORKER=0 still used the worker"
    return through, in_process


def same(a: subprocess.CompletedProcess, b: subprocess.CompletedProcess, normalize=lambda s: s) -> None:
    assert (a.returncode, normalize(a.stdout), normalize(a.stderr)) == (b.returncode, normalize(b.stdout),
                                                                         normalize(b.stderr))


# ----------------------------------------------------------------------------------- parity

def test_the_same_output_exit_code_and_prompt_through_the_worker_and_cold(plane: Plane) -> None:
    bad = plane.tmp / "bad.yaml"
    bad.write_text(BAD_TASK)
    seen = {}
    for args, extra in ((("status", "-o", "json"), {}), (("status",), {"COLUMNS": "60"}),
                        (("status", "--bogus"), {}), (("status", "-o", "yaml"), {}),
                        (("check-yaml", str(bad)), {}), (("logs", "nope"), {}), (("queue", "nope"), {}),
                        (("jobs", "queue"), {}), (("status", "--help"), {"COLUMNS": "90"})):
        warm, cold_run = both(plane, *args, env={**plane.env, **extra})
        same(warm, cold_run)
        seen[args] = warm
    assert seen[("status", "--bogus")].returncode == 2 and "--bogus" in seen[("status", "--bogus")].stderr
    assert seen[("status", "-o", "yaml")].returncode == 2
    assert seen[("status", "-o", "json")].returncode == 0 and json.loads(seen[("status", "-o", "json")].stdout) == []
    checked = seen[("check-yaml", str(bad))]
    assert checked.returncode != 0 and "lots" in checked.stdout + checked.stderr
    assert seen[("logs", "nope")].returncode == 102 and "No cluster named nope." in seen[("logs", "nope")].stderr


def test_launch_and_exec_exit_codes_are_the_commands(plane: Plane) -> None:
    before = len(plane.warm_lines())
    r = spz(plane.env, "launch", "-y", "-c", "w1", "--infra", "local", "echo up")
    assert r.returncode == 0 and r.stdout.splitlines() == ["up"], r.stderr
    assert plane.warm_lines()[before]["argv"][0] == "launch", "launch ran in the worker"
    warm, cold_run = both(plane, "exec", "w1", "echo hi; exit 3")
    same(warm, cold_run, steady)
    assert warm.stdout.splitlines() == ["hi"] and warm.returncode == 100, "a failed job: sky's exit code 100"
    warm, cold_run = both(plane, "exec", "w1", "echo fine")
    same(warm, cold_run, steady)
    assert warm.returncode == 0 and warm.stdout.splitlines() == ["fine"]
    # Off a terminal a destructive verb refuses without -y; on one (the caller's stdin, passed
    # to the worker's child) it asks, and "n" keeps the cluster: the same way in both.
    warm, cold_run = both(plane, "down", "w1")
    same(warm, cold_run)
    assert warm.returncode != 0 and "-y" in warm.stderr
    asked = []
    for env in (plane.env, cold(plane.env)):
        before = len(plane.warm_lines())
        asked.append(_on_a_terminal(env, ["down", "w1"], "n\n"))
        assert len(plane.warm_lines()) == before + (env is plane.env)
    assert asked[0] == asked[1] and asked[0][0] == 1 and "w1" in asked[0][1], asked
    assert "w1" in spz(cold(plane.env), "status", "-o", "json").stdout, "answered n: still there"


def _on_a_terminal(env: dict[str, str], args: list[str], answer: str) -> tuple[int, str, str]:
    """`spz args` with a terminal (a pty) as its stdin, `answer` typed on it."""
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "skypurza.cli.main", *args], env=env, cwd=REPO,
                                stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.close(follower)
        follower = -1
        os.write(leader, answer.encode())
        out, err = proc.communicate(timeout=60)
        return proc.returncode, out, err
    finally:
        os.close(leader)
        if follower != -1:
            os.close(follower)


def _started(proc: subprocess.Popen, timeout: float = 60) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line == "started\n", (line, proc.poll())


def test_ctrl_c_detaches_the_same_way_through_the_worker_and_cold(plane: Plane) -> None:
    if not plane.worker():
        wait_for_worker(plane)
    spz(plane.env, "launch", "-y", "-c", "w1", "--infra", "local", "echo up")  # there already, or now
    results = []
    for env in (plane.env, cold(plane.env)):
        before = len(plane.warm_lines())
        proc = subprocess.Popen([sys.executable, "-m", "skypurza.cli.main", "exec", "w1", "echo started; sleep 60"],
                                env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            _started(proc)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        results.append((proc.returncode, out, steady(err)))
        if env is plane.env:
            assert [line.get("exit") for line in plane.warm_lines()[before:]] == [proc.returncode]
    assert results[0] == results[1]
    assert results[0][0] == 130 and "Ctrl-C" in results[0][2]


def _commands_of(plane: Plane) -> list[int]:
    """The worker's command processes of this stage (named by the worker, cli/planeprocs.py)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if comm == "spz-command" and str(plane.state_dir).encode() in cmdline:
            out.append(int(entry))
    return out


def test_a_killed_client_takes_its_command_with_it(plane: Plane) -> None:
    wait_for_worker(plane)
    spz(plane.env, "launch", "-y", "-c", "w1", "--infra", "local", "echo up")
    proc = subprocess.Popen([sys.executable, "-m", "skypurza.cli.main", "exec", "w1", "echo started; sleep 60"],
                            env=plane.env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _started(proc)
        commands = _commands_of(plane)
        assert len(commands) == 1, f"one command runs in the worker: {commands}"
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 15
        while _commands_of(plane) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _commands_of(plane) == [], "the command outlived its client"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


# ------------------------------------------------------------------------- what it refuses

def test_a_changed_file_runs_the_next_command_cold_and_a_fresh_worker_serves_after(plane: Plane) -> None:
    old = wait_for_worker(plane)
    plane.watched.write_text("two, longer\n")
    warm, cold_run = both(plane, "status", "-o", "json", warm=False)  # stale: nothing ran in the old code
    same(warm, cold_run)
    assert "stale" in (plane.worker().get("last_cold") or "") or plane.worker().get("pid") != old
    new = wait_for_worker(plane, other_than=old)
    assert new != old
    same(*both(plane, "status", "-o", "json"))


def test_the_clients_environment_is_the_commands(plane: Plane) -> None:
    wait_for_worker(plane)
    assert spz(plane.env, "launch", "-y", "-c", "w1", "--infra", "local", "echo up").returncode == 0
    # Read at run time (never at import): served warm, and as cold prints it.
    ages = re.compile(r"\b\d+[smhd]\b")  # "37s ago": the two runs are seconds apart

    def aged(text: str) -> str:  # "9s" then "10s" widens that column by one: spaces are not compared
        return re.sub(r" +", " ", ages.sub("T", text))

    widths = {}
    for extra in ({"COLUMNS": "50", "NO_COLOR": "1"}, {"COLUMNS": "130", "TERM": "dumb"},
                  {"SKYPURZA_USER": "someone-else"}):
        warm, cold_run = both(plane, "status", env={**plane.env, **extra})
        same(warm, cold_run, aged)
        widths[extra.get("COLUMNS")] = max(len(line) for line in warm.stdout.splitlines())
        same(*both(plane, "queue", "-a", env={**plane.env, **extra}), aged)
    assert widths["50"] <= 50 < widths["130"] <= 130, f"the client's COLUMNS, not the worker's 200: {widths}"
    # Read at import by a pre-imported module (typer's help renderer): such a client runs cold.
    for extra in ({"TERMINAL_WIDTH": "40"}, {"FORCE_COLOR": "1"}, {"PYTHONHASHSEED": "7"}):
        same(*both(plane, "status", "--help", env={**plane.env, **extra}, warm=False))
    assert "TERMINAL_WIDTH" in plane.worker()["read_at_import"]


def test_a_worker_serves_the_stage_of_its_client_never_its_own(plane: Plane, tmp_path: Path) -> None:
    """A second worker on stage `other`'s socket, started with this plane's stage in its
    environment: a command for `other` sees `other`'s clusters (none), never this stage's."""
    wait_for_worker(plane)
    spz(plane.env, "launch", "-y", "-c", "w1", "--infra", "local", "echo up")
    url = json.loads((plane.state_dir / "api.json").read_text())["nats_url"]
    env = {**plane.env, "SKYPURZA_NATS_URL": url}
    worker = subprocess.Popen([sys.executable, "-m", "skypurza.cli.warmworker", "--stage", "other"],
                              env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "w.log").open("wb"))
    try:
        sock = plane.home / "other" / naming.cli_worker_socket("other").name
        deadline = time.monotonic() + 90
        while not _answers(sock):
            assert worker.poll() is None and time.monotonic() < deadline, (tmp_path / "w.log").read_text()
            time.sleep(0.1)
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        other = {**env, "SKYPURZA_STAGE": "other"}
        before = len(plane.warm_lines())
        warm = spz(other, "status", "-o", "json")
        assert len(plane.warm_lines()) == before + 1, "served by the second worker"
        same(warm, spz(cold(other), "status", "-o", "json"))
        assert "w1" not in warm.stdout and "w1" in spz(cold(env), "status", "-o", "json").stdout
    finally:
        worker.terminate()
        worker.wait(15)
    assert not sock.exists(), "a stopped worker removes its socket"


# ---------------------------------------------------------------------------- pure decisions

def test_the_decisions_the_worker_and_client_make() -> None:
    assert proto.peer_allowed(1000, 1000) and not proto.peer_allowed(1001, 1000) and not proto.peer_allowed(0, 1000)
    assert proto.wanted(["status", "-o", "json"], {}) and proto.wanted(["jobs", "queue"], {})
    assert proto.wanted(["exec", "c", "x"], {"SKYPURZA_CLI_WORKER": "1"})
    for argv in (["api", "start"], ["api", "stop"], ["jobs"], ["jobs", "cancel", "1"], ["--stage", "x", "status"], []):
        assert not proto.wanted(argv, {}), argv
    for off in ("0", "false", "off", "no"):
        assert not proto.wanted(["status"], {"SKYPURZA_CLI_WORKER": off})
    w = {"HOME": "/h", "COLUMNS": "80", "PYTHONPATH": "/a"}
    assert proto.env_mismatch(w, {**w, "COLUMNS": "200", "NO_COLOR": "1"}, frozenset({"HOME"})) is None
    assert "HOME" in proto.env_mismatch(w, {**w, "HOME": "/x"}, frozenset({"HOME"}))
    assert "PYTHONPATH" in proto.env_mismatch(w, {**w, "PYTHONPATH": "/b"}, frozenset())
    assert "PYTHONHASHSEED" in proto.env_mismatch(w, {**w, "PYTHONHASHSEED": "0"}, frozenset())
    assert proto.env_mismatch(w, {**w, "X": "1"}, frozenset({"*"})) is not None
    assert proto.exit_status(3 << 8) == {"exit": 3} and proto.exit_status(signal.SIGKILL) == {"signal": 9}
    # The plane runs a worker unless started with SKYPURZA_CLI_WORKER=0; `spz api stop` knows it by
    # its command line, and never takes a user's command it forked (named spz-command) for it.
    from skypurza.cli import planeprocs
    from skypurza.cli.supervisor import cli_worker_wanted

    assert cli_worker_wanted({}) and not cli_worker_wanted({"SKYPURZA_CLI_WORKER": "0"})
    argv = ["python", "-m", planeprocs.WORKER_MODULE, "--stage", "s", planeprocs.CONTROL_PLANE_FLAG, "/h/s"]
    assert planeprocs.classify(argv, "/h/s", "/h/s/jetstream/nats.conf", "s", None) == "cli-worker"
    assert planeprocs.classify(argv, "/h/t", "/h/t/jetstream/nats.conf", "t", None) is None
    assert set(planeprocs.FORKED_BY_WORKER) == {"spz-command", "spz-monitor"}


def test_messages_are_framed_and_bounded() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        r, w = os.pipe()
        proto.send(a, {"argv": ["spz", "x" * 100_000]}, (r,))
        message, fds = proto.recv(b, proto.MAX_FDS)
        assert message == {"argv": ["spz", "x" * 100_000]} and len(fds) == 1
        for fd in (r, w, *fds):
            os.close(fd)
        a.sendall((proto.MAX_MESSAGE_BYTES + 1).to_bytes(4, "big"))
        with pytest.raises(proto.ProtocolError):
            proto.recv(b)
        a.sendall(b"\0\0\0\x02[]")
        with pytest.raises(proto.ProtocolError):
            proto.recv(b)


def test_the_client_stays_light_and_finds_the_stage_as_the_cli_does(tmp_path: Path, monkeypatch) -> None:
    """The client runs before anything else of every allowlisted command: with no worker to talk
    to it imports nothing but the stage's naming (a real process, no plane). Only what the client
    adds is judged: the interpreter's own start-up (site's .pth files, which on some machines import
    certifi and with it typing and struct) happens before any command and is not the client's."""
    probe = ("import sys, json; started = set(sys.modules); from skypurza.cli import workerclient as w; "
             "w.run(['status']); print(json.dumps(sorted(set(sys.modules) - started)))")
    env = {**os.environ, "SKYPURZA_HOME": str(tmp_path), "SKYPURZA_STAGE": "light"}
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    modules = set(json.loads(r.stdout.splitlines()[-1])) - {"json", "json.decoder", "json.scanner", "json.encoder"}
    heavy = sorted(m for m in modules if m.split(".")[0] in ("typer", "click", "rich", "pydantic", "nats", "yaml",
                                                             "asyncio", "socket", "typing", "struct"))
    assert heavy == [] and "skypurza.events.naming" in modules, heavy
    from skypurza.cli.workerclient import stage_of

    assert stage_of({"SKYPURZA_STAGE": "mine"}) == "mine"
    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path))
    assert stage_of({}) == naming.DEFAULT_STAGE
    (tmp_path / "config.yaml").write_text("nats_url: nats://x:1\nstage: 'prod'  # the team's\n")
    assert stage_of({}) == "prod" and stage_of({"SKYPURZA_STAGE": "env"}) == "env"
