"""pytest fixtures for a real nats-server (one per test, ephemeral port, its own store)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from skypurza.events.bus import Bus
from skypurza.events.natsserver import NatsServer, free_port


@pytest.fixture
def nats_server(tmp_path: Path):
    server = NatsServer(store_dir=tmp_path / "js", port=free_port(), log_file=tmp_path / "nats.log").start()
    yield server
    server.stop()
    kill_processes_using(server.url)


def kill_processes_using(url: str) -> list[int]:
    """A test that failed half-way may leave node agents (own sessions) behind: find every
    process whose command line names this server's URL and kill its process group."""
    import os

    from leftovers import kill_with_group

    killed = []
    needle = url.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            kill_with_group(int(entry.name))
            killed.append(int(entry.name))
    return killed


@pytest.fixture
def stage() -> str:
    return "test"


@pytest.fixture
def spz_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated SKYPURZA_HOME so nothing touches the user's ~/.skypurza."""
    home = tmp_path / "spzhome"
    home.mkdir()
    monkeypatch.setenv("SKYPURZA_HOME", str(home))
    return home


async def connect_bus(server: NatsServer, stage: str = "test", source: str = "/tests") -> Bus:
    return await Bus.connect(server.url, stage, source=source)


def run(coro):
    return asyncio.run(coro)
