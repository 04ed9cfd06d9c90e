"""Where a user waits: wall time of `spz` commands as a user runs them, each beside its baseline
measured in the same run (issue 21).

Rows (medians of --runs):
- cold commands: `spz --help`, `spz check-yaml f.yaml`, `spz launch --dryrun -o json f.yaml`
  (a plain task, placed without the pydantic models: events/taskspec/plaintask.py; and the same
  task with a key only the models read, `resources.labels`), beside Python's own start-up
  (`python -c pass`);
- on the `local` infra with the control plane up (`spz api start`, real nats-server, services,
  node agents): `spz launch -c NEW 'echo hi'` (exit, and its first line of output), `spz exec
  CLUSTER 'echo hi'` (exit), `spz jobs launch 'echo hi'` to SUCCEEDED (exit);
- the views, end to end (a real `spz` process against a real nats-server and status service,
  the clusters and managed jobs seeded on the log as bench/api.py seeds them): `spz status` with
  100 and 5,000 clusters known, `spz jobs queue` (the default view: the newest 50) and `spz jobs
  queue -a` with 5,000 managed jobs;
- what a per-cluster verb reads (`read_cluster`, in this process): a new cluster, and one with
  --ticks usage events on its subject, beside the old read of its whole subject;
- rendering `spz status`'s table of 5,000 clusters (cli/tables.py), beside rich's own table.

Each row has wall seconds and the command's CPU seconds (user + system); on a loaded machine the
CPU figure is the one to compare. The rows the warm CLI worker serves (local and views: a user
with the control plane up) run through it, as a user's do (`spz api start` starts it; the views
start it as the supervisor does), with `worker cpu s` the CPU of the worker's child that ran the
command, and each has a `cold` line beside it: SKYPURZA_CLI_WORKER=0, the command in its own
process. The cold rows run with bytecode caches written once (a user's
install has them); `--no-bytecode` keeps a shell's PYTHONDONTWRITEBYTECODE.

Baseline: with `--baseline DIR`, each row runs a second time with the code of DIR (a checkout
whose `DIR/skypurza` is the package, e.g. `git archive HEAD | tar -x -C DIR/skypurza`) put first
on PYTHONPATH: the old code path, same machine, same control plane, same run. SkyPilot is timed
too where `sky` is installed (or `--sky-python` names a Python that has it, e.g. a virtualenv with
`pip install skypilot==0.14.1`): its optimizer placing the same task from a cold process, in a
HOME bench/skyhome.py prepares so that it runs offline (AWS recorded as `sky check` would, a
small stand-in catalog), with the dry run's ratio to it. SkyPilot runs from its own virtualenv,
whose interpreter processes no `.pth` file but its own; `--spz-python` names the interpreter of a
virtualenv where SkyPilot's twin is installed the same way (`python -m venv V && V/bin/pip install
.`), for the dry run (and Python's start-up) timed from there as well, and the ratio of the two.

Rows of the issue not timed here have their own benches: bus vs bare nats-py (bench/bus.py),
replays (bench/replay.py), 1,000 placements (bench/optimizer.py), ledger replay (bench/ledger.py),
a new local node's PlacementChosen -> NodeReady (bench/provision.py --skip aws).

    python bench/latency.py [--runs 3] [--baseline DIR] [--skip local,views] [--sky-python PY] [--spz-python PY] [-o json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from skypurza.events.natsserver import free_port

TASK = "name: hi\nresources:\n  cpus: 1+\nrun: echo hi\n"
# The same task with a key the plain loader leaves to the models (events/taskspec/plaintask.py):
# the dry run of a task outside the plain subset, pydantic models and all.
MODEL_TASK = "name: hi\nresources:\n  cpus: 1+\n  labels: {team: ml}\nrun: echo hi\n"
COMMAND_TIMEOUT_S = 180
NO_BYTECODE = False  # --no-bytecode: time the cold rows with PYTHONDONTWRITEBYTECODE as the shell has it
SKY_PYTHON: str | None = None  # --sky-python: an interpreter with SkyPilot installed (its own virtualenv)
SPZ_PYTHON: str | None = None  # --spz-python: an interpreter with SkyPurza installed (its own virtualenv)


def _env(base: dict[str, str], tree: Path | None) -> dict[str, str]:
    env = dict(base)
    if tree is not None:
        env["PYTHONPATH"] = str(tree) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float | None, int, float]:
    """Seconds to exit, seconds to the first line of stdout (None: none), exit status, and the
    command's CPU seconds (user + system: what a loaded machine inflates least)."""
    c0 = _children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    first = None
    for _ in proc.stdout:
        if first is None:
            first = time.perf_counter() - t0
    try:
        proc.wait(timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return time.perf_counter() - t0, first, proc.returncode, _children_cpu() - c0


def _spz(*args: str) -> list[str]:
    return [sys.executable, "-m", "skypurza.cli.main", *args]


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def with_cold(trees: dict[str, Path | None]) -> dict[str, Path | None]:
    """The rows a warm CLI worker serves (cli/warmworker.py): each beside `cold`, the same code
    with SKYPURZA_CLI_WORKER=0 (the command in its own process, as without a worker)."""
    return {**trees, "cold": None}


def measure(name: str, argv_of, env_of, cwd: Path, runs: int, trees: dict[str, Path | None],
            ok=(0,), warm_up: bool = False) -> dict[str, dict[str, float]]:
    row: dict[str, dict[str, float]] = {}
    for label, tree in trees.items():
        exits, firsts, cpus, worker_cpus = [], [], [], []
        env = env_of(tree)
        stats = cwd / f".worker-stats-{os.getpid()}.jsonl"
        env = {**env, "SKYPURZA_CLI_WORKER": "0"} if label == "cold" else {**env, "SKYPURZA_CLI_WORKER_STATS": str(stats)}
        if warm_up:  # writes the bytecode caches, as pip's install does: "cold" is the process, not the disk
            _timed(argv_of(label, -1), env, cwd)
        for i in range(runs):
            stats.unlink(missing_ok=True)
            wall, first, rc, cpu = _timed(argv_of(label, i), env, cwd)
            if rc not in ok:
                raise SystemExit(f"{name} ({label}) exited {rc}")
            exits.append(wall)
            cpus.append(cpu)
            if first is not None:
                firsts.append(first)
            if stats.exists():  # the warm worker ran it: its child's CPU seconds too
                worker_cpus.append(sum(json.loads(line).get("cpu_s", 0.0) for line in stats.read_text().splitlines()))
        stats.unlink(missing_ok=True)
        row[label] = {"exit_s": _median(exits), "cpu_s": _median(cpus)}
        if firsts:
            row[label]["first_line_s"] = _median(firsts)
        if worker_cpus:
            row[label]["worker_cpu_s"] = _median(worker_cpus)
            row[label]["warm_runs"] = len(worker_cpus)
    return row


def start_cli_worker(stage: str, env: dict[str, str], work: Path) -> subprocess.Popen:
    """The stage's CLI worker, started as the supervisor starts it (cli/supervisor.py), for the
    rows that run their own nats-server and status service instead of `spz api start`."""
    from skypurza.cli.workerproto import connect
    from skypurza.events import naming

    proc = subprocess.Popen([sys.executable, "-m", "skypurza.cli.warmworker", "--stage", stage], env=env,
                            stdout=subprocess.DEVNULL, stderr=(work / f"{stage}-cli-worker.log").open("wb"))
    sock = Path(env["SKYPURZA_HOME"]) / stage / naming.cli_worker_socket(stage).name
    deadline = time.monotonic() + 120
    while True:
        try:
            connect(str(sock), 1.0).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the CLI worker did not start; see {work / f'{stage}-cli-worker.log'}")
            time.sleep(0.1)


def cold_rows(runs: int, trees: dict[str, Path | None], work: Path) -> dict[str, dict]:
    task = work / "hi.yaml"
    task.write_text(TASK)
    model_task = work / "labels.yaml"
    model_task.write_text(MODEL_TASK)
    env = {**os.environ, "SKYPURZA_HOME": str(work / "cold-home"), "SKYPURZA_STAGE": "benchcold",
           "PYTHONPYCACHEPREFIX": str(work / "pycache")}
    env.pop("SKYPURZA_NATS_URL", None)
    # A user's install has its .pyc files (pip compiles them); a shell with PYTHONDONTWRITEBYTECODE
    # would time the compiler instead (~100 ms of every command here). --no-bytecode keeps it.
    if not NO_BYTECODE:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    out: dict[str, dict] = {
        "python -c pass": measure("python -c pass", lambda _l, _i: [sys.executable, "-c", "pass"],
                                  lambda t: _env(env, t), work, runs, {"python": None}, warm_up=True),
    }
    for what, args in (("spz --help", ("--help",)), ("spz check-yaml f.yaml", ("check-yaml", str(task))),
                       ("spz launch --dryrun -o json", ("launch", "--dryrun", "-o", "json", str(task))),
                       ("spz launch --dryrun -o json, not plain", ("launch", "--dryrun", "-o", "json",
                                                                   str(model_task)))):
        out[what] = measure(what, lambda _l, _i, a=args: _spz(*a), lambda t: _env(env, t), work, runs, trees,
                            warm_up=True)
    if SPZ_PYTHON:
        # As SkyPilot is timed: from a virtualenv of its own, installed as a user installs it (no
        # editable finder, no site .pth of this machine's), the code that virtualenv holds.
        venv_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        out["python -c pass, own virtualenv"] = measure(
            "python -c pass", lambda _l, _i: [SPZ_PYTHON, "-c", "pass"], lambda t: venv_env, work, runs,
            {"venv": None}, warm_up=True)
        out["spz launch --dryrun -o json, own virtualenv"] = measure(
            "dry run (venv)", lambda _l, _i: [SPZ_PYTHON, "-m", "skypurza.cli.main", "launch", "--dryrun", "-o", "json",
                                             str(task)],
            lambda t: venv_env, work, runs, {"venv": None}, warm_up=True)
    sky_python = SKY_PYTHON or (sys.executable if importlib.util.find_spec("sky") is not None else None)
    if sky_python:
        # SkyPilot's own optimizer placing the same task from a cold process, offline: a HOME where
        # `sky check` has recorded AWS and a small stand-in catalog lies (bench/skyhome.py).
        from skyhome import prepare_sky_home

        sky_env = {**{k: v for k, v in env.items() if k != "PYTHONPATH"},
                   **prepare_sky_home(work / "sky-home", sky_python)}
        code = ("import sky; from sky import optimizer; t = sky.Task(run='echo hi'); "
                "t.set_resources(sky.Resources(cpus='1+', infra='aws')); d = sky.Dag(); d.add(t); "
                "optimizer.Optimizer.optimize(d, quiet=True); assert t.best_resources is not None")
        out["SkyPilot 0.14.1 optimizer, cold"] = measure(
            "sky", lambda _l, _i: [sky_python, "-c", code], lambda t: sky_env, work, runs, {"skypilot": None},
            warm_up=True)
    return out


def local_rows(runs: int, trees: dict[str, Path | None], work: Path) -> dict[str, dict]:
    env = {**os.environ, "SKYPURZA_HOME": str(work / "home"), "SKYPURZA_STAGE": "benchlat",
           "SKYPURZA_USER": "bench", "SKYPURZA_NATS_PORT": str(free_port()), "SKYPURZA_NO_PLUGINS": "1"}
    env.pop("SKYPURZA_NATS_URL", None)
    run = lambda *a: subprocess.run(_spz(*a), env=env, cwd=work, capture_output=True, text=True,  # noqa: E731
                                    timeout=COMMAND_TIMEOUT_S)
    r = run("api", "start")
    if r.returncode != 0:
        raise SystemExit(f"spz api start failed: {r.stderr}")
    out: dict[str, dict] = {}
    try:
        tag = uuid.uuid4().hex[:6]
        out["spz launch -c NEW 'echo hi'"] = measure(
            "launch", lambda label, i: _spz("launch", "-y", "--infra", "local", "-c", f"n{tag}{label[:1]}{i}",
                                            "echo hi"),
            lambda t: _env(env, t), work, runs, with_cold(trees))
        r = run("launch", "-y", "--infra", "local", "-c", f"x{tag}", "echo hi")
        if r.returncode != 0:
            raise SystemExit(f"launch for exec failed: {r.stderr}")
        out["spz exec CLUSTER 'echo hi'"] = measure(
            "exec", lambda _l, _i: _spz("exec", f"x{tag}", "echo hi"), lambda t: _env(env, t), work, runs, with_cold(trees))
        out["spz jobs launch to SUCCEEDED"] = measure(
            "jobs launch", lambda _l, _i: _spz("jobs", "launch", "-y", "--infra", "local", "echo hi"),
            lambda t: _env(env, t), work, runs, with_cold(trees))
    finally:
        run("down", "-a", "-y")
        run("api", "stop")
    return out


def _bench_api():
    """bench/api.py, for its seeding of clusters (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("_bench_api", Path(__file__).with_name("api.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def view_rows(runs: int, trees: dict[str, Path | None], work: Path, clusters: tuple[int, int] = (100, 5_000),
              jobs: int = 5_000) -> dict[str, dict]:
    """`spz status` with `clusters` known, `spz jobs queue` (default and -a) with `jobs` managed
    jobs: real processes against a real nats-server and the status service (what those views
    ask), the log seeded first and the projection caught up before any is timed."""
    import asyncio

    from skypurza.events import status_queries
    from skypurza.events.bus import Bus
    from skypurza.events.managed_events import ManagedJobStatusChanged, ManagedJobSubmitted
    from skypurza.events.natsserver import NatsServer

    api = _bench_api()
    stage = "benchviews"
    server = NatsServer(store_dir=work / "views-js", port=free_port()).start()
    env = {**os.environ, "SKYPURZA_HOME": str(work / "views-home"), "SKYPURZA_STAGE": stage,
           "SKYPURZA_NATS_URL": server.url, "SKYPURZA_NO_PLUGINS": "1", "COLUMNS": "200"}
    status = None

    async def seed(n_clusters: int, n_jobs: int, first_job: int) -> None:
        bus = await Bus.connect(server.url, stage, source="/bench/latency")
        try:
            if n_clusters:
                await api.seed_clusters(bus, n_clusters, 10)
            events = []
            for j in range(first_job, first_job + n_jobs):
                events.append(bus.envelope(ManagedJobSubmitted(managed_job_id=j, name=f"job-{j}",
                                                               tasks=[{"run": "true"}], user="bench")))
                events.append(bus.envelope(ManagedJobStatusChanged(
                    managed_job_id=j, status="SUCCEEDED" if j % 3 else "RUNNING",
                    kind="succeeded" if j % 3 else "started", cluster=f"c{j % max(n_clusters, 1):05d}")))
            for start in range(0, len(events), 3000):
                await bus.publish_many(events[start:start + 3000])
            seq = await bus.last_seq()
            deadline = time.monotonic() + 180
            while True:  # the projection has caught up with everything seeded
                try:
                    await status_queries.status(bus, min_seq=seq, timeout=10)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise SystemExit("the status service did not catch up with the seeded log")
                    await asyncio.sleep(0.5)
        finally:
            await bus.close()

    out: dict[str, dict] = {}
    worker = None
    try:
        worker = start_cli_worker(stage, env, work)
        status = subprocess.Popen([sys.executable, "-m", "skypurza.services.status.service", "--nats", server.url,
                                   "--stage", stage, "--db", str(work / "views-status.duckdb")],
                                  stdout=(work / "views-status.log").open("wb"), stderr=subprocess.STDOUT,
                                  env={**os.environ, "SKYPURZA_NO_PLUGINS": "1"})
        small, big = clusters
        asyncio.run(seed(small, 0, 1))
        for what, args in ((f"spz status, {small:,} clusters", ("status",)),):
            out[what] = measure(what, lambda _l, _i, a=args: _spz(*a), lambda t: _env(env, t), work, runs,
                                with_cold(trees))
        asyncio.run(seed(big, jobs, 1))  # the first `small` again (the same names), and the rest
        for what, args in ((f"spz status, {big:,} clusters", ("status",)),
                           (f"spz jobs queue, {jobs:,} jobs", ("jobs", "queue")),
                           (f"spz jobs queue -a, {jobs:,} jobs", ("jobs", "queue", "-a"))):
            out[what] = measure(what, lambda _l, _i, a=args: _spz(*a), lambda t: _env(env, t), work, runs,
                                with_cold(trees))
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(15)
        if status is not None:
            status.terminate()
            try:
                status.wait(10)
            except subprocess.TimeoutExpired:
                status.kill()
                status.wait(5)
        server.stop()
    return out


def cluster_read_rows(runs: int, ticks: int, work: Path) -> dict[str, dict]:
    """What `exec`, `logs --status`, `down` read of a cluster (cli/clusterlog.py `read_cluster`):
    a new cluster and one with `ticks` UsageRecorded on its subject, beside the old read (the
    cluster's whole subject, ticks decoded then skipped) in the same run."""
    import asyncio
    from datetime import timedelta

    from skypurza.cli.clusterlog import fold, read_cluster
    from skypurza.events import naming
    from skypurza.events.bus import Bus
    from skypurza.events.envelope import utcnow
    from skypurza.events.models import (Candidate, ClusterProvisioned, JobQueued, JobStarted, JobSucceeded,
                                        NodeInfo, NodeReady, UsageRecorded)
    from skypurza.events.natsserver import NatsServer

    def history(cluster: str) -> list:
        t = utcnow() - timedelta(days=30)
        return [ClusterProvisioned(cluster=cluster, task_id="t", placement_id="p",
                                   candidate=Candidate(infra="aws", region="us-east-1", zone="us-east-1a",
                                                       instance_type="m6i.large", hourly_price_micros=96_000,
                                                       num_nodes=1),
                                   nodes=[NodeInfo(rank=0, instance_id="i-1")], hourly_price_micros=96_000,
                                   launched_at=t, user="bench"),
                NodeReady(cluster=cluster, rank=0),
                JobQueued(cluster=cluster, job_id=1, task_id="t", task={"run": "echo hi"}),
                JobStarted(cluster=cluster, job_id=1, started_at=t),
                JobSucceeded(cluster=cluster, job_id=1, ended_at=t)]

    async def old_read(bus: Bus, name: str):
        items = []
        async for s in bus.replay(filter_subject=naming.aggregate_subjects(bus.stage, "cluster", name)):
            if s.event is not None and s.envelope is not None and s.event.EVENT_NAME != "usage_recorded":
                items.append((s.event, s.envelope.time, s.seq))
        return fold(name, items)

    async def go(url: str) -> dict[str, dict]:
        bus = await Bus.connect(url, "benchreads", source="/bench/latency")
        t = utcnow() - timedelta(days=30)
        await bus.publish_many(history("new"))
        await bus.publish_many(history("old") + [
            UsageRecorded(cluster="old", rank=0, instance_id="i-1", start=t + timedelta(minutes=i),
                          end=t + timedelta(minutes=i + 1), hourly_price_micros=96_000, cost_micros=1_600)
            for i in range(ticks)])
        out: dict[str, dict] = {}
        for name, what in (("new", "read a new cluster"), ("old", f"read a cluster with {ticks:,} usage events")):
            row: dict[str, dict[str, float]] = {}
            for label, fn in (("spz", read_cluster), ("old path", old_read)):
                times = []
                for _ in range(runs):
                    t0 = time.perf_counter()
                    c = await fn(bus, name)
                    times.append(time.perf_counter() - t0)
                    assert c.status == "UP" and 1 in c.jobs
                row[label] = {"exit_s": _median(times)}
            out[what] = row
        await bus.close()
        return out

    server = NatsServer(store_dir=work / "reads-js", port=free_port()).start()
    try:
        return asyncio.run(go(server.url))
    finally:
        server.stop()


def table_rows(runs: int, rows: int) -> dict[str, dict]:
    """Rendering `spz status`'s table of `rows` clusters, piped (cli/tables.py `render_table`),
    beside rich's own table of the same rows (the old path): CPU seconds in this process."""
    import io

    from rich.console import Console

    from skypurza.cli.tables import _rich_table, render_table

    columns = ("NAME", "INFRA", "RESOURCES", "STATUS", "AUTOSTOP", "LAUNCHED", "$/H")
    cells = [(f"cluster-{i}", "aws (us-east-1)", "1x m6i.large (cpus=2, mem=8)", "UP", "10m", "3 days ago",
              "0.0960") for i in range(rows)]

    def ours(console: Console) -> None:
        assert render_table(console, columns, cells)

    def old(console: Console) -> None:
        console.print(_rich_table(columns, cells))

    out: dict[str, dict[str, float]] = {}
    for label, fn in (("spz", ours), ("old path", old)):
        times = []
        for _ in range(runs):
            console = Console(file=io.StringIO(), width=100_000, highlight=False)
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            fn(console)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            times.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
        out[label] = {"exit_s": _median(times), "cpu_s": _median(times)}
    return {f"render the status table, {rows:,} clusters": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline", type=Path, help="a tree whose skypurza/ is the old code")
    ap.add_argument("--skip", default="", help="comma-separated: cold,local,views,reads,tables")
    ap.add_argument("--ticks", type=int, default=50_000, help="usage events on the old cluster (reads)")
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    ap.add_argument("--no-bytecode", action="store_true", help="cold rows: keep PYTHONDONTWRITEBYTECODE")
    ap.add_argument("--sky-python", help="a Python with SkyPilot installed (e.g. a virtualenv's bin/python), "
                                         "for the SkyPilot baseline row")
    ap.add_argument("--spz-python", help="a Python with SkyPurza installed as a user installs it (a virtualenv's "
                                         "bin/python): the dry run timed from there too, as SkyPilot is")
    args = ap.parse_args()
    global NO_BYTECODE, SKY_PYTHON, SPZ_PYTHON
    NO_BYTECODE = args.no_bytecode
    for flag, value in (("--sky-python", args.sky_python), ("--spz-python", args.spz_python)):
        if value and not Path(value).is_file():
            ap.error(f"{flag}: {value} not found")
    SKY_PYTHON, SPZ_PYTHON = args.sky_python, args.spz_python
    if not 1 <= args.runs <= 20:
        ap.error("--runs: 1 to 20")
    trees: dict[str, Path | None] = {"spz": None}
    if args.baseline is not None:
        if not (args.baseline / "skypurza" / "cli" / "main.py").is_file():
            ap.error(f"--baseline: {args.baseline}/skypurza/cli/main.py not found")
        trees["baseline"] = args.baseline.resolve()
    skip = set(filter(None, args.skip.split(",")))
    result: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        if "cold" not in skip:
            result.update(cold_rows(args.runs, trees, work))
        if "local" not in skip:
            result.update(local_rows(args.runs, trees, work))
        if "views" not in skip:
            result.update(view_rows(args.runs, trees, work))
        if "reads" not in skip:
            result.update(cluster_read_rows(args.runs, args.ticks, work))
        if "tables" not in skip:
            result.update(table_rows(args.runs, 5_000))
    if args.output == "json":
        print(json.dumps(result, indent=2))
        return
    print(f"{'what a user does':<46}{'code':<10}{'exit s':>8}{'first line s':>14}{'cpu s':>8}{'worker cpu s':>14}")
    for what, row in result.items():
        for label, figs in row.items():
            first, cpu, wcpu = figs.get("first_line_s"), figs.get("cpu_s"), figs.get("worker_cpu_s")
            print(f"{what:<46}{label:<10}{figs['exit_s']:>8.3f}{'' if first is None else f'{first:.3f}':>14}"
                  f"{'' if cpu is None else f'{cpu:.3f}':>8}{'' if wcpu is None else f'{wcpu:.3f}':>14}")
    sky = result.get("SkyPilot 0.14.1 optimizer, cold")
    for key, label, what in (("spz launch --dryrun -o json", "spz", "spz's cold dry run"),
                             ("spz launch --dryrun -o json, not plain", "spz",
                              "spz's cold dry run of a task the models load"),
                             ("spz launch --dryrun -o json, own virtualenv", "venv",
                              "spz's cold dry run, each from its own virtualenv")):
        dry = result.get(key)
        if sky and dry:
            print(f"SkyPilot's cold optimizer / {what}: {sky['skypilot']['exit_s'] / dry[label]['exit_s']:.1f}x "
                  f"wall, {sky['skypilot']['cpu_s'] / dry[label]['cpu_s']:.1f}x CPU (goal: at least 15x)")


if __name__ == "__main__":
    main()
