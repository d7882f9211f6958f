"""The sans-I/O response parser, driven with bytes only (no sockets)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmget.errors import ErrorCode, ProtocolError, TransferError
from swarmget.protocol import (
    MAX_HEADER_BYTES,
    MAX_HEADER_FIELDS,
    MAX_INFORMATIONAL,
    ConnectionClosed,
    ResponseHead,
    ResponseParser,
    build_request,
)


class Collected:
    def __init__(self) -> None:
        self.heads: list[ResponseHead] = []
        self.body = bytearray()
        self.parser = ResponseParser(self.heads.append, self.body.extend)


def feed(data: bytes, step: int | None = None, eof: bool = False) -> tuple[bool, Collected]:
    c = Collected()
    view = memoryview(data)
    step = step or max(1, len(data))
    done = False
    for i in range(0, len(data), step):
        done = c.parser.feed(view[i : i + step])
    if eof:
        done = c.parser.feed_eof()
    return done, c


RESP_CL = b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\nETag: "x"\r\n\r\nhello world'
RESP_CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
)


@pytest.mark.parametrize("step", [None, 1, 2, 7, 64])
def test_content_length_body_any_split(step: int | None) -> None:
    done, c = feed(RESP_CL, step)
    assert done and c.parser.complete
    assert bytes(c.body) == b"hello world"
    assert c.heads[0].status == 200
    assert c.heads[0].content_length == 11
    assert c.heads[0].get(b"etag") == b'"x"'
    assert c.parser.reusable


@pytest.mark.parametrize("step", [None, 1, 3, 16])
def test_chunked_body_any_split(step: int | None) -> None:
    done, c = feed(RESP_CHUNKED, step)
    assert done
    assert bytes(c.body) == b"hello world"
    assert c.heads[0].chunked and c.heads[0].content_length is None
    assert c.parser.reusable


def test_body_slices_are_views_of_the_input_buffer() -> None:
    # The zero-copy promise: Content-Length bodies reach the sink as memoryviews
    # of the caller's buffer, not copies.
    seen: list[object] = []
    parser = ResponseParser(lambda h: None, seen.append)
    buffer = bytearray(RESP_CL)
    parser.feed(memoryview(buffer))
    assert len(seen) == 1
    piece = seen[0]
    assert isinstance(piece, memoryview)
    assert piece.obj is buffer
    assert bytes(piece) == b"hello world"


def test_close_delimited_body_completes_at_eof() -> None:
    data = b"HTTP/1.1 200 OK\r\n\r\nuntil the end"
    done, c = feed(data, 5)
    assert not done
    assert c.parser.feed_eof()
    assert bytes(c.body) == b"until the end"
    assert not c.parser.reusable


def test_informational_responses_are_skipped() -> None:
    data = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n" + RESP_CL
    done, c = feed(data, 4)
    assert done
    assert [h.status for h in c.heads] == [200]
    assert c.parser.informational == 2


def test_endless_informational_responses_are_a_protocol_error() -> None:
    data = b"HTTP/1.1 100 Continue\r\n\r\n" * (MAX_INFORMATIONAL + 1)
    with pytest.raises(ProtocolError, match="1xx"):
        feed(data)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: a\rb\r\n\r\n",
        b"HTTX/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"garbage garbage\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
    ],
)
def test_malformed_heads_are_protocol_errors(head: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        feed(head + b"hello")
    assert info.value.code == ErrorCode.PROTOCOL


@pytest.mark.parametrize(
    "fields",
    [
        b"Location: /a\r\nLocation: /b\r\n",
        b"location: /a\r\nX-A: 1\r\nLOCATION: /b\r\n",
        b"Location: /a\nLocation: /b\n",  # bare LF ends: read through the repair
    ],
)
@pytest.mark.parametrize("status", [b"200 OK", b"302 Found"])
def test_two_different_locations_are_refused_whatever_the_status(
    fields: bytes, status: bytes
) -> None:
    """curl (test 772), Chrome and Firefox refuse them: which target is meant?"""
    end = b"\n" if b"\r" not in fields else b"\r\n"
    head = b"HTTP/1.1 " + status + end + b"Content-Length: 5" + end + fields + end
    with pytest.raises(ProtocolError, match="conflicting Location headers: /a, /b"):
        feed(head + b"hello")


@pytest.mark.parametrize(
    "fields",
    [
        b"Location: /a\r\nLocation:  /a \r\n",  # the same value, repeated
        b"Location: /a\r\nX-Location: /b\r\n",  # another field's name ends so
        b"Location: http://x/location:1\r\n",  # the name inside a value
    ],
)
def test_one_location_value_is_accepted(fields: bytes) -> None:
    head = b"HTTP/1.1 302 Found\r\nContent-Length: 5\r\n" + fields + b"\r\n"
    done, c = feed(head + b"hello")
    assert done and c.heads[0].status == 302


def test_chunked_wins_over_content_length_and_the_connection_is_not_reused() -> None:
    data = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
    done, c = feed(data + RESP_CHUNKED[RESP_CHUNKED.index(b"\r\n\r\n") + 4 :], 3)
    assert done and bytes(c.body) == b"hello world"
    assert c.heads[0].chunked and c.heads[0].content_length is None
    assert not c.parser.reusable


def test_head_repairs_are_the_rfc_ones_only() -> None:
    from swarmget.protocol.head import repair

    assert repair(b"HTTP/1.1 200 OK\nA: b\n\n") == b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n"
    assert repair(b"HTTP/1.1 200\tOK\r\n x\r\nA: b\r\n  c\r\n\r\n") == (
        b"HTTP/1.1 200 OK\r\nA: b c\r\n\r\n"
    )
    assert repair(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 5, 05\r\n\r\n") == (
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    )
    # A bare CR or a NUL stays where it was, for llhttp to refuse.
    assert repair(b"HTTP/1.1 200 OK\nA: b\rc\x00\n\n") == b"HTTP/1.1 200 OK\r\nA: b\rc\x00\r\n\r\n"
    with pytest.raises(ProtocolError, match="conflicting"):
        repair(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n")
    with pytest.raises(ProtocolError, match="too large"):
        repair(
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999, 99999999999999999999\r\n\r\n"
        )


def test_transfer_codings_are_planned_as_curl_does() -> None:
    from swarmget.protocol.codings import plan_codings

    assert plan_codings([b"chunked"]) == (True, [])
    assert plan_codings([b"identity", b"chunked", b"chunked"]) == (True, [])
    assert plan_codings([b"gzip", b"deflate", b"chunked"]) == (True, [b"gzip", b"deflate"])
    assert plan_codings([b"gzip"]) == (False, [b"gzip"])
    assert plan_codings([b"identity"]) == (False, [])
    for refused in ([b"chunked", b"gzip"], [b"br"], [b"gzip"] * 5 + [b"chunked"]):
        with pytest.raises(ProtocolError):
            plan_codings(refused)


def test_header_block_over_64k_is_refused() -> None:
    filler = b"X-Fill: " + b"a" * 1000 + b"\r\n"
    head = b"HTTP/1.1 200 OK\r\n" + filler * (MAX_HEADER_BYTES // len(filler) + 1) + b"\r\n"
    with pytest.raises(ProtocolError, match="larger than"):
        feed(head, 4096)
    with pytest.raises(ProtocolError, match="larger than"):
        feed(head)


def test_header_block_never_terminated_is_refused_at_the_limit() -> None:
    c = Collected()
    chunk = memoryview(b"X-Fill: " + b"a" * 4000 + b"\r\n")
    c.parser.feed(memoryview(b"HTTP/1.1 200 OK\r\n"))
    with pytest.raises(ProtocolError):
        for _ in range(MAX_HEADER_BYTES // len(chunk) + 2):
            c.parser.feed(chunk)


def test_header_block_just_under_the_limit_is_fine() -> None:
    start = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
    pad = MAX_HEADER_BYTES - len(start) - len(b"X: \r\n\r\n")
    head = start + b"X: " + b"a" * pad + b"\r\n\r\n"
    assert len(head) == MAX_HEADER_BYTES
    done, c = feed(head + b"ok", 1000)
    assert done and bytes(c.body) == b"ok"


def test_too_many_header_fields() -> None:
    fields = b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADER_FIELDS + 1))
    with pytest.raises(ProtocolError, match="header fields"):
        feed(b"HTTP/1.1 200 OK\r\n" + fields + b"Content-Length: 0\r\n\r\n")
    fields = b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADER_FIELDS - 1))
    done, _ = feed(b"HTTP/1.1 200 OK\r\n" + fields + b"Content-Length: 0\r\n\r\n")
    assert done


def test_short_body_then_close_is_truncated() -> None:
    with pytest.raises(TransferError) as info:
        feed(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nhello", eof=True)
    assert info.value.code == ErrorCode.TRUNCATED
    assert "5 of 50" in info.value.message


def test_chunked_cut_before_last_chunk_is_truncated() -> None:
    with pytest.raises(TransferError) as info:
        feed(RESP_CHUNKED[:-5], eof=True)
    assert info.value.code == ErrorCode.TRUNCATED


def test_close_inside_head_is_truncated_and_before_anything_is_connection_closed() -> None:
    with pytest.raises(TransferError) as info:
        feed(b"HTTP/1.1 200 OK\r\nContent-Le", eof=True)
    assert info.value.code == ErrorCode.TRUNCATED
    with pytest.raises(ConnectionClosed):
        feed(b"", eof=True)


def test_bytes_after_the_response_make_the_connection_unusable() -> None:
    done, c = feed(RESP_CL + b"JUNK")
    assert done and bytes(c.body) == b"hello world"
    assert not c.parser.reusable
    done, c = feed(RESP_CHUNKED + b"HTTP/1.1 200 OK\r\n")
    assert done and bytes(c.body) == b"hello world"
    assert not c.parser.reusable


def test_connection_close_header_is_honoured() -> None:
    done, c = feed(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx")
    assert done and not c.parser.reusable
    done, c = feed(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx")
    assert done and not c.parser.reusable


@pytest.mark.parametrize(
    ("head", "reusable"),
    [
        # llhttp completes an empty body with its head and then says "close":
        # every empty 200 or 302 cost a new connection (and a TLS handshake).
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 302 Found\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nContent-Length:  0\r\nX: y\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nconnection: Keep-Alive, Close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", True),
    ],
)
def test_an_empty_body_keeps_the_connection_by_the_usual_rules(head: bytes, reusable: bool) -> None:
    done, c = feed(head)
    assert done and c.parser.reusable is reusable


def test_no_body_statuses() -> None:
    done, c = feed(b"HTTP/1.1 204 No Content\r\n\r\n")
    assert done and c.heads[0].status == 204 and not c.body
    done, c = feed(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n")
    assert done and not c.body


def test_body_sink_errors_propagate_unwrapped() -> None:
    class Full(TransferError):
        pass

    def sink(data: object) -> None:
        raise Full(ErrorCode.IO, "disk full")

    for data in (RESP_CL, RESP_CHUNKED):
        parser = ResponseParser(lambda h: None, sink)
        with pytest.raises(Full):
            parser.feed(memoryview(data))


def test_build_request() -> None:
    req = build_request("/a?b=1", "example.com:8080", b"User-Agent: t\r\n")
    assert req == b"GET /a?b=1 HTTP/1.1\r\nHost: example.com:8080\r\nUser-Agent: t\r\n\r\n"


# -- properties -------------------------------------------------------------------

VALID = [RESP_CL, RESP_CHUNKED, b"HTTP/1.1 100 Continue\r\n\r\n" + RESP_CL]


@settings(max_examples=300, deadline=None)
@given(
    base=st.sampled_from(VALID),
    cuts=st.lists(st.integers(min_value=1, max_value=200), max_size=20),
)
def test_any_split_gives_the_same_result(base: bytes, cuts: list[int]) -> None:
    c = Collected()
    view = memoryview(base)
    pos = 0
    done = False
    for cut in cuts:
        if pos >= len(base):
            break
        done = c.parser.feed(view[pos : pos + cut])
        pos += cut
    if pos < len(base):
        done = c.parser.feed(view[pos:])
    assert done
    assert bytes(c.body) == b"hello world"


@settings(max_examples=500, deadline=None)
@given(
    base=st.sampled_from(VALID),
    edits=st.lists(
        st.tuples(st.integers(min_value=0, max_value=200), st.binary(min_size=0, max_size=4)),
        max_size=5,
    ),
    cut=st.integers(min_value=1, max_value=64),
    eof=st.booleans(),
)
def test_corrupted_streams_parse_or_raise_our_errors(
    base: bytes, edits: list[tuple[int, bytes]], cut: int, eof: bool
) -> None:
    data = bytearray(base)
    for pos, replacement in edits:
        pos = min(pos, len(data))
        data[pos : pos + len(replacement)] = replacement
    c = Collected()
    view = memoryview(bytes(data))
    try:
        for i in range(0, len(view), cut):
            c.parser.feed(view[i : i + cut])
        if eof:
            c.parser.feed_eof()
    except TransferError as exc:
        assert exc.code in ErrorCode.ALL
    # Whatever happened, the body never exceeds what was sent.
    assert len(c.body) <= len(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(min_value=1, max_value=50))
def test_random_bytes_never_escape_as_foreign_exceptions(data: bytes, cut: int) -> None:
    c = Collected()
    view = memoryview(data)
    try:
        for i in range(0, len(view), cut):
            c.parser.feed(view[i : i + cut])
        c.parser.feed_eof()
    except TransferError as exc:
        assert exc.code in ErrorCode.ALL


# -- the chunk reader (curl's rules) under every framing and split ----------------------


@st.composite
def chunked_bodies(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(the framing, the data it carries): sizes in any case and with leading
    zeros, CRLF or bare LF ends, extensions, a trailer."""
    pieces = draw(st.lists(st.binary(min_size=1, max_size=40), max_size=6))
    framed = bytearray()
    for piece in pieces:
        digits = f"{len(piece):x}"
        digits = draw(st.sampled_from([digits, digits.upper(), "0" + digits]))
        extension = draw(st.sampled_from(["", ";a=b", " ;x"]))
        end, after = draw(st.sampled_from(["\r\n", "\n"])), draw(st.sampled_from(["\r\n", "\n"]))
        framed += f"{digits}{extension}{end}".encode() + piece + after.encode()
    framed += b"0" + draw(st.sampled_from([b"\r\n", b"\n"]))
    framed += draw(st.sampled_from([b"", b"X-Sum: 1\r\n"])) + b"\r\n"
    return bytes(framed), b"".join(pieces)


@settings(max_examples=300, deadline=None)
@given(body=chunked_bodies(), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_chunk_reader_reads_every_framing_under_any_split(
    body: tuple[bytes, bytes], cuts: list[int]
) -> None:
    from swarmget.protocol.http11 import _ChunkReader

    framed, data = body
    got = bytearray()
    reader = _ChunkReader(got.extend)
    bounds = sorted({0, len(framed), *(c for c in cuts if c < len(framed))})
    done = False
    for start, stop in itertools.pairwise(bounds):
        assert not done
        done = reader.feed(memoryview(framed)[start:stop])
    assert done and bytes(got) == data and not reader.extra


def test_the_chunks_of_one_read_reach_the_sink_in_one_call() -> None:
    # A write each: 1 MB in 1-byte chunks was a million write(2) calls, and a
    # 20 MB stream of 100-byte chunks ten times curl's time.
    from swarmget.protocol.http11 import _ChunkReader

    calls: list[bytes] = []
    reader = _ChunkReader(lambda view: calls.append(bytes(view)))
    framed = b"".join(b"1\r\n%c\r\n" % (97 + i % 26) for i in range(1000))
    assert not reader.feed(memoryview(framed))
    assert reader.feed(memoryview(b"3\r\nxyz\r\n0\r\n\r\n"))
    expected = bytes(97 + i % 26 for i in range(1000))
    assert calls == [expected, b"xyz"]


@pytest.mark.parametrize(
    "framed",
    [
        b"1\r\na\r\r\n0\r\n\r\n",
        b"1\r\nab\r\n0\r\n\r\n",
        b"1\r\na\r0\r\n\r\n",
        b"1\r\na\r\n\n0\r\n\r\n",
        b"\n0\r\n\r\n",
    ],
)
def test_chunk_reader_refuses_what_does_not_end_the_data_whatever_the_split(framed: bytes) -> None:
    from swarmget.protocol.http11 import _ChunkReader

    for cut in range(len(framed) + 1):
        reader = _ChunkReader(lambda view: None)
        with pytest.raises(ProtocolError):
            for piece in (framed[:cut], framed[cut:]):
                reader.feed(memoryview(piece))


def test_an_http2_reply_is_named_as_such() -> None:
    # A server that ignores ALPN's http/1.1 and speaks HTTP/2 sends a SETTINGS
    # frame first: said in words, not as "not an HTTP/1.x reply: b'\x00\x00...'".
    settings_frame = b"\x00\x00\x12\x04\x00\x00\x00\x00\x00" + b"\x00\x03\x00\x00\x00\x64" * 3
    parser = ResponseParser(lambda h: None, lambda b: None)
    with pytest.raises(ProtocolError, match="the server answered in HTTP/2"):
        parser.feed(memoryview(settings_frame))
    other = ResponseParser(lambda h: None, lambda b: None)
    with pytest.raises(ProtocolError, match=r"not an HTTP/1\.x reply"):
        other.feed(memoryview(b"SSH-2.0-OpenSSH_9.2p1\r\n"))


@pytest.mark.parametrize(
    "reply", [b"\x15\x03\x01\x00\x02\x02\x0a", b"\x16\x03", b"\x15\x03\x03\x00"]
)
def test_a_tls_record_in_reply_to_plain_http_is_named_as_such(reply: bytes) -> None:
    # A TLS server behind an http:// URL; two bytes already tell.
    parser = ResponseParser(lambda h: None, lambda b: None)
    with pytest.raises(ProtocolError, match=r"answered in TLS, not plain HTTP \(is it an https://"):
        parser.feed(memoryview(reply))
