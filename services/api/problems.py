"""RFC 9457 problem details: what every error of the API server is answered with."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

PROBLEM = "application/problem+json"
PROBLEM_BASE = "https://skypurza.dev/problems/"  # a stable identifier per kind of problem (RFC 9457 `type`)


class Problem(Exception):
    """An RFC 9457 problem: raised anywhere in a request, answered as problem+json."""

    def __init__(self, status: int, kind: str, title: str, detail: str, headers: dict[str, str] | None = None,
                 **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.kind, self.title, self.detail = status, kind, title, detail
        self.headers = headers or {}
        self.extra = extra

    def response(self, instance: str = "") -> JSONResponse:
        body = {"type": PROBLEM_BASE + self.kind, "title": self.title, "status": self.status, "detail": self.detail,
                **({"instance": instance} if instance else {}), **self.extra}
        return JSONResponse(body, status_code=self.status, headers=self.headers, media_type=PROBLEM)


def forbidden(reason: str) -> Problem:
    return Problem(403, "forbidden", "Forbidden", reason)


def not_found(detail: str) -> Problem:
    return Problem(404, "not-found", "Not Found", detail)


def conflict(detail: str) -> Problem:
    return Problem(409, "conflict", "Conflict", detail)


def unavailable(detail: str, retry_after_s: int = 5) -> Problem:
    return Problem(503, "unavailable", "Service unavailable", detail, {"Retry-After": str(retry_after_s)})
