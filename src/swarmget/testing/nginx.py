"""A real nginx on loopback, for integration tests and benchmarks.

Theory of operation
-------------------
Our own test server scripts hostile behaviour byte by byte; this module gives the
opposite: a boring, fast, standards-following origin that serves a directory the
way production CDNs do (keep-alive, ``sendfile``, many connections).  Benchmarks
measure clients against it, so the server must never be the bottleneck.

Each :class:`Nginx` owns a private temporary directory holding its config, pid
file, logs and the temp paths nginx insists on, so it runs as root or as a plain
user without touching ``/etc`` or ``/var``.  It runs in the foreground
(``daemon off``) as our child, in its own process group: on exit we send SIGTERM
(nginx's "fast shutdown"), reap the master, and if anything hangs we SIGKILL the
whole group so no worker outlives the test.

Port choice has an unavoidable race: we bind port 0 to learn a free port, close
it, and let nginx bind it.  If someone else grabbed it in between, nginx exits at
once with "Address already in use" and we try another port.  nginx writes its
pid file only after it has bound its listening sockets, so "pid file exists and a
TCP connect succeeds while our process is still alive" means *our* nginx is up.

Test files (:func:`make_tree`) are deterministic: a file's bytes are a window
into one fixed pseudo-random pool, starting at an offset derived from the file's
name.  That is cheap to write (one slice per file, no per-block hashing) yet not
periodic at any small stride, so a client that drops, repeats or reorders a
buffer's worth of bytes produces a mismatch.
"""

from __future__ import annotations

import functools
import hashlib
import os
import resource
import ssl as _ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from swarmget.testing.daemons import Daemon, accepts, find_binary, free_port, terminate_group

__all__ = [
    "ECHO_MODULE",
    "Nginx",
    "NginxError",
    "ServedTree",
    "TlsFiles",
    "delayed_location",
    "expected_file_bytes",
    "find_module",
    "find_nginx",
    "make_tls_files",
    "make_tree",
]

_FALLBACK_PATHS = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
# Where Debian's libnginx-mod-* packages put dynamic modules (nginx-light pulls in
# libnginx-mod-http-echo), then the usual places of a build from source.
MODULE_DIRS = (
    Path("/usr/lib/nginx/modules"),
    Path("/usr/share/nginx/modules"),
    Path("/usr/local/nginx/modules"),
)
_START_TIMEOUT = 15.0
_PORT_ATTEMPTS = 8


class NginxError(RuntimeError):
    """nginx is missing, or failed to start; the message says which and why."""


def find_nginx() -> str | None:
    """Path of the nginx binary, or None when it is not installed."""
    return find_binary("nginx", _FALLBACK_PATHS)


def find_module(name: str) -> Path | None:
    """Path of the dynamic module ``name`` (``"ngx_http_echo_module"``), or None."""
    for directory in MODULE_DIRS:
        path = directory / f"{name}.so"
        if path.is_file():
            return path
    return None


ECHO_MODULE = "ngx_http_echo_module"


def delayed_location(seconds: float, prefix: str = "/delayed/") -> str:
    """An ``extra_locations`` block: ``{prefix}PATH`` answers with the file ``/PATH``
    after ``seconds``.  ``echo_sleep`` is a timer, not a blocked worker, so one
    nginx worker holds thousands of delayed responses at almost no CPU; the
    server needs ``modules=(ECHO_MODULE,)``."""
    return f"location ~ ^{prefix}(.*)$ {{ echo_sleep {seconds:g}; echo_exec /$1; }}"


class Nginx(Daemon):
    """nginx serving ``root`` on 127.0.0.1; use as a context manager.

    ``port=0`` picks a free port.  ``extra_locations`` is pasted into the
    ``server`` block verbatim (e.g. ``"location /old { return 301 /new; }"``).
    ``ssl=(cert_path, key_path)`` serves HTTPS (HTTP/1.1 only: no ``http2`` on
    the listen line) instead of HTTP.  ``modules`` names dynamic modules to load
    (``"ngx_http_echo_module"`` gives ``echo_sleep``, a response delayed without
    tying up the worker).
    """

    program = "nginx"
    error = NginxError

    def __init__(
        self,
        root: Path,
        *,
        port: int = 0,
        workers: int = 1,
        worker_connections: int = 16384,
        extra_locations: str = "",
        ssl: tuple[Path | str, Path | str] | None = None,
        modules: tuple[str, ...] = (),
    ) -> None:
        self.root = Path(root).resolve()
        self.modules = modules
        self._module_paths: list[Path] = []  # found when started
        self.workers = workers
        self.worker_connections = worker_connections
        self.extra_locations = extra_locations
        self.ssl = (Path(ssl[0]).resolve(), Path(ssl[1]).resolve()) if ssl else None
        self._requested_port = port
        super().__init__()

    # -- public surface ---------------------------------------------------------

    @property
    def scheme(self) -> str:
        return "https" if self.ssl else "http"

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    @property
    def pid(self) -> int | None:
        """The master process id while running, else None."""
        return self._proc.pid if self._proc is not None else None

    @property
    def error_log(self) -> str:
        """What nginx has written to its error log so far (for failure messages)."""
        return _tail(self._tmp / "error.log") if self._tmp else ""

    def start(self) -> None:
        self._check_not_running()
        binary = find_nginx()
        if binary is None:
            raise NginxError(
                "nginx is not installed (looked on PATH and in /usr/sbin); "
                "`./dev test` installs it, or run: apt-get install nginx-light"
            )
        if not self.root.is_dir():
            raise NginxError(f"nginx root {self.root} is not a directory")
        self._module_paths = [self._module_path(name) for name in self.modules]
        self._make_tmp("swarmget-nginx-")
        try:
            self._start_with_retries(binary)
        except BaseException:
            self.stop()
            raise

    # -- starting -----------------------------------------------------------------

    @staticmethod
    def _module_path(name: str) -> Path:
        path = find_module(name)
        if path is None:
            searched = ", ".join(str(d) for d in MODULE_DIRS)
            raise NginxError(
                f"nginx module {name} not found (looked in {searched}); Debian's "
                "nginx-light brings ngx_http_echo_module (libnginx-mod-http-echo)"
            )
        return path

    def _start_with_retries(self, binary: str) -> None:
        attempts = 1 if self._requested_port else _PORT_ATTEMPTS
        failure = ""
        for _ in range(attempts):
            port = self._requested_port or free_port()
            failure = self._try_start(binary, port)
            if not failure:
                self._port = port
                return
            if "in use" not in failure:
                break
        raise NginxError(f"nginx failed to start: {failure}")

    def _try_start(self, binary: str, port: int) -> str:
        """Start nginx on ``port``; return "" when it serves, else why it did not."""
        assert self._tmp is not None
        conf = self._tmp / "nginx.conf"
        conf.write_text(self._config(port))
        pid_file = self._tmp / "nginx.pid"
        pid_file.unlink(missing_ok=True)
        (self._tmp / "error.log").unlink(missing_ok=True)
        proc = self._spawn([binary, "-p", f"{self._tmp}/", "-c", str(conf)])
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self._proc = None
                return self._why_dead(proc)
            if pid_file.exists() and accepts(port):
                return ""
            if "in use" in self._logs():
                # nginx retries bind() for 2.5 s before giving up; don't wait for it.
                self._proc = None
                terminate_group(proc, self.stop_timeout)
                return f"port {port} is in use\n{self._logs()}"
            time.sleep(0.01)
        self._proc = None
        terminate_group(proc, self.stop_timeout)
        return f"not accepting connections on port {port} after {_START_TIMEOUT}s\n{self._logs()}"

    def _why_dead(self, proc: subprocess.Popen[bytes]) -> str:
        return f"exit status {proc.returncode}\n{self._logs()}"

    def _logs(self) -> str:
        assert self._tmp is not None
        return (_tail(self._tmp / "stderr.log") + "\n" + _tail(self._tmp / "error.log")).strip()

    def _config(self, port: int) -> str:
        assert self._tmp is not None
        tmp = self._tmp
        for sub in ("logs", "client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (tmp / sub).mkdir(exist_ok=True)
        # As root, nginx would switch workers to "nobody", who may not read a
        # 0700 pytest tmp dir; as a plain user the directive only warns.
        user = "user root;" if os.geteuid() == 0 else ""
        listen = f"127.0.0.1:{port} backlog=4096" + (" ssl" if self.ssl else "")
        tls = ""
        if self.ssl:
            cert, key = self.ssl
            tls = f"""
        ssl_certificate {_quote(cert)};
        ssl_certificate_key {_quote(key)};
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache shared:SSL:10m;
        ssl_session_timeout 10m;"""
        modules = "".join(f"load_module {_quote(path)};\n" for path in self._module_paths)
        return f"""# written by swarmget.testing.nginx
{modules}{user}
daemon off;
master_process on;
worker_processes {self.workers};
worker_rlimit_nofile {_nofile_for(self.worker_connections)};
pid {_quote(tmp / "nginx.pid")};
error_log {_quote(tmp / "error.log")} warn;

events {{
    worker_connections {self.worker_connections};
    multi_accept on;
}}

http {{
    access_log off;
    client_body_temp_path {_quote(tmp / "client_body")};
    proxy_temp_path {_quote(tmp / "proxy")};
    fastcgi_temp_path {_quote(tmp / "fastcgi")};
    uwsgi_temp_path {_quote(tmp / "uwsgi")};
    scgi_temp_path {_quote(tmp / "scgi")};

    types {{
        text/html html;
        text/plain txt;
        application/json json;
        image/jpeg jpg jpeg;
        image/png png;
    }}
    default_type application/octet-stream;

    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_requests 100000;
    keepalive_timeout 65s;
    server_tokens off;

    server {{
        listen {listen};
        server_name localhost;
        root {_quote(self.root)};{tls}

        location / {{
        }}

{self.extra_locations}
    }}
}}
"""


@dataclass(frozen=True)
class ServedTree:
    """A running :class:`Nginx` plus the files :func:`make_tree` wrote under its root."""

    nginx: Nginx
    root: Path
    names: list[str] = field(repr=False)
    size: int

    @property
    def port(self) -> int:
        return self.nginx.port

    @property
    def base_url(self) -> str:
        return self.nginx.base_url

    def url(self, path: str) -> str:
        return self.nginx.url(path)

    def urls(self) -> list[str]:
        return [self.nginx.url(name) for name in self.names]

    def expected(self, name: str) -> bytes:
        return expected_file_bytes(name, self.size)


# -- deterministic files ----------------------------------------------------------

# Odd, not a power of two, so the pool never lines up with a client's buffer size.
_POOL_SIZE = (1 << 20) - 3


@functools.cache
def _pool() -> bytes:
    return hashlib.shake_256(b"swarmget test pool v1").digest(_POOL_SIZE)


def expected_file_bytes(name: str, size: int) -> bytes:
    """The exact content :func:`make_tree` writes for ``name`` at ``size`` bytes."""
    pool = _pool()
    start = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % _POOL_SIZE
    if start + size <= _POOL_SIZE:
        return pool[start : start + size]
    parts = [pool[start:]]
    remaining = size - (_POOL_SIZE - start)
    while remaining > 0:
        chunk = pool[: min(remaining, _POOL_SIZE)]
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


def make_tree(
    root: Path,
    count: int,
    size: int,
    *,
    prefix: str = "img",
    name_fmt: str = "{prefix}{i:06d}.jpg",
) -> list[str]:
    """Write ``count`` files of ``size`` bytes under ``root``; return their relative names.

    ``name_fmt`` may contain ``/`` to spread files over subdirectories.
    """
    # Plain strings and raw fds: at 10,000 files, pathlib overhead is measurable.
    base = os.fspath(root)
    os.makedirs(base, exist_ok=True)
    made_dirs = {""}
    names: list[str] = []
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    for i in range(count):
        name = name_fmt.format(prefix=prefix, i=i)
        parent = os.path.dirname(name)
        if parent not in made_dirs:
            os.makedirs(os.path.join(base, parent), exist_ok=True)
            made_dirs.add(parent)
        data = memoryview(expected_file_bytes(name, size))
        fd = os.open(os.path.join(base, name), flags, 0o644)
        try:
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
        names.append(name)
    return names


# -- TLS --------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost, as PEM files."""

    ca_pem: Path
    cert_pem: Path
    key_pem: Path

    @property
    def server(self) -> tuple[Path, Path]:
        """The ``ssl=`` argument for :class:`Nginx`."""
        return (self.cert_pem, self.key_pem)

    def client_context(self) -> _ssl.SSLContext:
        """A client context that trusts only this CA."""
        return _ssl.create_default_context(cafile=str(self.ca_pem))


def make_tls_files(directory: Path) -> TlsFiles:
    """Make a CA and a server cert for 127.0.0.1 and localhost with trustme."""
    import trustme  # test extra; imported lazily so the package does not need it

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    ca.cert_pem.write_to_path(str(files.ca_pem))
    cert.cert_chain_pems[0].write_to_path(str(files.cert_pem))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(files.cert_pem), append=True)
    cert.private_key_pem.write_to_path(str(files.key_pem))
    return files


# -- helpers ----------------------------------------------------------------------


def _nofile_for(worker_connections: int) -> int:
    # A served connection holds a socket and an open file.  Stay within our hard
    # limit: even root may lack CAP_SYS_RESOURCE in a container, and nginx would
    # log an alert for every worker.
    want = 2 * worker_connections + 64
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return want if hard == resource.RLIM_INFINITY else min(want, hard)


def _quote(path: Path) -> str:
    text = str(path)
    if any(c in text for c in " ;{}\"'\\$"):
        raise NginxError(f"path {text!r} has characters nginx config cannot take")
    return text


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode(errors="replace")
