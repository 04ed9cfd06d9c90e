"""botocore retries that fail over fast.

How botocore decides (1.40, aiobotocore 2.25): the client registers one handler on
`needs-retry.<service>` (unique id `retry-config-<service>`). In *standard* mode it retries a
response when any of these holds: the HTTP status is 500/502/503/504 (whatever the error
code), the code is a throttling code (RequestLimitExceeded, Throttling, ...), the code is one
of RequestTimeout/PriorRequestNotComplete, the error shape is modelled retryable, or the
connection failed. *Legacy* mode (`_retry.json`) likewise retries every 500/502/503/504 plus
EC2's RequestLimitExceeded. AWS answers InsufficientInstanceCapacity (and the other
Insufficient*Capacity codes) with HTTP 500, so both modes spend seconds of back-off on an
error that will not go away, before the optimizer can try the next zone.

`install_retry_policy` swaps that handler for one that asks `aws_errors.should_retry` first:
capacity, quota, unsupported and auth errors surface on the first answer, while throttling,
AWS-side faults and connection errors are retried with jittered exponential back-off, under
botocore's own retry quota (a token bucket that stops retry storms).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from aiobotocore.retries.standard import AioRetryHandler, AioRetryPolicy
from botocore.config import Config
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.exceptions import HTTPClientError
from botocore.retries import quota
from botocore.retries.base import BaseRetryableChecker, BaseRetryBackoff
from botocore.retries.standard import RetryContext, RetryEventAdapter, RetryQuotaChecker

from . import aws_errors


@dataclass(frozen=True)
class RetryOptions:
    max_attempts: int = 6  # first call included
    base_delay: float = 0.5  # seconds; delay n is rand(0, 1) * min(base * 2**n, max_delay)
    max_delay: float = 20.0
    connect_timeout: float = 10.0
    read_timeout: float = 60.0


def client_config(options: RetryOptions) -> Config:
    """The botocore Config for EC2 clients (the handler itself is swapped afterwards)."""
    return Config(
        retries={"mode": "standard", "total_max_attempts": options.max_attempts},
        connect_timeout=options.connect_timeout,
        read_timeout=options.read_timeout,
    )


class _ClassifiedChecker(BaseRetryableChecker):
    def __init__(self, max_attempts: int) -> None:
        self._max_attempts = max_attempts

    def is_retryable(self, context: RetryContext) -> bool:
        if context.attempt_number >= self._max_attempts:
            context.add_retry_metadata(MaxAttemptsReached=True)
            return False
        if context.caught_exception is not None:
            return isinstance(context.caught_exception, (BotoConnectionError, HTTPClientError))
        status = context.http_response.status_code if context.http_response is not None else None
        code = context.get_error_code()
        if code is None and (status is None or status < 400):
            return False  # a success
        return aws_errors.should_retry(code, status)


class _Backoff(BaseRetryBackoff):
    def __init__(self, base: float, maximum: float, rand: Any = random.random) -> None:
        self._base = base
        self._max = maximum
        self._rand = rand

    def delay_amount(self, context: RetryContext) -> float:
        return self._rand() * min(self._base * 2 ** (context.attempt_number - 1), self._max)


def install_retry_policy(client: Any, options: RetryOptions = RetryOptions()) -> None:
    """Replace the client's retry handler (works for aiobotocore clients, any retry mode)."""
    service = client.meta.service_model.service_id.hyphenize()
    unique_id = f"retry-config-{service}"
    events = client.meta.events
    events.unregister(f"needs-retry.{service}", unique_id=unique_id)
    retry_quota = RetryQuotaChecker(quota.RetryQuota())
    events.register(f"after-call.{service}", retry_quota.release_retry_quota)
    handler = AioRetryHandler(
        retry_policy=AioRetryPolicy(
            retry_checker=_ClassifiedChecker(options.max_attempts),
            retry_backoff=_Backoff(options.base_delay, options.max_delay),
        ),
        retry_event_adapter=RetryEventAdapter(),
        retry_quota=retry_quota,
    )
    events.register(f"needs-retry.{service}", handler.needs_retry, unique_id=unique_id)
