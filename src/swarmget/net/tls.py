"""TLS for the event loop: the run's one client ``SSLContext``, wrapping, error codes.

Theory of operation
-------------------
An HTTPS connection's TLS layer reads from and writes to its non-blocking
socket itself: the connection wraps the connected socket (:meth:`ClientTLS.wrap`)
and decrypts straight into the loop's receive buffer with ``read(n, buffer)``
(``engine/https.py``).  Per 50 KB response that is OpenSSL's own reads from the
kernel into its record buffer, in-place decryption and one copy of the
plaintext into our buffer.  We used to do it the other way round -- an
``SSLObject`` over two ``MemoryBIO``s, one ``recv_into`` and a copy into the
BIO -- which saved OpenSSL's two small ``read()`` calls per record but cost two
more copies of every byte and a ``memset`` (``MemoryBIO.write`` zeroes the room
it grows into): 29% of the client's user-space instructions per file on the
HTTPS benchmark went to moving ciphertext between buffers, and the handshakes
were 12% dearer (``bench/profile_https.py`` measures both; README "Speed" has
the figures).

* **When to wrap.**  After the TCP connect (or the proxy's tunnel) is up; the
  loop then drives ``do_handshake()`` until it stops raising
  ``SSLWantReadError``/``SSLWantWriteError``.  The wrapping object is the C
  ``_ssl._SSLSocket`` that ``ssl.SSLSocket`` itself wraps (no Python frame per
  call, and the descriptor stays with our socket object); should that private
  constructor ever be missing, the public ``SSLContext.wrap_socket`` gives the
  same object behind an ``SSLSocket``, which then owns the descriptor.
* **One context per run.**  Loading the system trust store costs ~30 ms and
  a context owns the session machinery, so :class:`ClientTLS` builds one, on
  first use (an http-only run never pays for it) or at once when the options
  ask for TLS settings (a bad ``cacert`` then fails before any download).
* **Trust.**  ``ssl.create_default_context()`` loads OpenSSL's default paths,
  and OpenSSL reads ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` for those: setting the
  variables *replaces* the system store, as with curl and every OpenSSL tool.
  ``cacert`` adds one more CA on top.  ``insecure`` turns verification off and
  says so once on stderr.  Certificate and host name are checked by OpenSSL
  during the handshake, whichever way the socket was wrapped.
* **Truncation.**  The context never sets ``OP_IGNORE_UNEXPECTED_EOF``, so a
  TCP close without TLS close_notify surfaces from ``read`` as
  ``ssl.SSLEOFError`` (close_notify itself reads as 0 bytes).  Once a response
  has started, that is ``truncated`` even for a body framed only by the close:
  without close_notify nothing proves the server meant to stop there.
  (Before a response starts it is an ordinary close: servers such as nginx
  drop idle keep-alive connections without close_notify.)
* **Resumption.**  The caller keeps the last ``session`` per origin and passes
  it to the next :meth:`ClientTLS.wrap` for that origin.  TLS 1.3 tickets
  arrive *after* the handshake, so the session is taken once the first
  response on a connection is complete, when OpenSSL has surely read them.
* **Kernel TLS** is asked for where Python offers ``ssl.OP_ENABLE_KTLS``
  (3.12 and later; 3.11 has no such option and stays in user space).  OpenSSL
  then hands the record layer to the kernel when it can -- only for a socket it
  reads itself, which is one more reason not to use memory BIOs; receiving
  only for TLS 1.2 before OpenSSL 3.2 -- and silently stays in user space when
  it cannot, e.g. on kernels built without ``CONFIG_TLS``, which refuse the
  ``tls`` socket option (``ENOENT``).
* **Errors.**  :func:`tls_error` turns ``ssl`` exceptions into the two stable
  codes, ``tls_verify`` (the certificate was refused) and ``tls`` (anything
  else the TLS layer rejected).
"""

from __future__ import annotations

import re
import socket
import ssl
from collections.abc import Callable
from typing import Final, Protocol, TextIO, cast

from swarmget.errors import ErrorCode, TransferError, UsageError, warn
from swarmget.net.address import bare_host
from swarmget.net.openssl import enable_read_ahead

ALPN_PROTOCOLS = ["http/1.1"]
INSECURE_WARNING = (
    "swarmget: warning: --insecure: TLS certificates and host names are NOT verified\n"
)
_SSL_LOCATION = re.compile(r"\s*\(_ssl\.c:\d+\)$")
# What OpenSSL calls a reply to our ClientHello that is not TLS at all ("HTTP/1.1
# 400 ..." read as a record header): "wrong version number", which OpenSSL 3.2
# and later report as the "record layer failure" it comes wrapped in.
_NOT_TLS_REASONS = frozenset({"wrong version number", "record layer failure"})
_TRUST_HINT: Final = "a private CA is trusted with --cacert FILE, or $SSL_CERT_FILE"
_CLIENT_CERTIFICATE_REQUIRED: Final = "tlsv13 alert certificate required"
# A server that speaks only TLS 1.0/1.1: its alert refusing the versions we
# offer, or (a server that answers with its own version regardless) OpenSSL's
# refusal of the one it chose.
_NO_COMMON_VERSION_REASONS = frozenset({"tlsv1 alert protocol version", "unsupported protocol"})
_NO_COMMON_VERSION_HINT: Final = (
    " (the server speaks no TLS version swarmget accepts: it needs TLS 1.2 or later)"
)


def client_context(cacert: str | None = None, *, insecure: bool = False) -> ssl.SSLContext:
    """A client context: system trust store (+ ``cacert``), TLS >= 1.2, ALPN http/1.1."""
    context = ssl.create_default_context()
    if cacert is not None:
        try:
            context.load_verify_locations(cafile=cacert)
        except FileNotFoundError:
            raise UsageError(f"--cacert {cacert!r}: no such file") from None
        except ssl.SSLError as exc:  # OpenSSL's reason in words, not its C location
            raise UsageError(
                f"--cacert {cacert!r}: not a PEM CA certificate ({describe(exc)})"
            ) from None
        except OSError as exc:
            reason = exc.strerror if isinstance(exc.strerror, str) else str(exc)
            raise UsageError(f"--cacert {cacert!r}: not a PEM CA certificate ({reason})") from None
    if insecure:
        context.check_hostname = False  # must come before verify_mode = CERT_NONE
        context.verify_mode = ssl.CERT_NONE
    else:
        # A trusted certificate may be an intermediate or the server's own (a
        # pinned leaf given with --cacert): the chain ends there, as curl and
        # Python 3.13's default context let it.
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(ALPN_PROTOCOLS)
    # A ragged EOF must stay an error: it is how we tell a cut body from a whole one.
    context.options &= ~getattr(ssl, "OP_IGNORE_UNEXPECTED_EOF", 0)
    # A server's renegotiation (TLS 1.2: per-directory client certificates, IIS)
    # is taken, as curl and wget take it: refused, the server failed the
    # handshake and the reply with it.  OpenSSL allows only the secure kind
    # (RFC 5746).  A read may then have to write (engine/https.py).
    # Kernel TLS where Python can ask for it (3.12+): OpenSSL falls back by itself.
    context.options |= getattr(ssl, "OP_ENABLE_KTLS", 0)
    return context


class TLSChannel(Protocol):
    """The TLS object over a connection's socket, as the connection uses it.

    ``_ssl._SSLSocket`` (what :meth:`ClientTLS.wrap` makes) and ``ssl.SSLSocket``
    (its public fallback) both have these.  Non-blocking: each call raises
    ``SSLWantReadError`` / ``SSLWantWriteError`` when the socket has to be
    readable / writable first.
    """

    def do_handshake(self) -> None: ...

    def read(self, size: int, buffer: memoryview, /) -> int:
        """Decrypt up to ``size`` bytes into ``buffer``: the count, 0 at close_notify."""
        ...

    def write(self, data: bytes | memoryview, /) -> int:
        """Encrypt and send all of ``data`` (after ``SSLWant*Error``: the same bytes again)."""
        ...

    @property
    def session(self) -> ssl.SSLSession | None: ...

    @property
    def session_reused(self) -> bool: ...

    def cipher(self) -> tuple[str, str, int] | None:
        """The cipher agreed on: None until the server's hello (or an offered session) names one."""
        ...


class ClientTLS:
    """The run's TLS settings and its one ``SSLContext``, built when first needed."""

    __slots__ = ("_context", "_warn_to", "cacert", "insecure", "public_api", "read_ahead")

    def __init__(
        self, cacert: str | None = None, insecure: bool = False, *, warn_to: TextIO | None = None
    ) -> None:
        self.cacert = cacert
        self.insecure = insecure
        self._warn_to = warn_to
        self._context: ssl.SSLContext | None = None
        # Wrap with the public SSLContext.wrap_socket even where the C
        # constructor is there (the fallback's own tests set this).
        self.public_api = False
        # OpenSSL reads ahead (net/openssl.py): whoever reads a channel must go on
        # until SSLWantReadError before waiting for the socket again.
        self.read_ahead = False
        if cacert is not None or insecure:
            self._build()  # the user asked for TLS settings: check them before the run

    @property
    def context(self) -> ssl.SSLContext:
        return self._context if self._context is not None else self._build()

    def _build(self) -> ssl.SSLContext:
        self._context = client_context(self.cacert, insecure=self.insecure)
        self.read_ahead = enable_read_ahead(self._context)
        if self.insecure:
            warn(INSECURE_WARNING, self._warn_to)
        return self._context

    def wrap(
        self, sock: socket.socket, host: str, session: ssl.SSLSession | None
    ) -> tuple[TLSChannel, socket.socket]:
        """A client TLS channel over the connected non-blocking ``sock``, not yet
        handshaken, and the socket object that now holds the descriptor (``sock``
        itself, or the public fallback's ``SSLSocket``).

        ``host`` is sent as SNI (Python leaves SNI out for IP literals but still
        checks the certificate against the address).  Raises ``ValueError`` for a
        host name that cannot be sent, ``ssl.SSLError`` for a session that does
        not fit.
        """
        host = bare_host(host)  # an IPv6 zone id names our interface, not the server's address
        if host.endswith(".") and len(host) > 1:
            # A fully qualified name: the certificate names the host without the
            # root's dot, and SNI must not carry one (RFC 6066 section 3); curl
            # strips it for both.
            host = host[:-1]
        context = self.context
        construct = None if self.public_api else getattr(context, "_wrap_socket", None)
        if construct is not None:
            # What SSLContext.wrap_socket passes on to it: an IDNA host name,
            # client side, the socket object we keep for close() and fileno().
            name = host.encode("idna").decode("ascii")
            channel: TLSChannel = construct(sock, False, name, owner=None, session=session)
            return channel, sock
        tls_sock = context.wrap_socket(
            sock,
            server_hostname=host,
            session=session,
            do_handshake_on_connect=False,
            suppress_ragged_eofs=False,  # a ragged EOF must raise: it is how truncation shows
        )
        return cast(TLSChannel, tls_sock), tls_sock


def record_reader(tls: TLSChannel) -> Callable[[int, memoryview], int]:
    """``read(size, buffer) -> n``: decrypt the next record's bytes into ``buffer``.

    For the C ``_ssl._SSLSocket`` that is its own ``read``; behind the public
    ``SSLSocket`` (or ``SSLObject``) the C ``read`` of its private ``_sslobj``,
    skipping a Python frame per record.  Same arguments, same result, same
    exceptions; the public method is the fallback should ``_sslobj`` ever go.
    """
    inner = getattr(tls, "_sslobj", tls)
    read = getattr(inner, "read", None)
    if callable(read):
        fast: Callable[[int, memoryview], int] = read
        return fast
    return public_record_reader(tls)


def public_record_reader(tls: TLSChannel) -> Callable[[int, memoryview], int]:
    """The same as :func:`record_reader` through the channel's public ``read``."""
    return lambda size, buffer: tls.read(size, buffer)


def tls_error(exc: ssl.SSLError, host: str, *, handshake: bool) -> TransferError:
    """The stable error for an ``ssl`` failure on a connection to ``host``."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = exc.verify_message or describe(exc)
        if "self-signed" in detail or "self signed" in detail:
            detail += f" ({_TRUST_HINT})"
        elif "issuer" in detail:
            # "unable to get local issuer certificate": the chain stops short of
            # a trusted CA.  Just as often as an untrusted private CA, a server
            # with a public one that leaves its intermediate out (browsers fetch
            # it, OpenSSL does not), and then --cacert with the root cannot help.
            detail += f" (the server may not send its intermediate CA certificate; {_TRUST_HINT})"
        return TransferError(
            ErrorCode.TLS_VERIFY, f"certificate verification failed for {host}: {detail}"
        )
    where = "TLS handshake with" if handshake else "TLS connection to"
    # (A close without an alert, SSLEOFError, is the transport's failure, not
    # TLS's: engine/classify.py makes it HandshakeLost or truncated first.)
    reason = describe(exc)
    if reason in _NOT_TLS_REASONS and handshake:
        reason += " (is it an http:// server?)"  # what a plain-HTTP reply reads as
    elif reason == _CLIENT_CERTIFICATE_REQUIRED:
        # TLS 1.3's alert: the server asks every client for a certificate of
        # its own (mutual TLS), and said only that.
        reason += " (the server wants a client certificate, which swarmget does not send)"
    elif reason in _NO_COMMON_VERSION_REASONS and handshake:
        reason += _NO_COMMON_VERSION_HINT
    return TransferError(ErrorCode.TLS, f"{where} {host} failed: {reason}")


def describe(exc: ssl.SSLError) -> str:
    """OpenSSL's reason in words ("tlsv1 alert unknown ca"), without the C file location."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason:
        return reason.lower().replace("_", " ")
    text = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], str) else str(exc)
    return _SSL_LOCATION.sub("", text)
