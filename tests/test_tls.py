"""HTTPS: real nginx over TLS, bad certificates, and TLS servers scripted in a thread.

The scripted servers are blocking ``ssl`` server sockets, one thread per
connection: enough to misbehave precisely (cut a body without close_notify,
drop a kept-alive connection) and far simpler than teaching the asyncio test
server TLS.  Every certificate comes from trustme, except the self-signed one,
which trustme cannot make (its leaves always have an issuing CA).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import gzip
import io
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trustme

import swarmget
from swarmget import cli
from swarmget.engine import core as engine_core
from swarmget.engine import https
from swarmget.engine.core import Engine
from swarmget.net import tls as tls_module
from swarmget.net.tls import INSECURE_WARNING
from swarmget.options import Options
from swarmget.sinks.base import Assignment
from swarmget.sinks.files import FileSink
from swarmget.testing.events import RecordedEvents
from swarmget.testing.nginx import Nginx, ServedTree, TlsFiles
from swarmget.testing.outputs import parts

Handler = Callable[[ssl.SSLSocket], None]
BODY = bytes(range(256)) * 64  # 16 KB: more than one TLS record's worth with the head


def manifest(out: Path) -> list[dict[str, Any]]:
    lines = (out / ".swarmget" / "manifest.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def assert_nothing_left(out: Path, name: str) -> None:
    assert not (out / name).exists()
    assert not parts(out)


# -- a scripted TLS server -------------------------------------------------------------


class TLSServer:
    """Runs ``handler(tls_socket)`` for each connection on its own thread."""

    def __init__(self, context: ssl.SSLContext, handler: Handler) -> None:
        self.context = context
        self.handler = handler
        self.accepted = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}/{path}"

    def __enter__(self) -> TLSServer:
        thread = threading.Thread(target=self._accept_loop, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(5)
        self._listener.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                raw, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            thread = threading.Thread(target=self._serve, args=(raw,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(5)
        try:
            with self.context.wrap_socket(raw, server_side=True) as tls:
                self.handler(tls)
        except OSError:
            pass  # the client refused our certificate, or hung up: both expected
        finally:
            raw.close()


def read_request(tls: ssl.SSLSocket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = tls.recv(4096)
        if not chunk:
            return b""
        data += chunk
    return data


def serve_keep_alive(tls: ssl.SSLSocket) -> None:
    """A well-behaved origin: BODY for every request, until the client hangs up."""
    while read_request(tls):
        tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)


def server_context(cert: trustme.LeafCert) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    return context


# -- certificates ----------------------------------------------------------------------


class Certs:
    """A trusted CA (``ca_pem``) and server contexts with one flaw each."""

    def __init__(self, directory: Path) -> None:
        self.ca = trustme.CA()
        self.ca_pem = directory / "trusted-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_pem))
        now = datetime.datetime.now(datetime.UTC)
        self.contexts: dict[str, ssl.SSLContext] = {
            "good": server_context(self.ca.issue_cert("127.0.0.1", "localhost")),
            "expired": server_context(
                self.ca.issue_cert(
                    "127.0.0.1",
                    not_before=now - datetime.timedelta(days=30),
                    not_after=now - datetime.timedelta(days=1),
                )
            ),
            "wrong_host": server_context(self.ca.issue_cert("other.example")),
            "unknown_ca": server_context(trustme.CA().issue_cert("127.0.0.1")),
            "self_signed": self_signed_context(directory),
        }


def self_signed_context(directory: Path) -> ssl.SSLContext:
    """A leaf for 127.0.0.1 signed by its own key (trustme only issues from a CA)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "self-signed.pem", directory / "self-signed.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_path, key_path)
    return context


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


# -- against nginx ---------------------------------------------------------------------


def test_600_files_byte_for_byte_over_https(
    nginx_tls_server: ServedTree, tls_files: TlsFiles, out_dir: Path
) -> None:
    names = nginx_tls_server.names[:600]
    urls = [nginx_tls_server.url(name) for name in names]
    report = swarmget.download(
        urls, out_dir, concurrency=50, per_host=50, cacert=str(tls_files.ca_pem)
    )
    assert (report.ok, report.failed) == (600, 0), report.error_counts()
    for name in names:
        assert (out_dir / name).read_bytes() == nginx_tls_server.expected(name), name
    assert {r["status"] for r in manifest(out_dir)} == {"ok"}


def test_the_system_store_alone_does_not_trust_a_private_ca(
    nginx_tls_server: ServedTree, out_dir: Path
) -> None:
    name = nginx_tls_server.names[0]
    report = swarmget.download([nginx_tls_server.url(name)], out_dir, retries=0)
    assert [f.error for f in report.failures] == ["tls_verify"]
    assert_nothing_left(out_dir, name)


def test_https_to_a_plain_http_port_is_a_tls_error(nginx_server: ServedTree, out_dir: Path) -> None:
    url = nginx_server.url(nginx_server.names[0]).replace("http://", "https://")
    report = swarmget.download([url], out_dir, retries=0)
    (failure,) = report.failures
    assert failure.error == "tls"
    assert failure.message is not None and "TLS handshake" in failure.message
    assert failure.message.endswith("wrong version number (is it an http:// server?)")


@pytest.mark.parametrize("version", ["TLSv1_2", "TLSv1_3"])
def test_reconnects_resume_the_tls_session(
    nginx_server: ServedTree, tls_files: TlsFiles, out_dir: Path, version: str
) -> None:
    # nginx answers /session/ANY with $ssl_session_reused ("r" or "."), and
    # "Connection: close" makes it end every connection after one response, so
    # each file after the first comes over a new, hopefully resumed, connection.
    location = 'location /session/ { default_type text/plain; return 200 "$ssl_session_reused"; }'
    with Nginx(nginx_server.root, ssl=tls_files.server, extra_locations=location) as nginx:
        urls = [nginx.url(f"session/s{i}") for i in range(4)]
        options = Options(
            concurrency=1, cacert=str(tls_files.ca_pem), headers={"Connection": "close"}
        )
        events = run_engine(options, out_dir, urls, tls_version=ssl.TLSVersion[version])
    assert [r.status for r in events.results] == ["ok"] * 4
    assert [(out_dir / f"f{i}.bin").read_bytes() for i in range(4)] == [b".", b"r", b"r", b"r"]


def test_ssl_cert_file_replaces_the_system_store(
    nginx_tls_server: ServedTree, tls_files: TlsFiles, certs: Certs, tmp_path: Path
) -> None:
    # OpenSSL, not swarmget, reads these variables: this checks we let it.
    url = nginx_tls_server.url(nginx_tls_server.names[0])
    empty_dir = tmp_path / "no-certs"
    empty_dir.mkdir()

    def run(cert_file: Path, out: Path) -> tuple[int, list[dict[str, Any]]]:
        env = dict(os.environ, SSL_CERT_FILE=str(cert_file), SSL_CERT_DIR=str(empty_dir))
        argv = [sys.executable, "-m", "swarmget", url, "-o", str(out), "--quiet", "--retries", "0"]
        proc = subprocess.run(argv, env=env, capture_output=True, timeout=60)
        return proc.returncode, manifest(out)

    status, records = run(tls_files.ca_pem, tmp_path / "trusted")
    assert (status, records[0]["status"]) == (0, "ok")
    status, records = run(certs.ca_pem, tmp_path / "other-ca")
    assert (status, records[0]["error"]) == (1, "tls_verify")


# -- command line ----------------------------------------------------------------------


def test_cli_cacert_and_insecure(
    nginx_tls_server: ServedTree,
    tls_files: TlsFiles,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    urls = [nginx_tls_server.url(name) for name in nginx_tls_server.names[:3]]
    with_ca = [*urls, "-o", str(tmp_path / "a"), "--quiet", "--cacert", str(tls_files.ca_pem)]
    assert cli.main(with_ca) == 0
    assert capsys.readouterr().err == ""
    assert cli.main([*urls, "-o", str(tmp_path / "b"), "--quiet", "--insecure"]) == 0
    assert capsys.readouterr().err == INSECURE_WARNING  # one line, once per run
    missing = tmp_path / "missing.pem"
    assert cli.main([*urls, "-o", str(tmp_path / "c"), "--cacert", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("swarmget: error: --cacert") and err.count("\n") == 1


def test_a_cacert_that_is_not_pem_is_a_usage_error(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate\n")
    with pytest.raises(swarmget.UsageError, match="--cacert") as raised:
        swarmget.download([], tmp_path / "out", cacert=str(bogus))
    assert "_ssl.c" not in str(raised.value) and "[" not in str(raised.value)  # words only


# -- certificate verification ----------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("expired", "certificate has expired"),
        ("self_signed", "self"),  # "self-signed certificate" (OpenSSL 3) or "self signed"
        ("wrong_host", "mismatch"),  # "IP address mismatch, certificate is not valid for ..."
        ("unknown_ca", "unable to get local issuer certificate"),
    ],
)
def test_bad_certificates_fail_with_tls_verify(
    certs: Certs, out_dir: Path, kind: str, reason: str
) -> None:
    with TLSServer(certs.contexts[kind], serve_keep_alive) as server:
        report = swarmget.download(
            [server.url("a.bin")], out_dir, cacert=str(certs.ca_pem), retries=0
        )
    (failure,) = report.failures
    assert failure.error == "tls_verify", failure.message
    assert failure.message is not None
    assert "127.0.0.1" in failure.message and reason in failure.message
    # What to do when the issuer is not trusted; nothing to add to the others.
    hint = "a private CA is trusted with --cacert FILE, or $SSL_CERT_FILE)"
    assert (hint in failure.message) is (kind in ("self_signed", "unknown_ca"))
    assert_nothing_left(out_dir, "a.bin")


@pytest.mark.parametrize("pinned", ["intermediate", "leaf"])
def test_a_cacert_may_be_an_intermediate_or_the_servers_own_certificate(
    tmp_path: Path, out_dir: Path, pinned: str
) -> None:
    """The chain may end at whatever certificate the user trusts, as curl lets it."""
    root = trustme.CA()
    intermediate = root.create_child_ca()
    leaf = intermediate.issue_cert("127.0.0.1")
    trusted = tmp_path / f"{pinned}.pem"
    if pinned == "intermediate":
        intermediate.cert_pem.write_to_path(str(trusted))
    else:
        leaf.cert_chain_pems[0].write_to_path(str(trusted))
    with TLSServer(server_context(leaf), serve_keep_alive) as server:
        report = swarmget.download([server.url("a.bin")], out_dir, cacert=str(trusted), retries=0)
        other = swarmget.download(  # trusting the root of another chain still verifies
            [server.url("b.bin")], out_dir, cacert=str(trusted_root(tmp_path)), retries=0
        )
    assert (report.ok, report.failed) == (1, 0), report.failures
    assert (out_dir / "a.bin").read_bytes() == BODY
    assert [f.error for f in other.failures] == ["tls_verify"]


def test_a_chain_without_its_intermediate_says_the_server_may_have_left_it_out(
    tmp_path: Path, out_dir: Path
) -> None:
    # The common misconfiguration of servers with a public CA; the hint told only
    # of --cacert, which the user trusting the root had already given.
    root = trustme.CA()
    leaf = root.create_child_ca().issue_cert("127.0.0.1")
    root_pem, leaf_pem = tmp_path / "root.pem", tmp_path / "leaf-only.pem"
    root.cert_pem.write_to_path(str(root_pem))
    leaf_pem.write_bytes(leaf.private_key_pem.bytes() + leaf.cert_chain_pems[0].bytes())
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(leaf_pem))  # the leaf alone, no intermediate after it
    with TLSServer(context, serve_keep_alive) as server:
        report = swarmget.download([server.url("a.bin")], out_dir, cacert=str(root_pem))
    (failure,) = report.failures
    assert (failure.error, failure.attempts) == ("tls_verify", 1)
    assert failure.message == (
        "certificate verification failed for 127.0.0.1: unable to get local issuer certificate "
        "(the server may not send its intermediate CA certificate; "
        "a private CA is trusted with --cacert FILE, or $SSL_CERT_FILE)"
    )


def trusted_root(directory: Path) -> Path:
    path = directory / "unrelated-root.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return path


def test_a_fully_qualified_host_name_is_checked_and_sent_without_its_dot(
    certs: Certs, tmp_path: Path, out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 plain.test plain.test.\n")  # c-ares reads it literally
    monkeypatch.setenv("CARES_HOSTS", str(hosts))
    names: list[str | None] = []
    context = server_context(certs.ca.issue_cert("plain.test"))
    context.sni_callback = lambda sock, name, ctx: names.append(name)  # type: ignore[func-returns-value]
    with TLSServer(context, serve_keep_alive) as server:
        url = f"https://plain.test.:{server.port}/a.bin"
        report = swarmget.download([url], out_dir, cacert=str(certs.ca_pem), retries=0)
    assert (report.ok, report.failed) == (1, 0), report.failures
    assert names == ["plain.test"]


def test_a_slow_link_is_not_silence_while_a_record_is_still_coming(
    certs: Certs, out_dir: Path
) -> None:
    """Bytes of a record not yet whole are activity: a 16 KiB record over a
    ~10 KB/s link takes more than --timeout to complete, and it is no stall."""
    with (
        TLSServer(certs.contexts["good"], serve_keep_alive) as server,
        Throttle(server.port, piece=200, interval=0.02) as throttle,
    ):
        url = f"https://127.0.0.1:{throttle.port}/slow.bin"
        report = swarmget.download(
            [url], out_dir, cacert=str(certs.ca_pem), retries=0, timeout=0.5, min_speed=0
        )
    assert (report.ok, report.failed) == (1, 0), report.failures
    assert (out_dir / "slow.bin").read_bytes() == BODY


class Throttle:
    """A TCP relay to ``port`` that passes the server's bytes on ``piece`` at a time."""

    def __init__(self, port: int, *, piece: int, interval: float) -> None:
        self._target, self._piece, self._interval = port, piece, interval
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]

    def __enter__(self) -> Throttle:
        threading.Thread(target=self._relay, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()

    def _relay(self) -> None:
        with contextlib.suppress(OSError):
            client, _ = self._listener.accept()
            upstream = socket.create_connection(("127.0.0.1", self._target))
            threading.Thread(target=self._pass_up, args=(client, upstream), daemon=True).start()
            with client, upstream:
                while data := upstream.recv(self._piece):
                    client.sendall(data)
                    time.sleep(self._interval)

    @staticmethod
    def _pass_up(client: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                upstream.sendall(data)


@pytest.mark.parametrize("kind", ["expired", "self_signed", "wrong_host", "unknown_ca"])
def test_insecure_accepts_any_certificate_and_warns_once(
    certs: Certs, out_dir: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with TLSServer(certs.contexts[kind], serve_keep_alive) as server:
        urls = [server.url(f"f{i}.bin") for i in range(3)]
        report = swarmget.download(urls, out_dir, insecure=True, concurrency=2)
    assert (report.ok, report.failed) == (3, 0)
    assert all((out_dir / f"f{i}.bin").read_bytes() == BODY for i in range(3))
    assert capsys.readouterr().err == INSECURE_WARNING


# -- hostile TLS servers ---------------------------------------------------------------


def _cut_body(framing: str, close_notify: bool) -> Handler:
    def handler(tls: ssl.SSLSocket) -> None:
        read_request(tls)
        length = b"Content-Length: %d\r\n" % len(BODY) if framing == "length" else b""
        tls.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n" + length + b"\r\n")
        tls.sendall(BODY[: len(BODY) // 2])
        if close_notify:
            tls.unwrap()  # raises once the client hangs up without answering: fine
        # else: the socket closes under TLS, with no close_notify at all

    return handler


@pytest.mark.parametrize(
    ("framing", "close_notify"),
    [("until-close", False), ("length", False), ("length", True)],
    ids=["close-delimited-without-close_notify", "length-without-close_notify", "length-cut"],
)
def test_a_body_cut_short_is_truncated(
    certs: Certs, out_dir: Path, framing: str, close_notify: bool
) -> None:
    with TLSServer(certs.contexts["good"], _cut_body(framing, close_notify)) as server:
        report = swarmget.download(
            [server.url("cut.bin")], out_dir, cacert=str(certs.ca_pem), retries=0
        )
    (failure,) = report.failures
    assert failure.error == "truncated", failure.message
    if framing == "length":  # how much of how much, as over plain HTTP
        assert f"{len(BODY) // 2} of {len(BODY)} body bytes" in failure.message
    assert_nothing_left(out_dir, "cut.bin")


@pytest.mark.parametrize("reader", ["fast", "public"])
def test_truncation_is_seen_through_either_record_reader(
    certs: Certs, out_dir: Path, monkeypatch: pytest.MonkeyPatch, reader: str
) -> None:
    # The fast reader calls the private SSLObject._sslobj; the public fallback
    # must see the ragged EOF (a TCP close without close_notify) just the same.
    if reader == "public":
        monkeypatch.setattr(https, "record_reader", tls_module.public_record_reader)
    with TLSServer(certs.contexts["good"], _cut_body("until-close", False)) as server:
        report = swarmget.download(
            [server.url("cut.bin")], out_dir, cacert=str(certs.ca_pem), retries=0
        )
    assert [f.error for f in report.failures] == ["truncated"]


def test_a_server_that_wants_a_client_certificate_says_so(
    certs: Certs, out_dir: Path, tmp_path: Path
) -> None:
    # TLS 1.3's "certificate required" alert alone left the user to guess.
    context = server_context(certs.ca.issue_cert("127.0.0.1"))
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=str(certs.ca_pem))

    def refuse(listener: socket.socket) -> None:
        raw, _ = listener.accept()
        with raw, context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False) as tls:
            with contextlib.suppress(ssl.SSLError):
                tls.do_handshake()  # fails, sending the alert
            # Open a moment more: a close at once could reset the connection
            # before the client read the alert (a "connect" error, not this).
            time.sleep(0.5)

    with socket.create_server(("127.0.0.1", 0)) as listener:
        thread = threading.Thread(target=refuse, args=(listener,), daemon=True)
        thread.start()
        url = f"https://127.0.0.1:{listener.getsockname()[1]}/mtls.bin"
        report = swarmget.download([url], out_dir, cacert=str(certs.ca_pem), retries=0)
        thread.join(5)
    (failure,) = report.failures
    assert failure.error == "tls"
    assert (failure.message or "").endswith(
        "tlsv13 alert certificate required "
        "(the server wants a client certificate, which swarmget does not send)"
    ), failure.message


def test_a_server_that_speaks_only_tls_1_0_and_1_1_says_so(certs: Certs, out_dir: Path) -> None:
    # Its "tlsv1 alert protocol version" alone left the user to guess which side was old.
    context = server_context(certs.ca.issue_cert("127.0.0.1"))
    context.set_ciphers("DEFAULT:@SECLEVEL=0")  # OpenSSL 3 refuses TLS 1.0/1.1 above it
    context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TLSv1_1 is, that is the point
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    with TLSServer(context, serve_keep_alive) as server:
        report = swarmget.download([server.url("old.bin")], out_dir, cacert=str(certs.ca_pem))
    (failure,) = report.failures
    assert (failure.error, failure.attempts) == ("tls", 1)  # the same again: not retried
    assert failure.message == (
        "TLS handshake with 127.0.0.1 failed: tlsv1 alert protocol version "
        "(the server speaks no TLS version swarmget accepts: it needs TLS 1.2 or later)"
    )


def _handshake_error_message(reason: str, text: str) -> str:
    """The message of the error OpenSSL's ``reason`` in a handshake with h.test becomes."""
    exc = ssl.SSLError(1, f"[SSL: {reason}] {text} (_ssl.c:1000)")
    exc.reason = reason
    return tls_module.tls_error(exc, "h.test", handshake=True).message


def test_a_server_hello_of_an_old_version_is_said_to_be_one() -> None:
    # What OpenSSL says when the server answers with TLS 1.0 instead of an alert.
    assert _handshake_error_message("UNSUPPORTED_PROTOCOL", "unsupported protocol") == (
        "TLS handshake with h.test failed: unsupported protocol "
        "(the server speaks no TLS version swarmget accepts: it needs TLS 1.2 or later)"
    )


def test_a_tls_alert_in_answer_to_a_plain_http_request_says_so(out_dir: Path) -> None:
    # A TLS server behind an http:// URL that refuses our plain request with an
    # alert record: "not an HTTP/1.x reply: b'\\x15\\x03...'" named no cause.
    def answer(listener: socket.socket) -> None:
        raw, _ = listener.accept()
        with raw:
            raw.recv(4096)  # GET /x HTTP/1.1 ...
            raw.sendall(b"\x15\x03\x01\x00\x02\x02\x0a")  # fatal alert: unexpected_message
            time.sleep(0.2)

    with socket.create_server(("127.0.0.1", 0)) as listener:
        thread = threading.Thread(target=answer, args=(listener,), daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/x"
        report = swarmget.download([url], out_dir, retries=0)
        thread.join(5)
    (failure,) = report.failures
    assert failure.error == "protocol"
    assert (failure.message or "").startswith(
        "the server answered in TLS, not plain HTTP (is it an https:// server?)"
    ), failure.message


def test_a_close_delimited_body_ended_by_close_notify_is_whole(certs: Certs, out_dir: Path) -> None:
    def handler(tls: ssl.SSLSocket) -> None:
        read_request(tls)
        tls.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY)
        tls.unwrap()

    with TLSServer(certs.contexts["good"], handler) as server:
        report = swarmget.download([server.url("whole.bin")], out_dir, cacert=str(certs.ca_pem))
    assert (report.ok, report.failed) == (1, 0)
    assert (out_dir / "whole.bin").read_bytes() == BODY


@pytest.mark.parametrize("whole", [True, False])
def test_a_gzip_coded_body_is_whole_without_close_notify_once_its_stream_ends(
    certs: Certs, out_dir: Path, whole: bool
) -> None:
    # Transfer-Encoding: gzip, ended by the connection, no close_notify: the
    # gzip trailer (CRC, length) proves the body whole, and curl saves it; it
    # was `truncated`, retried and lost.  A gzip stream cut short still is.
    coded = gzip.compress(BODY)
    sent = coded if whole else coded[: len(coded) // 2]

    def handler(tls: ssl.SSLSocket) -> None:
        read_request(tls)
        tls.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nConnection: close\r\n\r\n")
        tls.sendall(sent)  # then the socket closes under TLS: no close_notify

    with TLSServer(certs.contexts["good"], handler) as server:
        report = swarmget.download(
            [server.url("coded.bin")], out_dir, cacert=str(certs.ca_pem), retries=0
        )
    if whole:
        assert (report.ok, report.failed) == (1, 0), report.failures
        assert (out_dir / "coded.bin").read_bytes() == BODY
    else:
        assert [f.error for f in report.failures] == ["truncated"]


def test_a_dropped_keep_alive_connection_is_retried_on_a_fresh_one(
    certs: Certs, out_dir: Path
) -> None:
    # One response per connection, then the next request is met with a bare TCP
    # close (as when a server times the connection out just as we reuse it).
    def handler(tls: ssl.SSLSocket) -> None:
        read_request(tls)
        tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
        read_request(tls)

    with TLSServer(certs.contexts["good"], handler) as server:
        urls = [server.url(f"k{i}.bin") for i in range(3)]
        report = swarmget.download(
            urls, out_dir, cacert=str(certs.ca_pem), concurrency=1, retries=0
        )
        accepted = server.accepted
    assert (report.ok, report.failed) == (3, 0), report.error_counts()
    assert accepted == 3
    assert [r["attempts"] for r in manifest(out_dir)] == [1, 1, 1]


def handshake_cutter(listener: socket.socket, context: ssl.SSLContext, cut: int) -> list[int]:
    """Serve ``listener`` on a thread: reset the first ``cut`` connections' handshakes
    (the ClientHello read, then an RST), do the next ones properly and answer
    "ok".  The returned list grows by one per connection accepted."""
    accepted: list[int] = []

    def serve() -> None:
        listener.settimeout(2)
        with contextlib.suppress(OSError):
            while True:
                raw, _ = listener.accept()
                accepted.append(1)
                if len(accepted) <= cut:
                    raw.recv(4096)  # the ClientHello
                    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    raw.close()  # RST
                    continue
                raw.settimeout(5)
                with context.wrap_socket(raw, server_side=True) as tls:
                    read_request(tls)
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    threading.Thread(target=serve, daemon=True).start()
    return accepted


def test_a_server_that_hangs_up_during_the_handshake_is_a_connect_error(out_dir: Path) -> None:
    """A close without an alert is the transport ending, not TLS refusing: ``connect``."""

    def hang_up() -> None:
        raw, _ = listener.accept()
        raw.recv(4096)  # the ClientHello
        raw.close()

    with socket.create_server(("127.0.0.1", 0)) as listener:
        thread = threading.Thread(target=hang_up, daemon=True)
        thread.start()
        port = listener.getsockname()[1]
        report = swarmget.download([f"https://127.0.0.1:{port}/x"], out_dir, retries=0)
        thread.join(5)
    (failure,) = report.failures
    assert failure.error == "connect"
    assert failure.message is not None and "handshake" in failure.message
    assert "closed by the server" in failure.message


def hang_up_at_the_hello(
    how: str, context: ssl.SSLContext | None = None
) -> Callable[[socket.socket], None]:
    """A server that reads the ClientHello, then closes (a FIN), resets (an RST)
    or sits on the connection ("sit", as a plain-HTTP server waiting for the end
    of a request line does); with ``context``, a TLS server that sends its
    ServerHello first."""

    def serve(listener: socket.socket) -> None:
        listener.settimeout(5)
        with contextlib.suppress(OSError), contextlib.ExitStack() as kept:
            while True:
                raw, _ = listener.accept()
                hello = raw.recv(4096)
                if context is not None:
                    raw.sendall(server_hello(context, hello))
                    time.sleep(0.05)  # read before the end comes
                if how == "sit":
                    kept.enter_context(raw)  # closed when the listener is
                    continue
                if how == "reset":
                    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                raw.close()

    return serve


def server_hello(context: ssl.SSLContext, client_hello: bytes) -> bytes:
    """The first record ``context`` answers ``client_hello`` with (its ServerHello),
    the rest of its handshake withheld."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = context.wrap_bio(incoming, outgoing, server_side=True)
    incoming.write(client_hello)
    with contextlib.suppress(ssl.SSLWantReadError):
        server.do_handshake()
    flight = outgoing.read()
    return flight[: 5 + int.from_bytes(flight[3:5], "big")]


def failure_from(
    serve: Callable[[socket.socket], None], out_dir: Path, **options: Any
) -> swarmget.FileResult:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        threading.Thread(target=serve, args=(listener,), daemon=True).start()
        port = listener.getsockname()[1]
        report = swarmget.download([f"https://127.0.0.1:{port}/x"], out_dir, retries=1, **options)
    (failure,) = report.failures
    return failure


NOT_TLS_HINT = "before any TLS reply (is it an http:// server, or not TLS on that port?)"


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_server_that_ends_the_connection_at_our_hello_may_not_speak_tls(
    how: str, out_dir: Path
) -> None:
    # A plain-HTTP server given an https:// URL may close on the ClientHello it
    # cannot read: retried as a lost handshake, the row said only that the
    # server had closed it, nothing of why that was likely.
    failure = failure_from(hang_up_at_the_hello(how), out_dir)
    assert (failure.error, failure.attempts) == ("connect", 2)  # still retried as a lost one
    assert failure.message is not None and failure.message.endswith(NOT_TLS_HINT)
    assert ("closed by the server" if how == "close" else "reset by") in failure.message


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_tls_server_that_ends_the_handshake_is_not_said_to_be_plain_http(
    how: str, certs: Certs, out_dir: Path
) -> None:
    failure = failure_from(hang_up_at_the_hello(how, certs.contexts["good"]), out_dir)
    assert (failure.error, failure.attempts) == ("connect", 2)
    assert failure.message is not None and "handshake" in failure.message
    assert "http://" not in failure.message and "TLS reply" not in failure.message


def test_a_server_that_sits_on_our_hello_may_not_speak_tls(out_dir: Path) -> None:
    # A plain-HTTP server reading our ClientHello as the start of a request
    # line waits for its end: the handshake times out, and said no more than that.
    failure = failure_from(hang_up_at_the_hello("sit"), out_dir, timeout=0.5)
    assert failure.error == "timeout"
    assert failure.message == (
        "connect and TLS handshake timed out after 0.5s, no TLS reply "
        "(is it an http:// server, or not TLS on that port?)"
    )


def test_a_tls_server_that_stalls_after_its_hello_is_not_said_to_be_plain_http(
    certs: Certs, out_dir: Path
) -> None:
    serve = hang_up_at_the_hello("sit", certs.contexts["good"])
    failure = failure_from(serve, out_dir, timeout=0.5)
    assert failure.error == "timeout"
    assert failure.message == "connect and TLS handshake timed out after 0.5s"


# The start of a real TLS 1.2 ServerHello record: a handshake record of TLS 1.x.
SERVER_HELLO_START = b"\x16\x03\x03\x00\x7a\x02\x00\x00\x76\x03"


def answer_the_hello(
    reply: bytes, *, pace: float = 0.0, then: str
) -> Callable[[socket.socket], None]:
    """A server that reads the ClientHello, answers with ``reply`` (a byte every
    ``pace`` seconds when given), then closes ("close") or sits ("sit")."""

    def answer(raw: socket.socket) -> None:
        with raw, contextlib.suppress(OSError):
            raw.recv(4096)  # the ClientHello
            # Not at once: this thread may run while the client's handshake call
            # is between writing its hello and reading, and the client peeks at
            # what comes back only on a readable event (a remote server's reply
            # takes a round trip to come).
            time.sleep(0.05)
            for piece in [reply[i : i + 1] for i in range(len(reply))] if pace else [reply]:
                raw.sendall(piece)
                time.sleep(pace)
            time.sleep(0.05 if then == "close" else 5)

    def serve(listener: socket.socket) -> None:
        listener.settimeout(5)
        with contextlib.suppress(OSError):
            while True:
                raw, _ = listener.accept()
                threading.Thread(target=answer, args=(raw,), daemon=True).start()

    return serve


@pytest.mark.parametrize("public_api", [False, True], ids=["_ssl", "ssl.SSLSocket"])
@pytest.mark.parametrize(
    ("serve", "message"),
    [
        (answer_the_hello(SERVER_HELLO_START, then="close"), "closed by the server"),
        (answer_the_hello(b"\x15\x03", then="close"), "closed by the server"),
        (
            answer_the_hello(SERVER_HELLO_START, pace=0.2, then="sit"),
            "connect and TLS handshake timed out after 1s",
        ),
    ],
    ids=["cut-server-hello", "cut-alert", "server-hello-a-byte-at-a-time"],
)
def test_a_server_whose_reply_begins_a_tls_record_is_not_said_to_be_plain_http(
    serve: Callable[[socket.socket], None], message: str, public_api: bool, out_dir: Path
) -> None:
    # The hint went by "no cipher yet", as true of a handshake cut or timed
    # out halfway as of a server that never said a TLS word.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        threading.Thread(target=serve, args=(listener,), daemon=True).start()
        url = f"https://127.0.0.1:{listener.getsockname()[1]}/x"
        events = run_engine(Options(retries=0, timeout=1), out_dir, [url], public_api=public_api)
    (result,) = events.results
    assert result.message is not None and message in result.message
    assert "TLS reply" not in result.message and "http://" not in result.message


def test_a_reply_that_begins_no_tls_record_gets_the_hint(out_dir: Path) -> None:
    failure = failure_from(answer_the_hello(b"H", then="sit"), out_dir, timeout=0.5)
    assert failure.message == (
        "connect and TLS handshake timed out after 0.5s, no TLS reply "
        "(is it an http:// server, or not TLS on that port?)"
    )


def test_openssl_3_2s_name_for_a_reply_that_is_not_tls_gets_the_hint_too() -> None:
    # OpenSSL 3.2 and later report "wrong version number" wrapped in a "record
    # layer failure" (the last error, the one Python shows).
    assert _handshake_error_message("RECORD_LAYER_FAILURE", "record layer failure") == (
        "TLS handshake with h.test failed: record layer failure (is it an http:// server?)"
    )


def test_a_handshake_reset_once_is_retried(certs: Certs, out_dir: Path) -> None:
    """Loaded servers and middleboxes reset handshakes now and then (aria2c
    retries them): the second attempt gets the file."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        accepted = handshake_cutter(listener, certs.contexts["good"], cut=1)
        port = listener.getsockname()[1]
        report = swarmget.download(
            [f"https://127.0.0.1:{port}/x"], out_dir, retries=2, cacert=str(certs.ca_pem)
        )
    assert (report.ok, report.failed) == (1, 0), report.error_counts()
    assert (out_dir / "x").read_bytes() == b"ok"
    assert [row["attempts"] for row in manifest(out_dir)] == [2]
    assert len(accepted) == 2


def test_a_server_that_resets_every_handshake_fails_after_the_retries(
    certs: Certs, out_dir: Path
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        accepted = handshake_cutter(listener, certs.contexts["good"], cut=1000)
        port = listener.getsockname()[1]
        report = swarmget.download(
            [f"https://127.0.0.1:{port}/x"], out_dir, retries=2, cacert=str(certs.ca_pem)
        )
    (failure,) = report.failures
    assert failure.error == "connect", failure.message
    assert failure.message is not None and "TLS handshake" in failure.message
    assert "reset by the server" in failure.message
    assert [row["attempts"] for row in manifest(out_dir)] == [3]
    assert len(accepted) == 3


def test_a_host_that_resets_every_handshake_is_given_up(certs: Certs, out_dir: Path) -> None:
    """Retried resets must not cost every row its retries: after --host-failures
    of them in a row (a burst of parallel ones counting once) the host is given up."""
    urls_count = 60
    with socket.create_server(("127.0.0.1", 0), backlog=128) as listener:
        accepted = handshake_cutter(listener, certs.contexts["good"], cut=10**6)
        port = listener.getsockname()[1]
        report = swarmget.download(
            [f"https://127.0.0.1:{port}/{i}" for i in range(urls_count)],
            out_dir,
            retries=3,
            host_failures=3,
            per_host=4,
            cacert=str(certs.ca_pem),
        )
    assert report.failed == urls_count and report.error_counts() == {"connect": urls_count}
    given_up = [f for f in report.failures if f.message and "--host-failures" in f.message]
    assert given_up, [f.message for f in report.failures[:3]]
    assert len(accepted) < urls_count  # most rows never went out


def test_handshakes_under_way_when_their_host_is_given_up_fail_at_once(
    certs: Certs, out_dir: Path
) -> None:
    """The first handshake is reset and gives the host up (--host-failures 1); the
    others are still waiting on a server that never answers their ClientHello.
    They fail at once with the give-up, not after --timeout each, and every row
    says why it was not retried, the one that tipped it too."""
    held: list[socket.socket] = []

    def serve() -> None:
        listener.settimeout(2)
        with contextlib.suppress(OSError):
            while True:
                raw, _ = listener.accept()
                raw.recv(4096)  # the ClientHello
                if not held:
                    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    raw.close()  # RST
                held.append(raw)  # the others: never answered

    with socket.create_server(("127.0.0.1", 0), backlog=64) as listener:
        threading.Thread(target=serve, daemon=True).start()
        port = listener.getsockname()[1]
        started = time.monotonic()
        report = swarmget.download(
            [f"https://127.0.0.1:{port}/{i}" for i in range(8)],
            out_dir,
            workers=1,
            retries=3,
            host_failures=1,
            per_host=8,
            timeout=10,
            cacert=str(certs.ca_pem),
        )
        elapsed = time.monotonic() - started
        for raw in held:
            raw.close()
    assert report.failed == 8 and report.error_counts() == {"connect": 8}
    assert elapsed < 5, elapsed
    messages = [f.message or "" for f in report.failures]
    assert all("given up after 1 failed connection" in m for m in messages), messages
    assert any("reset by the server" in m and "; not retried: host" in m for m in messages)


def test_a_silent_handshake_times_out(out_dir: Path) -> None:
    # The kernel completes the TCP handshake from the backlog; nobody ever
    # answers the ClientHello.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        report = swarmget.download([f"https://127.0.0.1:{port}/x"], out_dir, retries=0, timeout=0.3)
    (failure,) = report.failures
    assert failure.error == "timeout"
    assert failure.message is not None and "TLS handshake" in failure.message


# -- the TLS layer over the socket (issue 15) ------------------------------------------


def run_engine(
    options: Options,
    out: Path,
    urls: list[str],
    *,
    public_api: bool = False,
    tls_version: ssl.TLSVersion | None = None,
) -> RecordedEvents:
    """Download ``urls`` with an Engine of our own (so tests can reach its ``tls``),
    optionally held to one TLS version."""
    events = RecordedEvents()
    engine = Engine(FileSink(out), options, events)
    engine.tls.public_api = public_api
    if tls_version is not None:
        context = engine.tls.context
        context.minimum_version = context.maximum_version = tls_version
    engine.add([Assignment(i, i, url, f"f{i}.bin") for i, url in enumerate(urls)])
    engine.close_input()
    try:
        engine.run()
    finally:
        engine.close()
    return events


@pytest.mark.parametrize("public_api", [False, True], ids=["_ssl", "ssl.SSLSocket"])
def test_either_way_of_wrapping_downloads_and_sees_truncation(
    certs: Certs, tmp_path: Path, public_api: bool
) -> None:
    # The C _SSLSocket is the fast way; SSLContext.wrap_socket the public fallback
    # (it takes over the descriptor).  Both must give whole files, and a ragged EOF.
    options = Options(concurrency=2, cacert=str(certs.ca_pem), retries=0)
    with TLSServer(certs.contexts["good"], serve_keep_alive) as server:
        urls = [server.url(f"f{i}.bin") for i in range(6)]
        events = run_engine(options, tmp_path / "ok", urls, public_api=public_api)
    assert [r.status for r in events.results] == ["ok"] * 6
    assert all((tmp_path / "ok" / f"f{i}.bin").read_bytes() == BODY for i in range(6))
    with TLSServer(certs.contexts["good"], _cut_body("length", False)) as server:
        events = run_engine(options, tmp_path / "cut", [server.url("cut")], public_api=public_api)
    assert [r.error for r in events.results] == ["truncated"]
    with TLSServer(certs.contexts["unknown_ca"], serve_keep_alive) as server:
        events = run_engine(options, tmp_path / "ca", [server.url("x")], public_api=public_api)
    assert [r.error for r in events.results] == ["tls_verify"]


def test_a_request_the_socket_cannot_take_at_once_goes_out_whole(
    certs: Certs, out_dir: Path
) -> None:
    # An 8 MB header to a server that reads nothing for a while: the TLS write
    # cannot finish at once (SSLWantWriteError) and must be repeated, with the
    # same bytes, as the socket drains.
    big = "x" * (8 << 20)

    def handler(tls: ssl.SSLSocket) -> None:
        time.sleep(0.5)
        data = b""
        while not data.endswith(b"\r\n\r\n"):
            chunk = tls.recv(1 << 20)
            if not chunk:
                return
            data += chunk
        ok = f"X-Big: {big}\r\n".encode() in data
        status = b"200 OK" if ok else b"400 Bad Request"
        tls.sendall(b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n" % (status, len(BODY)) + BODY)
        read_request(tls)

    with TLSServer(certs.contexts["good"], handler) as server:
        report = swarmget.download(
            [server.url("big.bin")],
            out_dir,
            cacert=str(certs.ca_pem),
            headers={"X-Big": big},
            retries=0,
        )
    assert (report.ok, report.failed) == (1, 0), report.error_counts()
    assert (out_dir / "big.bin").read_bytes() == BODY


def test_a_request_the_server_never_reads_is_said_to_be_unsent(certs: Certs, out_dir: Path) -> None:
    def handler(tls: ssl.SSLSocket) -> None:
        time.sleep(3)  # after the handshake: never a byte of the request read

    with TLSServer(certs.contexts["good"], handler) as server:
        report = swarmget.download(
            [server.url("big.bin")],
            out_dir,
            cacert=str(certs.ca_pem),
            headers={"X-Big": "a" * 8_000_000},
            timeout=1,
            retries=0,
        )
    (failure,) = report.failures
    assert failure.error == "timeout"
    assert failure.message == "the request could not be sent: the server read nothing for 1s"


def test_an_answer_before_the_whole_request_is_read_does_not_splice_the_next_one(
    certs: Certs, out_dir: Path
) -> None:
    # The server answers at the request line (RFC 9112 allows it) while most of
    # an 8 MB request is still to go.  The connection was reused: the next
    # request went into the middle of the first, OpenSSL carried on from the
    # first one's offset into its bytes, and row b was saved, as ok, with a's body.
    request_lines: list[bytes] = []

    def handler(tls: ssl.SSLSocket) -> None:
        with tls.makefile("rb") as reader:
            while line := reader.readline():
                request_lines.append(line)
                body = b"BODY-OF-" + line.split(b" ")[1]
                tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                while reader.readline(1 << 26) not in (b"\r\n", b""):
                    pass

    with TLSServer(certs.contexts["good"], handler) as server:
        report = swarmget.download(
            [server.url("big/a"), server.url("big/b")],
            out_dir,
            cacert=str(certs.ca_pem),
            headers={"X-Big": "x" * (8 << 20)},
            concurrency=1,
            per_host=1,
            timeout=5,
            retries=0,
        )
    assert report.ok == 2, report.failures
    assert (out_dir / "a").read_bytes() == b"BODY-OF-/big/a"
    assert (out_dir / "b").read_bytes() == b"BODY-OF-/big/b"
    assert request_lines == [b"GET /big/a HTTP/1.1\r\n", b"GET /big/b HTTP/1.1\r\n"]


def _server_ssl_pointer(tls: ssl.SSLSocket) -> tuple[Any, int]:
    """libssl through ctypes, and the server connection's ``SSL *`` (CPython's
    ``PySSLSocket``: the object header, a weak reference to the socket, then the
    ``SSL *``), checked against its context's ``SSL_CTX *``."""
    import _ssl
    import ctypes

    if sys.implementation.name != "cpython":
        pytest.skip("reads CPython's _ssl objects")
    try:
        lib = ctypes.CDLL(_ssl.__file__)
        lib.SSL_key_update.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.SSL_new_session_ticket.argtypes = [ctypes.c_void_p]
        lib.SSL_get_SSL_CTX.argtypes = [ctypes.c_void_p]
        lib.SSL_get_SSL_CTX.restype = ctypes.c_void_p
    except (OSError, AttributeError):
        pytest.skip("libssl's SSL_key_update / SSL_new_session_ticket are not reachable")
    head = object.__basicsize__
    ssl_ptr = ctypes.c_void_p.from_address(id(tls._sslobj) + head + ctypes.sizeof(ctypes.c_void_p))
    ctx_ptr = ctypes.c_void_p.from_address(id(tls.context) + head)
    assert ssl_ptr.value and lib.SSL_get_SSL_CTX(ssl_ptr.value) == ctx_ptr.value
    return lib, ssl_ptr.value


def test_an_idle_connection_outlives_a_key_update_and_a_new_ticket(
    certs: Certs, out_dir: Path
) -> None:
    # TLS 1.3 records without data -- a KeyUpdate that asks for ours in return,
    # a NewSessionTicket -- reach a connection idle in the pool: it must stay
    # (and answer the key update), not be taken for a server hanging up.
    sent = threading.Event()

    def handler(tls: ssl.SSLSocket) -> None:
        assert tls.version() == "TLSv1.3"
        lib, ssl_ptr = _server_ssl_pointer(tls)
        read_request(tls)
        tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
        time.sleep(0.2)  # the client's connection is idle in its pool by now
        assert lib.SSL_new_session_ticket(ssl_ptr) == 1
        tls.do_handshake()  # sends it
        assert lib.SSL_key_update(ssl_ptr, 1) == 1  # SSL_KEY_UPDATE_REQUESTED
        tls.do_handshake()
        sent.set()
        serve_keep_alive(tls)

    options = Options(concurrency=1, cacert=str(certs.ca_pem), retries=0)
    events = RecordedEvents()
    engine = Engine(FileSink(out_dir), options, events)
    with TLSServer(certs.contexts["good"], handler) as server:
        try:
            engine.add([Assignment(0, 0, server.url("a"), "a")])
            while not events.results:
                engine.step(0.05)
            deadline = time.monotonic() + 5
            while not sent.is_set() and time.monotonic() < deadline:
                engine.step(0.05)
            for _ in range(10):  # let the loop see the records while the connection idles
                engine.step(0.02)
            assert sent.is_set()
            engine.add([Assignment(1, 1, server.url("b"), "b")])
            engine.close_input()
            engine.run()
        finally:
            engine.close()
        accepted = server.accepted
    assert [r.status for r in events.results] == ["ok", "ok"]
    assert (out_dir / "b").read_bytes() == BODY
    assert accepted == 1  # the second file came over the same connection


def test_a_server_that_renegotiates_mid_response_is_read_as_curl_reads_it(
    certs: Certs, out_dir: Path
) -> None:
    # TLS 1.2 servers may renegotiate in the middle of a reply (per-directory
    # client certificates, IIS): we refused it, the server failed the
    # handshake, and the row failed with "tls" where curl and wget read it.
    context = server_context(certs.ca.issue_cert("127.0.0.1"))
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    renegotiated = threading.Event()

    def handler(tls: ssl.SSLSocket) -> None:
        lib, ssl_ptr = _server_ssl_pointer(tls)
        lib.SSL_renegotiate.argtypes = [ctypes.c_void_p]
        lib.SSL_renegotiate_pending.argtypes = [ctypes.c_void_p]
        read_request(tls)
        tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY[:100])
        assert lib.SSL_renegotiate(ssl_ptr) == 1
        tls.do_handshake()  # the HelloRequest; the rest comes with the client's reads
        tls.settimeout(0.1)
        for _ in range(50):  # reads drive our side of the handshake; no data comes
            if not lib.SSL_renegotiate_pending(ssl_ptr):
                break
            try:
                tls.recv(1)
            except TimeoutError:
                continue
            except OSError:  # refused: the handshake failed
                break
        if lib.SSL_renegotiate_pending(ssl_ptr):
            tls.close()  # refused: the reply ends here, cut short
            return
        renegotiated.set()
        tls.sendall(BODY[100:])
        serve_keep_alive(tls)

    with TLSServer(context, handler) as server:
        report = swarmget.download(
            [server.url("r")], out_dir, cacert=str(certs.ca_pem), retries=0, timeout=5
        )
    assert report.ok == 1, [(f.error, f.message) for f in report.failures]
    assert renegotiated.is_set() and (out_dir / "r").read_bytes() == BODY


def test_kernel_tls_is_asked_for_where_python_offers_it() -> None:
    context = tls_module.client_context()
    ktls = getattr(ssl, "OP_ENABLE_KTLS", None)
    if ktls is None:  # Python 3.11: nothing to ask with, user space it is
        assert context.options & 8 == 0  # OpenSSL's SSL_OP_ENABLE_KTLS bit untouched
    else:
        assert context.options & ktls


# -- read-ahead (net/openssl.py) ---------------------------------------------------------------


def test_read_ahead_is_set_where_openssl_is_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    import _ssl
    import ctypes

    if sys.implementation.name != "cpython" or sys.platform == "win32":
        pytest.skip("read-ahead is set only on CPython on POSIX")
    lib = ctypes.CDLL(_ssl.__file__)
    lib.SSL_CTX_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
    lib.SSL_CTX_ctrl.restype = ctypes.c_long

    def settings(channel: tls_module.ClientTLS) -> tuple[int, int]:
        address = id(channel.context) + object.__basicsize__
        pointer = ctypes.c_void_p.from_address(address).value
        read_ahead = lib.SSL_CTX_ctrl(pointer, 40, 0, None)  # SSL_CTRL_GET_READ_AHEAD
        return read_ahead, lib.SSL_CTX_ctrl(pointer, 33, 0, None) & 0x10  # RELEASE_BUFFERS

    on = tls_module.ClientTLS()
    assert settings(on) == (1, 0x10) and on.read_ahead
    monkeypatch.setenv("SWARMGET_NO_READ_AHEAD", "1")
    off = tls_module.ClientTLS()
    assert settings(off) == (0, 0x10) and not off.read_ahead  # CPython releases buffers


@pytest.fixture(params=[True, False], ids=["read-ahead", "no-read-ahead"])
def read_ahead(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Each test that takes it runs with OpenSSL reading ahead, and without."""
    if not request.param:
        monkeypatch.setenv("SWARMGET_NO_READ_AHEAD", "1")
    return bool(request.param)


def _big_then_small(size: int) -> Handler:
    big = bytes(range(256)) * (size // 256)

    def handler(tls: ssl.SSLSocket) -> None:
        while request := read_request(tls):
            body = big if b"/big" in request else BODY
            tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    return handler


def test_a_body_longer_than_a_turns_reads_comes_whole(
    certs: Certs, out_dir: Path, monkeypatch: pytest.MonkeyPatch, read_ahead: bool
) -> None:
    # A connection that yields to the others after a turn's reads, with bytes
    # OpenSSL read ahead and epoll cannot see, must come back by itself (else it
    # waits for bytes the server already sent: a timeout).
    # A small receive buffer makes the turns short (the .py build only: the
    # compiled one has the constant built in, and a turn there is 8 MB).
    monkeypatch.setattr(engine_core, "RECV_BUFFER_SIZE", 64 << 10)
    size = 6 << 20
    with TLSServer(certs.contexts["good"], _big_then_small(size)) as server:
        urls = [server.url(f"big{i}") for i in range(3)] + [server.url(f"s{i}") for i in range(8)]
        report = swarmget.download(
            urls, out_dir, cacert=str(certs.ca_pem), timeout=1, retries=0, workers=1
        )
    assert (report.ok, report.failed) == (11, 0), report.failures
    for i in range(3):
        assert (out_dir / f"big{i}").stat().st_size == size
    assert (out_dir / "big2").read_bytes() == bytes(range(256)) * (size // 256)


STRAY = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nSTRAY"  # an answer nobody asked for


def _a_then_b(handler: Handler, certs: Certs, out_dir: Path) -> swarmget.Report:
    """Rows a and b, one after the other on one connection if it may be reused."""
    with TLSServer(certs.contexts["good"], handler) as server:
        return swarmget.download(
            [server.url("a"), server.url("b")],
            out_dir,
            cacert=str(certs.ca_pem),
            concurrency=1,
            per_host=1,
            retries=1,
            workers=1,
        )


def test_bytes_after_a_response_are_never_the_next_ones_answer(
    certs: Certs, out_dir: Path, read_ahead: bool
) -> None:
    # A server that sends a second response nobody asked for, with the first:
    # read ahead with it, it would have answered the next request on the
    # connection (row b saved, as ok, with the stray body).

    def handler(tls: ssl.SSLSocket) -> None:
        first = True
        while read_request(tls):
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY)
            tls.sendall(head + BODY)
            if first:
                tls.sendall(STRAY)  # a record of its own, right behind: read ahead with it
            first = False

    report = _a_then_b(handler, certs, out_dir)
    assert report.ok == 2, report.failures
    assert (out_dir / "a").read_bytes() == BODY
    assert (out_dir / "b").read_bytes() == BODY


def test_a_stray_answer_behind_a_response_that_fills_the_buffer_is_not_the_next_ones(
    certs: Certs, out_dir: Path, monkeypatch: pytest.MonkeyPatch, read_ahead: bool
) -> None:
    # The response ends exactly where a turn's buffer is full: the stray record
    # behind it was left unread (in OpenSSL or in the kernel), the connection
    # reused, and row b saved, ok, with it.  (The .py build: a 64 KiB buffer.)
    monkeypatch.setattr(engine_core, "RECV_BUFFER_SIZE", 64 << 10)
    room = (64 << 10) - (16 << 10)
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %06d\r\n\r\n"
    body = (bytes(range(256)) * 256)[: room - len(head % 0)]
    whole = head % len(body) + body
    answered = threading.Event()  # a's answer, on whichever connection asks first

    def handler(tls: ssl.SSLSocket) -> None:
        while read_request(tls):
            if answered.is_set():
                tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
                continue
            answered.set()
            tls.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)  # one segment for all
            for start in range(0, len(whole), 16 << 10):
                tls.sendall(whole[start : start + (16 << 10)])  # a full record each
            tls.sendall(STRAY)
            tls.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)

    report = _a_then_b(handler, certs, out_dir)
    assert report.ok == 2, report.failures
    assert (out_dir / "a").read_bytes() == body
    assert (out_dir / "b").read_bytes() == BODY


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("stderr", ["none", "closed"])
def test_insecure_runs_whatever_became_of_stderr(
    certs: Certs, out_dir: Path, workers: int, stderr: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The warning is said if it can be; a program without a usable stderr (a
    # daemon: None; closed) got AttributeError or ValueError before any request.
    gone: Any = None
    if stderr == "closed":
        gone = io.StringIO()
        gone.close()
    monkeypatch.setattr(sys, "stderr", gone)
    with TLSServer(certs.contexts["self_signed"], serve_keep_alive) as server:
        urls = [server.url(f"f{i}.bin") for i in range(4)]
        report = swarmget.download(urls, out_dir, insecure=True, workers=workers)
    assert (report.ok, report.failed) == (4, 0)
