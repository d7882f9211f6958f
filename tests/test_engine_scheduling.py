"""How the engine paces its work within loop turns (white-box: it steps the loop)."""

from __future__ import annotations

import socket
from pathlib import Path

from swarmget.engine.core import Engine
from swarmget.engine.scheduler import CONNECT_SLICE
from swarmget.options import Options
from swarmget.sinks.base import Assignment
from swarmget.sinks.files import FileSink
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
