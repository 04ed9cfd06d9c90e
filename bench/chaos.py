"""Chaos campaign: managed jobs on the local infra while nats-server and the services are killed.

What it does, bounded in count and time, on a fresh SKYPURZA_HOME (everything real: the `spz`
CLI as a user runs it, the embedded control plane, node agents):
1. `spz api start`; a probe publisher appends events of an inert type to the event stream the
   whole time (retrying with the same Nats-Msg-Id until acknowledged) and records each ack;
2. submits N managed jobs (`spz jobs launch -d --infra local`), four CLI processes at a time,
   while a second thread keeps calling `spz status` / `spz jobs queue` and a third SIGKILLs
   nats-server or the services process K times at random moments (the supervisor restarts them);
3. waits (bounded) until every job is terminal, then `spz audit`, `spz down -a`, `spz api stop`.

It prints:
- lost: probe publishes acknowledged but not in the stream; submissions that exited 0 but are
  not in the log;
- duplicated: managed-job ids issued twice; jobs that reached a terminal state more than once;
  jobs whose run started more than once;
- stuck: jobs not terminal by the deadline; CLI calls that hung past their limit or showed a
  traceback;
- leftover: control-plane processes and node agents still running after `down -a` + `api stop`;
- audit: whether the live projections equal a fresh replay of the log.

    python bench/chaos.py [--jobs 20] [--kills 4] [--seed 1] [--deadline 300] [-o json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from skypurza.cli import planeprocs
from skypurza.events import naming
from skypurza.events.envelope import Envelope, utcnow

STAGE = "chaos"
PROBE_TYPE = "io.skypurza.chaos_probe.v1"  # a type no service knows: skipped and acked by each
CLI_TIMEOUT_S = 120.0
TASK = """\
name: chaos
resources:
  infra: local
run: |
  echo "chaos job $SKYPILOT_TASK_ID"
  sleep 1
"""


@dataclass
class Report:
    jobs: int
    kills: int
    kills_done: list[str] = field(default_factory=list)
    probes_acked: int = 0
    probes_stored: int = 0
    probes_lost: int = 0
    submissions_ok: int = 0
    submissions_refused: int = 0
    submissions_lost: int = 0
    ids_issued_twice: int = 0
    terminal_more_than_once: int = 0
    started_more_than_once: int = 0
    stuck: int = 0
    cli_calls: int = 0
    cli_hung: int = 0
    cli_tracebacks: int = 0
    leftover_control_plane: int = 0
    leftover_agents: int = 0
    audit_equal: bool = False
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.probes_lost or self.submissions_lost or self.ids_issued_twice
                    or self.terminal_more_than_once or self.started_more_than_once or self.stuck or self.cli_hung
                    or self.cli_tracebacks or self.leftover_control_plane or self.leftover_agents) \
            and self.audit_equal


class Campaign:
    def __init__(self, home: Path, jobs: int, kills: int, seed: int, deadline_s: float) -> None:
        self.home = home
        self.rng = random.Random(seed)
        self.report = Report(jobs=jobs, kills=kills)
        self.deadline_s = deadline_s
        self.env = {**os.environ, "SKYPURZA_HOME": str(home), "SKYPURZA_STAGE": STAGE,
                    "SKYPURZA_AGENT_KILL_GRACE_S": "1", "COLUMNS": "200"}
        for k in ("SKYPURZA_NATS_URL", "SKYPURZA_NATS_PORT"):
            self.env.pop(k, None)
        self.state_dir = home / STAGE
        self.task_file = home / "chaos.yaml"
        self.stop_noise = threading.Event()
        self.acked: set[str] = set()
        self.lock = threading.Lock()

    # ----------------------------------------------------------------------------- helpers
    def spz(self, *args: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess | None:
        with self.lock:
            self.report.cli_calls += 1
        try:
            out = subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], env=self.env,
                                 capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            with self.lock:
                self.report.cli_hung += 1
                self.report.notes.append(f"hung: spz {' '.join(args)}")
            return None
        if "Traceback (most recent call last)" in out.stderr:
            with self.lock:
                self.report.cli_tracebacks += 1
                self.report.notes.append(f"traceback from spz {' '.join(args)}: {out.stderr.strip()[-300:]}")
        return out

    def state(self) -> dict:
        try:
            return json.loads(naming.control_state_file(STAGE).read_text())
        except (OSError, ValueError):
            return {}

    # ----------------------------------------------------------------------------- threads
    def probe(self, url: str) -> None:
        asyncio.run(self._probe(url))

    async def _probe(self, url: str) -> None:
        import nats

        async def quiet(*_a) -> None:  # a killed server is expected here: no tracebacks on stderr
            return None

        nc = await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.2, allow_reconnect=True,
                                connect_timeout=2, error_cb=quiet, disconnected_cb=quiet, reconnected_cb=quiet)
        js = nc.jetstream()
        while not self.stop_noise.is_set():
            msg_id = uuid.uuid4().hex
            env = Envelope(id=msg_id, source="/bench/chaos", type=PROBE_TYPE, time=utcnow(),
                           subject=f"probe/{msg_id}", data={})
            subject = naming.event_subject(STAGE, "probe", "chaos", "chaos_probe")
            for _ in range(200):  # the same id until acknowledged (JetStream de-duplicates)
                try:
                    await js.publish(subject, env.model_dump_json().encode(), timeout=2,
                                     headers={"Nats-Msg-Id": msg_id})
                    self.acked.add(msg_id)
                    break
                except Exception:
                    await asyncio.sleep(0.1)
            await asyncio.sleep(0.02)
        await nc.close()

    def noise(self) -> None:
        while not self.stop_noise.is_set():
            self.spz("status", "-o", "json", timeout=60)
            self.spz("jobs", "queue", "-o", "json", timeout=60)
            time.sleep(0.3)

    def killer(self, window_s: float) -> None:
        for _ in range(self.report.kills):
            time.sleep(self.rng.uniform(1.0, max(1.5, window_s / max(1, self.report.kills))))
            victim = self.rng.choice(["nats-server", "services"])
            pid = ((self.state().get("processes") or {}).get(victim) or {}).get("pid")
            if not pid:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                self.report.kills_done.append(victim)
            except ProcessLookupError:
                pass

    # ----------------------------------------------------------------------------- phases
    def submit(self, index: int) -> int | None:
        out = self.spz("jobs", "launch", "-y", "-d", "-n", f"chaos-{index}", "-o", "json", str(self.task_file))
        if out is None or out.returncode != 0:
            with self.lock:
                self.report.submissions_refused += 1
            return None
        try:
            job_id = int(json.loads(out.stdout)["id"])
        except (ValueError, KeyError, TypeError):
            with self.lock:
                self.report.notes.append(f"unparsable submission output: {out.stdout[-200:]}")
            return None
        with self.lock:
            self.report.submissions_ok += 1
        return job_id

    def queue(self) -> list[dict]:
        out = self.spz("jobs", "queue", "-a", "-o", "json", "--refresh")
        if out is None or out.returncode != 0:
            return []
        try:
            return json.loads(out.stdout)
        except ValueError:
            return []

    def run(self) -> Report:
        t0 = time.monotonic()
        self.task_file.write_text(TASK)
        started = self.spz("api", "start", "-o", "json")
        if started is None or started.returncode != 0:
            raise SystemExit(f"spz api start failed: {started.stderr if started else 'hung'}")
        url = json.loads(started.stdout)["nats_url"]
        threads = [threading.Thread(target=self.probe, args=(url,), daemon=True),
                   threading.Thread(target=self.noise, daemon=True),
                   threading.Thread(target=self.killer, args=(max(10.0, self.report.jobs * 1.0),), daemon=True)]
        for t in threads:
            t.start()
        ids: list[int] = []
        pending = list(range(self.report.jobs))
        while pending:
            batch, pending = pending[:4], pending[4:]
            results: list[int | None] = [None] * len(batch)

            def one(slot: int, index: int) -> None:
                results[slot] = self.submit(index)

            workers = [threading.Thread(target=one, args=(s, i)) for s, i in enumerate(batch)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            ids += [r for r in results if r is not None]
        threads[2].join()  # every kill done before we judge
        deadline = time.monotonic() + self.deadline_s
        rows: list[dict] = []
        while time.monotonic() < deadline:
            rows = self.queue()
            mine = [r for r in rows if r.get("id") in ids]
            if len(mine) == len(set(ids)) and all(r.get("terminal") or r.get("status") in _TERMINAL for r in mine):
                break
            time.sleep(1.0)
        self.stop_noise.set()
        threads[0].join(30)
        threads[1].join(CLI_TIMEOUT_S)
        self.judge(ids, rows, url)
        audit = self.spz("audit", "-o", "json")
        self.report.audit_equal = bool(audit is not None and audit.returncode == 0)
        if audit is not None and audit.returncode != 0:
            self.report.notes.append(f"audit: {audit.stdout[-500:]} {audit.stderr[-300:]}")
        self.teardown()
        self.report.seconds = round(time.monotonic() - t0, 1)
        return self.report

    def judge(self, ids: list[int], rows: list[dict], url: str) -> None:
        r = self.report
        counts = Counter(ids)
        r.ids_issued_twice = sum(1 for c in counts.values() if c > 1)
        by_id = Counter(row.get("id") for row in rows)
        r.ids_issued_twice += sum(1 for c in by_id.values() if c > 1)
        seen = {row.get("id") for row in rows}
        r.submissions_lost = sum(1 for i in set(ids) if i not in seen)
        r.stuck = sum(1 for row in rows if row.get("id") in counts
                      and not (row.get("terminal") or row.get("status") in _TERMINAL))
        stuck = Counter(row.get("status") for row in rows if row.get("id") in counts
                        and not (row.get("terminal") or row.get("status") in _TERMINAL))
        if stuck:
            r.notes.append(f"stuck jobs by status: {dict(stuck)}")
        terminal, started, stored = asyncio.run(self._log_counts(url))
        r.terminal_more_than_once = sum(1 for c in terminal.values() if c > 1)
        r.started_more_than_once = sum(1 for c in started.values() if c > 1)
        r.probes_acked = len(self.acked)
        r.probes_stored = len(stored)
        r.probes_lost = len(self.acked - stored)

    async def _log_counts(self, url: str) -> tuple[Counter, Counter, set[str]]:
        from skypurza.events.bus import Bus

        bus = await Bus.connect(url, STAGE, source="/bench/chaos")
        terminal: Counter = Counter()
        started: Counter = Counter()
        stored: set[str] = set()
        try:
            async for s in bus.replay(filter_subject=naming.event_filter(STAGE, "mjob", "managed_job_status_changed")):
                ev = s.event
                if ev is not None and ev.status in _TERMINAL:
                    terminal[ev.managed_job_id] += 1
            async for s in bus.replay(filter_subject=naming.event_filter(STAGE, "cluster", "job_started")):
                if s.event is not None:
                    started[(s.event.cluster, s.event.job_id)] += 1
            async for s in bus.replay(filter_subject=naming.event_subject(STAGE, "probe", "chaos", "chaos_probe")):
                if s.envelope is not None:
                    stored.add(s.envelope.id)
        finally:
            await bus.close()
        return terminal, started, stored

    def teardown(self) -> None:
        if os.environ.get("SPZ_CHAOS_KEEP"):  # leave everything running to look at it
            return
        self.spz("down", "-a", "-y")
        self.spz("api", "stop")
        time.sleep(1.0)
        r = self.report
        r.leftover_control_plane = len(planeprocs.find(self.state_dir, naming.nats_store_dir(STAGE) / "nats.conf",
                                                       STAGE))
        agents = _agents_under(self.state_dir)
        r.leftover_agents = len(agents)
        for pid in agents:  # leave the machine clean whatever we found
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _agents_under(state_dir: Path) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        argv = planeprocs.read_argv(int(entry))
        if "skypurza.services.agent" in argv and any(a.startswith(str(state_dir)) for a in argv):
            found.append(int(entry))
    return found


def _terminal_statuses() -> frozenset[str]:
    from skypurza.events.managed_events import TERMINAL_STATUSES

    return frozenset(str(getattr(s, "value", s)) for s in TERMINAL_STATUSES)


_TERMINAL = _terminal_statuses()


def run_campaign(jobs: int = 20, kills: int = 4, seed: int = 1, deadline_s: float = 300.0,
                 home: Path | None = None) -> Report:
    if home is not None:
        return Campaign(home, jobs, kills, seed, deadline_s).run()
    with tempfile.TemporaryDirectory(prefix="spz-chaos-") as tmp:
        old = os.environ.get("SKYPURZA_HOME")
        os.environ["SKYPURZA_HOME"] = tmp  # naming.state_dir() in this process
        try:
            return Campaign(Path(tmp), jobs, kills, seed, deadline_s).run()
        finally:
            if old is None:
                os.environ.pop("SKYPURZA_HOME", None)
            else:
                os.environ["SKYPURZA_HOME"] = old


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20)
    p.add_argument("--kills", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--deadline", type=float, default=300.0, help="seconds to wait for every job to end")
    p.add_argument("-o", "--output", default="table", choices=["table", "json"])
    a = p.parse_args(argv)
    if not (1 <= a.jobs <= 500 and 0 <= a.kills <= 100 and 10 <= a.deadline <= 3600):
        p.error("bounds: 1 <= --jobs <= 500, 0 <= --kills <= 100, 10 <= --deadline <= 3600")
    r = run_campaign(a.jobs, a.kills, a.seed, a.deadline)
    if a.output == "json":
        print(json.dumps({**asdict(r), "clean": r.clean}, indent=2))
    else:
        print(f"chaos: {r.jobs} managed jobs, {len(r.kills_done)} kills ({Counter(r.kills_done)}), {r.seconds}s")
        print(f"  lost        probes {r.probes_lost} of {r.probes_acked} acked ({r.probes_stored} stored); "
              f"submissions {r.submissions_lost} of {r.submissions_ok} accepted ({r.submissions_refused} refused)")
        print(f"  duplicated  ids {r.ids_issued_twice}; terminal twice {r.terminal_more_than_once}; "
              f"started twice {r.started_more_than_once}")
        print(f"  stuck       jobs {r.stuck}; CLI calls hung {r.cli_hung} / tracebacks {r.cli_tracebacks} "
              f"of {r.cli_calls}")
        print(f"  leftover    control plane {r.leftover_control_plane}; agents {r.leftover_agents}")
        print(f"  audit       {'equal' if r.audit_equal else 'DIFFERENT'}")
        for n in r.notes[:20]:
            print(f"  note: {n}")
    return 0 if r.clean else 1


if __name__ == "__main__":
    sys.exit(main())
