"""One accepted connection: read request heads, hand each to a responder, write bytes.

Theory of operation.  Requests on a connection are answered strictly one after
another, as HTTP/1.1 demands.  The common case (a plain ``/files`` GET) is
answered synchronously inside ``data_received`` with a single ``writev`` of
the head and a ``memoryview`` of the body, so it costs no task and no copy.
A plain file that only asks for latency is answered by a timer calling the
same synchronous writer (the latency benchmark serves 2,000 of them a second,
and a task per response would make this server, not the client, the slowest
part).  Anything else with timing in it (faults, scripts) runs as one task per
response; while a timer or task is pending, further pipelined requests wait in
the buffer, and when it ends the connection either closes or goes back to
reading.

End of input from the client ends the task at once only for the responses
that would otherwise never finish (stalls, drips, endless 1xx): those are
what "until the client goes away" means.  Other responses are completed, so
that a client that half-closes still gets its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import socket
import struct
import termios
import time
from collections.abc import Callable, Coroutine
from typing import Any

from swarmget.testing.files import respond_file
from swarmget.testing.request import MAX_HEAD, BadRequest, Request, parse_head
from swarmget.testing.script import run_script
from swarmget.testing.state import ServerState

_LINGER_ZERO = struct.pack("ii", 1, 0)
_OUTQ = struct.pack("i", 0)


def simple_response(status: int, reason: str, body: bytes, *, close: bool = False) -> bytes:
    connection = "Connection: close\r\n" if close else ""
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\n{connection}\r\n"
    ).encode() + body


class ServerConnection(asyncio.Protocol):
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._fd = -1
        self._task: asyncio.Task[bool] | None = None
        self._task_ends_on_eof = False
        self._timer: asyncio.TimerHandle | None = None
        self._skip = 0  # request body bytes still to discard
        self._served = 0
        self._internal = False  # opened only to ask /_stats; not counted
        self._peak_before = 0
        self._paused = False
        self._resumed: asyncio.Future[None] | None = None
        self._head_waiter: asyncio.Future[bytes | None] | None = None
        self.eof = False
        self.closed = False

    @property
    def served(self) -> int:
        """Requests this connection has read so far, the current one included."""
        return self._served

    # -- asyncio.Protocol ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._fd = transport.get_extra_info("socket").fileno()
        state = self.state
        state.connections += 1
        self._peak_before = state.peak_active
        state.active += 1
        state.peak_active = max(state.peak_active, state.active)
        state.live.add(self)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._idle():
            self._process()
        elif self._head_waiter is not None:
            self._feed_waiter()

    def eof_received(self) -> bool:
        self.eof = True
        if self._head_waiter is not None:
            self._feed_waiter()
        if self._timer is not None:
            return True  # finish the response first; _timer_fired closes
        if self._task is None:
            return False  # the transport closes itself
        if self._task_ends_on_eof:
            self._task.cancel()
            return False
        return True  # finish the response first; _task_done closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self._internal:
            self.state.active -= 1
        self.state.live.discard(self)
        if self._task is not None:
            self._task.cancel()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for fut in (self._resumed, self._head_waiter):
            if fut is not None and not fut.done():
                fut.cancel()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)

    # -- writing, for responders --------------------------------------------

    def write(self, *parts: bytes | memoryview) -> None:
        """Queue ``parts`` in order; one ``writev`` when nothing is queued before them."""
        t = self._transport
        if t is None or t.is_closing():
            return  # the fd may already be closed (and reused): never touch it
        if t.get_write_buffer_size() or len(parts) == 1:
            for part in parts:
                t.write(part)
            return
        try:
            sent = os.writev(self._fd, parts)
        except OSError:
            sent = 0  # the transport's own write meets the error again and reports it
        for part in parts:
            if sent >= len(part):
                sent -= len(part)
                continue
            t.write(memoryview(part)[sent:] if sent else part)
            sent = 0

    async def drain(self) -> None:
        """Wait while the transport holds more than its high-water mark."""
        while self._paused and not self.closed:
            self._resumed = asyncio.get_running_loop().create_future()
            await self._resumed

    async def flushed(self, timeout: float = 2.0) -> None:
        """Wait until everything written has been acknowledged by the peer (or ``timeout``).

        A reset (SO_LINGER 0) throws away unsent bytes, so the reset fault waits
        here first to make "half the body, then ECONNRESET" reliable.
        """
        deadline = time.monotonic() + timeout
        while not self.closed and time.monotonic() < deadline:
            t = self._transport
            if t is None or t.is_closing():
                return
            if not t.get_write_buffer_size() and _unacked(self._fd) == 0:
                return
            await asyncio.sleep(0.002)

    def close(self) -> None:
        """Close after the queued bytes are sent (FIN)."""
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Close now, dropping anything queued."""
        if self._transport is not None:
            self._transport.abort()

    async def reset(self) -> None:
        """Flush, then close with SO_LINGER 0 so the peer sees ECONNRESET."""
        await self.flushed()
        t = self._transport
        if t is None or t.is_closing():
            return
        t.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
        t.abort()

    # -- responses ----------------------------------------------------------

    def start(self, coro: Coroutine[Any, Any, bool], *, ends_on_eof: bool = False) -> None:
        """Run ``coro`` as this connection's current response; it returns "keep alive?"."""
        task = asyncio.get_running_loop().create_task(coro)
        self._task = task
        self._task_ends_on_eof = ends_on_eof
        self.state.tasks.add(task)
        task.add_done_callback(self._task_done)
        if ends_on_eof and self.eof:
            task.cancel()

    def answer_later(self, delay: float, respond: Callable[[], bool]) -> None:
        """Call ``respond`` (which writes and returns "keep alive?") after ``delay`` s."""
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(delay, self._timer_fired, respond)

    def _timer_fired(self, respond: Callable[[], bool]) -> None:
        self._timer = None
        if not self.closed:
            self._answered(respond())

    def _idle(self) -> bool:
        return self._task is None and self._timer is None

    def _task_done(self, task: asyncio.Task[bool]) -> None:
        self._task = None
        self.state.tasks.discard(task)
        if task.cancelled():
            self.abort()
            return
        exc = task.exception()
        if exc is not None:
            self.state.errors.append(exc)
            self.abort()
        else:
            self._answered(task.result())

    def _answered(self, keep_alive: bool) -> None:
        """A response is written: close, or go on with the next request in the buffer."""
        if not keep_alive or self.eof:
            self.close()
        elif not self.closed:
            self._process()

    async def next_head(self) -> bytes | None:
        """The next request head on this connection, or ``None`` at end of input.

        For scripts that hold the connection; counted and logged like any request.
        """
        head = self._take_head()
        if head is None and not self.eof and not self.closed:
            self._head_waiter = asyncio.get_running_loop().create_future()
            try:
                head = await self._head_waiter
            finally:
                self._head_waiter = None
        if head is not None:
            self.state.requests += 1
            self.state.log.append(head)
        return head

    def _feed_waiter(self) -> None:
        waiter = self._head_waiter
        if waiter is None or waiter.done():
            return
        head = self._take_head()
        if head is not None or self.eof:
            waiter.set_result(head)

    def _take_head(self) -> bytes | None:
        buf = self._buf
        while buf.startswith(b"\r\n"):  # RFC 9112 2.2: ignore CRLFs before a request
            del buf[:2]
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = bytes(buf[:end])
        del buf[: end + 4]
        return head

    def _process(self) -> None:
        """Answer every complete request in the buffer until one needs a task."""
        while self._idle() and not self.closed and not self._transport_closing():
            if self._skip:
                n = min(self._skip, len(self._buf))
                del self._buf[:n]
                self._skip -= n
                if self._skip:
                    return
            head = self._take_head()
            if head is None:
                if len(self._buf) > MAX_HEAD:
                    self.write(simple_response(431, "Too Large", b"head too large\n", close=True))
                    self.close()
                return
            try:
                request = parse_head(head)
                self._skip = request.body_length
            except BadRequest as exc:
                self.write(simple_response(400, "Bad Request", f"{exc}\n".encode(), close=True))
                self.close()
                return
            keep = self._dispatch(request)
            if keep is False:
                self.close()
                return

    def _transport_closing(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    def _dispatch(self, request: Request) -> bool | None:
        """Answer ``request``: True/False once written (keep alive?), None if a task answers."""
        state = self.state
        self._served += 1
        if request.path == "/_stats":
            return self._answer_stats(request)
        state.requests += 1
        state.log.append(request.head)
        handler = state.routes.get(request.path)
        if handler is not None:
            self.start(run_script(self, request, handler))
            return None
        if request.path.startswith("/files/"):
            return respond_file(self, request)
        self.write(simple_response(404, "Not Found", b"no such route\n"))
        return request.keep_alive

    def _answer_stats(self, request: Request) -> bool:
        if self._served == 1 and not self._internal:
            self._internal = True
            state = self.state
            state.connections -= 1
            if state.peak_active == state.active:  # this connection may have set the peak
                state.peak_active = max(self._peak_before, state.active - 1)
            state.active -= 1
        body = json.dumps(self.state.stats().to_dict()).encode()
        if "reset=1" in request.query:
            self.state.reset_stats()
        self.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        return request.keep_alive


def _unacked(fd: int) -> int:
    """Bytes sent but not yet acknowledged (Linux SIOCOUTQ); 0 where unknown."""
    with contextlib.suppress(OSError):
        out = fcntl.ioctl(fd, termios.TIOCOUTQ, _OUTQ)
        return int(struct.unpack("i", out)[0])
    return 0
