"""``python -m swarmget.testing --port 0 [--latency S]``: serve until SIGTERM/SIGINT.

Prints the base URL (``http://127.0.0.1:PORT``) as its only line of stdout once
it is listening; ``ProcessServer`` waits for that line.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal

from swarmget.testing.content import DEFAULT_SIZE
from swarmget.testing.server import BACKLOG, close_listener, open_listener, raise_fd_limit
from swarmget.testing.state import ServerState


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swarmget.testing", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument("--latency", type=float, default=0.0, help="default delay for /files")
    parser.add_argument("--default-size", type=int, default=DEFAULT_SIZE)
    parser.add_argument("--backlog", type=int, default=BACKLOG)
    parser.add_argument(
        "--exit-on-stdin-eof",
        action="store_true",
        help="also stop when stdin closes (so a parent that dies takes the server with it)",
    )
    args = parser.parse_args(argv)
    raise_fd_limit()
    state = ServerState(latency=args.latency, default_size=args.default_size)
    asyncio.run(_serve(state, args.host, args.port, args.backlog, args.exit_on_stdin_eof))
    return 0


async def _serve(state: ServerState, host: str, port: int, backlog: int, watch_stdin: bool) -> None:
    server = await open_listener(state, host, port, backlog)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if watch_stdin:

        def stdin_readable() -> None:
            if not os.read(0, 4096):
                loop.remove_reader(0)
                stop.set()

        loop.add_reader(0, stdin_readable)
    # Everything allocated so far lives forever; keep the collector off it.
    gc.freeze()
    bound = server.sockets[0].getsockname()
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    print(f"http://{shown}:{bound[1]}", flush=True)
    try:
        await stop.wait()
    finally:
        await close_listener(server, state)


if __name__ == "__main__":
    raise SystemExit(main())
