"""How the engine paces its work within loop turns (white-box: it steps the loop)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import swarmget
from swarmget.engine.core import Engine
from swarmget.engine.scheduler import CONNECT_SLICE
from swarmget.options import Options
from swarmget.sinks.base import Assignment
from swarmget.sinks.files import FileSink
from swarmget.testing import TestServer
from swarmget.testing.events import RecordedEvents


def test_new_connections_start_in_slices_per_loop_turn(out_dir: Path) -> None:
    # A listener that never accepts: the kernel completes the handshakes into
    # its backlog, so every connect succeeds and no response ever comes.
    count = 3 * CONNECT_SLICE + 5
    with socket.create_server(("127.0.0.1", 0), backlog=count + 10) as listener:
        port = listener.getsockname()[1]
        rows = [Assignment(i, i, f"http://127.0.0.1:{port}/f{i}", f"f{i}") for i in range(count)]
        options = Options(concurrency=count, per_host=count, timeout=5)
        engine = Engine(FileSink(out_dir), options, RecordedEvents())
        loop = engine.loop
        seen: list[int] = []
        try:
            engine.add(rows)
            for _ in range(20):
                if not seen or seen[-1] != len(engine.connections):
                    seen.append(len(engine.connections))
                if len(engine.connections) == count:
                    break
                loop.run_once(max_wait=0.05)
            # Each turn adds at most one slice, and between slices the loop ran:
            # the first connections' requests went out before the last connects.
            growth = [b - a for a, b in zip([0, *seen], seen, strict=False)]
            assert seen[-1] == count, seen
            assert max(growth) == CONNECT_SLICE, seen
            assert len([g for g in growth if g]) >= 4, seen
            sent = [conn for conn in engine.connections if conn.served == 0 and conn.parser]
            assert sent, "no connection had sent its request"
        finally:
            engine.close()


def test_a_stopped_engine_starts_nothing_for_its_queued_transfers(out_dir: Path) -> None:
    # Closing a connection frees its slot, and the scheduler gives freed slots to
    # the transfers queued for the host.  After abort() that dialed new
    # connections from close(), on a loop about to close: the stopped worker died
    # with a traceback.
    with socket.create_server(("127.0.0.1", 0), backlog=64) as listener:
        port = listener.getsockname()[1]
        rows = [Assignment(i, i, f"http://127.0.0.1:{port}/f{i}", f"f{i}") for i in range(20)]
        options = Options(concurrency=20, per_host=2, timeout=5)
        engine = Engine(FileSink(out_dir), options, RecordedEvents())
        try:
            engine.add(rows)
            for _ in range(20):
                if len(engine.connections) == 2:
                    break
                engine.loop.run_once(max_wait=0.05)
            assert len(engine.connections) == 2  # and 18 transfers queued behind them
            engine.abort()
            assert not engine.connections and not engine.dialing
        finally:
            engine.close()
        assert not engine.connections and not engine.dialing


def test_rows_of_a_fast_host_do_not_wait_behind_a_slow_hosts_queue(out_dir: Path) -> None:
    # Every other row is on a host that answers after 30 s, on 2 connections:
    # its queue filled the intake window (256 rows) and the fast host's rows
    # behind them waited for it, about a row a second.  Rows waiting for their
    # own busy host now stretch the window (and the driver's backlog).
    fast_seen: list[float] = []
    with TestServer() as slow, TestServer() as fast:
        urls = []
        for i in range(600):
            urls.append(slow.file_url(f"s{i}.bin", size=10, latency=30))
            urls.append(fast.file_url(f"f{i}.bin", size=10))
        result: list[swarmget.Report] = []
        run = threading.Thread(
            target=lambda: result.append(
                swarmget.download(urls, out_dir, per_host=2, concurrency=16, deadline=4, workers=1)
            )
        )
        started = time.monotonic()
        run.start()
        while len(fast.requests) < 600 and time.monotonic() - started < 3.5:
            time.sleep(0.05)
        fast_seen.append(len(fast.requests))
        run.join(30)
    assert fast_seen == [600], "the fast host's rows waited behind the slow host's"
    (report,) = result
    assert report.ok == 600
    assert report.error_counts() == {"timeout": 600}
