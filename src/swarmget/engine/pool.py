"""Per-origin bookkeeping: queued jobs, idle keep-alive connections, addresses.

An origin reached through an http proxy keeps its own pool (the same origin
never mixes proxied and direct connections: the choice is made once per origin
for the whole run); only ``connect_to`` (what is resolved and dialled),
``connection_type`` and the request tail differ.  So ``per_host`` still counts
connections per target origin, and connections to the proxy are not shared
between origins.
"""

from __future__ import annotations

import ssl
from collections import deque
from typing import TYPE_CHECKING

from swarmget.engine.job import Job, Origin
from swarmget.errors import TransferError
from swarmget.net.dns import Address
from swarmget.net.proxy import Proxy

if TYPE_CHECKING:
    from swarmget.engine.connection import HTTPConnection


def request_tail(host_header: str, headers: dict[str, str]) -> bytes:
    """Everything after the request target: the same for every request to an origin."""
    lines = [" HTTP/1.1", f"Host: {host_header}"]
    lines.extend(f"{name}: {value}" for name, value in headers.items())
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class HostPool:
    __slots__ = (
        "addresses",
        "connect_to",
        "connection_type",
        "dns_error",
        "idle",
        "open",
        "origin",
        "proxy",
        "queue",
        "refresh_at",
        "request_tail",
        "resolving",
        "target_prefix",
        "tls_session",
    )

    def __init__(
        self,
        origin: Origin,
        request_tail: bytes,
        connection_type: type[HTTPConnection],
        proxy: Proxy | None = None,
    ) -> None:
        self.origin = origin
        self.request_tail = request_tail
        self.connection_type = connection_type
        self.proxy = proxy
        # Where connections go: the origin, or its proxy.
        self.connect_to = (proxy.host, proxy.port) if proxy else (origin[1], origin[2])
        # Put before each request target: "http://host:port" for an http proxy
        # (absolute-form, RFC 9112 3.2.2), else "".
        self.target_prefix = ""
        self.queue: deque[Job] = deque()
        self.idle: list[HTTPConnection] = []  # most recently used last
        self.open = 0  # connections of this origin, connecting, active or idle
        self.addresses: list[Address] | None = None
        self.dns_error: TransferError | None = None
        self.resolving = False
        self.refresh_at = 0.0  # loop time when the addresses (or dns_error) go stale
        # The last TLS session a connection got here: the next one resumes it.
        self.tls_session: ssl.SSLSession | None = None

    def __repr__(self) -> str:
        scheme, host, port = self.origin
        via = f" via {self.proxy}" if self.proxy else ""
        return f"<HostPool {scheme}://{host}:{port}{via} open={self.open} queued={len(self.queue)}>"
