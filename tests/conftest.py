"""Shared fixtures: a real nats-server per test (ephemeral port), fake AWS, temp state dirs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "support"))

pytest_plugins = ["nats_fixtures", "aws_fixtures", "slurm_fixtures"]


import pytest  # noqa: E402

from hang_report import arm  # noqa: E402
from skypurza.events.natsserver import free_port  # noqa: E402


def _own_api_port_per_worker() -> None:
    """The suite runs on two xdist workers. `spz api start` without --port tries sky's default
    46580 first, and two workers' planes starting at the same moment would both pick it (the
    probe and the bind are apart); so every worker but the first gets its own first choice,
    through SKYPURZA_API_PORT (not sky's SKYPILOT_API_SERVER_LOCAL_PORT: a SKYPILOT_* variable
    would reach the jobs' environment, which the env-contract tests compare exactly)."""
    import os

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and worker != "gw0" and "SKYPURZA_API_PORT" not in os.environ:
        os.environ["SKYPURZA_API_PORT"] = str(free_port())


_own_api_port_per_worker()


def _ctrl_c_as_in_a_terminal() -> None:
    """Started as a background job of a non-interactive shell (`pytest ... &`), the suite inherits
    SIGINT and SIGQUIT ignored (POSIX, for asynchronous commands without job control), and so does
    every `spz` it starts: the tests that press Ctrl-C would wait on a process that cannot hear it.
    A terminal's defaults are put back, for this process and what it starts."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


_ctrl_c_as_in_a_terminal()
from leftovers import kill_under  # noqa: E402


@pytest.fixture(autouse=True)
def _hang_report(request: pytest.FixtureRequest):
    """A test about to hit its timeout prints every asyncio task's stack first (hang_report.py),
    so a hang seen once in CI says where it was."""
    marker = request.node.get_closest_marker("timeout")
    limit = float(marker.args[0]) if marker and marker.args else float(request.config.getini("timeout") or 0)
    timer = arm(max(limit - 15, limit * 0.9)) if limit > 0 else None
    yield
    if timer is not None:
        timer.cancel()


@pytest.fixture(autouse=True)
def _no_leftover_processes(request: pytest.FixtureRequest):
    """After every test, pass or fail, kill what it left running under its tmp_path (agents,
    their detached jobs, control planes): a failed test must not leave a job running for minutes."""
    root = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if root is not None:
        kill_under(root)


@pytest.fixture(autouse=True)
def _every_emit_is_declared():
    """Every event a service published in this test (handled in this process, by its runner, its
    context or its background loops) is one its contract declares: an UndeclaredEmit anywhere —
    even one a loop caught and logged — fails the test (events/contract.py)."""
    from skypurza.events.contract import forget_undeclared_emits, undeclared_emits

    forget_undeclared_emits()
    yield
    found = undeclared_emits()
    forget_undeclared_emits()
    assert not found, f"undeclared emits: {found}"


@pytest.fixture(autouse=True)
def _no_stage_left_by_an_earlier_test():
    """A test that ran the whole CLI in this process (CliRunner with --stage or SKYPURZA_STAGE) left
    its stage in cli.context.settings, and a later test's in-process command would act on that
    stage instead of its own (a reconcile that saw none of its own pods)."""
    context = sys.modules.get("skypurza.cli.context")
    if context is not None:
        context.settings.stage = None
    yield

