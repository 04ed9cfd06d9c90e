"""pytest fixtures for the fault-injecting fake AWS (tests/support/fakeaws.py).

- `fakeaws_server` (session): one fakeaws process on an ephemeral port.
- `fake_aws` (function): a fresh AWS account on that server (a new 12-digit access key is a
  new moto account, so nothing needs resetting), its faults cleared at the end. Yields a
  `FakeAws` with `endpoint_url`, `account_id`, `env`, `session()`, `client()` and the fault
  helpers `add_fault`, `add_launch_failure`, `clear_faults`, `preempt`, `requests`,
  `request_count`, `count_instances`.
- `bare_moto` (function): a plain `moto_server -p PORT` process, as a user with a local AWS
  emulator runs it: no middleware, no validation switches, moto's own gaps (no placement groups:
  it answers those actions with an HTML 500 page). Yields a `BareMoto` with the same `env`,
  `session()`, `client()` and `count_instances` as FakeAws (no faults). Killed at the end, on
  failure too.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

FAKEAWS = Path(__file__).with_name("fakeaws.py")
SECRET = "fake-secret-key"
DEFAULT_REGION = "us-east-1"

_accounts = itertools.count(random.Random().randrange(10**6, 9 * 10**6) * 10**5)


@dataclass
class FakeAwsServer:
    url: str
    process: subprocess.Popen[str]

    def control(self, method: str, what: str, data: dict[str, Any] | None = None, **query: str) -> Any:
        qs = "&".join(f"{k}={v}" for k, v in query.items() if v is not None)
        req = urllib.request.Request(
            f"{self.url}/_fault/{what}" + (f"?{qs}" if qs else ""),
            data=json.dumps(data).encode() if data is not None else None,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())


class FakeAws:
    """One test's AWS account on the fake server."""

    def __init__(self, server: FakeAwsServer, account_id: str, region: str = DEFAULT_REGION) -> None:
        self.server = server
        self.endpoint_url = server.url
        self.account_id = account_id
        self.region = region

    # ------------------------------------------------------------ clients

    @property
    def env(self) -> dict[str, str]:
        """Environment for a process that should talk to this account (boto honours all of it)."""
        return {
            "AWS_ACCESS_KEY_ID": self.account_id,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint_url,
        }

    def session(self) -> Any:
        """An aioboto3 Session bound to this account (pass endpoint_url to the adapter too)."""
        import aioboto3

        return aioboto3.Session(
            aws_access_key_id=self.account_id, aws_secret_access_key=SECRET, region_name=self.region
        )

    def client(self, region: str | None = None, service: str = "ec2", **kwargs: Any) -> Any:
        """A plain boto3 client for setting things up or looking behind the adapter's back."""
        import boto3

        return boto3.client(
            service,
            region_name=region or self.region,
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.account_id,
            aws_secret_access_key=SECRET,
            **kwargs,
        )

    # ------------------------------------------------------------ faults

    def add_fault(
        self,
        code: str,
        *,
        action: str = "RunInstances",
        region: str | None = None,
        zone: str | None = None,
        instance_type: str | None = None,
        market: str | None = None,
        message: str | None = None,
        status: int | None = None,
        count: int | None = None,
        after: int = 0,
    ) -> dict[str, Any]:
        """Answer matching calls with AWS's error `code` (HTTP status as AWS sends it)."""
        return self.server.control("POST", "rules", dict(
            action=action, account=self.account_id, region=region, zone=zone,
            instance_type=instance_type, market=market, code=code, message=message,
            status=status, count=count, after=after,
        ))

    def add_launch_failure(
        self,
        index: int,
        *,
        code: str = "Server.InsufficientInstanceCapacity",
        message: str | None = None,
        region: str | None = None,
        zone: str | None = None,
        instance_type: str | None = None,
        market: str | None = None,
        count: int | None = 1,
        after: int = 0,
    ) -> dict[str, Any]:
        """Let a matching RunInstances succeed, then kill the node at launch `index` at once."""
        return self.server.control("POST", "rules", dict(
            action="RunInstances", account=self.account_id, region=region, zone=zone,
            instance_type=instance_type, market=market, code=code, message=message,
            count=count, after=after, effect="terminate", index=index,
        ))

    def rules(self) -> list[dict[str, Any]]:
        return self.server.control("GET", "rules", account=self.account_id)["rules"]

    def clear_faults(self) -> None:
        self.server.control("DELETE", "rules", account=self.account_id)

    def preempt(self, instance_id: str, region: str | None = None, *,
                code: str = "Server.SpotInstanceTermination",
                message: str = "Server.SpotInstanceTermination: Spot instance termination") -> str:
        """Interrupt a spot instance as AWS does: terminated, with that state reason."""
        return self.server.control("POST", "preempt", dict(
            account=self.account_id, region=region or self.region, instance_id=instance_id,
            code=code, message=message,
        ))["state"]

    # ------------------------------------------------------------ what reached AWS

    def requests(self, action: str | None = None, region: str | None = None) -> list[dict[str, Any]]:
        return self.server.control("GET", "requests", account=self.account_id, action=action,
                                   region=region)["requests"]

    def request_count(self, action: str, region: str | None = None) -> int:
        return len(self.requests(action, region))

    def clear_requests(self) -> None:
        self.server.control("DELETE", "requests", account=self.account_id)

    def count_instances(
        self, region: str | None = None, states: Sequence[str] = ("pending", "running"),
        tags: dict[str, str] | None = None,
    ) -> int:
        filters = [{"Name": "instance-state-name", "Values": list(states)}]
        filters += [{"Name": f"tag:{k}", "Values": [v]} for k, v in (tags or {}).items()]
        pages = self.client(region).get_paginator("describe_instances").paginate(Filters=filters)
        return sum(len(r["Instances"]) for page in pages for r in page["Reservations"])


def start_fakeaws(log_path: Path | None = None, timeout: float = 30.0) -> FakeAwsServer:
    env = dict(os.environ)
    env.update(MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION="1", MOTO_ENABLE_AMI_VALIDATION="1",
               MOTO_ENABLE_KEYPAIR_VALIDATION="1")
    for var in ("AWS_ENDPOINT_URL", "MOTO_ACCOUNT_ID"):  # would override per-test accounts
        env.pop(var, None)
    stderr = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, str(FAKEAWS), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=stderr, text=True, env=env)
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the port line (or EOF if it died)
    if not line.startswith("FAKEAWS_PORT=") or time.monotonic() > deadline:
        proc.kill()
        raise RuntimeError(f"fakeaws did not start: {line!r}")
    return FakeAwsServer(url=f"http://127.0.0.1:{int(line.split('=', 1)[1])}", process=proc)


def stop_fakeaws(server: FakeAwsServer) -> None:
    _stop_process(server.process)


def _stop_process(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def fakeaws_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeAwsServer]:
    server = start_fakeaws(tmp_path_factory.mktemp("fakeaws") / "fakeaws.log")
    yield server
    stop_fakeaws(server)


def another_account(server: FakeAwsServer) -> FakeAws:
    """One more fresh account on the server (a team's own AWS account); clear its faults after."""
    return FakeAws(server, account_id=f"{next(_accounts):012d}")


@pytest.fixture
def fake_aws(fakeaws_server: FakeAwsServer) -> Iterator[FakeAws]:
    aws = another_account(fakeaws_server)
    yield aws
    aws.clear_faults()
    aws.clear_requests()


# ---------------------------------------------------------------------------- bare moto_server


class BareMoto(FakeAws):
    """A plain moto_server: FakeAws's clients and counts, without the fault middleware."""

    def __init__(self, url: str, process: subprocess.Popen[bytes]) -> None:
        self.endpoint_url = url
        self.process = process
        self.account_id = "123456789012"  # moto's default account (the access key is not read)
        self.region = DEFAULT_REGION

    def _no_faults(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a bare moto_server has no fault injection: use fake_aws")

    add_fault = add_launch_failure = rules = clear_faults = preempt = _no_faults  # type: ignore[assignment]
    requests = request_count = clear_requests = _no_faults  # type: ignore[assignment]


def moto_server_command() -> list[str]:
    """`moto_server` next to this Python (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("moto_server")
    found = str(beside) if beside.exists() else shutil.which("moto_server")
    if found is None:
        raise RuntimeError("moto_server not found (pip install 'moto[server]')")
    return [found]


def start_bare_moto(log_path: Path | None = None, timeout: float = 30.0) -> BareMoto:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOTO_") and k != "AWS_ENDPOINT_URL"}
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen([*moto_server_command(), "-p", str(port)], stdout=out, stderr=subprocess.STDOUT,
                            env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/moto-api/data.json", timeout=2) as resp:
                resp.read()
            return BareMoto(url, proc)
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"moto_server did not start on port {port}")
            time.sleep(0.05)


def stop_bare_moto(server: BareMoto) -> None:
    _stop_process(server.process)


@pytest.fixture
def bare_moto(tmp_path: Path) -> Iterator[BareMoto]:
    server = start_bare_moto(tmp_path / "moto_server.log")
    try:
        yield server
    finally:
        stop_bare_moto(server)
