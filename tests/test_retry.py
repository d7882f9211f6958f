"""Retry policy as a value, and retries that never hold up other transfers."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import swarmget
from swarmget.engine.retry import RETRYABLE_STATUS, RetryPolicy, parse_retry_after
from swarmget.sources.rows import Row
from swarmget.testing import RouteHandler, ScriptedConnection, TestServer, expected_body
from swarmget.testing.outputs import small_tmpfs


def test_backoff_is_full_jitter_and_capped() -> None:
    random.seed(1)
    policy = RetryPolicy(retries=10, base=0.5, cap=4.0)
    for attempt in range(1, 10):
        ceiling = min(4.0, 0.5 * 2 ** (attempt - 1))
        delays = [policy.delay(attempt) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8  # spread over the whole range
        assert min(delays) < ceiling * 0.2


def test_the_backoff_stays_at_its_cap_however_many_attempts() -> None:
    # 2.0 ** 1025 overflows a float: the 1026th attempt's backoff raised
    # OverflowError in the engine (--retries 5000 on a host that closes every
    # connection, which --host-failures does not count, for hours).
    policy = RetryPolicy(retries=10**6, cap=4.0)
    assert policy.ceiling(10**6) == 4.0
    assert 0.0 <= policy.delay(2000) <= 4.0
    assert policy.push_back(429, 5000, None) == 4.0


def test_retry_after_wins_up_to_its_cap() -> None:
    policy = RetryPolicy(retry_after_cap=60)
    assert policy.delay(1, retry_after=5) == 5
    assert policy.delay(1, retry_after=1e6) == 60


@pytest.mark.parametrize(
    ("code", "retried"),
    [("timeout", True), ("connect", True), ("truncated", True), ("http_404", False),
     ("http_403", False), ("protocol", False), ("dns", False), ("checksum", False)]
    + [(f"http_{s}", True) for s in sorted(RETRYABLE_STATUS)],
)  # fmt: skip
def test_what_is_retried(code: str, retried: bool) -> None:
    policy = RetryPolicy(retries=2)
    assert policy.should_retry(code, 1) is retried
    assert policy.should_retry(code, 3) is False  # retries exhausted


def test_retry_after_parsing() -> None:
    assert parse_retry_after(b"7") == 7.0
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True).encode()
    assert 28 <= (parse_retry_after(date, now) or 0) <= 31
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True).encode(), now) == 0
    assert parse_retry_after(b"soon") is None
    assert parse_retry_after(None) is None
    # These raised (ValueError, OverflowError) while the head was judged: the
    # row failed as `protocol` instead of being retried as the 503 it was.
    assert parse_retry_after(b"\xb2") is None  # a digit to str.isdigit(), not to float()
    assert parse_retry_after(b"Wed, 21 Oct 99999999999 07:28:00 GMT") is None
    assert parse_retry_after(b"Wed, 21 Oct 9999 07:28:00 GMT") is not None


def test_a_retry_after_in_asctimes_form_is_gmt_whatever_the_local_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # asctime's form has no zone and means GMT (RFC 9110 5.6.7): it was read in
    # the local zone, 30 s becoming 5 h west of Greenwich and 0 east of it.
    now = time.time()
    date = time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(now + 30)).encode()
    for zone in ("America/New_York", "Asia/Tokyo"):
        monkeypatch.setenv("TZ", zone)
        time.tzset()
        try:
            assert 28 <= (parse_retry_after(date, now) or 0) <= 31
        finally:
            monkeypatch.undo()
            time.tzset()


@pytest.fixture(scope="module")
def server() -> Iterator[TestServer]:
    with TestServer() as srv:
        yield srv


def test_a_waiting_retry_does_not_hold_up_other_files(server: TestServer, out_dir: Path) -> None:
    slow = server.file_url("wait.bin", size=100, status=503, retry_after=2, times=1)
    others = [server.file_url(f"o{i}.bin", size=2000, latency=0.01) for i in range(100)]
    started = time.monotonic()
    report = swarmget.download([slow, *others], out_dir, retries=1, concurrency=4)
    elapsed = time.monotonic() - started
    assert report.ok == 101
    assert 1.9 <= elapsed < 5  # one Retry-After wait, overlapped with all the others
    # The other files were all done before the retry's wait was over.
    first_done = max((out_dir / f"o{i}.bin").stat().st_mtime for i in range(100))
    assert first_done < (out_dir / "wait.bin").stat().st_mtime
    assert (out_dir / "wait.bin").read_bytes() == expected_body("wait.bin", 100)


@contextlib.contextmanager
def routed(server: TestServer, handler: RouteHandler, paths: list[str]) -> Iterator[list[str]]:
    """``handler`` answers each of ``paths`` for the block; their URLs."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(server.routed(path, handler)) for path in paths]


@pytest.mark.parametrize("retry_after", [b"Retry-After: 1\r\n", b""])
def test_a_429_pauses_the_whole_host_not_only_its_row(
    retry_after: bytes, server: TestServer, out_dir: Path
) -> None:
    # A rate limiter: every request in the first second is refused with 429.
    # Pausing only the refused row sent each other row into the same refusal
    # (40 rows, 40 refusals, each spending an attempt); the host is paused instead.
    window: list[float] = []
    answers: list[int] = []

    def limited(head: bytes, conn: ScriptedConnection) -> None:
        now = time.monotonic()
        if not window:
            window.append(now + 1.0)
        if now < window[0]:
            answers.append(429)
            conn.send(
                b"HTTP/1.1 429 Too Many Requests\r\n" + retry_after + b"Content-Length: 0\r\n\r\n"
            )
        else:
            answers.append(200)
            conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    paths = [f"/limited-{len(retry_after)}/{i}" for i in range(40)]
    with routed(server, limited, paths) as urls:
        report = swarmget.download(urls, out_dir, retries=6, concurrency=4, workers=1)
    assert report.ok == 40
    # Refused: only what was under way when the host said so, once per pause
    # (without Retry-After: 0.5 s, then 1 s, ... the backoff's ceiling).
    assert 1 <= answers.count(429) <= (4 if retry_after else 12)
    assert answers.count(200) == 40


def rate_limiter(
    per_second: int, answers: list[int], refusal: bytes = b"429 Too Many Requests\r\nRetry-After: 1"
) -> Callable[[bytes, ScriptedConnection], None]:
    """A route that lets ``per_second`` requests through in each second from the
    first one, and refuses the others with ``refusal`` (status line's rest and
    headers: ``429, Retry-After: 1``)."""
    start: list[float] = []
    let_through: dict[int, int] = {}

    def limited(head: bytes, conn: ScriptedConnection) -> None:
        now = time.monotonic()
        start[:] = start or [now]
        second = int(now - start[0])
        if let_through.get(second, 0) >= per_second:
            answers.append(int(refusal[:3]))
            conn.send(b"HTTP/1.1 " + refusal + b"\r\nContent-Length: 0\r\n\r\n")
            return
        let_through[second] = let_through.get(second, 0) + 1
        answers.append(200)
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    return limited


def behind_limiter(
    server: TestServer,
    out_dir: Path,
    rows: int,
    per_second: int,
    refusal: bytes = b"429 Too Many Requests\r\nRetry-After: 1",
) -> tuple[swarmget.Report, list[int]]:
    """``rows`` files from a host letting ``per_second`` requests a second through
    (see rate_limiter), downloaded in one process: the report, and the status
    of every request the host answered, in order."""
    answers: list[int] = []
    paths = [f"/{per_second}-a-second-{refusal[:3].decode()}/{i}" for i in range(rows)]
    with routed(server, rate_limiter(per_second, answers, refusal), paths) as urls:
        report = swarmget.download(urls, out_dir, workers=1)
    return report, answers


def test_a_host_letting_two_requests_a_second_through_is_paced_not_hammered(
    server: TestServer, out_dir: Path
) -> None:
    # Two a second, the rest refused with a bare 429.  One request at a time
    # is as fast as the host answers, so every round after a pause ran into
    # the limiter again: 28-29 refusals for 16 rows, and in two runs of three
    # a row ran out of attempts (http_429).  Now the host's requests are
    # spaced at the pace it let them through: the first burst's refusals (14,
    # nothing known yet) and a few more (20-23 in all).
    report, answers = behind_limiter(server, out_dir, 16, 2, b"429 Too Many Requests")
    assert report.ok == 16, report.error_counts()
    assert answers.count(429) <= 25, answers.count(429)


def test_a_host_that_bans_for_a_while_without_retry_after_is_waited_out(
    server: TestServer, out_dir: Path
) -> None:
    # A ban (Cloudflare style): every request refused with a bare 429 for
    # 3.25 s.  Each pause lasted the backoff's ceiling for the attempts of
    # the row refused, and each row refused twice goes behind the others, so
    # the probes alternated a first attempt and a second: 0.5 s, 1 s, 0.5 s,
    # 1 s; the third row's refusal, 3 s into the ban, gave the host up
    # (--host-failures 3) and every row failed http_429.  The pauses grow
    # with the host's rows refused in a row too (0.5, 1, 1, 1 s): the third
    # row goes at 3.5 s, after the ban.
    ban: list[float] = []
    answers: list[int] = []

    def banned(head: bytes, conn: ScriptedConnection) -> None:
        now = time.monotonic()
        ban[:] = ban or [now + 3.25]
        answers.append(429 if now < ban[0] else 200)
        if now < ban[0]:
            conn.send(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\n\r\n")
        else:
            conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    paths = [f"/banned/{i}" for i in range(6)]
    with routed(server, banned, paths) as urls:
        report = swarmget.download(
            urls, out_dir, workers=1, concurrency=1, per_host=1, host_failures=3
        )
    assert report.ok == 6, report.error_counts()
    assert answers.count(429) <= 4, answers


def test_the_refused_row_goes_first_when_the_pause_is_over(
    server: TestServer, out_dir: Path
) -> None:
    # One request a second.  The host's wake-up timer and the refused row's retry
    # end at the same moment; the wake-up came first and sent the next queued row,
    # so the refused row went out again inside the same second, was refused
    # again, and ran out of attempts.
    answers: list[int] = []
    limited = rate_limiter(1, answers)
    paths = [f"/one-a-second/{i}" for i in range(3)]
    with routed(server, limited, paths) as urls:
        report = swarmget.download(urls, out_dir, retries=1, concurrency=1, workers=1)
    assert report.ok == 3, report.failures
    assert answers.count(429) <= 2


def test_a_rate_limited_host_is_sent_less_after_it_pushes_back(
    server: TestServer, out_dir: Path
) -> None:
    # Five requests a second, the rest refused with "429, Retry-After: 1".
    # After each pause the queue went out again at --per-host: refused again,
    # each refusal spending one of the row's attempts, and 8 of 30 rows failed
    # http_429 after some 60 refusals.  Now the host is allowed half what it
    # had under way, growing back from one request (AIMD), and a refusal of a
    # request already under way when the host said so costs no attempt.
    started = time.monotonic()
    report, answers = behind_limiter(server, out_dir, 30, 5)
    assert report.ok == 30, report.error_counts()
    # 25 of the first burst (nothing known yet), then a few per second: 35-41
    # measured (60-70 before, with the rows that failed no longer asking).
    assert answers.count(429) <= 50, answers.count(429)
    assert time.monotonic() - started < 10  # 5 s: five a second, a pause between


def test_a_host_refusing_its_load_with_503_is_sent_less_too(
    server: TestServer, out_dir: Path
) -> None:
    # nginx's limit_req and limit_conn refuse with 503, no Retry-After, unless
    # told otherwise.  A 503 paused only its row, so the queue went on at
    # --per-host into the limiter: a third of the rows failed http_503 after
    # four attempts each (nginx limit_conn 8: 682 of 2,000).  A 503 to a second
    # row in a row, no other answer between, is the host refusing the load:
    # it is slowed down as after a 429.
    report, answers = behind_limiter(server, out_dir, 30, 5, b"503 Service Unavailable")
    assert report.ok == 30, report.error_counts()
    assert answers.count(503) <= 50, answers.count(503)


def test_one_url_answering_503_does_not_slow_its_host(server: TestServer, out_dir: Path) -> None:
    # The other side of the rule above: one file's backend down (a 503 on every
    # try of one URL, 200s between) pauses only its row.
    # retries=2: the run lasts as long as the broken row's backoffs (up to 0.5 +
    # 1 s; with the default 3, up to 3.5 s, and the bound below failed now and then).
    broken = server.file_url("down.bin", size=10, status=503)
    good = [server.file_url(f"up{i}.bin", size=10, latency=0.05) for i in range(60)]
    started = time.monotonic()
    report = swarmget.download([broken, *good], out_dir, workers=1, per_host=4, retries=2)
    assert report.ok == 60 and report.error_counts() == {"http_503": 1}
    assert time.monotonic() - started < 3  # 60 x 50 ms over 4 connections: 0.75 s


def test_a_host_that_refuses_everything_is_given_up_not_waited_on(
    server: TestServer, out_dir: Path
) -> None:
    # Queued rows spend no attempt while a host pushes back, and 429 is not a
    # failure the breaker counted: 40 rows took 40 pauses.  After --host-failures
    # pauses in a row, the host is given up like a dead one.
    refusing = [
        server.file_url(f"refuse-{i}", size=10, status=429, retry_after=1) for i in range(40)
    ]
    started = time.monotonic()
    report = swarmget.download(
        refusing, out_dir, retries=5, concurrency=2, workers=1, host_failures=2
    )
    took = time.monotonic() - started
    assert report.failed == 40 and set(report.error_counts()) == {"http_429"}
    assert any("given up: 2 rows in a row refused" in f.message for f in report.failures)
    assert sum("not requested: " in f.message for f in report.failures) >= 30
    assert took < 10, took  # a pause for each first refusal and each repeat: not 40


def test_one_burst_refused_slowly_is_one_pause(server: TestServer, out_dir: Path) -> None:
    # A queueing limiter answers a burst of five with 429 one by one, 0.6 s apart
    # (longer than the 0.5 s pause), then lets everything through.  Each late
    # refusal of a request sent before the pause counted as another pause in a
    # row, and the host was given up with every row failed.
    answered: list[int] = []

    async def queueing(head: bytes, conn: ScriptedConnection) -> None:
        turn = len(answered)
        answered.append(turn)
        if turn < 5:
            await asyncio.sleep(0.6 * turn)
            conn.send(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\n\r\n")
        else:
            conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    paths = [f"/queueing/{i}" for i in range(20)]
    with routed(server, queueing, paths) as urls:
        report = swarmget.download(
            urls, out_dir, concurrency=5, per_host=5, workers=1, host_failures=2
        )
    assert report.ok == 20, report.failures


def test_a_long_download_under_way_does_not_hold_back_the_probe(
    server: TestServer, out_dir: Path
) -> None:
    # After a pause one request goes out before the rest; the check counted every
    # busy connection as a probe, so a long body already downloading when the
    # 429 came held the host's queue until it ended.
    seen: list[tuple[float, str]] = []
    refused: list[bool] = []

    async def slow_body(head: bytes, conn: ScriptedConnection) -> None:
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n")
        for _ in range(4):
            await asyncio.sleep(1.0)
            conn.send(b"x" * 10)
        seen.append((time.monotonic(), "end of the long one"))

    async def small(head: bytes, conn: ScriptedConnection) -> None:
        await asyncio.sleep(0.2)  # the long one is under way first
        seen.append((time.monotonic(), "small"))
        if not refused:
            refused.append(True)
            conn.send(
                b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"
            )
        else:
            conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    smalls = [f"/probe/s{i}" for i in range(5)]
    with routed(server, slow_body, ["/probe/long"]) as long, routed(server, small, smalls) as urls:
        report = swarmget.download(long + urls, out_dir, concurrency=2, per_host=2, workers=1)
    assert report.ok == 6, report.failures
    order = [what for _, what in sorted(seen)]
    assert order[-1] == "end of the long one", order  # the small ones did not wait for it


def test_the_queue_goes_on_when_the_probe_is_answered_not_when_its_body_ends(
    server: TestServer, out_dir: Path
) -> None:
    seen: list[tuple[float, str]] = []
    refused: list[bool] = []

    async def probe(head: bytes, conn: ScriptedConnection) -> None:
        if not refused:
            refused.append(True)
            conn.send(
                b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"
            )
            return
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\n")
        for _ in range(3):
            await asyncio.sleep(1.0)
            conn.send(b"x" * 10)
        seen.append((time.monotonic(), "end of the probe's body"))

    def quick(head: bytes, conn: ScriptedConnection) -> None:
        seen.append((time.monotonic(), "queued row"))
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    with (
        routed(server, probe, ["/answered/probe"]) as first,
        routed(server, quick, [f"/answered/q{i}" for i in range(4)]) as rest,
    ):
        report = swarmget.download(first + rest, out_dir, concurrency=2, per_host=2, workers=1)
    assert report.ok == 5, report.failures
    order = [what for _, what in sorted(seen)]
    assert order[-1] == "end of the probe's body", order  # the head said 200: the queue went on


def test_a_retry_after_past_the_deadline_gives_the_host_up_at_once(
    server: TestServer, out_dir: Path
) -> None:
    # No row may wait 20 s under --deadline 2: the queued rows were held for the
    # whole pause (and the next), only to fail.
    refusing = [
        server.file_url(f"later-{i}", size=10, status=429, retry_after=20) for i in range(6)
    ]
    started = time.monotonic()
    report = swarmget.download(refusing, out_dir, concurrency=2, workers=1, deadline=2)
    assert time.monotonic() - started < 5
    assert report.failed == 6 and set(report.error_counts()) == {"http_429"}
    # Every row says why it was not retried; the others, that the host was
    # given up for it (they said only "HTTP 429", or "not retried:" without
    # the host, as if their own Retry-After were past the deadline).
    messages = [f.message or "" for f in report.failures]
    assert all("Retry-After 20 s is past --deadline" in m for m in messages), messages
    assert any("given up: Retry-After 20 s is past --deadline" in m for m in messages), messages


def test_a_429_past_the_deadline_names_the_servers_retry_after_not_our_cap(
    server: TestServer, out_dir: Path
) -> None:
    # The wait is capped at 120 s; the message said "Retry-After 120 s", a
    # value the server never sent.
    url = server.file_url("later", size=10, status=429, retry_after=10**9)
    report = swarmget.download([url], out_dir, workers=1, deadline=2)
    (failure,) = report.failures
    assert failure.error == "http_429"
    assert failure.message == "HTTP 429; Retry-After 1000000000 s is past --deadline"


@pytest.mark.parametrize("retry_after", [20, 10**9])
def test_a_503_whose_retry_after_is_past_the_deadline_says_why_it_is_not_retried(
    retry_after: int, server: TestServer, out_dir: Path
) -> None:
    # A 503 pauses only its row: past --deadline it failed at once, saying
    # only "HTTP 503" after one attempt despite --retries.
    url = server.file_url("busy", size=10, status=503, retry_after=retry_after)
    started = time.monotonic()
    report = swarmget.download([url], out_dir, workers=1, retries=3, deadline=2)
    assert time.monotonic() - started < 5
    (failure,) = report.failures
    assert (failure.error, failure.attempts) == ("http_503", 1)
    assert (
        failure.message == f"HTTP 503; not retried: Retry-After {retry_after} s is past --deadline"
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_rows_waiting_for_a_paused_host_do_not_hold_up_the_others(
    workers: int, server: TestServer, out_dir: Path
) -> None:
    # Every other row is on a host that refuses everything for its first 2.5 s
    # (429, Retry-After: 3).  Its rows, waiting, filled the engine's intake and
    # the driver's dealing window, and the other host's rows waited with them.
    started: list[float] = []

    def limited(head: bytes, conn: ScriptedConnection) -> None:
        now = time.monotonic()
        started[:] = started or [now]
        if now - started[0] < 2.5:
            conn.send(
                b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nContent-Length: 0\r\n\r\n"
            )
        else:
            conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    paths = [f"/paused-{workers}/{i}" for i in range(600)]
    with routed(server, limited, paths) as limited_urls, TestServer() as other:
        urls: list[str] = []
        for i, url in enumerate(limited_urls):
            urls += [url, other.file_url(f"free-{i}.bin", size=10)]
        begun = time.monotonic()
        report = swarmget.download(urls, out_dir, workers=workers, retries=2)
        free_done = max((out_dir / f"free-{i}.bin").stat().st_mtime for i in range(len(paths)))
    assert report.ok == 1200, report.error_counts()
    # The free host's rows were all done during the pause (wall clock: mtimes).
    assert free_done - (time.time() - (time.monotonic() - begun)) < 2.0


@pytest.mark.parametrize("fault", ["two_cl", "nul_header", "bad_status", "huge_headers"])
def test_connection_is_never_reused_after_a_protocol_error(
    server: TestServer, out_dir: Path, fault: str
) -> None:
    bad = server.file_url(f"{fault}.bin", size=100, fault=fault)
    good = [server.file_url(f"after-{fault}-{i}.bin", size=100) for i in range(3)]
    server.reset_stats()
    report = swarmget.download([bad, *good], out_dir, retries=0, concurrency=1)
    assert report.failures[0].error == "protocol" and report.ok == 3
    assert server.stats.connections == 2  # the bad one, then a fresh one for the rest


def test_unwritable_output_dir_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(swarmget.TransferError) as info:
        swarmget.download(["http://127.0.0.1:9/x"], blocker / "out")
    assert info.value.code == "io"
    assert "Not a directory" in info.value.message or "not a directory" in str(info.value)


def test_read_only_output_stops_the_run(server: TestServer, tmp_path: Path) -> None:
    import os

    with small_tmpfs(tmp_path / "ro") as mount:
        (mount / ".swarmget").mkdir()
        os.system(f"mount -o remount,ro {mount}")
        urls = [server.file_url(f"r{i}.bin", size=100) for i in range(10)]
        with pytest.raises(swarmget.TransferError) as info:
            swarmget.download(urls, mount, retries=0)
        assert info.value.code == "io"
        assert "Read-only" in info.value.message


def test_a_read_only_or_full_mount_inside_the_output_fails_only_its_rows(
    server: TestServer, out_dir: Path
) -> None:
    # A directory to create on a read-only mount inside the output dir stopped
    # the whole run (EROFS, as if the output dir itself were read-only).
    import os

    with small_tmpfs(out_dir / "ro", "64k") as read_only, small_tmpfs(out_dir / "tiny", "64k"):
        os.system(f"mount -o remount,ro {read_only}")
        rows = [
            Row(0, server.file_url("b", size=5), path="ro/new/b.bin"),
            Row(1, server.file_url("c", size=200_000), path="tiny/new/c.bin"),
            *[Row(i + 2, server.file_url(f"r{i}", size=5), path=f"r{i}.bin") for i in range(300)],
        ]
        report = swarmget.download(rows, out_dir, retries=0, concurrency=4)
        assert (report.ok, report.failed) == (300, 2), report.failures
        messages = sorted(f.message or "" for f in report.failures)
        assert "Read-only" in messages[0] or "Read-only" in messages[1], messages
        assert any("No space left" in m for m in messages), messages


def test_a_read_only_bind_mount_inside_the_output_fails_only_its_rows(
    server: TestServer, out_dir: Path
) -> None:
    # A bind mount has the output dir's device: its EROFS stopped the run.
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root to bind-mount")
    source, target = out_dir.parent / f"{out_dir.name}-src", out_dir / "rob"
    source.mkdir()
    target.mkdir(parents=True)
    if os.system(f"mount --bind {source} {target} && mount -o remount,bind,ro {target}"):
        pytest.skip("bind mounts not allowed here")
    try:
        rows = [
            Row(0, server.file_url("a", size=5), path="a.bin"),
            Row(1, server.file_url("b", size=5), path="rob/new/b.bin"),
            Row(2, server.file_url("c", size=5), path="c.bin"),
        ]
        report = swarmget.download(rows, out_dir, retries=0, concurrency=1)
    finally:
        os.system(f"umount -l {target}")
        source.rmdir()
    (failure,) = report.failures
    assert (report.ok, failure.index) == (2, 1)
    assert failure.message is not None and "Read-only" in failure.message


def test_urls_a_host_always_refuses_do_not_cost_the_ones_it_serves(
    server: TestServer, out_dir: Path
) -> None:
    # Some URLs answer 429 every time, the others once.  The probe after each
    # pause was the row refused before it: refused again and again, it gave
    # the host up (--host-failures) and failed the rest, most never requested.
    # (Small: "Retry-After: 0" is no advice, so every pause is the backoff's.)
    # host_failures 3: the host is paced after its first rounds (as a rate
    # limiter would be), so its requests go one at a time, and an always-URL's
    # first 429 then another row's first 429 with no answer between are two
    # rows in a row refused, as the rule says.
    always = [server.file_url(f"always-{i}", size=10, status=429, retry_after=0) for i in range(2)]
    once = [
        server.file_url(f"once-{i}", size=10, status=429, retry_after=0, times=1) for i in range(4)
    ]
    urls = []
    for i, url in enumerate(once):
        urls += [url, always[i // 2]] if i % 2 == 0 else [url]
    report = swarmget.download(
        urls, out_dir, retries=2, concurrency=2, per_host=2, workers=1, host_failures=3
    )
    assert (report.ok, report.error_counts()) == (4, {"http_429": 2}), report.failures
    for i in range(4):
        assert (out_dir / f"once-{i}").read_bytes() == expected_body(f"once-{i}", 10)


def test_a_503_read_as_push_back_that_asks_for_tomorrow_does_not_hold_its_host(
    server: TestServer, out_dir: Path
) -> None:
    # A 503 right after another row's 503 is read as the host refusing its
    # load, and paused the host for our 120 s cap, while its own row, asking
    # for more than we wait, failed at once: the other rows waited 2 minutes
    # for a pause nobody would take.
    urls = [
        server.file_url("soon.bin", size=10, status=503, retry_after=1, times=1),
        server.file_url("tomorrow.bin", size=10, status=503, retry_after=9999),
        server.file_url("fine.bin", size=10),
    ]
    started = time.monotonic()
    report = swarmget.download(urls, out_dir, workers=1, per_host=1)
    assert time.monotonic() - started < 10
    assert report.ok == 2 and report.error_counts() == {"http_503": 1}


@pytest.mark.parametrize(
    ("retry_after", "why"),
    [(1000, "is more than the 120 s we wait"), (86400, "is past --deadline")],
)
def test_a_503_asking_for_more_than_we_wait_is_not_retried(
    retry_after: int, why: str, server: TestServer, out_dir: Path
) -> None:
    # "Retry-After: 86400" ("tomorrow"): the row waited our cap, 120 s, asked
    # again, and again: 6 minutes for one URL, to fail the same way.
    url = server.file_url(f"later-{retry_after}", size=10, status=503, retry_after=retry_after)
    started = time.monotonic()
    report = swarmget.download([url], out_dir, workers=1, retries=3)
    assert time.monotonic() - started < 5
    (failure,) = report.failures
    assert (failure.error, failure.attempts) == ("http_503", 1)
    assert failure.message == f"HTTP 503; not retried: Retry-After {retry_after} s {why}"


@pytest.mark.parametrize("no_wait", ["0", "Thu, 01 Jan 1970 00:00:00 GMT"])
def test_a_429_asking_for_no_wait_still_pauses_the_host(
    no_wait: str, server: TestServer, out_dir: Path
) -> None:
    # A limiter refuses everything for 1 s with "Retry-After: 0" (or a date
    # already past).  Taken at its word, the host was paused for no time: the
    # whole queue went out again at once, 5 refusals in a row gave the host up
    # within 0.3 s, and every row failed http_429.  A Retry-After that asks for
    # no wait is no advice (curl reads it so too): the backoff's pause applies.
    answers: list[int] = []
    window: list[float] = []

    def limited(head: bytes, conn: ScriptedConnection) -> None:
        now = time.monotonic()
        window[:] = window or [now + 1.0]
        if now < window[0]:
            answers.append(429)
            conn.send(
                b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: "
                + no_wait.encode()
                + b"\r\nContent-Length: 0\r\n\r\n"
            )
        else:
            answers.append(200)
            conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    paths = [f"/no-wait-{len(no_wait)}/{i}" for i in range(30)]
    with routed(server, limited, paths) as urls:
        report = swarmget.download(urls, out_dir, concurrency=4, workers=1)
    assert report.ok == 30, report.error_counts()
    assert answers.count(429) <= 12, answers  # a few per pause, not the queue's worth


@pytest.mark.parametrize("status", [522, 524])
def test_a_cdns_origin_timeout_is_retried_as_curl_does(
    status: int, server: TestServer, out_dir: Path
) -> None:
    # Cloudflare's 522 (the origin did not accept) and 524 (it accepted and
    # did not answer in time) are a busy origin's, as a 504 is; curl --retry
    # retries them.  They failed at the first attempt.
    url = server.file_url(f"cdn-{status}", size=10, status=status, times=1)
    report = swarmget.download([url], out_dir, workers=1, retries=1)
    assert report.ok == 1, report.failures
    assert [record["attempts"] for record in swarmget.read_manifest(out_dir)] == [2]
