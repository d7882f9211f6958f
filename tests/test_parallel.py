"""Several worker processes: the same files, names and manifest as one process."""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import swarmget
from swarmget import api
from swarmget.errors import UsageError
from swarmget.options import Options
from swarmget.parallel import fork, supervisor, worker_count
from swarmget.parallel.backend import Stopped
from swarmget.report import Report, Snapshot
from swarmget.sinks.base import Assignment
from swarmget.sinks.plan import PlanBatch
from swarmget.sources.rows import Row
from swarmget.streaming import Stream
from swarmget.testing import ProcessServer, TestServer, expected_body, serve_in_subprocess
from swarmget.testing.process import open_files


@pytest.fixture(scope="module")
def server() -> Iterator[ProcessServer]:
    with serve_in_subprocess() as srv:
        yield srv


def rows(server: ProcessServer) -> list[Row]:
    out: list[Row] = []
    for i in range(600):
        # Every third name collides with another, so suffixes must be dealt
        # out exactly as one process would.
        name = f"dir{i % 7}/img{i // 3}.jpg"
        out.append(Row(i, server.url(f"/files/{name}", size=1000 + i)))
    out.append(Row(600, server.file_url("gone.bin", status=404)))
    out.append(Row(601, "ftp://nope/x"))
    out.append(Row(602, server.file_url("x.bin", size=10), path="../escape"))
    return out


def manifest(out: Path) -> dict[str, dict[str, Any]]:
    lines = (out / ".swarmget" / "manifest.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == len({r["url"] for r in records})
    return {r["url"]: r for r in records}


def tree(out: Path) -> dict[str, bytes]:
    files = {}
    for base, _, names in os.walk(out):
        for name in names:
            path = Path(base) / name
            if ".swarmget" not in path.parts:
                files[str(path.relative_to(out))] = path.read_bytes()
    return files


def test_two_workers_match_one(server: ProcessServer, tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    single = swarmget.download(rows(server), one, workers=1, retries=0, concurrency=8)
    double = swarmget.download(rows(server), two, workers=2, retries=0, concurrency=8)
    assert (single.ok, single.failed) == (double.ok, double.failed) == (600, 3)
    assert single.error_counts() == double.error_counts() == {
        "bad_path": 1, "bad_url": 1, "http_404": 1,
    }  # fmt: skip
    assert tree(one) == tree(two)
    assert len(tree(two)) == 600
    for url, record in manifest(one).items():
        other = manifest(two)[url]
        assert (record["status"], record["path"], record["error"]) == (
            other["status"], other["path"], other["error"],
        )  # fmt: skip
    sample = next(r for r in manifest(two).values() if r["path"] == "img0-1.jpg")
    assert (two / "img0-1.jpg").read_bytes() == expected_body("dir1/img0.jpg", 1001)
    assert sample["url"].endswith("/files/dir1/img0.jpg?size=1001")


def test_worker_reports_keep_every_field_of_a_record(server: ProcessServer, tmp_path: Path) -> None:
    """Plain ok rows cross from a worker as five integers, the driver putting the
    rest back from the row it dealt (parallel/backend.py: Done): every record is
    the one a single process writes, the redacted URL of a row with credentials
    and the digests of a --hash run included."""
    urls = [server.file_url(f"f{i}.bin", size=300 + i) for i in range(60)]
    urls.append(server.file_url("cred.bin", size=10).replace("http://", "http://me:secret@", 1))
    urls.append(server.file_url("gone.bin", status=404))
    for options in ({}, {"hash": "sha256"}):
        runs = []
        for workers in (1, 2):
            out = tmp_path / f"{workers}-{len(options)}"
            report = swarmget.download(urls, out, workers=workers, retries=0, **options)
            assert (report.ok, report.failed) == (61, 1)
            lines = (out / ".swarmget" / "manifest.jsonl").read_text().splitlines()
            records = [json.loads(line) for line in lines]
            for record in records:
                assert record.pop("elapsed_ms") >= 0
            runs.append(records)
        assert runs[0] == runs[1]
        cred = next(r for r in runs[1] if "cred.bin" in r["url"])
        assert "secret" not in cred["url"] and cred["path"] == "cred.bin"
        assert all(("sha256" in r) == bool(options) for r in runs[1] if r["status"] == "ok")
        assert {r["http_status"] for r in runs[1]} == {200, 404}


def test_a_download_collects_cycles_less_often_and_puts_the_threshold_back(
    server: ProcessServer, tmp_path: Path
) -> None:
    seen = []

    def urls() -> Iterator[str]:
        for i in range(20):
            seen.append(gc.get_threshold()[0])  # read by the driver, during the run
            yield server.file_url(f"g{i}.bin", size=100)

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        assert swarmget.download(urls(), tmp_path / "a", workers=2).ok == 20
        assert set(seen) == {api.DOWNLOAD_GC_THRESHOLD} and gc.get_threshold() == (700, 10, 10)
        seen.clear()
        gc.set_threshold(50_000, 10, 10)  # the caller's own, rarer: kept
        assert swarmget.download(urls(), tmp_path / "b", workers=1).ok == 20
        assert set(seen) == {50_000} and gc.get_threshold() == (50_000, 10, 10)
    finally:
        gc.set_threshold(*before)


def _frozen_objects(item: Any) -> int:
    return gc.get_freeze_count()  # in the worker that fetched the item


def test_a_worker_keeps_what_it_inherited_out_of_the_collector(server: ProcessServer) -> None:
    # A forked worker's collections neither scan the driver's heap nor write
    # to its shared pages: the worker freezes what it inherited.  The caller's
    # own process is left as it was.
    urls = [server.file_url(f"z{i}.bin", size=10) for i in range(4)]
    with swarmget.stream(urls, workers=2, map=_frozen_objects) as items:
        counts = [item.value for item in items]
    assert len(counts) == 4 and min(counts) > 10_000
    assert gc.get_freeze_count() == 0


def test_a_stream_interrupted_as_it_starts_leaves_no_workers(
    server: ProcessServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Ctrl-C after the workers were forked, before the run's thread began:
    # the workers lived on until the collector freed their pipes.
    def interrupted(self: Stream, backend: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Stream, "_supervisor", interrupted)
    stream = swarmget.stream([server.file_url("a.bin")], workers=2, spill_dir=str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        next(stream)  # the first item starts the run
    assert multiprocessing.active_children() == []
    assert list(tmp_path.iterdir()) == []


def test_progress_is_the_sum_of_the_workers(server: ProcessServer, tmp_path: Path) -> None:
    seen: list[Snapshot] = []
    finished: list[Report] = []

    class Listener:
        def start(self) -> None:
            pass

        def update(self, snapshot: Snapshot) -> None:
            seen.append(snapshot)

        def finish(self, report: Report) -> None:
            finished.append(report)

    urls = [server.file_url(f"p{i}.bin", size=5000, latency=0.01) for i in range(400)]
    report = swarmget.download(urls, tmp_path, workers=2, concurrency=8, progress=Listener())
    assert report.ok == 400 and finished == [report]
    assert seen and seen[-1].rows_seen == 400 and seen[-1].input_done
    done = [s.done for s in seen]
    assert done == sorted(done)  # never goes backwards
    assert max(s.active for s in seen) > 4  # both workers were busy at once


def test_rerun_with_workers_skips_what_is_done(server: ProcessServer, tmp_path: Path) -> None:
    urls = [server.file_url(f"r{i}.bin", size=700) for i in range(300)]
    assert swarmget.download(urls, tmp_path, workers=2).ok == 300
    again = swarmget.download(urls, tmp_path, workers=2)
    assert (again.ok, again.skipped) == (0, 300)
    assert len(manifest(tmp_path)) == 300


def test_a_fatal_error_in_a_worker_stops_the_run(server: ProcessServer, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(swarmget.TransferError) as info:
        swarmget.download([server.file_url("a.bin")], blocker / "out", workers=2)
    assert info.value.code == "io"


def test_worker_count_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWARMGET_WORKERS", raising=False)
    assert worker_count(Options(workers=3)) == 3
    assert worker_count(Options(workers=8, concurrency=2)) == 2
    assert worker_count(Options(workers=8, per_host=3)) == 3  # a host's limit is kept
    assert worker_count(Options(), rows=10) == 1  # a short list: one process, no fork
    assert worker_count(Options(workers=2), rows=10) == 2  # unless asked for
    assert worker_count(Options(), rows=1000) == worker_count(Options())
    monkeypatch.setenv("SWARMGET_WORKERS", "5")
    assert worker_count(Options()) == 5
    assert worker_count(Options(workers=2)) == 2
    monkeypatch.setenv("SWARMGET_WORKERS", "many")
    with pytest.raises(swarmget.UsageError):
        worker_count(Options())
    monkeypatch.delenv("SWARMGET_WORKERS")
    # A threaded caller gets one process unless it asks: forking threads is unsafe.
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert worker_count(Options()) == 1
    finally:
        stop.set()
        thread.join()


def _stream_in_a_daemon(url: str, results: Any) -> None:
    try:
        with swarmget.stream([url] * 5, workers=2) as items:
            results.put(("ok", sum(item.ok for item in items)))
    except BaseException as exc:
        results.put(("error", repr(exc)))


def test_a_daemonic_process_streams_with_one_worker(tmp_path: Path) -> None:
    # A DataLoader's or a Pool's worker may not have children: it used to fail
    # with "daemonic processes are not allowed to have children".
    import multiprocessing

    with TestServer() as server:
        results: Any = multiprocessing.get_context("fork").Queue()
        url = server.file_url("d.bin", size=10)
        child = multiprocessing.get_context("fork").Process(
            target=_stream_in_a_daemon, args=(url, results), daemon=True
        )
        child.start()
        assert results.get(timeout=30) == ("ok", 5)
        child.join(10)


def _worker_that_fails_at_start_up(conn: Any, _inherited: Any, worker: int, *_args: Any) -> None:
    # What worker_main does when its engine cannot start (a bad setting): say
    # why, then end, so the parent's later sends meet a broken pipe.
    conn.send(Stopped(worker, UsageError("bad setting found by the worker")))
    conn.close()


def test_a_worker_ending_at_start_up_reports_its_error_not_a_broken_pipe(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(fork, "worker_main", _worker_that_fails_at_start_up)
    # Far more rows than a pipe buffers, so the parent keeps sending after the
    # workers are gone.
    urls = [f"http://127.0.0.1:1/{'x' * 200}{i}" for i in range(20_000)]
    with pytest.raises(UsageError, match="bad setting found by the worker"):
        swarmget.download(urls, tmp_path / "out", workers=2)


def test_a_short_input_is_split_evenly_between_the_workers(
    server: ProcessServer, tmp_path: Path
) -> None:
    # 200 rows fit in one dealing batch.  Dealt whole, they all went to one
    # worker, which has only half the connections (100), so half the rows
    # waited for a second round.  Split level, each worker opens a connection
    # for each of its 100 rows at once (every response is 0.3 s away).
    urls = [server.file_url(f"even{i}.bin", size=100, latency=0.3) for i in range(200)]
    server.reset_stats()
    report = swarmget.download(urls, tmp_path / "out", workers=2, concurrency=200, per_host=200)
    assert report.ok == 200
    assert (server.stats.connections, server.stats.peak_active) == (200, 200)


class _RecordingBackend:
    """Records what the supervisor deals to each worker."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.sent: list[list[Any]] = [[] for _ in range(workers)]

    def send(self, worker: int, rows: list[Any]) -> bool:
        self.sent[worker].extend(rows)
        return True


def _supervisor(backlogs: list[int]) -> tuple[supervisor.Supervisor, _RecordingBackend]:
    backend = _RecordingBackend(len(backlogs))
    sup = supervisor.Supervisor(iter(()), None, backend, backlog_limit=10_000)  # type: ignore[arg-type]
    for worker, backlog in zip(sup._workers, backlogs, strict=True):
        worker.sent = backlog
    return sup, backend


class _SkippingPlanner:
    """Every row done in an earlier run, each batch taking a while to look up."""

    def __init__(self) -> None:
        self.planned = 0

    def plan(self, rows: list[Row]) -> PlanBatch:
        time.sleep(0.002)
        self.planned += len(rows)
        return PlanBatch([], [], skipped=len(rows))


def test_a_rerun_with_nothing_to_do_gives_the_loop_its_turns() -> None:
    # Rows skipped as done fill no worker's backlog, so dealing read the whole
    # list in one go: no commit (the open transaction grew ~130 bytes a row, to
    # 1.3 GB at 10 million), no progress and no Ctrl-C until the end.
    planner = _SkippingPlanner()
    rows = (Row(i, f"http://h/{i}") for i in range(1_000_000))
    sup = supervisor.Supervisor(rows, planner, _RecordingBackend(2), backlog_limit=10_000)  # type: ignore[arg-type]
    started = time.monotonic()
    assert sup._deal() is True  # more to do: the loop comes straight back
    assert time.monotonic() - started < 1.0
    assert 0 < planner.planned < 1_000_000
    assert sup.report.skipped == planner.planned


def _rows(indices: range) -> list[Assignment]:
    return [Assignment(i, i, f"http://h/{i}") for i in indices]


def test_dealing_levels_the_backlogs() -> None:
    sup, backend = _supervisor([1000, 976, 0])
    ended = sup._workers[2]
    ended.gone = True
    batch = _rows(range(256))
    sup._send(batch)
    assert [w.backlog for w in sup._workers] == [1116, 1116, 0]
    sent = sorted(row.index for rows in backend.sent for row in rows)
    assert sent == list(range(256))  # each row once
    sup._send(_rows(range(256, 259)))
    assert [w.backlog for w in sup._workers] == [1117, 1118, 0]  # the odd row goes round-robin
    assert not backend.sent[2]
    # The supervisor knows which rows each worker holds (what a crash would cost).
    assert len(sup._workers[0].outstanding) + len(sup._workers[1].outstanding) == 259


@pytest.mark.parametrize(
    ("backlogs", "rows", "start", "shares"),
    [
        ([0, 0], 256, 0, [128, 128]),
        ([0, 0], 255, 0, [128, 127]),
        ([0, 0], 255, 1, [127, 128]),
        ([0, 500], 256, 0, [256, 0]),
        ([5, 3, 9], 10, 0, [4, 6, 0]),
        ([5, 3, 9], 17, 2, [6, 8, 3]),
        ([7], 5, 0, [5]),
        ([0, 0, 0], 0, 0, [0, 0, 0]),
    ],
)
def test_level_shares(backlogs: list[int], rows: int, start: int, shares: list[int]) -> None:
    assert supervisor.level_shares(backlogs, rows, start) == shares
    assert sum(shares) == rows


def _pipes() -> int:
    return sum(link.startswith("pipe:") for link in open_files())


def test_runs_with_worker_processes_leave_no_descriptors_for_the_collector(
    server: ProcessServer, tmp_path: Path
) -> None:
    # Each multiprocessing Process object (in a reference cycle) kept its
    # sentinel pipe open until the collector ran: with gc off, +4 a run.
    urls = [server.file_url(f"gc{i}.bin", size=100) for i in range(10)]
    gc.collect()
    gc.disable()
    try:
        before = _pipes()
        for run in range(3):
            assert swarmget.download(urls, tmp_path / f"o{run}", workers=2).ok == 10
            with swarmget.stream(urls, workers=2) as items:
                assert sum(item.ok for item in items) == 10
        after = _pipes()
    finally:
        gc.enable()
    assert after == before


def test_a_stream_outlives_the_thread_that_started_it(server: ProcessServer) -> None:
    # Linux ties the parent-death signal to the thread that forked the workers:
    # when that thread ended, they were stopped and the rows failed as crashed.
    urls = [server.file_url(f"th{i}.bin", size=100, latency=0.05) for i in range(40)]
    started: list[Stream] = []

    def start() -> None:
        stream = swarmget.stream(urls, workers=2, concurrency=4)
        stream.__enter__()
        started.append(stream)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    with started[0] as items:
        got = [(item.index, item.ok, item.error) for item in items]
    assert len(got) == 40 and all(ok for _, ok, _ in got), [g for g in got if not g[1]]


class _Failing:
    """A progress listener with a bug: its third update raises."""

    def __init__(self) -> None:
        self.updates = 0

    def start(self) -> None:
        pass

    def update(self, snapshot: object) -> None:
        self.updates += 1
        if self.updates == 3:
            raise RuntimeError("listener bug")

    def finish(self, report: object) -> None:
        pass


@pytest.mark.parametrize("workers", [1, 2])
def test_an_exception_in_the_run_still_lists_every_file_on_disk(
    tmp_path: Path, workers: int
) -> None:
    """The workers stop and report what they finished before the exception goes
    on: every file on disk has its record."""
    from swarmget.testing import TestServer

    with TestServer() as server:
        urls = [server.file_url(f"x{i}.bin", size=100, latency=0.02) for i in range(3000)]
        with pytest.raises(RuntimeError, match="listener bug"):
            swarmget.download(urls, tmp_path, workers=workers, progress=_Failing(), concurrency=32)
    files = {p.name for p in tmp_path.iterdir() if p.name != ".swarmget"}
    listed = {r["path"] for r in swarmget.read_manifest(tmp_path) if r["status"] == "ok"}
    assert files and files == listed


def test_worker_shares_add_up_to_the_limits_exactly() -> None:
    from swarmget.parallel.workers import worker_shares

    shares = worker_shares(Options(concurrency=7, per_host=3), 2)
    assert [(s.concurrency, s.per_host, s.workers) for s in shares] == [(4, 2, 1), (3, 1, 1)]


def test_rows_are_dealt_in_turn_not_in_slices() -> None:
    from swarmget.parallel.supervisor import _interleave

    rows = [Assignment(i, i, f"http://h/{i}") for i in range(10)]

    def dealt(shares: list[int]) -> list[list[int]]:
        return [[row.index for row in chunk] for chunk in _interleave(rows, shares)]

    assert dealt([5, 5]) == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    assert dealt([2, 8]) == [[0, 2], [1, 3, 4, 5, 6, 7, 8, 9]]
    assert dealt([0, 10]) == [[], list(range(10))]


@pytest.mark.parametrize("per_host", [1, 3])
def test_per_host_is_a_promise_to_the_host_whatever_the_workers(
    per_host: int, tmp_path: Path
) -> None:
    """--per-host 1 with two workers opened two connections to the host."""
    from swarmget.testing import TestServer

    with TestServer() as server:
        urls = [server.file_url(f"p{i}.bin", size=100, latency=0.05) for i in range(30)]
        report = swarmget.download(urls, tmp_path, workers=2, per_host=per_host)
        assert report.ok == 30
        assert server.stats.peak_active == per_host


def test_slow_rows_together_in_the_list_are_shared_by_the_workers(tmp_path: Path) -> None:
    """The first half slow, the second fast: dealt in slices, one worker had every
    slow row on half the connections (twice the time of one worker)."""
    from swarmget.testing import TestServer

    with TestServer() as server:
        slow = [server.file_url(f"s{i}.bin", size=100, latency=0.2) for i in range(40)]
        fast = [server.file_url(f"f{i}.bin", size=100) for i in range(40)]
        report = swarmget.download(slow + fast, tmp_path, workers=2, concurrency=4, per_host=4)
    assert report.ok == 80
    # Each worker had two connections: 20 slow rows each is 10 rounds of 0.2 s.
    # All 40 on one worker's two connections took 4 s.
    assert report.elapsed < 3.0


def test_a_run_knows_its_length_only_from_lists_and_urls() -> None:
    from swarmget.api import _known_rows

    assert _known_rows(["http://h/a", "http://h/b"], None) == 2
    assert _known_rows(None, ["http://h/a"]) == 1  # swarmget URL -o out: no fork
    assert _known_rows(["http://h/a"], ["http://h/b", "http://h/c"]) == 3
    assert _known_rows(iter(["http://h/a"]), None) is None
    assert _known_rows(None, ["urls.txt"]) is None
    assert _known_rows(None, ["-"]) is None


DEAF_MAP_CHILD = """
import json, os, signal, sys, time
import swarmget

def deaf(item):
    # Stuck where no Python signal handler runs: SIGTERM (the parent-death
    # signal, the driver's stop) stays pending while this waits.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    open(os.path.join(sys.argv[2], str(os.getpid())), "w").close()
    time.sleep(600)

with swarmget.stream(json.loads(sys.argv[1]), map=deaf, workers=2) as items:
    for item in items:
        pass
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended, whoever is to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_workers_stuck_in_c_code_end_when_their_driver_is_killed(
    server: ProcessServer, tmp_path: Path
) -> None:
    """Two workers stuck where SIGTERM could not reach their Python handler ran
    on as orphans for 10+ minutes after their driver was killed."""
    import signal
    import subprocess
    import sys
    import time

    from swarmget.testing.process import child_env

    urls = [server.file_url(f"deaf{i}.bin", size=10) for i in range(2)]
    driver = subprocess.Popen(
        [sys.executable, "-c", DEAF_MAP_CHILD, json.dumps(urls), str(tmp_path)],
        env=child_env(), start_new_session=True,
    )  # fmt: skip
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.1)
            workers = [int(p.name) for p in tmp_path.iterdir()]
        assert len(workers) == 2, "the workers never reached map"
        driver.kill()
        driver.wait()
        deadline = time.monotonic() + 60  # the grace period is 10 s
        while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_running(pid) for pid in workers), "orphaned workers ran on"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for pid in workers:
            if _running(pid):  # not a number that went to another process since
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
