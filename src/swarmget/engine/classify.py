"""The one place where low-level failures become the public error codes.

Sockets raise ``OSError``, the TLS layer ``ssl.SSLError``, and a bug or a reply
nobody foresaw may raise anything.  A connection hands whatever it caught to
:func:`classify` together with *where* it happened, and gets back the
:class:`~swarmget.errors.TransferError` the row fails with:

=====================  ==========================================  ===========
stage                  failure                                      code
=====================  ==========================================  ===========
any                    TransferError (parser, verdict, sink)       its own
CONNECT / TUNNEL       OSError                                     ``connect``
HANDSHAKE              certificate refused                         ``tls_verify``
HANDSHAKE              reset, EOF or other OSError                 ``connect``
                                                                   (HandshakeLost)
HANDSHAKE              other SSLError (alert, version, protocol)   ``tls``
EXCHANGE               reset/EOF after the response began          ``truncated``
EXCHANGE               reset/EOF before it                         ``connect``
                                                                   (not counted by
                                                                   --host-failures;
                                                                   on a reused
                                                                   connection stale:
                                                                   retried once, free)
EXCHANGE               other OSError before the response           ``connect``
EXCHANGE               other SSLError                              ``tls``
any                    any other exception (a bug, odd input)      ``protocol``
=====================  ==========================================  ===========

Unexpected exceptions end as ``protocol`` rather than crashing the process: one
hostile reply must cost one row, never the rows of a whole worker.

A handshake the *transport* broke (a reset, a close without an alert) says
nothing about TLS itself: loaded servers and middleboxes reset handshakes
transiently, and aria2c retries them.  It is ``connect`` like a reset before
the response, retried, but a :class:`HandshakeLost`, which the circuit breaker
counts (engine/scheduler.py): a host or middlebox that resets every handshake
is given up after ``--host-failures``, as a host refusing every connect is.
A TLS failure proper -- a certificate, an alert, a wrong version number --
would fail the same way again and stays ``tls``/``tls_verify``, not retried.
A handshake lost before the server sent anything of TLS back says it may not
speak TLS at all (:func:`unanswered_hello`): a plain-HTTP server behind an
https:// URL closes on our ClientHello, or answers it in plain HTTP (OpenSSL's
"wrong version number", hinted at by ``tls_error``).
"""

from __future__ import annotations

import errno
import os
import ssl
from typing import Final

from swarmget.errors import ErrorCode, ProtocolError, TransferError
from swarmget.net.tls import tls_error
from swarmget.protocol import ConnectionClosed
from swarmget.sinks.files import OutOfDescriptors

CONNECT: Final = 0  # TCP connect to the origin or the proxy
TUNNEL: Final = 1  # waiting for the proxy's answer to CONNECT
HANDSHAKE: Final = 2  # TLS handshake
EXCHANGE: Final = 3  # request sent, response expected or being read

_STALE_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE})


class HandshakeLost(TransferError):
    """``connect``: the connection was reset or closed during the TLS handshake.

    A class of its own so the circuit breaker can tell it from a close after
    the handshake (:class:`ConnectionClosed`, which it does not count).
    """

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.CONNECT, message)

    def _arguments(self) -> tuple[str]:
        return (self.message,)


# Said when a server that took our TCP connection never answered our
# ClientHello with TLS: closing on it, resetting it, or (a plain-HTTP server
# waiting for the rest of a request line that never comes) sitting on it.
NOT_TLS_HINT: Final = "(is it an http:// server, or not TLS on that port?)"


def unanswered_hello(lost: HandshakeLost) -> HandshakeLost:
    """``lost``, for a handshake the server ended before it answered our
    ClientHello with anything TLS: most likely it does not speak TLS there (a
    plain-HTTP server closes on bytes it cannot read), which the bare "closed
    by the server" never hinted at, retry after retry."""
    return HandshakeLost(f"{lost.message}, before any TLS reply {NOT_TLS_HINT}")


def classify(
    exc: BaseException,
    stage: int,
    *,
    host: str,
    started: bool = False,
    received: int = 0,
    announced: int | None = None,
    reused: bool = False,
    via: str = "",
) -> TransferError:
    """The error a row fails with when ``exc`` ended its transfer at ``stage``.

    ``started``: some of the response had arrived; ``received``: body bytes so
    far, of ``announced`` (its Content-Length; None: not known); ``reused``:
    the connection had served a response before; ``via``: the proxy, for
    messages.
    """
    if isinstance(exc, TransferError):
        return exc
    if isinstance(exc, ssl.SSLError):
        if stage == HANDSHAKE and via:
            host = f"{host} (through proxy {via})"
        of = f" of {announced}" if announced is not None else ""
        return _tls_failure(exc, stage, host=host, started=started, received=f"{received}{of}")
    if isinstance(exc, OSError):
        return _os_failure(exc, stage, host=host, started=started, reused=reused, via=via)
    return ProtocolError(f"unexpected {type(exc).__name__} while reading the reply: {exc}")


def _os_failure(
    exc: OSError, stage: int, *, host: str, started: bool, reused: bool, via: str
) -> TransferError:
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    if stage == CONNECT:
        # ``host``: the host:port dialled (without a proxy, which is named instead).
        where = f" to proxy {via}" if via else f" to {host}" if host else ""
        return TransferError(ErrorCode.CONNECT, f"connect{where} failed: {reason}")
    if stage == TUNNEL:
        return TransferError(ErrorCode.CONNECT, f"connection to proxy {via} failed: {reason}")
    if stage == HANDSHAKE:
        # The transport failed, not TLS: worth another connection (see above).
        where = f" (through proxy {via})" if via else ""
        if exc.errno in _STALE_ERRNOS:
            return HandshakeLost(f"TLS handshake with {host}{where} reset by the server: {reason}")
        return HandshakeLost(f"connection to {host}{where} lost during the TLS handshake: {reason}")
    if started:
        return TransferError(ErrorCode.TRUNCATED, f"connection lost mid-response: {reason}")
    if exc.errno in _STALE_ERRNOS:
        # Reset after the TCP handshake: the host is up (the scheduler's circuit
        # breaker does not count these), and on a reused connection most likely
        # closed as we sent.
        if reused:
            return ConnectionClosed(f"kept-alive connection was closed: {reason}")
        return ConnectionClosed(f"connection closed before the response: {reason}")
    return TransferError(ErrorCode.CONNECT, f"connection failed: {reason}")


def _tls_failure(
    exc: ssl.SSLError, stage: int, *, host: str, started: bool, received: str
) -> TransferError:
    if stage == EXCHANGE and isinstance(exc, ssl.SSLEOFError):
        if started:
            return TransferError(
                ErrorCode.TRUNCATED,
                f"TLS connection closed without close_notify after {received} body bytes",
            )
        return ConnectionClosed("server closed the TLS connection before responding")
    if isinstance(exc, ssl.SSLEOFError):
        # In the handshake, a TCP close without an alert: the transport ended,
        # TLS refused nothing.
        return HandshakeLost(f"TLS handshake with {host}: connection closed by the server")
    return tls_error(exc, host, handshake=stage != EXCHANGE)


def connect_failure(err: int, via: str = "", host: str = "") -> TransferError:
    """``connect``: a TCP connect to ``host`` (host:port) failed with errno ``err``.
    No descriptor for the socket (a program near its limit) is a moment's
    shortage, retried as such."""
    if err in (errno.EMFILE, errno.ENFILE):
        return OutOfDescriptors(f"cannot open a socket: {os.strerror(err)}")
    return _os_failure(
        OSError(err, os.strerror(err)), CONNECT, host=host, started=False, reused=False, via=via
    )
