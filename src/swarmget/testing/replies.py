"""Replaying a recorded reply: exact bytes, the way curl's test server sends them.

``replay(raw, close=...)`` is a route handler (see :mod:`swarmget.testing.script`)
that answers every request with ``raw``, in pieces of ``piece`` bytes like
curl's ``sws`` (20 by default, so that a client reads a head in several
``recv`` calls), then waits ``hold`` seconds and closes the connection when
``close`` is set.  Without ``close`` the connection stays open, as ``sws``
keeps it unless the reply says ``swsclose``: a client that waits for the end
of a close-delimited body then waits for its own timeout.

    srv.route("/curl/0034", replay(raw, close=True))
"""

from __future__ import annotations

from swarmget.testing.script import ScriptedConnection
from swarmget.testing.state import RouteHandler

SWS_PIECE = 20  # sws writes at most this many bytes at a time


def replay(raw: bytes, *, close: bool, hold: float = 0.0, piece: int = SWS_PIECE) -> RouteHandler:
    """A handler sending ``raw`` in ``piece``-byte writes, then (after ``hold`` s) maybe FIN."""
    pieces = [raw[i : i + piece] for i in range(0, len(raw), piece)] if piece > 0 else [raw]

    def handler(head: bytes, conn: ScriptedConnection) -> None:
        for data in pieces:
            conn.send(data)
        if hold:
            conn.sleep(hold)
        if close:
            conn.close()

    return handler
