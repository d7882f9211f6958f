"""Happy Eyeballs: connect to whichever of a host's addresses answers first.

Theory of operation
-------------------
A name often resolves to several addresses, IPv6 and IPv4.  Trying them one
after another means an address that silently drops our SYN (a broken IPv6
route, a dead backend left in DNS) costs a full connect timeout before the next
is tried.  RFC 8305 (Happy Eyeballs v2) instead races them with a short head
start each: the addresses are reordered to alternate families (``interleave``),
the first attempt starts at once, and each next one starts when the previous
fails or after a *connection attempt delay* (250 ms), whichever comes first.
The first attempt to connect wins; the others are closed.

:class:`HappyEyeballs` does this on our EventLoop: each attempt is a
non-blocking socket registered for writability under an :class:`_Attempt`
handler (the loop calls handlers with a mask only, so each socket needs its own
small handler object).  Two timers at most: the stagger, and the deadline that
bounds the whole race (``timeout``), so an attempt list of unreachable
addresses fails in ``timeout``, not ``timeout`` per address.

The winner's socket is handed over unregistered, still non-blocking, with
``TCP_NODELAY`` set: the caller registers it as its own.  Failure is delivered
with ``loop.call_soon``, never inside :meth:`HappyEyeballs.start`, so a caller
that opens connections in a loop does not recurse when every address fails at
once (no route, refused).  The engine uses this only for names with more than
one address; a single address goes straight to ``start_connect``.
"""

from __future__ import annotations

import errno
import itertools
import os
import socket
from collections.abc import Callable, Sequence

from swarmget.errors import ErrorCode, TransferError
from swarmget.loop import EVENT_WRITE, EventLoop, Timer
from swarmget.net.address import Address
from swarmget.net.connect import connect_result, start_connect

CONNECTION_ATTEMPT_DELAY = 0.25  # RFC 8305 §8: the recommended default

DialCallback = Callable[[socket.socket | None, TransferError | None], None]


def interleave(addresses: Sequence[Address]) -> list[Address]:
    """Alternate address families, starting with the first one's (RFC 8305 §4).

    The resolver's order (RFC 6724 preference) is kept within each family.
    """
    if len(addresses) < 2:
        return list(addresses)
    first = addresses[0][0]
    preferred = [a for a in addresses if a[0] == first]
    others = [a for a in addresses if a[0] != first]
    merged = itertools.chain.from_iterable(itertools.zip_longest(preferred, others))
    return [a for a in merged if a is not None]


def _ignore(sock: socket.socket | None, error: TransferError | None) -> None:
    pass


class _Attempt:
    __slots__ = ("address", "fd", "owner", "sock")

    def __init__(self, owner: HappyEyeballs, address: Address, sock: socket.socket) -> None:
        self.owner = owner
        self.address = address
        self.sock = sock
        self.fd = sock.fileno()

    def handle_io(self, mask: int) -> None:
        self.owner._attempt_done(self)


class HappyEyeballs:
    """Race connects to ``addresses``; ``callback(sock, None)`` or ``(None, error)`` once."""

    __slots__ = (
        "_addresses",
        "_attempts",
        "_callback",
        "_deadline",
        "_done",
        "_last_error",
        "_loop",
        "_next",
        "_stagger",
        "_stagger_timer",
        "_timeout",
        "_where",
        "started",
    )

    def __init__(
        self,
        loop: EventLoop,
        addresses: Sequence[Address],
        callback: DialCallback,
        *,
        timeout: float,
        stagger: float = CONNECTION_ATTEMPT_DELAY,
        where: str = "",
    ) -> None:
        self._loop = loop
        self._where = where  # in messages after "connect": " to proxy P (--proxy)"
        self._addresses = interleave(addresses)
        self._callback = callback
        self._timeout = timeout
        self._stagger = stagger
        self._next = 0  # index of the next address to try
        self._attempts: list[_Attempt] = []  # in flight
        self._stagger_timer: Timer | None = None
        self._deadline: Timer | None = None
        self._last_error = errno.EHOSTUNREACH
        self._done = False
        self.started = loop.now  # loop time: how long it has been trying (for progress)

    def start(self) -> None:
        # Timers from the clock, not loop.now: the turn may have started a while ago.
        self._deadline = self._loop.call_at(self._loop.time() + self._timeout, self._timed_out)
        self._try_next()

    def cancel(self) -> None:
        """Stop without calling back (the engine is shutting down)."""
        self._callback = _ignore
        self._finish()

    def abandon(self, error: TransferError) -> None:
        """Stop now and call back with ``error`` (the host was given up meanwhile)."""
        if not self._done:
            self._fail(error)

    # -- the race ---------------------------------------------------------------------

    def _try_next(self) -> None:
        """Start the next attempt that does not fail at once; then wait or give up."""
        if self._stagger_timer is not None:
            self._stagger_timer.cancel()
            self._stagger_timer = None
        addresses = self._addresses
        while self._next < len(addresses):
            address = addresses[self._next]
            self._next += 1
            sock, err = start_connect(address)
            if err == errno.EINPROGRESS:
                assert sock is not None
                attempt = _Attempt(self, address, sock)
                self._attempts.append(attempt)
                self._loop.add(attempt.fd, EVENT_WRITE, attempt)
                if self._next < len(addresses):
                    when = self._loop.time() + self._stagger
                    self._stagger_timer = self._loop.call_at(when, self._try_next)
                return
            self._last_error = err  # refused / unreachable at once: next address now
        if not self._attempts:
            self._fail(
                TransferError(
                    ErrorCode.CONNECT,
                    f"connect{self._where} failed: {os.strerror(self._last_error)} "
                    f"({len(addresses)} addresses tried)",
                )
            )

    def _attempt_done(self, attempt: _Attempt) -> None:
        if self._done:
            return  # a loser that was ready in the same loop turn as the winner
        err = connect_result(attempt.sock)
        self._attempts.remove(attempt)
        self._loop.remove(attempt.fd)
        if err == 0:
            sock = attempt.sock
            self._finish()
            self._call_back(sock, None)
            return
        attempt.sock.close()
        self._last_error = err
        # A failed attempt forfeits the rest of its head start (RFC 8305 §5).
        if self._next < len(self._addresses) or not self._attempts:
            self._try_next()

    def _timed_out(self) -> None:
        self._deadline = None
        self._fail(
            TransferError(
                ErrorCode.TIMEOUT, f"connect{self._where} timed out after {self._timeout:g}s"
            )
        )

    def _fail(self, error: TransferError) -> None:
        self._finish()
        self._loop.call_soon(self._report_failure, error)

    def _report_failure(self, error: TransferError) -> None:
        self._call_back(None, error)  # looked up now: cancel() may have come in between

    def _call_back(self, sock: socket.socket | None, error: TransferError | None) -> None:
        # Once, and then let go of the callback: it usually refers to this race
        # (to forget it), a cycle only the garbage collector would break, with
        # the pool and the transfer inside -- one per new host of a long list.
        callback, self._callback = self._callback, _ignore
        callback(sock, error)

    def _finish(self) -> None:
        """Close the losers and stop the timers; after this nothing calls back."""
        if self._done:
            return
        self._done = True
        for attempt in self._attempts:
            self._loop.remove(attempt.fd)
            attempt.sock.close()
        self._attempts.clear()
        for timer in (self._stagger_timer, self._deadline):
            if timer is not None:
                timer.cancel()
        self._stagger_timer = self._deadline = None
