"""``/files/<name>?...``: synthetic files whose behaviour is spelled in the query.

Grammar (every option is optional and they combine; unknown options are a 400,
so a typo in a test fails loudly instead of silently testing nothing)::

    size=N            body length in bytes (default 51200)
    latency=S         wait S seconds before answering
    chunked=1         Transfer-Encoding: chunked, chunk=N bytes per chunk (default 16384)
    close=1           no Content-Length: the body ends when the server closes
    status=N          answer status N with a short text body; retry_after=X adds Retry-After: X
    redirect=N        answer 30N (N in 1,2,3,7,8; or the full code) with Location: <to>,
                      where to=URL defaults to this same URL without redirect/to
    norange=1         ignore Range (and say Accept-Ranges: none); norange=2: ignore it
                      while saying Accept-Ranges: bytes (a proxy on the way drops Range)
    fault=F           one of faults.FAULTS; drip_interval=S for fault=drip (default 0.5)
    times=K           fault/status/redirect apply only to the first K requests for this
                      exact URL; later ones are answered normally (for retry tests)
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from swarmget.testing.content import BLOCK_SIZE, body_view
from swarmget.testing.faults import ENDLESS, FAULTS, run_fault
from swarmget.testing.request import Request
from swarmget.testing.responses import (
    build_head,
    file_head,
    send_chunked,
    send_pieces,
    short_response,
)

if TYPE_CHECKING:
    from swarmget.testing.connection import ServerConnection

PREFIX = "/files/"


@dataclasses.dataclass(frozen=True, slots=True)
class FileOptions:
    size: int
    latency: float = 0.0
    chunked: bool = False
    chunk: int = 16384
    close: bool = False
    status: int | None = None
    retry_after: str | None = None
    fault: str | None = None
    drip_interval: float = 0.5
    redirect: int | None = None
    to: str | None = None
    norange: int = 0  # 1: Range ignored, "Accept-Ranges: none"; 2: ignored, "bytes"
    times: int | None = None

    @property
    def plain(self) -> bool:
        """True when nothing but the body (maybe a range, maybe a delay) is asked for."""
        return not (self.chunked or self.close or self.fault or self.status or self.redirect)


def _flag(value: str) -> bool:
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a flag: {value!r}")


def _norange(value: str) -> int:
    return 2 if value == "2" else int(_flag(value))


def _count(value: str) -> int:
    if not value.isdigit():
        raise ValueError(f"not a count: {value!r}")
    return int(value)


def _seconds(value: str) -> float:
    seconds = float(value)
    if not 0 <= seconds < 1e6:
        raise ValueError(f"not a duration: {value!r}")
    return seconds


def _status(value: str) -> int:
    status = _count(value)
    if not 100 <= status <= 999:
        raise ValueError(f"not a status: {value!r}")
    return status


def _redirect(value: str) -> int:
    code = _count(value)
    code = 300 + code if code < 10 else code
    if not 300 <= code <= 399:
        raise ValueError(f"not a redirect: {value!r}")
    return code


def _fault(value: str) -> str:
    if value not in FAULTS:
        raise ValueError(f"unknown fault {value!r}; known: {', '.join(sorted(FAULTS))}")
    return value


def _positive(value: str) -> int:
    n = _count(value)
    if n == 0:
        raise ValueError("chunk must be > 0")
    return n


_PARSERS: dict[str, Callable[[str], Any]] = {
    "size": _count,
    "latency": _seconds,
    "chunked": _flag,
    "chunk": _positive,
    "close": _flag,
    "status": _status,
    "retry_after": str,
    "fault": _fault,
    "drip_interval": _seconds,
    "redirect": _redirect,
    "to": str,
    "norange": _norange,
    "times": _count,
}


def parse_options(query: str, default_size: int, default_latency: float = 0.0) -> FileOptions:
    """Parse a ``/files`` query string; raises ValueError naming the bad option."""
    values: dict[str, Any] = {"size": default_size, "latency": default_latency}
    for part in query.split("&"):
        if not part:
            continue
        key, _, raw = part.partition("=")
        parser = _PARSERS.get(key)
        if parser is None:
            raise ValueError(f"unknown option {key!r}")
        try:
            values[key] = parser(unquote(raw))
        except ValueError as exc:
            raise ValueError(f"bad {key}: {exc}") from None
    return FileOptions(**values)


def respond_file(conn: ServerConnection, request: Request) -> bool | None:
    """Answer a /files request: keep-alive when written at once, or None if a task will."""
    name = unquote(request.path[len(PREFIX) :])
    state = conn.state
    try:
        opts = parse_options(request.query, state.default_size, state.latency)
    except ValueError as exc:
        conn.write(short_response(400, request, request.keep_alive, [f"X-Error: {exc}"]))
        return request.keep_alive
    if opts.times is not None and (opts.fault or opts.status or opts.redirect):
        state.hits[request.target] += 1
        if state.hits[request.target] > opts.times:
            opts = dataclasses.replace(opts, fault=None, status=None, redirect=None)
    if opts.plain and opts.size <= BLOCK_SIZE:
        if not opts.latency:
            return _write_plain(conn, request, name, opts)
        conn.answer_later(opts.latency, partial(_write_plain, conn, request, name, opts))
        return None
    conn.start(respond_later(conn, request, name, opts), ends_on_eof=opts.fault in ENDLESS)
    return None


def _write_plain(conn: ServerConnection, request: Request, name: str, opts: FileOptions) -> bool:
    """The hot path: one head, one body slice, one writev, no task."""
    fh = file_head(request, name, opts.size, opts.norange)
    keep = request.keep_alive
    if fh.status == 416:
        conn.write(short_response(416, request, keep, fh.headers[-1:]))
        return keep
    head = build_head(fh.status, [*fh.headers, f"Content-Length: {fh.length}"], request, keep)
    if request.method == "HEAD":
        conn.write(head)
    else:
        conn.write(head, body_view(name, fh.start, fh.stop))
    return keep


async def respond_later(
    conn: ServerConnection, request: Request, name: str, opts: FileOptions
) -> bool:
    if opts.latency:
        await asyncio.sleep(opts.latency)
    keep = request.keep_alive
    if opts.redirect:
        location = opts.to if opts.to is not None else _same_url_without_redirect(request)
        conn.write(short_response(opts.redirect, request, keep, [f"Location: {location}"]))
        return keep
    if opts.status:
        extra = [] if opts.retry_after is None else [f"Retry-After: {opts.retry_after}"]
        conn.write(short_response(opts.status, request, keep, extra))
        return keep
    if opts.fault:
        return await run_fault(opts.fault, conn, request, name, opts)
    return await send_file(conn, request, name, opts)


async def send_file(
    conn: ServerConnection, request: Request, name: str, opts: FileOptions, *, close: bool = False
) -> bool:
    """A well-formed response with the framing ``opts`` asks for; returns keep-alive."""
    fh = file_head(request, name, opts.size, opts.norange)
    keep = request.keep_alive and not opts.close and not close
    if fh.status == 416:
        conn.write(short_response(416, request, keep, fh.headers[-1:]))
        return keep
    headers = list(fh.headers)
    if opts.chunked:
        headers.append("Transfer-Encoding: chunked")
    elif not opts.close:
        headers.append(f"Content-Length: {fh.length}")
    head = build_head(fh.status, headers, request, keep)
    if request.method == "HEAD":
        conn.write(head)
    elif opts.chunked:
        conn.write(head)
        await send_chunked(conn, name, fh.start, fh.stop, opts.chunk)
    else:
        await send_pieces(conn, name, fh.start, fh.stop, head=head)
    return keep


def _same_url_without_redirect(request: Request) -> str:
    kept = [
        p for p in request.query.split("&") if p and p.partition("=")[0] not in ("redirect", "to")
    ]
    path = quote(unquote(request.path), safe="/")
    return path + ("?" + "&".join(kept) if kept else "")
