"""Two API server replicas serve one deployment: the server keeps no state of its own.

A real control plane on the `local` infra (nats-server, the services, real node agents:
tests/support/local_cli.py) and two API servers as uvicorn processes over it. A client that knows
both URLs (as a load balancer would route) submits a task through replica A and streams its job's
output from A; A is SIGKILLed mid-stream. The client carries on through B: the stream resumes from
the last frame id it saw (`Last-Event-ID`), and it submits again. Every line of the job arrives
exactly once and in order, and the stream ends with the job's status.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
from api_harness import Api, team_of_four
from local_cli import local_cli

STAGE = "test"
LINES = 40
TASK = f"name: count\nrun: |\n  for i in $(seq 1 {LINES}); do echo line-$i; sleep 0.2; done\n"


class Replicas:
    """A client of several API server URLs: a request that cannot connect goes to the next one."""

    def __init__(self, urls: list[str], token: str) -> None:
        self.urls = urls
        self.headers = {"Authorization": f"Bearer {token}"}
        self.current = 0

    def _each(self):
        for i in range(len(self.urls)):
            yield (self.current + i) % len(self.urls)

    def request(self, method: str, path: str, **kw) -> httpx.Response:
        last: Exception | None = None
        for i in self._each():
            try:
                res = httpx.request(method, self.urls[i] + path, headers=self.headers, timeout=20, **kw)
            except httpx.TransportError as exc:
                last = exc
                continue
            self.current = i
            return res
        raise AssertionError(f"no replica answered: {last}")

    def stream_logs(self, path: str, seen: list[tuple[int, str]], on_line, deadline: float) -> dict:
        """Frames until `end`, reconnecting (to the next replica) with Last-Event-ID when cut off."""
        while time.monotonic() < deadline:
            for i in self._each():
                headers = dict(self.headers)
                if seen:  # from the last frame seen, on whichever replica answers
                    headers["Last-Event-ID"] = str(seen[-1][0])
                try:
                    with httpx.stream("GET", self.urls[i] + path, headers=headers, timeout=30) as res:
                        if res.status_code == 404:  # the job is not queued yet
                            time.sleep(0.3)
                            break
                        assert res.status_code == 200, res.read()
                        self.current = i
                        event = fid = None
                        for raw in res.iter_lines():
                            if raw.startswith("id: "):
                                fid = int(raw[4:])
                            elif raw.startswith("event: "):
                                event = raw[7:]
                            elif raw.startswith("data: "):
                                import json

                                data = json.loads(raw[6:])
                                if event == "end":
                                    return data
                                if event == "line":
                                    seen.append((fid, data["line"]))
                                    on_line(data["line"])
                    break
                except (httpx.TransportError, httpx.RemoteProtocolError):
                    continue  # this replica is gone: the next one, from the last id seen
        raise AssertionError(f"the stream never ended; saw {[line for _, line in seen][-5:]}")


def test_a_client_carries_on_through_the_other_replica_when_one_is_killed(tmp_path: Path) -> None:
    with local_cli(tmp_path, STAGE) as env:
        alice, _, _, _ = team_of_four(env)
        server = SimpleNamespace(url=f"nats://127.0.0.1:{env['SKYPURZA_NATS_PORT']}")
        a, b = Api(server, tmp_path, name="api-a"), Api(server, tmp_path, name="api-b")
        try:
            client = Replicas([a.url, b.url], alice)
            res = client.request("POST", "/api/v1/tasks", json={"task": TASK, "cluster": "rep",
                                                                "overrides": {"infra": "local"}})
            assert res.status_code == 202, res.text
            assert client.current == 0  # through A

            killed: list[bool] = []

            def on_line(line: str) -> None:
                if line == "line-8" and not killed:
                    a.proc.send_signal(signal.SIGKILL)  # A dies mid-stream, without a goodbye
                    a.proc.wait(10)
                    killed.append(True)

            seen: list[tuple[int, str]] = []
            end = client.stream_logs("/api/v1/clusters/rep/jobs/1/logs", seen, on_line, time.monotonic() + 150)
            assert killed and client.current == 1, "the stream went on through B"
            assert [line for _, line in seen] == [f"line-{i}" for i in range(1, LINES + 1)], seen
            ids = [i for i, _ in seen]
            assert ids == sorted(set(ids)), "each chunk once, in the log's order"
            assert end["status"] == "SUCCEEDED" and end["exit_code"] == 0, end

            # Submissions carry on through B too (the client does not know which one is up).
            again = client.request("POST", "/api/v1/tasks", json={"task": "run: echo again\n", "cluster": "rep2",
                                                                  "overrides": {"infra": "local"}})
            assert again.status_code == 202 and again.json()["user"] == "alice", again.text
            assert client.current == 1
        finally:
            b_out = b.close()
            a.close()
        assert "Traceback" not in b_out, b_out[-3000:]
