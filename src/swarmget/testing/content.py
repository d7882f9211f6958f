"""Deterministic file content, cheap to serve and cheap to check.

Every file the test server serves is a window onto one 1 MiB pseudo-random
block, read cyclically from an offset derived from ``zlib.crc32(name)``.  The
block is generated once from a fixed seed, so a test (or the demo) can compute
the exact bytes it should have received without asking the server, and the
server never builds a body per request: it hands out ``memoryview`` slices of
a doubled copy of the block (block + block), so any window of up to 1 MiB is a
single contiguous slice.  CRC32 rather than ``hash()`` because Python salts
string hashes per process, and the server often runs in another process.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from functools import cache

BLOCK_SIZE = 1 << 20
DEFAULT_SIZE = 51200
# A fixed date: resume tests compare it with If-Range, so it must never change.
LAST_MODIFIED = "Wed, 21 Oct 2015 07:28:00 GMT"
_SEED = 0x5EED_F11E


@cache
def _doubled_block() -> memoryview:
    block = random.Random(_SEED).randbytes(BLOCK_SIZE)
    return memoryview(block + block)


def _offset(name: str) -> int:
    return zlib.crc32(name.encode("utf-8")) % BLOCK_SIZE


def body_pieces(name: str, start: int, stop: int) -> Iterator[memoryview]:
    """Yield bytes ``[start, stop)`` of file ``name`` as slices of at most 1 MiB, copying nothing.

    A file's bytes do not depend on its size: ``size`` only says where it ends.
    """
    doubled = _doubled_block()
    pos = (_offset(name) + start) % BLOCK_SIZE
    left = stop - start
    while left > 0:
        n = min(left, BLOCK_SIZE)
        yield doubled[pos : pos + n]
        left -= n  # pos + BLOCK_SIZE wraps to pos, so pos stays where it was


def body_view(name: str, start: int, stop: int) -> memoryview:
    """Bytes ``[start, stop)`` of file ``name`` as one slice; at most 1 MiB."""
    if stop - start > BLOCK_SIZE:
        raise ValueError("body_view covers at most BLOCK_SIZE bytes")
    pos = (_offset(name) + start) % BLOCK_SIZE
    return _doubled_block()[pos : pos + stop - start]


def expected_body(name: str, size: int) -> bytes:
    """The exact body the test server sends for ``/files/<name>?size=<size>``.

    ``name`` is the percent-decoded path after ``/files/`` (it may contain ``/``).
    """
    if size < 0:
        raise ValueError("size must be >= 0")
    return b"".join(body_pieces(name, 0, size))


def etag(name: str, size: int) -> str:
    """The strong ETag (with its quotes) the server sends for that file."""
    return f'"{zlib.crc32(f"{name}:{size}".encode()):08x}"'
