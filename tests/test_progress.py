"""Progress listeners, driven by synthetic snapshots and a fake clock."""

from __future__ import annotations

import io
import re
import threading

import pytest
from rich.console import Console

from swarmget.progress import (
    Display,
    NullProgress,
    PlainProgress,
    ProgressListener,
    RateMeter,
    RichProgress,
    StallWatch,
    format_bytes,
    format_eta,
    make_progress,
    summary_lines,
)
from swarmget.report import FileResult, Report, Snapshot, Waiting, longest_waiting


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def snap(
    done: int,
    elapsed: float,
    *,
    failed: int = 0,
    nbytes: int | None = None,
    rows_seen: int = 10000,
    input_done: bool = True,
    waiting: Waiting | None = None,
) -> Snapshot:
    return Snapshot(
        done=done,
        failed=failed,
        bytes=done * 51200 if nbytes is None else nbytes,
        elapsed=elapsed,
        rows_seen=rows_seen,
        input_done=input_done,
        active=8,
        waiting=waiting,
    )


def test_listeners_satisfy_the_protocols() -> None:
    listeners: list[Display] = [
        NullProgress(),
        PlainProgress(io.StringIO()),
        RichProgress(Console(file=io.StringIO(), force_terminal=True)),
    ]
    for listener in listeners:
        engine_side: ProgressListener = listener
        engine_side.start()
        engine_side.update(snap(1, 0.5))
        engine_side.finish(Report(ok=1))
        listener.close()


# -- what a stalled run waits on -----------------------------------------------------------------


def connecting(seconds: float, count: int = 3, host: str = "10.0.0.7:8443") -> Waiting:
    return Waiting(count, "connecting to", host, seconds)


def test_a_stall_is_said_once_nothing_finished_for_a_while() -> None:
    watch = StallWatch(after=5.0)
    assert watch.waiting(snap(0, 4.0, waiting=connecting(4.0))) is None  # not yet a while
    assert watch.waiting(snap(0, 5.0, waiting=connecting(5.0))) == (
        "waiting: 3 connecting to 10.0.0.7:8443 for 5 s"
    )
    assert watch.waiting(snap(0, 6.0)) is None  # nothing in flight (between attempts)
    assert watch.waiting(snap(1, 7.0, waiting=connecting(7.0))) is None  # a row finished
    assert watch.waiting(snap(1, 11.0, waiting=connecting(9.0))) is None  # 4 s since then
    assert watch.waiting(snap(1, 12.0, waiting=connecting(1.0))) is None  # a fresh wait
    assert watch.waiting(snap(1, 12.5, waiting=connecting(10.0))) is not None


def test_rows_backing_off_are_said_with_their_next_try() -> None:
    watch = StallWatch(after=5.0)
    backing_off = Waiting(3, "backing off from", "10.0.0.7:8443", 4.0, next_try_in=26.0)
    assert watch.waiting(snap(0, 5.0, waiting=backing_off)) is None  # not long enough yet
    backing_off = Waiting(3, "backing off from", "10.0.0.7:8443", 6.0, next_try_in=24.4)
    assert watch.waiting(snap(0, 6.0, waiting=backing_off)) == (
        "waiting: 3 backing off from 10.0.0.7:8443, next try in 24 s"
    )


def test_workers_backing_off_from_one_host_say_its_soonest_next_try() -> None:
    waits = [
        Waiting(2, "backing off from", "b.test", 9.0, next_try_in=20.0),
        Waiting(1, "backing off from", "b.test", 3.0, next_try_in=2.0),
    ]
    assert longest_waiting(waits) == Waiting(3, "backing off from", "b.test", 9.0, 2.0)


def test_a_waiting_host_is_made_printable() -> None:
    watch = StallWatch(after=0.0)
    said = watch.waiting(snap(0, 1.0, waiting=connecting(1.0, host="evil\x1b]0;x\x07")))
    assert said is not None and "\x1b" not in said and "evil\\x1b" in said


def test_the_longest_wait_of_several_engines_sums_their_counts_for_its_host() -> None:
    assert longest_waiting([None, None]) is None
    waits = [
        connecting(3.0, count=2),
        Waiting(5, "in TLS handshake with", "b.test", 9.0),
        None,
        Waiting(1, "in TLS handshake with", "b.test", 2.0),
    ]
    assert longest_waiting(waits) == Waiting(6, "in TLS handshake with", "b.test", 9.0)


def test_plain_says_what_it_waits_on_instead_of_a_zero_rate() -> None:
    out, clock = io.StringIO(), FakeClock()
    progress = PlainProgress(out, clock=clock, interval=2.0)
    progress.start()
    for elapsed in (2.0, 4.0, 6.0):
        clock.now += 2.0
        progress.update(snap(0, elapsed, nbytes=0, rows_seen=3, waiting=connecting(elapsed)))
    assert out.getvalue().splitlines() == [
        "swarmget: 0/3 files, 0 failed, 0 B, 0.0 files/s",
        "swarmget: 0/3 files, 0 failed, 0 B, 0.0 files/s",
        "swarmget: 0/3 files, 0 failed, 0 B, waiting: 3 connecting to 10.0.0.7:8443 for 6 s",
    ]


def test_rich_says_what_it_waits_on_instead_of_a_zero_rate_and_no_eta() -> None:
    console, buf = rich_console()
    clock = FakeClock()
    progress = RichProgress(console, clock=clock)
    progress.start()
    clock.now += 1
    progress.update(snap(0, 12.0, nbytes=0, rows_seen=3, waiting=connecting(12.0)))
    progress.close()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())
    assert "waiting: 3 connecting to 10.0.0.7:8443 for 12 s" in plain
    assert "files/s" not in plain and "ETA" not in plain


# -- plain mode ---------------------------------------------------------------------------------


def test_plain_line_format() -> None:
    out, clock = io.StringIO(), FakeClock()
    progress = PlainProgress(out, clock=clock)
    progress.start()
    clock.now += 2.0
    progress.update(snap(1234, 2.0, nbytes=61_700_000))
    assert out.getvalue() == "swarmget: 1234/10000 files, 0 failed, 61.7 MB, 617 files/s\n"


def test_plain_total_is_a_lower_bound_until_input_is_read() -> None:
    out, clock = io.StringIO(), FakeClock()
    progress = PlainProgress(out, clock=clock)
    progress.start()
    clock.now += 2.0
    progress.update(snap(4, 2.0, failed=3, rows_seen=5000, input_done=False, nbytes=999))
    assert out.getvalue() == "swarmget: 4/5000+ files, 3 failed, 999 B, 2.0 files/s\n"


def test_plain_throttles_to_one_line_per_interval() -> None:
    out, clock = io.StringIO(), FakeClock()
    progress = PlainProgress(out, clock=clock, interval=2.0)
    progress.start()
    # 4 updates a second for 10 s: the engine's cadence.
    for tick in range(1, 41):
        clock.now += 0.25
        progress.update(snap(tick * 100, tick * 0.25))
    lines = out.getvalue().splitlines()
    assert len(lines) == 5  # at 2, 4, 6, 8 and 10 s
    assert lines[0].startswith("swarmget: 800/10000 files")
    assert lines[-1].startswith("swarmget: 4000/10000 files")
    # Steady 400 files/s, measured over each interval rather than since the start.
    assert all(line.endswith(", 400 files/s") for line in lines)


def test_plain_says_nothing_for_a_short_run() -> None:
    out, clock = io.StringIO(), FakeClock()
    progress = PlainProgress(out, clock=clock)
    progress.start()
    clock.now += 1.5
    progress.update(snap(10, 1.5))
    progress.finish(Report(ok=10, elapsed=1.6))
    assert out.getvalue() == ""


def test_plain_ends_on_the_runs_totals_once_it_showed_a_line() -> None:
    # Its last line was up to an interval old: 4/10000 where the run did all 10.
    out, clock = io.StringIO(), FakeClock()
    progress = PlainProgress(out, clock=clock)
    progress.start()
    clock.now += 2.0
    progress.update(snap(4, 2.0, rows_seen=10))
    clock.now += 1.0
    progress.update(snap(10, 3.0, rows_seen=10))  # too soon after the first line to show
    progress.finish(Report(ok=9, failed=1, skipped=0, bytes=5000, elapsed=3.0))
    assert out.getvalue().splitlines() == [
        "swarmget: 4/10 files, 0 failed, 204.8 kB, 2.0 files/s",
        "swarmget: 10/10 files, 1 failed, 5.0 kB, 3.3 files/s",
    ]


def test_plain_ends_a_stopped_run_on_what_finished() -> None:
    out, clock = io.StringIO(), FakeClock()
    progress = PlainProgress(out, clock=clock)
    progress.start()
    clock.now += 2.0
    progress.update(snap(4, 2.0, rows_seen=300, input_done=False))
    progress.finish(Report(ok=5, skipped=2, bytes=500, elapsed=2.5))  # Ctrl-C
    assert out.getvalue().splitlines()[-1] == "swarmget: 7/300+ files, 0 failed, 500 B, 2.0 files/s"


def test_plain_survives_a_closed_stream() -> None:
    out, clock = io.StringIO(), FakeClock()
    progress = PlainProgress(out, clock=clock)
    progress.start()
    out.close()
    clock.now += 5
    progress.update(snap(10, 5.0))  # must not raise into the engine's loop


# -- rates and formatting -----------------------------------------------------------------------


def test_rate_meter_follows_recent_changes() -> None:
    meter = RateMeter(window=5.0)
    assert meter.add(snap(100, 1.0)) == (100.0, 100 * 51200)
    for t in range(2, 11):
        meter.add(snap(100 * t, float(t)))
    # The rate then halves: after a full window the meter shows only the new rate.
    done = 1000
    files_per_s = 0.0
    for t in range(11, 17):
        done += 50
        files_per_s, _ = meter.add(snap(done, float(t)))
    assert files_per_s == pytest.approx(50.0)


def test_rate_meter_with_no_elapsed_time() -> None:
    assert RateMeter().add(snap(0, 0.0)) == (0.0, 0.0)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (51200, "51.2 kB"),
        (61_700_000, "61.7 MB"),
        (512_000_000, "512.0 MB"),
        (1_500_000_000, "1.5 GB"),
        (3e15, "3000.0 TB"),
    ],
)
def test_format_bytes(n: float, text: str) -> None:
    assert format_bytes(n) == text


def test_format_eta() -> None:
    assert format_eta(None, 10, 5.0) == "-:--"
    assert format_eta(100, 10, 0.0) == "-:--"
    assert format_eta(100, 10, 45.0) == "0:02"
    assert format_eta(10_000, 0, 1.0) == "2:46:40"


def test_summary_all_ok() -> None:
    report = Report(ok=10000, bytes=512_000_000, elapsed=1.23)
    assert summary_lines(report) == [
        "10000 files ok, 0 failed, 512.0 MB in 1.23 s (8130 files/s, 416.3 MB/s)"
    ]


def test_summary_rate_counts_only_what_came_in_this_run() -> None:
    report = Report(elapsed=2.0)
    report.add(FileResult("http://a/big", "big", "ok", 206, 4_000_000_000, reused=2_000_000_000))
    assert summary_lines(report) == [
        "1 file ok, 0 failed, 4.0 GB in 2.00 s (0.5 files/s, 1.0 GB/s)",
        "2.0 GB of it was already on disk (parts kept by an earlier run, --dedupe copies): "
        "not counted in the rate",
    ]
    assert (report.to_json()["mb_per_s"], report.to_json()["reused_bytes"]) == (1000.0, 2e9)


def test_a_failure_line_is_cut_to_a_readable_length() -> None:
    report = Report(elapsed=1.0)
    report.add(FileResult("http://a/" + "x" * 100_000, None, "failed", error="http_414",
                          message="m" * 10_000))  # fmt: skip
    line = summary_lines(report)[-1]
    assert len(line) < 600 and line.startswith("  http://a/xxx") and line.endswith("...")


def test_summary_with_failures() -> None:
    report = Report(elapsed=2.0, manifest="/out/.swarmget/manifest.jsonl")
    report.add(FileResult(url="http://a/1", path="1", status="ok", bytes=10))
    for i in range(7):
        report.add(
            FileResult(
                url=f"http://a/missing{i}",
                path=None,
                status="failed",
                error="http_404",
                message="Not\nFound",
            )
        )
    report.add(FileResult(url="http://b/x", path=None, status="failed", error="timeout"))
    lines = summary_lines(report, show=3)
    assert lines[0].startswith("1 file ok, 8 failed, 10 B in 2.00 s")
    assert lines[1] == "errors: http_404 7, timeout 1"
    assert lines[2] == "first 3 failures:"
    assert lines[3] == "  http://a/missing0 -> http_404: Not Found"
    assert len(lines) == 7
    assert lines[-1] == "every row is listed in /out/.swarmget/manifest.jsonl"


def test_the_summary_never_sends_a_terminal_what_it_would_act_on() -> None:
    # URLs come from the input, messages from servers: an ESC in either set the
    # window title, cleared the screen or wrote the clipboard (OSC 52).
    report = Report(elapsed=1.0)
    url = "http://h/\x1b]0;owned\x07\u202egpj.exe"
    report.add(FileResult(url, None, "failed", error="http_404", message="\x1b[2Jgone\x9b"))
    failure = summary_lines(report)[-1]
    assert failure == "  http://h/\\x1b]0;owned\\x07\\u202egpj.exe -> http_404: \\x1b[2Jgone\\x9b"
    assert failure.isprintable()


# -- rich mode ----------------------------------------------------------------------------------


def rich_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=140, color_system="truecolor"), buf


def test_rich_renders_and_cleans_up() -> None:
    console, buf = rich_console()
    clock = FakeClock()
    progress = RichProgress(console, clock=clock)
    progress.start()
    for i in range(1, 6):
        clock.now += 0.2
        progress.update(snap(i * 100, i * 0.2, failed=i, rows_seen=i * 300, input_done=i >= 3))
    progress.finish(Report(ok=495, failed=5, elapsed=1.0))
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())
    assert "100/300+ files" in plain  # total unknown yet: pulsing bar, lower bound
    assert "500/1500 files" in plain
    assert "5 failed" in plain
    assert "ETA" in plain
    assert "files/s" in plain
    assert "MB/s" in plain
    # Transient: the live line is erased at the end, and the cursor is shown again.
    assert buf.getvalue().endswith("\x1b[2K")
    assert "\x1b[?25h" in buf.getvalue()


def test_rich_throttles_renders() -> None:
    console, buf = rich_console()
    clock = FakeClock()
    progress = RichProgress(console, clock=clock, interval=0.1)
    progress.start()
    for i in range(100):  # 100 updates in 0.5 s
        clock.now += 0.005
        progress.update(snap(i, i * 0.005))
    renders = buf.getvalue().count("files/s")
    assert 5 <= renders <= 6  # one every 0.1 s, give or take float rounding of the clock
    progress.close()


def test_rich_close_is_idempotent_and_late_updates_are_ignored() -> None:
    console, buf = rich_console()
    clock = FakeClock()
    progress = RichProgress(console, clock=clock)
    progress.start()
    progress.close()
    progress.close()
    size = len(buf.getvalue())
    clock.now += 10
    progress.update(snap(5, 10.0))
    progress.finish(Report())
    assert len(buf.getvalue()) == size


def test_rich_update_from_another_thread() -> None:
    console, _ = rich_console()
    progress = RichProgress(console, interval=0.0)
    progress.start()
    errors: list[BaseException] = []

    def loop_thread() -> None:
        try:
            for i in range(200):
                progress.update(snap(i, 0.01 * (i + 1)))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=loop_thread)
    thread.start()
    progress.close()  # may land mid-stream, as on Ctrl-C
    thread.join()
    assert errors == []


# -- choosing a display -------------------------------------------------------------------------


class TtyStringIO(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_make_progress_picks_by_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    assert isinstance(make_progress(io.StringIO(), quiet=True), NullProgress)
    assert isinstance(make_progress(TtyStringIO(), quiet=True), NullProgress)
    assert isinstance(make_progress(io.StringIO()), PlainProgress)
    assert isinstance(make_progress(None), NullProgress)  # no stderr at all (2>&-)
    display = make_progress(TtyStringIO())
    assert isinstance(display, RichProgress)
    display.close()
    # A terminal that cannot redraw a line: rich showed nothing there at all.
    monkeypatch.setenv("TERM", "dumb")
    assert isinstance(make_progress(TtyStringIO()), PlainProgress)


@pytest.mark.parametrize("width", [40, 80, 100, 200])
def test_rich_stays_on_one_line(width: int) -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=width)
    clock = FakeClock()
    progress = RichProgress(console, clock=clock)
    progress.start()
    clock.now += 1
    progress.update(snap(123456, 30.0, failed=1234, nbytes=12_345_678_901, rows_seen=1_000_000))
    frame = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())
    assert "\n" not in frame.strip("\r\n")
    assert frame.startswith(("━", "123456/"))
    progress.close()


def test_report_repr_counts_failures_instead_of_listing_them() -> None:
    report = Report(manifest="/out/.swarmget/manifest.jsonl")
    for i in range(5000):
        report.add(FileResult(f"http://h/{i}", None, "failed", 404, 0, "http_404", 1, 1))
    report.add(FileResult("http://h/x", None, "failed", None, 0, "dns", 1, 1))
    report.add(FileResult("http://h/ok", "ok", "ok", 200, 10, None, 1, 1))
    text = repr(report)
    assert text == (
        "Report(ok=1, failed=5001, skipped=0, bytes=10, elapsed=0.000, "
        "errors={http_404: 5000, dns: 1}, manifest='/out/.swarmget/manifest.jsonl')"
    )
    assert len(report.failures) == 5001  # still all there, just not printed
