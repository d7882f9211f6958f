"""A real http proxy (Debian's tinyproxy) on loopback, for the proxy tests.

Like :mod:`swarmget.testing.nginx`: a private temporary directory holds the
config, pid file and log, so it runs as root or a plain user without touching
``/etc``; it runs in the foreground (``-d``) as our child in its own process
group, and stops with SIGTERM (SIGKILL of the group if it hangs).  The port is
picked the same racy way (bind 0, close, let tinyproxy bind it; retry when it
says the address is in use).

The log (``LogLevel Info``) is how tests prove the proxy carried a request:
:meth:`TinyProxy.requests` lists the request lines it received, e.g.
``GET http://127.0.0.1:8080/a HTTP/1.1`` or ``CONNECT 127.0.0.1:8443 HTTP/1.1``.

Two tinyproxy habits the tests rely on: it closes the client connection after
each forwarded request without saying ``Connection: close`` (so the client
sees a keep-alive connection die), and it answers a CONNECT to a port outside
``ConnectPort`` with 403, missing ``BasicAuth`` credentials with 407 and wrong
ones with 401 (sic).  ``BasicAuth`` takes only letters, digits and ``-._``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from pathlib import Path

from swarmget.testing.daemons import Daemon, accepts, find_binary, free_port, terminate_group

__all__ = ["TinyProxy", "TinyProxyError", "find_tinyproxy"]

_FALLBACK_PATHS = ("/usr/bin/tinyproxy", "/usr/sbin/tinyproxy", "/usr/local/bin/tinyproxy")
_START_TIMEOUT = 10.0
_PORT_ATTEMPTS = 8
_REQUEST_LINE = re.compile(r"Request \(file descriptor \d+\): (.*)$", re.MULTILINE)


class TinyProxyError(RuntimeError):
    """tinyproxy is missing or failed to start; the message says which and why."""


def find_tinyproxy() -> str | None:
    """Path of the tinyproxy binary, or None when it is not installed."""
    return find_binary("tinyproxy", _FALLBACK_PATHS)


class TinyProxy(Daemon):
    """tinyproxy on 127.0.0.1; use as a context manager.

    ``auth=(user, password)`` requires Basic credentials (``BasicAuth``);
    ``connect_ports`` limits CONNECT to those ports (default: any port).
    """

    stop_timeout = 5.0
    program = "tinyproxy"
    error = TinyProxyError

    def __init__(
        self, *, auth: tuple[str, str] | None = None, connect_ports: Iterable[int] = ()
    ) -> None:
        self.auth = auth
        self.connect_ports = tuple(connect_ports)
        super().__init__()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``, with the configured credentials when there are some."""
        if self.auth is None:
            return f"http://127.0.0.1:{self.port}"
        return self.url_with(*self.auth)

    def url_with(self, user: str, password: str) -> str:
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return _read(self._tmp / "tinyproxy.log") if self._tmp else ""

    def requests(self) -> list[str]:
        """The request lines tinyproxy has received so far, oldest first."""
        return _REQUEST_LINE.findall(self.log)

    def start(self) -> None:
        self._check_not_running()
        binary = find_tinyproxy()
        if binary is None:
            raise TinyProxyError(
                "tinyproxy is not installed; `./dev test` installs it, "
                "or run: apt-get install tinyproxy"
            )
        self._make_tmp("swarmget-tinyproxy-")
        try:
            failure = ""
            for _ in range(_PORT_ATTEMPTS):
                port = free_port()
                failure = self._try_start(binary, port)
                if not failure:
                    self._port = port
                    return
                if "in use" not in failure:
                    break
            raise TinyProxyError(f"tinyproxy failed to start: {failure}")
        except BaseException:
            self.stop()
            raise

    def _try_start(self, binary: str, port: int) -> str:
        """Start on ``port``; return "" once it listens, else why it did not."""
        assert self._tmp is not None
        conf = self._tmp / "tinyproxy.conf"
        conf.write_text(self._config(port))
        log = self._tmp / "tinyproxy.log"
        log.unlink(missing_ok=True)
        proc = self._spawn([binary, "-d", "-c", str(conf)])
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            text = _read(log)
            if proc.poll() is not None:
                self._proc = None
                terminate_group(proc, self.stop_timeout)
                detail = (text + _read(self._tmp / "stderr.log"))[-3000:]
                if "Could not create listening sockets" in detail:  # what a taken port says
                    return f"port {port} is in use: {detail}"
                return f"exit status {proc.returncode}: {detail}"
            if "Starting main loop" in text and accepts(port):
                return ""
            time.sleep(0.01)
        self._proc = None
        terminate_group(proc, self.stop_timeout)
        return f"not listening on port {port} after {_START_TIMEOUT}s"

    def _config(self, port: int) -> str:
        assert self._tmp is not None
        lines = [
            "# written by swarmget.testing.tinyproxy",
            f"Port {port}",
            "Listen 127.0.0.1",
            "Timeout 30",
            f'LogFile "{self._tmp / "tinyproxy.log"}"',
            "LogLevel Info",
            f'PidFile "{self._tmp / "tinyproxy.pid"}"',
            "MaxClients 256",
            "Allow 127.0.0.1",
        ]
        if self.auth is not None:
            lines.append(f"BasicAuth {self.auth[0]} {self.auth[1]}")
        lines.extend(f"ConnectPort {p}" for p in self.connect_ports)
        return "\n".join(lines) + "\n"


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
