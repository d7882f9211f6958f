"""Retry policy: an immutable value, asked "again, and after how long?"."""

from __future__ import annotations

import dataclasses
import random
import time

from swarmget.errors import ErrorCode

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
RETRYABLE_CODES = frozenset(
    {ErrorCode.CONNECT, ErrorCode.TIMEOUT, ErrorCode.TRUNCATED}
    | {f"http_{status}" for status in RETRYABLE_STATUS}
)


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter (AWS architecture blog), capped.

    ``delay(attempt)`` for attempt n (1-based, the attempt that just failed) is
    uniform in [0, min(cap, base * 2**(n-1))].  A server's ``Retry-After`` wins,
    up to ``retry_after_cap``.
    """

    retries: int = 3
    base: float = 0.5
    cap: float = 30.0
    retry_after_cap: float = 120.0

    def should_retry(self, code: str, attempts: int) -> bool:
        return attempts <= self.retries and code in RETRYABLE_CODES

    def delay(self, attempts: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(max(0.0, retry_after), self.retry_after_cap)
        return random.uniform(0.0, min(self.cap, self.base * 2 ** max(0, attempts - 1)))


def parse_retry_after(value: bytes | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date)."""
    if not value:
        return None
    text = value.decode("latin-1").strip()
    if text.isdigit():
        return float(text)
    import email.utils  # ~14 ms to import, and HTTP-dates are rare here: only now

    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
