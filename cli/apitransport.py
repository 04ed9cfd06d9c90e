"""The HTTP side of the CLI's transport seam (cli/transport.py): the API server's routes over httpx.

Every failure is one `ApiError` with the HTTP status (0: no answer) and a line a person can act
on: the server's RFC 9457 `detail`, or what was wrong with reaching it. Bounded: a connection
is given CONNECT_S, an answer READ_S; a stream gets STREAM_READ_S between frames (the server
sends a comment frame every 15 s), so nothing waits forever on a server that went away.
The token goes in the Authorization header only: never in a message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from . import httplight  # noqa: F401  (first: httpx without trio and its command line)

import httpx

from .apiclient import Endpoint

CONNECT_S = 10.0
READ_S = 60.0
STREAM_READ_S = 60.0
MAX_FRAME = 1024 * 1024  # a data line longer than this is not the server's


class ApiError(Exception):
    """The API server refused or failed a request; `status` 0 when it did not answer at all."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ApiTransport:
    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.url = endpoint.url
        headers = {"Accept": "application/json"}
        if endpoint.token:
            headers["Authorization"] = f"Bearer {endpoint.token}"
        self.http = httpx.Client(base_url=endpoint.url, headers=headers,
                                 timeout=httpx.Timeout(READ_S, connect=CONNECT_S))

    # ------------------------------------------------------------------------------ plain requests

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        return self._json("GET", path, params={k: _q(v) for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._json("POST", path, body=body)

    def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._json("PATCH", path, body=body)

    def delete(self, path: str) -> dict[str, Any]:
        return self._json("DELETE", path)

    def _json(self, method: str, path: str, params: dict[str, Any] | None = None,
              body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            res = self.http.request(method, path, params=params, json=body)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if res.status_code >= 400:
            raise self._refused(res)
        try:
            out = res.json()
        except ValueError:
            out = None
        if not isinstance(out, dict):
            raise ApiError(res.status_code, f"{self.url} is not an spz API server: {method} {path} did not "
                                             "answer JSON")
        return out

    # ------------------------------------------------------------------------------------- streams

    def frames(self, path: str, **params: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event, data) of a server-sent stream until the server ends it."""
        timeout = httpx.Timeout(STREAM_READ_S, connect=CONNECT_S)
        try:
            with self.http.stream("GET", path, params={k: _q(v) for k, v in params.items() if v is not None},
                                  headers={"Accept": "text/event-stream"}, timeout=timeout) as res:
                if res.status_code >= 400:
                    res.read()
                    raise self._refused(res)
                event, data = None, []
                for raw in res.iter_lines():
                    if len(raw) > MAX_FRAME:
                        raise ApiError(res.status_code, f"{self.url} sent a stream frame over {MAX_FRAME:,} bytes")
                    if raw.startswith("event: "):
                        event = raw[7:]
                    elif raw.startswith("data: "):
                        data.append(raw[6:])
                    elif raw == "" and event is not None:
                        try:
                            yield event, json.loads("\n".join(data))
                        except ValueError:
                            raise ApiError(res.status_code, f"{self.url} sent a stream frame that is not JSON") from None
                        event, data = None, []
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    def download(self, path: str, sink: Any, limit: int, **params: Any) -> tuple[int, bool]:
        """Write a streamed plain response to `sink` (a binary file) as it comes, at most
        `limit` bytes of it: (bytes written, whether it was cut there)."""
        timeout = httpx.Timeout(STREAM_READ_S, connect=CONNECT_S)
        written = 0
        try:
            with self.http.stream("GET", path, params={k: _q(v) for k, v in params.items() if v is not None},
                                  headers={"Accept": "text/plain"}, timeout=timeout) as res:
                if res.status_code >= 400:
                    res.read()
                    raise self._refused(res)
                for chunk in res.iter_bytes():
                    if written + len(chunk) > limit:
                        sink.write(chunk[:limit - written])
                        return limit, True
                    sink.write(chunk)
                    written += len(chunk)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        return written, written >= limit

    # -------------------------------------------------------------------------------------- errors

    def _unreachable(self, exc: Exception) -> ApiError:
        if isinstance(exc, httpx.TimeoutException):
            why = f"no answer in time ({type(exc).__name__})"
        else:
            why = str(exc) or type(exc).__name__
        return ApiError(0, f"cannot reach the API server at {self.url}: {why}; is it running (spz api start), "
                           "and is the URL right (spz api info)?")

    def _refused(self, res: httpx.Response) -> ApiError:
        detail = _detail(res)
        if res.status_code == 401:
            if self.endpoint.token:
                return ApiError(401, f"{self.url} refused the token (401): it is unknown, revoked, or its user was "
                                     "removed; ask an admin for a new one (spz users token NAME)")
            return ApiError(401, f"{self.url} needs a token (401): spz api login -e {self.url} --token TOKEN, "
                                 "or set SKYPURZA_API_TOKEN")
        if res.status_code == 403:
            return ApiError(403, f"not allowed: {detail}")
        if res.status_code >= 500:
            return ApiError(res.status_code, f"the API server at {self.url} failed ({res.status_code}): {detail}")
        return ApiError(res.status_code, detail)


def _q(value: Any) -> Any:
    return ("true" if value else "false") if isinstance(value, bool) else value


def _detail(res: httpx.Response) -> str:
    """The RFC 9457 `detail` (with the fields at fault), else the status line."""
    try:
        body = res.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        detail = body["detail"]
        errors = body.get("errors") or body.get("problems")
        if isinstance(errors, list) and errors:
            parts = [f"{e.get('field') or e.get('path') or e.get('loc') or ''}: {e.get('message') or e.get('msg') or ''}"
                     for e in errors[:5] if isinstance(e, dict)]
            detail += " (" + "; ".join(p for p in parts if p.strip(": ")) + ")" if parts else ""
        return detail[:2000]
    return f"{res.status_code} {res.reason_phrase}"
