"""The floor of the latency run: the least a Python client can do per file.

Usage::

    .venv/bin/python bench/bare_loop.py HOST PORT PATH_PREFIX FILES CONCURRENCY
        [--name img{i:06d}.jpg] [--write DIR]

One ``selectors`` loop, CONCURRENCY blocking-connected keep-alive sockets, one
request per response (``GET PATH_PREFIX/NAME``, NAME from ``--name`` with
i = 0 .. FILES-1; the default matches the bench's nginx tree), each response
read by its Content-Length and, with ``--write``, written to its own file.  No URL parsing,
no output names, no ``.part`` and rename, no manifest, no retries, no timeouts:
not a downloader, a yardstick.  Against nginx delaying every response by
100 ms (``bench/servers.py``, ``delay=0.1``) it shows how far above the ideal
the machine itself puts any client (README, "Speed").
"""

from __future__ import annotations

import argparse
import os
import re
import selectors
import socket
import time

_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("prefix", help="path before each name, e.g. /delayed")
    parser.add_argument("files", type=int)
    parser.add_argument("concurrency", type=int)
    parser.add_argument("--name", default="img{i:06d}.jpg", help="file name format (i)")
    parser.add_argument("--write", metavar="DIR", help="write each body to DIR/NAME")
    args = parser.parse_args()
    if args.write:
        os.makedirs(args.write, exist_ok=True)
    todo = list(range(args.files))[::-1]
    selector = selectors.DefaultSelector()
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    done = 0
    started = time.perf_counter()

    def next_request(sock: socket.socket, state: dict[str, int]) -> None:
        if not todo:
            selector.unregister(sock)
            sock.close()
            return
        i = todo.pop()
        name = args.name.format(i=i)
        state.update(i=i, got=0, need=-1, fd=-1)
        if args.write:
            path = os.path.join(args.write, os.path.basename(name))
            state["fd"] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        sock.send(f"GET {args.prefix}/{name} HTTP/1.1\r\nHost: {args.host}\r\n\r\n".encode())

    for _ in range(min(args.concurrency, args.files)):
        sock = socket.create_connection((args.host, args.port))
        sock.setblocking(False)
        state: dict[str, int] = {}
        selector.register(sock, selectors.EVENT_READ, state)
        next_request(sock, state)

    while done < args.files:
        for key, _ in selector.select():
            sock, state = key.fileobj, key.data
            assert isinstance(sock, socket.socket)
            n = sock.recv_into(buffer)
            if not n:
                raise SystemExit(f"server closed the connection during file {state['i']}")
            body = view[:n]
            if state["need"] < 0:  # the head is in the first read at these sizes
                head_end = bytes(view[: min(n, 4096)]).find(b"\r\n\r\n") + 4
                match = _LENGTH.search(bytes(view[:head_end]))
                assert head_end > 3 and match, "no Content-Length head in the first read"
                state["need"] = int(match.group(1))
                body = view[head_end:n]
            if state["fd"] >= 0:
                os.write(state["fd"], body)
            state["got"] += len(body)
            if state["got"] >= state["need"]:
                if state["fd"] >= 0:
                    os.close(state["fd"])
                done += 1
                next_request(sock, state)
    elapsed = time.perf_counter() - started
    print(f"{args.files} files in {elapsed:.3f} s ({args.files / elapsed:,.0f} files/s)")


if __name__ == "__main__":
    main()
