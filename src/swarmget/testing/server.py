"""The test server's handle: asyncio on a dedicated thread, or a subprocess.

The no-asyncio rule is for the client engine; a test server needs timers and
thousands of mostly idle connections, which is exactly what asyncio's
Protocol layer does cheaply.  ``TestServer`` runs the loop on a daemon
thread inside the test process, which lets tests register Python handlers;
``ProcessServer`` (``process.py``) runs the same code in a child process so
benchmarks do not share a GIL with the client they measure.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import resource
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from swarmget.testing.connection import ServerConnection
from swarmget.testing.content import DEFAULT_SIZE
from swarmget.testing.script import ScriptedConnection
from swarmget.testing.state import RouteHandler, ServerState, ServerStats
from swarmget.testing.urls import ServerUrls

if TYPE_CHECKING:
    from swarmget.testing.process import ProcessServer

T = TypeVar("T")

# The kernel clamps this to net.core.somaxconn; the scale test opens 10,000
# connections at once and should not depend on how fast we accept.
BACKLOG = 65535


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (for 10,000 connections); return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
    return soft


async def open_listener(state: ServerState, host: str, port: int, backlog: int) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: ServerConnection(state), host, port, backlog=backlog, reuse_address=True
    )


async def close_listener(server: asyncio.Server, state: ServerState) -> None:
    """Stop accepting, drop every connection and response task, let the sockets close."""
    server.close()
    for conn in list(state.live):
        conn.abort()
    tasks = list(state.tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await server.wait_closed()
    # Aborted transports close their sockets in a callback a loop turn later.
    for _ in range(3):
        await asyncio.sleep(0)


class TestServer(ServerUrls):
    """A scripted HTTP/1.1 server on 127.0.0.1, running on a background thread.

    >>> with TestServer() as srv:
    ...     url = srv.file_url("a.jpg", size=100)   # or srv.url("/files/a.jpg?size=100")
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        latency: float = 0.0,
        default_size: int = DEFAULT_SIZE,
        backlog: int = BACKLOG,
    ) -> None:
        self.host = host
        self.port = port
        self.backlog = backlog
        self.state = ServerState(latency=latency, default_size=default_size)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._startup_error: BaseException | None = None

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError("TestServer already started")
        raise_fd_limit()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="swarmget-test-server", daemon=True
        )
        self._thread.start()
        ready.wait()
        if self._startup_error is not None:
            self._thread.join()
            raise self._startup_error
        return self

    def stop(self, *, raise_errors: bool = True) -> None:
        """Close every socket and end the thread; then re-raise the first handler error."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        self._loop = None
        if raise_errors and self.state.errors:
            raise self.state.errors[0]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(raise_errors=exc_type is None)

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        try:
            server = loop.run_until_complete(
                open_listener(self.state, self.host, self.port, self.backlog)
            )
        except BaseException as exc:
            self._startup_error = exc
            loop.close()
            ready.set()
            return
        self.port = server.sockets[0].getsockname()[1]
        self._loop = loop
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(close_listener(server, self.state))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    @staticmethod
    def start_process(**kwargs: Any) -> ProcessServer:
        """The same server in a child process (see :class:`ProcessServer`), started."""
        from swarmget.testing.process import ProcessServer

        return ProcessServer(**kwargs).start()

    # -- scripting ----------------------------------------------------------

    def route(self, path: str, handler: RouteHandler) -> None:
        """Answer requests for exactly ``path`` (query ignored) with ``handler``.

        See :mod:`swarmget.testing.script` for what the handler can do.  It runs
        on the server thread; an exception in it resets the connection and is
        re-raised by :meth:`stop`.
        """
        self.state.routes[path] = handler

    def route_bytes(self, path: str, raw: bytes) -> None:
        """Answer requests for ``path`` with exactly ``raw``, then close."""

        def send_raw(head: bytes, conn: ScriptedConnection) -> None:
            conn.send(raw)
            conn.close()

        self.route(path, send_raw)

    def unroute(self, path: str) -> None:
        self.state.routes.pop(path, None)

    @contextlib.contextmanager
    def routed(self, path: str, handler: RouteHandler) -> Iterator[str]:
        """:meth:`route` for a ``with`` block, which gets ``path``'s URL; the route
        is gone after it, whatever happened inside."""
        self.route(path, handler)
        try:
            yield self.url(path)
        finally:
            self.unroute(path)

    # -- observation --------------------------------------------------------

    @property
    def stats(self) -> ServerStats:
        return self.state.stats()

    def reset_stats(self) -> None:
        self._call(self.state.reset_stats)

    @property
    def requests(self) -> list[bytes]:
        """Raw heads of the most recent requests (up to 10,000), oldest first."""
        return self._call(lambda: list(self.state.log))

    @property
    def errors(self) -> list[BaseException]:
        return list(self.state.errors)

    def _call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the server thread, where the state it reads is changed."""
        loop, thread = self._loop, self._thread
        if loop is None or threading.current_thread() is thread:
            return fn()
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:
                done.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return done.result(timeout=10)
