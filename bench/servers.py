"""The servers a scenario downloads from, each a context manager that always stops.

* :func:`nginx`: ``swarmget.testing.nginx.Nginx`` (one worker) with a stub_status
  location added, for the throughput scenarios (plain HTTP, or HTTPS with a
  throwaway CA).
  With ``delay``, nginx also answers ``/delayed/NAME`` with ``NAME`` after that
  many seconds (the echo module's ``echo_sleep``, which Debian's nginx-light
  brings): delayed responses from a server that costs the shared cores
  almost nothing.
* :func:`scripted_server`: the scripted test server ``swarmget.testing`` in its own
  process (so it shares neither the GIL nor the CPU accounting of the tool under
  test), for the scenarios the issue sets on it.  It is Python: about 100 us of
  CPU per response, taken from the same two cores as the tool's.

Both are wrapped to expose the same two calls, :meth:`reset_counters` before a
tool runs and :meth:`counters` after it: how many connections the tool opened
(the keep-alive check: it should be about the concurrency, not the file count)
and, where the server can tell, how many it held open at once.  And
:meth:`cpu_seconds`: the CPU the server has used so far, read around each run.
The server shares the two cores with the tool, so what it spends is time the
tool cannot have: the goals' arithmetic (how fast any client could be) needs it.
"""

from __future__ import annotations

import os
import ssl
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from swarmget.testing.nginx import TlsFiles

STATUS_PATH = "/_bench_status"
# nginx keeps the served files' descriptors open between requests, as a
# production file server would: the server shares this machine's two cores with
# the tool under test, so every microsecond it spends in open()/close() is one
# the client cannot use.  The same server serves every tool.
OPEN_FILE_CACHE = "open_file_cache max=100000 inactive=300s; open_file_cache_valid 300s;"


class BenchServer:
    """What run.py needs from a server: URLs, expected bodies and connection counters."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def url(self, path: str) -> str:
        return str(self.inner.url(path))

    def reset_counters(self) -> None:
        raise NotImplementedError

    def counters(self) -> dict[str, int | None]:
        """``opened``: connections accepted since the reset; ``peak_open``: most open
        at once since the reset (None when the server cannot tell)."""
        raise NotImplementedError

    def cpu_seconds(self) -> float | None:
        """User + system CPU the server's processes have used so far (None: unknown)."""
        return None


def cpu_seconds(pids: list[int]) -> float | None:
    """User + system CPU of ``pids`` so far, from /proc (None off Linux, or if one
    of them is gone).  Clock ticks: 10 ms resolution, fine for sums over a run."""
    from swarmget.testing.daemons import proc_stat

    total = 0
    for pid in pids:
        fields = proc_stat(pid)
        if fields is None:
            return None
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


# -- nginx ------------------------------------------------------------------------------


class NginxServer(BenchServer):
    """Counters from nginx's stub_status (accepts since the reset; no peak)."""

    _accepts_at_reset = 0
    context: ssl.SSLContext | None = None  # trusts the server's CA when it serves HTTPS

    def _accepts(self) -> int:
        url = self.url(STATUS_PATH)
        with urllib.request.urlopen(url, timeout=10, context=self.context) as response:
            lines = response.read().decode().splitlines()
        # "Active connections: N" / "server accepts handled requests" / "A H R"
        return int(lines[2].split()[0])

    def reset_counters(self) -> None:
        self._accepts_at_reset = self._accepts()

    def counters(self) -> dict[str, int | None]:
        # The status request made now is one accept of its own.
        return {"opened": self._accepts() - self._accepts_at_reset - 1, "peak_open": None}

    def cpu_seconds(self) -> float | None:
        from swarmget.testing.daemons import group_members

        master = self.inner.pid  # nginx runs in a session of its own: the group is it
        return None if master is None else cpu_seconds(group_members(master))


@contextmanager
def nginx(
    root: Path,
    *,
    worker_connections: int = 16384,
    tls: TlsFiles | None = None,
    delay: float | None = None,
) -> Iterator[NginxServer]:
    """``tls``: serve HTTPS with that certificate (TLS 1.2/1.3, session cache on).
    ``delay``: also serve ``/delayed/NAME`` after ``delay`` seconds."""
    from swarmget.testing.nginx import ECHO_MODULE, Nginx, delayed_location

    extra = f"location = {STATUS_PATH} {{ stub_status; access_log off; }}\n" + OPEN_FILE_CACHE
    if delay is not None:
        extra += "\n" + delayed_location(delay)
    with Nginx(
        root,
        workers=1,
        worker_connections=worker_connections,
        extra_locations=extra,
        ssl=tls.server if tls else None,
        modules=(ECHO_MODULE,) if delay is not None else (),
    ) as server:
        wrapped = NginxServer(server)
        wrapped.context = tls.client_context() if tls else None
        yield wrapped


# -- the scripted test server -----------------------------------------------------------


class ScriptedServer(BenchServer):
    """``swarmget.testing.serve_in_subprocess()``: counters from its ``/_stats``."""

    def file_url(self, name: str, size: int, latency: float) -> str:
        return str(self.inner.file_url(name, size=size, latency=latency))

    def reset_counters(self) -> None:
        self.inner.reset_stats()

    def counters(self) -> dict[str, int | None]:
        stats = self.inner.stats
        return {"opened": stats.connections, "peak_open": stats.peak_active}

    def cpu_seconds(self) -> float | None:
        pid = self.inner.pid  # one process (its threads count in its own stat)
        return None if pid is None else cpu_seconds([pid])


@contextmanager
def scripted_server() -> Iterator[ScriptedServer]:
    from swarmget.testing import serve_in_subprocess

    with serve_in_subprocess() as server:
        yield ScriptedServer(server)
