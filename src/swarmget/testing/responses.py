"""Building blocks of a file response: status and headers, ranges, body writers.

Shared by the well-behaved path (``files.py``) and the faults (``faults.py``),
so that a fault differs from a normal response only in the one thing it breaks.
"""

from __future__ import annotations

import http
from dataclasses import dataclass
from typing import TYPE_CHECKING

from swarmget.testing.content import BLOCK_SIZE, LAST_MODIFIED, body_pieces, body_view, etag
from swarmget.testing.request import Request

if TYPE_CHECKING:
    from swarmget.testing.connection import ServerConnection


def reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def connection_header(request: Request, keep_alive: bool) -> list[str]:
    if not keep_alive:
        return ["Connection: close"]
    if request.version == "HTTP/1.0":
        return ["Connection: keep-alive"]
    return []


def build_head(status: int, headers: list[str], request: Request, keep_alive: bool) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason(status)}", *headers]
    lines += connection_header(request, keep_alive)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def short_response(status: int, request: Request, keep_alive: bool, extra: list[str]) -> bytes:
    """A complete response with a one-line text body (none where HTTP forbids one)."""
    if status < 200 or status in (204, 304):
        return build_head(status, extra, request, keep_alive)
    body = f"{status} {reason(status)}\n".encode()
    headers = [*extra, "Content-Type: text/plain", f"Content-Length: {len(body)}"]
    head = build_head(status, headers, request, keep_alive)
    return head if request.method == "HEAD" else head + body


@dataclass(frozen=True, slots=True)
class FileHead:
    """What a file request resolves to: status, validator headers and body window."""

    status: int  # 200, 206 or 416
    headers: list[str]  # everything but framing and Connection
    start: int
    stop: int

    @property
    def length(self) -> int:
        return self.stop - self.start


def file_head(request: Request, name: str, size: int, norange: int) -> FileHead:
    """Resolve Range / If-Range for file ``name`` of ``size`` bytes (``norange``:
    files.FileOptions)."""
    tag = etag(name, size)
    headers = [
        "Content-Type: application/octet-stream",
        f"ETag: {tag}",
        f"Last-Modified: {LAST_MODIFIED}",
        "Accept-Ranges: none" if norange == 1 else "Accept-Ranges: bytes",
    ]
    spec = request.headers.get("range")
    if norange or spec is None:
        return FileHead(200, headers, 0, size)
    if_range = request.headers.get("if-range")
    if if_range is not None and if_range not in (tag, LAST_MODIFIED):
        return FileHead(200, headers, 0, size)  # the client's copy is stale: send it all
    window = parse_range(spec, size)
    if window is None:
        return FileHead(200, headers, 0, size)  # unparseable or multi-range: ignore it
    start, stop = window
    if start >= stop:
        return FileHead(416, [*headers, f"Content-Range: bytes */{size}"], 0, 0)
    return FileHead(206, [*headers, f"Content-Range: bytes {start}-{stop - 1}/{size}"], start, stop)


def parse_range(spec: str, size: int) -> tuple[int, int] | None:
    """``bytes=a-``, ``bytes=a-b`` or ``bytes=-n`` as [start, stop); empty = unsatisfiable."""
    unit, _, ranges = spec.partition("=")
    if unit.strip().lower() != "bytes" or "," in ranges:
        return None
    first, dash, last = ranges.strip().partition("-")
    if not dash or not (first.isdigit() or last.isdigit()):
        return None
    if not first:  # suffix: the last n bytes
        if not last.isdigit():
            return None
        n = int(last)
        return (max(size - n, 0), size) if n else (0, 0)
    if not first.isdigit() or (last and not last.isdigit()):
        return None
    start = int(first)
    stop = min(int(last) + 1, size) if last else size
    if last and stop <= start and start < size:
        return None  # a-b with b < a is invalid, not unsatisfiable
    return (start, stop) if start < size else (0, 0)


async def send_pieces(
    conn: ServerConnection, name: str, start: int, stop: int, *, head: bytes = b""
) -> None:
    """Write ``head`` then bytes [start, stop) of file ``name``, honouring flow control.

    The head goes out in the same ``writev`` as the first piece: one syscall,
    and a client sees head and body together as it would from a real server.
    """
    for piece in body_pieces(name, start, stop):
        if head:
            conn.write(head, piece)
            head = b""
        else:
            conn.write(piece)
        await conn.drain()
    if head:
        conn.write(head)


async def send_chunked(
    conn: ServerConnection, name: str, start: int, stop: int, chunk: int, *, cut: bool = False
) -> None:
    """Write bytes [start, stop) as chunks of ``chunk`` bytes, then the last-chunk.

    With ``cut``, leave out the final data chunk and the last-chunk: a chunked
    body that ends before it should.
    """
    chunk = max(1, min(chunk, BLOCK_SIZE))
    pos = start
    while pos < stop:
        n = min(chunk, stop - pos)
        if cut and pos + n >= stop:
            return
        conn.write(b"%x\r\n" % n, body_view(name, pos, pos + n), b"\r\n")
        pos += n
        await conn.drain()
    if not cut:
        conn.write(b"0\r\n\r\n")
