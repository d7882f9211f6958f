"""TLS for the event loop: the run's one client ``SSLContext``, wrapping, error codes.

Theory of operation
-------------------
An HTTPS connection is an ``ssl.SSLObject`` over two ``MemoryBIO``s: the
connection itself moves ciphertext between its plain non-blocking socket and
the BIOs (``engine/https.py``).  We first used a non-blocking ``SSLSocket``,
where OpenSSL reads from the kernel itself, but it reads each record in two
``read`` calls (5-byte header, then body) and one more to learn that nothing
is left: ten syscalls per 50 KB response, where libcurl makes about two.  With
BIOs one ``recv_into`` takes everything the kernel has, and OpenSSL decrypts
it from memory; the price is one memcpy into the BIO.

* **When to wrap.**  After the TCP connect has completed; the loop then drives
  ``do_handshake()`` on each readable event until it stops raising
  ``SSLWantReadError`` (with memory BIOs OpenSSL never waits to write: what it
  writes lands in the outgoing BIO, which the connection sends).
* **One context per run.**  Loading the system trust store costs ~30 ms and
  a context owns the session machinery, so :class:`ClientTLS` builds one, on
  first use (an http-only run never pays for it) or at once when the options
  ask for TLS settings (a bad ``cacert`` then fails before any download).
* **Trust.**  ``ssl.create_default_context()`` loads OpenSSL's default paths,
  and OpenSSL reads ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` for those: setting the
  variables *replaces* the system store, as with curl and every OpenSSL tool.
  ``cacert`` adds one more CA on top.  ``insecure`` turns verification off and
  says so once on stderr.
* **Truncation.**  The end of the TCP stream is passed on with
  ``MemoryBIO.write_eof()`` and the context never sets
  ``OP_IGNORE_UNEXPECTED_EOF``, so a TCP close without TLS close_notify
  surfaces as ``ssl.SSLEOFError``.  Once a response has
  started, that is ``truncated`` even for a body framed only by the close:
  without close_notify nothing proves the server meant to stop there.
  (Before a response starts it is an ordinary close: servers such as nginx
  drop idle keep-alive connections without close_notify.)
* **Resumption.**  The caller keeps the last ``SSLObject.session`` per origin
  and passes it to the next :meth:`ClientTLS.wrap` for that origin.  TLS 1.3
  tickets arrive *after* the handshake, so the session is taken once the first
  response on a connection is complete, when OpenSSL has surely read them.
* **Errors.**  :func:`tls_error` turns ``ssl`` exceptions into the two stable
  codes, ``tls_verify`` (the certificate was refused) and ``tls`` (anything
  else the TLS layer rejected).
"""

from __future__ import annotations

import re
import ssl
import sys
from collections.abc import Callable
from typing import TextIO

from swarmget.errors import ErrorCode, TransferError, UsageError

ALPN_PROTOCOLS = ["http/1.1"]
INSECURE_WARNING = (
    "swarmget: warning: --insecure: TLS certificates and host names are NOT verified\n"
)
_SSL_LOCATION = re.compile(r"\s*\(_ssl\.c:\d+\)$")


def client_context(cacert: str | None = None, *, insecure: bool = False) -> ssl.SSLContext:
    """A client context: system trust store (+ ``cacert``), TLS >= 1.2, ALPN http/1.1."""
    context = ssl.create_default_context()
    if cacert is not None:
        try:
            context.load_verify_locations(cafile=cacert)
        except FileNotFoundError:
            raise UsageError(f"--cacert {cacert!r}: no such file") from None
        except (ssl.SSLError, OSError) as exc:
            reason = exc.strerror if isinstance(exc.strerror, str) else str(exc)
            raise UsageError(f"--cacert {cacert!r}: not a PEM CA certificate ({reason})") from None
    if insecure:
        context.check_hostname = False  # must come before verify_mode = CERT_NONE
        context.verify_mode = ssl.CERT_NONE
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(ALPN_PROTOCOLS)
    # A ragged EOF must stay an error: it is how we tell a cut body from a whole one.
    context.options &= ~getattr(ssl, "OP_IGNORE_UNEXPECTED_EOF", 0)
    # We never present a client certificate, so a renegotiation could only fail
    # later; refusing it up front also means a read never has to wait to write.
    context.options |= ssl.OP_NO_RENEGOTIATION
    return context


class ClientTLS:
    """The run's TLS settings and its one ``SSLContext``, built when first needed."""

    __slots__ = ("_context", "_warn_to", "cacert", "insecure")

    def __init__(
        self, cacert: str | None = None, insecure: bool = False, *, warn_to: TextIO | None = None
    ) -> None:
        self.cacert = cacert
        self.insecure = insecure
        self._warn_to = warn_to
        self._context: ssl.SSLContext | None = None
        if cacert is not None or insecure:
            self._build()  # the user asked for TLS settings: check them before the run

    @property
    def context(self) -> ssl.SSLContext:
        return self._context if self._context is not None else self._build()

    def _build(self) -> ssl.SSLContext:
        self._context = client_context(self.cacert, insecure=self.insecure)
        if self.insecure:
            out = self._warn_to if self._warn_to is not None else sys.stderr
            out.write(INSECURE_WARNING)
            out.flush()
        return self._context

    def wrap(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        host: str,
        session: ssl.SSLSession | None,
    ) -> ssl.SSLObject:
        """A client ``SSLObject`` over two memory BIOs; the caller moves the bytes.

        ``host`` is sent as SNI (Python leaves SNI out for IP literals but still
        checks the certificate against the address).
        """
        return self.context.wrap_bio(incoming, outgoing, server_hostname=host, session=session)


def record_reader(tls: ssl.SSLObject) -> Callable[[int, memoryview], int]:
    """``read(size, buffer) -> n``: decrypt the next record's bytes into ``buffer``.

    ``SSLObject.read`` is a Python frame around the C ``read`` of its private
    ``_sslobj``; at four records per 50 KB file we call the C method directly.
    Same arguments, same result, same exceptions; the public method is the
    fallback should ``_sslobj`` ever go away.
    """
    sslobj = getattr(tls, "_sslobj", None)
    read = getattr(sslobj, "read", None)
    if callable(read):
        fast: Callable[[int, memoryview], int] = read
        return fast
    return public_record_reader(tls)


def public_record_reader(tls: ssl.SSLObject) -> Callable[[int, memoryview], int]:
    """The same as :func:`record_reader` through the public (slower) ``read``."""
    # With a buffer, read() returns the byte count (typeshed says bytes).
    return lambda size, buffer: tls.read(size, buffer)  # type: ignore[return-value]


def tls_error(exc: ssl.SSLError, host: str, *, handshake: bool) -> TransferError:
    """The stable error for an ``ssl`` failure on a connection to ``host``."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = exc.verify_message or describe(exc)
        return TransferError(
            ErrorCode.TLS_VERIFY, f"certificate verification failed for {host}: {detail}"
        )
    where = "TLS handshake with" if handshake else "TLS error from"
    if isinstance(exc, ssl.SSLEOFError):
        return TransferError(ErrorCode.TLS, f"{where} {host}: connection closed by the server")
    return TransferError(ErrorCode.TLS, f"{where} {host} failed: {describe(exc)}")


def describe(exc: ssl.SSLError) -> str:
    """OpenSSL's reason in words ("tlsv1 alert unknown ca"), without the C file location."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        return reason.lower().replace("_", " ")
    text = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], str) else str(exc)
    return _SSL_LOCATION.sub("", text)
