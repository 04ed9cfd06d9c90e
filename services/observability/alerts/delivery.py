"""Webhook delivery: the two message forms (pure) and one message's delivery to one webhook,
with bounded retries and back-off.

- Slack-compatible: `{"text": ..., "blocks": [...]}` (an incoming webhook of Slack, and the
  many chat tools that take its form: Mattermost, Rocket.Chat, Discord's `/slack` URLs);
- plain JSON: `{"version": 1, "status": "firing"|"resolved", "key", "kind", ...}` for anything else.

`deliver` never raises on a receiver's failure: it returns what happened (delivered after N
attempts, or given up with the last error). A 2xx answer is delivered; 4xx other than 408/429 is
given up at once (the receiver will not take this message however often it is sent); anything
else (5xx, 408, 429, a refused connection, a timeout) is retried after `backoff_s`, doubled each
time, at most `MAX_BACKOFF_S`, `attempts` times in all.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from skypurza.events.naming import PROJECT

from .settings import Webhook

USER_AGENT = f"{PROJECT}/alerts"

MAX_BACKOFF_S = 300.0
MAX_BODY_BYTES = 64 * 1024  # what one message may weigh; the evidence is cut to fit
MAX_ERROR_CHARS = 300
RETRYABLE_4XX = (408, 425, 429)
EMOJI = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}


@dataclass(frozen=True)
class Message:
    """One thing to tell: an alert raised or resolved."""

    stage: str
    what: str  # raised | resolved
    key: str
    kind: str
    subject: str
    severity: str
    summary: str
    occurrence: int
    at: str  # ISO time it was raised or resolved
    evidence: dict[str, Any]
    reason: str = ""  # a resolve's


@dataclass(frozen=True)
class Outcome:
    outcome: str  # delivered | gave_up
    attempts: int
    error: str = ""


def _evidence(evidence: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(evidence, default=str)
    if len(text) <= MAX_BODY_BYTES // 2:
        return evidence
    return {"truncated": text[: MAX_BODY_BYTES // 4]}


def json_body(m: Message) -> dict[str, Any]:
    return {"version": 1, "status": "firing" if m.what == "raised" else "resolved", "stage": m.stage,
            "key": m.key, "kind": m.kind, "subject": m.subject, "severity": m.severity, "summary": m.summary,
            "occurrence": m.occurrence, ("raised_at" if m.what == "raised" else "resolved_at"): m.at,
            **({"reason": m.reason} if m.reason else {}), "evidence": _evidence(m.evidence)}


def _mrkdwn(text: str) -> str:
    # Slack's three control characters; a cluster name cannot make a link or a mention.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_body(m: Message) -> dict[str, Any]:
    if m.what == "raised":
        head = f"{EMOJI.get(m.severity, '')} [{m.severity.upper()}] {m.summary}".strip()
    else:
        head = f":white_check_mark: [RESOLVED] {m.summary or m.subject}" + (f" ({m.reason})" if m.reason else "")
    facts = "\n".join(f"*{_mrkdwn(str(k))}*: {_mrkdwn(str(v))[:200]}" for k, v in list(m.evidence.items())[:12])
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": _mrkdwn(head)[:3000]}},
    ]
    if facts and m.what == "raised":
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": facts[:3000]}})
    blocks.append({"type": "context", "elements": [
        {"type": "mrkdwn", "text": _mrkdwn(f"{m.kind} · {m.subject} · stage {m.stage} · {m.at} · key {m.key}")[:3000]}]})
    return {"text": head[:3000], "blocks": blocks}


def body_of(hook: Webhook, m: Message) -> bytes:
    return json.dumps(slack_body(m) if hook.form == "slack" else json_body(m), default=str).encode()


class _Refused(Exception):
    """A 4xx the receiver will answer again: not worth a retry."""


def post(url: str, body: bytes, timeout_s: float) -> None:
    """One POST (blocking: run in a thread). Raises on anything but a 2xx answer."""
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            r.read(4096)
    except urllib.error.HTTPError as exc:
        if 400 <= exc.code < 500 and exc.code not in RETRYABLE_4XX:
            raise _Refused(f"HTTP {exc.code}") from None
        raise RuntimeError(f"HTTP {exc.code}") from None


def _one_line(exc: BaseException) -> str:
    # Never the URL (urllib puts it in some messages): the type and the reason only.
    reason = getattr(exc, "reason", None)
    text = f"{type(exc).__name__}: {reason if reason is not None else exc}"
    return " ".join(text.split())[:MAX_ERROR_CHARS]


ATTEMPT_GRACE_S = 5.0  # how far past its own timeout one POST may run before `deliver` stops waiting


def longest_s(attempts: int, backoff_s: float, timeout_s: float) -> float:
    """Pure: the longest `deliver` can take with these settings (every attempt timing out, every
    back-off slept): how long another instance waits on a claim before taking the message over."""
    waits, delay = 0.0, backoff_s
    for _ in range(attempts - 1):
        waits += delay
        delay = min(delay * 2, MAX_BACKOFF_S)
    return attempts * (timeout_s + ATTEMPT_GRACE_S) + waits


async def deliver(hook: Webhook, m: Message, *, attempts: int, backoff_s: float, timeout_s: float,
                  sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                  send: Callable[[str, bytes, float], None] = post,
                  on_failure: Callable[[int, str], None] | None = None) -> Outcome:
    """Send `m` to `hook` until it is taken, `attempts` at most; never raises for the receiver."""
    body = body_of(hook, m)
    delay, error = backoff_s, ""
    for attempt in range(1, attempts + 1):
        try:
            await asyncio.wait_for(asyncio.to_thread(send, hook.url, body, timeout_s), timeout_s + ATTEMPT_GRACE_S)
            return Outcome("delivered", attempt)
        except asyncio.CancelledError:
            raise
        except _Refused as exc:
            error = _one_line(exc)
            if on_failure:
                on_failure(attempt, error)
            return Outcome("gave_up", attempt, error)
        except Exception as exc:
            error = _one_line(exc)
            if on_failure:
                on_failure(attempt, error)
        if attempt < attempts:
            await sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)
    return Outcome("gave_up", attempts, error)
