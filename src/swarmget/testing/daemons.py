"""Running real server programs (nginx, tinyproxy) for tests: find, probe, stop."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Self

from swarmget.parallel.deathsig import parent_death_signal

STOP_TIMEOUT = 10.0


def find_binary(name: str, fallbacks: Iterable[str] = ()) -> str | None:
    """Path of program ``name`` on PATH or at one of ``fallbacks``, else None."""
    found = shutil.which(name)
    if found:
        return found
    for candidate in fallbacks:
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (callers retry on a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def accepts(port: int) -> bool:
    """Does something accept TCP connections on 127.0.0.1:``port``?"""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (``state ppid
    pgrp ...``: field 3 of proc(5) is item 0); None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces and ")"


def group_members(pgid: int) -> list[int]:
    """Pids whose process group is ``pgid`` (a daemon's master and its workers),
    from /proc; empty where there is no /proc."""
    try:
        entries = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []
    return [pid for pid in entries if (fields := proc_stat(pid)) and int(fields[2]) == pgid]


def terminate_group(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM and reap; SIGKILL the whole process group if it hangs or died early.

    The program must have been started with ``start_new_session=True``.  A
    master that exits normally has already reaped its workers; the group kill
    is for one that hangs, or that died on its own and left orphaned workers.
    """
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux SIGTERM the daemon when we die.

    ``stop()`` and the context manager end a daemon whenever Python gets to
    run them; a test run killed outright (SIGKILL, a CI timeout) does not, and
    nginx in its own session would serve on forever.  The parent-death signal
    is tied to the *thread* that forked, so it is asked for only from the main
    thread (a daemon started by a passing thread would die with that thread);
    elsewhere, and off Linux, None (no preexec_fn).
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    ask = parent_death_signal()
    if ask is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        ask()
        if os.getppid() != parent:  # we died between the fork and the prctl
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class Daemon:
    """What nginx and tinyproxy share: a process group, a temp dir, a port.

    Subclasses set ``_proc`` and ``_port`` in ``start()``; ``stop()`` reaps the
    group and removes the temp dir, and is idempotent.
    """

    stop_timeout = STOP_TIMEOUT
    program = "the daemon"  # its name in error messages
    error: type[RuntimeError] = RuntimeError  # what its misuse and failures raise

    def __init__(self) -> None:
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: Path | None = None

    def start(self) -> None:
        raise NotImplementedError

    @property
    def port(self) -> int:
        if self._port is None:
            raise self.error(f"{self.program} is not running (use it as a context manager)")
        return self._port

    def _check_not_running(self) -> None:
        if self._proc is not None:
            raise self.error(f"{self.program} is already running")

    def _make_tmp(self, prefix: str) -> Path:
        self._tmp = Path(tempfile.mkdtemp(prefix=prefix))
        return self._tmp

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start ``argv`` as ``_proc``, in its own process group (so ``stop()`` can
        reap every worker it forks), its output to ``stderr.log`` in the temp dir."""
        assert self._tmp is not None
        with open(self._tmp / "stderr.log", "wb") as stderr:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=_die_with_parent(),
            )
        return self._proc

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            terminate_group(proc, self.stop_timeout)
        self._port = None
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
