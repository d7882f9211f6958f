"""Per-origin bookkeeping: queued jobs, idle keep-alive connections, addresses."""

from __future__ import annotations

import ssl
from collections import deque
from typing import TYPE_CHECKING

from swarmget.engine.job import Job, Origin
from swarmget.errors import TransferError
from swarmget.net.dns import Address

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
        "dns_error",
        "idle",
        "open",
        "origin",
        "queue",
        "refresh_at",
        "request_tail",
        "resolving",
        "tls_session",
    )

    def __init__(self, origin: Origin, request_tail: bytes) -> None:
        self.origin = origin
        self.request_tail = request_tail
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
        return f"<HostPool {scheme}://{host}:{port} open={self.open} queued={len(self.queue)}>"
