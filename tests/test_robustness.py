"""Nothing a server, an input row or the machine does can lose a row or escape the plan."""

from __future__ import annotations

import base64
import contextlib
import json
import multiprocessing
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import swarmget
from swarmget.sources.rows import Row
from swarmget.testing import ScriptedConnection, TestServer, expected_body
from swarmget.testing.daemons import free_port
from swarmget.testing.outputs import parts, small_tmpfs
from swarmget.testing.process import child_env


@pytest.fixture(scope="module")
def server() -> Iterator[TestServer]:
    with TestServer() as srv:
        yield srv


records = swarmget.read_manifest  # one dict per manifest line


# -- no reply kills a process --------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2])
def test_an_unsolicited_upgrade_fails_one_row_and_the_run_goes_on(
    server: TestServer, tmp_path: Path, workers: int
) -> None:
    server.route_bytes(
        "/upgrade",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        b"\x81\x05hello",
    )
    try:
        urls = [server.url("/upgrade")] + [
            server.file_url(f"g{i}.bin", size=500) for i in range(20)
        ]
        report = swarmget.download(urls, tmp_path, workers=workers, retries=0)
    finally:
        server.unroute("/upgrade")
    assert (report.ok, report.failed) == (20, 1)
    assert report.failures[0].error == "protocol"


def test_a_worker_that_dies_hands_its_rows_on(server: TestServer, tmp_path: Path) -> None:
    """A dead worker's rows are dealt again (they failed as crashed, even those it
    had not begun): a worker killed by something else costs nothing.  (A row
    that kills every worker it reaches: tests/test_stream.py.)"""
    killed: list[int] = []

    def kill_a_worker(head: bytes, conn: ScriptedConnection) -> None:
        # The first request for this file kills whichever worker process is
        # downloading now; the server runs in the test's own process, and so
        # does the supervisor, so the workers are our children.
        if not killed:
            victim = multiprocessing.active_children()[0]
            assert victim.pid is not None
            killed.append(victim.pid)
            os.kill(victim.pid, signal.SIGKILL)
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    server.route("/killer", kill_a_worker)
    try:
        urls = [server.file_url(f"w{i}.bin", size=2000, latency=0.2) for i in range(300)]
        urls.insert(100, server.url("/killer"))
        report = swarmget.download(urls, tmp_path, workers=2, concurrency=40, retries=0)
        assert (len(killed), report.ok, report.failed) == (1, 301, 0)
    finally:
        server.unroute("/killer")
    assert len(records(tmp_path)) == 301


def test_a_row_that_crashes_its_workers_keeps_its_password_out_of_the_manifest(
    server: TestServer, tmp_path: Path
) -> None:
    # The crashed row's record carried its URL as given, user:password and all
    # (every other outcome redacts it), into the manifest and the failure list.
    def kill_every_worker(head: bytes, conn: ScriptedConnection) -> None:
        for worker in multiprocessing.active_children():
            assert worker.pid is not None
            os.kill(worker.pid, signal.SIGKILL)
        conn.close()

    with server.routed("/kills", kill_every_worker) as url:
        secret = url.replace("http://", "http://bob:hunter2@")
        report = swarmget.download([secret], tmp_path, workers=2, retries=0)
    (failure,) = report.failures
    assert failure.error == "crashed"
    assert failure.url == url.replace("http://", "http://bob:***@")
    assert "hunter2" not in (tmp_path / ".swarmget" / "manifest.jsonl").read_text()


# -- the same checks in every mode ------------------------------------------------------------


def _hostile_rows(server: TestServer) -> list[Row]:
    good = server.file_url("same.bin", size=300)
    return [
        Row(0, good, path="../escape.bin"),
        Row(1, good, path="a\x00b.bin"),
        Row(2, good, path=".swarmget/journal.sqlite3"),
        Row(3, good, path=".SwarmGet/x"),
        Row(4, "ftp://h/x"),
        Row(5, good, path="x"),
        Row(6, good, path="x.part"),
        Row(7, good, path="sub/\u202eevil.bin"),
        Row(8, "not a url"),
        Row(9, good),
        Row(10, good, path="x"),
    ]


def _outcomes(out: Path) -> list[tuple[Any, ...]]:
    return sorted((r["index"], r["status"], r["error"], r["path"]) for r in records(out))


def test_every_check_runs_the_same_with_one_worker_and_with_many(
    server: TestServer, tmp_path: Path
) -> None:
    one = swarmget.download(_hostile_rows(server), tmp_path / "one", workers=1)
    many = swarmget.download(_hostile_rows(server), tmp_path / "many", workers=2)
    # Row 10 asks for row 5's path: never renamed, it fails.
    expected = {"bad_path": 5, "bad_url": 2, "exists": 1}
    assert one.error_counts() == many.error_counts() == expected
    assert _outcomes(tmp_path / "one") == _outcomes(tmp_path / "many")
    assert sorted(os.listdir(tmp_path / "many")) == [".swarmget", "same.bin", "x", "x.part"]
    for name in ("x", "x.part", "same.bin"):
        assert (tmp_path / "many" / name).read_bytes() == expected_body("same.bin", 300)
    assert not (tmp_path.parent / "escape.bin").exists()


def test_part_files_never_meet_the_users_files(server: TestServer, tmp_path: Path) -> None:
    (tmp_path / "data.part").write_bytes(b"mine, not yours")
    (tmp_path / "data").write_bytes(b"also mine")
    urls = [server.file_url("data", size=700), server.file_url("data.part", size=800)]
    report = swarmget.download(urls, tmp_path, retries=0)
    assert report.error_counts() == {"exists": 2}
    assert (tmp_path / "data.part").read_bytes() == b"mine, not yours"
    assert (tmp_path / "data").read_bytes() == b"also mine"
    assert not parts(tmp_path)


# -- small holes ------------------------------------------------------------------------------


def test_retry_after_beyond_the_deadline_fails_now(server: TestServer, tmp_path: Path) -> None:
    url = server.file_url("busy.bin", status=503, retry_after="60")
    started = time.monotonic()
    report = swarmget.download([url], tmp_path, retries=5, deadline=3)
    assert time.monotonic() - started < 2
    (failure,) = report.failures
    assert (failure.error, failure.attempts) == ("http_503", 1)


def test_an_empty_location_is_a_bad_redirect(server: TestServer, tmp_path: Path) -> None:
    for path, location in (("/empty-loc", b"Location: \r\n"), ("/no-loc", b"")):
        server.route_bytes(
            path, b"HTTP/1.1 302 Found\r\n" + location + b"Content-Length: 0\r\n\r\n"
        )
    try:
        report = swarmget.download(
            [server.url("/empty-loc"), server.url("/no-loc")], tmp_path, retries=0
        )
    finally:
        server.unroute("/empty-loc")
        server.unroute("/no-loc")
    assert report.error_counts() == {"bad_redirect": 2}


def test_bidi_controls_never_reach_a_file_name(server: TestServer, tmp_path: Path) -> None:
    url = server.file_url("invoice%E2%80%AEgpj.exe", size=10)
    report = swarmget.download([url], tmp_path)
    assert report.ok == 1
    (name,) = [n for n in os.listdir(tmp_path) if n != ".swarmget"]
    assert "\u202e" not in name


def test_user_and_password_in_a_url_are_basic_auth_for_that_origin_only(
    server: TestServer, tmp_path: Path
) -> None:
    other = TestServer()
    with other:
        seen: dict[str, bytes] = {}

        def protected(head: bytes, conn: ScriptedConnection) -> None:
            seen["first"] = head
            target = other.file_url("moved.bin", size=42).encode()
            conn.send(
                b"HTTP/1.1 302 Found\r\nLocation: " + target + b"\r\nContent-Length: 0\r\n\r\n"
            )

        server.route("/protected", protected)
        try:
            port = server.url("/").split(":")[2].split("/")[0]
            url = f"http://alice:s3cr%40t@127.0.0.1:{port}/protected"
            report = swarmget.download([url], tmp_path, retries=0)
        finally:
            server.unroute("/protected")
        assert report.ok == 1
        token = base64.b64encode(b"alice:s3cr@t")
        assert (b"\r\nAuthorization: Basic " + token) in seen["first"]
        assert b"authorization" not in other.requests[-1].lower()
    text = (tmp_path / ".swarmget" / "manifest.jsonl").read_text()
    assert "s3cr" not in text and "alice:***@" in text
    assert all("s3cr" not in str(r) for r in swarmget.read_manifest(tmp_path))


def test_a_manifest_line_is_one_line_for_every_reader(server: TestServer, tmp_path: Path) -> None:
    # U+2028, U+2029 and U+0085 end lines for str.splitlines() and JavaScript;
    # JSON leaves them raw, so a record came apart.
    urls = [server.file_url(f"a{sep}b.bin", size=10) for sep in ("\u2028", "\u2029", "\x85")]
    swarmget.download(urls, tmp_path, retries=0)
    text = (tmp_path / ".swarmget" / "manifest.jsonl").read_text()
    assert len(text.splitlines()) == 3
    assert [r["url"] for r in map(json.loads, text.splitlines())] == urls


@pytest.mark.parametrize(
    "url", ["http://example.com:99999/@user/file", "http://exa mple.com/p?email=a@b.c"]
)
def test_an_invalid_url_whose_at_sign_is_not_a_passwords_end_is_shown(
    url: str, tmp_path: Path
) -> None:
    report = swarmget.download([url], tmp_path, retries=0)
    assert report.failures[0].error == "bad_url"
    assert swarmget.read_manifest(tmp_path)[0]["url"] == url
    assert "hidden" not in (report.failures[0].message or "")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://ghp_T0KEN@127.0.0.1:9/x", "http://***@127.0.0.1:9/x"),  # a token as user name
        ("http://u:pa/T0KEN@127.0.0.1:9/x", "http://***@127.0.0.1:9/x"),  # ... a password with /
        ("http://u:p?T0KEN@127.0.0.1:9/x", "http://***@127.0.0.1:9/x"),  # ... with ?
    ],
)
def test_secrets_in_urls_are_hidden_even_when_the_url_is_invalid(
    url: str, shown: str, tmp_path: Path
) -> None:
    report = swarmget.download([url], tmp_path, retries=0, timeout=2)
    text = (tmp_path / ".swarmget" / "manifest.jsonl").read_text()
    assert "T0KEN" not in text
    assert "T0KEN" not in repr(report.failures) and "T0KEN" not in str(report.failures[0])
    assert swarmget.read_manifest(tmp_path)[0]["url"] == shown


# -- dead and trickling hosts -----------------------------------------------------------------


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A port that accepts connections (into the kernel's backlog) and never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=4096) as listener:
        yield listener.getsockname()[1]


def test_a_dead_host_costs_one_timeout_not_one_per_row(
    server: TestServer, black_hole: int, tmp_path: Path
) -> None:
    good = [server.file_url(f"ok{i}.bin", size=1000) for i in range(1000)]
    started = time.monotonic()
    assert swarmget.download(good, tmp_path / "alone", workers=1).ok == 1000
    alone = time.monotonic() - started
    dead = [f"http://127.0.0.1:{black_hole}/d{i}.bin" for i in range(1000)]
    mixed = [u for pair in zip(dead, good, strict=True) for u in pair]
    timeout = 1.0
    started = time.monotonic()
    report = swarmget.download(mixed, tmp_path / "mixed", workers=1, timeout=timeout)
    took = time.monotonic() - started
    assert report.ok == 1000 and report.failed == 1000
    assert set(report.error_counts()) == {"timeout"}
    # One timeout: the connections opened in the slots the first failures
    # freed waited out a second one after the host was given up.
    assert took < alone + 1.6 * timeout, (took, alone)
    given_up = [r for r in records(tmp_path / "mixed") if "given up" in r.get("message", "")]
    assert len(given_up) > 900


def test_urls_that_stall_together_do_not_give_up_a_host_that_answers(
    server: TestServer, tmp_path: Path
) -> None:
    # Five stalls that began together timed out together: "five failures in a
    # row", and the host was given up while it served three files a second
    # per connection: 107 good rows failed without being tried.
    stalls = [server.file_url(f"stall{i}.bin", size=10, latency=60) for i in range(5)]
    good = [server.file_url(f"fine{i}.bin", size=1000, latency=0.3) for i in range(300)]
    report = swarmget.download(
        stalls + good, tmp_path, workers=1, timeout=2, per_host=32, retries=0
    )
    assert (report.ok, report.failed) == (300, 5)
    assert not any("given up" in (f.message or "") for f in report.failures)


def test_host_failures_zero_never_gives_up(
    server: TestServer, black_hole: int, tmp_path: Path
) -> None:
    dead = [f"http://127.0.0.1:{black_hole}/d{i}.bin" for i in range(8)]
    report = swarmget.download(
        dead, tmp_path, workers=1, timeout=0.5, retries=0, host_failures=0, per_host=8
    )
    assert report.failed == 8
    assert not any("given up" in (f.message or "") for f in report.failures)


def test_a_refused_connect_names_the_host_and_port(tmp_path: Path) -> None:
    # It said "connect failed: Connection refused", which left the user to
    # guess where it went (curl: "Failed to connect to h port p").
    port = free_port()
    report = swarmget.download([f"http://127.0.0.1:{port}/a"], tmp_path, retries=0, workers=1)
    (failure,) = report.failures
    assert failure.error == "connect"
    assert failure.message == f"connect to 127.0.0.1:{port} failed: Connection refused"


def test_a_host_silent_on_kept_alive_connections_costs_a_timeout_not_one_a_file(
    server: TestServer, tmp_path: Path
) -> None:
    # Each connection's first request is answered, later ones never (nor is
    # the connection closed).  Every file after the first two waited out a
    # --timeout and failed when its one retry met another silent connection.
    urls = [server.file_url(f"ka{i}.bin", size=2000, fault="silent_reused") for i in range(12)]
    started = time.monotonic()
    report = swarmget.download(
        urls, tmp_path, workers=1, per_host=2, concurrency=2, timeout=1, retries=1
    )
    took = time.monotonic() - started
    assert report.ok == 12, report.error_counts()
    manifest = (tmp_path / ".swarmget" / "manifest.jsonl").read_text()
    records = [json.loads(line) for line in manifest.splitlines()]
    assert {r["attempts"] for r in records} == {1}  # the silence is not the file's
    assert took < 3, took  # one --timeout for the host, not one a file


def test_a_trickling_server_fails_within_two_speed_windows(
    server: TestServer, tmp_path: Path
) -> None:
    url = server.file_url("trickle.bin", size=100_000, fault="drip", drip_interval=0.05)
    window = 1.0
    started = time.monotonic()
    report = swarmget.download(
        [url], tmp_path, workers=1, min_speed=1000, min_speed_window=window, retries=3
    )
    took = time.monotonic() - started
    (failure,) = report.failures
    assert failure.error == "timeout" and "min-speed" in (failure.message or "")
    # The head itself trickles (drip sends the whole response a byte at a
    # time): the message said "0 B/s", now what was slow.
    assert "no response head after 1s" in (failure.message or "")
    assert failure.attempts == 2  # retried once for slowness, not three times
    assert took < 2 * window + 0.3, took


# -- the machine's limits ---------------------------------------------------------------------


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (120, 120))


def test_a_low_descriptor_limit_lowers_the_concurrency_and_says_so_once(
    server: TestServer, tmp_path: Path
) -> None:
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(server.file_url(f"n{i}.bin", size=300, latency=0.05) + "\n"
                            for i in range(400)))  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "swarmget", str(urls), "-o", str(tmp_path / "out"), "-q",
         "--concurrency", "500", "--workers", "1"],
        capture_output=True, text=True, env=child_env(), timeout=120, check=False,
        preexec_fn=_low_nofile,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("file descriptors") == 1, done.stderr
    assert "using --concurrency" in done.stderr
    assert len(os.listdir(tmp_path / "out")) == 401


# The CLI in a process that can start no thread: every new thread's stack is
# larger than the address space allowed (as at `ulimit -u`, which counts
# threads, but also as root, whom that limit does not bind).
_NO_THREADS = (
    "import resource, sys, threading\n"
    "resource.setrlimit(resource.RLIMIT_AS, (1 << 44, 1 << 44))\n"
    "threading.stack_size(1 << 45)\n"
    "from swarmget.cli import main\n"
    "sys.exit(main())\n"
)


def _cli_under(
    prelude: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI with ``args``, run by ``python -c prelude`` (which sets a limit first)."""
    return subprocess.run(
        [sys.executable, "-c", prelude, *args],
        input=stdin, capture_output=True, text=True, env=child_env(), timeout=120, check=False,
    )  # fmt: skip


def test_workers_that_can_start_no_thread_still_download_every_row(
    server: TestServer, tmp_path: Path
) -> None:
    # Each worker died starting its orphan watch, a traceback each, and every
    # row of the run failed with crashed.
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(server.file_url(f"t{i}.bin", size=300) + "\n" for i in range(300)))
    done = _cli_under(
        _NO_THREADS, str(urls), "-o", str(tmp_path / "out"), "--json", "--workers", "2"
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert json.loads(done.stdout)["ok"] == 300


def test_stdin_that_no_thread_can_read_stops_the_run_in_one_line_with_its_json(
    server: TestServer, tmp_path: Path
) -> None:
    lines = "".join(server.file_url(f"s{i}.bin", size=300) + "\n" for i in range(300))
    done = _cli_under(
        _NO_THREADS, "-", "-o", str(tmp_path / "out"), "--json", "--workers", "1", stdin=lines
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert "cannot start a thread to read the input" in done.stderr, done.stderr
    assert "(ulimit -u)" in done.stderr
    summary = json.loads(done.stdout)
    assert summary["stopped"] == "error"
    assert summary["ok"] + summary["failed"] == summary["total"]


# The CLI whose forked workers have 2 MiB of address space to spare: too little
# for an engine's 4 MiB receive buffer (as under a tight ulimit -v).
_WORKERS_WITHOUT_MEMORY = (
    "import os, resource, sys\n"
    "def tight():\n"
    "    with open('/proc/self/status') as status:\n"
    "        kib = next(int(f.split()[1]) for f in status if f.startswith('VmSize:'))\n"
    "    limit = (kib << 10) + (2 << 20)\n"
    "    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))\n"
    "os.register_at_fork(after_in_child=tight)\n"
    "from swarmget.cli import main\n"
    "sys.exit(main())\n"
)


def test_workers_without_memory_for_an_engine_stop_the_run_in_one_line(
    server: TestServer, tmp_path: Path
) -> None:
    # Each worker died with a traceback, and so did its replacements, until
    # every row of the run had failed with crashed.
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(server.file_url(f"m{i}.bin", size=300) + "\n" for i in range(40)))
    out = tmp_path / "out"
    done = _cli_under(
        _WORKERS_WITHOUT_MEMORY, str(urls), "-o", str(out), "--json", "--workers", "2"
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "a worker process could not start downloading" in done.stderr, done.stderr
    assert json.loads(done.stdout)["stopped"] == "error"
    again = subprocess.run(  # with the memory back, the same command does every row
        [sys.executable, "-m", "swarmget", str(urls), "-o", str(out), "--json"],
        capture_output=True, text=True, env=child_env(), timeout=120, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["ok"] == 40


def cli_over(
    urls: list[str], tmp_path: Path, out: Path, *flags: str
) -> Callable[[], subprocess.CompletedProcess[str]]:
    """``swarmget LIST -o OUT --json FLAGS`` over ``urls``, to run (again and again)."""
    listing = tmp_path / "urls.txt"
    listing.write_text("".join(url + "\n" for url in urls))
    argv = [sys.executable, "-m", "swarmget", str(listing), "-o", str(out), "--json", *flags]
    return lambda: subprocess.run(
        argv, capture_output=True, text=True, env=child_env(), timeout=120
    )


def test_a_full_disk_stops_cleanly_and_a_rerun_completes(
    server: TestServer, tmp_path: Path
) -> None:
    with small_tmpfs(tmp_path / "small", "2m") as mount:
        out = mount / "out"
        filler = mount / "filler"
        urls = [server.file_url(f"f{i}.bin", size=50_000) for i in range(20)]
        cli = cli_over(urls, tmp_path, out, "--concurrency", "4")
        filler.write_bytes(b"\0" * (3 << 19))  # 1.5 of the 2 MiB
        full = cli()
        assert full.returncode == 1, full.stderr
        assert "Traceback" not in full.stderr, full.stderr
        assert "the run stopped" in full.stderr, full.stderr
        # It names the manifest only if one could be written on the full disk.
        written = (out / ".swarmget" / "manifest.jsonl").exists()
        assert ("rows that finished are listed in" in full.stderr) == written, full.stderr
        assert ("no manifest could be written" in full.stderr) == (not written), full.stderr
        summary = json.loads(full.stdout)
        assert (summary["manifest"] is not None) == written  # never a file that is not there
        assert summary["ok"] < 20
        assert not parts(out)
        filler.unlink()
        again = cli()
        assert again.returncode == 0, again.stderr
        for i in range(20):
            assert (out / f"f{i}.bin").read_bytes() == expected_body(f"f{i}.bin", 50_000)
        assert len(records(out)) == 20


def test_a_disk_too_full_to_open_the_journal_still_gives_the_json_summary(
    server: TestServer, tmp_path: Path
) -> None:
    # Stopped before the run began: exit 1 with its error line, and --json
    # printed nothing for a script to parse.
    with small_tmpfs(tmp_path / "small", "256k") as mount:
        out = mount / "out"
        out.mkdir()
        filler = mount / "filler"
        with contextlib.suppress(OSError), filler.open("wb") as fill:
            while True:
                fill.write(b"\0" * 4096)
        full = cli_over([server.file_url("j.bin", size=10)], tmp_path, out)()
        assert full.returncode == 1, full.stderr
        assert "disk is full" in full.stderr and "Traceback" not in full.stderr, full.stderr
        summary = json.loads(full.stdout)
        assert (summary["ok"], summary["failed"], summary["stopped"]) == (0, 0, "error")
        assert summary["manifest"] is None


def test_the_rows_done_before_a_full_disk_are_not_fetched_again(
    server: TestServer, tmp_path: Path
) -> None:
    # SQLite rolls a transaction back when its commit meets a full disk: every
    # row done since the last commit (a short run's all) was lost from the
    # journal, and the rerun fetched and replaced every file already there.
    # 20 of 24 MiB filled: the first run gets ~1,000 files in; the rerun needs
    # room for all 3,000 (4 KiB a page each), the journal and its reserve.
    with small_tmpfs(tmp_path / "small", "24m") as mount:
        out = mount / "out"
        filler = mount / "filler"
        filler.write_bytes(b"\0" * (20 << 20))
        cli = cli_over(
            [server.file_url(f"s{i}.bin", size=1000) for i in range(3000)], tmp_path, out
        )
        full = cli()
        assert full.returncode == 1 and "No space left" in full.stderr, full.stderr
        done = {p.name: p.stat().st_ino for p in out.iterdir() if p.name.endswith(".bin")}
        assert 100 < len(done) < 3000
        assert not (out / ".swarmget" / "reserve").exists()  # its room is the disk's again
        filler.unlink()
        again = cli()
        assert again.returncode == 0, again.stderr
        summary = json.loads(again.stdout)
        assert (summary["skipped"], summary["ok"]) == (len(done), 3000 - len(done))
        assert {name: (out / name).stat().st_ino for name in done} == done  # not replaced
        assert len(records(out)) == 3000


def test_a_full_disk_in_one_worker_gives_back_the_other_workers_parts(
    server: TestServer, tmp_path: Path
) -> None:
    # Two rows, one per worker: one stalls half way (its small part is on
    # disk), the other fills the disk.  The worker that hit the full disk
    # drops its part; the other, stopped by the driver, must give its part's
    # space back too (it is too small to resume), not keep it as on Ctrl-C.
    with small_tmpfs(tmp_path / "small", "1m") as mount:
        out = mount / "out"
        urls = [
            server.file_url("stalls.bin", size=40_000, fault="stall", times=1),
            server.file_url("huge.bin", size=3 << 20, latency=0.5),
        ]
        with pytest.raises(swarmget.TransferError) as info:
            swarmget.download(urls, out, workers=2, concurrency=2)
        assert info.value.code == "io" and "No space left" in info.value.message
        assert not parts(out)


@pytest.mark.parametrize("removed", [".swarmget", ""])
@pytest.mark.parametrize("workers", [1, 2])
def test_an_output_dir_removed_during_the_run_stops_it_at_once(
    server: TestServer, tmp_path: Path, removed: str, workers: int
) -> None:
    # Every row after it failed io one by one, for as long as the list
    # lasted, recorded in a journal no longer there (a whole night's list).
    out = tmp_path / "out"
    urls = [server.file_url(f"r{i}.bin", size=1000, latency=0.1) for i in range(300)]

    def remove_after_the_first_file() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(out.glob("r*.bin")):
            time.sleep(0.01)
        while (out / removed).exists():  # again if a file was published meanwhile
            shutil.rmtree(out / removed, ignore_errors=True)

    remover = threading.Thread(target=remove_after_the_first_file)
    remover.start()
    try:
        with pytest.raises(swarmget.TransferError) as info:
            swarmget.download(urls, out, workers=workers, concurrency=8)
    finally:
        remover.join()
    assert info.value.code == "io"
    assert "was removed during the run" in info.value.message, info.value.message
    report = info.value.report
    assert report.failed <= 16 and report.ok + report.failed < 150, report.error_counts()


def test_rows_keep_flowing_when_the_journal_is_big(tmp_path: Path) -> None:
    # A thread, not a subprocess: the point is the planner's bookkeeping across
    # many checkpoints of the plan log (see sinks/journal.py).
    from swarmget.options import Options
    from swarmget.sinks import plan as plan_module
    from swarmget.sinks.plan import FilePlanner

    rows = [Row(i, f"http://h.invalid/{i % 5000}.jpg") for i in range(12_000)]
    planner = FilePlanner(str(tmp_path), Options())
    old = plan_module.CHECKPOINT_ROWS
    try:
        plan_module.CHECKPOINT_ROWS = 1000
        keys: set[bytes] = set()
        for start in range(0, len(rows), 256):
            batch = planner.plan(rows[start : start + 256])
            keys.update(a.key for a in batch.assignments)
            planner.commit()
    finally:
        plan_module.CHECKPOINT_ROWS = old
        planner.finish(interrupted=True)
    assert len(keys) == 12_000  # every copy of a URL is a row of its own
    log = tmp_path / ".swarmget" / "plans.log"
    assert log.stat().st_size == 0  # emptied: every claim is in the table


def test_running_out_of_descriptors_is_retried_not_an_io_failure() -> None:
    import errno

    from swarmget.engine.retry import RetryPolicy, RetryState
    from swarmget.sinks.files import OutOfDescriptors, io_error

    error = io_error("create", "/x.part", OSError(errno.EMFILE, "Too many open files"))
    assert isinstance(error, OutOfDescriptors) and not error.fatal
    state = RetryState().started().failed(error)
    assert RetryPolicy(retries=3).wait(state, error) is not None
    full = io_error("write", "/x.part", OSError(errno.ENOSPC, "No space left on device"))
    assert full.fatal and RetryPolicy(retries=3).wait(state, full) is None


_CROWDED_CHILD = """
import json, resource, sys, swarmget
resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))
held = [open("/dev/null") for _ in range(440)]  # the calling program's own files
report = swarmget.download(json.loads(sys.argv[1]), sys.argv[2], workers=1, concurrency=128)
print(report.ok, report.failed)
"""


def test_descriptors_the_caller_holds_count_against_the_concurrency(
    server: TestServer, tmp_path: Path
) -> None:
    # 480 of 512 descriptors held by the program: concurrency was fitted to the
    # limit as if all were free, socket() raised EMFILE out of download(), and
    # with 440 held most rows failed with io.
    urls = [server.file_url(f"fd{i}.bin", size=100) for i in range(300)]
    done = subprocess.run(
        [sys.executable, "-c", _CROWDED_CHILD, json.dumps(urls), str(tmp_path / "out")],
        capture_output=True, text=True, env=child_env(), timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["300", "0"]
    assert "open already; using --concurrency" in done.stderr


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("overwrite", "false"),
        ("insecure", "no"),
        ("trust_env", "false"),
        ("dedupe", 1),
        ("allow_downgrade", "no"),
        ("proxy", 5),
        ("no_proxy", ["a"]),
        ("dns_servers", 5),
        ("dns_servers", [b"127.0.0.1"]),
        ("cacert", 5),
    ],
)
def test_an_option_of_the_wrong_kind_is_a_usage_error_naming_it(
    option: str, value: object, server: TestServer, out_dir: Path
) -> None:
    # overwrite="false" is a true value: the user's own file was replaced (the
    # compiled build raised a TypeError naming no option).
    mine = out_dir / "precious.txt"
    mine.write_text("the user's")
    with pytest.raises(swarmget.UsageError, match=f"^{option} must be"):
        swarmget.download([server.file_url("precious.txt", size=10)], out_dir, **{option: value})
    assert mine.read_text() == "the user's"


def test_a_progress_listener_that_fails_to_start_lets_the_output_dir_go(
    server: TestServer, out_dir: Path
) -> None:
    # Its start() ran outside the run's clean-up: the output dir stayed locked
    # ("another swarmget run is using ...") for the rest of the process.
    class Broken:
        def start(self) -> None:
            raise RuntimeError("listener bug")

        def update(self, snapshot: object) -> None:
            pass

        def finish(self, report: object) -> None:
            pass

    urls = [server.file_url(f"p{i}.bin", size=100) for i in range(5)]
    with pytest.raises(RuntimeError, match="listener bug"):
        swarmget.download(urls, out_dir, progress=Broken())
    assert swarmget.download(urls, out_dir).ok == 5
    with pytest.raises(swarmget.UsageError, match="progress must be"):
        swarmget.download(urls, out_dir, progress="yes")
    # The class, not an object of it: its start() failed mid-run, "missing self".
    with pytest.raises(swarmget.UsageError, match=r"not the class Broken: pass Broken\(\)"):
        swarmget.download(urls, out_dir, progress=Broken)
    with pytest.raises(swarmget.UsageError, match="spill_dir must be a path, not 123"):
        swarmget.stream(urls, spill_dir=123)


class _ListenerFailingIn:
    """A progress listener whose ``hook`` (update or finish) raises."""

    def __init__(self, hook: str) -> None:
        self.hook = hook

    def start(self) -> None:
        pass

    def update(self, snapshot: object) -> None:
        if self.hook == "update":
            raise RuntimeError("listener bug in update")

    def finish(self, report: object) -> None:
        if self.hook == "finish":
            raise RuntimeError("listener bug in finish")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_progress_listener_whose_finish_raises_keeps_the_report(
    server: TestServer, out_dir: Path, workers: int
) -> None:
    # The run was whole, its manifest written, but the caller got the
    # listener's exception alone: the outcome of every row was lost.
    urls = [server.file_url(f"fin{i}.bin", size=100) for i in range(20)]
    with pytest.raises(RuntimeError, match="listener bug in finish") as raised:
        swarmget.download(urls, out_dir, progress=_ListenerFailingIn("finish"), workers=workers)
    report = raised.value.report  # type: ignore[attr-defined]
    assert (report.ok, report.failed) == (20, 0)
    assert len(swarmget.read_manifest(out_dir)) == 20
    assert swarmget.download(urls, out_dir).skipped == 20  # the journal knows them done


def test_a_listener_whose_finish_raises_after_a_full_disk_still_tells_of_the_disk(
    server: TestServer, tmp_path: Path
) -> None:
    # The run stopped on a full disk, then the listener's finish raised: the
    # caller got the listener's exception alone, the disk error in no chain.
    with small_tmpfs(tmp_path / "small", "2m") as mount:
        (mount / "filler").write_bytes(b"\0" * (3 << 19))  # 1.5 of the 2 MiB
        urls = [server.file_url(f"full{i}.bin", size=50_000) for i in range(20)]
        with pytest.raises(RuntimeError, match="listener bug in finish") as raised:
            swarmget.download(urls, mount / "out", progress=_ListenerFailingIn("finish"), workers=1)
        context = raised.value.__context__
        assert isinstance(context, swarmget.TransferError) and context.code == "io", repr(context)
        assert "No space left on device" in str(context)
        assert raised.value.report.ok < 20  # type: ignore[attr-defined]


def test_a_progress_listener_whose_update_raises_gives_the_report_so_far(
    server: TestServer, out_dir: Path
) -> None:
    urls = [server.file_url(f"upd{i}.bin", size=100) for i in range(20)]
    with pytest.raises(RuntimeError, match="listener bug in update") as raised:
        swarmget.download(urls, out_dir, progress=_ListenerFailingIn("update"), workers=1)
    report = raised.value.report  # type: ignore[attr-defined]
    listed = swarmget.read_manifest(out_dir)
    assert report.ok == sum(record["status"] == "ok" for record in listed)


def test_progress_true_on_a_pipe_ends_on_the_runs_totals(
    server: TestServer, out_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Plain lines every 2 s (stderr is no terminal here): the one at 2 s showed
    # 30/31 files, and was the last word of a run that went on to do all 31.
    urls = [server.file_url(f"plain{i}.bin", size=100) for i in range(30)]
    urls.append(server.file_url("slow.bin", size=100, latency=2.6))
    report = swarmget.download(urls, out_dir, progress=True, workers=1)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 2, lines
    assert lines[-1].startswith(f"swarmget: {report.total}/31 files, {report.failed} failed,")
    assert report.ok == 31


def test_stream_takes_a_progress_listener_as_download_does(
    server: TestServer, capsys: pytest.CaptureFixture[str]
) -> None:
    # It was read as a yes/no flag: the built-in display was shown instead.
    calls: list[str] = []

    class Listener:
        def start(self) -> None:
            calls.append("start")

        def update(self, snapshot: object) -> None:
            calls.append("update")

        def finish(self, report: object) -> None:
            calls.append("finish")

    urls = [server.file_url(f"s{i}.bin", size=100) for i in range(5)]
    with swarmget.stream(urls, progress=Listener(), workers=1) as items:
        assert len(list(items)) == 5
    assert calls[0] == "start" and calls[-1] == "finish"
    assert capsys.readouterr().err == ""
    with pytest.raises(swarmget.UsageError, match="ordered must be True or False"):
        swarmget.stream(urls, ordered="no")


_SIZE_LIMITED_CHILD = """
import json, resource, sys, swarmget
resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, resource.RLIM_INFINITY))  # ulimit -f 3072
report = swarmget.download(json.loads(sys.argv[1]), sys.argv[2], workers=1, retries=0)
print(json.dumps([[f.error, f.message] for f in report.failures]), report.ok)
"""


def test_a_file_over_the_size_one_file_may_have_says_which_limit(
    server: TestServer, tmp_path: Path
) -> None:
    # A 5 GB model onto a FAT32 stick, or under `ulimit -f`: the write fails
    # with EFBIG ("File too large"; Python ignores SIGXFSZ), which read as if
    # the download were too big for swarmget, and "run again to resume" met
    # the same limit again.  Only that row fails: the disk is not full.
    urls = [server.file_url("huge.bin", size=4 << 20), server.file_url("fine.bin", size=1000)]
    child = subprocess.run(
        [sys.executable, "-c", _SIZE_LIMITED_CHILD, json.dumps(urls), str(tmp_path / "out")],
        env=child_env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    failures, ok = child.stdout.rsplit(" ", 1)
    ((error, message),) = json.loads(failures)
    assert (error, int(ok)) == ("io", 1)
    assert "File too large: over the largest file allowed here (ulimit -f" in message, message
    assert "(ulimit -f, or the file system's own limit" in message, message


def _small_files_only() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))


def test_a_journal_over_the_size_one_file_may_have_names_that_limit(tmp_path: Path) -> None:
    # SQLite calls a write past `ulimit -f` a "disk I/O error", and the user
    # went looking at a disk with room to spare.
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(f"http://127.0.0.1:9/f{i}\n" for i in range(100)))
    done = subprocess.run(
        [sys.executable, "-m", "swarmget", str(urls), "-o", str(tmp_path / "out"), "-q"],
        capture_output=True, text=True, env=child_env(), timeout=60, check=False,
        preexec_fn=_small_files_only,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "the limit of file size, 100000 bytes: ulimit -f" in done.stderr, done.stderr
