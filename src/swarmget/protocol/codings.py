"""Undoing the transfer codings a response body may carry besides chunked.

Transfer codings are framing (RFC 9112 section 6.1): a file saved with one still
applied would be a different file.  So a ``Transfer-Encoding`` is either undone
here or the response fails: ``gzip`` (and its alias ``x-gzip``) and ``deflate``
are undone, ``identity`` means nothing, anything else is a
:class:`ProtocolError`.  (``Content-Encoding`` is not framing: we ask for
``identity`` and save whatever comes, as curl does without ``--compressed``.)

:func:`plan_codings` reads the list of codings the way curl does: ``chunked`` must be
the last one (repeating it changes nothing), and at most :data:`MAX_CODINGS`
codings in all (a chain of a hundred gzips is an attack, not a file).

:class:`Decoder` inflates with :mod:`zlib` incrementally and never produces more
than :data:`PIECE` bytes per step, so one small compressed segment cannot make a
gigabyte in memory: each piece goes to the sink (which checks ``--max-size``)
before the next is made, and a ``limit`` stops the body outright once the
decoded size passes it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Final

from swarmget.errors import ErrorCode, ProtocolError, TransferError

MAX_CODINGS: Final = 5  # curl's MAX_ENCODE_STACK, chunked included
PIECE: Final = 64 * 1024  # most decoded bytes made per inflate step
_GZIP: Final = frozenset({b"gzip", b"x-gzip"})
_KNOWN: Final = frozenset({b"gzip", b"x-gzip", b"deflate"})

Sink = Callable[[bytes], None]


def plan_codings(codings: list[bytes]) -> tuple[bool, list[bytes]]:
    """``(chunked, codings to undo, in the order they were applied)`` for a TE list."""
    codings = [coding for coding in codings if coding != b"identity"]
    chunked = bool(codings) and codings[-1] == b"chunked"
    while codings and codings[-1] == b"chunked":
        codings.pop()
    if b"chunked" in codings:
        raise ProtocolError("Transfer-Encoding: chunked is not the last coding")
    if len(codings) + chunked > MAX_CODINGS:
        raise ProtocolError(f"more than {MAX_CODINGS} transfer codings")
    for coding in codings:
        if coding not in _KNOWN:
            raise ProtocolError(f"unknown Transfer-Encoding {coding[:40]!r}")
    return chunked, codings


class _Inflater:
    """One gzip or deflate stream (deflate: zlib-wrapped, or raw as some servers send)."""

    __slots__ = ("_obj", "_start", "done", "fed", "name")

    def __init__(self, name: bytes) -> None:
        self.name = name.decode("latin-1")
        self._obj: zlib._Decompress | None = None
        if name in _GZIP:
            self._obj = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._start = b""  # deflate: the first byte, until the second tells zlib from raw
        self.done = False
        self.fed = False  # any byte came: an empty body is no stream at all (see finish)

    def feed(self, data: bytes, emit: Sink) -> None:
        if data:
            self.fed = True
        obj = self._obj
        if obj is None:
            data = self._start + data
            if len(data) < 2:
                self._start = data
                return
            obj = self._obj = zlib.decompressobj(_deflate_wbits(data))
        while True:
            if self.done:
                if data:
                    raise ProtocolError(f"data after the end of the {self.name} stream")
                return
            try:
                out = obj.decompress(data, PIECE)
            except zlib.error as exc:
                raise ProtocolError(f"bad {self.name} transfer coding: {exc}") from None
            if out:
                emit(out)
            self.done = obj.eof
            data = obj.unused_data if self.done else obj.unconsumed_tail
            if not data and len(out) < PIECE:
                return  # all input taken and zlib holds no more output for it


def _deflate_wbits(start: bytes) -> int:
    """zlib's wbits for a deflate body starting with ``start``: zlib-wrapped or raw."""
    header = start[0] << 8 | start[1]
    if start[0] & 0x0F == 8 and header % 31 == 0:
        return zlib.MAX_WBITS
    return -zlib.MAX_WBITS


class Decoder:
    """Undoes ``codings`` (in the order they were applied) and gives the result to ``sink``."""

    __slots__ = ("_limit", "_sink", "_stages", "decoded")

    def __init__(self, codings: list[bytes], sink: Sink, limit: int | None = None) -> None:
        # The coding applied last is undone first.
        self._stages = [_Inflater(coding) for coding in reversed(codings)]
        self._sink = sink
        self._limit = limit
        self.decoded = 0

    def write(self, data: memoryview | bytes) -> None:
        self._feed(0, bytes(data))

    def _feed(self, index: int, data: bytes) -> None:
        if index == len(self._stages):
            self._deliver(data)
        else:
            self._stages[index].feed(data, lambda out: self._feed(index + 1, out))

    def _deliver(self, data: bytes) -> None:
        self.decoded += len(data)
        limit = self._limit
        if limit is not None and self.decoded > limit:
            raise TransferError(ErrorCode.TOO_LARGE, f"decoded body exceeds {limit} bytes")
        self._sink(data)

    @property
    def complete(self) -> bool:
        """Has every coding's stream ended (the gzip trailer's CRC and length
        checked)?  Then the body is whole, however the connection ends."""
        return all(stage.fed and stage.done for stage in self._stages)

    def finish(self, code: str = ErrorCode.PROTOCOL) -> None:
        """The body has ended: every stream must have ended with it (else ``code``)."""
        for stage in self._stages:
            # An empty body under a coding is an empty body (curl saves it); one
            # that began a stream must end it.
            if stage.fed and not stage.done:
                raise TransferError(code, f"the {stage.name} transfer coding ends early")
