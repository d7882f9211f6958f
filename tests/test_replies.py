"""Replies real servers send that break RFC 9112's rules for senders (issue 12).

Each reply in :data:`REPLIES` is read twice: by the sans-I/O parser alone, in
several splittings, and end to end by ``swarmget.download`` from the scripted
test server.  Both must give the expected outcome: the saved bytes, or the
error code.  What a reply should give is what curl gives (see
``tests/test_curl_replies.py`` for curl's own test data); the few choices of
ours are said where they are made.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import swarmget
from swarmget.errors import ErrorCode, TransferError
from swarmget.protocol import ResponseHead, ResponseParser
from swarmget.testing import TestServer
from swarmget.testing.replies import replay

BODY = b"hello, world\n"
GZ = gzip.compress(BODY)
DEFLATE = zlib.compress(BODY)
RAW_DEFLATE = zlib.compress(BODY, wbits=-15)


def chunked(data: bytes, size: int = 5, end: bytes = b"\r\n") -> bytes:
    """``data`` in chunks of ``size`` with line ends ``end``, then the last chunk."""
    pieces = [data[i : i + size] for i in range(0, len(data), size)]
    framed = b"".join(b"%x%s%s%s" % (len(p), end, p, end) for p in pieces)
    return framed + b"0" + end + end


@dataclass(frozen=True)
class Reply:
    name: str
    raw: bytes
    expect: bytes | str  # the saved body, or the error code
    close: bool = False  # the server closes after the reply

    @property
    def path(self) -> str:
        return f"/replies/{self.name}"


def head(*fields: bytes, status: bytes = b"HTTP/1.1 200 OK", end: bytes = b"\r\n") -> bytes:
    """A head: the status line and ``fields``, each line ended by ``end``, then the empty line."""
    return b"".join(line + end for line in (status, *fields, b""))


CL = b"Content-Length: 13"
CHUNKED = head(b"Transfer-Encoding: chunked")
PROTOCOL, TRUNCATED = ErrorCode.PROTOCOL, ErrorCode.TRUNCATED


def coded(codings: bytes, body: bytes, *fields: bytes) -> bytes:
    return head(b"Transfer-Encoding: " + codings, *fields) + body


REPLIES = [
    # -- line ends: CRLF, bare LF, and the two mixed (RFC 9112 section 2.2) ----
    Reply("crlf", head(CL) + BODY, BODY),
    Reply("lf", head(CL, end=b"\n") + BODY, BODY),
    Reply("crlf-then-lf", b"HTTP/1.1 200 OK\r\n" + CL + b"\r\n\n" + BODY, BODY),
    Reply("lf-then-crlf", b"HTTP/1.1 200 OK\n" + CL + b"\n\r\n" + BODY, BODY),
    Reply("mixed-lines", b"HTTP/1.1 200 OK\r\nServer: x\n" + CL + b"\r\n\r\n" + BODY, BODY),
    # The head ends at the LF LF even though a CRLFCRLF follows in the body.
    Reply(
        "lf-head-crlf-body",
        head(b"Content-Length: 9", end=b"\n") + b"a\r\n\r\nbcd\n",
        b"a\r\n\r\nbcd\n",
    ),
    Reply("lf-http10-until-close", head(status=b"HTTP/1.0 200 OK", end=b"\n") + BODY, BODY, True),
    # CR CR LF: a Windows text-mode CGI's CRLF.  The head was never seen to end.
    Reply("cr-cr-lf", head(b"Server: cgi", CL, end=b"\r\r\n") + BODY, BODY),
    Reply(
        "cr-cr-cr-lf-chunked",
        head(b"Transfer-Encoding: chunked", end=b"\r\r\r\n") + chunked(BODY),
        BODY,
    ),
    # Empty lines before a status line (a server's stray line ends after an
    # earlier response or a 1xx), skipped as llhttp skips them (curl refuses
    # them).  Two or more were read only when the head came in one piece:
    # split, their LF LF was taken for the end of the head.
    Reply("empty-lines-before-status", b"\r\n\r\n\n" + head(CL) + BODY, BODY),
    Reply("lf-lines-before-status", b"\n\n" + head(CL) + BODY, BODY),
    Reply("lf-lines-before-lf-head", b"\n\n" + head(CL, end=b"\n") + BODY, BODY),
    Reply(
        "empty-lines-after-100",
        head(status=b"HTTP/1.1 100 Continue") + b"\r\n\r\n" + head(CL) + BODY,
        BODY,
    ),
    Reply("only-empty-lines", b"\r\n" * 3, ErrorCode.CONNECT, close=True),
    # -- obs-fold and whitespace lines (RFC 9112 sections 5.2 and 2.2) ---------
    Reply("obs-fold", head(b"X-A: a", b" b", b"\tc", CL) + BODY, BODY),
    Reply("folded-length", head(b"Content-Length:", b" 13") + BODY, BODY),
    Reply("space-after-status", head(b" X-Junk: y", CL) + BODY, BODY),
    # ... but not when the line ignored would frame the body (curl refuses both).
    Reply(
        "space-led-chunked", head(b" Transfer-Encoding: chunked") + chunked(BODY), PROTOCOL, True
    ),
    Reply("tab-led-gzip", head(b"\tTRANSFER-ENCODING : gzip") + GZ, PROTOCOL, True),
    Reply("space-led-length", head(b" Content-Length: 5") + BODY, PROTOCOL, True),
    # -- interim responses ------------------------------------------------------
    Reply("100", head(status=b"HTTP/1.1 100 Continue") + head(CL) + BODY, BODY),
    Reply(
        "102-lf-with-fields",
        head(b"X-A: b", status=b"HTTP/1.1 102 Processing", end=b"\n") + head(CL, end=b"\n") + BODY,
        BODY,
    ),
    Reply(
        "103-then-chunked",
        head(b"Link: </a.css>; rel=preload", status=b"HTTP/1.1 103 Early Hints")
        + CHUNKED
        + chunked(BODY),
        BODY,
    ),
    Reply("101", head(status=b"HTTP/1.1 101 Switching Protocols") + BODY, PROTOCOL),
    Reply(
        "101-upgrade",
        head(b"Upgrade: websocket", b"Connection: Upgrade", status=b"HTTP/1.1 101 Switching"),
        PROTOCOL,
    ),
    # -- Transfer-Encoding with Content-Length: chunked wins (RFC 9112 6.3) ---
    Reply("chunked-and-length", coded(b"chunked", chunked(BODY), b"Content-Length: 99"), BODY),
    # -- Content-Length repeated (RFC 9110 section 8.6) -------------------------
    Reply("length-list", head(b"Content-Length: 13, 13") + BODY, BODY),
    Reply("length-twice", head(CL, CL) + BODY, BODY),
    Reply("length-spellings", head(CL, b"content-length: 013") + BODY, BODY),
    Reply("length-conflict", head(CL, b"Content-Length: 14") + BODY, PROTOCOL),
    Reply("length-list-conflict", head(b"Content-Length: 13, 12") + BODY, PROTOCOL),
    Reply("length-not-a-number", head(b"Content-Length: 13, x") + BODY, PROTOCOL),
    # llhttp takes up to 2**64 - 1; past 2**63 - 1 it failed as `truncated` (retried).
    Reply("length-2-63", head(b"Content-Length: 9223372036854775808") + BODY, PROTOCOL),
    Reply("length-2-64-minus-1", head(b"Content-Length: 18446744073709551615") + BODY, PROTOCOL),
    # -- status lines ---------------------------------------------------------
    Reply("no-reason", head(CL, status=b"HTTP/1.1 200") + BODY, BODY),
    Reply("no-reason-space", head(CL, status=b"HTTP/1.1 200 ") + BODY, BODY),
    Reply("tabs", head(CL, status=b"HTTP/1.1\t200\tOK") + BODY, BODY),
    Reply("reason-spaces", head(CL, status=b"HTTP/1.1 200  All  OK ") + BODY, BODY),
    Reply("nul-in-reason", head(CL, status=b"HTTP/1.1 200 O\x00K") + BODY, PROTOCOL),
    Reply(
        "nul-in-interim-reason",
        head(status=b"HTTP/1.1 100 Con\x00tinue") + head(CL) + BODY,
        PROTOCOL,
    ),
    # curl 7.88 reads these (and so do we): blanks before the code, the name in
    # any case, HTTP/2 spelt out in an HTTP/1.1 reply.
    Reply("two-spaces-before-code", head(CL, status=b"HTTP/1.1  200 OK") + BODY, BODY),
    Reply("space-tab-before-code", head(CL, status=b"HTTP/1.1 \t200 OK") + BODY, BODY),
    Reply("lower-case-name", head(CL, status=b"http/1.1 200 OK") + BODY, BODY),
    Reply("mixed-case-name", head(CL, status=b"Http/1.1 200 OK") + BODY, BODY),
    Reply("http2-spelt-out", head(CL, status=b"HTTP/2 200") + BODY, BODY),
    Reply("http2.0-spelt-out", head(CL, status=b"HTTP/2.0 200 OK") + BODY, BODY),
    Reply("http2-until-close", head(status=b"HTTP/2 200 OK") + BODY, BODY, close=True),
    Reply("http3-spelt-out", head(CL, status=b"HTTP/3 200") + BODY, PROTOCOL),
    Reply("http2.1", head(CL, status=b"HTTP/2.1 200 OK") + BODY, PROTOCOL),
    Reply("lower-case-no-blank", head(CL, status=b"http/1.1200 OK") + BODY, PROTOCOL),
    Reply("four-digit-code", head(CL, status=b"HTTP/1.1 2000 OK") + BODY, PROTOCOL),
    # Was http_0 with no http_status in the record.
    Reply("status-000", head(CL, status=b"HTTP/1.1 000 Zero") + BODY, PROTOCOL),
    Reply("status-099", head(CL, status=b"HTTP/1.1 099 Low") + BODY, PROTOCOL),
    Reply("http10-until-close", head(status=b"HTTP/1.0 200 OK") + BODY, BODY, close=True),
    # llhttp reads these protocols too; not a reply to an HTTP/1.x request (curl agrees).
    Reply("rtsp", head(CL, status=b"RTSP/1.0 200 OK") + BODY, PROTOCOL),
    Reply("ice", head(CL, status=b"ICE/1.0 200 OK") + BODY, PROTOCOL),
    Reply("http09-status-line", head(CL, status=b"HTTP/0.9 200 OK") + BODY, PROTOCOL),
    # Not HTTP at all (an SSH banner, an HTTP/0.9 body): refused as such at
    # once, not a head cut short (`truncated`, retried).
    Reply("ssh-banner", b"SSH-2.0-OpenSSH_9.2p1\r\n", PROTOCOL, close=True),
    Reply("http09-body", b"<html>hello</html>\n", PROTOCOL, close=True),
    # Two Location fields that disagree are refused whatever their spelling.
    Reply(
        "locations-in-two-spellings",
        head(b"Location: /one", b"LocatioN: /two", CL, status=b"HTTP/1.1 200 OK") + BODY,
        PROTOCOL,
    ),
    # -- transfer codings other than chunked: undone, or the row fails --------
    Reply("gzip-chunked", coded(b"gzip, chunked", chunked(GZ, 7)), BODY),
    Reply("x-gzip-chunked", coded(b"x-gzip, chunked", chunked(GZ)), BODY),
    Reply(
        "deflate-chunked",
        head(b"Transfer-Encoding: deflate", b"Transfer-Encoding: chunked") + chunked(DEFLATE),
        BODY,
    ),
    Reply("raw-deflate-until-close", coded(b"deflate", RAW_DEFLATE), BODY, close=True),
    # Transfer-Encoding overrides Content-Length: the body runs to the close.
    Reply("gzip-ignores-length", coded(b"gzip", GZ, b"Content-Length: 3"), BODY, close=True),
    Reply("gzip-twice", coded(b"gzip, gzip, chunked", chunked(gzip.compress(GZ))), BODY),
    Reply("identity-and-length", coded(b"identity", BODY, CL), BODY),
    Reply("unknown-coding", coded(b"br, chunked", chunked(BODY)), PROTOCOL),
    # Two fields whose names differ in case only are two fields all the same:
    # the gzip was skipped, and the still-gzipped bytes saved as ok.
    Reply(
        "codings-in-two-spellings",
        head(b"TRANSFER-ENCODING: gzip", b"Transfer-Encoding: chunked") + chunked(GZ),
        BODY,
    ),
    Reply(
        "unknown-coding-in-another-spelling",
        head(b"transfer-encoding: br", b"Transfer-Encoding: chunked") + chunked(BODY),
        PROTOCOL,
    ),
    # A blank Transfer-Encoding is an empty list, as "," is: no coding (curl
    # reads these).  Beside a Content-Length, which frames it?  Refused.
    Reply("empty-coding", head(b"Transfer-Encoding:") + BODY, BODY, close=True),
    Reply("comma-coding", head(b"Transfer-Encoding: ,") + BODY, BODY, close=True),
    Reply("blank-coding", head(b"Transfer-Encoding: \t ") + BODY, BODY, close=True),
    Reply(
        "empty-coding-then-chunked",
        head(b"Transfer-Encoding:", b"Transfer-Encoding: chunked") + chunked(BODY),
        BODY,
    ),
    Reply(
        "empty-coding-and-length",
        head(b"Transfer-Encoding:", b"Content-Length: 5") + BODY,
        PROTOCOL,
        close=True,
    ),
    Reply("chunked-not-last", coded(b"chunked, gzip", chunked(GZ)), PROTOCOL),
    Reply("too-many-codings", coded(b"gzip, " * 5 + b"chunked", b"0\r\n\r\n"), PROTOCOL),
    Reply("bad-gzip", coded(b"gzip, chunked", chunked(b"not gzip at all")), PROTOCOL),
    Reply("gzip-empty-body", coded(b"gzip, chunked", b"0\r\n\r\n"), b""),
    Reply("gzip-cut-short", coded(b"gzip", GZ[:-6]), TRUNCATED, close=True),
    # -- chunk framing as curl reads it -----------------------------------------
    Reply("chunked-lf", CHUNKED + chunked(BODY, end=b"\n"), BODY),
    Reply("chunked-lf-after-data", CHUNKED + b"5\r\nhello\n0\r\n\n", b"hello"),
    Reply("chunk-extensions", CHUNKED + b"5 ;a=b\r\nhello\r\n0\r\n\r\n", b"hello"),
    Reply("chunk-trailer", CHUNKED + b"5\r\nhello\r\n0\r\nX-T: 1\nX-U: 2\r\n\r\n", b"hello"),
    Reply("chunk-size-junk", CHUNKED + b"5x\r\nhello\r\n0\r\n\r\n", PROTOCOL),
    Reply("chunk-size-17-digits", CHUNKED + b"1" * 17 + b"\r\n", PROTOCOL),
    Reply("chunk-trailer-nul", CHUNKED + b"0\r\nX: a\x00b\r\n\r\n", PROTOCOL),
    Reply("chunk-data-overrun", CHUNKED + b"3\r\nhello\r\n0\r\n\r\n", PROTOCOL),
    # Past the first chunk too, and whatever the head looked like: one reader.
    Reply("later-chunk-lf", CHUNKED + b"5\r\nhello\r\n6\n world\r\n0\n\r\n", b"hello world"),
    Reply(
        "later-chunk-extensions",
        CHUNKED + b'5\r\nhello\r\n6; a=b\r\n world\r\n1 ; a = b; c="x"\r\n!\r\n0;z\r\n\r\n',
        b"hello world!",
    ),
    Reply(
        "later-chunk-extensions-folded-head",
        head(b"X-A: a", b" b", b"Transfer-Encoding: chunked")
        + b"5\r\nhello\r\n6; a=b\r\n world\r\n0\r\n\r\n",
        b"hello world",
    ),
    Reply(
        "chunk-long-extension",
        CHUNKED + b"5;x=" + b"a" * 5000 + b"\r\nhello\r\n0\r\n\r\n",
        b"hello",
    ),
    Reply("chunk-size-20-digits", CHUNKED + b"0" * 15 + b"00005\r\nhello\r\n0\r\n\r\n", PROTOCOL),
    Reply(
        "chunk-size-20-digits-folded-head",
        head(b"X-A: a", b" b", b"Transfer-Encoding: chunked")
        + b"0" * 15
        + b"00005\r\nhello\r\n0\r\n\r\n",
        PROTOCOL,
    ),
    Reply("chunk-size-2-64", CHUNKED + b"10000000000000000\r\nhello\r\n", PROTOCOL),
    Reply("chunk-size-2-63", CHUNKED + b"8000000000000000\r\nhello\r\n", PROTOCOL),
    *(
        Reply(
            f"chunk-trailer-{name}",
            CHUNKED + b"5\r\nhello\r\n0\r\n" + field + b"\r\n\r\n",
            b"hello",
        )
        for name, field in [
            ("length", b"Content-Length: 99"),
            ("space-before-colon", b"X : 1"),
            ("folded", b"X: 1\r\n 2"),
            ("control", b"X: a\x01b"),
            ("utf8-name", "Xé: 1".encode()),
        ]
    ),
    # -- fields llhttp refuses and curl reads (RFC 9112 5.1, RFC 9110 5.5) ------
    # Whitespace before the colon: the field is ignored, as curl ignores it (the
    # body here runs to the close, not to the 5 bytes the field would say).
    Reply("space-before-colon", head(b"X-Foo : bar", b"Content-Length\t: 5") + BODY, BODY, True),
    Reply("controls-in-values", head(b"Set-Cookie: a\x7fb", b"X-E: \x1b[0m\x01", CL) + BODY, BODY),
    Reply(
        "control-in-location",
        head(b"Location: /a\x01b", CL, status=b"HTTP/1.1 302 Found") + BODY,
        PROTOCOL,
    ),
    Reply("nul-in-field-name", head(b"X-A\x00: 1", CL) + BODY, PROTOCOL),
    Reply("cr-in-field-name", head(b"Content-Length\r: 13", b"X: y", end=b"\n") + BODY, PROTOCOL),
    Reply("bad-field-name", head(b"X A: b", CL, end=b"\n") + BODY, BODY),
    Reply("field-names-not-tokens", head("X-Grüße: 1".encode(), b'X-"q": 2', CL) + BODY, BODY),
    # -- what stays refused, bare LF or not -------------------------------------
    Reply("nul-in-field", head(b"X-A: a\x00b", CL, end=b"\n") + BODY, PROTOCOL),
    Reply("bare-cr-in-field", head(b"X-A: a\rb", CL, end=b"\n") + BODY, PROTOCOL),
    Reply("colon-less-field", head(b"nocolon", CL, end=b"\n") + BODY, PROTOCOL),
    # What curl still reads: a 100 KB field, 150 fields, 20 interim responses.
    Reply("big-head", head(b"X-Pad: " + b"a" * 100_000, CL) + BODY, BODY),
    Reply("many-fields", head(*(b"X-%d: v" % i for i in range(150)), CL) + BODY, BODY),
    Reply("many-interim", head(status=b"HTTP/1.1 100 Continue") * 20 + head(CL) + BODY, BODY),
    Reply("huge-lf-head", head(b"X-Pad: " + b"a" * 310_000, CL, end=b"\n") + BODY, PROTOCOL),
]
BY_NAME = {reply.name: reply for reply in REPLIES}


# -- sans-I/O ------------------------------------------------------------------------


class Read:
    """A parser fed with one reply, and what came out of it."""

    def __init__(self, raw: bytes, step: int, close: bool, max_decoded: int | None = None) -> None:
        self.heads: list[ResponseHead] = []
        self.pieces: list[bytes] = []
        self.parser = ResponseParser(self.heads.append, self._body, max_decoded)
        self.done = False
        view = memoryview(raw)
        for i in range(0, len(raw), step):
            self.done = self.parser.feed(view[i : i + step])
            if self.done:
                break
        if not self.done and close:
            self.done = self.parser.feed_eof()

    def _body(self, data: memoryview | bytes) -> None:
        self.pieces.append(bytes(data))

    @property
    def body(self) -> bytes:
        return b"".join(self.pieces)


@pytest.mark.parametrize("step", [1, 3, 20, 1 << 20])
@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: r.name)
def test_the_parser_reads_each_reply(reply: Reply, step: int) -> None:
    if isinstance(reply.expect, bytes):
        read = Read(reply.raw, step, reply.close)
        assert read.done, "the response should be complete"
        assert read.body == reply.expect
        assert read.heads[0].status == 200
    else:
        with pytest.raises(TransferError) as info:
            Read(reply.raw, step, reply.close)
        assert info.value.code == reply.expect, info.value


def test_head_end_finds_every_kind_of_empty_line() -> None:
    from swarmget.protocol.http11 import head_end

    assert head_end(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody") == 25
    assert head_end(b"HTTP/1.1 200 OK\nA: b\n\nbody") == 22
    assert head_end(b"HTTP/1.1 200 OK\r\nA: b\r\n\nbody") == 24
    assert head_end(b"HTTP/1.1 200 OK\nA: b\n\r\nbody") == 23
    assert head_end(b"HTTP/1.1 200 OK\nA: b\n\nx\r\n\r\n") == 22  # the first one wins
    assert head_end(b"HTTP/1.1 200 OK\r\nA: b\r\n\r") == -1
    assert head_end(b"HTTP/1.1 200 OK\r\r\nA: b\r\r\n\r\r\nbody") == 28
    assert head_end(b"HTTP/1.1 200 OK\r\r\nA: b\r\r\n\r\r\r\nbody") == 29
    assert head_end(b"HTTP/1.1 200 OK\r\r\nA: b\r\r\n\r\r") == -1  # the LF may come
    assert head_end(b"HTTP/1.1 200 OK\r\r\nA: b\r\r\n\r\rX\r\r\n\r\r\n") == 34
    # The first empty line wins, whatever its kind.
    assert head_end(b"HTTP/1.1 200 OK\r\r\nA: b\r\r\n\r\r\nx\n\r\n") == 28
    assert head_end(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n", 20) == 25


def test_folded_fields_are_joined_with_a_space() -> None:
    read = Read(BY_NAME["obs-fold"].raw, 1 << 20, False)
    assert read.heads[0].get(b"x-a") == b"a b c"


def test_interim_responses_are_counted_and_skipped() -> None:
    read = Read(BY_NAME["102-lf-with-fields"].raw, 7, False)
    assert read.parser.informational == 1
    assert [h.status for h in read.heads] == [200]


@pytest.mark.parametrize(
    "name", ["chunked-and-length", "gzip-ignores-length", "identity-and-length"]
)
def test_transfer_encoding_with_content_length_is_never_reused(name: str) -> None:
    read = Read(BY_NAME[name].raw, 1 << 20, BY_NAME[name].close)
    assert read.done and not read.parser.reusable


def test_plain_replies_stay_reusable() -> None:
    for name in ("crlf", "lf", "length-list", "obs-fold", "chunked-lf", "gzip-chunked"):
        read = Read(BY_NAME[name].raw, 1 << 20, False)
        assert read.done and read.parser.reusable, name


def test_bytes_after_a_chunked_body_make_the_connection_unusable() -> None:
    for name in ("103-then-chunked", "chunked-lf"):
        read = Read(BY_NAME[name].raw + b"HTTP/1.1 200 OK\r\n", 1 << 20, False)
        assert read.done and read.body == BODY and not read.parser.reusable


def test_a_zip_bomb_is_cut_at_max_decoded_in_bounded_pieces() -> None:
    bomb = gzip.compress(bytes(64 << 20), compresslevel=9)  # 64 MiB of zeros, ~64 KiB
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunked(bomb, 1 << 16)
    with pytest.raises(TransferError) as info:
        Read(raw, 1 << 20, False, max_decoded=1 << 20)
    assert info.value.code == ErrorCode.TOO_LARGE
    # Without a limit every piece handed on is bounded: the sink (the engine
    # checks --max-size there) sees at most 64 KiB at a time.
    read = Read(raw, 1 << 20, False)
    assert read.done and len(read.body) == 64 << 20
    assert max(len(piece) for piece in read.pieces) <= 64 * 1024


# -- fuzzing: whatever comes, only TransferError comes out -------------------------

SEEDS = [reply.raw for reply in REPLIES if len(reply.raw) < 4096]


@settings(max_examples=1500, deadline=None)
@given(
    base=st.sampled_from(SEEDS),
    edits=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=400),
            st.integers(min_value=0, max_value=3),
            st.binary(max_size=4)
            | st.sampled_from([b"\n", b"\r", b"\r\n", b" ", b"\t", b":", b",", b"\x00", b"0"]),
        ),
        max_size=6,
    ),
    cut=st.integers(min_value=1, max_value=64),
    eof=st.booleans(),
)
def test_mutated_replies_raise_only_transfer_errors(
    base: bytes, edits: list[tuple[int, int, bytes]], cut: int, eof: bool
) -> None:
    data = bytearray(base)
    for pos, drop, insert in edits:
        pos = min(pos, len(data))
        data[pos : pos + drop] = insert
    feed_all(bytes(data), cut, eof)


GENERATED_LINES = [
    b"HTTP/1.1 200 OK",
    b"HTTP/1.1 100 Continue",
    b"HTTP/1.1 101 X",
    b"HTTP/1.0 204",
    b"Content-Length: 5",
    b"Content-Length: 5, 5",
    b"Transfer-Encoding: chunked",
    b"Transfer-Encoding: gzip",
    b"Transfer-Encoding: deflate, chunked",
    b" folded",
    b"\tfolded",
    b"X: y",
    b"",
    b"Connection: close",
    b"Upgrade: h2c",
]


@settings(max_examples=500, deadline=None)
@given(
    lines=st.lists(
        st.sampled_from(GENERATED_LINES),
        max_size=8,
    ),
    ends=st.lists(st.sampled_from([b"\r\n", b"\n", b"\r"]), min_size=8, max_size=8),
    body=st.binary(max_size=64) | st.sampled_from([chunked(GZ), GZ, b"5\r\nhello\r\n0\r\n\r\n"]),
    cut=st.integers(min_value=1, max_value=64),
    eof=st.booleans(),
)
def test_generated_replies_raise_only_transfer_errors(
    lines: list[bytes], ends: list[bytes], body: bytes, cut: int, eof: bool
) -> None:
    joined = b"".join(line + end for line, end in zip(lines, ends, strict=False))
    feed_all(joined + b"\r\n" + body, cut, eof)


def feed_all(data: bytes, cut: int, eof: bool) -> None:
    """Feed ``data`` in ``cut``-byte slices (then EOF); only TransferError may come out."""
    read_body = bytearray()
    parser = ResponseParser(lambda head: None, read_body.extend, 1 << 16)
    view = memoryview(data)
    try:
        for i in range(0, len(view), cut):
            parser.feed(view[i : i + cut])
        if eof:
            parser.feed_eof()
    except TransferError as exc:
        assert exc.code in ErrorCode.ALL


# -- end to end ------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    ok: bool
    body: bytes | None
    error: str | None


@pytest.fixture(scope="module")
def downloaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Row]]:
    """Every reply downloaded in one run: name -> what swarmget did with it."""
    out = tmp_path_factory.mktemp("replies")
    with TestServer() as srv:
        for reply in REPLIES:
            srv.route(reply.path, replay(reply.raw, close=reply.close))
        urls = {srv.url(reply.path): reply for reply in REPLIES}
        report = swarmget.download(list(urls), out, retries=0, timeout=2, workers=1)
    failures = {f.url: f for f in report.failures}
    rows = {}
    for url, reply in urls.items():
        failure = failures.get(url)
        if failure is None:
            rows[reply.name] = Row(True, (out / reply.name).read_bytes(), None)
        else:
            rows[reply.name] = Row(False, None, failure.error)
    yield rows


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: r.name)
def test_swarmget_downloads_each_reply(reply: Reply, downloaded: dict[str, Row]) -> None:
    row = downloaded[reply.name]
    if isinstance(reply.expect, bytes):
        assert row == Row(True, reply.expect, None)
    else:
        assert (row.ok, row.error) == (False, reply.expect)


def test_a_zip_bomb_fails_with_too_large_end_to_end(out_dir: Path) -> None:
    bomb = gzip.compress(bytes(64 << 20), compresslevel=9)
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunked(bomb, 1 << 16)
    with TestServer() as srv:
        srv.route("/bomb", replay(raw, close=False, piece=0))
        report = swarmget.download([srv.url("/bomb")], out_dir, retries=0, max_size=1 << 20)
    assert report.failures[0].error == ErrorCode.TOO_LARGE
    assert not (out_dir / "bomb").exists()


def test_a_206_to_a_plain_get_is_saved_only_when_it_is_the_whole_file(out_dir: Path) -> None:
    """A server that answers every GET with 206: a Content-Range that covers the
    whole entity is the file (curl saves it); any other part is refused."""
    ranges = {
        "whole": (b"bytes 0-12/13", BODY),
        "part": (b"bytes 0-4/13", BODY[:5]),
        "unknown-length": (b"bytes 0-12/*", BODY),
        "not-from-0": (b"bytes 2-12/13", BODY[2:]),
    }
    with TestServer() as srv:
        for name, (content_range, body) in ranges.items():
            raw = head(
                b"Content-Range: " + content_range,
                b"Content-Length: %d" % len(body),
                status=b"HTTP/1.1 206 Partial Content",
            )
            srv.route(f"/{name}", replay(raw + body, close=False))
        report = swarmget.download([srv.url(f"/{name}") for name in ranges], out_dir, retries=0)
    assert (out_dir / "whole").read_bytes() == BODY
    assert sorted(f.url.rsplit("/", 1)[1] for f in report.failures) == [
        "not-from-0",
        "part",
        "unknown-length",
    ]
    assert {f.error for f in report.failures} == {ErrorCode.PROTOCOL}


@pytest.mark.parametrize(("name", "connections"), [("crlf", 1), ("chunked-and-length", 2)])
def test_a_reply_with_both_framings_closes_its_connection(
    name: str, connections: int, out_dir: Path
) -> None:
    with TestServer() as srv:
        srv.route(BY_NAME[name].path, replay(BY_NAME[name].raw, close=False))
        urls = [srv.url(BY_NAME[name].path), srv.file_url("after.bin", size=100)]
        report = swarmget.download(urls, out_dir, retries=0, concurrency=1, per_host=1, workers=1)
        assert report.ok == 2
        assert srv.stats.connections == connections
