"""swarmget.stream / astream: bytes into the caller's loop, in order or not, bounded."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import itertools
import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

import swarmget
from swarmget.sinks.memory import Arena
from swarmget.sources.rows import Row
from swarmget.streaming import Item
from swarmget.testing import TestServer, expected_body
from swarmget.testing.daemons import proc_stat
from swarmget.testing.nginx import ServedTree
from swarmget.testing.process import child_env


@pytest.fixture(scope="module")
def server() -> Iterator[TestServer]:
    with TestServer() as srv:
        yield srv


def _pid_of(item: Item) -> int:
    return os.getpid()


def _fails_on_odd(item: Item) -> int:
    if item.index % 2:
        if item.index == 5:
            sys.exit(f"odd row {item.index}")  # fails its item, not the worker
        if item.index == 7:
            # Raised by map itself in a worker (where Ctrl-C is the driver's,
            # and a stop is a signal): its item's failure, not the worker's end.
            raise KeyboardInterrupt(f"odd row {item.index}")
        raise ValueError(f"odd row {item.index}")
    return len(item.read())


@pytest.mark.parametrize("workers", [1, 2])
def test_ordered_items_are_the_served_bytes_with_errors_in_place(
    server: TestServer, workers: int
) -> None:
    urls = [
        server.file_url(f"o{i}.bin", size=500 + 37 * i, latency=0.01 * (i % 5)) for i in range(60)
    ]
    urls[7] = server.file_url("missing.bin", status=404)
    urls[30] = "not a url"
    with swarmget.stream(urls, ordered=True, workers=workers, retries=0) as items:
        got = list(items)
    assert [item.index for item in got] == list(range(60))
    for item in got:
        if item.index == 7:
            assert (item.ok, item.error, item.http_status) == (False, "http_404", 404)
        elif item.index == 30:
            assert (item.ok, item.error) == (False, "bad_url")
        else:
            assert item.ok and item.url == urls[item.index]
            assert item.read() == expected_body(f"o{item.index}.bin", 500 + 37 * item.index)
            assert item.data is not None and item.path is None and item.value is None


def test_unordered_items_come_as_they_finish(server: TestServer) -> None:
    slow = server.file_url("slow.bin", size=100, latency=0.5)
    fast = [server.file_url(f"fast{i}.bin", size=100) for i in range(10)]
    with swarmget.stream([slow, *fast], workers=1) as items:
        order = [item.index for item in items]
    assert sorted(order) == list(range(11))
    assert order[-1] == 0  # the slow one, first in the input, came last


@pytest.mark.parametrize(("on_error", "expected"), [("skip", 9), ("yield", 10)])
def test_on_error_skip_and_yield(server: TestServer, on_error: str, expected: int) -> None:
    urls = [server.file_url(f"e{i}.bin", size=10) for i in range(9)]
    urls.insert(4, server.file_url("e404.bin", status=404))
    with swarmget.stream(urls, on_error=on_error, retries=0, workers=1) as items:
        got = list(items)
    assert len(got) == expected
    assert all(item.ok for item in got) == (on_error == "skip")


def test_on_error_raise_raises_at_that_item(server: TestServer) -> None:
    urls = [server.file_url(f"r{i}.bin", size=10) for i in range(5)]
    urls[3] = server.file_url("r404.bin", status=404)
    seen = []
    stream = swarmget.stream(urls, on_error="raise", ordered=True, retries=0)
    with pytest.raises(swarmget.TransferError) as info, stream as items:
        for item in items:
            seen.append(item.index)
    assert info.value.code == "http_404"
    assert seen == [0, 1, 2]


def test_on_error_raise_says_which_item_failed(server: TestServer) -> None:
    # In completion order, "http_404: HTTP 404" alone did not say which URL.
    urls = [server.file_url(f"which{i}.bin", size=10) for i in range(5)]
    missing = server.file_url("which404.bin", status=404)
    urls[2] = missing.replace("http://", "http://user:secret@")
    stream = swarmget.stream(urls, on_error="raise", retries=0, workers=1)
    with pytest.raises(swarmget.TransferError) as info, stream as items:
        list(items)
    error = info.value
    shown = missing.replace("http://", "http://user:***@")
    assert (error.code, error.url, error.index) == ("http_404", shown, 2)  # type: ignore[attr-defined]
    assert str(error) == f"http_404: {error.message} (item 2: {shown})"
    assert "secret" not in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.args, str(copy)) == (type(error), error.args, str(error))
    assert (copy.url, copy.index) == (shown, 2)


def test_on_error_raise_lets_the_loop_go_on_past_a_caught_error(server: TestServer) -> None:
    # stream() closed itself on the error: the loop that caught it got a few
    # more items, then a silent end (astream went on).
    urls = [server.file_url(f"g{i}.bin", size=10) for i in range(200)]
    urls[3] = server.file_url("g404.bin", status=404)

    def collect(items: Iterator[Item]) -> tuple[list[int], list[str]]:
        seen, errors = [], []
        while True:
            try:
                seen.append(next(items).index)
            except swarmget.TransferError as exc:
                errors.append(exc.code)
            except StopIteration:
                return seen, errors

    with swarmget.stream(urls, on_error="raise", retries=0) as items:
        seen, errors = collect(items)
    assert errors == ["http_404"] and sorted(seen) == [i for i in range(200) if i != 3]

    async def collect_async() -> tuple[list[int], list[str]]:
        seen, errors = [], []
        async with swarmget.astream(urls, on_error="raise", retries=0) as items:
            while True:
                try:
                    seen.append((await items.__anext__()).index)
                except swarmget.TransferError as exc:
                    errors.append(exc.code)
                except StopAsyncIteration:
                    return seen, errors

    seen, errors = asyncio.run(collect_async())
    assert errors == ["http_404"] and sorted(seen) == [i for i in range(200) if i != 3]


def test_astreams_that_gave_up_waiting_close_at_once_and_starve_nothing(
    server: TestServer,
) -> None:
    """Each wait a timeout gave up on held a thread of asyncio's default pool until
    an item came: past six such streams, closing them (and the program's own
    to_thread and getaddrinfo) waited for the server, here 5 s."""
    urls = [server.file_url(f"gone{i}.bin", size=10, latency=5) for i in range(2)]

    async def one() -> None:
        async with swarmget.astream(urls, workers=1) as items:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(items.__anext__(), 0.2)

    async def main() -> tuple[float, float]:
        started = time.monotonic()
        streams = asyncio.gather(*(one() for _ in range(12)))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(lambda: None)  # the program's own use of the pool
        other = time.monotonic() - started
        await streams
        return other, time.monotonic() - started

    other, closed = asyncio.run(main())
    assert other < 2.0 and closed < 3.0, (other, closed)


def test_an_astream_wait_that_times_out_loses_no_item(server: TestServer) -> None:
    # The thread waiting for the next item went on after the caller's timeout,
    # took that item, and dropped it.
    urls = [server.file_url(f"w{i}.bin", size=10, latency=0.15) for i in range(10)]

    async def poll() -> tuple[list[int], int]:
        got, timeouts = [], 0
        async with swarmget.astream(urls, ordered=True, concurrency=2) as items:
            while True:
                try:
                    item = await asyncio.wait_for(items.__anext__(), 0.05)
                except TimeoutError:
                    timeouts += 1
                    continue
                except StopAsyncIteration:
                    return got, timeouts
                got.append(item.index)

    got, timeouts = asyncio.run(poll())
    assert timeouts > 0
    assert got == list(range(10))


def test_an_astream_wait_that_timed_out_is_delivered_in_the_next_event_loop(
    server: TestServer,
) -> None:
    # The pending wait was a future of the first loop: awaiting it in a second
    # asyncio.run raised "attached to a different loop", and its item was lost.
    urls = [server.file_url(f"loop{i}.bin", size=10, latency=0.3) for i in range(6)]
    items = swarmget.astream(urls, ordered=True, workers=1)

    async def give_up_waiting() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(items.__anext__(), 0.05)

    async def take_the_rest() -> list[int]:
        async with items:
            return [item.index async for item in items]

    asyncio.run(give_up_waiting())
    assert asyncio.run(take_the_rest()) == list(range(6))


def test_two_tasks_sharing_one_astream_get_each_item_once(server: TestServer) -> None:
    # The second task awaited the first one's pending wait: both got its item.
    urls = [server.file_url(f"t{i}.bin", size=10, latency=0.01) for i in range(60)]

    async def consume(items: swarmget.AsyncStream, got: list[int]) -> None:
        async for item in items:
            got.append(item.index)

    async def share() -> tuple[list[int], list[int]]:
        first: list[int] = []
        second: list[int] = []
        async with swarmget.astream(urls, concurrency=4) as items:
            await asyncio.gather(consume(items, first), consume(items, second))
        return first, second

    first, second = asyncio.run(share())
    assert sorted(first + second) == list(range(60))


def test_a_generator_that_waits_for_the_items_gets_them(server: TestServer) -> None:
    # The run took 256 rows with blocking next() calls before it began: a
    # generator fed by what the caller does with the items (a crawler's queue)
    # waited forever, and the workers' reports went unread meanwhile.
    import queue

    fed: queue.Queue[str | None] = queue.Queue()

    def crawl() -> Iterator[str]:
        yield server.file_url("seed.bin", size=10)
        while (url := fed.get(timeout=5)) is not None:
            yield url

    started = time.monotonic()
    seen = []
    with swarmget.stream(crawl(), workers=1) as items:
        for item in items:
            seen.append((item.index, item.ok, round(time.monotonic() - started)))
            fed.put(server.file_url("next.bin", size=10) if item.index == 0 else None)
    assert seen == [(0, True, 0), (1, True, 0)]


def test_a_stream_closed_early_stops_reading_the_callers_generator(server: TestServer) -> None:
    # Its input thread went on taking rows (4,096 of them, from a generator fed
    # by a queue: lost to the caller) and stayed blocked for good, the
    # generator never finalised.
    url = server.file_url("endless.bin", size=10)
    pulled = 0
    finalised = threading.Event()

    def endless() -> Iterator[str]:
        nonlocal pulled
        try:
            while True:
                pulled += 1
                yield url
        finally:
            finalised.set()

    for workers in (1, 2):
        pulled = 0
        finalised.clear()
        with swarmget.stream(endless(), prefetch=4, workers=workers) as items:
            for n, item in enumerate(items):
                assert item.ok
                if n == 4:
                    break
        assert finalised.wait(5)
        assert pulled < 600, pulled  # a batch read ahead, and the run's own intake
        time.sleep(0.1)
        assert not [t for t in threading.enumerate() if t.name == "swarmget-input"]


class _Abort(BaseException):
    pass


class _BadText(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ broke")


def _raises_odd_things(item: Item) -> int:
    if item.index == 3:
        raise _BadText
    if item.index == 4:
        raise _Abort("stop")
    return item.index


@pytest.mark.parametrize("workers", [1, 2])
def test_a_map_exception_of_any_kind_fails_only_its_item(server: TestServer, workers: int) -> None:
    # A BaseException of the caller's, or an exception whose str() raises, ended
    # the whole stream (one process) or crashed its worker (two).
    urls = [server.file_url(f"o{i}.bin", size=10) for i in range(8)]
    with swarmget.stream(urls, map=_raises_odd_things, workers=workers, ordered=True) as items:
        got = [(item.index, item.ok, item.error, item.message) for item in items]
    assert [row[:3] for row in got if not row[1]] == [
        (3, False, "map_error"),
        (4, False, "map_error"),
    ]
    assert got[3][3].startswith("_BadText: ") and got[4][3] == "_Abort: stop"
    assert [row[0] for row in got if row[1]] == [0, 1, 2, 5, 6, 7]


def _sleeps(item: Item) -> int:
    time.sleep(30)
    return 0


def test_leaving_a_one_process_stream_does_not_wait_for_a_running_map(
    server: TestServer,
) -> None:
    # With one process, map runs on the stream's thread and cannot be cut
    # short; leaving waited 15 s for it.
    urls = [server.file_url(f"z{i}.bin", size=10) for i in range(4)]
    stream = swarmget.stream(urls, map=_sleeps, workers=1)
    started = time.monotonic()
    with stream, contextlib.suppress(TimeoutError):
        stream.ready()
        time.sleep(0.3)  # map is running now
    assert time.monotonic() - started < 5


def _leaves_a_thread_or_a_child(item: Item) -> int:
    if item.index == 0:
        threading.Thread(target=time.sleep, args=(30,)).start()  # not a daemon
        return 0
    if item.index == 1:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child only sleeps
            time.sleep(30)
            os._exit(0)
        return pid
    return -1


def test_a_map_that_leaves_a_thread_or_a_child_behind_does_not_delay_the_end(
    server: TestServer,
) -> None:
    # A worker that had sent its last report still joined the thread map had
    # started (multiprocessing's exit), and a child map forked held the worker's
    # sentinel open: the driver waited its whole 1.5 s for either, every stream.
    urls = [server.file_url(f"lt{i}.bin", size=10) for i in range(4)]
    started = time.monotonic()
    with swarmget.stream(urls, map=_leaves_a_thread_or_a_child, workers=2) as items:
        values = {item.index: item.value for item in items}
    took = time.monotonic() - started
    child = values[1]
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGKILL)
    assert took < 1.2, took
    assert not multiprocessing.active_children()


def test_map_runs_in_the_worker_processes(server: TestServer) -> None:
    urls = [server.file_url(f"m{i}.bin", size=2000, latency=0.02) for i in range(80)]
    with swarmget.stream(urls, map=_pid_of, workers=2, concurrency=20) as items:
        got = list(items)
    pids = {item.value for item in got}
    assert len(got) == 80 and all(item.ok for item in got)
    assert os.getpid() not in pids and len(pids) == 2
    assert all(item.data is None and item.path is None for item in got)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_exception_in_map_fails_that_item_with_map_error(
    server: TestServer, workers: int
) -> None:
    # With workers=1 a KeyboardInterrupt raised by map itself ended the whole
    # stream; it runs on the stream's thread, where no Ctrl-C ever arrives.
    urls = [server.file_url(f"x{i}.bin", size=300) for i in range(10)]
    try:
        with swarmget.stream(urls, map=_fails_on_odd, workers=workers, ordered=True) as items:
            got = list(items)
    except KeyboardInterrupt as exc:  # a failure here, not the end of the test session
        pytest.fail(f"map's own KeyboardInterrupt ended the stream: {exc}")
    assert len(got) == 10
    for item in got:
        if item.index % 2:
            assert (item.ok, item.error) == (False, "map_error")
            kind = {5: "SystemExit", 7: "KeyboardInterrupt"}.get(item.index, "ValueError")
            assert item.message == f"{kind}: odd row {item.index}"
        else:
            assert item.ok and item.value == 300


def _unpicklable_on_threes(item: Item) -> object:
    if item.index % 3 == 0:
        return threading.Lock()  # fine in this process, cannot go through a pipe
    return len(item.read())


def test_a_map_value_that_cannot_travel_fails_only_its_item(
    server: TestServer, capfd: pytest.CaptureFixture[str]
) -> None:
    # It used to take its whole worker down: every row that worker held failed
    # as `crashed`, with a traceback on stderr.
    urls = [server.file_url(f"lock{i}.bin", size=200) for i in range(30)]
    with swarmget.stream(urls, map=_unpicklable_on_threes, workers=2, ordered=True) as items:
        got = list(items)
    assert [item.index for item in got] == list(range(30))
    for item in got:
        if item.index % 3 == 0:
            assert (item.ok, item.error) == (False, "map_error")
            assert "cannot be sent back from the worker process" in (item.message or "")
            assert "_thread.lock" in (item.message or "")
        else:
            assert item.ok and item.value == 200
    assert "Traceback" not in capfd.readouterr().err


def _refuse_to_load() -> None:
    raise RuntimeError("this value cannot be loaded here")


class _Unloadable:
    """Pickles in the worker; raises when the driver unpickles it."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_refuse_to_load, ())


def _unloadable_at_three(item: Item) -> object:
    return _Unloadable() if item.index == 3 else len(item.read())


def test_a_map_value_the_driver_cannot_load_fails_only_its_item(server: TestServer) -> None:
    # It failed the whole report it came in: the worker was ended, and about a
    # hundred rows of 2,000 were lost as `crashed`, some already mapped.
    urls = [server.file_url(f"ul{i}.bin", size=100) for i in range(60)]
    with swarmget.stream(urls, map=_unloadable_at_three, workers=2, ordered=True) as items:
        got = list(items)
    assert [item.index for item in got] == list(range(60))
    assert [item.index for item in got if not item.ok] == [3]
    assert got[3].error == "map_error"
    assert "cannot be loaded back (unpickling it failed): RuntimeError: this value" in (
        got[3].message or ""
    )
    assert all(item.value == 100 for item in got if item.ok)


@pytest.mark.parametrize("workers", [1, 2])
def test_bodies_beyond_the_budget_spill_and_their_files_go(
    server: TestServer, tmp_path: Path, workers: int
) -> None:
    size = 300_000
    urls = [server.file_url(f"big{i}.bin", size=size) for i in range(12)]
    spill = tmp_path / "spill"
    with swarmget.stream(
        urls, max_buffer_bytes=700_000, spill_dir=spill, workers=workers, ordered=True
    ) as items:
        kept: list[Item] = []
        for item in items:
            assert item.read() == expected_body(f"big{item.index}.bin", size)
            kept.append(item)
        spilled = [item for item in kept if item.path is not None]
        assert spilled and all(item.data is None for item in spilled)
        (ours,) = list(spill.iterdir())  # swarmget works in a folder of its own
        assert ours.name.startswith("swarmget-stream-")
        first = spilled[0].path
        assert first is not None and first.exists()
        spilled[0].close()  # dropping an item (or close) removes its file
        assert not first.exists()
    # The items still held keep their files past the stream's close; the folder
    # goes with the last of them.
    assert all(item.read() for item in spilled[1:])
    del kept, spilled, item
    gc.collect()
    assert list(spill.iterdir()) == []


# Bodies cut and asked for again: resumed with Range, restarted from zero when
# the server ignores Range (norange=2 says "bytes" and sends 200), chunked ones
# cut before their last chunk.  Large ones spill (the budget is small), small
# ones stay in memory: either way each row is one item, its bytes exactly once.
_CUT_AND_RETRIED = [
    {"fault": "reset", "times": 2},
    {"fault": "truncate", "times": 2},
    {"fault": "stall", "times": 1},
    {"fault": "chunk_cut", "times": 2, "chunk": 100_000},
    {"fault": "reset", "times": 2, "norange": 1},
    {"fault": "reset", "times": 2, "norange": 2},
    {"fault": "truncate", "times": 1, "norange": 2},
    {"fault": "cl_and_chunked"},
]


@pytest.mark.parametrize("workers", [1, 2])
def test_bodies_cut_and_retried_come_once_with_exactly_the_served_bytes(
    server: TestServer, tmp_path: Path, workers: int
) -> None:
    sizes = [3_000_000, 200_000]
    specs = [(size, fault) for size in sizes for fault in _CUT_AND_RETRIED]
    name = f"cut{workers}-{{}}.bin".format
    urls = [server.file_url(name(i), size=size, **fault) for i, (size, fault) in enumerate(specs)]
    spill = tmp_path / "spill"
    with swarmget.stream(
        urls, workers=workers, ordered=True, max_buffer_bytes=64 << 10, spill_dir=spill,
        timeout=2, retries=3,
    ) as items:  # fmt: skip
        seen, spilled = [], 0
        for item in items:
            assert item.ok, (specs[item.index], item.error, item.message)
            assert item.read() == expected_body(name(item.index), specs[item.index][0])
            seen.append(item.index)
            spilled += item.path is not None
            item.close()
    assert seen == list(range(len(specs)))
    assert spilled  # the resumed and restarted bodies in spill files were checked too
    assert list(spill.iterdir()) == []


@pytest.mark.parametrize("workers", [1, 2])
def test_a_spilled_item_keeps_its_file_until_it_is_dropped(
    server: TestServer, tmp_path: Path, workers: int
) -> None:
    # Closing the stream removed every spill file, those of items the caller
    # still held too: `list(swarmget.stream(...))` drops the stream at once,
    # and every spilled item's read() failed.
    size = 100_000
    urls = [server.file_url(f"keep{i}.bin", size=size) for i in range(6)]
    got = list(
        swarmget.stream(urls, max_buffer_bytes=1, spill_dir=tmp_path, workers=workers, ordered=True)
    )
    gc.collect()
    assert all(item.path is not None for item in got)
    assert [item.read() for item in got] == [expected_body(f"keep{i}.bin", size) for i in range(6)]
    first = got.pop(0).path  # dropped: its file goes, the others stay
    assert first is not None and not first.exists()
    assert all(item.read() for item in got)
    del got
    gc.collect()
    assert list(tmp_path.iterdir()) == []  # the last item takes the folder with it


def test_closing_removes_the_files_of_items_never_handed_out(
    server: TestServer, tmp_path: Path
) -> None:
    urls = [server.file_url(f"q{i}.bin", size=100_000) for i in range(40)]
    with swarmget.stream(
        urls, max_buffer_bytes=1, spill_dir=tmp_path, workers=2, prefetch=40, ordered=True
    ) as items:
        held = next(items)
        (folder,) = tmp_path.iterdir()
        deadline = time.monotonic() + 10
        while len(list(folder.iterdir())) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)  # items spill and wait ahead of the caller
    assert held.path is not None
    assert sorted(p.name for p in folder.iterdir()) == [".owner", held.path.name]
    assert held.read() == expected_body("q0.bin", 100_000)
    del held
    gc.collect()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("framing", [{"chunked": 1, "chunk": 3000}, {"close": 1}])
def test_bodies_of_unknown_length_stay_in_memory_unless_they_outgrow_their_share(
    server: TestServer, tmp_path: Path, framing: dict[str, int]
) -> None:
    # Chunked or close-delimited: no length to reserve at the start.  They used to
    # go to a spill file every time in a worker process (a file per item).
    sizes = [0, 1, 40_000, 200_000, 3_000_000]  # the last outgrows a 1 MiB slot
    urls = [server.file_url(f"u{i}.bin", size=n, **framing) for i, n in enumerate(sizes)]
    urls *= 8
    with swarmget.stream(urls, workers=2, ordered=True, spill_dir=tmp_path) as items:
        got = list(items)
        for item in got:
            size = sizes[item.index % len(sizes)]
            assert item.ok and item.read() == expected_body(f"u{item.index % 5}.bin", size)
            assert (item.path is not None) == (size == 3_000_000), item.index
    del got, item
    gc.collect()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_the_arena_frees_what_a_shrunk_slot_no_longer_needs() -> None:
    arena = Arena(1000)
    first = arena.allocate(400)
    second = arena.allocate(300)
    assert (first, second, arena.free) == (0, 400, 300)
    arena.shrink(first, 100)  # a provisional slot ends short: its tail is free
    assert arena.free == 600 and arena.allocate(300) == 100
    arena.shrink(second, 0)  # an empty body keeps one byte, and joins the space after
    assert arena.free == 599 and arena.allocate(599) == 401
    assert arena.free == 0


def test_a_body_larger_than_the_whole_budget_always_spills(server: TestServer) -> None:
    with swarmget.stream(
        [server.file_url("huge.bin", size=200_000)], max_buffer_bytes=1000
    ) as items:
        (item,) = list(items)
        assert item.data is None and item.path is not None
        assert item.read() == expected_body("huge.bin", 200_000)
    assert item.read() == expected_body("huge.bin", 200_000)  # kept past the stream's end
    assert item.path is not None
    item.path.unlink()  # removed by someone else: said so, not a bare FileNotFoundError
    with pytest.raises(ValueError, match="which is gone"):
        item.read()


def test_a_no_limit_byte_budget_runs(server: TestServer) -> None:
    # 1 << 40 (a "no limit"): the workers' shared arenas are capped by the
    # machine's memory, not mapped at a size the kernel refuses.
    urls = [server.file_url(f"nl{i}.bin", size=1000) for i in range(4)]
    with swarmget.stream(urls, max_buffer_bytes=1 << 40, workers=2, ordered=True) as items:
        assert [item.read() for item in items] == [
            expected_body(f"nl{i}.bin", 1000) for i in range(4)
        ]


def test_checksums_and_download_options_apply(server: TestServer) -> None:
    import hashlib

    body = expected_body("c.bin", 1000)
    rows = [
        Row(0, server.file_url("c.bin", size=1000), sha256=hashlib.sha256(body).hexdigest()),
        Row(1, server.file_url("c.bin", size=1000), sha256="0" * 64),
    ]
    with swarmget.stream(rows, ordered=True, workers=1) as items:
        good, bad = list(items)
    assert good.ok and good.data == body
    assert (bad.ok, bad.error) == (False, "checksum")


def test_prefetch_bounds_what_runs_ahead_of_a_slow_consumer(server: TestServer) -> None:
    urls = [server.file_url(f"p{i}.bin", size=100) for i in range(200)]
    server.reset_stats()
    with swarmget.stream(urls, prefetch=10, workers=1) as items:
        first = next(items)
        time.sleep(0.5)  # a consumer busy with the first item
        assert server.stats.requests <= 12
        rest = [first, *items]
    assert len(rest) == 200


@pytest.mark.parametrize(("workers", "prefetch"), [(1, 1), (2, 1), (1, 4), (2, 4)])
def test_a_small_prefetch_does_not_wait_a_report_interval_per_round_trip(
    server: TestServer, workers: int, prefetch: int
) -> None:
    # Worker processes send their results every REPORT_INTERVAL (0.1 s) unless
    # a batch fills; with a prefetch window of 4 the driver dealt 4 rows, then
    # heard of them 0.1 s later: 160 rows took >= 4 s whatever the network
    # (W1 without map ran at 0.17x the CLI).  Workers now report once a
    # quarter of what they hold is done, so this takes a fraction of that floor.
    # And the driver waited for room to read more rows until its own poll timed
    # out (0.1 s): the caller taking an item now wakes it.
    urls = [server.file_url(f"q{i}.bin", size=100) for i in range(160)]
    started = time.monotonic()
    with swarmget.stream(urls, prefetch=prefetch, workers=workers) as items:
        assert sum(item.ok for item in items) == 160
    floor_with_the_interval = 160 / prefetch * 0.1
    assert time.monotonic() - started < floor_with_the_interval / 2


def test_breaking_out_stops_everything_and_leaves_nothing(
    server: TestServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    urls = [server.file_url(f"b{i}.bin", size=100_000, latency=0.05) for i in range(2000)]
    spill = tmp_path / "spill"
    started = time.monotonic()
    with swarmget.stream(urls, workers=2, spill_dir=spill, max_buffer_bytes=200_000) as items:
        for i, _item in enumerate(items):
            if i == 20:
                break
        children = [p.pid for p in __import__("multiprocessing").active_children()]
        assert children
    assert time.monotonic() - started < 10
    time.sleep(0.2)
    for pid in children:
        assert not _alive(pid), pid
    del _item  # the one item still held kept its spill file (if it had one)
    gc.collect()
    assert list(spill.iterdir()) == []
    assert "Traceback" not in capfd.readouterr().err


def test_no_item_comes_out_of_a_closed_stream(server: TestServer) -> None:
    # take() popped the queue before looking at the close: 256 more items came
    # (prefetch), most of them spilled to files close() had removed.
    urls = [server.file_url(f"cl{i}.bin", size=300_000) for i in range(600)]
    stream = swarmget.stream(urls, workers=2, max_buffer_bytes=1 << 20)
    next(stream)
    time.sleep(0.5)  # items pile up ahead of the caller
    stream.close()
    assert list(stream) == []
    assert stream.ready() is None
    with pytest.raises(swarmget.UsageError, match="this stream is closed"), stream:
        pass


def test_a_stream_closed_from_another_thread_ends_the_loop(server: TestServer) -> None:
    urls = [server.file_url(f"ct{i}.bin", size=300_000) for i in range(600)]
    after_close = []
    with swarmget.stream(urls, workers=2, max_buffer_bytes=1 << 20) as items:
        for i, item in enumerate(items):
            if i == 0:
                time.sleep(0.5)
                closer = threading.Thread(target=items.close)
                closer.start()
                closer.join()
            elif not closer.is_alive():
                after_close.append(item.index)
    assert after_close == []


def test_two_threads_taking_the_first_item_start_one_run(
    server: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # _start() said "started" before the run existed: the second thread found
    # no Delivery (an AssertionError, 2 runs in 5).  Starting is made slow here
    # so that the two threads always meet in it.
    import swarmget.api

    fit = swarmget.api.fit_concurrency

    def slow_fit(options: object) -> object:
        time.sleep(0.3)
        return fit(options)  # type: ignore[arg-type]

    monkeypatch.setattr(swarmget.api, "fit_concurrency", slow_fit)
    urls = [server.file_url(f"two{i}.bin", size=100) for i in range(20)]
    got: list[int] = []
    errors: list[BaseException] = []

    def take(stream: swarmget.Stream) -> None:
        try:
            got.append(next(stream).index)
        except BaseException as exc:
            errors.append(exc)

    stream = swarmget.stream(urls, workers=1)
    threads = [threading.Thread(target=take, args=(stream,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    rest = [item.index for item in stream]
    stream.close()
    assert errors == []
    assert sorted(got + rest) == list(range(20))


def _wait_for_exit(pids: list[int], within: float = 5.0) -> list[int]:
    """The processes of ``pids`` still alive after ``within`` seconds."""
    deadline = time.monotonic() + within
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [pid for pid in pids if _alive(pid)]


def test_a_bare_for_that_breaks_stops_everything(server: TestServer) -> None:
    # No `with`: the stream is dropped when the loop is left.  Its thread used to
    # hold it, so it was never collected and the workers ran on until exit.
    urls = [server.file_url(f"bare{i}.bin", size=20_000, latency=0.05) for i in range(3000)]
    children: list[int] = []

    def take_a_few() -> None:
        for i, _ in enumerate(swarmget.stream(urls, workers=2)):
            if i == 5:
                children.extend(p.pid for p in multiprocessing.active_children())
                break

    take_a_few()
    assert children
    assert _wait_for_exit(children) == []


def test_a_cancelled_bare_async_for_stops_everything(server: TestServer) -> None:
    urls = [server.file_url(f"abare{i}.bin", size=20_000, latency=0.05) for i in range(3000)]
    children: list[int] = []

    async def consume() -> None:
        async for _ in swarmget.astream(urls, workers=2):
            if not children:
                children.extend(p.pid for p in multiprocessing.active_children())
            await asyncio.sleep(0.001)

    async def cancel_soon() -> None:
        task = asyncio.create_task(consume())
        await asyncio.sleep(0.5)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(cancel_soon())
    assert children
    assert _wait_for_exit(children) == []


def _sleepy_map(item: Item) -> int:
    """A map that runs for a minute (a big decode, a slow model), after saying so."""
    marker = Path(os.environ["SWARMGET_TEST_MARKERS"]) / f"{os.getpid()}-{item.index}"
    marker.touch()
    time.sleep(60)
    return item.index


def test_closing_does_not_wait_for_a_long_map(
    server: TestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stopped worker used to finish the map under way first: the driver killed
    # it after 10 s.  The map now gets the KeyboardInterrupt, as on Ctrl-C.
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("SWARMGET_TEST_MARKERS", str(markers))
    urls = [server.file_url(f"slow{i}.bin", size=1000) for i in range(8)]
    items = swarmget.stream(urls, map=_sleepy_map, workers=2)
    taking = threading.Thread(target=lambda: next(iter(items), None), daemon=True)
    taking.start()
    deadline = time.monotonic() + 20
    while len(list(markers.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(list(markers.iterdir())) >= 2  # both workers are inside the map
    children = [p.pid for p in multiprocessing.active_children()]
    started = time.monotonic()
    items.close()
    assert time.monotonic() - started < 3
    taking.join(5)
    for pid in children:
        assert not _alive(pid), pid


def test_workers_stop_quietly_with_transfers_queued_for_a_host(
    server: TestServer, capfd: pytest.CaptureFixture[str]
) -> None:
    # Closing a stopped worker's connections used to free their slots to the
    # transfers queued behind them: new connections were dialed on a loop being
    # closed, and each worker died with a traceback on the way out.
    urls = [server.file_url(f"q{i}.bin", size=5000, latency=0.3) for i in range(400)]
    with swarmget.stream(urls, workers=2, per_host=4) as items:
        for i, _ in enumerate(items):
            if i == 3:
                break
    time.sleep(0.3)
    assert not multiprocessing.active_children()
    assert "Traceback" not in capfd.readouterr().err


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z"  # a zombie has ended


@pytest.mark.parametrize("bad_at", [30, 700])  # in the first batch read, or later
def test_an_input_that_raises_ends_the_stream_with_its_error_and_no_workers_left(
    server: TestServer, bad_at: int
) -> None:
    def urls() -> Iterator[str]:
        for i in range(bad_at + 100):
            if i == bad_at:
                raise LookupError(f"the caller's input broke at {i}")
            yield server.file_url(f"in{i}.bin", size=500)

    got: list[int] = []
    workers: list[int] = []
    started = time.monotonic()
    with (
        pytest.raises(LookupError, match=f"broke at {bad_at}"),
        swarmget.stream(urls(), workers=2) as items,
    ):
        for item in items:
            assert item.ok
            got.append(item.index)
            workers = workers or [p.pid for p in multiprocessing.active_children()]
    assert time.monotonic() - started < 5
    # What was read before the error came out first, as from the iterable itself.
    assert sorted(got) == list(range(bad_at))
    time.sleep(0.2)
    assert not [p.pid for p in multiprocessing.active_children()]
    assert not [pid for pid in workers if _alive(pid)]


def test_download_of_an_input_that_raises_records_what_it_read(
    server: TestServer, tmp_path: Path
) -> None:
    def urls() -> Iterator[str]:
        yield from (server.file_url(f"dl{i}.bin", size=500) for i in range(300))
        raise LookupError("the caller's input broke")

    with pytest.raises(LookupError):
        swarmget.download(urls(), tmp_path, workers=2)
    assert len(swarmget.read_manifest(tmp_path)) == 300
    # The journal was let go of: the same directory takes the next run at once.
    report = swarmget.download([server.file_url("after.bin", size=10)], tmp_path, workers=2)
    assert report.ok == 1
    assert not multiprocessing.active_children()


CTRL_C_CHILD = """
import os, sys, time, swarmget
urls = [{url!r}.replace("N", str(i)) for i in range(5000)]
with swarmget.stream(urls, workers=2, spill_dir={spill!r}, max_buffer_bytes=100_000) as items:
    for i, item in enumerate(items):
        if i == 5:
            print("ready", flush=True)
        time.sleep(0.01)
"""


def _ready_child(code: str) -> subprocess.Popen[str]:
    """``python -c code`` in a session of its own (its group takes a terminal's
    Ctrl-C), once it has printed "ready"."""
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
        start_new_session=True,
    )  # fmt: skip
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    return child


def test_ctrl_c_stops_the_stream_promptly_without_orphans(
    server: TestServer, tmp_path: Path
) -> None:
    spill = tmp_path / "spill"
    url = server.file_url("cN.bin", size=60_000, latency=0.05)
    child = _ready_child(CTRL_C_CHILD.format(url=url, spill=str(spill)))
    workers = _children_of(child.pid)
    assert len(workers) == 2
    os.killpg(child.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole group
    started = time.monotonic()
    _, stderr = child.communicate(timeout=15)
    assert time.monotonic() - started < 3
    assert "KeyboardInterrupt" in stderr
    time.sleep(0.2)
    assert not [pid for pid in workers if _alive(pid)]
    assert list(spill.iterdir()) == []


BLOCKED_INPUT_CHILD = """
import json, multiprocessing, os, queue, sys, swarmget
never = queue.Queue()
def urls():
    never.get()  # a producer that has nothing yet (a crawler, a queue)
    yield "http://127.0.0.1:9/never"
try:
    with swarmget.stream(urls(), workers={workers}, spill_dir={spill!r}) as items:
        print("ready", flush=True)
        for item in items:
            pass
except KeyboardInterrupt:
    alive = [p.pid for p in multiprocessing.active_children()]
    print(json.dumps({{"workers": alive, "spill": os.listdir({spill!r})}}), flush=True)
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_stops_a_stream_whose_input_has_not_given_a_row(
    tmp_path: Path, workers: int
) -> None:
    # The run's thread read the first row itself, inside the caller's generator:
    # a Ctrl-C waited 2 s for it in close(), in vain, and the worker processes
    # ran on after the KeyboardInterrupt had reached the caller.
    spill = tmp_path / "spill"
    child = _ready_child(BLOCKED_INPUT_CHILD.format(workers=workers, spill=str(spill)))
    time.sleep(0.3)  # the run's thread is waiting for the first row
    os.killpg(child.pid, signal.SIGINT)
    started = time.monotonic()
    try:
        after = json.loads(child.stdout.readline())
        took = time.monotonic() - started
        child.communicate(timeout=15)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
    assert took < 1.0
    assert after == {"workers": [], "spill": []}
    assert child.returncode == 0


CTRL_C_ONE_PROCESS_CHILD = """
import time, swarmget
def decode(item):
    time.sleep(0.005)
    return len(item.read())
urls = [{url!r}.replace("N", str(i)) for i in range(5000)]
with swarmget.stream(urls, workers=1, map=decode) as items:
    for i, item in enumerate(items):
        if i == 5:
            print("ready", flush=True)
        time.sleep(0.01)
"""


def test_ctrl_c_stops_a_one_process_stream_whose_map_fails_its_own_interrupts(
    server: TestServer,
) -> None:
    # map's own KeyboardInterrupt fails its item with workers=1: the caller's
    # Ctrl-C, in the caller's thread, must still end the stream.
    url = server.file_url("c1N.bin", size=1000, latency=0.01)
    child = _ready_child(CTRL_C_ONE_PROCESS_CHILD.format(url=url))
    os.killpg(child.pid, signal.SIGINT)
    started = time.monotonic()
    _, stderr = child.communicate(timeout=15)
    assert time.monotonic() - started < 5
    assert child.returncode != 0 and "KeyboardInterrupt" in stderr


def _children_of(pid: int) -> list[int]:
    entries = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    return [child for child in entries if (fields := proc_stat(child)) and int(fields[1]) == pid]


def test_astream_never_blocks_the_event_loop(server: TestServer) -> None:
    urls = [server.file_url(f"a{i}.bin", size=5000, latency=0.2) for i in range(40)]

    async def main() -> tuple[list[int], list[float]]:
        ticks: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            while not stop.is_set():
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        got: list[int] = []
        async with swarmget.astream(urls, workers=1, concurrency=10) as items:
            async for item in items:
                assert item.ok
                got.append(item.index)
        stop.set()
        await task
        return got, ticks

    got, ticks = asyncio.run(main())
    assert sorted(got) == list(range(40))
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert len(ticks) > 50 and max(gaps) < 0.1, max(gaps)


def test_nginx_items_byte_for_byte(nginx_server: ServedTree) -> None:
    names = nginx_server.names[:500]
    urls = [nginx_server.url(name) for name in names]
    with swarmget.stream(urls, concurrency=50) as items:
        for item in items:
            assert item.ok
            assert item.read() == nginx_server.expected(names[item.index])


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(swarmget.UsageError, match="on_error"):
        swarmget.stream([], on_error="ignore")
    for prefetch in (0, 1.5, True, "8"):
        with pytest.raises(swarmget.UsageError, match="prefetch must be a whole number"):
            swarmget.stream([], prefetch=prefetch)  # type: ignore[arg-type]
    for budget in (-1, 1e6):
        with pytest.raises(swarmget.UsageError, match="max_buffer_bytes"):
            swarmget.stream([], max_buffer_bytes=budget)  # type: ignore[arg-type]
    # Not a map_error on every item, after the downloads: at once.
    with pytest.raises(swarmget.UsageError, match="map must be a function"):
        swarmget.stream([], map=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        swarmget.stream("http://h/a")
    with swarmget.stream([]) as items:
        assert list(items) == []


MEMORY_CHILD = """
import os, time, swarmget

def pss_kb(pid):
    try:
        with open(f"/proc/{{pid}}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0

def tree_pss():
    me = os.getpid()
    pids = [me] + [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == me]
    return sum(pss_kb(p) for p in pids)

def _ppid(pid):
    try:
        with open(f"/proc/{{pid}}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1

urls = [{url!r}.replace("N", str(i)) for i in range(300)]
peak = 0
with swarmget.stream(urls, workers=2, max_buffer_bytes=64 << 20, spill_dir={spill!r}) as items:
    start = tree_pss()
    for i, item in enumerate(items):
        assert item.ok and len(item.read()) == 4 << 20
        del item
        time.sleep(0.02)  # a slow consumer
        if i % 10 == 0:
            peak = max(peak, tree_pss())
print(start, peak)
"""


@pytest.mark.slow
def test_memory_stays_within_twice_the_budget_with_a_slow_consumer(
    server: TestServer, tmp_path: Path
) -> None:
    url = server.file_url("memN.bin", size=4 << 20)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(MEMORY_CHILD.format(url=url, spill=str(tmp_path)))],
        capture_output=True, text=True, env=child_env(), timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    start, peak = (int(x) for x in done.stdout.split())
    assert peak - start < 2 * 64 * 1024, (start, peak)


RUN_ENDED_CHILD = """
import time
import swarmget

def anon_mb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) >> 10

urls = [{url!r}.replace("N", str(i)) for i in range(300)]
with swarmget.stream(
    urls, workers=2, prefetch=400, max_buffer_bytes=256 << 20, spill_dir={spill!r}
) as items:
    start = anon_mb()
    first = next(items)
    while items.report is None:  # the caller is slow: every body is downloaded
        time.sleep(0.05)
    held = anon_mb()
    assert sum(1 for item in items if item.ok and len(item.read()) == 1 << 20) == 299
print(start, held)
"""


def test_bodies_waiting_in_the_workers_memory_are_not_copied_when_the_run_ends(
    server: TestServer, tmp_path: Path
) -> None:
    # Bodies waiting in the workers' shared memory were all copied into the
    # caller's process as soon as the workers ended, past the budget: half of
    # max_buffer_bytes in bytes was already there, and the shared memory stays
    # mapped (a 256 MB budget held 384 MB at the end of the run).  They are
    # copied as the caller takes them, as while the run goes on.
    url = server.file_url("endN.bin", size=1 << 20)
    code = textwrap.dedent(RUN_ENDED_CHILD.format(url=url, spill=str(tmp_path)))
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, env=child_env(), timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    start, held = (int(x) for x in done.stdout.split())
    # The caller's half of the budget is 128 MB (about 130 held); the copies
    # made it about 210.
    assert held - start < 170, (start, held)


BIG_BODY_CHILD = """
import hashlib, sys
import swarmget

def peak_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) >> 10

before = peak_mb()
with swarmget.stream([{url!r}], workers=1, max_buffer_bytes=1 << 30) as items:
    item = next(items)
    assert item.ok and item.data is not None, item
    print(before, peak_mb(), hashlib.sha256(item.data).hexdigest())
"""


@pytest.mark.parametrize(
    "framing", [{}, {"chunked": 1, "chunk": 1 << 20}], ids=["announced-length", "chunked"]
)
def test_a_body_held_in_memory_costs_its_size_once(
    server: TestServer, framing: dict[str, int]
) -> None:
    # With one process a body waited in a bytearray, and bytes(bytearray) made
    # the caller's copy when it ended: for a moment the body was in memory
    # twice, past max_buffer_bytes (a 200 MB body peaked at 434 MB).
    size = 160 << 20
    url = server.file_url("big.bin", size=size, **framing)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BIG_BODY_CHILD.format(url=url))],
        capture_output=True, text=True, env=child_env(), timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    before, peak, digest = done.stdout.split()
    assert digest == hashlib.sha256(expected_body("big.bin", size)).hexdigest()
    assert int(peak) - int(before) < 1.4 * (size >> 20), (before, peak)


FORK_CHILD = """
import os, sys
import swarmget
with swarmget.stream({urls!r}, workers=1, max_buffer_bytes=0, ordered=True) as items:
    first = [next(items) for _ in range(3)]  # spilled: max_buffer_bytes=0
    if os.fork() == 0:
        sys.exit(0)  # a child of the caller's program: it touches nothing, exits normally
    os.wait()
    assert os.path.isdir(items.spill_dir), "the child removed the spill dir"
    assert first[0].read() == first[0].read() and len(first[0].read()) == 20000
    rest = list(items)
    print(len(rest), sum(not item.ok for item in rest))
"""


def test_a_forked_child_leaves_the_streams_spill_files_alone(server: TestServer) -> None:
    # The child's exit hook closed its copy of the stream (removing the spill
    # dir) and its copies of the items unlinked their files: the parent's
    # items could not be read, and later ones failed with io.
    urls = [server.file_url(f"fk{i}.bin", size=20000) for i in range(40)]
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FORK_CHILD.format(urls=urls))],
        capture_output=True, text=True, env=child_env(), timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["37", "0"]


def test_an_item_closed_or_mapped_has_no_body_to_read(server: TestServer, tmp_path: Path) -> None:
    # read() after close() returned b"" (in memory, still ok=True) or raised
    # FileNotFoundError (spilled); with map it returned b"" too.
    urls = [server.file_url(f"c{i}.bin", size=1000) for i in range(4)]
    for budget in (1 << 20, 0):  # in memory; spilled
        with swarmget.stream(urls, max_buffer_bytes=budget, workers=1, spill_dir=tmp_path) as items:
            for item in items:
                assert item.read() == expected_body(f"c{item.index}.bin", 1000)
                item.close()
                assert item.path is None
                with pytest.raises(ValueError, match="no body"):
                    item.read()
    with swarmget.stream(urls, map=_pid_of, workers=1) as items:
        for item in items:
            with pytest.raises(ValueError, match="map took it"):
                item.read()
    empty = server.file_url("empty.bin", size=0)
    with swarmget.stream([empty], workers=1) as items:
        assert [item.read() for item in items] == [b""]


def _what_map_sees(item: Item) -> tuple[int, str, bool, int | None, bool]:
    return item.index, item.url, item.ok, item.http_status, bool(item)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_item_map_gets_says_what_the_callers_item_says(
    server: TestServer, workers: int
) -> None:
    # map's item had http_status None (the caller's said 200), and an item
    # with an empty body was falsy.
    urls = [server.file_url(f"seen{i}.bin", size=100 * (i % 2)) for i in range(6)]
    with swarmget.stream(urls, map=_what_map_sees, workers=workers) as items:
        got = [(item.value, (item.index, item.url, item.ok, item.http_status)) for item in items]
    assert len(got) == 6
    for seen, caller in got:
        assert seen == (*caller, True)
        assert caller[3] == 200


def test_every_item_is_true_whatever_its_length(server: TestServer) -> None:
    # __len__ without __bool__: `if item:` skipped an ok item with an empty
    # body, or with map's value (no body here).
    urls = [server.file_url("nothing.bin", size=0)]
    with swarmget.stream(urls, workers=1) as items:
        (empty,) = items
    with swarmget.stream(urls, map=len, workers=1) as items:
        (mapped,) = items
    assert empty.ok and len(empty) == 0 and bool(empty) is True
    assert mapped.ok and mapped.value == 0 and bool(mapped) is True


def test_bad_workers_and_spill_dirs_are_usage_errors_and_nothing_is_left(
    server: TestServer, tmp_path: Path
) -> None:
    for workers in (2.5, "2", True):
        with pytest.raises(swarmget.UsageError, match="workers"):
            swarmget.stream([], workers=workers)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with (
        pytest.raises(swarmget.UsageError, match="spill_dir"),
        swarmget.stream([server.file_url("sd.bin", size=10)], spill_dir=a_file),
    ):
        pass
    new = tmp_path / "new"
    with swarmget.stream([server.file_url("sd.bin", size=10)], spill_dir=new) as items:
        assert [item.ok for item in items] == [True]
    assert new.is_dir() and list(new.iterdir()) == []  # the caller's folder; ours is gone


_ASTREAM_CHILD = """
import asyncio, json, os, sys
import swarmget

def pid(item):
    return os.getpid()

async def main():
    runs = []
    for _ in range(3):  # back to back: the last one's threads must be gone
        async with swarmget.astream(json.loads(sys.argv[1]), map=pid, concurrency=8) as items:
            runs.append([item.value async for item in items])
    return runs

print(json.dumps({"me": os.getpid(), "runs": asyncio.run(main())}))
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: one process by default")
def test_astream_uses_worker_processes_by_default(tmp_path: Path) -> None:
    # It started the stream from a helper thread, so the program always had two
    # threads and never forked: map ran in the caller's process, on its GIL.
    from swarmget.testing import serve_in_subprocess

    with serve_in_subprocess() as srv:
        urls = [srv.file_url(f"p{i}.bin", size=1000, latency=0.02) for i in range(40)]
        env = child_env()
        env.pop("SWARMGET_WORKERS", None)  # the default: one per CPU
        done = subprocess.run(
            [sys.executable, "-c", _ASTREAM_CHILD, json.dumps(urls)],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    for run in result["runs"]:
        # The second and third fell back to one process at times: the thread
        # that closed the one before was still alive when `async with` ended.
        pids = set(run)
        assert len(run) == 40
        assert result["me"] not in pids and len(pids) >= 2


def test_an_astream_waits_on_one_thread_not_one_per_wait(server: TestServer) -> None:
    # A thread per wait: Thread.start() on the loop's thread waits for the new
    # thread to get the GIL, and with map in this process it stalled the loop.
    urls = [server.file_url(f"w{i}.bin", size=100, latency=0.01) for i in range(30)]
    seen: set[threading.Thread] = set()

    async def main() -> int:
        async with swarmget.astream(urls, workers=1, concurrency=2) as items:
            count = 0
            async for _ in items:
                count += 1
                seen.update(t for t in threading.enumerate() if t.name == "swarmget-astream")
        return count

    assert asyncio.run(main()) == 30
    assert len(seen) == 1
    assert not any(t.is_alive() for t in seen)


def _long_c_call(item: Item) -> int:
    # ~10 s inside OpenSSL with the GIL released: no Python signal handler runs.
    return len(hashlib.pbkdf2_hmac("sha256", item.read(), b"salt", 30_000_000))


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs worker processes")
def test_close_ends_workers_stuck_in_a_long_c_call_within_seconds(server: TestServer) -> None:
    # Told to stop, a worker inside C code never ran its handler: close()
    # returned after 2 s with both still busy, and they were killed 8 s later.
    urls = [server.file_url(f"kdf{i}.bin", size=10) for i in range(2)]
    items = swarmget.stream(urls, map=_long_c_call, workers=2, concurrency=2)
    items.__enter__()
    time.sleep(1.0)  # both workers are in map by now
    started = time.monotonic()
    items.close()
    assert time.monotonic() - started < 4
    assert multiprocessing.active_children() == []


def test_an_astream_dropped_with_a_wait_under_way_ends_its_threads_and_workers(
    server: TestServer,
) -> None:
    # The waiting thread held the stream (in next()) until an item came, so
    # the stream was never collected: threads, workers and downloads went on.
    urls = [server.file_url(f"stall{i}.bin", size=10, latency=30) for i in range(4)]
    before = set(threading.enumerate())  # other tests' threads may still be ending

    def ours() -> list[str]:
        names = [t.name for t in set(threading.enumerate()) - before]
        return [n for n in names if n.startswith(("swarmget-stream", "swarmget-astream"))]

    async def main() -> None:
        items = swarmget.astream(urls, workers=2, timeout=60)
        await items.__aenter__()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(items.__anext__(), 0.5)

    asyncio.run(main())
    gc.collect()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (multiprocessing.active_children() or ours()):
        time.sleep(0.05)
    assert multiprocessing.active_children() == []
    stacks = {t.name: sys._current_frames().get(t.ident or 0) for t in threading.enumerate()}
    assert ours() == [], [
        "".join(traceback.format_stack(frame))
        for name, frame in stacks.items()
        if name in ours() and frame is not None
    ]


def test_a_stop_that_came_between_two_map_calls_stops_the_next(tmp_path: Path) -> None:
    """The stop signal only interrupts a map call that is running; one that came
    between two set a flag, and the next call ran to its end (seconds after
    close() was asked for)."""
    from swarmget.report import FileResult
    from swarmget.sinks.memory import BYTES, MemorySink
    from swarmget.streaming.items import body_item

    called: list[int] = []
    sink = MemorySink(str(tmp_path), map_fn=lambda item: called.append(1), make_item=body_item)
    result = FileResult("http://h/a", None, "ok", 200, 3, index=0, payload=(BYTES, b"abc"))
    sink.stop_requested = True  # as worker.py's handler sets it, with mapping False
    with pytest.raises(KeyboardInterrupt):
        sink.run_map(result)
    assert called == [] and not sink.mapping


def _dies_on_seven(item: Item) -> int:
    if item.index == 7:
        os._exit(3)  # a map that segfaults, or calls into a library that aborts
    return item.index


@pytest.mark.parametrize("rows", [40, 400])
def test_a_row_that_kills_every_worker_it_reaches_fails_alone(
    server: TestServer, rows: int
) -> None:
    """A dead worker's rows are dealt again: the row that killed it kills a
    second worker, and is then dealt alone, as a suspect, to a third, whose
    death names it: it fails with ``crashed``, and every other row comes.
    (Every row the second worker held failed with it: 112 of 1,000.)"""
    urls = [server.file_url(f"k{i}.bin", size=100) for i in range(rows)]
    with swarmget.stream(
        urls, map=_dies_on_seven, workers=2, ordered=True, on_error="yield", concurrency=8
    ) as items:
        got = {item.index: (item.ok, item.error) for item in items}
    assert sorted(got) == list(range(rows))
    assert [i for i, (ok, _) in got.items() if not ok] == [7]
    assert got[7] == (False, "crashed")


def _killed_twice(item: Item) -> int:
    # Once both workers have mapped an item, one of them is killed outright, as
    # the OOM killer would; then the worker started in its place (holding the
    # first one's rows, dealt again) is killed too.  No row is to blame.
    marks = os.environ["SWARMGET_TEST_MARKS"]
    seen = os.path.join(marks, f"seen{os.getpid()}")
    new = not os.path.exists(seen)
    replacement = new and os.path.exists(os.path.join(marks, "kill1"))
    open(seen, "w").close()
    both = len([name for name in os.listdir(marks) if name.startswith("seen")]) >= 2
    name = "kill2" if replacement else "kill1" if both else ""
    if name:
        try:
            os.close(os.open(os.path.join(marks, name), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return item.index
        os.kill(os.getpid(), signal.SIGKILL)
    return item.index


def test_workers_killed_twice_with_no_row_to_blame_lose_no_row(
    server: TestServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rows in a second death failed as crashed (a worker killed twice by the
    # OOM killer cost every row the second one held); then, held apart one
    # per worker, they were retried one at a time (100 s for 400 rows).  As a
    # group, halved only by further deaths, they go on at full concurrency.
    monkeypatch.setenv("SWARMGET_TEST_MARKS", str(tmp_path))
    urls = [server.file_url(f"o{i}.bin", size=100, latency=0.05) for i in range(200)]
    with swarmget.stream(urls, map=_killed_twice, workers=2, concurrency=32) as items:
        got = {item.index: (item.ok, item.error) for item in items}
    assert sorted(got) == list(range(200))
    assert [i for i, (ok, _) in got.items() if not ok] == []
    assert (tmp_path / "kill2").exists()


def test_sources_are_read_as_download_reads_them(server: TestServer, tmp_path: Path) -> None:
    listing = tmp_path / "list.csv"
    listing.write_text(
        "url\n" + "".join(server.file_url(f"src{i}.bin", size=50) + "\n" for i in range(3))
    )
    extra = server.file_url("after.bin", size=60)
    with swarmget.stream([extra], sources=[str(listing)], ordered=True) as items:
        got = [(item.index, item.read()) for item in items]
    expected = [(i, expected_body(f"src{i}.bin", 50)) for i in range(3)]
    assert got == [*expected, (3, expected_body("after.bin", 60))]
    with swarmget.stream(sources=[str(listing)]) as items:
        assert sorted(item.index for item in items) == [0, 1, 2]


def test_stream_arguments_are_the_streams_own_keywords() -> None:
    # URLDataset tells download options from stream arguments by this set.
    import inspect

    from swarmget.streaming.core import STREAM_ARGUMENTS, Stream

    own = set(inspect.signature(Stream.__init__).parameters) - {"self", "urls", "map", "options"}
    assert own == STREAM_ARGUMENTS


KILLED_CHILD = """
import sys, swarmget
urls = [{url!r}] * 8
stream = swarmget.stream(urls, workers=1, spill_dir={spill!r}, max_buffer_bytes=1)
for item in stream:
    assert item.path is not None  # spilled: no memory budget
    print("ready", flush=True)
    sys.stdin.read()  # until killed
"""


def test_a_stream_killed_outright_has_its_spill_folder_swept_by_the_next(
    server: TestServer, tmp_path: Path
) -> None:
    # SIGKILL (the OOM killer) runs no close and no exit hook: the spilled
    # bodies stayed in /tmp for good.  The next stream removes the folder of a
    # stream that died, and no other: a live stream's, or a folder not ours.
    spill = tmp_path / "spill"
    url = server.file_url("killed.bin", size=50_000)
    script = KILLED_CHILD.format(url=url, spill=str(spill))

    def start() -> subprocess.Popen[str]:
        child = subprocess.Popen(
            [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=child_env(),
        )  # fmt: skip
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        return child

    dead, alive = start(), start()
    folders = sorted(spill.iterdir())
    assert len(folders) == 2 and all(any(f.iterdir()) for f in folders)
    dead.kill()
    dead.communicate()
    foreign = spill / "swarmget-stream-foreign"  # no owner file: never ours to judge
    foreign.mkdir()
    for folder in [*folders, foreign]:
        old = time.time() - 3600  # not one in the making
        os.utime(folder, (old, old))
    try:
        with swarmget.stream([url], spill_dir=spill, workers=1) as items:
            assert [item.ok for item in items] == [True]
            left = set(spill.iterdir())
        assert foreign in left and len(left & set(folders)) == 1
        (kept,) = left & set(folders)
        assert any(kept.iterdir())  # the live stream's bodies are untouched
    finally:
        alive.kill()
        alive.communicate()


EXIT_OPEN_CHILD = """
import atexit, sys, time
import swarmget
# A hook of the program's own, registered before the first item: it runs
# between weakref.finalize's exit hook (set up by the first item) and
# swarmget's, while the stream goes on delivering (it may take any time).
atexit.register(time.sleep, 0.5)
urls = {urls!r}
items = swarmget.stream(urls, spill_dir={spill!r}, max_buffer_bytes=0, workers=2)
held = next(items)
print(held.ok, flush=True)
sys.exit(0)  # the stream left open, an item held
"""


def test_a_stream_left_open_at_exit_leaves_no_spill_files(
    server: TestServer, tmp_path: Path
) -> None:
    # weakref.finalize's exit hook ran first and set finalisers off for good:
    # items delivered after it kept their files, and swarmget's own hook left
    # those, and the folder, in /tmp.
    spill = tmp_path / "spill"
    urls = [server.file_url(f"exit{i}.bin", size=20_000) for i in range(200)]
    done = subprocess.run(
        [sys.executable, "-c", EXIT_OPEN_CHILD.format(urls=urls, spill=str(spill))],
        capture_output=True, text=True, env=child_env(), timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]
    assert list(spill.iterdir()) == []


EXIT_PENDING_ASTREAM_CHILD = """
import asyncio, swarmget
async def main():
    items = swarmget.astream({urls!r}, spill_dir={spill!r}, workers={workers})
    await items.__aenter__()
    try:
        await asyncio.wait_for(items.__anext__(), 0.2)
    except asyncio.TimeoutError:
        print("waiting", flush=True)
asyncio.run(main())  # the astream dropped unclosed, a wait under way; then the exit
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_an_astream_dropped_with_a_wait_under_way_at_exit_leaves_no_spill_folder(
    server: TestServer, tmp_path: Path, workers: int
) -> None:
    # The dropped astream is closed on a thread of its own, which the stream
    # left the exit hook's list at once: the interpreter ended that thread
    # before it reached the spill folder, and the hook did not know of it.
    spill = tmp_path / "spill"
    urls = [server.file_url(f"ap{i}.bin", size=1000, latency=5) for i in range(20)]
    code = EXIT_PENDING_ASTREAM_CHILD.format(urls=urls, spill=str(spill), workers=workers)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, env=child_env(), timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["waiting"]
    assert list(spill.iterdir()) == []


def test_a_finished_stream_left_unclosed_keeps_no_spill_folder(
    server: TestServer, tmp_path: Path
) -> None:
    # Iterated to its end and kept (`items = stream(...)`, no `with`): its empty
    # spill folder stayed until the stream was dropped, or the program ended.
    spill = tmp_path / "spill"
    urls = [server.file_url(f"fin{i}.bin", size=1000) for i in range(10)]
    items = swarmget.stream(urls, spill_dir=spill, max_buffer_bytes=0, workers=1)
    held = list(items)
    assert [len(item.read()) for item in held] == [1000] * 10
    assert items.ready() is None
    del held
    gc.collect()
    assert list(spill.iterdir()) == []
    assert items.report is not None and items.report.ok == 10


def test_bodies_waiting_in_a_killed_workers_memory_are_not_overwritten_by_its_replacement(
    server: TestServer,
) -> None:
    # The worker that takes a dead one's place shares its memory (the arena
    # made before the first fork) and begins with all of it free: the bodies
    # the dead worker had left there, waiting for room in the byte budget,
    # came out with the replacement's bytes in them (the right length, the
    # wrong content), and releasing them freed the replacement's own slots.
    files = [(f"waiting{i}.bin", 20_000) for i in range(300)]
    urls = [server.file_url(name, size=size) for name, size in files]
    expected = {
        url: expected_body(name, size) for url, (name, size) in zip(urls, files, strict=True)
    }
    with swarmget.stream(urls, workers=2, max_buffer_bytes=1 << 20, prefetch=64) as items:
        got = [next(items)]
        time.sleep(0.8)  # the budget is full: the next bodies wait in the workers' memory
        for worker in multiprocessing.active_children():
            os.kill(worker.pid, signal.SIGKILL)  # (whichever holds them)
        for item in items:
            got.append(item)
            time.sleep(0.01)  # a slow consumer: new bodies come in while old ones wait
    assert sorted(item.url for item in got) == sorted(urls)
    wrong = [item.url for item in got if not item.ok or item.read() != expected[item.url]]
    assert wrong == []
