"""Scripted routes: a test writes any byte sequence, with any timing, per connection.

A handler gets the raw request head and a :class:`ScriptedConnection`.  Its
calls (``send``, ``sleep``, ``close``, ``reset``) are *steps*, played in order
by the server; each returns a future that completes when its step has been
played.  So a plain function can describe a whole exchange up front::

    def slow_then_reset(head: bytes, conn: ScriptedConnection) -> None:
        conn.send(b"HTTP/1.1 200 OK\\r\\nContent-Length: 10\\r\\n\\r\\nabc")
        conn.sleep(0.2)
        conn.reset()

and a coroutine function can also wait on the futures and read further
requests from the same connection (``await conn.next_request()``)::

    async def count_requests(head: bytes, conn: ScriptedConnection) -> None:
        while head is not None:
            conn.send(b"HTTP/1.1 204 No Content\\r\\n\\r\\n")
            head = await conn.next_request()

When the handler has returned and every step is played, a connection the
script did not close goes back to serving requests normally (keep-alive).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from swarmget.testing.request import Request
from swarmget.testing.state import RouteHandler

if TYPE_CHECKING:
    from swarmget.testing.connection import ServerConnection

_Step = tuple[str, "bytes | float", "asyncio.Future[None]"]


class ScriptedConnection:
    """The connection a route handler scripts.  Use it only on the server's loop."""

    def __init__(self, conn: ServerConnection) -> None:
        self._conn = conn
        self._steps: deque[_Step] = deque()
        self._wake = asyncio.Event()
        self.ended = False  # closed or reset by the script

    def send(self, data: bytes) -> asyncio.Future[None]:
        """Write ``data`` (after the steps before it)."""
        return self._add("send", bytes(data))

    def sleep(self, seconds: float) -> asyncio.Future[None]:
        """Pause: the following steps start ``seconds`` after the previous bytes left."""
        return self._add("sleep", float(seconds))

    def close(self) -> asyncio.Future[None]:
        """Close after the bytes before it are sent (FIN)."""
        return self._add("close", 0.0)

    def reset(self) -> asyncio.Future[None]:
        """Close with SO_LINGER 0 once the bytes before it are acknowledged (RST)."""
        return self._add("reset", 0.0)

    async def next_request(self) -> bytes | None:
        """The next request head on this connection, or ``None`` once the client has closed."""
        return await self._conn.next_head()

    @property
    def peer_closed(self) -> bool:
        """The client has sent EOF (or the connection is gone)."""
        return self._conn.eof or self._conn.closed

    def _add(self, kind: str, arg: bytes | float) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.ended:
            fut.cancel()
        else:
            self._steps.append((kind, arg, fut))
            self._wake.set()
        return fut

    async def _play(self) -> None:
        conn = self._conn
        while self._steps and not self.ended:
            kind, arg, fut = self._steps.popleft()
            if kind == "send":
                assert isinstance(arg, bytes)
                conn.write(arg)
                await conn.drain()
            elif kind == "sleep":
                assert isinstance(arg, float)
                await conn.drain()
                await asyncio.sleep(arg)
            elif kind == "close":
                self.ended = True
                conn.close()
            else:
                self.ended = True
                await conn.reset()
            if not fut.done():
                fut.set_result(None)
        if self.ended:
            self._cancel_pending()

    def _cancel_pending(self) -> None:
        while self._steps:
            self._steps.popleft()[2].cancel()


async def run_script(conn: ServerConnection, request: Request, handler: RouteHandler) -> bool:
    """Run ``handler`` for ``request`` and play its steps; returns keep-alive."""
    script = ScriptedConnection(conn)
    result = handler(request.head, script)
    if result is None:
        await script._play()
        return not script.ended
    task = asyncio.ensure_future(result)
    task.add_done_callback(lambda _: script._wake.set())
    try:
        while True:
            await script._play()
            if script.ended or (task.done() and not script._steps):
                break
            script._wake.clear()
            if not script._steps and not task.done():
                await script._wake.wait()
    finally:
        script._cancel_pending()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    exc = None if task.cancelled() else task.exception()
    if exc is not None:
        raise exc
    return not script.ended
