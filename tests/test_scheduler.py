"""The scheduler's rules, with no sockets and no clock: actions in, actions out."""

from __future__ import annotations

import contextlib
import socket

from swarmget.engine.classify import HandshakeLost
from swarmget.engine.connection import HTTPConnection, peer_closed
from swarmget.engine.job import Job, Transfer
from swarmget.engine.owner import ConnectionOwner
from swarmget.engine.pool import DIRECT, HostPool, PooledConnection
from swarmget.engine.scheduler import (
    CONNECT_SLICE,
    MIN_RESOLVING,
    Action,
    Close,
    Defer,
    Dial,
    Fail,
    Resolve,
    Scheduler,
    Start,
    WakeAt,
)
from swarmget.engine.urls import split_url
from swarmget.errors import ErrorCode, TransferError
from swarmget.loop import EventLoop
from swarmget.options import Options
from swarmget.protocol import ConnectionClosed
from swarmget.protocol.request import RequestTemplate
from swarmget.sinks.base import Assignment

ADDRESSES = [(2, ("127.0.0.1", 80))]


def pool(host: str = "a.test", resolved: bool = True) -> HostPool:
    p = HostPool(("http", host, 80), RequestTemplate(host, {}), DIRECT)
    if resolved:
        p.addresses = list(ADDRESSES)
        p.refresh_at = 1e9
    return p


def transfer(i: int = 0, host: str = "a.test") -> Transfer:
    url = f"http://{host}/f{i}"
    return Transfer(Job(Assignment(i, i, url, f"f{i}"), split_url(url)))


def kinds(actions: list[Action]) -> list[str]:
    return [type(action).__name__ for action in actions]


def dial_all(scheduler: Scheduler, p: HostPool, count: int, now: float = 1.0) -> list[Action]:
    actions: list[Action] = []
    for i in range(count):
        actions += scheduler.submit(p, transfer(i, p.host), now)
    return actions


def test_per_host_limit_queues_the_rest() -> None:
    scheduler = Scheduler(concurrency=10, per_host=2)
    p = pool()
    actions = dial_all(scheduler, p, 5)
    assert kinds(actions) == ["Dial", "Dial"]
    assert len(p.queue) == 3 and p.open == 2 and scheduler.open == 2


def test_a_finished_connection_takes_the_next_queued_transfer_at_once() -> None:
    scheduler = Scheduler(concurrency=10, per_host=1)
    p = pool()
    dial_all(scheduler, p, 2)
    conn = PooledConnection(p)
    (action,) = scheduler.released(conn, reusable=True, now=2.0)
    assert isinstance(action, Start) and action.conn is conn
    assert action.transfer.job.row.index == 1 and not p.queue


REFUSED = TransferError("http_429", "HTTP 429 Too Many Requests")


def test_a_host_that_pushed_back_gets_nothing_new_until_its_wait_is_over() -> None:
    scheduler = Scheduler(concurrency=10, per_host=3)
    p = pool()
    dial_all(scheduler, p, 6)  # three out, three queued
    (wake,) = scheduler.pushed_back(p, until=11.0, now=1.5, error=REFUSED)
    assert isinstance(wake, WakeAt) and (wake.pool, wake.until) == (p, 11.0)
    # Connections that finish park instead of taking the next row...
    conns = [PooledConnection(p) for _ in range(3)]
    for conn in conns:
        assert scheduler.released(conn, reusable=True, now=2.0) == []
    assert len(p.queue) == 3 and p.idle == conns
    # ... and a new row (or a retry) queues.
    assert scheduler.submit(p, transfer(9), now=3.0) == []
    # A shorter pause does not cut the running one short; a longer one replaces
    # it; neither is another pause in a row (requests already under way).
    assert scheduler.pushed_back(p, until=5.0, now=3.0, error=REFUSED) == []
    assert kinds(scheduler.pushed_back(p, until=12.0, now=3.0, error=REFUSED)) == ["WakeAt"]
    assert p.push_backs == 1
    assert scheduler.wake(p, until=11.0, now=11.0) == []  # the replaced wake-up
    # Over: one request goes out, the rest wait for its answer.
    assert kinds(scheduler.wake(p, until=12.0, now=12.0)) == ["Start"]
    assert p.probing and len(p.queue) == 3
    assert scheduler.submit(p, transfer(10), now=12.1) == []
    # Answered (anything but 429): the queue goes on, as far as the host is
    # allowed now (three were under way when it pushed back: half of that,
    # reached from one request; see the tests of the AIMD below).
    assert kinds(scheduler.head_came(p, status=200, started=12.0, now=12.2)) == ["Start"]
    assert not p.probing and p.push_backs == 0 and len(p.queue) == 3


def test_the_rows_parked_on_paused_hosts_are_counted_as_they_come_and_go() -> None:
    # parked() is asked once per finished row; it keeps a count rather than
    # summing every paused host's queue, and the count must stay that sum.
    import random

    rng = random.Random(7)
    scheduler = Scheduler(concurrency=8, per_host=2, host_failures=3)
    pools = [pool(f"h{i}.test") for i in range(6)]
    now, serial, seen_parked = 1.0, 0, 0

    def expected() -> int:
        return sum(len(p.queue) for p in scheduler.paused)

    for _ in range(600):
        now += 0.25
        p = rng.choice(pools)
        step = rng.randrange(6)
        if step <= 1:
            serial += 1
            scheduler.submit(p, transfer(serial, p.host), now, front=step == 1)
        elif step == 2:
            scheduler.pushed_back(p, until=now + rng.choice([0.5, 2.0]), now=now, error=REFUSED)
        elif step == 3 and p.paused_until:
            scheduler.wake(p, until=p.paused_until, now=max(now, p.paused_until))
        elif step == 4:
            scheduler.released(PooledConnection(p), reusable=True, now=now)
        elif rng.random() < 0.1:
            scheduler.give_up(p, REFUSED, "given up in the walk")
        assert scheduler.parked() == expected()
        seen_parked += scheduler.parked() > 0
    assert seen_parked > 30  # the walk did park rows, often


def test_a_pause_that_is_over_probes_even_before_its_wake_up_comes() -> None:
    # The refused row's retry timer, set first, fires before the host's WakeAt at
    # the same moment: it goes out alone, not with the whole queue behind it.
    scheduler = Scheduler(concurrency=10, per_host=4)
    p = pool()
    dial_all(scheduler, p, 1)
    scheduler.pushed_back(p, until=5.0, now=1.0, error=REFUSED)
    scheduler.released(PooledConnection(p), reusable=True, now=1.1)
    for i in range(3):
        assert scheduler.submit(p, transfer(i + 1), now=2.0) == []
    assert kinds(scheduler.submit(p, transfer(0), now=5.0, front=True)) == ["Start"]
    assert scheduler.wake(p, until=5.0, now=5.0) == []
    assert p.probing and len(p.queue) == 3


def test_a_refusal_of_a_request_sent_before_the_pause_is_old_news() -> None:
    scheduler = Scheduler(concurrency=10, per_host=4, host_failures=2)
    p = pool()
    dial_all(scheduler, p, 4)  # a burst, all sent at 1.0
    assert kinds(scheduler.pushed_back(p, until=2.0, now=1.5, error=REFUSED, started=1.0)) == [
        "WakeAt"
    ]
    scheduler.wake(p, until=2.0, now=2.0)
    # The rest of the burst, refused later still: neither a pause nor a count.
    for now in (2.1, 2.7, 3.3):
        assert scheduler.pushed_back(p, until=now + 1, now=now, error=REFUSED, started=1.0) == []
    assert p.given_up is None and p.push_backs == 1 and p.paused_until == 0.0


def test_the_probe_goes_out_past_requests_still_under_way_and_again_if_lost() -> None:
    scheduler = Scheduler(concurrency=10, per_host=4)
    p = pool()
    dial_all(scheduler, p, 2, now=1.0)  # two under way (one a long download)
    scheduler.pushed_back(p, until=3.0, now=1.5, error=REFUSED, started=1.0)
    for i in range(3):
        scheduler.submit(p, transfer(10 + i), now=2.0)
    assert kinds(scheduler.wake(p, until=3.0, now=3.0)) == ["Dial"]  # one, not held back
    assert p.probe_out and len(p.queue) == 2
    assert scheduler.submit(p, transfer(20), now=3.1) == []
    # The probe ended unanswered (a timeout, a reset): another goes.
    assert kinds(scheduler.request_lost(p, now=4.0)) == ["Dial"]
    assert kinds(scheduler.host_answered(p, now=4.5, status=200)) == []  # per_host is full
    assert not p.probing and not p.probe_out


def answer(scheduler: Scheduler, p: HostPool, sent: float, now: float) -> list[Action]:
    """A 200's head, then the end of its transfer, and its connection free."""
    actions = scheduler.head_came(p, status=200, started=sent, now=now)
    actions += scheduler.host_answered(p, now=now, status=200)
    return actions + scheduler.released(PooledConnection(p), reusable=True, now=now)


def test_a_host_that_pushed_back_is_allowed_half_as_many_requests() -> None:
    # 16 under way when the host said 429: after the pause it starts again
    # from one request, each answer allowing one more up to 8 (half), and
    # there it stays until it has answered that many more.
    scheduler = Scheduler(concurrency=64, per_host=32)
    p = pool()
    dial_all(scheduler, p, 16)
    scheduler.pushed_back(p, until=2.0, now=1.0, error=REFUSED, started=1.0)
    assert (p.limit, p.threshold) == (1, 8)
    for i in range(16):  # the burst's refused rows (and more) wait for the pause
        scheduler.closed(PooledConnection(p), now=1.1)
        scheduler.submit(p, transfer(100 + i), now=1.1)
    assert kinds(scheduler.wake(p, until=2.0, now=2.0)) == ["Dial"]  # the probe, alone
    # The probe's head (anything but 429): one more may go (two now).
    assert kinds(scheduler.head_came(p, status=200, started=2.0, now=2.1)) == ["Dial"]
    # Its end: slow start, one more allowed per answer.
    assert kinds(scheduler.host_answered(p, now=2.2, status=200)) == ["Dial"]
    assert p.limit == 2 and p.unanswered == 2


def test_a_throttled_host_ramps_up_by_one_per_round_back_to_per_host() -> None:
    scheduler = Scheduler(concurrency=64, per_host=8)
    p = pool()
    p.limit = p.threshold = 4  # as after a push-back
    now = 1.0
    dial_all(scheduler, p, 100, now=now)
    assert p.unanswered == 4 and len(p.queue) == 96  # four under way, not per_host's eight
    limits = []
    for _ in range(40):
        now += 0.1
        answer(scheduler, p, sent=now - 0.1, now=now)
        limits.append(p.limit)
    # +1 once as many answers as the limit came; at per_host, un-throttled (0).
    assert limits[:4] == [4, 4, 4, 5] and limits[4:9] == [5, 5, 5, 5, 6]
    assert 0 in limits and limits[limits.index(0) :] == [0] * (40 - limits.index(0))
    assert p.open == 8  # per_host, no more


def test_a_refusal_slows_a_host_down_once_per_round() -> None:
    # Each 429 of one burst (sent before the pause began) halved the limit
    # again; and a later decrease halves it with no pause nor restart.
    scheduler = Scheduler(concurrency=64, per_host=32)
    p = pool()
    dial_all(scheduler, p, 20, now=1.0)
    scheduler.pushed_back(p, until=3.0, now=1.5, error=REFUSED, started=1.0)
    for now in (1.6, 1.7, 1.8):  # the rest of the burst
        scheduler.pushed_back(p, until=now + 1, now=now, error=REFUSED, started=1.0)
    assert (p.limit, p.threshold) == (1, 10)
    p.limit = 10  # as after its slow start
    scheduler.slow_down(p, now=5.0, started=1.2)  # sent before the last decrease
    assert p.limit == 10
    scheduler.slow_down(p, now=5.0, started=4.0)  # a request sent since
    assert (p.limit, p.threshold) == (5, 5)  # no restart from one request


def test_answers_to_a_paused_host_or_5xx_do_not_ramp_it_up() -> None:
    scheduler = Scheduler(concurrency=64, per_host=32)
    p = pool()
    p.limit = p.threshold = 2
    for status in (500, 503, 502):
        scheduler.host_answered(p, now=1.0, status=status)
    p.paused_until = 9.0
    for _ in range(5):
        scheduler.host_answered(p, now=1.0, status=200)
    assert (p.limit, p.ramp) == (2, 0)


def test_a_host_that_never_pushed_back_is_not_throttled() -> None:
    scheduler = Scheduler(concurrency=64, per_host=4)
    p = pool()
    dial_all(scheduler, p, 10)
    for _ in range(6):
        scheduler.host_answered(p, now=2.0, status=200)
        assert kinds(scheduler.released(PooledConnection(p), reusable=True, now=2.0)) == ["Start"]
    assert (p.limit, p.ramp, p.unanswered) == (0, 0, 0)


def test_per_host_one_is_as_slow_as_a_push_back_makes_it() -> None:
    scheduler = Scheduler(concurrency=64, per_host=1)
    p = pool()
    dial_all(scheduler, p, 3)
    scheduler.pushed_back(p, until=2.0, now=1.0, error=REFUSED, started=1.0)
    assert p.limit == 0


def test_a_host_that_pushes_back_again_is_paced_at_the_pace_it_showed() -> None:
    # A rate limiter (4 a second): one request at a time is as fast as the host
    # answers, hundreds a second, and every round after a pause ran into it.
    # The second push-back, after 4 answers in the 1 s since the first pause
    # began, spaces the requests 0.25 s apart (the pace the host showed); each
    # answer eases that by 3%.
    scheduler = Scheduler(concurrency=64, per_host=1)
    p = pool()
    dial_all(scheduler, p, 20, now=1.0)
    scheduler.pushed_back(p, until=1.5, now=1.0, error=REFUSED, started=1.0)
    assert p.spacing == 0.0  # the first pause: nothing known of the host's pace yet
    scheduler.closed(PooledConnection(p), now=1.0)
    assert kinds(scheduler.wake(p, until=1.5, now=1.5)) == ["Dial"]  # the probe
    for now in (1.6, 1.7, 1.8, 1.9):
        scheduler.host_answered(p, now=now, status=200)
        assert kinds(scheduler.released(PooledConnection(p), reusable=True, now=now)) == ["Start"]
    scheduler.pushed_back(p, until=2.5, now=2.0, error=REFUSED, started=1.9)
    assert p.spacing == 0.25
    scheduler.closed(PooledConnection(p), now=2.0)
    assert kinds(scheduler.wake(p, until=2.5, now=2.5)) == ["Dial"]  # the probe
    assert p.next_send == 2.75
    # Answered at once: the next request waits for its time, on a timer...
    (wake,) = scheduler.host_answered(p, now=2.51, status=200)
    assert isinstance(wake, WakeAt) and wake.until == 2.75
    assert p.spacing == 0.25 * 0.97
    # ... one timer, however many connections and rows come meanwhile.
    assert scheduler.released(PooledConnection(p), reusable=True, now=2.51) == []
    assert scheduler.submit(p, transfer(99), now=2.6) == []
    # Its time: one goes, and the timer for the next one is armed.
    start, wake = scheduler.wake(p, until=2.75, now=2.75)
    assert isinstance(start, Start) and isinstance(wake, WakeAt)
    assert wake.until == p.next_send == 2.75 + p.spacing
    # A paced host's rows are held for it alone (the intake fetches others).
    assert scheduler.held_back([p], since=10.0) == len(p.queue)


def test_a_paced_host_is_eased_back_to_full_speed() -> None:
    scheduler = Scheduler(concurrency=64, per_host=4)
    p = pool()
    p.spacing = 0.1
    for _ in range(300):
        scheduler.host_answered(p, now=1.0, status=200)
    assert p.spacing == 0.0
    scheduler.host_answered(p, now=1.0, status=200)  # no longer paced
    assert p.spacing == 0.0


def test_a_host_refusing_everything_for_a_while_is_not_paced() -> None:
    # Its probe refused, nothing let through since the last pause: the pauses
    # grow instead; pacing it at their length would crawl long after.
    scheduler = Scheduler(concurrency=64, per_host=1, host_failures=0)
    p = pool()
    dial_all(scheduler, p, 5, now=1.0)
    scheduler.pushed_back(p, until=1.5, now=1.0, error=REFUSED, started=1.0)
    scheduler.closed(PooledConnection(p), now=1.0)
    scheduler.wake(p, until=1.5, now=1.5)
    scheduler.pushed_back(p, until=3.0, now=1.6, error=REFUSED, started=1.5)
    assert p.spacing == 0.0


def test_a_host_that_keeps_pushing_back_is_given_up() -> None:
    scheduler = Scheduler(concurrency=10, per_host=1, host_failures=3)
    p = pool()
    dial_all(scheduler, p, 5)
    now = 1.0
    for _ in range(2):
        assert kinds(scheduler.pushed_back(p, until=now + 1, now=now, error=REFUSED)) == ["WakeAt"]
        now += 1
        scheduler.wake(p, until=now, now=now)
        assert scheduler.host_answered(p, now=now, status=429) == []  # no reset
    actions = scheduler.pushed_back(p, until=now + 1, now=now, error=REFUSED)
    assert kinds(actions) == ["Fail"] * 4 and p.given_up is not None
    fail = actions[0]
    assert isinstance(fail, Fail) and fail.error.code == "http_429"
    assert fail.error.message.startswith("not requested: HTTP 429")  # queued, never sent
    assert "host a.test given up: 3 rows in a row refused with 429" in fail.error.message


def test_an_answer_between_pauses_starts_the_count_again() -> None:
    scheduler = Scheduler(concurrency=10, per_host=1, host_failures=2)
    p = pool()
    dial_all(scheduler, p, 3)
    for now in (1.0, 3.0, 5.0):
        assert kinds(scheduler.pushed_back(p, until=now + 1, now=now, error=REFUSED)) == ["WakeAt"]
        scheduler.wake(p, until=now + 1, now=now + 1)
        scheduler.host_answered(p, now=now + 1, status=200)
    assert p.given_up is None


def test_idle_connections_are_reused_before_dialling() -> None:
    scheduler = Scheduler(concurrency=10, per_host=4)
    p = pool()
    dial_all(scheduler, p, 1)
    conn = PooledConnection(p)
    assert scheduler.released(conn, reusable=True, now=2.0) == []
    assert p.idle == [conn] and conn.idle_since == 2.0
    (action,) = scheduler.submit(p, transfer(7), now=3.0)
    assert isinstance(action, Start) and action.conn is conn and not p.idle


def test_an_unusable_connection_is_closed_and_its_slot_reopens_when_closed() -> None:
    scheduler = Scheduler(concurrency=10, per_host=1)
    p = pool()
    dial_all(scheduler, p, 2)
    conn = PooledConnection(p)
    (action,) = scheduler.released(conn, reusable=False, now=2.0)
    assert isinstance(action, Close) and action.conn is conn
    # The slot counts as promised until the connection is gone; then the queue dials.
    assert kinds(scheduler.closed(conn, now=2.0)) == ["Dial"]
    assert p.open == 1 and scheduler.open == 1 and scheduler.closing == 0


def test_the_global_limit_evicts_another_origins_idle_connection() -> None:
    scheduler = Scheduler(concurrency=2, per_host=2)
    a, b = pool("a.test"), pool("b.test")
    dial_all(scheduler, a, 2)
    first, second = PooledConnection(a), PooledConnection(a)
    scheduler.released(first, reusable=True, now=2.0)
    scheduler.released(second, reusable=True, now=3.0)
    actions = scheduler.submit(b, transfer(0, "b.test"), now=4.0)
    assert kinds(actions) == ["Close", "Dial"]
    assert isinstance(actions[0], Close) and actions[0].conn is first  # the oldest idle one


def test_a_starved_origin_gets_the_next_freed_slot() -> None:
    scheduler = Scheduler(concurrency=1, per_host=1)
    a, b = pool("a.test"), pool("b.test")
    dial_all(scheduler, a, 1)
    assert scheduler.submit(b, transfer(0, "b.test"), now=2.0) == []  # starved: no slot
    conn = PooledConnection(a)
    # a has nothing queued, but b is starved: a's connection closes to make room.
    (close,) = scheduler.released(conn, reusable=True, now=3.0)
    assert isinstance(close, Close)
    (dial,) = scheduler.closed(conn, now=3.0)
    assert isinstance(dial, Dial) and dial.pool is b


def test_a_fresh_transfer_never_reuses_a_kept_alive_connection() -> None:
    scheduler = Scheduler(concurrency=10, per_host=1)
    p = pool()
    dial_all(scheduler, p, 1)
    conn = PooledConnection(p)
    scheduler.released(conn, reusable=True, now=2.0)
    retry = transfer(5)
    retry.fresh = True
    close, dial = scheduler.submit(p, retry, now=3.0, front=True)
    # The idle connection goes first (its slot is promised to the new one).
    assert isinstance(close, Close) and close.conn is conn
    assert isinstance(dial, Dial) and dial.transfer is retry and not retry.fresh
    assert scheduler.closed(conn, now=3.0) == []
    assert p.open == 1


def test_a_fresh_transfer_is_not_given_another_idle_connection() -> None:
    # With three idle connections it closed one and started on another:
    # likely as dead as the first, and then the failure counted.
    scheduler = Scheduler(concurrency=10, per_host=3)
    p = pool()
    dial_all(scheduler, p, 3)
    conns = [PooledConnection(p) for _ in range(3)]
    for conn in conns:
        scheduler.released(conn, reusable=True, now=2.0)
    retry = transfer(5)
    retry.fresh = True
    close, dial = scheduler.submit(p, retry, now=3.0, front=True)
    assert isinstance(close, Close) and close.conn in conns
    assert isinstance(dial, Dial) and dial.transfer is retry
    assert len(p.idle) == 2  # for the transfers that may reuse them


def test_a_finished_connection_does_not_take_a_fresh_transfer() -> None:
    scheduler = Scheduler(concurrency=10, per_host=1)
    p = pool()
    dial_all(scheduler, p, 1)
    retry = transfer(5)
    retry.fresh = True
    assert scheduler.submit(p, retry, now=2.0, front=True) == []  # no slot yet
    conn = PooledConnection(p)
    close, dial = scheduler.released(conn, reusable=True, now=3.0)
    assert isinstance(close, Close) and close.conn is conn
    assert isinstance(dial, Dial) and dial.transfer is retry


def _idle_connection(p: HostPool, sock: socket.socket, loop: EventLoop) -> HTTPConnection:
    """A real connection over ``sock`` (its owner a bare one), as the pool holds it."""
    owner = ConnectionOwner()
    owner.loop, owner.options = loop, Options()
    return HTTPConnection(owner, p, sock, transfer(99))


def test_an_idle_connection_the_server_closed_is_not_reused() -> None:
    # Its end of file was in the socket, not yet seen by the loop: the request
    # went out on it and the transfer paid an attempt for nothing.
    scheduler = Scheduler(concurrency=10, per_host=2)
    p = pool()
    dial_all(scheduler, p, 2)
    ours_dead, theirs_dead = socket.socketpair()
    ours_alive, theirs_alive = socket.socketpair()
    loop = EventLoop()
    with ours_dead, theirs_dead, ours_alive, theirs_alive, contextlib.closing(loop):
        dead, alive = _idle_connection(p, ours_dead, loop), _idle_connection(p, ours_alive, loop)
        scheduler.released(alive, reusable=True, now=2.0)
        scheduler.released(dead, reusable=True, now=2.0)
        theirs_dead.close()
        close, start = scheduler.submit(p, transfer(7), now=3.0)
    assert isinstance(close, Close) and close.conn is dead
    assert isinstance(start, Start) and start.conn is alive


def test_a_peek_tells_a_closed_or_talking_peer_from_a_quiet_one() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.setblocking(False)
        assert not peer_closed(ours, unasked_bytes_end_it=True)
        theirs.sendall(b"HTTP/1.1 408 Request Timeout\r\n\r\n")  # what some send, then close
        assert peer_closed(ours, unasked_bytes_end_it=True)
        assert not peer_closed(ours, unasked_bytes_end_it=False)  # TLS: a record, maybe a ticket
        assert ours.recv(100).startswith(b"HTTP/1.1 408")  # the peek consumed nothing
        theirs.close()
        assert peer_closed(ours, unasked_bytes_end_it=False)


def test_new_connections_start_in_slices_per_turn() -> None:
    scheduler = Scheduler(concurrency=1000, per_host=1000)
    p = pool()
    actions = dial_all(scheduler, p, CONNECT_SLICE + 8, now=1.0)
    assert kinds(actions).count("Dial") == CONNECT_SLICE
    assert kinds(actions).count("Defer") == 1
    assert kinds(scheduler.dispatch_deferred(now=1.001)) == ["Dial"] * 8


def test_a_name_is_resolved_once_and_its_failure_fails_the_queue() -> None:
    scheduler = Scheduler(concurrency=10, per_host=10)
    p = pool(resolved=False)
    first = scheduler.submit(p, transfer(0), now=1.0)
    second = scheduler.submit(p, transfer(1), now=1.0)
    assert kinds(first) == ["Resolve"] and second == []
    error = TransferError(ErrorCode.DNS, "cannot resolve")
    failed = scheduler.resolved(p, None, error, refresh_at=11.0, now=1.5)
    assert kinds(failed) == ["Fail", "Fail"]
    assert all(isinstance(a, Fail) and a.error is error for a in failed)
    # Until the negative answer goes stale, new transfers fail at once...
    assert kinds(scheduler.submit(p, transfer(2), now=5.0)) == ["Fail"]
    # ...and then the name is asked again.
    assert kinds(scheduler.submit(p, transfer(3), now=12.0)) == ["Resolve"]


def test_a_resolved_name_dials_and_refreshes_in_the_background() -> None:
    scheduler = Scheduler(concurrency=10, per_host=10)
    p = pool(resolved=False)
    scheduler.submit(p, transfer(0), now=1.0)
    assert kinds(scheduler.resolved(p, ADDRESSES, None, refresh_at=5.0, now=1.1)) == ["Dial"]
    # Past the TTL: the next dial uses what we have while the name is asked again.
    assert kinds(scheduler.submit(p, transfer(1), now=6.0)) == ["Resolve", "Dial"]


def test_the_circuit_breaker_gives_a_dead_host_up() -> None:
    scheduler = Scheduler(concurrency=10, per_host=2, host_failures=3)
    p = pool()
    dial_all(scheduler, p, 6)  # 2 dialled, 4 queued
    timeout = TransferError(ErrorCode.TIMEOUT, "connect timed out after 2s")
    assert scheduler.host_failed(p, timeout) == []
    scheduler.host_answered(p)  # a response in between starts the count again
    assert scheduler.host_failed(p, timeout) == []
    assert scheduler.host_failed(p, timeout) == []
    given_up = scheduler.host_failed(p, timeout)
    assert kinds(given_up) == ["Fail"] * 4
    error = p.given_up
    assert error is not None and error.code == ErrorCode.TIMEOUT
    assert "given up after 3 failed connections in a row" in error.message
    assert kinds(scheduler.submit(p, transfer(9), now=2.0)) == ["Fail"]


def test_failures_of_attempts_the_host_answered_after_do_not_count() -> None:
    scheduler = Scheduler(concurrency=10, per_host=10, host_failures=2)
    p = pool()
    timeout = TransferError(ErrorCode.TIMEOUT, "no data for 2s")
    scheduler.host_answered(p, now=5.0)
    # Began at 4.0, failed later: the host answered someone at 5.0, so it is up.
    assert scheduler.host_failed(p, timeout, started=4.0) == []
    assert scheduler.host_failed(p, timeout, started=4.5) == []
    assert p.given_up is None and p.consecutive_failures == 0
    scheduler.host_failed(p, timeout, started=6.0)
    assert p.given_up is None
    scheduler.host_failed(p, timeout, started=6.0)
    assert p.given_up is not None  # two in a row, with no answer since they began


def test_http_errors_do_not_trip_the_breaker() -> None:
    scheduler = Scheduler(concurrency=10, per_host=2, host_failures=1)
    p = pool()
    assert scheduler.host_failed(p, TransferError("http_503", "HTTP 503")) == []
    assert p.given_up is None


def test_connections_the_host_accepted_then_closed_do_not_trip_the_breaker() -> None:
    # A burst of parallel connections reset at once counted "in a row": a host
    # resetting half its connections was given up (264 of 300 rows failed).
    scheduler = Scheduler(concurrency=10, per_host=2, host_failures=1)
    p = pool()
    assert scheduler.host_failed(p, ConnectionClosed("connection closed before the response")) == []
    assert p.given_up is None


def test_a_burst_of_lost_handshakes_counts_once_towards_the_breaker() -> None:
    # A loaded server resets the handshakes it got at once; a host (or a
    # middlebox) that resets every one is given up all the same.
    scheduler = Scheduler(concurrency=10, per_host=10, host_failures=2)
    p = pool()
    reset = HandshakeLost("TLS handshake with a.test reset by the server")
    scheduler.host_failed(p, reset, started=1.0, now=1.5)
    for _ in range(8):  # under way with the one counted
        scheduler.host_failed(p, reset, started=1.0, now=1.6)
    assert p.given_up is None and p.consecutive_failures == 1
    scheduler.host_failed(p, reset, started=2.0, now=2.5)  # a retry, begun after it
    error = p.given_up
    assert error is not None and error.code == ErrorCode.CONNECT
    assert "reset by the server" in error.message and "--host-failures" in error.message


def test_stopping_starts_nothing_and_reuses_nothing() -> None:
    scheduler = Scheduler(concurrency=10, per_host=2)
    p = pool()
    dial_all(scheduler, p, 3)
    scheduler.stopping = True
    conn = PooledConnection(p)
    assert kinds(scheduler.released(conn, reusable=True, now=2.0)) == ["Close"]
    assert scheduler.closed(conn, now=2.0) == []
    assert len(p.queue) == 1


def test_actions_name_what_they_act_on() -> None:
    p = pool()
    t = transfer()
    conn = PooledConnection(p)
    assert (Start(conn, t).conn, Dial(p, t).pool, Close(conn).conn) == (conn, p, conn)
    assert Resolve(p).pool is p and isinstance(Defer(), Action)


def test_lookups_in_flight_are_capped_and_the_rest_wait_their_turn() -> None:
    """Every host with a queued row was looked up at once: name servers that cap
    their clients dropped the rest, and resolvable hosts failed with dns."""
    scheduler = Scheduler(concurrency=4, per_host=2)
    assert scheduler.max_resolving == MIN_RESOLVING
    pools = [pool(f"h{i}.test", resolved=False) for i in range(MIN_RESOLVING + 5)]
    actions: list[Action] = []
    for i, p in enumerate(pools):
        actions += scheduler.submit(p, transfer(i, p.host), now=1.0)
        actions += scheduler.submit(p, transfer(100 + i, p.host), now=1.0)  # asked once
    assert kinds(actions) == ["Resolve"] * MIN_RESOLVING
    assert scheduler.resolving == MIN_RESOLVING
    # An answer frees a slot: the next pool in line is looked up.
    after = scheduler.resolved(pools[0], list(ADDRESSES), None, 1e9, now=2.0)
    assert kinds(after) == ["Dial", "Dial", "Resolve"]
    resolved = [a for a in after if isinstance(a, Resolve)]
    assert resolved[0].pool is pools[MIN_RESOLVING]
    # A failure frees one too, and the waiting pools are all asked in order.
    error = TransferError(ErrorCode.DNS, "cannot resolve")
    later: list[Action] = []
    for p in pools[1:6]:
        later += scheduler.resolved(p, None, error, 10.0, now=3.0)
    asked = [a.pool for a in later if isinstance(a, Resolve)]
    assert asked == pools[MIN_RESOLVING + 1 :]
    assert scheduler.resolving == MIN_RESOLVING - 1  # five ended, four were waiting
    assert kinds(later).count("Fail") == 10  # the failed hosts' queued rows


def test_a_503_speaks_of_the_hosts_load_only_when_a_second_row_gets_one_in_a_row() -> None:
    # One URL's 503s, with other answers between, are that URL's trouble; 503s
    # to two rows in a row are a limiter's (nginx's limit_req refuses with 503).
    p = pool()
    seen = [Scheduler.load_status(p, status, key) for status, key in [
        (503, 1), (503, 1),  # one row, asked at its head and at its end: the same
        (200, 2), (503, 1), (200, 3), (503, 1),  # one URL again and again, others between
        (503, 4), (503, 5), (503, 8),  # then rows in a row: the host refuses its load
        (404, 6), (503, 7),  # another answer ends the run of them
    ]]  # fmt: skip
    assert seen == [503, 503, 200, 503, 200, 503, 429, 429, 429, 404, 503]
