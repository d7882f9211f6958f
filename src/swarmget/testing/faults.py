"""``fault=`` behaviours: each breaks exactly one thing about a file response.

Each fault answers with the same head and body window a normal response
would (ranges included) and then misbehaves; ``L`` below is that window's
length.  A fault returns whether the connection stays open for another
request.

=============  ==============================================================
truncate       Content-Length: L, then L//2 body bytes, then FIN
reset          Content-Length: L, L//2 body bytes, wait (<= 2 s) until the peer
               has acknowledged them, then RST (SO_LINGER 0): ECONNRESET
stall          Content-Length: L and L//2 body bytes, then silence until the
               client goes away or the server stops
stall_headers  read the request, send nothing, same silence
drip           the whole normal response, one byte per drip_interval seconds
huge_headers   72 extra ``X-Pad-NN`` fields of 5000 bytes each: a head > 300 KiB
many_headers   a head of exactly 1500 header fields (valid otherwise)
two_cl         ``Content-Length: L`` and ``Content-Length: L+1``, L bytes, FIN
cl_and_chunked Content-Length: L and Transfer-Encoding: chunked, a chunked body, FIN (read: chunked)
bad_status     status line ``HTTP/1.1 2x0 \\xffgarbage``, then a normal head and body, FIN
neg_cl         ``Content-Length: -1``, L bytes, FIN
nul_header     ``X-Bad: a\\x00b`` in an otherwise normal response, FIN
bare_cr        ``X-Bad: a\\rb`` in an otherwise normal response, FIN
endless_1xx    ``HTTP/1.1 100 Continue`` every 10 ms, never a final response
chunk_cut      chunked, every data chunk but the last, no last-chunk, FIN
extra_bytes    a normal response followed by ``GARBAGE AFTER RESPONSE\\r\\n``
               (the connection stays open)
no_keepalive   a normal response with ``Connection: close``, then FIN
silent_reused  a normal response to a connection's first request; to a later
               one, nothing: the connection stays open and silent (keep-alive
               broken by the server, or by a box on the way, without a close)
=============  ==============================================================
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from swarmget.testing.content import body_view
from swarmget.testing.request import Request
from swarmget.testing.responses import FileHead, build_head, file_head, send_chunked, send_pieces

if TYPE_CHECKING:
    from swarmget.testing.connection import ServerConnection
    from swarmget.testing.files import FileOptions

Fault = Callable[["ServerConnection", Request, str, "FileOptions"], Awaitable[bool]]

HUGE_PAD_FIELDS = 72
HUGE_PAD_BYTES = 5000
MANY_FIELDS = 1500
BAD_STATUS_LINE = b"HTTP/1.1 2x0 \xffgarbage"
GARBAGE = b"GARBAGE AFTER RESPONSE\r\n"


def _window(request: Request, name: str, opts: FileOptions) -> FileHead:
    return file_head(request, name, opts.size, opts.norange)


def _cl_head(
    request: Request, fh: FileHead, extra: list[str] | None = None, *, keep: bool = True
) -> bytes:
    headers = [*fh.headers, *(extra or []), f"Content-Length: {fh.length}"]
    return build_head(fh.status, headers, request, keep and request.keep_alive)


async def _forever() -> None:
    await asyncio.get_running_loop().create_future()  # cancelled on EOF or stop


async def _truncate(conn: ServerConnection, req: Request, name: str, opts: FileOptions) -> bool:
    fh = _window(req, name, opts)
    await send_pieces(conn, name, fh.start, fh.start + fh.length // 2, head=_cl_head(req, fh))
    return False


async def _reset(conn: ServerConnection, req: Request, name: str, opts: FileOptions) -> bool:
    await _truncate(conn, req, name, opts)
    await conn.reset()
    return False


async def _stall(conn: ServerConnection, req: Request, name: str, opts: FileOptions) -> bool:
    await _truncate(conn, req, name, opts)
    await _forever()
    return False


async def _stall_headers(
    conn: ServerConnection, req: Request, name: str, opts: FileOptions
) -> bool:
    await _forever()
    return False


async def _drip(conn: ServerConnection, req: Request, name: str, opts: FileOptions) -> bool:
    fh = _window(req, name, opts)
    data = memoryview(_cl_head(req, fh) + body_view(name, fh.start, fh.stop))
    for i in range(len(data)):
        conn.write(data[i : i + 1])
        await asyncio.sleep(opts.drip_interval)
    return req.keep_alive


async def _with_headers(
    conn: ServerConnection, req: Request, name: str, opts: FileOptions, extra: list[str]
) -> bool:
    fh = _window(req, name, opts)
    await send_pieces(conn, name, fh.start, fh.stop, head=_cl_head(req, fh, extra))
    return req.keep_alive


async def _huge_headers(conn: ServerConnection, req: Request, name: str, opts: FileOptions) -> bool:
    pad = "a" * HUGE_PAD_BYTES
    extra = [f"X-Pad-{i:02d}: {pad}" for i in range(HUGE_PAD_FIELDS)]
    return await _with_headers(conn, req, name, opts, extra)


async def _many_headers(conn: ServerConnection, req: Request, name: str, opts: FileOptions) -> bool:
    fh = _window(req, name, opts)
    # Count what a normal head would carry, so the total is exactly MANY_FIELDS.
    normal = len(fh.headers) + 1 + (0 if req.keep_alive and req.version != "HTTP/1.0" else 1)
    extra = [f"X-Field-{i:04d}: {i}" for i in range(MANY_FIELDS - normal)]
    return await _with_headers(conn, req, name, opts, extra)


async def _malformed(
    conn: ServerConnection, req: Request, name: str, opts: FileOptions, head: bytes
) -> bool:
    fh = _window(req, name, opts)
    await send_pieces(conn, name, fh.start, fh.stop, head=head)
    return False


async def _two_cl(conn: ServerConnection, req: Request, name: str, opts: FileOptions) -> bool:
    fh = _window(req, name, opts)
    lengths = [f"Content-Length: {fh.length}", f"Content-Length: {fh.length + 1}"]
    head = build_head(fh.status, [*fh.headers, *lengths], req, req.keep_alive)
    return await _malformed(conn, req, name, opts, head)


async def _neg_cl(conn: ServerConnection, req: Request, name: str, opts: FileOptions) -> bool:
    fh = _window(req, name, opts)
    head = build_head(fh.status, [*fh.headers, "Content-Length: -1"], req, req.keep_alive)
    return await _malformed(conn, req, name, opts, head)


async def _bad_status(conn: ServerConnection, req: Request, name: str, opts: FileOptions) -> bool:
    fh = _window(req, name, opts)
    normal = _cl_head(req, fh)
    head = BAD_STATUS_LINE + normal[normal.index(b"\r\n") :]
    return await _malformed(conn, req, name, opts, head)


async def _nul_header(conn: ServerConnection, req: Request, name: str, opts: FileOptions) -> bool:
    head = _cl_head(req, _window(req, name, opts), ["X-Bad: a\x00b"])
    return await _malformed(conn, req, name, opts, head)


async def _bare_cr(conn: ServerConnection, req: Request, name: str, opts: FileOptions) -> bool:
    head = _cl_head(req, _window(req, name, opts), ["X-Bad: a\rb"])
    return await _malformed(conn, req, name, opts, head)


async def _cl_and_chunked(
    conn: ServerConnection, req: Request, name: str, opts: FileOptions
) -> bool:
    fh = _window(req, name, opts)
    conn.write(_cl_head(req, fh, ["Transfer-Encoding: chunked"]))
    await send_chunked(conn, name, fh.start, fh.stop, opts.chunk)
    return False


async def _chunk_cut(conn: ServerConnection, req: Request, name: str, opts: FileOptions) -> bool:
    fh = _window(req, name, opts)
    headers = [*fh.headers, "Transfer-Encoding: chunked"]
    conn.write(build_head(fh.status, headers, req, req.keep_alive))
    # At least two data chunks, so that cutting the last still sends some body.
    chunk = min(opts.chunk, max(1, (fh.length + 1) // 2))
    await send_chunked(conn, name, fh.start, fh.stop, chunk, cut=True)
    return False


async def _endless_1xx(conn: ServerConnection, req: Request, name: str, opts: FileOptions) -> bool:
    while True:
        conn.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await conn.drain()
        await asyncio.sleep(0.01)


async def _extra_bytes(conn: ServerConnection, req: Request, name: str, opts: FileOptions) -> bool:
    keep = await _with_headers(conn, req, name, opts, [])
    conn.write(GARBAGE)
    return keep


async def _no_keepalive(conn: ServerConnection, req: Request, name: str, opts: FileOptions) -> bool:
    fh = _window(req, name, opts)
    await send_pieces(conn, name, fh.start, fh.stop, head=_cl_head(req, fh, keep=False))
    return False


async def _silent_reused(
    conn: ServerConnection, req: Request, name: str, opts: FileOptions
) -> bool:
    if conn.served > 1:
        return await _stall_headers(conn, req, name, opts)
    return await _with_headers(conn, req, name, opts, [])


_FAULTS: dict[str, Fault] = {
    "truncate": _truncate,
    "reset": _reset,
    "stall": _stall,
    "stall_headers": _stall_headers,
    "drip": _drip,
    "huge_headers": _huge_headers,
    "many_headers": _many_headers,
    "two_cl": _two_cl,
    "cl_and_chunked": _cl_and_chunked,
    "bad_status": _bad_status,
    "neg_cl": _neg_cl,
    "nul_header": _nul_header,
    "bare_cr": _bare_cr,
    "endless_1xx": _endless_1xx,
    "chunk_cut": _chunk_cut,
    "extra_bytes": _extra_bytes,
    "no_keepalive": _no_keepalive,
    "silent_reused": _silent_reused,
}
FAULTS = frozenset(_FAULTS)
# Faults that never finish by themselves: end of input from the client ends them.
ENDLESS = frozenset({"stall", "stall_headers", "drip", "endless_1xx", "silent_reused"})


async def run_fault(
    fault: str, conn: ServerConnection, req: Request, name: str, opts: FileOptions
) -> bool:
    return await _FAULTS[fault](conn, req, name, opts)
