"""What one test server shares between its connections: routes, counters, errors.

Everything here is touched only from the server's event-loop thread, except
the plain reads a test does of the counters, which CPython makes safe enough
for integers, and ``routes``, which a test may add to while the server runs
(a single dict assignment is atomic).
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from swarmget.testing.content import DEFAULT_SIZE

if TYPE_CHECKING:
    from swarmget.testing.connection import ServerConnection
    from swarmget.testing.script import ScriptedConnection

# A route handler gets the raw request head and a connection to script.  It may
# be a plain function (its calls on the connection are played back in order
# once it returns) or a coroutine function (which can also wait for them).
RouteHandler = Callable[[bytes, "ScriptedConnection"], Awaitable[None] | None]

# Heads kept for ServerState.log; enough for any test, small enough for the demo.
LOG_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class ServerStats:
    connections: int  # connections accepted (the /_stats endpoint's own are not counted)
    requests: int  # request heads received (not counting /_stats)
    active: int  # connections open right now
    peak_active: int  # most connections open at once

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerStats:
        return cls(
            **{k: int(data[k]) for k in ("connections", "requests", "active", "peak_active")}
        )


class ServerState:
    def __init__(self, *, latency: float = 0.0, default_size: int = DEFAULT_SIZE) -> None:
        self.latency = latency  # default delay for /files responses without latency=
        self.default_size = default_size
        self.routes: dict[str, RouteHandler] = {}
        self.connections = 0
        self.requests = 0
        self.active = 0
        self.peak_active = 0
        self.hits: Counter[str] = Counter()  # request targets seen, for the times= option
        self.errors: list[BaseException] = []  # exceptions raised by handlers (or by us)
        self.log: deque[bytes] = deque(maxlen=LOG_LIMIT)
        self.tasks: set[asyncio.Task[bool]] = set()
        self.live: set[ServerConnection] = set()

    def stats(self) -> ServerStats:
        return ServerStats(self.connections, self.requests, self.active, self.peak_active)

    def reset_stats(self) -> None:
        self.connections = self.requests = 0
        self.peak_active = self.active
        self.hits.clear()
        self.log.clear()
