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
HANDSHAKE              other SSLError, or OSError (a reset)        ``tls``
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


def classify(
    exc: BaseException,
    stage: int,
    *,
    host: str,
    started: bool = False,
    received: int = 0,
    reused: bool = False,
    via: str = "",
) -> TransferError:
    """The error a row fails with when ``exc`` ended its transfer at ``stage``.

    ``started``: some of the response had arrived; ``received``: body bytes so
    far; ``reused``: the connection had served a response before; ``via``: the
    proxy, for messages.
    """
    if isinstance(exc, TransferError):
        return exc
    if isinstance(exc, ssl.SSLError):
        if stage == HANDSHAKE and via:
            host = f"{host} (through proxy {via})"
        return _tls_failure(exc, stage, host=host, started=started, received=received)
    if isinstance(exc, OSError):
        return _os_failure(exc, stage, host=host, started=started, reused=reused, via=via)
    return ProtocolError(f"unexpected {type(exc).__name__} while reading the reply: {exc}")


def _os_failure(
    exc: OSError, stage: int, *, host: str, started: bool, reused: bool, via: str
) -> TransferError:
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    if stage == CONNECT:
        where = f" to proxy {via}" if via else ""
        return TransferError(ErrorCode.CONNECT, f"connect{where} failed: {reason}")
    if stage == TUNNEL:
        return TransferError(ErrorCode.CONNECT, f"connection to proxy {via} failed: {reason}")
    if stage == HANDSHAKE:
        # A reset in the middle of the handshake is the handshake failing, as a
        # close there is (curl: exit 35), whatever layer noticed it first.
        where = f" (through proxy {via})" if via else ""
        return TransferError(ErrorCode.TLS, f"TLS handshake with {host}{where} failed: {reason}")
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
    exc: ssl.SSLError, stage: int, *, host: str, started: bool, received: int
) -> TransferError:
    if stage == EXCHANGE and isinstance(exc, ssl.SSLEOFError):
        if started:
            return TransferError(
                ErrorCode.TRUNCATED,
                f"TLS connection closed without close_notify after {received} body bytes",
            )
        return ConnectionClosed("server closed the TLS connection before responding")
    return tls_error(exc, host, handshake=stage != EXCHANGE)


def connect_failure(err: int, via: str = "") -> TransferError:
    """``connect``: a TCP connect failed with errno ``err``.  No descriptor for the
    socket (a program near its limit) is a moment's shortage, retried as such."""
    if err in (errno.EMFILE, errno.ENFILE):
        return OutOfDescriptors(f"cannot open a socket: {os.strerror(err)}")
    return _os_failure(
        OSError(err, os.strerror(err)), CONNECT, host="", started=False, reused=False, via=via
    )
