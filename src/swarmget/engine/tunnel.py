"""HTTPS through an http proxy: ``CONNECT`` first, then TLS inside the tunnel.

Theory of operation
-------------------
:class:`TunnelHTTPSConnection` is an :class:`HTTPSConnection` whose TCP connect
goes to the proxy.  Once connected it sends ``CONNECT host:port`` (with
``Proxy-Authorization`` when the proxy URL has credentials) and enters
``TUNNELLING``; the proxy's answer is read with the sans-I/O
:class:`~swarmget.protocol.ConnectResponseParser`, which stops at the end of the
head.  A 2xx turns the socket into a tunnel to the origin, and the connection
goes on exactly as a direct HTTPS one after its TCP connect: TLS handshake with
the origin's name, then requests.  The tunnel is for one origin, which is why
the pool (and its TLS session) stays per origin.

Failures keep the usual codes, so retries treat them like any connection
failure: a proxy that cannot be reached or that closes or resets before it
answers is ``connect``; a malformed answer is ``protocol``; a non-2xx answer is
``http_<status>`` with the status in the manifest (``http_407`` means the proxy
wants other credentials; 502/503/504 are retried as from an origin).  The connect
timeout covers TCP connect, tunnel and handshake together.

The plain HTTPS path pays nothing for this: only tunnelled connections are of
this class, and after the tunnel is up ``handle_io`` costs one comparison more.
"""

from __future__ import annotations

from swarmget.engine.classify import TUNNEL, classify
from swarmget.engine.connection import TUNNELLING, HTTPConnection
from swarmget.engine.https import HTTPSConnection
from swarmget.engine.job import Transfer
from swarmget.engine.verdicts import FAIL, Verdict, proxy_auth_hint
from swarmget.errors import ErrorCode, ProtocolError, TransferError, http_code
from swarmget.loop import EVENT_READ, EVENT_WRITE
from swarmget.net.address import bare_host
from swarmget.net.proxy import Proxy
from swarmget.protocol import ConnectionClosed, ConnectResponseParser


def connect_request(host: str, port: int, proxy: Proxy, user_agent: str) -> bytes:
    """The ``CONNECT`` request that asks ``proxy`` for a tunnel to ``host:port``."""
    # An IPv6 literal without its zone id (an interface of this machine, which
    # means nothing to the proxy; a raw % is no authority either), as curl.
    authority = f"[{bare_host(host)}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if user_agent:  # user_agent="": none at all, as for the requests themselves
        lines.append(f"User-Agent: {user_agent}")
    if proxy.authorization is not None:
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class TunnelHTTPSConnection(HTTPSConnection):
    __slots__ = ("_tunnel",)

    def _established(self, transfer: Transfer) -> None:
        """TCP to the proxy is up: ask it for the tunnel (TLS starts in _tunnelled)."""
        pool = self.pool
        proxy = pool.proxy
        assert proxy is not None
        _, host, port = pool.origin
        self._tunnel = ConnectResponseParser()
        self.state = TUNNELLING
        request = connect_request(host, port, proxy, self.owner.options.user_agent)
        # In clear to the proxy: TLS starts inside the tunnel, once it is up.
        if not HTTPConnection._send(self, request, self._proxy_lost):
            return
        if self._pending_out is not None:
            return  # still registered for writability, as for the connect
        self.owner.loop.modify(self.fd, EVENT_READ, self)

    def _on_io(self, mask: int) -> None:
        if self.state != TUNNELLING:
            super()._on_io(mask)
        elif mask & EVENT_WRITE and self._pending_out is not None:
            self._send_connect()
        elif mask & EVENT_READ:
            self._tunnel_readable()

    def _send_connect(self) -> None:
        self._flush_out(self._proxy_lost)

    def _tunnel_readable(self) -> None:
        buffer = self.owner.recv_view
        parser = self._tunnel
        try:
            n = self.sock.recv_into(buffer)
        except BlockingIOError:
            return
        except OSError as exc:
            self._proxy_lost(exc)
            return
        try:
            done = parser.feed(buffer[:n]) if n else parser.feed_eof()
        except ConnectionClosed:
            self._fail(ConnectionClosed(f"proxy {self.pool.proxy} closed the connection"))
            return
        except Exception as exc:
            error = classify(exc, TUNNEL, host=self.pool.host, via=self.pool.via)
            if error.code == ErrorCode.TRUNCATED:  # closed inside the head: a connect failure
                error = TransferError(
                    ErrorCode.CONNECT, f"proxy {self.pool.proxy}: {error.message}"
                )
            elif error.code == ErrorCode.PROTOCOL:
                # The proxy's answer, not the origin's: a bare "malformed
                # response head" sent people to look at the origin.
                error = ProtocolError(f"proxy {self.pool.proxy} answered CONNECT: {error.message}")
            self._fail(error)
            return
        if done:
            self._tunnelled()

    def _tunnelled(self) -> None:
        head = self._tunnel.head
        transfer = self.transfer
        assert head is not None and transfer is not None
        _, host, port = self.pool.origin
        status = head.status
        if not 200 <= status < 300:
            hint = proxy_auth_hint(self.pool.proxy) if status == 407 else ""
            error = TransferError(
                http_code(status),
                f"proxy {self.pool.proxy} refused CONNECT to {host}:{port}: HTTP {status}{hint}",
            )
            self._end(Verdict(FAIL, status, error=error))
            return
        if self._tunnel.extra:
            self._fail(
                TransferError(
                    ErrorCode.PROTOCOL,
                    f"proxy {self.pool.proxy} sent {self._tunnel.extra} bytes after its "
                    f"CONNECT response, before the TLS handshake",
                )
            )
            return
        # HTTPSConnection takes over as after a direct connect, which it expects
        # to find registered for writability.
        self.owner.loop.modify(self.fd, EVENT_WRITE, self)
        super()._established(transfer)

    def _proxy_lost(self, exc: OSError) -> None:
        self._fail(classify(exc, TUNNEL, host=self.pool.host, via=self.pool.via))
