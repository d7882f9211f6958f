"""What to do with a response, decided from its head alone: a value, not an exception.

:func:`judge` looks at a final response head and the transfer that asked for
it, and returns a :class:`Verdict`:

* ``ACCEPT``: the body is ours; write it from byte ``start`` (0, or the start
  of the range we asked for when the server answered 206 with a matching
  ``Content-Range``, the same validator and a length that agrees; the body
  must then reach ``end``, the byte after the range's last).  Also a 416
  whose ``Content-Range: bytes */N`` says the part we kept (``If-Range``
  sent) ends where the file does: ``complete``, nothing of its body written;
* ``REDIRECT``: follow ``location`` (already checked: http(s), within the hop
  limit, no silent https -> http downgrade);
* ``RESTART``: a ranged request got a 206 for other bytes, of another version
  of the file (its ETag or Last-Modified is not the one we sent in
  ``If-Range``), or a 416 (the file is shorter than our part now): ask again
  from zero; not the server's failure, so it does not count as an attempt;
* ``FAIL``: the row fails with ``error`` (an HTTP error status, too large, a
  protocol violation), retried or not by the retry policy.

For ``REDIRECT`` and ``FAIL`` the verdict also says whether the body is worth
reading (``discard``: small and framed, so the connection can be kept) or the
connection should be closed now.  The connection acts on the verdict; nothing
here does I/O.
"""

from __future__ import annotations

from typing import Final

from swarmget.engine.job import (
    Transfer,
    content_range_end,
    content_range_ok,
    content_range_total,
)
from swarmget.engine.redirects import OPTIONAL_REDIRECTS, REDIRECT_STATUSES, redirect_target
from swarmget.engine.retry import parse_http_date, retry_after_advice
from swarmget.errors import ErrorCode, TransferError, http_code
from swarmget.net.proxy import Proxy
from swarmget.options import Options
from swarmget.protocol import ResponseHead

ACCEPT: Final = 0
REDIRECT: Final = 1
RESTART: Final = 2
FAIL: Final = 3

# An error response body larger than this is not worth reading to keep the
# connection: we close it instead.
MAX_DISCARD: Final = 256 * 1024
# ... nor one that takes longer than this after the request began (a trickle).
MAX_DISCARD_SECONDS: Final = 1.0


def proxy_auth_hint(proxy: Proxy | None) -> str:
    """What a 407 from ``proxy`` asks of the user: credentials, or other ones."""
    if proxy is not None and proxy.authorization is not None:
        return " (Proxy Authentication Required: the proxy refused the user:password given)"
    return " (Proxy Authentication Required: give user:password in the proxy URL)"


class Verdict:
    __slots__ = (
        "complete",
        "discard",
        "end",
        "error",
        "kind",
        "location",
        "retry_after",
        "stale",
        "start",
        "status",
        "total",
    )

    def __init__(
        self,
        kind: int,
        status: int,
        *,
        start: int = 0,
        end: int | None = None,
        error: TransferError | None = None,
        location: str | None = None,
        retry_after: float | None = None,
        discard: bool = False,
        stale: bool = False,
        complete: bool = False,
        total: int | None = None,
    ) -> None:
        self.kind = kind
        self.status = status
        self.start = start  # ACCEPT: the byte the body begins at
        self.end = end  # ACCEPT of a 206: the byte the body must reach
        self.error = error  # FAIL, RESTART
        self.location = location  # REDIRECT
        self.retry_after = retry_after  # FAIL: the server's Retry-After, in seconds
        self.discard = discard  # read the (small) body to keep the connection
        # FAIL on a reused connection before any of our response: most likely the
        # server closed it as we sent; retried once on a fresh one, for free.
        self.stale = stale
        # ACCEPT of a 416 for a kept part that is the whole file already: nothing
        # of the body (an error page) is the file's.
        self.complete = complete
        # ACCEPT: the entity's whole length as announced (None: not said), which
        # the connection keeps on the job (Job.total) for the next attempt.
        self.total = total

    def __repr__(self) -> str:
        kind = ("accept", "redirect", "restart", "fail")[self.kind]
        return f"<Verdict {kind} {self.status} error={self.error} location={self.location}>"


def judge(
    transfer: Transfer, head: ResponseHead, options: Options, proxy: Proxy | None = None
) -> Verdict:
    """The verdict on ``head`` for ``transfer``; ``proxy``: the http proxy it went
    through, if any."""
    status = head.status
    if status == 206:
        return _judge_partial(transfer, head, options)
    if 200 <= status < 300:
        return _judge_whole(transfer, head, options)
    if status == 416 and transfer.ranged:
        if _already_whole(transfer, head):
            # The kept part is the whole file (a run stopped between its last
            # byte and its rename): nothing is left to fetch.  The validator
            # in If-Range matched, or the server would have sent it all anew.
            start = transfer.start
            refused = _too_large(start, options) or _not_the_size(transfer, start)
            if refused is not None:
                return Verdict(FAIL, status, error=refused)
            return Verdict(ACCEPT, status, start=start, end=start, complete=True, total=start)
        # Our part is longer than the file now (it changed on a server that
        # ignores If-Range, or shrank): asking for the rest again would fail
        # the same way on every rerun.
        error = TransferError(
            ErrorCode.PROTOCOL,
            f"416 Range Not Satisfiable for Range: {transfer.range_header()}",
        )
        return Verdict(RESTART, status, error=error)
    discard = head.chunked or (
        head.content_length is not None and head.content_length <= MAX_DISCARD
    )
    location = head.get(b"location") if 300 <= status < 400 else None
    if location is not None and not location.strip():
        location = None  # an empty Location names nowhere
    if status in REDIRECT_STATUSES or (location is not None and status in OPTIONAL_REDIRECTS):
        if location is None:
            error = TransferError(
                ErrorCode.BAD_REDIRECT, f"HTTP {status} redirect without a Location"
            )
            return Verdict(FAIL, status, error=error)
        try:
            target = redirect_target(transfer.job, location, options)
        except TransferError as exc:
            return Verdict(FAIL, status, error=exc)
        return Verdict(REDIRECT, status, location=target, discard=discard)
    retry_after = retry_after_advice(head.get(b"retry-after"))
    return Verdict(
        FAIL, status, error=http_error(status, proxy), retry_after=retry_after, discard=discard
    )


def _already_whole(transfer: Transfer, head: ResponseHead) -> bool:
    """Does a 416 say our ranged request started at the file's end (``Content-Range:
    bytes */N``, N our start), with If-Range sent (a validator), and for the
    rest of the file (no end of ours)?"""
    if transfer.end is not None or transfer.job.validator is None or transfer.start <= 0:
        return False
    known = transfer.job.total
    if known is not None and known != transfer.start:
        # This run was told another length (a body cut short, then this 416 to
        # its retry): the part is not the whole file, whatever the 416 says.
        return False
    if _shows_another_version(transfer.job.validator, head):
        # A server that answers If-Range with a 416 of another version (it
        # should send that version whole): our part is not of it.
        return False
    value = head.get(b"content-range")
    if value is None:
        return False
    value = value.strip().lower()
    if not value.startswith(b"bytes */"):
        return False
    total = value[8:].strip()
    return total.isdigit() and int(total) == transfer.start


def _judge_whole(transfer: Transfer, head: ResponseHead, options: Options) -> Verdict:
    """A 2xx other than 206: the whole entity (the server ignored our Range, or
    the validator changed); either way the body starts at byte zero."""
    status = head.status
    length = head.content_length
    too_large = _too_large(length, options)
    if too_large is not None:
        return Verdict(FAIL, status, error=too_large)
    wrong_size = _not_the_size(transfer, length)
    if wrong_size is not None:
        assert length is not None
        return Verdict(FAIL, status, error=wrong_size, discard=length <= MAX_DISCARD)
    known = transfer.job.total
    if length is None and known is not None and _same_version(transfer.job.validator, head):
        # No length, but the same version as a reply that announced one (a
        # server ignoring our Range): the body must end there, or it was cut
        # (published short: "ok" for 1.5 of 2 MiB).
        return Verdict(ACCEPT, status, end=known, total=known)
    return Verdict(ACCEPT, status, total=length)


def _same_version(validator: str | None, head: ResponseHead) -> bool:
    """Does ``head`` show our validator itself (not merely no other)?"""
    return validator is not None and _shown(validator, head) == validator


def _shows_another_version(validator: str, head: ResponseHead) -> bool:
    """Does ``head`` carry a validator of the kind ours is, and another value?
    (A reply without one, as a 416 may be, shows nothing.)"""
    shown = _shown(validator, head)
    return shown is not None and shown != validator


def _validator_field(validator: str) -> bytes:
    """The field a validator of ours comes in: a quoted ETag, else a Last-Modified."""
    return b"etag" if validator.startswith('"') else b"last-modified"


def _shown(validator: str, head: ResponseHead) -> str | None:
    """What ``head`` says in the field ``validator`` comes in (None: nothing)."""
    value = head.get(_validator_field(validator))
    return None if value is None else value.strip().decode("latin-1")


def _judge_partial(transfer: Transfer, head: ResponseHead, options: Options) -> Verdict:
    content_range = head.get(b"content-range")
    if not transfer.ranged and not _whole_entity(content_range):
        # A part of the file nobody asked for.  One that says it is all of it
        # (``bytes 0-4/5``) is the file, as curl saves it.
        error = TransferError(ErrorCode.PROTOCOL, "206 Partial Content to a plain GET")
        return Verdict(FAIL, 206, error=error)
    if not content_range_ok(content_range, transfer.start, transfer.end):
        error = TransferError(
            ErrorCode.PROTOCOL,
            f"Content-Range {content_range!r} does not answer Range: {transfer.range_header()}",
        )
        return Verdict(RESTART, 206, error=error)
    assert content_range is not None
    end = content_range_end(content_range)
    length = head.content_length
    if length is not None and length != end - transfer.start:
        error = TransferError(
            ErrorCode.PROTOCOL,
            f"Content-Length {length} does not match Content-Range {content_range!r}",
        )
        return Verdict(RESTART, 206, error=error)
    changed = _changed(transfer.job.validator, head)
    if changed is not None:
        return Verdict(RESTART, 206, error=changed)
    total = content_range_total(content_range)
    known = transfer.job.total
    if known is not None and (
        total != known if total is not None else transfer.end is None and end != known
    ):
        # Earlier in this run the file had another length: these bytes are
        # of another version, even under the same validator.
        said = "an unknown" if total is None else str(total)
        error = TransferError(
            ErrorCode.PROTOCOL,
            f"the 206 is of a file of {said} length, not of the {known} bytes announced before",
        )
        return Verdict(RESTART, 206, error=error)
    too_large = _too_large(end, options)
    if too_large is not None:
        return Verdict(FAIL, 206, error=too_large)
    wrong_size = _not_the_size(transfer, end) if transfer.end is None else None
    if wrong_size is not None:
        return Verdict(FAIL, 206, error=wrong_size)
    return Verdict(
        ACCEPT, 206, start=transfer.start, end=end, total=known if total is None else total
    )


def _whole_entity(content_range: bytes | None) -> bool:
    """Does ``Content-Range`` say the body is the whole entity, from byte 0 to its
    stated (not ``*``) length?"""
    return content_range_ok(content_range, 0) and not (content_range or b"").rstrip().endswith(
        b"/*"
    )


def _changed(validator: str | None, head: ResponseHead) -> TransferError | None:
    """A 206 from another version of the file than our part's: a server that ignores
    ``If-Range`` sends the rest of what it has now, and the two would be spliced.

    The 206 must show the validator we sent: one without it (RFC 9110 15.3.7
    says a 206 carries the ETag a 200 would) cannot be told from another
    version's, so it is not spliced on either."""
    if validator is None or _shown(validator, head) == validator:
        return None
    name = _validator_field(validator)
    now = head.get(name)
    shown = "none" if now is None else repr(now)
    return TransferError(
        ErrorCode.PROTOCOL,
        f"the 206 is not of the same file ({name.decode()} {validator!r} -> {shown})",
    )


def resume_validator(head: ResponseHead) -> str | None:
    """What ``If-Range`` may send to continue this body later: a strong ETag, else
    a Last-Modified that is a strong validator (RFC 9110 8.8.2.2: at least a
    second before the response's Date; a file changed within that second keeps
    its date).  None when the server says it takes no ranges (``Accept-Ranges:
    none``): a part kept of its body could only be fetched again from zero, and
    the failure said "run again to resume"."""
    ranges = head.get(b"accept-ranges")
    if ranges is not None and ranges.strip().lower() == b"none":
        return None
    etag = head.get(b"etag")
    if etag is not None and etag.startswith(b'"'):  # strong, and quoted: an ETag
        return etag.decode("latin-1")
    modified, date = head.get(b"last-modified"), head.get(b"date")
    if modified is None or date is None:
        return None
    modified_at, date_at = parse_http_date(modified), parse_http_date(date)
    if modified_at is None or date_at is None:
        return None  # a date we cannot read proves nothing
    try:
        strong = (date_at - modified_at).total_seconds() >= 1.0
    except TypeError:
        return None  # one with a time zone, one without: nothing to compare
    return modified.decode("latin-1") if strong else None


def _not_the_size(transfer: Transfer, total: int | None) -> TransferError | None:
    """The file's announced length is not the input's ``size``: fail at the head,
    not after downloading all of it (a 64 MiB body for a row that says 1000)."""
    size = transfer.job.row.size
    if size is None or total is None or total == size:
        return None
    return TransferError(
        ErrorCode.SIZE_MISMATCH, f"the server announces {total} bytes, the input says {size}"
    )


def _too_large(total: int | None, options: Options) -> TransferError | None:
    limit = options.max_size
    if limit is None or total is None or total <= limit:
        return None
    return TransferError(
        ErrorCode.TOO_LARGE, f"the file has {total} bytes, over --max-size {limit}"
    )


def http_error(status: int, proxy: Proxy | None = None) -> TransferError:
    """``http_<status>`` for a final status that is not a success; a 407 names the proxy."""
    if status == 407 and proxy is not None:
        hint = proxy_auth_hint(proxy)
        return TransferError(http_code(407), f"HTTP 407 from proxy {proxy}{hint}")
    return TransferError(http_code(status), f"HTTP {status}")
