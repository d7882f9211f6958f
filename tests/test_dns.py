"""Names and addresses, against a name server of our own on 127.0.0.1.

The server is dnslib's ``DNSServer`` (UDP, random port) with a scripted zone:
names with A/AAAA records and chosen TTLs, one that answers NXDOMAIN and one
whose queries are dropped (a dead server, as far as that name is concerned).
"Unreachable" addresses are loopback listeners whose accept queue is full: the
kernel drops SYNs to them, which is what a blackholed route looks like, with
no packet leaving the machine.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from dnslib import AAAA, QTYPE, RCODE, RR, A, DNSRecord
from dnslib.dns import DNSError
from dnslib.server import BaseResolver, DNSHandler, DNSLogger, DNSServer

import swarmget
import swarmget.engine.core
from swarmget.errors import UsageError
from swarmget.loop import EventLoop
from swarmget.net.ares import AresResolver, lookup_budget
from swarmget.net.dns import Address, LazyResolver, ThreadedResolver, make_resolver
from swarmget.net.eyeballs import HappyEyeballs, interleave
from swarmget.options import Options
from swarmget.testing import TestServer, expected_body
from swarmget.testing.process import child_env

V4, V6 = socket.AF_INET, socket.AF_INET6

# name -> [(qtype, address, ttl)]
ZONE: dict[str, list[tuple[str, str, int]]] = {
    "v4.test.": [("A", "127.0.0.1", 300)],
    "dual.test.": [("AAAA", "::1", 300), ("A", "127.0.0.1", 300)],
    "ttl.test.": [("AAAA", "::1", 30), ("A", "127.0.0.1", 60)],
    "short.test.": [("A", "127.0.0.1", 1)],
    "zero.test.": [("A", "127.0.0.1", 0)],
    "long.test.": [("A", "127.0.0.1", 86400)],
    "shared.test.": [("A", "127.0.0.1", 300)],
    "slow.test.": [("A", "127.0.0.1", 300)],
    "fqdn.test.": [("A", "127.0.0.1", 300)],
    "fqdn-shared.test.": [("A", "127.0.0.1", 300)],
}
NXDOMAIN = {"nx.test.", "cached-nx.test."}
DROPPED = {"dead.test."}
SLOW = {"slow.test.": 2.5}  # seconds this name's answers take (a cold recursive lookup)


class ZoneResolver(BaseResolver):  # type: ignore[misc]
    def __init__(self) -> None:
        self.hits: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        name = str(request.q.qname).lower()
        with self._lock:
            self.hits[name] += 1
        if name in DROPPED:
            raise DNSError("dropped on purpose")  # logged (silently) and never answered
        time.sleep(SLOW.get(name, 0.0))  # each query on its own server thread
        reply = request.reply()
        if name in NXDOMAIN or name not in ZONE:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        qtype = QTYPE[request.q.qtype]
        for rtype, address, ttl in ZONE[name]:
            if rtype == qtype:
                rdata = A(address) if rtype == "A" else AAAA(address)
                reply.add_answer(RR(request.q.qname, getattr(QTYPE, rtype), rdata=rdata, ttl=ttl))
        return reply

    def count(self, name: str) -> int:
        with self._lock:
            return self.hits[name.rstrip(".") + "."]


class NameServer:
    def __init__(self) -> None:
        self.zone = ZoneResolver()
        quiet = DNSLogger(logf=lambda *_: None)
        self._server = DNSServer(self.zone, address="127.0.0.1", port=0, logger=quiet)
        self.port: int = self._server.server.server_address[1]
        self.address = f"127.0.0.1:{self.port}"

    def __enter__(self) -> NameServer:
        self._server.start_thread()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()
        self._server.server.server_close()


@pytest.fixture(scope="module")
def dns() -> Iterator[NameServer]:
    with NameServer() as server:
        yield server


@pytest.fixture(scope="module")
def web() -> Iterator[TestServer]:
    with TestServer() as srv:
        yield srv


@pytest.fixture
def loop() -> Iterator[EventLoop]:
    loop = EventLoop()
    yield loop
    loop.close()


@pytest.fixture
def resolver(loop: EventLoop, dns: NameServer) -> Iterator[AresResolver]:
    res = AresResolver(loop, servers=[dns.address], timeout=0.3, tries=2, min_ttl=1.0)
    yield res
    res.close()


Outcome = tuple[list[Address] | None, Any]


def resolve(
    resolver: AresResolver | ThreadedResolver, loop: EventLoop, host: str, port: int = 80
) -> Outcome:
    out: list[Outcome] = []
    resolver.resolve(host, port, lambda a, e: out.append((a, e)))
    run_until(loop, lambda: bool(out), within=5.0)
    return out[0]


def resolve_once(loop: EventLoop, server: RawNameServer, host: str) -> Outcome:
    """``host`` looked up once (one try, 1 s) by a c-ares resolver asking ``server``."""
    resolver = AresResolver(loop, servers=[server.address], timeout=1.0, tries=1)
    try:
        return resolve(resolver, loop, host)
    finally:
        resolver.close()


def run_until(loop: EventLoop, done: Callable[[], bool], within: float) -> None:
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, "timed out waiting on the loop"
        loop.run_once(0.05)


@contextlib.contextmanager
def blackhole(family: int = V6, host: str = "::1", port: int = 0) -> Iterator[int]:
    """A listener whose one-slot accept queue is full: further SYNs are dropped."""
    listener = socket.socket(family, socket.SOCK_STREAM)
    filler = socket.socket(family, socket.SOCK_STREAM)
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.bind((host, port))
        listener.listen(0)
        filler.connect(listener.getsockname()[:2])
        probe.setblocking(False)
        probe.connect_ex(listener.getsockname()[:2])
        time.sleep(0.1)
        if probe.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 and _connected(probe):
            pytest.skip("this kernel completes connects beyond a full accept queue")
        probe.close()
        yield listener.getsockname()[1]
    finally:
        for sock in (probe, filler, listener):
            sock.close()


def _connected(sock: socket.socket) -> bool:
    try:
        sock.getpeername()
    except OSError:
        return False
    return True


def listener(family: int = V4, host: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(16)
    return sock


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- the c-ares resolver ------------------------------------------------------------


def test_a_and_aaaa_records_become_addresses_with_the_port(
    resolver: AresResolver, loop: EventLoop
) -> None:
    addresses, error = resolve(resolver, loop, "dual.test", 8080)
    assert error is None
    assert addresses is not None
    assert sorted(addresses) == sorted([(V6, ("::1", 8080, 0, 0)), (V4, ("127.0.0.1", 8080))])
    # Another port of the same host comes from the cache, with its own port.
    addresses, _ = resolve(resolver, loop, "dual.test", 443)
    assert addresses is not None
    assert {a[1][1] for a in addresses} == {443}


def test_cache_lasts_the_smallest_record_ttl_clamped(
    resolver: AresResolver, loop: EventLoop
) -> None:
    resolve(resolver, loop, "ttl.test")
    assert resolver.expires("ttl.test", 80) - loop.now == pytest.approx(30, abs=1)
    resolve(resolver, loop, "zero.test")
    assert resolver.expires("zero.test", 80) - loop.now == pytest.approx(1.0, abs=0.2)  # min_ttl
    resolve(resolver, loop, "long.test")
    assert resolver.expires("long.test", 80) - loop.now == pytest.approx(3600, abs=1)  # max_ttl


def test_second_lookup_within_ttl_does_not_ask_and_after_ttl_does(
    resolver: AresResolver, loop: EventLoop, dns: NameServer
) -> None:
    before = dns.zone.count("short.test")
    addresses, error = resolve(resolver, loop, "short.test")
    assert error is None and addresses == [(V4, ("127.0.0.1", 80))]
    asked = dns.zone.count("short.test")
    assert asked > before  # A and AAAA
    resolve(resolver, loop, "short.test")
    assert dns.zone.count("short.test") == asked
    # TTL 1 s; c-ares keeps its own cache to whole seconds, so give it two.
    time.sleep(2.1)
    loop.run_once(0)
    addresses, error = resolve(resolver, loop, "short.test")
    assert error is None and addresses == [(V4, ("127.0.0.1", 80))]
    assert dns.zone.count("short.test") > asked


def test_concurrent_lookups_of_one_name_share_one_query(
    resolver: AresResolver, loop: EventLoop, dns: NameServer
) -> None:
    out: list[Outcome] = []
    for port in (80, 81, 82):
        resolver.resolve("shared.test", port, lambda a, e: out.append((a, e)))
    assert out == []  # never inside resolve()
    run_until(loop, lambda: len(out) == 3, within=5.0)
    assert [a[0][1][1] for a, _ in out if a] == [80, 81, 82]
    assert dns.zone.count("shared.test") == 2  # one A and one AAAA query


def test_a_name_in_any_case_is_one_lookup(loop: EventLoop, dns: NameServer) -> None:
    # "FQDN.Test." and "fqdn.test." are one DNS name: cached and asked once.
    # A fresh channel for every name asked: c-ares's own cache (sent along
    # with its channel) would answer a second lookup without asking.
    res = AresResolver(loop, servers=[dns.address], timeout=0.3, tries=2, names_per_channel=1)
    try:
        addresses, error = resolve(res, loop, "fqdn.test.")
        assert error is None and addresses == [(V4, ("127.0.0.1", 80))]
        assert dns.zone.count("fqdn.test") == 2  # one A and one AAAA query
        addresses, error = resolve(res, loop, "FQDN.Test.", 443)
        assert error is None and addresses == [(V4, ("127.0.0.1", 443))]
        assert dns.zone.count("fqdn.test") == 2
        assert len(res._cache) == 1
        assert res.expires("Fqdn.Test.", 80) == res.expires("fqdn.test.", 80) > loop.now
        # Asked together, they share one query too.
        out: list[Outcome] = []
        for name in ("fqdn-shared.test.", "FQDN-SHARED.test."):
            res.resolve(name, 80, lambda a, e: out.append((a, e)))
        run_until(loop, lambda: len(out) == 2, within=5.0)
        assert [e for _, e in out] == [None, None]
        assert dns.zone.count("fqdn-shared.test") == 2
    finally:
        res.close()


def test_a_name_and_its_fully_qualified_spelling_are_two_lookups(
    loop: EventLoop, dns: NameServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "fromhosts.test" is in the hosts file; "fromhosts.test." is not looked up
    # there (nor through the search domains), so the name server says
    # NXDOMAIN.  Keyed as one name, that NXDOMAIN, cached, failed the
    # hosts-file name for the rows after it.
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 fromhosts.test\n")
    monkeypatch.setenv("CARES_HOSTS", str(hosts))
    res = AresResolver(loop, servers=[dns.address], timeout=0.3, tries=2)
    try:
        resolve(res, loop, "fromhosts.test.")  # whatever c-ares makes of it
        addresses, error = resolve(res, loop, "fromhosts.test", 9)
        assert error is None and addresses == [(V4, ("127.0.0.1", 9))]
    finally:
        res.close()


def test_the_cache_keeps_the_most_recently_used_names_only(
    loop: EventLoop, dns: NameServer
) -> None:
    # Its answers used to stay for their whole TTL: a list over millions of
    # hosts held millions of them (~2 KB a host per worker, gigabytes in all).
    res = AresResolver(loop, servers=[dns.address], timeout=0.3, tries=2, cached=4)
    try:
        for name in ("v4.test", "dual.test", "ttl.test", "long.test"):
            assert resolve(res, loop, name)[1] is None
        resolve(res, loop, "v4.test")  # used again: the oldest is now dual.test
        asked = dns.zone.count("v4.test")
        assert resolve(res, loop, "shared.test")[1] is None  # a fifth name
        assert len(res._cache) == 4
        assert res.expires("dual.test", 80) == 0.0  # forgotten
        assert res.expires("v4.test", 80) > loop.now  # kept, answered from the cache
        assert resolve(res, loop, "v4.test")[1] is None
        assert dns.zone.count("v4.test") == asked
    finally:
        res.close()


def test_waiters_get_their_answer_even_when_the_cache_forgot_it(
    loop: EventLoop, dns: NameServer
) -> None:
    res = AresResolver(loop, servers=[dns.address], timeout=0.3, tries=2, cached=1)
    try:
        out: list[tuple[str, Outcome]] = []
        asked = [("v4.test", 80), ("ttl.test", 81), ("v4.test", 82), ("ttl.test", 83)]
        for name, port in asked:
            res.resolve(name, port, lambda a, e, name=name: out.append((name, (a, e))))
        run_until(loop, lambda: len(out) == 4, within=5.0)
        # Each name's answer pushed the other's out of a one-answer cache.
        assert len(res._cache) == 1
        answered = sorted((name, a[0][1][1]) for name, (a, e) in out if a and e is None)
        assert answered == sorted(asked)
    finally:
        res.close()


def test_c_ares_own_cache_goes_with_its_channel_every_few_names(
    loop: EventLoop, dns: NameServer
) -> None:
    # c-ares keeps every answer too (a "no such record" for an hour), and
    # pycares cannot turn that off: 100,000 names held ~260 MB in it.
    res = AresResolver(
        loop, servers=[dns.address], timeout=0.3, tries=2, cached=1, names_per_channel=2
    )
    try:
        resolve(res, loop, "v4.test")
        asked = dns.zone.count("v4.test")
        resolve(res, loop, "dual.test")  # our one-answer cache forgets v4.test
        resolve(res, loop, "v4.test")  # the channel's third name: a fresh channel asks
        assert dns.zone.count("v4.test") > asked
        for name in ("ttl.test", "long.test", "shared.test", "nx.test"):
            resolve(res, loop, name)
        loop.run_once(0)
        assert res._retired == []  # each closed once answered
        # The loop watches the waker and the current channel's sockets, no others.
        assert len(loop._selector.get_map()) == 1 + len(res._channel.sockets)
    finally:
        res.close()
    assert len(loop._selector.get_map()) == 1


def test_a_replaced_channel_answers_the_queries_it_has(loop: EventLoop, dns: NameServer) -> None:
    res = AresResolver(loop, servers=[dns.address], timeout=3.0, tries=1, names_per_channel=1)
    try:
        out: list[Outcome] = []
        res.resolve("slow.test", 80, lambda a, e: out.append((a, e)))  # 2.5 s to answer
        loop.run_once(0.05)
        assert resolve(res, loop, "v4.test")[1] is None  # on a fresh channel, meanwhile
        assert len(res._retired) == 1 and out == []
        run_until(loop, lambda: bool(out), within=5.0)
        assert out[0][1] is None and out[0][0] == [(V4, ("127.0.0.1", 80))]
        loop.run_once(0)
        assert res._retired == []
    finally:
        res.close()


def test_nxdomain_fails_fast_with_dns_and_is_cached_briefly(
    resolver: AresResolver, loop: EventLoop, dns: NameServer
) -> None:
    started = time.monotonic()
    addresses, error = resolve(resolver, loop, "cached-nx.test")
    assert time.monotonic() - started < 0.5
    assert addresses is None
    assert error.code == "dns"
    assert "cached-nx.test" in error.message
    asked = dns.zone.count("cached-nx.test")
    _, again = resolve(resolver, loop, "cached-nx.test")
    assert again.code == "dns"
    assert dns.zone.count("cached-nx.test") == asked
    assert resolver.expires("cached-nx.test", 80) - loop.now == pytest.approx(10, abs=1)


def test_a_silent_server_fails_in_about_timeout_times_tries_without_blocking_others(
    resolver: AresResolver, loop: EventLoop
) -> None:
    dead: list[Outcome] = []
    started = time.monotonic()
    resolver.resolve("dead.test", 80, lambda a, e: dead.append((a, e)))
    addresses, error = resolve(resolver, loop, "v4.test")
    assert error is None and addresses
    assert time.monotonic() - started < 0.3 and not dead
    run_until(loop, lambda: bool(dead), within=5.0)
    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 2.0  # 0.3 s, then 0.6 s: c-ares doubles each round
    assert dead[0][0] is None
    assert dead[0][1].code == "dns"
    assert "Timeout" in dead[0][1].message


def test_hosts_file_names_need_no_server(resolver: AresResolver, loop: EventLoop) -> None:
    addresses, error = resolve(resolver, loop, "localhost", 9)
    assert error is None and addresses
    assert {a[1][0] for a in addresses} <= {"127.0.0.1", "::1"}


def test_cares_hosts_names_another_hosts_file(
    resolver: AresResolver,
    loop: EventLoop,
    dns: NameServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 fromfile.test\n::1 fromfile.test\n")
    monkeypatch.setenv("CARES_HOSTS", str(hosts))
    addresses, error = resolve(resolver, loop, "fromfile.test", 9)
    assert error is None and addresses is not None
    assert sorted(a[1][0] for a in addresses) == ["127.0.0.1", "::1"]
    assert dns.zone.count("fromfile.test") == 0


def test_ip_literals_are_not_looked_up(resolver: AresResolver, loop: EventLoop) -> None:
    assert resolve(resolver, loop, "[::1]", 5) == ([(V6, ("::1", 5, 0, 0))], None)
    assert resolve(resolver, loop, "127.0.0.1", 5) == ([(V4, ("127.0.0.1", 5))], None)
    assert resolver.expires("127.0.0.1", 5) == float("inf")


def test_the_lazy_resolver_makes_the_real_one_at_the_first_name(
    loop: EventLoop, dns: NameServer
) -> None:
    made: list[AresResolver] = []

    def make() -> AresResolver:
        made.append(AresResolver(loop, servers=[dns.address]))
        return made[-1]

    lazy = LazyResolver(loop, make, eager=False)
    try:
        assert resolve(lazy, loop, "127.0.0.1", 8) == ([(V4, ("127.0.0.1", 8))], None)
        assert resolve(lazy, loop, "[::1]", 9) == ([(V6, ("::1", 9, 0, 0))], None)
        assert lazy.expires("127.0.0.1", 8) == float("inf")
        assert lazy.expires("v4.test", 8) == 0.0
        assert made == []  # IP literals never needed it
        assert resolve(lazy, loop, "v4.test", 8) == ([(V4, ("127.0.0.1", 8))], None)
        assert resolve(lazy, loop, "dual.test", 8)[1] is None
        assert len(made) == 1 and dns.zone.count("v4.test") > 0
        assert lazy.expires("v4.test", 8) > loop.now
    finally:
        lazy.close()
    eager = LazyResolver(loop, make, eager=True)  # explicit servers: checked up front
    assert len(made) == 2
    eager.close()


def test_a_run_on_ip_literals_never_loads_c_ares(web: TestServer, tmp_path: Path) -> None:
    # A fresh interpreter, since this one has imported pycares long ago.
    child = (
        "import sys, swarmget\n"
        f"report = swarmget.download([{web.file_url('lit.bin', size=1000)!r}], {str(tmp_path)!r})\n"
        "print(report.ok, 'pycares' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, env=child_env(), check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "False"]


def test_close_with_a_query_pending_calls_nothing_and_leaves_no_descriptor(
    loop: EventLoop, dns: NameServer
) -> None:
    res = AresResolver(loop, servers=[dns.address], timeout=0.3, tries=2)
    out: list[Outcome] = []
    res.resolve("dead.test", 80, lambda a, e: out.append((a, e)))
    loop.run_once(0.05)
    res.close()
    res.close()
    for _ in range(5):
        loop.run_once(0.05)
    assert out == []
    assert len(loop._selector.get_map()) == 1  # only the loop's own waker


def test_make_resolver_prefers_c_ares_and_checks_servers(loop: EventLoop) -> None:
    res = make_resolver(loop, servers=("127.0.0.1:5353",))
    assert isinstance(res, AresResolver)
    res.close()
    with pytest.raises(UsageError, match="dns-server"):
        Options(dns_servers=("not-an-ip",))
    with pytest.raises(UsageError, match="bad port"):
        Options(dns_servers=("[::1]:99999",))
    # Both went through, and c-ares refused them: "bad DNS server list
    # ['1.2.3.4:']: (17, 'Misformatted string')".
    with pytest.raises(UsageError, match=r"--dns-server '1\.2\.3\.4:': bad port"):
        Options(dns_servers=("1.2.3.4:",))
    with pytest.raises(UsageError, match=r"zone id is taken only without brackets"):
        Options(dns_servers=("[fe80::1%eth0]:53",))
    for server in ("fe80::1%eth0", "[::1]", "[::1]:53", "1.2.3.4:53"):
        make_resolver(loop, servers=Options(dns_servers=(server,)).dns_servers).close()
    assert Options(dns_servers="10.0.0.1").dns_servers == ("10.0.0.1",)  # type: ignore[arg-type]
    assert Options(dns_servers=["[::1]:53"]).dns_servers == ("[::1]:53",)  # type: ignore[arg-type]


def test_without_pycares_the_threaded_resolver_stands_in(
    loop: EventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "swarmget.net.ares", None)  # import fails
    res = make_resolver(loop)
    assert isinstance(res, ThreadedResolver)
    res.close()
    with pytest.raises(UsageError, match="pycares"):
        make_resolver(loop, servers=("127.0.0.1",))


def test_threaded_fallback_has_the_same_interface(loop: EventLoop) -> None:
    res = ThreadedResolver(loop)
    try:
        addresses, error = resolve(res, loop, "localhost", 9)
        assert error is None and addresses
        assert res.expires("localhost", 9) > loop.now
    finally:
        res.close()


def test_the_threaded_resolver_asks_once_for_a_name_in_any_case(
    loop: EventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        asked.append(host)
        return real("127.0.0.1", port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    res = ThreadedResolver(loop)
    try:
        for name in ("host.test.", "HOST.test.", "host.test", "Host.Test"):
            addresses, error = resolve(res, loop, name, 9)
            assert error is None and addresses == [(V4, ("127.0.0.1", 9))]
        # As given; the dot makes another name (glibc finds "localhost" in
        # /etc/hosts, not "localhost.").
        assert asked == ["host.test.", "host.test"]
        assert res.expires("HOST.test", 9) == res.expires("host.test", 9) > loop.now
    finally:
        res.close()


def test_the_threaded_resolver_forgets_expired_answers(loop: EventLoop) -> None:
    # Its cache used to keep every (host, port) of the run: a list over millions
    # of hosts grew without bound, as the c-ares resolver's cache never did.
    res = ThreadedResolver(loop, ttl=0.0, negative_ttl=0.0)
    try:
        for port in range(1, 2501):
            addresses, error = resolve(res, loop, "localhost", port)
            assert error is None and addresses
        assert len(res._cache) <= 1024
    finally:
        res.close()


def test_the_threaded_resolver_keeps_the_most_recently_used_answers_only(
    loop: EventLoop,
) -> None:
    # Forgetting expired answers alone let 300 s of a list's hosts pile up.
    res = ThreadedResolver(loop, cached=8)
    try:
        for port in range(1, 21):
            addresses, error = resolve(res, loop, "localhost", port)
            assert error is None and addresses
        assert len(res._cache) == 8
        assert res.expires("localhost", 12) == 0.0
        assert res.expires("localhost", 20) > loop.now
    finally:
        res.close()


# -- Happy Eyeballs -----------------------------------------------------------------

Dialed = tuple[socket.socket | None, Any]


def dial(loop: EventLoop, addresses: list[Address], timeout: float = 10.0) -> tuple[Dialed, float]:
    out: list[Dialed] = []
    eyeballs = HappyEyeballs(loop, addresses, lambda s, e: out.append((s, e)), timeout=timeout)
    started = time.monotonic()
    eyeballs.start()
    assert out == []  # never called back from inside start()
    run_until(loop, lambda: bool(out), within=timeout + 5)
    return out[0], time.monotonic() - started


def test_interleave_alternates_families_from_the_first() -> None:
    a6, b6, c6 = ((V6, (f"::{i}", 1, 0, 0)) for i in (1, 2, 3))
    a4, b4 = ((V4, (f"127.0.0.{i}", 1)) for i in (1, 2))
    assert interleave([a6, b6, c6, a4, b4]) == [a6, a4, b6, b4, c6]
    assert interleave([a4, a6, b6]) == [a4, a6, b6]
    assert interleave([a4]) == [a4]


def test_a_blackholed_first_address_costs_the_stagger_not_the_timeout(loop: EventLoop) -> None:
    good = listener()
    with blackhole() as dead_port, good:
        addresses = [(V6, ("::1", dead_port, 0, 0)), (V4, good.getsockname())]
        (sock, error), elapsed = dial(loop, addresses, timeout=10.0)
        assert error is None and sock is not None
        with sock:
            assert sock.getpeername() == good.getsockname()
        assert 0.2 <= elapsed < 1.0
    assert len(loop._selector.get_map()) == 1  # the loser was unregistered (and closed)


def test_the_same_within_one_family(loop: EventLoop) -> None:
    good = listener()
    with blackhole(V4, "127.0.0.1") as dead_port, good:
        addresses = [(V4, ("127.0.0.1", dead_port)), (V4, good.getsockname())]
        (sock, _), elapsed = dial(loop, addresses)
        assert sock is not None
        sock.close()
        assert 0.2 <= elapsed < 1.0


def test_a_refused_first_address_moves_on_at_once(loop: EventLoop) -> None:
    with listener() as good:
        addresses = [(V4, ("127.0.0.1", closed_port())), (V4, good.getsockname())]
        (sock, _), elapsed = dial(loop, addresses)
        assert sock is not None
        sock.close()
        assert elapsed < 0.2  # not the 0.25 s stagger


def test_all_refused_is_a_connect_error(loop: EventLoop) -> None:
    addresses = [(V6, ("::1", closed_port(), 0, 0)), (V4, ("127.0.0.1", closed_port()))]
    (sock, error), elapsed = dial(loop, addresses)
    assert sock is None
    assert error.code == "connect"
    assert os.strerror(errno.ECONNREFUSED) in error.message
    assert elapsed < 0.5


def test_all_blackholed_times_out_once_for_the_whole_race(loop: EventLoop) -> None:
    with blackhole() as port6, blackhole(V4, "127.0.0.1") as port4:
        addresses = [(V6, ("::1", port6, 0, 0)), (V4, ("127.0.0.1", port4))]
        (sock, error), elapsed = dial(loop, addresses, timeout=0.6)
        assert sock is None
        assert error.code == "timeout"
        assert 0.55 <= elapsed < 1.2
    assert len(loop._selector.get_map()) == 1


def test_cancel_closes_the_attempts_without_calling_back(loop: EventLoop) -> None:
    with blackhole() as port6, blackhole(V4, "127.0.0.1") as port4:
        out: list[Dialed] = []
        addresses = [(V6, ("::1", port6, 0, 0)), (V4, ("127.0.0.1", port4))]
        eyeballs = HappyEyeballs(loop, addresses, lambda s, e: out.append((s, e)), timeout=0.6)
        eyeballs.start()
        deadline = time.monotonic() + 0.4
        while time.monotonic() < deadline:
            loop.run_once(0.05)
        # Both attempts are in flight now (the stagger is 0.25 s); the deadline has
        # not passed yet, and once cancelled it must not fire.
        eyeballs.cancel()
        deadline = time.monotonic() + 0.4
        while time.monotonic() < deadline:
            loop.run_once(0.05)
        assert out == []
        assert len(loop._selector.get_map()) == 1


# -- the engine, through names ------------------------------------------------------


def manifest(out: Path) -> dict[str, dict[str, Any]]:
    text = (out / ".swarmget" / "manifest.jsonl").read_text()
    records = [json.loads(line) for line in text.splitlines()]
    return {r["url"]: r for r in records if r.get("status") in ("ok", "failed")}


def named_urls(web: TestServer, host: str, names: list[str], size: int = 3000) -> list[str]:
    return [f"http://{host}:{web.port}/files/{n}?size={size}" for n in names]


def test_downloads_through_names_and_both_families(
    web: TestServer, dns: NameServer, out_dir: Path
) -> None:
    v4 = named_urls(web, "v4.test", [f"a{i}.bin" for i in range(20)])
    # dual.test lists ::1 first, where nothing listens on this port: refused, so
    # Happy Eyeballs moves to 127.0.0.1 at once.
    dual = named_urls(web, "dual.test", [f"b{i}.bin" for i in range(20)])
    local = named_urls(web, "localhost", [f"c{i}.bin" for i in range(5)])
    report = swarmget.download(
        v4 + dual + local, out_dir, dns_servers=[dns.address], retries=0, concurrency=8
    )
    assert (report.ok, report.failed) == (45, 0), report.failures
    for name in ("a0.bin", "b19.bin", "c4.bin"):
        assert (out_dir / name).read_bytes() == expected_body(name, 3000)


def test_nxdomain_fails_that_hosts_files_with_dns_and_no_others(
    web: TestServer, dns: NameServer, out_dir: Path
) -> None:
    good = named_urls(web, "v4.test", [f"g{i}.bin" for i in range(30)])
    bad = named_urls(web, "nx.test", [f"n{i}.bin" for i in range(30)])
    mixed = [u for pair in zip(bad, good, strict=True) for u in pair]
    started = time.monotonic()
    report = swarmget.download(mixed, out_dir, dns_servers=[dns.address], retries=3)
    assert time.monotonic() - started < 2.0
    assert (report.ok, report.failed) == (30, 30)
    records = manifest(out_dir)
    assert {records[u]["error"] for u in bad} == {"dns"}
    assert all(records[u]["status"] == "ok" for u in good)


def test_a_silent_name_fails_with_dns_in_seconds_and_stalls_no_other_host(
    web: TestServer, dns: NameServer, out_dir: Path
) -> None:
    good = named_urls(web, "v4.test", [f"g{i}.bin" for i in range(30)])
    dead = named_urls(web, "dead.test", [f"d{i}.bin" for i in range(10)])
    started_wall = time.time()
    started = time.monotonic()
    report = swarmget.download(
        dead + good, out_dir, dns_servers=[dns.address], retries=0, timeout=3
    )
    elapsed = time.monotonic() - started
    assert (report.ok, report.failed) == (30, 10)
    records = manifest(out_dir)
    assert {records[u]["error"] for u in dead} == {"dns"}
    assert 0.5 < elapsed < 6.0  # --timeout 3: the lookup waits 1 s, then 2 s
    # The good host's files were on disk long before the dead name gave up.
    last_good = max((out_dir / f"g{i}.bin").stat().st_mtime for i in range(30))
    assert last_good - started_wall < 1.0


def test_a_slow_name_server_is_waited_for_within_the_timeout(
    web: TestServer, dns: NameServer, out_dir: Path
) -> None:
    # c-ares takes only the answer to its latest query, and waits up to 1 s,
    # then up to 2 s (less by a random part): with those two rounds, fixed, a
    # server that needs 2.5 s failed every name.  The rounds now fill --timeout
    # (1, 2, 4, 8 s of the default 30).
    urls = named_urls(web, "slow.test", ["s0.bin", "s1.bin"])
    report = swarmget.download(urls, out_dir, dns_servers=[dns.address], retries=0)
    assert (report.ok, report.failed) == (2, 0)


def test_a_silent_lookup_ends_within_the_timeout_whatever_the_servers(loop: EventLoop) -> None:
    # c-ares asks each server in every round: three silent servers made a
    # 30 s budget 38 s (three 1-2-4-8 s rounds).
    silent = [socket.socket(V4, socket.SOCK_DGRAM) for _ in range(3)]
    try:
        for sock in silent:
            sock.bind(("127.0.0.1", 0))
        servers = [f"127.0.0.1:{sock.getsockname()[1]}" for sock in silent]
        resolver = AresResolver(loop, servers=servers, within=3.0)
        out: list[tuple[object, object]] = []
        started = time.monotonic()
        resolver.resolve("nobody.test", 80, lambda a, e: out.append((a, e)))
        run_until(loop, lambda: bool(out), within=10)
        elapsed = time.monotonic() - started
        resolver.close()
    finally:
        for sock in silent:
            sock.close()
    assert out[0][0] is None and elapsed < 3.5


@pytest.mark.parametrize(
    ("servers", "first", "tries"), [(1, 1.0, 4), (2, 1.0, 4), (3, 1.0, 3), (40, 0.75, 1)]
)
def test_the_lookup_budget_counts_every_server_in_a_round(
    servers: int, first: float, tries: int
) -> None:
    assert lookup_budget(30.0, servers) == (first, tries)
    assert servers * first * (2**tries - 1) <= 30.0


@pytest.mark.parametrize(
    ("timeout", "first", "tries", "longest"),
    [(30.0, 1.0, 4, 15.0), (10.0, 1.0, 3, 7.0), (3.0, 1.0, 2, 3.0), (1.0, 1.0, 1, 1.0),
     (0.4, 0.4, 1, 0.4), (2.9, 1.0, 1, 1.0)],
)  # fmt: skip
def test_a_lookup_asks_again_after_doubling_waits_that_fit_the_timeout(
    timeout: float, first: float, tries: int, longest: float
) -> None:
    assert lookup_budget(timeout) == (first, tries)
    assert first * (2**tries - 1) == pytest.approx(longest)


def test_happy_eyeballs_in_the_engine(dns: NameServer, out_dir: Path) -> None:
    # dual.test: ::1 first.  On this port, ::1 drops our SYNs; 127.0.0.1 serves.
    with blackhole() as port:
        try:
            web = TestServer(port=port).start()
        except OSError:
            pytest.skip("127.0.0.1 has this port taken")
        try:
            urls = [f"http://dual.test:{port}/files/e{i}.bin?size=2000" for i in range(4)]
            started = time.monotonic()
            report = swarmget.download(
                urls, out_dir, dns_servers=[dns.address], retries=0, timeout=10, per_host=4
            )
            elapsed = time.monotonic() - started
        finally:
            web.stop()
    assert (report.ok, report.failed) == (4, 0), report.failures
    assert 0.2 <= elapsed < 2.0  # one stagger, not the 10 s connect timeout
    assert (out_dir / "e3.bin").read_bytes() == expected_body("e3.bin", 2000)


def test_a_race_nobody_answers_is_cut_by_the_deadline(dns: NameServer, out_dir: Path) -> None:
    # A race is no connection yet, which the sweep checks: bounded by its own
    # --timeout only, it ran a whole timeout past the row's deadline.
    with blackhole() as port, contextlib.ExitStack() as also:
        try:
            also.enter_context(blackhole(V4, "127.0.0.1", port))  # dual.test's other address
        except OSError:
            pytest.skip("127.0.0.1 has this port taken")
        started = time.monotonic()
        report = swarmget.download(
            [f"http://dual.test:{port}/f"],
            out_dir,
            dns_servers=[dns.address],
            deadline=1,
            timeout=5,
        )
        elapsed = time.monotonic() - started
    (failure,) = report.failures
    assert failure.error == "timeout"
    assert failure.message == "deadline of 1s exceeded during the connect"
    assert elapsed < 2.5  # the lookup, and one second


def test_the_engine_asks_again_when_the_ttl_runs_out(
    web: TestServer, dns: NameServer, out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # short.test has TTL 1 s; let the engine's resolver honour it (default floor: 5 s).
    def short_lived(
        loop: EventLoop, *, servers: tuple[str, ...] = (), timeout: float = 30.0
    ) -> AresResolver:
        return AresResolver(loop, servers=servers, min_ttl=0.5)

    monkeypatch.setattr(swarmget.engine.core, "make_resolver", short_lived)
    before = dns.zone.count("short.test")
    # One connection per file (the server closes), spread over ~2.5 s.
    urls = [
        f"http://short.test:{web.port}/files/t{i}.bin?size=100&close=1&latency=0.25"
        for i in range(10)
    ]
    report = swarmget.download(urls, out_dir, dns_servers=[dns.address], concurrency=1)
    assert (report.ok, report.failed) == (10, 0), report.failures
    assert dns.zone.count("short.test") - before >= 4  # asked at least twice (A + AAAA)


@pytest.mark.timeout(60)  # the bug this guards against was a hang
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"], ids=["one-address", "eyeballs"])
def test_a_host_that_refuses_everything_fails_every_row(host: str, out_dir: Path) -> None:
    # More rows than the engine holds in memory at once (256): failed connects
    # must keep pulling rows in, on both connect paths.
    port = closed_port()
    urls = [f"http://{host}:{port}/r{i}.bin" for i in range(600)]
    report = swarmget.download(urls, out_dir, retries=0)
    assert (report.ok, report.failed) == (0, 600)
    assert {f.error for f in report.failures} == {"connect"}


@pytest.mark.timeout(60)
def test_connects_that_fail_at_once_also_fail_every_row(
    out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No route (an IPv6-only host on an IPv4-only machine): connect() fails
    # before any event, and the retry that follows comes from a timer.
    def no_route(address: Address) -> tuple[socket.socket, int]:
        sock = socket.socket()
        sock.close()
        return sock, errno.ENETUNREACH

    monkeypatch.setattr(swarmget.engine.core, "start_connect", no_route)
    urls = [f"http://127.0.0.1:9/u{i}.bin" for i in range(600)]
    report = swarmget.download(urls, out_dir, retries=1)
    assert (report.ok, report.failed) == (0, 600)
    assert {f.error for f in report.failures} == {"connect"}


def test_https_through_happy_eyeballs(dns: NameServer, out_dir: Path, tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_pem = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("dual.test").configure_cert(context)
    body = b"over TLS, after ::1 refused"
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def serve_one() -> None:
            raw, _ = server.accept()
            with context.wrap_socket(raw, server_side=True) as tls:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += tls.recv(4096)
                assert data.startswith(b"GET /s.bin ")
                tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                with contextlib.suppress(OSError):
                    tls.recv(1)  # until the client hangs up

        thread = threading.Thread(target=serve_one, daemon=True)
        thread.start()
        report = swarmget.download(
            [f"https://dual.test:{port}/s.bin"],
            out_dir,
            dns_servers=[dns.address],
            cacert=str(ca_pem),
            retries=0,
        )
        thread.join(5)
    assert (report.ok, report.failed) == (1, 0), report.failures
    assert (out_dir / "s.bin").read_bytes() == body


def test_cli_takes_dns_servers(capsys: pytest.CaptureFixture[str]) -> None:
    from swarmget import cli

    cli.main(["--help"])
    assert "--dns-server ADDR" in capsys.readouterr().out


class RawNameServer:
    """A UDP name server whose ``answer(query) -> bytes | None`` decides each reply
    (None: none), each after ``delay`` s, on threads: queries overlap.  With
    ``capacity``, queries that come while that many wait for their reply are
    dropped, as name servers that cap a client do."""

    def __init__(
        self,
        answer: Callable[[DNSRecord, bytes], bytes | None],
        delay: float,
        capacity: int | None = None,
    ) -> None:
        self.answer, self.delay, self.capacity = answer, delay, capacity
        self.asked: collections.Counter[str] = collections.Counter()
        self.dropped = 0
        self._pending = 0
        self._lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> RawNameServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            query = DNSRecord.parse(data)
            self.asked[str(query.q.qname)] += 1
            with self._lock:
                if self.capacity is not None and self._pending >= self.capacity:
                    self.dropped += 1
                    continue
                self._pending += 1
            threading.Timer(self.delay, self._reply, (query, data, peer)).start()

    def _reply(self, query: DNSRecord, data: bytes, peer: tuple[str, int]) -> None:
        try:
            reply = self.answer(query, data)
            if reply is not None and not self._stop.is_set():
                with contextlib.suppress(OSError):
                    self.sock.sendto(reply, peer)
        finally:
            with self._lock:
                self._pending -= 1


def _answer_good_ones(query: DNSRecord, data: bytes) -> bytes | None:
    name = str(query.q.qname)
    if name.startswith("bad."):
        return data[:2] + b"\x81\x80\x00\x01\x00\x01" + b"\xff" * 7  # its id, then garbage
    reply = query.reply()
    if QTYPE[query.q.qtype] == "A":
        reply.add_answer(RR(query.q.qname, QTYPE.A, rdata=A("127.0.0.1"), ttl=60))
    return bytes(reply.pack())


def test_a_malformed_reply_fails_its_own_name_only(loop: EventLoop) -> None:
    """c-ares fails every query pending on the connection a malformed reply came
    on: twenty good names failed with the bad one.  Asked once more, they resolve."""
    with RawNameServer(_answer_good_ones, delay=0.05) as server:
        resolver = AresResolver(loop, servers=[server.address], timeout=1.0, tries=1)
        try:
            out: dict[str, Outcome] = {}
            for name in ["bad.test"] + [f"good{i}.test" for i in range(20)]:
                resolver.resolve(name, 80, lambda a, e, name=name: out.setdefault(name, (a, e)))
            run_until(loop, lambda: len(out) == 21, within=10.0)
        finally:
            resolver.close()
    assert out["bad.test"][0] is None and out["bad.test"][1].code == "dns"
    assert all(out[f"good{i}.test"][0] for i in range(20)), out
    assert server.asked["bad.test."] >= 2  # asked once more before it counts


def test_a_name_server_that_stopped_answering_fails_lookups_at_once(loop: EventLoop) -> None:
    """After DEAD_AFTER lookups in a row time out, the next ones fail at once (a
    list over thousands of hosts crawled at one timeout per host); after
    negative_ttl one goes out again."""
    from swarmget.net.ares import DEAD_AFTER

    with RawNameServer(lambda query, data: None, delay=0.0) as server:
        resolver = AresResolver(
            loop, servers=[server.address], timeout=0.05, tries=1, negative_ttl=0.5
        )
        try:
            for i in range(DEAD_AFTER):
                addresses, error = resolve(resolver, loop, f"slow{i}.test")
                assert addresses is None and "Timeout" in error.message
            asked = sum(server.asked.values())
            started = time.monotonic()
            addresses, error = resolve(resolver, loop, "next.test")
            assert time.monotonic() - started < 0.05
            assert "not answering" in error.message and error.code == "dns"
            assert sum(server.asked.values()) == asked  # not asked at all
            time.sleep(0.6)
            loop.run_once(0.0)  # the loop's clock moves on
            addresses, error = resolve(resolver, loop, "later.test")
            assert "Timeout" in error.message  # asked again, and still nothing
        finally:
            resolver.close()


def test_a_row_that_waited_for_its_name_records_the_wait(tmp_path: Path) -> None:
    """elapsed_ms counted from the first connection attempt: a row whose name
    took seconds to fail recorded 0."""

    def slow_nxdomain(query: DNSRecord, data: bytes) -> bytes:
        reply = query.reply()
        reply.header.rcode = RCODE.NXDOMAIN
        return bytes(reply.pack())

    with RawNameServer(slow_nxdomain, delay=0.3) as server:
        report = swarmget.download(
            ["http://slow-nx.test/a"], tmp_path, dns_servers=(server.address,), retries=0
        )
    (failure,) = report.failures
    assert failure.error == "dns"
    (record,) = swarmget.read_manifest(tmp_path)
    assert record["elapsed_ms"] >= 250


def test_a_name_without_records_is_asked_once(loop: EventLoop) -> None:
    """ "No data" is asked again only just after a malformed reply (which it may
    hide: an A query failed, the AAAA found nothing); otherwise it is an answer."""

    def nothing(query: DNSRecord, data: bytes) -> bytes:
        return bytes(query.reply().pack())

    with RawNameServer(nothing, delay=0.0) as server:
        addresses, error = resolve_once(loop, server, "empty.test")
    assert addresses is None and error.code == "dns"
    assert server.asked["empty.test."] == 2  # A and AAAA, once each


# -- --deadline counts the name lookup (as curl -m does) -------------------------------


def test_a_name_server_that_never_answers_ends_the_row_at_its_deadline(
    web: TestServer, dns: NameServer, out_dir: Path
) -> None:
    # The lookup's own limit is --timeout (c-ares: 1 s, then 2 s of 5): the row's
    # clock started at its first connect, so it ran 3 s past a 1 s deadline.
    good = named_urls(web, "v4.test", ["dl-g0.bin", "dl-g1.bin"])
    dead = named_urls(web, "dead.test", [f"dl-d{i}.bin" for i in range(3)])
    started = time.monotonic()
    report = swarmget.download(
        dead + good, out_dir, dns_servers=[dns.address], retries=2, timeout=5, deadline=1
    )
    elapsed = time.monotonic() - started
    assert (report.ok, report.failed) == (2, 3)
    assert {(f.error, f.message) for f in report.failures} == {
        ("timeout", "deadline of 1s exceeded during the name resolution")
    }
    assert all(900 <= f.elapsed_ms < 2000 for f in report.failures), report.failures
    assert elapsed < 2.5


def test_the_lookup_counts_in_the_deadline_of_a_row_that_then_connects(
    web: TestServer, dns: NameServer, out_dir: Path
) -> None:
    # slow.test answers after 2.5 s: a 4 s deadline leaves the transfer 1.5 s,
    # not 4 s more; the server's 2 s answer does not fit in them.
    url = f"http://slow.test:{web.port}/files/late.bin?size=100&latency=2"
    report = swarmget.download(
        [url], out_dir, dns_servers=[dns.address], retries=0, timeout=10, deadline=4
    )
    (failure,) = report.failures
    assert failure.error == "timeout"
    assert failure.message.startswith("deadline of 4s exceeded"), failure.message
    assert 3800 <= failure.elapsed_ms < 5000


def test_the_threaded_resolver_is_cut_by_the_deadline_too(
    web: TestServer, out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without pycares, getaddrinfo on a thread has no limit of ours at all: a
    # lookup the system's resolver sits on held the row for as long as it did.
    monkeypatch.setitem(sys.modules, "swarmget.net.ares", None)  # import fails
    real = socket.getaddrinfo

    def stuck(host: str, *args: Any, **kwargs: Any) -> Any:
        if host == "stuck.test":
            time.sleep(4)  # bounded: the thread must end for the process to exit
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", stuck)
    started = time.monotonic()
    report = swarmget.download(
        [f"http://stuck.test:{web.port}/files/t.bin", web.file_url("t-ok.bin", size=10)],
        out_dir,
        retries=0,
        deadline=1,
        workers=1,
    )
    elapsed = time.monotonic() - started
    assert (report.ok, report.failed) == (1, 1)
    (failure,) = report.failures
    assert (failure.error, failure.message) == (
        "timeout",
        "deadline of 1s exceeded during the name resolution",
    )
    assert elapsed < 2.5


def test_an_ipv6_only_answer_is_not_held_up_by_a_lost_a_query(loop: EventLoop) -> None:
    """A name server that answers AAAA but never A: c-ares held the AAAA answer
    until its A query had used up every retransmission (11 s of the default
    --timeout), while a lost AAAA query cost one first wait.  Now the AAAA
    answer is used after the first wait (c-ares's cache gives it: not asked
    again), and it stays cached when the A query finally times out."""

    def aaaa_only(query: DNSRecord, data: bytes) -> bytes | None:
        if QTYPE[query.q.qtype] == "A":
            return None
        reply = query.reply()
        reply.add_answer(RR(query.q.qname, QTYPE.AAAA, rdata=AAAA("::1"), ttl=60))
        return bytes(reply.pack())

    with RawNameServer(aaaa_only, delay=0.0) as server:
        resolver = AresResolver(loop, servers=[server.address], timeout=0.3, tries=3)
        try:
            started = time.monotonic()
            addresses, error = resolve(resolver, loop, "v6only.test")
            took = time.monotonic() - started
            assert error is None and addresses == [(V6, ("::1", 80, 0, 0))]
            assert took < 0.9  # 1.5 first waits (0.45 s), not the A query's 2.1 s
            run_until(loop, lambda: server.asked["v6only.test."] >= 4, within=5.0)
            time.sleep(2.2)  # the A query gives up
            for _ in range(5):
                loop.run_once(0.05)
            assert resolve(resolver, loop, "v6only.test") == (addresses, None)
        finally:
            resolver.close()


def test_a_connect_that_times_out_is_tried_twice_at_most(out_dir: Path) -> None:
    # Silence at the connect is silence as after the head: retried at most
    # once, as a stalled transfer is.  Retried as often as any failure, each
    # dead host of a list held a connection and a row of the window for four
    # --timeouts and their backoffs, and the rows behind waited.
    with blackhole(V4, "127.0.0.1") as port:
        started = time.monotonic()
        report = swarmget.download([f"http://127.0.0.1:{port}/f"], out_dir, retries=3, timeout=0.5)
        elapsed = time.monotonic() - started
    (failure,) = report.failures
    assert (failure.error, failure.attempts) == ("timeout", 2), failure
    assert failure.message.startswith("connect to 127.0.0.1:"), failure.message
    assert elapsed < 1.8


# -- hostile and odd name servers ----------------------------------------------------


def _answering(records: dict[str, list[str]]) -> Callable[[DNSRecord, bytes], bytes]:
    """A RawNameServer answer: ``records`` maps an A/AAAA qtype to its addresses."""

    def answer(query: DNSRecord, data: bytes) -> bytes:
        reply = query.reply()
        qtype = QTYPE[query.q.qtype]
        for ip in records.get(qtype, []):
            rdata = A(ip) if qtype == "A" else AAAA(ip)
            reply.add_answer(RR(query.q.qname, query.q.qtype, rdata=rdata, ttl=60))
        return bytes(reply.pack())

    return answer


def test_a_name_blocked_with_0_0_0_0_is_not_fetched_from_this_machine(
    web: TestServer, out_dir: Path
) -> None:
    # Blocklists answer 0.0.0.0 (and ::), which Linux connects to as this
    # machine: the blocked host's file came from whatever listened locally.
    with RawNameServer(_answering({"A": ["0.0.0.0"], "AAAA": ["::"]}), delay=0.0) as server:
        url = f"http://blocked.test:{web.port}/files/b.bin?size=10"
        report = swarmget.download([url], out_dir, dns_servers=(server.address,), retries=0)
    (failure,) = report.failures
    assert failure.error == "dns"
    assert failure.message == (
        "cannot resolve 'blocked.test': it resolved only to addresses no server can have: "
        "0.0.0.0 (the unspecified address, the answer for a blocked name); "
        ":: (the unspecified address, the answer for a blocked name)"
    )


@pytest.mark.parametrize(
    ("qtype", "ip", "why"),
    [
        ("A", "224.0.0.1", "a multicast address"),
        ("A", "255.255.255.255", "the broadcast address"),
        ("A", "240.0.0.1", "a reserved address"),
        ("AAAA", "ff02::1", "a multicast address"),
        ("AAAA", "fe80::1", "a link-local address, which needs an interface named"),
    ],
)
def test_an_answer_no_server_can_have_fails_with_dns_saying_why(
    loop: EventLoop, qtype: str, ip: str, why: str
) -> None:
    # These failed at the connect, "Network is unreachable" or "Invalid
    # argument", naming neither the address nor what was wrong with it.
    with RawNameServer(_answering({qtype: [ip]}), delay=0.0) as server:
        addresses, error = resolve_once(loop, server, "odd.test")
    assert addresses is None and error.code == "dns"
    assert error.message.endswith(f"no server can have: {ip} ({why})")


def test_the_usable_addresses_of_an_answer_are_kept(loop: EventLoop) -> None:
    records = {"A": ["0.0.0.0", "127.0.0.1", "169.254.1.1", "127.0.0.2"], "AAAA": ["ff02::1"]}
    with RawNameServer(_answering(records), delay=0.0) as server:
        addresses, error = resolve_once(loop, server, "mixed.test")
    assert error is None
    assert addresses is not None
    assert sorted(addresses) == [(V4, (ip, 80)) for ip in ("127.0.0.1", "127.0.0.2", "169.254.1.1")]


def test_a_name_server_that_drops_what_it_cannot_take_gets_fewer_names_at_once(
    loop: EventLoop,
) -> None:
    """The engine keeps up to 256 lookups going (as many as connections): a
    name server that drops queries beyond its cap (dnsmasq: 150; here 12) lost
    so many that names which resolve failed with ``dns`` (2,000 hosts against
    a cap of 50: 40 to 130 of them).  Here the server dropped ~660 queries of
    300 names; now the resolver starts with 16 names at once, and asks for half
    as many when names sent later are answered while earlier ones wait past
    the first wait (their queries were dropped), as TCP does: ~70."""
    names = [f"n{i}.test" for i in range(300)]
    with RawNameServer(_answering({"A": ["127.0.0.1"]}), delay=0.05, capacity=40) as server:
        resolver = AresResolver(loop, servers=[server.address], timeout=0.2, tries=4)
        out: dict[str, Outcome] = {}
        queue = collections.deque(names)

        def feed() -> None:  # as the scheduler does: 128 lookups going at most
            while queue and len(names) - len(queue) - len(out) < 128:
                name = queue.popleft()
                resolver.resolve(name, 80, lambda a, e, name=name: answered(name, a, e))

        def answered(name: str, addresses: Any, error: Any) -> None:
            out[name] = (addresses, error)
            feed()

        try:
            feed()
            run_until(loop, lambda: len(out) == len(names), within=30.0)
        finally:
            resolver.close()
    failed = [name for name, (addresses, _) in out.items() if addresses is None]
    assert failed == []
    assert 0 < server.dropped < 250


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("a" * 64 + ".test", "a label of 64 characters, where DNS allows 63"),
        ("abcdefghi." * 26 + "test", "a name of 264 characters, where DNS allows 253"),
    ],
    ids=["label", "name"],
)
def test_a_name_too_long_for_dns_says_what_is_too_long(
    loop: EventLoop, dns: NameServer, name: str, why: str
) -> None:
    # c-ares said only "Misformatted domain name".
    resolver = AresResolver(loop, servers=[dns.address], timeout=0.3, tries=1)
    try:
        addresses, error = resolve(resolver, loop, name)
    finally:
        resolver.close()
    assert addresses is None and error.code == "dns"
    assert error.message == f"cannot resolve {name!r}: {why}"
