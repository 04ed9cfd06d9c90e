"""A schemathesis fuzz of the API server's OpenAPI document against the real uvicorn process
(a real nats-server and status service behind it; no ledger, so the cost report's 503 is met,
nor observability services, so the observability routes' 503s are).

With an admin's token, every operation, a few examples each: no 5xx but the 503 a missing
service is answered with, and every error body is RFC 9457 problem+json. Server-sent streams are
read to their headers only (they run until their job ends). Then the cost report without a
ledger is a 503 that says so.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import httpx
import pytest
import schemathesis
from api_harness import STAGE, Api
from api_harness import problem as _problem
from hypothesis import HealthCheck, Phase, settings
from nats_fixtures import connect_bus

from skypurza.services.api import directory_io
from skypurza.services.api.app import ApiSettings, create_app

# The services this rig does not run, each named in the 503 its routes answer without them.
ABSENT = ("ledger", "GPU health manager is not answering", "metrics service is not answering",
          "provisioner is not answering")
ADMIN = "fuzz-admin-0123456789abcdef"  # longer than a fuzzed name is likely to be: never removed by the fuzz
# A few examples each keep the whole fuzz under a minute; SKYPURZA_FUZZ_EXAMPLES=50 for a deeper run.
EXAMPLES = int(os.environ.get("SKYPURZA_FUZZ_EXAMPLES", "3"))
SCHEMA = schemathesis.openapi.from_dict(create_app(ApiSettings(nats_url="nats://127.0.0.1:1")).openapi())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from skypurza.events.natsserver import NatsServer, free_port

    tmp = tmp_path_factory.mktemp("fuzz")
    server = NatsServer(store_dir=tmp / "js", port=free_port(), log_file=tmp / "nats.log").start()
    status = subprocess.Popen([sys.executable, "-m", "skypurza.services.status.service", "--nats", server.url,
                               "--stage", STAGE, "--db", str(tmp / "status.duckdb")],
                              stdout=subprocess.DEVNULL, stderr=(tmp / "status.log").open("wb"))

    async def admin() -> str:
        bus = await connect_bus(server, STAGE)
        try:
            await directory_io.add_team(bus, "ops", [], {})
            return (await directory_io.add_user(bus, ADMIN, "ops", "admin")).token
        finally:
            await bus.close()

    token = asyncio.run(admin())
    api = Api(server, tmp)
    deadline = time.monotonic() + 20
    while (api.http.get("/api/v1/health", headers=api.as_(token)).json().get("caller") or {}).get("user") != ADMIN:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    try:
        yield api, token
    finally:
        out = api.close()
        status.terminate()
        status.wait(10)
        server.stop()
        assert "Traceback" not in out, out[-3000:]


def _streams(case) -> bool:
    return "text/event-stream" in str(case.operation.definition.raw.get("responses", {}))


@SCHEMA.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
def test_every_operation_answers_without_5xx_and_with_problem_json(case, served) -> None:
    api, token = served
    kw = case.as_transport_kwargs(base_url=api.url, headers={"Authorization": f"Bearer {token}"})
    kw.pop("verify", None)
    kw.pop("allow_redirects", None)
    kw.pop("timeout", None)
    if isinstance(kw.get("data"), (str, bytes)):  # a raw body: httpx takes it as content
        kw["content"] = kw.pop("data")
    with httpx.Client(timeout=httpx.Timeout(15, read=15)) as client:
        with client.stream(kw.pop("method"), kw.pop("url"), **{k: v for k, v in kw.items() if v is not None
                                                               and k in ("params", "headers", "json", "content",
                                                                         "cookies", "data", "files")}) as res:
            if res.status_code == 200 and _streams(case):
                assert res.headers["content-type"].startswith("text/event-stream")
                return
            res.read()
    what = f"{case.method} {case.formatted_path}: {res.status_code} {res.text[:500]}"
    assert res.status_code != 401, what  # the admin token holds: the fuzz reaches every route's code
    assert res.status_code < 500 or (res.status_code == 503 and any(m in res.text for m in ABSENT)), what
    if res.status_code >= 400:
        assert res.headers["content-type"].startswith("application/problem+json"), what
        body = res.json()
        assert body["status"] == res.status_code and body["title"] and body["detail"], what


def test_the_cost_report_without_a_ledger_is_a_503_that_says_so(served) -> None:
    api, token = served
    body = _problem(api.http.get("/api/v1/cost-report", headers=api.as_(token)), 503)
    assert "ledger" in body["detail"] and "running" in body["detail"]
