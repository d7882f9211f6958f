"""The test server in a child process: ``python -m swarmget.testing``.

Benchmarks and the demo measure our client, so the server must not share its
GIL (or its CPU time accounting).  The child prints its URL on stdout once it
is listening; we read that one line and then leave the pipe alone.  We hold
the child's stdin open and never write to it: when this process dies, for any
reason, the child sees EOF there and exits, so no server outlives its test.  Stats come
back over HTTP from the child's ``/_stats`` endpoint, which does not count
itself.  Routes (Python callables) cannot cross the process boundary: a
subprocess server only has the URL-driven behaviour of ``/files``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from swarmget.testing.content import DEFAULT_SIZE
from swarmget.testing.state import ServerStats
from swarmget.testing.urls import ServerUrls

# The directory that holds the ``swarmget`` package, so the child imports this
# very copy even when swarmget is not installed (running from a checkout), and
# the compiled build when that is the one running (./dev puts it first).
_IMPORT_ROOT = str(Path(__file__).resolve().parents[2])


def open_files() -> list[str]:
    """What this process's descriptors are open on (``/proc/self/fd`` links:
    paths, ``pipe:[...]``, ``socket:[...]``), for tests of descriptor leaks."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
    return found


def child_env() -> dict[str, str]:
    """``os.environ`` with PYTHONPATH set so that a child Python imports this
    same copy of swarmget, compiled or not."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_IMPORT_ROOT, env.get("PYTHONPATH")]))
    return env


class ProcessServer(ServerUrls):
    """A test server in a child process, with the same URL helpers as TestServer."""

    __test__ = False

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        latency: float = 0.0,
        default_size: int = DEFAULT_SIZE,
        startup_timeout: float = 30.0,
    ) -> None:
        self.host = host
        self.port = port
        self.latency = latency
        self.default_size = default_size
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> Self:
        if self._proc is not None:
            raise RuntimeError("ProcessServer already started")
        cmd = [sys.executable, "-m", "swarmget.testing", "--host", self.host]
        cmd += ["--port", str(self.port), "--latency", repr(self.latency)]
        cmd += ["--default-size", str(self.default_size), "--exit-on-stdin-eof"]
        env = child_env()
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.PIPE, env=env)
        # A handle dropped without stop() must not leave a server running.
        self._finalizer = weakref.finalize(self, _terminate, self._proc)
        try:
            self.port = _read_port(self._proc, self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM the child (it closes its sockets and exits), then reap it."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if self._finalizer is not None:
                self._finalizer.detach()
            _terminate(proc)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def stats(self) -> ServerStats:
        return ServerStats.from_dict(self._get_stats(""))

    def reset_stats(self) -> None:
        self._get_stats("?reset=1")

    def _get_stats(self, query: str) -> dict[str, int]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request("GET", "/_stats" + query)
            data: dict[str, int] = json.loads(conn.getresponse().read())
            return data
        finally:
            conn.close()


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def _read_port(proc: subprocess.Popen[bytes], timeout: float) -> int:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("test server subprocess did not report its URL")
        readable, _, _ = select.select([proc.stdout], [], [], left)
        if not readable:
            continue
        line = proc.stdout.readline().decode().strip()
        if not line:
            raise RuntimeError(f"test server subprocess exited (status {proc.wait()})")
        if line.startswith("http://"):
            return int(line.rsplit(":", 1)[1].rstrip("/"))


@contextlib.contextmanager
def serve_in_subprocess(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    latency: float = 0.0,
    default_size: int = DEFAULT_SIZE,
) -> Iterator[ProcessServer]:
    """``with serve_in_subprocess() as srv: ...``: a started ProcessServer, stopped at exit."""
    with ProcessServer(host, port, latency=latency, default_size=default_size) as srv:
        yield srv
