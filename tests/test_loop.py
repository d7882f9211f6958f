"""The event loop, driven with socketpairs and a fake clock."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from swarmget.loop import EVENT_READ, EVENT_WRITE, EventLoop


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


class Recorder:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.events: list[int] = []
        self.data = bytearray()

    def handle_io(self, mask: int) -> None:
        self.events.append(mask)
        if mask & EVENT_READ:
            self.data += self.sock.recv(100)


def test_readable_handler_gets_data(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    loop = EventLoop()
    rec = Recorder(a)
    loop.add(a.fileno(), EVENT_READ, rec)
    loop.run_once(0)
    assert rec.events == []
    b.send(b"ping")
    loop.run_once(1.0)
    assert rec.events == [EVENT_READ]
    assert bytes(rec.data) == b"ping"
    loop.remove(a.fileno())
    loop.close()


def test_modify_to_writable(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _ = pair
    loop = EventLoop()
    rec = Recorder(a)
    loop.add(a.fileno(), EVENT_READ, rec)
    loop.modify(a.fileno(), EVENT_WRITE, rec)
    loop.run_once(1.0)
    assert rec.events == [EVENT_WRITE]
    loop.remove(a.fileno())
    loop.close()


def test_timers_fire_in_order_and_cancel() -> None:
    clock = FakeClock()
    loop = EventLoop(clock=clock)
    fired: list[str] = []
    loop.call_later(2.0, fired.append, "b")
    loop.call_later(1.0, fired.append, "a")
    cancelled = loop.call_later(1.5, fired.append, "never")
    cancelled.cancel()
    loop.run_once(0)
    assert fired == []
    clock.t += 1.6
    loop.run_once(0)
    assert fired == ["a"]
    clock.t += 1.0
    loop.run_once(0)
    assert fired == ["a", "b"]
    loop.close()


def test_select_sleeps_no_longer_than_the_next_timer() -> None:
    loop = EventLoop()
    fired: list[float] = []
    start = loop.time()
    loop.call_later(0.05, lambda: fired.append(loop.time()))
    loop.run_until(lambda: bool(fired))
    assert 0.04 <= fired[0] - start < 0.5
    loop.close()


def test_call_soon_runs_next_turn_without_sleeping() -> None:
    loop = EventLoop()
    order: list[int] = []
    loop.call_soon(order.append, 1)
    loop.call_soon(order.append, 2)
    start = loop.time()
    loop.run_once(5.0)
    assert order == [1, 2]
    assert loop.time() - start < 1.0
    loop.close()


def test_call_soon_threadsafe_wakes_a_sleeping_loop() -> None:
    loop = EventLoop()
    got: list[str] = []
    timer = threading.Timer(0.05, loop.call_soon_threadsafe, args=(got.append, "hi"))
    timer.start()
    start = loop.time()
    loop.run_until(lambda: bool(got))
    timer.join()
    assert got == ["hi"]
    assert loop.time() - start < 1.0
    loop.close()


def test_now_is_cached_per_turn() -> None:
    clock = FakeClock()
    loop = EventLoop(clock=clock)
    clock.t += 5
    assert loop.now == 1000.0
    loop.run_once(0)
    assert loop.now == 1005.0
    loop.close()
