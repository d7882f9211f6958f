"""A name server on loopback that answers NXDOMAIN to everything (tests, benchmarks).

Tests that need a name to fail use it (``dns_servers=(address,)``) rather than
the machine's resolver, so nothing sends DNS off this host.  It also notes when
each query arrived: the bench uses that to time a run's first request.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator


@contextlib.contextmanager
def nxdomain_server() -> Iterator[tuple[str, list[float]]]:
    """Yields the server's ``IP:PORT`` and the list of query arrival times (monotonic)."""
    from dnslib import RCODE, DNSRecord  # the test extra's; only this server needs it

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    seen: list[float] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                data, peer = sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            seen.append(time.monotonic())
            with contextlib.suppress(Exception):  # a malformed query gets no answer
                reply = DNSRecord.parse(data).reply()
                reply.header.rcode = RCODE.NXDOMAIN
                sock.sendto(reply.pack(), peer)

    thread = threading.Thread(target=serve, name="nxdomain-dns", daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}", seen
    finally:
        stop.set()
        thread.join()
        sock.close()
