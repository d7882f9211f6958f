"""swarmget inside a host program: the caller's signal set-up, its forks, its limits.

Each case runs in a child interpreter of its own (a signal disposition set in
the test process would outlive the test), against one test server.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmget.testing import ProcessServer, serve_in_subprocess
from swarmget.testing.process import child_env

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork and POSIX signals")


@pytest.fixture(scope="module")
def server() -> Iterator[ProcessServer]:
    with serve_in_subprocess() as srv:
        yield srv


def run_script(body: str, server: ProcessServer, tmp_path: Path, timeout: float = 90) -> str:
    """Run ``body`` (with ``base``, the server's address, and ``out``, a fresh
    directory, defined) in a child interpreter; return its stdout, failing the
    test with its stderr if it did not exit 0."""
    prelude = (
        f"import os, signal, sys, time\nimport swarmget\nbase = {server.url('').rstrip('/')!r}\n"
    )
    prelude += f"out = {str(tmp_path / 'out')!r}\n"
    script = prelude + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(),
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("how", ["ignored", "reaped"])
def test_runs_work_when_the_caller_ignores_or_reaps_its_children(
    how: str, server: ProcessServer, tmp_path: Path
) -> None:
    # With SIGCHLD ignored (or a handler reaping every child), waitpid learns
    # nothing of an ended worker: multiprocessing called it alive forever, and
    # closing the backend raised "Cannot close a process while it is still running".
    body = """
    if HOW == "ignored":
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    else:
        def reap(signum, frame):
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                pass
        signal.signal(signal.SIGCHLD, reap)
    urls = [f"{base}/files/c{i}.bin?size=500" for i in range(300)]
    report = swarmget.download(urls, out, workers=2)
    print("download", report.ok, report.failed)
    with swarmget.stream(urls[:50], workers=2) as items:
        print("stream", sum(item.ok for item in items))
    with swarmget.stream(urls, workers=2) as items:
        for n, item in enumerate(items):
            if n == 3:
                break
    print("closed early")
    """.replace("HOW", repr(how))
    output = run_script(body, server, tmp_path)
    assert output.split("\n")[:3] == ["download 300 0", "stream 50", "closed early"]


def test_the_cli_started_with_sigchld_ignored_reports_its_run(
    server: ProcessServer, tmp_path: Path
) -> None:
    # SIG_IGN for SIGCHLD survives exec: a parent that ignores it gave the
    # CLI a traceback and exit status 1 for a run that had downloaded everything.
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(f"{server.url(f'/files/i{i}.bin', size=300)}\n" for i in range(200)))
    body = f"""
    import subprocess
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    done = subprocess.run([sys.executable, "-m", "swarmget", {str(urls)!r}, "-o", out,
                           "--workers", "2", "-q"], capture_output=True, text=True)
    print(done.returncode, repr(done.stderr))
    """
    assert run_script(body, server, tmp_path).strip() == "0 ''"


def test_a_bare_fork_of_the_caller_leaves_its_workers_alone(
    server: ProcessServer, tmp_path: Path
) -> None:
    # A child made with os.fork() inherits multiprocessing's list of children;
    # when it exited, multiprocessing terminated every daemonic one on it: the
    # parent's workers.  With many such children the stream failed ("worker
    # processes keep dying").
    body = """
    import multiprocessing
    urls = [f"{base}/files/k{i}.bin?size=200&latency=0.01" for i in range(400)]
    with swarmget.stream(urls, workers=2, ordered=True, concurrency=8) as items:
        it = iter(items)
        ok = int(next(it).ok)
        workers = sorted(p.pid for p in multiprocessing.active_children())
        for _ in range(5):
            pid = os.fork()
            if pid == 0:
                sys.exit(0)  # a normal exit: atexit hooks run
            os.waitpid(pid, 0)
        time.sleep(0.2)
        still = sorted(p.pid for p in multiprocessing.active_children())
        ok += sum(item.ok for item in it)
    print(ok, len(workers), workers == still)
    """
    assert run_script(body, server, tmp_path).split() == ["400", "2", "True"]


def test_stopping_workers_runs_none_of_the_callers_signal_handlers(
    server: ProcessServer, tmp_path: Path
) -> None:
    # Workers inherited the caller's wake-up fd (asyncio's self-pipe): the
    # SIGTERM that closing a stream sends each worker ran the caller's own
    # SIGTERM handler, once per worker -- a service shut itself down.
    body = """
    import asyncio

    async def main():
        got = []
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, got.append, "TERM")
        loop.add_signal_handler(signal.SIGUSR1, got.append, "USR1")
        urls = [f"{base}/files/w{i}.bin?size=200&latency=0.2" for i in range(500)]
        async with swarmget.astream(urls, workers=2) as items:
            n = 0
            async for item in items:
                n += 1
                if n == 3:
                    break
        await asyncio.sleep(0.5)
        print("handlers ran:", got)

    asyncio.run(main())
    """
    assert run_script(body, server, tmp_path).strip() == "handlers ran: []"


def test_workers_take_stop_signals_the_caller_blocks(server: ProcessServer, tmp_path: Path) -> None:
    # Workers inherited the caller's signal mask: with SIGTERM blocked they
    # could only be killed when their grace period ran out.
    body = """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR1, signal.SIGINT})
    urls = [f"{base}/files/m{i}.bin?size=200&latency=0.5" for i in range(400)]
    items = swarmget.stream(urls, workers=2, concurrency=50)
    with items:
        for item in items:
            break
        started = time.monotonic()
    print(round(time.monotonic() - started, 1) < 1.0)
    """
    assert run_script(body, server, tmp_path).strip() == "True"


def test_a_fork_that_fails_is_a_clear_error_and_leaves_no_process(
    server: ProcessServer, tmp_path: Path
) -> None:
    # fork() failing (EAGAIN: the limit of processes) came out as a bare
    # BlockingIOError, and a stream whose second fork failed left the first
    # worker behind as a zombie.
    body = """
    import errno, multiprocessing
    real_fork = os.fork
    for kind in ("download", "stream"):
        calls = []

        def fork():
            calls.append(1)
            if len(calls) >= 2:
                raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
            return real_fork()

        os.fork = fork
        urls = [f"{base}/files/p{i}.bin?size=100" for i in range(20)]
        try:
            if kind == "download":
                swarmget.download(urls, out, workers=3)
            else:
                with swarmget.stream(urls, workers=3) as items:
                    list(items)
            print(kind, "ran")
        except swarmget.SwarmgetError as exc:
            print(kind, exc)
        finally:
            os.fork = real_fork
        time.sleep(0.2)
        print(kind, "children:", len(multiprocessing.active_children()))
    """
    lines = run_script(body, server, tmp_path).splitlines()
    said = "cannot start worker process 2 of 3: Resource temporarily unavailable"
    for kind in ("download", "stream"):
        assert any(line.startswith(f"{kind} {said}") for line in lines), lines
        assert f"{kind} children: 0" in lines


def test_stream_fits_its_concurrency_to_the_limit_of_open_files(
    server: ProcessServer, tmp_path: Path
) -> None:
    # download() lowered --concurrency to what the descriptor limit allows;
    # stream() did not, and items failed with "Too many open files".
    body = """
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(60)]
    urls = [f"{base}/files/n{i}.bin?size=50000&latency=0.05" for i in range(2000)]
    for workers in (1, 2):
        with swarmget.stream(urls, workers=workers, concurrency=200, per_host=200) as items:
            errors = [item.message for item in items if not item.ok]
        print(workers, len(errors), errors[:1])
    """
    assert run_script(body, server, tmp_path).splitlines() == ["1 0 []", "2 0 []"]


def test_workers_none_is_the_default(server: ProcessServer, tmp_path: Path) -> None:
    # stream(workers=None) took it as the default; download(workers=None) said
    # "--workers must be a whole number, not None".
    body = """
    report = swarmget.download([f"{base}/files/d.bin?size=10"], out, workers=None)
    print(report.ok)
    """
    assert run_script(body, server, tmp_path).strip() == "1"


def test_a_closed_stdin_is_an_error_not_an_empty_input(
    server: ProcessServer, tmp_path: Path
) -> None:
    # Descriptor 0 closed under sys.stdin: the input was read from whatever
    # took that number next (the journal, a socket): no rows, and a warning.
    body = """
    os.close(0)
    try:
        swarmget.download(None, out, sources=["-"])
        print("ran")
    except swarmget.UsageError as exc:
        print(exc)
    """
    assert run_script(body, server, tmp_path).strip() == "cannot read input '-': stdin is closed"


def test_a_relative_output_dir_in_a_removed_directory_is_a_clear_error(
    server: ProcessServer, tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    body = f"""
    os.mkdir({str(gone)!r})
    os.chdir({str(gone)!r})
    os.rmdir({str(gone)!r})
    try:
        swarmget.download([f"{{base}}/files/r.bin"], "relative")
    except swarmget.UsageError as exc:
        print(exc)
    """
    assert run_script(body, server, tmp_path).strip() == (
        "the output directory 'relative' is relative to the current directory, "
        "which cannot be found: No such file or directory"
    )


def test_a_caller_with_sigpipe_at_its_default_is_not_killed_by_a_dying_worker(
    server: ProcessServer, tmp_path: Path
) -> None:
    # A program that restored SIGPIPE's default (as tools piped into `head` do)
    # died of it, exit status 141 and no word, when a row was sent to a worker
    # that had just died: the stream's own error never came.
    body = """
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])

    def dies_often(item):
        if item.index % 50 == 7:
            os._exit(3)
        return item.index

    urls = [f"{base}/files/q{i}.bin?size=100" for i in range(1000)]
    for _ in range(5):  # a row sent as its worker dies: 1 run in 2 or 3 died
        try:
            with swarmget.stream(urls, map=dies_often, workers=2, concurrency=8) as items:
                for item in items:
                    pass
        except swarmget.SwarmgetError as exc:
            print(exc)
    report = swarmget.download(urls[:300], out, workers=2)
    print(report.ok, signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask)
    """
    lines = run_script(body, server, tmp_path).splitlines()
    assert len(lines) == 6 and lines[5] == "300 True", lines
    assert all(line.startswith("worker processes keep dying") for line in lines[:5]), lines


def test_files_are_created_with_the_mode_the_umask_allows(
    server: ProcessServer, tmp_path: Path
) -> None:
    # Files were made 0o644 whatever the umask: a group sharing a dataset
    # (umask 002, as curl's and wget's files are then 0o664) could not
    # rewrite them, nor write the journal of a rerun.
    body = """
    import stat
    for umask in (0o002, 0o077):
        os.umask(umask)
        dest = f"{out}{umask:o}"
        swarmget.download([f"{base}/files/a.bin", f"{base}/files/sub/b.bin"], dest, workers=1)
        modes = set()
        for folder, _, names in os.walk(dest):
            for name in names:
                if name != "reserve":  # room kept for the last commit: private
                    modes.add(oct(stat.S_IMODE(os.stat(os.path.join(folder, name)).st_mode)))
        print(sorted(modes))
    """
    assert run_script(body, server, tmp_path).splitlines() == ["['0o664']", "['0o600']"]
