"""The suite's own hygiene: what a test leaves running under its tmp_path is killed (issue 11 §6)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from leftovers import kill_under


def test_detached_processes_and_recorded_job_groups_under_a_test_dir_are_killed(tmp_path: Path):
    node = tmp_path / "clusters" / "c" / "node-0"
    node.mkdir(parents=True)
    # A detached job whose only tie to the test is its working directory, like an agent's job.
    by_cwd = subprocess.Popen(["sleep", "300"], cwd=node, start_new_session=True)
    # One that names the test's directory in its arguments (an agent's --home).
    by_arg = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "--home", str(node)], cwd="/",
                              start_new_session=True)
    # One recorded only by its process group, as the agent records a running job.
    by_group = subprocess.Popen(["sleep", "300"], cwd="/", start_new_session=True)
    (node / "job-1.pgid").write_text(str(by_group.pid))
    outside = subprocess.Popen(["sleep", "300"], cwd="/", start_new_session=True)
    try:
        kill_under(tmp_path)
        codes = [p.wait(10) for p in (by_cwd, by_arg, by_group)]
        assert codes == [-9, -9, -9]
        time.sleep(0.1)
        assert outside.poll() is None, "a process with no tie to the test's directory must survive"
    finally:
        for p in (by_cwd, by_arg, by_group, outside):
            if p.poll() is None:
                p.kill()
                p.wait(10)
