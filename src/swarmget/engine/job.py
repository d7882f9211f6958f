"""Jobs and transfers: one input row, and the requests that fetch its bytes.

A :class:`Job` is one planned row (:class:`~swarmget.sinks.base.Assignment`)
on its way to one outcome: where its URL leads now (redirects move it), the
validator a resumed part must match, when it began.  A :class:`Transfer` is one
request on one connection for the byte range ``[start, end)`` of the job's
body (``end`` None: to the end), with its own :class:`RetryState`.  Today a job
owns one transfer at a time (``Range: bytes=START-`` continues a kept part);
the range bookkeeping is general so that a big file can later be split into
several transfers on several connections.
"""

from __future__ import annotations

from swarmget.engine.retry import RetryState
from swarmget.engine.urls import Location
from swarmget.options import Options
from swarmget.sinks.base import Assignment, Writer


class Job:
    __slots__ = (
        "admitted",
        "authorization",
        "carried",
        "cross_origin",
        "deadline",
        "first_authorization",
        "first_origin",
        "first_start",
        "host_header",
        "named_for",
        "naming_since",
        "origin",
        "redirect_to",
        "redirects",
        "row",
        "target",
        "total",
        "url",
        "validator",
    )

    def __init__(
        self, row: Assignment, location: Location, deadline: float = Options.AUTO_DEADLINE
    ) -> None:
        self.row = row
        self.url = row.url  # the current URL: differs from row.url after a redirect
        self.redirects = 0
        self.redirect_to: str | None = None  # set by a 3xx head, followed when it completes
        self.cross_origin = False  # a redirect left the first origin: no credentials
        self.origin = self.first_origin = location.origin
        self.target = location.target
        self.host_header = location.host_header
        self.authorization = location.authorization  # from user:password@ in the URL
        self.first_authorization = location.authorization
        self.first_start = 0.0  # loop time of the first attempt (--deadline counts from it)
        # Seconds from then the row may take: --deadline, or with none given, more
        # once a long body is announced (Options.long_file_rate).
        self.deadline = deadline
        # Before it: waiting for the host's name counts in --deadline too, as in
        # curl -m (engine/core.py): since when it waits (0.0: it does not), and
        # for how long it waited before.  Not the wait for a free connection.
        self.naming_since = 0.0
        self.named_for = 0.0
        self.admitted = 0.0  # loop time the engine took the row (waiting for DNS counts)
        self.validator: str | None = row.validator  # ETag / Last-Modified for If-Range
        # Bytes of the file that an earlier run kept (its part) and this row still
        # builds on: the resume point, until a body starts below it (from zero).
        # Not received in this run, so not in its transfer rate.
        self.carried = row.resume_from
        # The entity's length as this run's last accepted response announced it
        # (None: not known).  A later 206 or 416 that tells another length is of
        # another version of the file: its bytes are not spliced onto ours.
        self.total: int | None = row.total  # an earlier run's, when it kept a part

    def move_to(self, url: str, location: Location) -> None:
        """Follow a redirect to ``url``."""
        if location.origin == self.first_origin:
            # Back at the first origin (curl: its host, port and scheme): the
            # credentials the user gave for it go again (they did not: a
            # sign-in detour through another host ended in a 401).
            self.cross_origin = False
            self.authorization = location.authorization or self.first_authorization
        elif location.origin != self.origin:
            self.cross_origin = True  # credentials stay with the first origin
            self.authorization = location.authorization
        elif location.authorization is not None:
            self.authorization = location.authorization  # user:password@ of its own, as curl
        self.redirects += 1
        self.url = url
        self.origin = location.origin
        self.target = location.target
        self.host_header = location.host_header

    def back_to_start(self, location: Location) -> None:
        """Again from the row's own URL (``location``, split), its redirects
        forgotten: a retry asks the URL the user gave, as curl --retry does.  A
        redirector (a mirror network, an API handing out presigned URLs) may
        send it elsewhere this time; the target that failed may be a mirror
        that is down or a link that has expired."""
        self.url = self.row.url
        self.redirects = 0
        self.redirect_to = None
        self.cross_origin = False
        self.origin = location.origin
        self.target = location.target
        self.host_header = location.host_header
        self.authorization = location.authorization

    @property
    def final_url(self) -> str | None:
        """The URL after redirects, or None when it is the row's own."""
        return self.url if self.url != self.row.url else None


class Transfer:
    """One request for bytes ``[start, end)`` of a job's body."""

    __slots__ = ("end", "fresh", "job", "retry", "speed_window", "start", "writer")

    def __init__(
        self, job: Job, start: int = 0, end: int | None = None, retry: RetryState | None = None
    ) -> None:
        self.job = job
        self.start = start  # first byte asked for (a kept part's size when resuming)
        self.end = end  # one past the last byte, None for "to the end"
        self.retry = retry if retry is not None else RetryState()
        self.fresh = False  # must not reuse a kept-alive connection (see the scheduler)
        self.writer: Writer | None = None  # open once a 2xx head arrived
        # The --min-speed window of the next attempt; 0.0: the option's.  A
        # retry after a slow attempt gets what is left of two windows.
        self.speed_window = 0.0

    @property
    def ranged(self) -> bool:
        return self.start > 0 or self.end is not None

    def range_header(self) -> str:
        """``bytes=START-[END-1]`` for the Range header (RFC 9110 14.1.2)."""
        last = "" if self.end is None else str(self.end - 1)
        return f"bytes={self.start}-{last}"

    def __repr__(self) -> str:
        return f"<Transfer {self.job.url} [{self.start}, {self.end})>"


def content_range_end(value: bytes) -> int:
    """The byte after LAST of a ``Content-Range`` that :func:`content_range_ok` accepted."""
    return int(value[6:].partition(b"/")[0].partition(b"-")[2]) + 1


def content_range_total(value: bytes) -> int | None:
    """TOTAL of a ``Content-Range`` that :func:`content_range_ok` accepted (None: ``*``)."""
    total = value.partition(b"/")[2].strip()
    return None if total == b"*" else int(total)


def content_range_ok(value: bytes | None, start: int, end: int | None = None) -> bool:
    """Does ``Content-Range: bytes FIRST-LAST/TOTAL`` answer a request for ``[start, end)``?

    FIRST must be ``start``; LAST must reach ``end - 1`` (or the end of the
    entity when ``end`` is None, or when the entity is shorter than ``end``).
    """
    if not value or value[:6].lower() != b"bytes ":  # units are case-blind (RFC 9110 14.1)
        return False
    span, _, total = value[6:].partition(b"/")
    first, _, last = span.partition(b"-")
    try:
        first_i, last_i = int(first), int(last)
        total_i = None if total.strip() == b"*" else int(total)
    except ValueError:
        return False
    if first_i != start or last_i < first_i:
        return False
    if total_i is not None and last_i >= total_i:
        return False
    if end is None:
        return total_i is None or last_i == total_i - 1
    if total_i is not None and total_i < end:
        return last_i == total_i - 1
    return last_i == end - 1
