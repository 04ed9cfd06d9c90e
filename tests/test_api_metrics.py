"""`GET /metrics` on the API server (services/api/routes_metrics.py): the metrics service's page
over the bus, for admins and the metrics token only. A real local control plane (its
observability service answers the render query) and the API server as a uvicorn process."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from api_harness import Api, problem, team_of_four
from local_cli import local_cli
from prometheus_client.parser import text_string_to_metric_families

STAGE = "test"
METRICS_TOKEN = "scrape-only-0123456789abcdef"


def test_metrics_on_the_api_server_for_admins_and_the_metrics_token(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with local_cli(tmp_path, STAGE) as env:
        alice, _bob, vera, root = team_of_four(env)  # starts the plane: its services answer
        monkeypatch.setenv("SKYPURZA_API_METRICS_TOKEN", METRICS_TOKEN)
        api = Api(SimpleNamespace(url=f"nats://127.0.0.1:{env['SKYPURZA_NATS_PORT']}"), tmp_path)
        try:
            problem(api.http.get("/metrics"), 401)
            problem(api.http.get("/metrics", headers=api.as_("not-a-token")), 401)
            body = problem(api.http.get("/metrics", headers=api.as_(alice)), 403)
            assert "admins or the metrics token" in body["detail"]
            problem(api.http.get("/metrics", headers=api.as_(vera)), 403)

            def page(token: str, accept: str | None = None):
                deadline = time.monotonic() + 60
                while True:  # the observability service starts with the plane: a 503 until it answers
                    res = api.http.get("/metrics", headers={**api.as_(token), **({"Accept": accept} if accept else {})})
                    if res.status_code != 503 or time.monotonic() > deadline:
                        return res
                    time.sleep(0.5)

            for token in (root, METRICS_TOKEN):
                res = page(token)
                assert res.status_code == 200, res.text
                assert res.headers["content-type"].startswith("text/plain")
                fams = {f.name: f for f in text_string_to_metric_families(res.text)}
                assert {"skypurza_metrics_source_up", "skypurza_log_events_read"} <= set(fams)
                assert any(s.value > 0 for s in fams["skypurza_log_events_read"].samples)  # the users' events
            om = page(METRICS_TOKEN, "application/openmetrics-text; version=1.0.0")
            assert om.headers["content-type"].startswith("application/openmetrics-text")
            assert om.text.rstrip().endswith("# EOF")
            assert "/metrics" not in api.http.get("/openapi.json").json()["paths"]
        finally:
            api.close()
