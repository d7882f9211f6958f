"""What a connection may ask of the engine that owns it: a small, fixed protocol.

Connections (``engine/connection.py`` and its TLS and tunnel subclasses) move
bytes and parse responses; everything that decides -- where a body goes, what
a failure means for the row, which transfer comes next -- belongs to the
owner.  The connection reports through the five methods below and reads the
shared resources (loop, receive buffer, options, TLS context) from it.  It
never imports the engine, which keeps the import graph a tree.
"""

from __future__ import annotations

from swarmget.engine.job import Transfer
from swarmget.engine.pool import HostPool, PooledConnection
from swarmget.engine.verdicts import Verdict
from swarmget.loop import EventLoop
from swarmget.net.tls import ClientTLS
from swarmget.options import Options
from swarmget.protocol import ResponseHead
from swarmget.sinks.base import Writer


class ConnectionOwner:
    """The engine, as its connections see it."""

    loop: EventLoop
    options: Options
    tls: ClientTLS
    # The loop's one receive buffer: only one connection runs at a time.
    recv_view: memoryview
    # Credential header lines for the first origin of each job (see engine/core.py).
    credentials: bytes
    # Is one of them an Authorization of the user's?  Then a URL's user:password
    # is not sent beside it (curl sends the user's header alone).
    user_authorizes: bool

    def queue_send(self, conn: PooledConnection) -> None:
        """``conn`` has a request to send at the end of this loop turn."""
        raise NotImplementedError

    def open_writer(self, transfer: Transfer, verdict: Verdict, head: ResponseHead) -> Writer:
        """The body of ``transfer`` is accepted: where to write it (raises TransferError)."""
        raise NotImplementedError

    def answered(self, pool: HostPool, status: int, started: float, key: int) -> None:
        """``pool``'s host sent a response head with ``status``, to a request sent
        at loop time ``started`` for row ``key``, while it was probed or throttled
        after a push-back (see Scheduler.head_came)."""
        raise NotImplementedError

    def ended(self, conn: PooledConnection, transfer: Transfer, verdict: Verdict) -> None:
        """``transfer`` is over on ``conn``: complete (``ACCEPT``) or not, as ``verdict`` says."""
        raise NotImplementedError

    def released(self, conn: PooledConnection, reusable: bool) -> None:
        """``conn`` has no transfer now; ``reusable`` if it may carry another."""
        raise NotImplementedError

    def closed(self, conn: PooledConnection) -> None:
        """``conn`` is closed; its slot is free."""
        raise NotImplementedError
