"""Proxies: http forwarding and CONNECT tunnels through a real tinyproxy, and the rules.

The real proxy is Debian's tinyproxy (``swarmget.testing.tinyproxy``), in front
of the session's nginx (plain and TLS).  Its log is the proof that it carried a
request: every request line it received is there.  Misbehaving proxies are
scripted in a thread, one blocking socket per connection, like test_tls.py's
servers.  Configuration rules (URL parsing, environment variables, no_proxy)
are tested as plain functions.
"""

from __future__ import annotations

import base64
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import swarmget
from swarmget import cli
from swarmget.engine.tunnel import connect_request
from swarmget.engine.verdicts import http_error
from swarmget.errors import UsageError
from swarmget.net.proxy import (
    DEFAULT_PROXY_PORT,
    NoProxy,
    Proxy,
    parse_proxy_url,
    proxy_settings,
)
from swarmget.options import Options
from swarmget.protocol import ConnectionClosed, ConnectResponseParser
from swarmget.testing.dns import nxdomain_server
from swarmget.testing.nginx import ServedTree, TlsFiles
from swarmget.testing.tinyproxy import TinyProxy

PROXY_VARIABLES = (
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "no_proxy",
    "NO_PROXY",
    "REQUEST_METHOD",
)


@pytest.fixture(autouse=True)
def clean_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees the machine's own proxy settings."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def manifest(out: Path) -> dict[str, dict[str, Any]]:
    lines = (out / ".swarmget" / "manifest.jsonl").read_text().splitlines()
    return {record["url"]: record for record in map(json.loads, lines)}


@pytest.fixture
def tinyproxy(tinyproxy_bin: str) -> Iterator[TinyProxy]:
    with TinyProxy() as proxy:
        yield proxy


# -- proxy URLs ----------------------------------------------------------------------------


def test_proxy_url_with_credentials() -> None:
    proxy = parse_proxy_url("http://sw%40rm:p%3Ass@Proxy.Example:3128")
    assert proxy is not None
    assert (proxy.host, proxy.port) == ("proxy.example", 3128)
    assert proxy.authorization == "Basic " + base64.b64encode(b"sw@rm:p:ss").decode()
    assert str(proxy) == "proxy.example:3128"  # what messages show: no credentials


def test_proxy_credentials_are_the_bytes_their_escapes_spell() -> None:
    # caf%E9 is Latin-1: decoded as UTF-8 first it became U+FFFD, and a wrong password.
    proxy = parse_proxy_url("http://u:caf%E9@proxy:3128")
    assert proxy is not None
    assert proxy.authorization == "Basic " + base64.b64encode(b"u:caf\xe9").decode()


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("proxy:8080", "proxy", 8080),  # no scheme: http, as curl
        ("http://proxy", "proxy", DEFAULT_PROXY_PORT),  # no port: 1080, as curl
        ("HTTP://[::1]:3128/", "::1", 3128),
    ],
)
def test_proxy_url_defaults(text: str, host: str, port: int) -> None:
    proxy = parse_proxy_url(text)
    assert proxy is not None
    assert (proxy.host, proxy.port, proxy.authorization) == (host, port, None)
    assert str(proxy) == (f"[{host}]:{port}" if ":" in host else f"{host}:{port}")


def test_empty_proxy_url_means_none() -> None:
    assert parse_proxy_url("") is None
    assert parse_proxy_url("  ") is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("socks5://user:secret@h:1080", "socks5:// proxies are not supported"),
        ("https://user:secret@h:443", "https:// proxies are not supported"),
        ("http://user:secret@:8080", "has no host"),
        ("http://user:secret@h:99999", "invalid proxy URL"),
        ("http://user:ab/secret@h:3128", "invalid proxy URL"),  # a / in the password
        ("http://user:se/cret@h:3128", "invalid proxy URL"),  # ... quoted by the reason
    ],
)
def test_unusable_proxy_urls_are_usage_errors_without_the_password(text: str, words: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_proxy_url(text, "$https_proxy")
    message = str(info.value)
    assert words in message
    assert message.startswith("$https_proxy")
    assert "secret" not in message and "se/c" not in message and "'se'" not in message


def test_options_check_the_proxy_url() -> None:
    with pytest.raises(UsageError, match="--proxy 'ftp://h'"):
        Options(proxy="ftp://h")
    Options(proxy="")  # "no proxy"
    Options(proxy="http://u:p@127.0.0.1:3128")


# -- environment and no_proxy --------------------------------------------------------------


def chosen(
    env: dict[str, str], proxy: str | None = None, no_proxy: str | None = None, trust: bool = True
) -> dict[str, str | None]:
    """Which proxy each of an http and an https origin would use."""
    settings = proxy_settings(proxy, no_proxy, trust, environ=env)
    if settings is None:
        return {"http": None, "https": None}
    result = {}
    for scheme, port in (("http", 80), ("https", 443)):
        found = settings.for_origin(scheme, "files.example", port)
        result[scheme] = None if found is None else f"{found.source} {found}"
    return result


def test_scheme_variables_and_all_proxy() -> None:
    env = {"http_proxy": "h:1", "https_proxy": "s:2", "all_proxy": "a:3"}
    assert chosen(env) == {"http": "$http_proxy h:1", "https": "$https_proxy s:2"}
    assert chosen({"all_proxy": "a:3"}) == {"http": "$all_proxy a:3", "https": "$all_proxy a:3"}
    assert chosen({"https_proxy": "s:2"}) == {"http": None, "https": "$https_proxy s:2"}
    assert chosen({"http_proxy": "", "ALL_PROXY": "a:3"})["http"] == "$ALL_PROXY a:3"


def test_lower_case_wins_and_httpoxy_is_ignored() -> None:
    env = {"https_proxy": "low:1", "HTTPS_PROXY": "up:2", "HTTP_PROXY": "up:3"}
    assert chosen(env) == {"http": "$HTTP_PROXY up:3", "https": "$https_proxy low:1"}
    # Under CGI, HTTP_PROXY is the client's "Proxy:" header, never a proxy to use.
    assert chosen({**env, "REQUEST_METHOD": "GET"})["http"] is None


def test_explicit_proxy_wins_and_empty_means_none() -> None:
    env = {"http_proxy": "h:1", "https_proxy": "s:2"}
    both = "--proxy x:9"
    assert chosen(env, proxy="http://x:9") == {"http": both, "https": both}
    assert chosen(env, proxy="") == {"http": None, "https": None}
    assert chosen(env, trust=False) == {"http": None, "https": None}


def test_no_proxy_from_the_option_or_the_environment() -> None:
    env = {"all_proxy": "a:3", "NO_PROXY": "other.example"}
    assert chosen(env) == {"http": "$all_proxy a:3", "https": "$all_proxy a:3"}
    assert chosen({**env, "no_proxy": "files.example"}) == {"http": None, "https": None}
    assert chosen({**env, "no_proxy": "*"}) == {"http": None, "https": None}
    # The option replaces the variable, even when empty ("proxy everything").
    assert chosen({**env, "no_proxy": "*"}, no_proxy="")["http"] == "$all_proxy a:3"
    assert chosen({"all_proxy": "a:3"}, no_proxy=".example")["https"] is None
    # trust_env=False ignores $no_proxy along with the proxy variables.
    assert chosen({"no_proxy": "*"}, proxy="x:9", trust=False)["http"] == "--proxy x:9"


@pytest.mark.parametrize(
    ("rules", "host", "port", "direct"),
    [
        ("example.com", "example.com", 80, True),
        ("example.com", "www.example.com", 80, True),
        (".example.com", "example.com", 443, True),
        ("example.com.", "a.b.Example.COM.", 80, True),
        ("example.com", "notexample.com", 80, False),
        ("example.com", "example.com.org", 80, False),
        ("example.com:8080", "example.com", 8080, True),
        ("example.com:8080", "example.com", 80, False),
        ("a.test, b.test  c.test", "c.test", 80, True),
        ("127.0.0.1", "127.0.0.1", 8080, True),
        ("127.0.0.1", "localhost", 80, False),  # names are not resolved to match
        ("localhost", "127.0.0.1", 80, False),  # and loopback is not implied
        ("10.0.0.0/8", "10.200.3.4", 80, True),
        ("10.0.0.0/8", "11.0.0.1", 80, False),
        ("::1", "::1", 80, True),
        ("[::1]:8443", "::1", 8443, True),
        ("[::1]:8443", "::1", 443, False),
        ("fd00::/8", "fd12::1", 80, True),
        ("::/0", "127.0.0.1", 80, False),  # an IPv6 network never holds an IPv4 host
        ("*", "anything.example", 80, True),
        (" * ", "anything.example", 80, True),
        ("localhost,*", "anything.example", 80, False),  # "*" only alone, as curl
        ("foo *", "foo", 80, True),
        ("", "example.com", 80, False),
    ],
)
def test_no_proxy_matching(rules: str, host: str, port: int, direct: bool) -> None:
    assert NoProxy(rules).matches(host, port) is direct


def test_a_bad_proxy_variable_fails_only_the_rows_it_would_carry(
    monkeypatch: pytest.MonkeyPatch,
    nginx_server: ServedTree,
    nginx_tls_server: ServedTree,
    tls_files: TlsFiles,
    out_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A SOCKS proxy in the environment (set for other programs) stopped the
    # whole run with a usage error, even for http URLs an https_proxy never
    # carries, and even with no_proxy=* (which was read after the proxies).
    name = nginx_server.names[0]
    plain, secure = nginx_server.url(name), nginx_tls_server.url(name)
    ca = str(tls_files.ca_pem)
    monkeypatch.setenv("https_proxy", "socks5h://u:secret@127.0.0.1:1080")
    report = swarmget.download([plain, secure], out_dir / "a", cacert=ca)
    assert (report.ok, report.error_counts()) == (1, {"connect": 1})
    failure = report.failures[0]
    assert failure.url == secure and failure.attempts == 0  # no request: it could only fail
    assert failure.message is not None and "secret" not in failure.message
    assert failure.message.startswith("cannot use $https_proxy 'socks5h://***@127.0.0.1:1080'")
    assert "socks5h:// proxies are not supported" in failure.message
    assert "go direct with --proxy '' (proxy='' in Python)" in failure.message
    assert cli.main([secure, "-o", str(out_dir / "c"), "-q", "--cacert", ca]) == 1
    assert "secret" not in capsys.readouterr().err
    # no_proxy=* turns every proxy off before one is read; --proxy '' too.
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "*")
    assert swarmget.download([plain, secure], out_dir / "b", cacert=ca).ok == 2
    monkeypatch.delenv("NO_PROXY")
    assert swarmget.download([plain, secure], out_dir / "d", cacert=ca, proxy="").ok == 2
    # Given as an option it is still refused before the run.
    with pytest.raises(UsageError, match=r"--proxy 'socks5://"):
        swarmget.download([plain], out_dir / "e", proxy="socks5://127.0.0.1:9")


def test_a_407_says_whether_credentials_were_given() -> None:
    none = Proxy("127.0.0.1", 3128)
    given = Proxy("127.0.0.1", 3128, authorization="Basic dTpw")
    assert http_error(407, none).message.endswith("give user:password in the proxy URL)")
    assert http_error(407, given).message == (
        "HTTP 407 from proxy 127.0.0.1:3128 "
        "(Proxy Authentication Required: the proxy refused the user:password given)"
    )
    assert http_error(407).message == "HTTP 407"  # not through a proxy


def test_cli_help_documents_proxies(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in ("--proxy URL", "--no-proxy HOSTS", "$http_proxy", "$https_proxy", "$no_proxy"):
        assert words in text


# -- the CONNECT response parser -----------------------------------------------------------


def test_connect_response_stops_at_the_head() -> None:
    parser = ConnectResponseParser()
    head = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 Connection established\r\n"
    assert not parser.feed(memoryview(head))
    assert parser.feed(memoryview(b"Via: x\r\n\r\n"))
    assert parser.head is not None and parser.head.status == 200
    assert parser.extra == 0 and not parser.reusable


def test_connect_response_counts_tunnel_bytes_and_ignores_bodies() -> None:
    parser = ConnectResponseParser()
    assert parser.feed(memoryview(b"HTTP/1.0 200 OK\r\n\r\n\x16\x03\x01"))
    assert parser.extra == 3
    refused = ConnectResponseParser()
    assert refused.feed(memoryview(b"HTTP/1.1 407 No\r\nContent-Length: 5\r\n\r\nnope!"))
    assert refused.head is not None and refused.head.status == 407
    with pytest.raises(ConnectionClosed):
        ConnectResponseParser().feed_eof()


# -- through tinyproxy -----------------------------------------------------------------------


def test_http_files_go_through_the_proxy_byte_for_byte(
    nginx_server: ServedTree, tinyproxy: TinyProxy, out_dir: Path
) -> None:
    names = nginx_server.names[:300]
    report = swarmget.download(
        [nginx_server.url(name) for name in names],
        out_dir,
        proxy=tinyproxy.url,
        concurrency=16,
        per_host=8,
    )
    assert (report.total, report.failed) == (300, 0)
    for name in names:
        assert (out_dir / name).read_bytes() == nginx_server.expected(name), name
    # Absolute-form request lines, one per file: the proxy carried every one.
    expected = {f"GET {nginx_server.url(name)} HTTP/1.1" for name in names}
    requests = tinyproxy.requests()
    assert set(requests) == expected
    # tinyproxy drops each connection after one response (without saying so):
    # a request that met such a dropped connection is sent again, never twice more.
    assert len(requests) <= 2 * len(names)


def test_https_files_go_through_connect_tunnels(
    nginx_tls_server: ServedTree, tls_files: TlsFiles, tinyproxy: TinyProxy, out_dir: Path
) -> None:
    # tinyproxy relays a tunnel's small writes ~40 ms apart (curl sees the same),
    # so this stays at ~15 files per tunnel.
    names = nginx_tls_server.names[:120]
    report = swarmget.download(
        [nginx_tls_server.url(name) for name in names],
        out_dir,
        proxy=tinyproxy.url,
        cacert=str(tls_files.ca_pem),
        concurrency=16,
        per_host=8,
    )
    assert (report.total, report.failed) == (120, 0)
    for name in names:
        assert (out_dir / name).read_bytes() == nginx_tls_server.expected(name), name
    # Only tunnels went through the proxy, and each carried many requests.
    requests = tinyproxy.requests()
    assert set(requests) == {f"CONNECT 127.0.0.1:{nginx_tls_server.port} HTTP/1.1"}
    assert 1 <= len(requests) <= 8


def test_proxy_basic_auth(
    nginx_server: ServedTree,
    nginx_tls_server: ServedTree,
    tls_files: TlsFiles,
    tinyproxy_bin: str,
    out_dir: Path,
) -> None:
    name = nginx_server.names[0]
    urls = [nginx_server.url(name), nginx_tls_server.url(name)]
    with TinyProxy(auth=("swarm", "s3-cr.t")) as proxy:
        port = proxy.port
        cases = {
            "right": proxy.url_with("swarm", "s3%2Dcr.t"),  # percent-decoded
            "wrong": proxy.url_with("swarm", "nope"),
            "none": f"http://127.0.0.1:{proxy.port}",
        }
        records = {}
        for case, url in cases.items():
            out = out_dir / case
            swarmget.download(urls, out, proxy=url, cacert=str(tls_files.ca_pem))
            records[case] = manifest(out)
    for record in records["right"].values():
        assert record["status"] == "ok"
    assert (out_dir / "right" / name).read_bytes() == nginx_server.expected(name)
    # No credentials: 407, naming the proxy and what to do.
    for url, record in records["none"].items():
        assert (record["status"], record["error"], record["http_status"]) == (
            "failed",
            "http_407",
            407,
        ), url
        assert record["attempts"] == 1  # not retried: other credentials are needed
        assert f"proxy 127.0.0.1:{port}" in record["message"]
        assert "Proxy Authentication Required" in record["message"]
    # Wrong credentials: tinyproxy answers 401 (not the 407 RFC 9110 asks for);
    # we report its status as it is.
    wrong = records["wrong"]
    assert {r["error"] for r in wrong.values()} == {"http_401"}
    assert {r["attempts"] for r in wrong.values()} == {1}
    assert f"proxy 127.0.0.1:{port} refused CONNECT" in wrong[urls[1]]["message"]
    for record in (*records["none"].values(), *wrong.values()):
        assert "s3" not in record["message"] and "nope" not in record["message"]


def test_a_refused_connect_is_the_proxys_status(
    nginx_tls_server: ServedTree, tls_files: TlsFiles, tinyproxy_bin: str, out_dir: Path
) -> None:
    url = nginx_tls_server.url(nginx_tls_server.names[0])
    with TinyProxy(connect_ports=[1]) as proxy:  # CONNECT only to port 1: ours gets 403
        swarmget.download([url], out_dir, proxy=proxy.url, cacert=str(tls_files.ca_pem))
    record = manifest(out_dir)[url]
    assert (record["error"], record["http_status"]) == ("http_403", 403)
    assert "refused CONNECT to 127.0.0.1:" in record["message"]


def test_proxy_variables_and_no_proxy(
    monkeypatch: pytest.MonkeyPatch,
    nginx_server: ServedTree,
    nginx_tls_server: ServedTree,
    tls_files: TlsFiles,
    tinyproxy: TinyProxy,
    out_dir: Path,
) -> None:
    name = nginx_server.names[1]
    http_url, https_url = nginx_server.url(name), nginx_tls_server.url(name)
    monkeypatch.setenv("http_proxy", tinyproxy.url)
    monkeypatch.setenv("HTTPS_PROXY", tinyproxy.url)
    cacert = str(tls_files.ca_pem)

    report = swarmget.download([http_url, https_url], out_dir / "a", cacert=cacert)
    assert report.failed == 0
    assert sorted(tinyproxy.requests()) == [
        f"CONNECT 127.0.0.1:{nginx_tls_server.port} HTTP/1.1",
        f"GET {http_url} HTTP/1.1",
    ]

    # no_proxy by host and port: the https origin goes direct, http still proxied.
    monkeypatch.setenv("no_proxy", f"example.com, 127.0.0.1:{nginx_tls_server.port}")
    report = swarmget.download([http_url, https_url], out_dir / "b", cacert=cacert)
    assert report.failed == 0
    assert len(tinyproxy.requests()) == 3
    assert tinyproxy.requests()[-1] == f"GET {http_url} HTTP/1.1"

    # The whole host, through the CLI: nothing reaches the proxy.
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    argv = [http_url, https_url, "-o", str(out_dir / "c"), "--cacert", cacert, "-q"]
    assert cli.main(argv) == 0
    # --no-proxy replaces $no_proxy ('' = proxy everything); trust_env=False ignores both.
    assert cli.main([http_url, "-o", str(out_dir / "d"), "--no-proxy", "", "-q"]) == 0
    swarmget.download([http_url], out_dir / "e", trust_env=False)
    assert len(tinyproxy.requests()) == 4
    for sub in "abcde":
        assert (out_dir / sub / name).read_bytes() == nginx_server.expected(name)


def test_cli_proxy_flag(
    nginx_server: ServedTree, tinyproxy: TinyProxy, out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = nginx_server.url(nginx_server.names[2])
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:1")  # the flag wins
    assert cli.main([url, "-o", str(out_dir), "--proxy", tinyproxy.url, "-q"]) == 0
    assert tinyproxy.requests() == [f"GET {url} HTTP/1.1"]
    assert cli.main([url, "-o", str(out_dir / "x"), "--proxy", "", "-q"]) == 0  # none
    assert len(tinyproxy.requests()) == 1


# -- proxies that fail ---------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# A proxy named by a host of two addresses (localhost: 127.0.0.1 and ::1) is
# raced for (net/eyeballs.py), and its failure said "connect failed" alone:
# the origin looked down, and nothing named the proxy.
@pytest.mark.parametrize("proxy_host", ["127.0.0.1", "localhost"])
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_unreachable_proxy_is_connect(scheme: str, proxy_host: str, out_dir: Path) -> None:
    port = closed_port()
    url = f"{scheme}://127.0.0.1:{closed_port()}/x"
    report = swarmget.download([url], out_dir, proxy=f"{proxy_host}:{port}", retries=1)
    assert report.failed == 1
    record = manifest(out_dir)[url]
    assert (record["error"], record["attempts"]) == ("connect", 2)  # retried like any connect
    assert f"connect to proxy {proxy_host}:{port} (--proxy) failed" in record["message"]


# A proxy whose name did not resolve failed its rows with "cannot resolve
# 'proxy.invalid'" alone, beside URLs of other hosts: nothing said it was the
# proxy's name (curl: "Could not resolve proxy").
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_proxy_name_that_does_not_resolve_is_named_as_the_proxys(
    scheme: str, out_dir: Path
) -> None:
    url = f"{scheme}://127.0.0.1:{closed_port()}/x"
    with nxdomain_server() as (server, _):
        report = swarmget.download(
            [url], out_dir, proxy="proxy.invalid:3128", dns_servers=(server,), retries=0
        )
    assert report.failed == 1
    record = manifest(out_dir)[url]
    assert record["error"] == "dns"
    assert record["message"].startswith("proxy proxy.invalid:3128 (--proxy): cannot resolve")


Script = Callable[[socket.socket], None]


class ScriptedProxy:
    """Runs ``script(conn)`` for each accepted connection, on its own thread."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.received: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> ScriptedProxy:
        self._spawn(self._accept_loop)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(5)
        self._listener.close()

    def _spawn(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self._spawn(lambda conn=conn: self._serve(conn))  # type: ignore[misc]

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            self.received.append(conn.recv(65536))
            self.script(conn)


def close_at_once(conn: socket.socket) -> None:
    pass


def half_a_head(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 Connection est")


def garbage(conn: socket.socket) -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")


def tunnel_with_junk(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\nhello")


def bad_gateway(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")


def tunnel_then_reset(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    conn.recv(65536)  # the ClientHello
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST


def silence(conn: socket.socket) -> None:
    conn.recv(1)  # until the client gives up


@pytest.mark.parametrize(
    ("script", "code", "words"),
    [
        (close_at_once, "connect", "closed the connection"),
        (half_a_head, "connect", "closed inside the response head"),
        (garbage, "protocol", "answered CONNECT: malformed response head"),
        (tunnel_with_junk, "protocol", "5 bytes after its CONNECT response"),
        (bad_gateway, "http_502", "refused CONNECT"),
        (
            tunnel_then_reset,
            "connect",
            "TLS handshake with files.example (through proxy 127.0.0.1:",
        ),
        (silence, "timeout", "connect through the proxy timed out"),
    ],
)
def test_misbehaving_proxy_during_connect(
    script: Script, code: str, words: str, out_dir: Path
) -> None:
    url = "https://files.example:8443/x"  # never resolved: only the proxy is dialled
    with ScriptedProxy(script) as proxy:
        report = swarmget.download([url], out_dir, proxy=proxy.url, retries=0, timeout=0.5)
    assert report.failed == 1
    record = manifest(out_dir)[url]
    assert record["error"] == code
    assert words in record["message"]
    request = proxy.received[0].decode()
    assert request.startswith("CONNECT files.example:8443 HTTP/1.1\r\nHost: files.example:8443\r\n")
    assert "Proxy-Authorization" not in request


def test_connect_names_an_ipv6_origin_without_its_zone() -> None:
    proxy = Proxy("proxy", 3128, None, "--proxy")
    request = connect_request("fe80::1%eth0", 443, proxy, "ua")
    assert request.startswith(b"CONNECT [fe80::1]:443 HTTP/1.1\r\nHost: [fe80::1]:443\r\n")


def test_an_empty_user_agent_is_no_user_agent_in_a_connect_either() -> None:
    # user_agent="" sends none with the requests; the CONNECT sent "User-Agent: ".
    proxy = Proxy("proxy", 3128, None, "--proxy")
    request = connect_request("h.example", 443, proxy, "")
    assert request == b"CONNECT h.example:443 HTTP/1.1\r\nHost: h.example:443\r\n\r\n"


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_dead_proxy_is_given_up_for_every_origin_behind_it(scheme: str, out_dir: Path) -> None:
    # Counted per origin, 300 origins behind a black-holed proxy each paid
    # their own timeouts and retries (66 s for 1,000 rows): it was never given up.
    port = closed_port()
    urls = [f"{scheme}://origin{i}.example/x" for i in range(300)]
    report = swarmget.download(urls, out_dir, proxy=f"127.0.0.1:{port}", concurrency=32)
    assert report.failed == 300
    messages = [r["message"] for r in manifest(out_dir).values()]
    given_up = [m for m in messages if f"proxy 127.0.0.1:{port} given up" in m]
    assert len(given_up) > 200, messages[:3]
    # Once, with one count: the dials it cut short were counted against it
    # again, each giving it up anew ("given up after 5 ...; ... after 6 ...").
    assert all(m.count("given up") == 1 for m in given_up), [
        m for m in given_up if m.count("given up") > 1
    ][:3]


def test_rows_queued_behind_a_dead_proxy_say_they_were_not_requested(out_dir: Path) -> None:
    # As the rows queued on a dead host do: those of the origins behind a proxy
    # given up, never dialled, read "connect to proxy ... failed" at 0 attempts,
    # as if each had been tried.
    port = closed_port()
    urls = [f"http://origin{i}.example/x" for i in range(60)]
    report = swarmget.download(urls, out_dir, proxy=f"127.0.0.1:{port}", concurrency=8)
    assert report.failed == 60
    records = manifest(out_dir).values()
    unsent = [r["message"] for r in records if r["attempts"] == 0]
    assert len(unsent) > 30, [r["message"] for r in records][:3]
    said = f"not requested: connect to proxy 127.0.0.1:{port} (--proxy) failed"
    assert all(m.startswith(said) for m in unsent), unsent[:3]
    assert all(f"; proxy 127.0.0.1:{port} given up after 5 " in m for m in unsent), unsent[:3]
    assert not any("not retried" in m for m in unsent), unsent[:3]  # never tried at all
    tried = [r["message"] for r in records if r["attempts"]]
    assert not any("not requested" in m for m in tried), tried[:3]


def test_http_request_through_a_proxy_has_absolute_form_and_credentials(out_dir: Path) -> None:
    url = "http://files.example/a%20b?x=1"

    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    with ScriptedProxy(answer) as proxy:
        credentials = proxy.url.replace("http://", "http://me:pw@")
        report = swarmget.download([url], out_dir, proxy=credentials, retries=0)
    assert report.failed == 0
    request = proxy.received[0].decode()
    assert request.startswith("GET http://files.example/a%20b?x=1 HTTP/1.1\r\n")
    assert "\r\nHost: files.example\r\n" in request
    assert f"\r\nProxy-Authorization: Basic {base64.b64encode(b'me:pw').decode()}\r\n" in request


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_silent_proxy_is_cut_by_the_deadline_too(scheme: str, out_dir: Path) -> None:
    # Through a tunnel (https) the row waits in the CONNECT, which checked only
    # --timeout: it ran 12 s for a 4 s deadline, where plain http stopped at 4 s.
    url = f"{scheme}://files.example/x"
    with ScriptedProxy(silence) as proxy:
        started = time.monotonic()
        report = swarmget.download([url], out_dir, proxy=proxy.url, deadline=1, timeout=5)
        elapsed = time.monotonic() - started
    (failure,) = report.failures
    assert failure.error == "timeout"
    assert failure.message is not None and failure.message.startswith("deadline of 1s exceeded")
    assert elapsed < 2.5
