"""Retry policy and retry state: immutable values, asked "again, and after how long?".

Theory of operation
-------------------
Two values, as in urllib3's ``Retry``:

* :class:`RetryPolicy` is the run's rule (how many attempts, which codes,
  backoff), fixed for the whole run.
* :class:`RetryState` is one transfer's history: the attempts that counted,
  the ones that did not (a redirect hop, a restart after a mismatched
  ``Content-Range``, a kept-alive connection the server had already closed, a
  429 to a request already under way when its host had said so),
  and the error code of every failure so far.  Every event makes a new state;
  nothing edits a counter in place, so "how many attempts" is never out of
  step with "what happened".

:meth:`RetryPolicy.wait` turns a state and a failure into a delay (retry
after that long) or None (give up).  Three rules bound the time a bad host can
cost a run:

* a timeout (silence longer than ``--timeout`` at the connect, in a TLS
  handshake or a proxy's tunnel, or after the request; or a transfer cut for
  slowness, ``--min-speed``: a :class:`Stalled` error) is retried at most once;
* a server's ``Retry-After`` is honoured up to ``retry_after_cap``, but a wait
  that would end after the row's ``--deadline`` fails the row now (the
  engine weighs that, and says it in the row's message);
* the per-host circuit breaker (engine/scheduler.py) gives up the remaining
  rows of a host after ``--host-failures`` consecutive failures.

:meth:`RetryPolicy.push_back` answers the question for the host rather than
the row: a 429 says the client as a whole is too fast, so the scheduler sends
that host nothing new for as long (its ``Retry-After``, else the backoff's
ceiling, growing with the host's rows refused in a row), and the rows queued
meanwhile spend no attempt on the refusal.
"""

from __future__ import annotations

import dataclasses
import datetime
import random
import time

from swarmget.errors import ErrorCode, TransferError, http_code
from swarmget.sinks.files import OutOfDescriptors

# As curl --retry: 522 and 524 are a CDN's word (Cloudflare) for an origin that
# did not accept, or did not answer in time: a 504 by another name.
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504, 522, 524})
RETRYABLE_CODES = frozenset(
    {ErrorCode.CONNECT, ErrorCode.TIMEOUT, ErrorCode.TRUNCATED}
    | {f"http_{status}" for status in RETRYABLE_STATUS}
)
_TOO_MANY = http_code(429)
# History entries for attempts that did not count against --retries.
REDIRECT = "redirect"
RESTART = "restart"
STALE = "stale"
# A 429 to a request sent before its host's latest pause began (engine._failed).
BURST = "burst"
STALLED = "stalled"  # appended after the error code of a Stalled failure


class Stalled(TransferError):
    """A transfer cut for slowness: below ``--min-speed`` or silent for ``--timeout``.

    Code ``timeout`` like any timeout; the class tells the retry policy that a
    second slow attempt is not worth a third.
    """

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.TIMEOUT, message)

    def _arguments(self) -> tuple[str]:
        return (self.message,)


class RetryState:
    """What happened to one transfer so far; every method returns a new state."""

    __slots__ = ("attempts", "history")

    def __init__(self, attempts: int = 0, history: tuple[str, ...] = ()) -> None:
        self.attempts = attempts  # requests that counted (the manifest's "attempts")
        self.history = history  # error codes and free retries, oldest first

    def started(self) -> RetryState:
        """A request for this transfer went out (or a connect began)."""
        return RetryState(self.attempts + 1, self.history)

    def failed(self, error: TransferError) -> RetryState:
        entry = f"{error.code}:{STALLED}" if isinstance(error, Stalled) else error.code
        return RetryState(self.attempts, (*self.history, entry))

    def forgiven(self, reason: str) -> RetryState:
        """The last attempt does not count: ``reason`` is REDIRECT, RESTART, STALE or BURST."""
        return RetryState(self.attempts - 1, (*self.history, reason))

    def count(self, entry: str) -> int:
        return sum(1 for seen in self.history if seen == entry or seen.endswith(":" + entry))

    def __repr__(self) -> str:
        return f"RetryState(attempts={self.attempts}, history={self.history!r})"


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
    slow_retries: int = 1  # retries after timeouts (silence, slowness), in all

    def should_retry(self, code: str, attempts: int) -> bool:
        return attempts <= self.retries and code in RETRYABLE_CODES

    def delay(self, attempts: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(max(0.0, retry_after), self.retry_after_cap)
        return random.uniform(0.0, self.ceiling(attempts))

    def ceiling(self, attempts: int) -> float:
        """The longest backoff after ``attempts`` attempts."""
        # The exponent is bounded: 2.0 ** 1025 overflows (OverflowError), and
        # any cap is reached long before 2 ** 64 times the base.
        return min(self.cap, self.base * 2.0 ** min(64, max(0, attempts - 1)))

    def asks_too_long(self, error: TransferError, retry_after: float | None) -> bool:
        """Does the server ask this row to wait longer than we ever wait (a 503
        saying "tomorrow": waiting our cap, then asking again, three times, only
        delays a failure)?  A 429's wait is the host's (push_back), not the row's."""
        return (
            retry_after is not None
            and retry_after > self.retry_after_cap
            and error.code != _TOO_MANY
        )

    def push_back(self, status: int, refusals: int, retry_after: float | None) -> float | None:
        """How long the whole host should be sent nothing new after this reply,
        None if it concerns only its own row.  A 429 (too many requests) speaks
        of the client's rate, so of every row to the host: its Retry-After
        (capped), else the backoff's ceiling for ``refusals``: the refused
        row's attempts, or the host's rows in a row refused at their first
        request if more (engine/core.py).  The row's alone stayed at 0.5 s or
        1 s when each probe was another row, and a 10 s ban (no Retry-After)
        gave the host up (--host-failures) within 6 s, every row failing
        http_429.  (Grown with every pause in a row, rows refused again
        included, it took minutes to give up a host refusing everything.)
        A 503 may be one URL's trouble (one file's backend down): only its
        row waits, the others go on."""
        if status != 429:
            return None
        if retry_after is not None:
            return self.delay(refusals, retry_after)
        return self.ceiling(refusals)

    def wait(
        self, state: RetryState, error: TransferError, retry_after: float | None = None
    ) -> float | None:
        """Seconds to wait before the next attempt, None when ``error`` is not to
        be retried at all.  ``state`` already holds ``error`` (see
        :meth:`RetryState.failed`).  The row's --deadline is the engine's to
        weigh: a wait past it fails the row, saying so (engine/core.py)."""
        if isinstance(error, OutOfDescriptors) and state.attempts <= self.retries:
            return self.delay(state.attempts)  # a moment's shortage, whatever its code
        if not self.should_retry(error.code, state.attempts):
            return None
        if self.asks_too_long(error, retry_after):
            return None
        if error.code == ErrorCode.TIMEOUT:
            # Silence for --timeout (at the connect, in a handshake, after the
            # request) or slowness: a second such attempt is not worth a third.
            # A connect retried as often as any failure held a dead host's row
            # (and its place in the window) for four --timeouts and backoffs.
            if state.count(ErrorCode.TIMEOUT) + state.count(STALLED) > self.slow_retries:
                return None
            return 0.0  # the time was spent already, waiting: no reason to wait more
        return self.delay(state.attempts, retry_after)


def parse_retry_after(value: bytes | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date)."""
    if not value:
        return None
    text = value.decode("latin-1").strip()
    if text.isascii() and text.isdigit():  # not "\xb2": a digit to isdigit(), not to float()
        return float(text)
    when = parse_http_date(value)
    if when is None:
        return None
    try:
        return max(0.0, when.timestamp() - (time.time() if now is None else now))
    except (ValueError, OverflowError, OSError):
        return None


def retry_after_advice(value: bytes | None, now: float | None = None) -> float | None:
    """The wait a Retry-After field asks for, None when it gives no advice:
    absent, unreadable, or asking for no wait at all ("0", a date already
    past).  Taken at its word, a 429 with "Retry-After: 0" paused its host for
    no time: the whole queue went out again at once into the same refusal,
    and --host-failures gave the host up within a fraction of a second.  With
    no advice the backoff applies, as in curl (whose CURLINFO_RETRY_AFTER is 0
    then, and which backs off as without the field)."""
    seconds = parse_retry_after(value, now)
    return seconds if seconds is not None and seconds > 0 else None


def parse_http_date(value: bytes) -> datetime.datetime | None:
    """An HTTP-date field value (Retry-After, Date, Last-Modified); None for one
    that is not.  A field the server got wrong is ignored, never our error: this
    runs while a head is judged, where any exception failed the row as protocol."""
    import email.utils  # ~14 ms to import, and HTTP-dates are rare here: only now

    try:
        when = email.utils.parsedate_to_datetime(value.decode("latin-1").strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    # asctime's form has no zone, and email.utils reads "-0000" as none: both
    # are GMT all the same (RFC 9110 5.6.7).  A naive datetime was read in the
    # local zone (a Retry-After off by hours) and could not be compared with an
    # aware one (a Last-Modified in asctime's form was no resume validator).
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.UTC)
