"""The scripted test server (swarmget.testing), checked with stdlib clients only."""

from __future__ import annotations

import asyncio
import http.client
import selectors
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from swarmget.testing import (
    DEFAULT_SIZE,
    FAULTS,
    LAST_MODIFIED,
    ScriptedConnection,
    TestServer,
    etag,
    expected_body,
    serve_in_subprocess,
)
from swarmget.testing.content import BLOCK_SIZE
from swarmget.testing.faults import BAD_STATUS_LINE, GARBAGE
from swarmget.testing.urls import ServerUrls


@pytest.fixture(scope="module")
def srv() -> Iterator[TestServer]:
    with TestServer() as server:
        yield server


# -- helpers ------------------------------------------------------------------


def connect(srv: ServerUrls, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)


def request(target: str, *headers: str, version: str = "HTTP/1.1") -> bytes:
    lines = [f"GET {target} {version}", "Host: test", *headers, "", ""]
    return "\r\n".join(lines).encode()


def read_until_eof(sock: socket.socket) -> bytes:
    chunks = []
    while data := sock.recv(65536):
        chunks.append(data)
    return b"".join(chunks)


def exchange(srv: ServerUrls, target: str, *headers: str) -> bytes:
    """Send one request with Connection: close and return every byte until EOF."""
    with connect(srv) as sock:
        sock.sendall(request(target, "Connection: close", *headers))
        return read_until_eof(sock)


def split(raw: bytes) -> tuple[bytes, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return head, body


def header_values(head: bytes, name: bytes) -> list[bytes]:
    prefix = name.lower() + b":"
    lines = head.split(b"\r\n")[1:]
    return [ln.split(b":", 1)[1].strip() for ln in lines if ln.lower().startswith(prefix)]


def get(srv: ServerUrls, target: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        conn.request("GET", target, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def wait_for(predicate: object, timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


# -- content ------------------------------------------------------------------


def test_expected_body_is_deterministic_and_cyclic() -> None:
    a = expected_body("a.jpg", 5000)
    assert a == expected_body("a.jpg", 5000)
    assert expected_body("a.jpg", 100) == a[:100]
    assert expected_body("b.jpg", 5000) != a
    assert expected_body("a.jpg", 0) == b""
    big = expected_body("a.jpg", BLOCK_SIZE + 10)
    assert big[BLOCK_SIZE:] == big[:10]  # read cyclically from the block
    assert etag("a.jpg", 100) == etag("a.jpg", 100) != etag("a.jpg", 101)


@pytest.mark.parametrize("size", [0, 1, 100, DEFAULT_SIZE, 3 * BLOCK_SIZE + 7])
def test_serves_expected_body(srv: TestServer, size: int) -> None:
    status, headers, body = get(srv, f"/files/dir/x%20y.bin?size={size}")
    assert status == 200
    assert body == expected_body("dir/x y.bin", size)
    assert headers["content-length"] == str(size)
    assert headers["etag"] == etag("dir/x y.bin", size)
    assert headers["last-modified"] == LAST_MODIFIED
    assert headers["accept-ranges"] == "bytes"


def test_default_size_and_head(srv: TestServer) -> None:
    assert get(srv, "/files/a")[2] == expected_body("a", DEFAULT_SIZE)
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    conn.request("HEAD", "/files/a?size=10")
    resp = conn.getresponse()
    assert (resp.status, resp.getheader("Content-Length"), resp.read()) == (200, "10", b"")
    conn.close()


def test_url_helpers(srv: TestServer) -> None:
    assert srv.base_url == f"http://127.0.0.1:{srv.port}"
    assert srv.url("/files/a?size=1", fault="truncate").endswith("/files/a?size=1&fault=truncate")
    assert srv.file_url("a b", size=3, chunked=True).endswith("/files/a%20b?size=3&chunked=1")


# -- keep-alive and stats -----------------------------------------------------


def test_keep_alive_reuses_one_connection() -> None:
    with TestServer() as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        for i in range(10):
            conn.request("GET", f"/files/f{i}?size=1000")
            assert conn.getresponse().read() == expected_body(f"f{i}", 1000)
        conn.close()
        assert wait_for(lambda: server.stats.active == 0)
        stats = server.stats
        assert (stats.connections, stats.requests, stats.peak_active) == (1, 10, 1)
        assert len(server.requests) == 10 and server.requests[0].startswith(b"GET /files/f0")
        server.reset_stats()
        assert server.stats.requests == 0


def test_pipelined_requests_answered_in_order(srv: TestServer) -> None:
    with connect(srv) as sock:
        sock.sendall(request("/files/p1?size=5&latency=0.05") + request("/files/p2?size=7"))
        sock.sendall(request("/files/p3?size=3", "Connection: close"))
        raw = read_until_eof(sock)
    bodies = [expected_body("p1", 5), expected_body("p2", 7), expected_body("p3", 3)]
    assert raw.count(b"HTTP/1.1 200 OK") == 3
    assert [raw.index(b) for b in bodies] == sorted(raw.index(b) for b in bodies)


def test_http10_closes_after_response(srv: TestServer) -> None:
    with connect(srv) as sock:
        sock.sendall(request("/files/a?size=3", version="HTTP/1.0"))
        raw = read_until_eof(sock)  # EOF without us closing
    assert header_values(split(raw)[0], b"connection") == [b"close"]


def test_errors_for_bad_requests(srv: TestServer) -> None:
    assert get(srv, "/nothing-here")[0] == 404
    status, headers, _ = get(srv, "/files/a?sise=3")
    assert status == 400 and "sise" in headers["x-error"]
    assert get(srv, "/files/a?fault=nope")[0] == 400
    with connect(srv) as sock:
        sock.sendall(b"NONSENSE\r\n\r\n")
        assert read_until_eof(sock).startswith(b"HTTP/1.1 400")


# -- framing options ----------------------------------------------------------


def test_chunked(srv: TestServer) -> None:
    head, body = split(exchange(srv, "/files/c?size=1000&chunked=1&chunk=300"))
    assert header_values(head, b"transfer-encoding") == [b"chunked"]
    assert not header_values(head, b"content-length")
    data = expected_body("c", 1000)
    expected = b"".join(
        b"%x\r\n%s\r\n" % (len(data[i : i + 300]), data[i : i + 300]) for i in (0, 300, 600, 900)
    )
    assert body == expected + b"0\r\n\r\n"


def test_close_delimited(srv: TestServer) -> None:
    with connect(srv) as sock:
        sock.sendall(request("/files/d?size=2000&close=1"))  # keep-alive asked for, still closed
        head, body = split(read_until_eof(sock))
    assert not header_values(head, b"content-length")
    assert body == expected_body("d", 2000)


def test_status_with_retry_after(srv: TestServer) -> None:
    status, headers, body = get(srv, "/files/a?status=503&retry_after=7")
    assert (status, headers["retry-after"]) == (503, "7")
    assert body == b"503 Service Unavailable\n"
    assert get(srv, "/files/a?status=404")[0] == 404


def test_redirect(srv: TestServer) -> None:
    target = srv.file_url("b", size=5)
    status, headers, _ = get(srv, f"/files/a?redirect=7&to={target}")
    assert (status, headers["location"]) == (307, target)
    status, headers, _ = get(srv, "/files/a?size=5&redirect=301")
    assert (status, headers["location"]) == (301, "/files/a?size=5")


def test_times_applies_fault_only_to_first_requests(srv: TestServer) -> None:
    target = "/files/t?size=10&status=500&times=2"
    assert [get(srv, target)[0] for _ in range(3)] == [500, 500, 200]


# -- ranges -------------------------------------------------------------------


def test_range_from_offset(srv: TestServer) -> None:
    status, headers, body = get(srv, "/files/r?size=1000", Range="bytes=400-")
    assert status == 206
    assert headers["content-range"] == "bytes 400-999/1000"
    assert body == expected_body("r", 1000)[400:]


@pytest.mark.parametrize(
    ("spec", "status", "window"),
    [("bytes=10-19", 206, (10, 20)), ("bytes=-100", 206, (900, 1000)), ("bytes=0-", 206, None)],
)
def test_range_forms(
    srv: TestServer, spec: str, status: int, window: tuple[int, int] | None
) -> None:
    got_status, _, body = get(srv, "/files/r?size=1000", Range=spec)
    start, stop = window or (0, 1000)
    assert (got_status, body) == (status, expected_body("r", 1000)[start:stop])


def test_if_range(srv: TestServer) -> None:
    full = expected_body("r", 1000)
    for validator in (etag("r", 1000), LAST_MODIFIED):
        status, _, body = get(
            srv, "/files/r?size=1000", Range="bytes=10-", **{"If-Range": validator}
        )
        assert (status, body) == (206, full[10:])
    status, _, body = get(srv, "/files/r?size=1000", Range="bytes=10-", **{"If-Range": '"stale"'})
    assert (status, body) == (200, full)


def test_norange_and_unsatisfiable(srv: TestServer) -> None:
    status, headers, body = get(srv, "/files/r?size=1000&norange=1", Range="bytes=10-")
    assert (status, headers["accept-ranges"], len(body)) == (200, "none", 1000)
    status, headers, _ = get(srv, "/files/r?size=1000", Range="bytes=1000-")
    assert (status, headers["content-range"]) == (416, "bytes */1000")


# -- faults -------------------------------------------------------------------


def test_truncate_sends_exactly_half_then_eof(srv: TestServer) -> None:
    head, body = split(exchange(srv, "/files/t?size=1001&fault=truncate"))
    assert header_values(head, b"content-length") == [b"1001"]
    assert body == expected_body("t", 1001)[:500]


def test_reset_gives_econnreset(srv: TestServer) -> None:
    received = b""
    with connect(srv) as sock, pytest.raises(ConnectionResetError):
        sock.sendall(request("/files/r?size=20000&fault=reset"))
        while data := sock.recv(65536):
            received += data
    head, body = split(received)
    assert header_values(head, b"content-length") == [b"20000"]
    assert body == expected_body("r", 20000)[:10000]


def test_stall_keeps_socket_open_until_client_leaves() -> None:
    with TestServer() as server, connect(server, timeout=0.3) as sock:
        sock.sendall(request("/files/s?size=1000&fault=stall"))
        received = b""
        with pytest.raises(TimeoutError):
            while data := sock.recv(65536):
                received += data
        assert split(received)[1] == expected_body("s", 1000)[:500]
        sock.close()
        assert wait_for(lambda: server.stats.active == 0)


def test_stall_headers_sends_nothing(srv: TestServer) -> None:
    with connect(srv, timeout=0.2) as sock:
        sock.sendall(request("/files/s?fault=stall_headers"))
        with pytest.raises(TimeoutError):
            sock.recv(1)


def test_drip_sends_one_byte_at_a_time(srv: TestServer) -> None:
    with connect(srv) as sock:
        sock.sendall(request("/files/d?size=3&fault=drip&drip_interval=0.2"))
        assert sock.recv(100) == b"H"
        assert sock.recv(100) == b"T"
    start = time.monotonic()
    with connect(srv) as sock:
        sock.sendall(request("/files/d?size=3&fault=drip&drip_interval=0.001", "Connection: close"))
        raw = read_until_eof(sock)
    assert split(raw)[1] == expected_body("d", 3)
    assert time.monotonic() - start >= len(raw) * 0.001


def test_header_faults(srv: TestServer) -> None:
    def head_of(fault: str) -> bytes:
        return split(exchange(srv, f"/files/h?size=10&fault={fault}"))[0]

    assert len(head_of("huge_headers")) > 300 * 1024
    assert len(head_of("many_headers").split(b"\r\n")) == 1 + 1500
    assert header_values(head_of("two_cl"), b"content-length") == [b"10", b"11"]
    cl_te = head_of("cl_and_chunked")
    assert header_values(cl_te, b"content-length") == [b"10"]
    assert header_values(cl_te, b"transfer-encoding") == [b"chunked"]
    assert head_of("bad_status").split(b"\r\n")[0] == BAD_STATUS_LINE
    assert header_values(head_of("neg_cl"), b"content-length") == [b"-1"]
    assert header_values(head_of("nul_header"), b"x-bad") == [b"a\x00b"]
    assert header_values(head_of("bare_cr"), b"x-bad") == [b"a\rb"]


def test_endless_1xx(srv: TestServer) -> None:
    with connect(srv) as sock:
        sock.sendall(request("/files/e?fault=endless_1xx"))
        time.sleep(0.1)
        data = sock.recv(65536)
    continues = data.count(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert continues >= 3 and data == b"HTTP/1.1 100 Continue\r\n\r\n" * continues


def test_chunk_cut(srv: TestServer) -> None:
    _, body = split(exchange(srv, "/files/c?size=1000&fault=chunk_cut&chunk=400"))
    data = expected_body("c", 1000)
    assert body == b"190\r\n%s\r\n190\r\n%s\r\n" % (data[:400], data[400:800])


def test_extra_bytes_and_no_keepalive(srv: TestServer) -> None:
    with connect(srv, timeout=0.5) as sock:
        sock.sendall(request("/files/x?size=10&fault=extra_bytes"))
        time.sleep(0.1)
        assert split(sock.recv(65536))[1] == expected_body("x", 10) + GARBAGE
    with connect(srv) as sock:
        sock.sendall(request("/files/x?size=10&fault=no_keepalive"))
        head, body = split(read_until_eof(sock))
    assert header_values(head, b"connection") == [b"close"] and body == expected_body("x", 10)


def test_every_fault_is_documented() -> None:
    import swarmget.testing.faults as faults

    for fault in FAULTS:
        assert f"\n{fault} " in (faults.__doc__ or ""), fault


# -- latency does not serialise ------------------------------------------------


def test_200_concurrent_latency_requests_finish_together(srv: TestServer) -> None:
    sel = selectors.DefaultSelector()
    socks = [connect(srv) for _ in range(200)]
    start = time.monotonic()
    for i, sock in enumerate(socks):
        sock.sendall(request(f"/files/l{i}?size=100&latency=0.1", "Connection: close"))
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
    open_ = set(socks)
    while open_ and time.monotonic() - start < 5:
        for key, _ in sel.select(1):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if not sock.recv(65536):
                sel.unregister(sock)
                open_.discard(sock)
    elapsed = time.monotonic() - start
    sel.close()
    for sock in socks:
        sock.close()
    assert not open_
    assert 0.1 <= elapsed < 0.6, elapsed


def test_1000_concurrent_connections() -> None:
    with serve_in_subprocess() as server:
        socks = [connect(server) for _ in range(1000)]
        try:
            for i, sock in enumerate(socks):
                sock.sendall(request(f"/files/c{i}?size=10&latency=0.3", "Connection: close"))
            assert wait_for(lambda: server.stats.peak_active == 1000)
            for i, sock in enumerate(socks):
                assert split(read_until_eof(sock))[1] == expected_body(f"c{i}", 10)
        finally:
            for sock in socks:
                sock.close()
        stats = server.stats
        assert (stats.connections, stats.requests, stats.peak_active) == (1000, 1000, 1000)


# -- scripted routes ----------------------------------------------------------


def test_route_bytes(srv: TestServer) -> None:
    srv.route_bytes("/raw", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhiJUNK")
    assert exchange(srv, "/raw?anything") == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhiJUNK"


def test_sync_script_with_timing_and_reset() -> None:
    def handler(head: bytes, conn: ScriptedConnection) -> None:
        assert head.startswith(b"GET /script ")
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab")
        conn.sleep(0.15)
        conn.send(b"cd")
        conn.reset()

    with TestServer() as server:
        server.route("/script", handler)
        with connect(server) as sock:
            sock.sendall(request("/script"))
            start = time.monotonic()
            assert sock.recv(100).endswith(b"ab")
            assert sock.recv(100) == b"cd"
            assert time.monotonic() - start >= 0.1
            with pytest.raises(ConnectionResetError):
                sock.recv(100)


def test_async_script_reads_further_requests() -> None:
    heads: list[bytes] = []

    async def handler(head: bytes | None, conn: ScriptedConnection) -> None:
        while head is not None:
            heads.append(head)
            await conn.send(b"HTTP/1.1 204 No Content\r\n\r\n")
            await asyncio.sleep(0.01)
            head = await conn.next_request()

    with TestServer() as server:
        server.route("/echo", handler)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        for _ in range(3):
            conn.request("GET", "/echo")
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (204, b"")
        conn.close()
        assert wait_for(lambda: len(heads) == 3 and server.stats.active == 0)
    assert (server.stats.connections, server.stats.requests) == (1, 3)


def test_script_that_does_not_close_keeps_connection(srv: TestServer) -> None:
    srv.route("/then-files", lambda head, conn: conn.send(b"HTTP/1.1 204 No Content\r\n\r\n"))
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    conn.request("GET", "/then-files")
    resp = conn.getresponse()
    assert (resp.status, resp.read()) == (204, b"")
    conn.request("GET", "/files/k?size=4")
    assert conn.getresponse().read() == expected_body("k", 4)
    conn.close()


def test_handler_error_is_raised_at_stop() -> None:
    def broken(head: bytes, conn: ScriptedConnection) -> None:
        raise ValueError("boom")

    server = TestServer().start()
    server.route("/broken", broken)
    with connect(server) as sock:
        sock.sendall(request("/broken"))
        assert read_until_eof(sock) == b""
    with pytest.raises(ValueError, match="boom"):
        server.stop()


# -- lifecycle ------------------------------------------------------------------


def test_stop_closes_everything() -> None:
    before = threading.active_count()
    server = TestServer().start()
    socks = [connect(server) for _ in range(5)]
    for sock in socks:
        sock.sendall(request("/files/s?fault=stall_headers"))
    assert wait_for(lambda: server.stats.active == 5)
    server.stop()
    for sock in socks:
        assert read_until_eof(sock) == b""  # the server closed it
        sock.close()
    assert threading.active_count() == before
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()


def test_subprocess_mode() -> None:
    with serve_in_subprocess(latency=0.05) as server:
        assert server.pid is not None
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        for i in range(3):
            conn.request("GET", f"/files/p{i}?size=70000")
            assert conn.getresponse().read() == expected_body(f"p{i}", 70000)
        conn.close()
        assert wait_for(lambda: server.stats.active == 0)
        stats = server.stats
        assert (stats.connections, stats.requests) == (1, 3)
        proc = server._proc
    assert proc is not None and proc.returncode == 0


def test_start_process() -> None:
    server = TestServer.start_process()
    try:
        assert get(server, "/files/z?size=9")[2] == expected_body("z", 9)
    finally:
        server.stop()
