"""The real-nginx harness itself: serving, keep-alive, HTTPS, redirects, shutdown."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarmget.testing import nginx as nginx_mod
from swarmget.testing.daemons import group_members
from swarmget.testing.nginx import (
    ECHO_MODULE,
    Nginx,
    NginxError,
    ServedTree,
    delayed_location,
    expected_file_bytes,
    make_tls_files,
    make_tree,
)


def _get(
    conn: http.client.HTTPConnection, path: str
) -> tuple[int, bytes, http.client.HTTPResponse]:
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, response.read(), response


def test_files_over_one_keepalive_connection(nginx_server: ServedTree) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", nginx_server.port, timeout=10)
    try:
        names = [*nginx_server.names[:3], nginx_server.names[-1]]
        first_sock = None
        for name in names:
            status, body, response = _get(conn, f"/{name}")
            assert status == 200
            assert response.getheader("Content-Length") == str(nginx_server.size)
            assert body == nginx_server.expected(name)
            if first_sock is None:
                first_sock = conn.sock
            # http.client reconnects silently when the server closes: same socket = kept alive.
            assert conn.sock is first_sock
        status, _body, _resp = _get(conn, "/no-such-file.jpg")
        assert status == 404
    finally:
        conn.close()


def test_served_tree_shape(nginx_server: ServedTree) -> None:
    assert len(nginx_server.names) == 2500
    assert nginx_server.names[0] == "img000000.jpg"
    assert nginx_server.base_url == f"http://127.0.0.1:{nginx_server.port}"
    assert nginx_server.url("/a/b") == f"{nginx_server.base_url}/a/b"
    assert nginx_server.urls()[7] == nginx_server.url(nginx_server.names[7])
    on_disk = (nginx_server.root / nginx_server.names[7]).read_bytes()
    assert on_disk == nginx_server.expected(nginx_server.names[7])


def test_https_with_trustme_ca(nginx_bin: str, tmp_path: Path) -> None:
    root = tmp_path / "www"
    names = make_tree(root, 3, 20_000)
    tls = make_tls_files(tmp_path / "tls")
    with Nginx(root, ssl=tls.server) as server:
        assert server.base_url == f"https://127.0.0.1:{server.port}"
        conn = http.client.HTTPSConnection(
            "127.0.0.1", server.port, context=tls.client_context(), timeout=10
        )
        try:
            for name in names:
                status, body, _resp = _get(conn, f"/{name}")
                assert status == 200
                assert body == expected_file_bytes(name, 20_000)
            assert isinstance(conn.sock, ssl.SSLSocket)
            assert conn.sock.selected_alpn_protocol() in (None, "http/1.1")
        finally:
            conn.close()

        # A client that does not trust our throwaway CA must refuse the server.
        untrusting = ssl.create_default_context()
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
            pytest.raises(ssl.SSLCertVerificationError),
        ):
            untrusting.wrap_socket(raw, server_hostname="127.0.0.1").close()


def test_extra_locations_redirect_chain(nginx_bin: str, tmp_path: Path) -> None:
    names = make_tree(tmp_path, 1, 1000)
    extra = f"""
        location = /old {{ return 301 /mid; }}
        location = /mid {{ return 302 /{names[0]}; }}
    """
    with Nginx(tmp_path, extra_locations=extra) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            status, _body, response = _get(conn, "/old")
            assert status == 301
            assert response.getheader("Location") == server.url("/mid")
            status, _body, response = _get(conn, "/mid")
            assert status == 302
            assert response.getheader("Location") == server.url(names[0])
            status, body, _resp = _get(conn, f"/{names[0]}")
            assert (status, body) == (200, expected_file_bytes(names[0], 1000))
        finally:
            conn.close()


def test_echo_module_delays_a_response(nginx_bin: str, tmp_path: Path) -> None:
    names = make_tree(tmp_path, 1, 5000)
    with Nginx(tmp_path, modules=(ECHO_MODULE,), extra_locations=delayed_location(0.2)) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            for _ in range(2):  # and again on the same connection
                started = time.monotonic()
                status, body, response = _get(conn, f"/delayed/{names[0]}")
                assert time.monotonic() - started >= 0.2
                assert (status, body) == (200, expected_file_bytes(names[0], 5000))
                assert response.getheader("Content-Length") == "5000"
        finally:
            conn.close()


def test_missing_module_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, nginx_bin: str, tmp_path: Path
) -> None:
    monkeypatch.setattr(nginx_mod, "MODULE_DIRS", (tmp_path,))
    assert nginx_mod.find_module(ECHO_MODULE) is None
    with (
        pytest.raises(NginxError, match="ngx_http_echo_module not found"),
        Nginx(tmp_path, modules=(ECHO_MODULE,)),
    ):
        pass


def test_clean_shutdown(nginx_bin: str, tmp_path: Path) -> None:
    make_tree(tmp_path, 1, 10)
    server = Nginx(tmp_path, workers=2)
    with server:
        port, master = server.port, server.pid
        assert master is not None
        deadline = time.monotonic() + 5
        while len(group_members(master)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(group_members(master)) == 3  # master + 2 workers
        # An idle keep-alive connection must not hold up shutdown.
        idle = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        _get(idle, "/img000000.jpg")
    idle.close()
    assert server.pid is None
    assert group_members(master) == []
    with pytest.raises(ProcessLookupError):
        os.kill(master, 0)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    with pytest.raises(NginxError):
        _ = server.port
    server.stop()  # idempotent


def test_nginx_ends_when_the_process_that_started_it_is_killed(
    nginx_bin: str, tmp_path: Path
) -> None:
    """A test run killed outright (SIGKILL, a CI timeout) runs no clean-up of
    ours: the kernel's parent-death signal must end nginx anyway."""
    make_tree(tmp_path, 1, 10)
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from swarmget.testing.nginx import Nginx\n"
        "server = Nginx(Path(sys.argv[1]), workers=2)\n"
        "server.start()\n"
        "print(server.pid, server.port, flush=True)\n"
        "time.sleep(60)\n"
    )
    master = -1
    with subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True
    ) as starter:
        try:
            assert starter.stdout is not None
            master, port = (int(x) for x in starter.stdout.readline().split())
            assert len(group_members(master)) >= 1
            starter.kill()
            starter.wait()
            deadline = time.monotonic() + 10
            while group_members(master) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert group_members(master) == []  # master and workers
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
        finally:
            starter.kill()
            if master > 0:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(master, signal.SIGKILL)


def test_explicit_port_in_use_is_a_clear_error(nginx_bin: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(NginxError, match="in use"):
            Nginx(tmp_path, port=taken.getsockname()[1]).start()


def test_missing_binary_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from swarmget.testing import daemons

    monkeypatch.setattr(daemons.shutil, "which", lambda _name: None)
    monkeypatch.setattr(nginx_mod, "_FALLBACK_PATHS", ())
    assert nginx_mod.find_nginx() is None
    with pytest.raises(NginxError, match="not installed"), Nginx(tmp_path):
        pass


def test_file_content_is_deterministic_and_not_periodic() -> None:
    a = expected_file_bytes("img000001.jpg", 3 << 20)  # longer than the pool: wraps
    assert len(a) == 3 << 20
    assert a == expected_file_bytes("img000001.jpg", 3 << 20)
    assert a[:1000] != expected_file_bytes("img000002.jpg", 1000)
    for stride in (32, 4096, 65536):
        assert a[:stride] != a[stride : 2 * stride]
    assert expected_file_bytes("x", 0) == b""


def test_make_tree_subdirs_and_speed(out_dir: Path) -> None:
    names = make_tree(out_dir, 5, 100, prefix="p", name_fmt="d{i:02d}/{prefix}{i}.bin")
    assert names == [f"d{i:02d}/p{i}.bin" for i in range(5)]
    assert (out_dir / names[4]).read_bytes() == expected_file_bytes(names[4], 100)
    # A fifth of the 10,000 x 50 KB budget (2 s), with room for a slow disk.
    start = time.perf_counter()
    make_tree(out_dir / "speed", 2000, 50 * 1024)
    assert time.perf_counter() - start < 2.0


def test_port_race_is_retried(
    nginx_bin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_free_port = nginx_mod.free_port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        # The first "free" port is snatched by someone else before nginx binds it.
        stolen = [taken.getsockname()[1]]
        monkeypatch.setattr(
            nginx_mod, "free_port", lambda: stolen.pop() if stolen else real_free_port()
        )
        with Nginx(tmp_path) as server:
            assert not stolen
            assert server.port != taken.getsockname()[1]
