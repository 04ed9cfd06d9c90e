"""Output as a terminal shows it (issue 12 §6): the agent cuts a phase's output at "\n", "\r\n"
and "\r" and sends a partial line after a pause (services/agent/procs.py LogTail); the CLI joins
the pieces back (cli/logrender.py): one line per completed line when piped, progress bars drawn
in place on a terminal."""

from __future__ import annotations

from pathlib import Path

from skypurza.cli.jobwatch import LogLine, format_line
from skypurza.cli.logrender import Line, Live, Render, show, with_text
from skypurza.services.agent.procs import LogTail


def test_the_agent_cuts_at_newlines_and_carriage_returns(tmp_path: Path):
    log = tmp_path / "run.log"
    log.write_bytes(b"a\r\nb\n\r 10%\r 20%\r100%\ndone\nwait")
    tail = LogTail(log)
    got = [(c.line, c.end, c.offset) for c in tail.read_chunks()]
    assert got == [("a", "\n", 0), ("b", "\n", 3), ("", "\r", 5), (" 10%", "\r", 6), (" 20%", "\r", 11),
                   ("100%", "\n", 16), ("done", "\n", 21)]
    assert tail.has_partial and tail.committed == 26  # "wait" waits for its end ...
    assert [(c.line, c.end, c.offset) for c in tail.read_chunks(flush_partial=True)] == [("wait", "", 26)]
    with open(log, "ab") as f:  # ... or is sent as it is, and its rest follows
        f.write(b"ed\n\r")
    assert [(c.line, c.end) for c in tail.read_chunks()] == [("ed", "\n")]
    assert tail.has_partial  # a "\r" at the very end may be half of "\r\n"
    with open(log, "ab") as f:
        f.write(b"\n")
    assert [(c.line, c.end) for c in tail.read_chunks()] == [("", "\n")]
    # The same bytes read again from the recorded position are the same chunks (exactly-once ids).
    again = LogTail(log, 21, 6)
    assert [(c.seq, c.offset, c.line) for c in again.read_chunks(final=True)] == [
        (6, 21, "done"), (7, 26, "waited"), (8, 33, "")]


def _chunk(text: str, end: str = "\n", rank: int = 0) -> LogLine:
    line = LogLine(1, "", rank, "run", text, None, None, "c/1")
    line.end = end  # type: ignore[attr-defined]
    return line


def _render(nodes: int = 1) -> Render:
    return Render(lambda line, text: format_line(with_text(line, text), nodes))


def test_a_progress_bar_is_one_line_when_piped_and_drawn_in_place_on_a_terminal():
    r = _render()
    actions = []
    for text, end in [("", "\r"), (" 10%", "\r"), (" 55%", "\r"), ("100%", "\r"), ("", "\n"), ("next", "\n")]:
        actions += r.feed(_chunk(text, end))
    assert [a for a in actions if isinstance(a, Line)] == [Line("100%"), Line("next")]
    assert [a.text for a in actions if isinstance(a, Live)] == ["", " 10%", " 55%", "100%", ""]
    printed: list[str] = []
    show(actions, printed.append)  # piped: the completed lines only
    assert printed == ["100%", "next"]
    lines, states = [], []
    show(actions, lines.append, states.append)  # a terminal: the states in the status line
    assert lines == ["100%", "next"] and states == [" 10%", " 55%", "100%"]


def test_partial_pieces_join_and_other_nodes_print_above_an_open_line():
    r = _render(nodes=2)
    actions = r.feed(_chunk("Downloading... ", "", rank=0))
    actions += r.feed(_chunk("worker says hi", "\n", rank=1))
    actions += r.feed(_chunk("done", "\n", rank=0))
    assert [a.text for a in actions if isinstance(a, Line)] == [
        "(worker1, rank=1) worker says hi", "(head, rank=0) Downloading... done"]
    lines, states = [], []
    show(actions, lines.append, states.append)
    assert lines == ["(worker1, rank=1) worker says hi", "(head, rank=0) Downloading... done"]
    assert states == ["(head, rank=0) Downloading... "]
    # What is left unfinished when the output ends is printed as a line.
    r2 = _render()
    r2.feed(_chunk("no newline at the end", ""))
    assert r2.close() == [Live(""), Line("no newline at the end")]


# ---------------------------------------------------------------- end to end on the local infra

PROGRESS_TASK = """\
name: progress
resources:
  infra: local
run: |
  printf 'Downloading... '
  sleep 2.5
  printf 'done\\n'
  for p in 10 20 30 100; do printf '\\r%3d%%|bar|' $p; sleep 0.05; done
  printf '\\n'
  echo after
"""


def test_progress_bars_and_partial_lines_on_a_real_job(tmp_path: Path):
    import json as _json

    from local_cli import local_cli, spz

    task = tmp_path / "progress.yaml"
    task.write_text(PROGRESS_TASK)
    with local_cli(tmp_path, "render") as env:
        out = spz(env, "launch", "-y", "-c", "prog", str(task), timeout=180)
        assert out.returncode == 0, out.stdout + out.stderr
        lines = out.stdout.splitlines()
        # Piped: one line per completed line, the bar as its final state, nothing cut.
        assert lines[-3:] == ["Downloading... done", "100%|bar|", "after"], lines
        assert " 10%" not in out.stdout and "\r" not in out.stdout
        logs = spz(env, "logs", "prog", "1", "--no-follow")
        assert logs.stdout.splitlines()[-3:] == ["Downloading... done", "100%|bar|", "after"], logs.stdout
        # The partial line was sent during the pause, as a chunk of its own ("end": "").
        status = _json.loads(spz(env, "api", "status", "-o", "json").stdout)
        import asyncio

        import nats

        async def chunks() -> list[dict]:
            nc = await nats.connect(status["nats_url"])
            js = nc.jetstream()
            from skypurza.events import naming

            sub = await js.subscribe(naming.all_logs_subject("render"), ordered_consumer=True)
            got = []
            try:
                while True:
                    msg = await sub.next_msg(timeout=2)
                    got.append(_json.loads(msg.data))
            except Exception:
                pass
            await nc.close()
            return got

        got = asyncio.run(chunks())
        ends = [(c["line"], c.get("end", "\n")) for c in got if c.get("stream") == "run"]
        assert ("Downloading... ", "") in ends and ("done", "\n") in ends, ends
        assert (" 30%|bar|", "\r") in ends, ends
        # `exit_code` means one thing everywhere: the job's own (issue 12 §6).
        failed = spz(env, "launch", "-y", "-c", "prog", "-o", "json", "exit 3")
        assert failed.returncode == 100, failed.stderr
        summary = _json.loads(failed.stdout)
        assert (summary["exit_code"], summary["cli_exit_code"], summary["status"]) == (3, 100, "FAILED")
        queued = {r["job_id"]: r for r in _json.loads(spz(env, "queue", "prog", "-o", "json").stdout)}
        assert queued[summary["job_id"]]["exit_code"] == 3
        # An unknown name is said to be unknown, beside the clusters that are there.
        st = spz(env, "status", "prog", "nosuch")
        assert st.returncode == 0 and "Cluster(s) not found: nosuch." in st.stderr and "prog" in st.stdout
        assert spz(env, "down", "-y", "prog").returncode == 0


def test_piped_tables_are_never_cut(tmp_path: Path):
    """`spz gpus list H100 > f`: no terminal, no COLUMNS: the table is as wide as its content."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["SKYPURZA_HOME"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-m", "skypurza.cli.main", "gpus", "list", "H100"], env=env,
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert "…" not in out.stdout and max(len(line) for line in out.stdout.splitlines()) > 80
    assert "p5.48xlarge" in out.stdout and "SPOT ZONE" in out.stdout


def test_a_failed_jobs_output_is_complete_once_every_node_that_printed_has_reported() -> None:
    """`stream_job` stops reading a failed job's output when every (rank, phase) it saw output
    from has its JobNodeFinished, late reports after the outcome included (the neighbours of
    the failing node report once they are stopped): no fixed drain."""
    from datetime import datetime, timezone

    from skypurza.cli.clusterlog import fold
    from skypurza.cli.jobwatch import output_pending
    from skypurza.events.job_events import JobFailed, JobNodeFinished, JobQueued, JobStarted

    t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    events = [JobQueued(cluster="c", job_id=1, task_id="t", task={"num_nodes": 2, "run": "x"}),
              JobStarted(cluster="c", job_id=1, started_at=t),
              JobNodeFinished(cluster="c", job_id=1, rank=0, phase="run", exit_code=3),
              JobFailed(cluster="c", job_id=1, ended_at=t, phase="run", exit_code=3, failed_rank=0)]
    streamed = {(0, "run"), (1, "run")}
    cluster = fold("c", [(ev, t, i + 1) for i, ev in enumerate(events)])
    assert cluster.jobs[1].status == "FAILED"
    assert output_pending(cluster.jobs[1].reported, streamed) == {(1, "run")}  # rank 1 still stopping
    late = JobNodeFinished(cluster="c", job_id=1, rank=1, phase="run", exit_code=143)
    cluster = fold("c", [(ev, t, i + 1) for i, ev in enumerate([*events, late])])
    assert cluster.jobs[1].status == "FAILED" and output_pending(cluster.jobs[1].reported, streamed) == set()
    # a node that printed nothing is not waited for
    assert output_pending(cluster.jobs[1].reported, {(0, "run")}) == set()
