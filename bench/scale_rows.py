"""Memory and start-up against the length of the list (issue 13, part 6).

Usage::

    .venv/bin/python bench/scale_rows.py --rows 10000000 [--workers 2]

Every URL is on a host whose name does not resolve (a name server on loopback
answers NXDOMAIN), so each row fails fast with ``dns`` and what is measured is
swarmget's own bookkeeping: reading, planning, the journal, dealing to the
workers, recording, the manifest.  Two runs of the CLI on the same list:

1. the first run: wall time, rows/s, and the peak memory of the whole process
   tree (the sum of the processes' RSS, sampled every 50 ms);
2. a rerun against the journal the first one left (every row failed, so every
   row is redone): how long after the start the first request goes out (the
   first DNS query reaching our name server), and the same peak memory.

Goals: the whole tree under 200 MB at 10 million rows; the rerun's first
request within 10 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swarmget.testing.daemons import proc_stat
from swarmget.testing.dns import nxdomain_server
from swarmget.testing.process import child_env

SAMPLE = 0.05  # seconds between memory samples


def tree_rss_kb(pid: int) -> int:
    """RSS of ``pid`` and all its descendants, in KiB."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = proc_stat(int(entry))
        if fields is not None:
            parents[int(entry)] = int(fields[1])
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE") // 1024
    family = {pid}
    grew = True
    while grew:
        grew = False
        for child, parent in parents.items():
            if parent in family and child not in family:
                family.add(child)
                grew = True
    return sum(rss.get(p, 0) for p in family)


def run(argv: list[str], queries: list[float]) -> tuple[float, int, float | None]:
    """Wall time, peak tree RSS (KiB), and seconds until the first DNS query."""
    before = len(queries)
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=child_env(), stdout=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss_kb(proc.pid))
        time.sleep(SAMPLE)
    wall = time.monotonic() - started
    first = queries[before] - started if len(queries) > before else None
    return wall, peak, first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="swarmget-scale-", dir="/dev/shm"))
    try:
        urls = work / "urls.txt"
        with urls.open("w") as out:
            for i in range(args.rows):
                out.write(f"http://nowhere.invalid/d/{i // 1000:05d}/img{i:08d}.jpg\n")
        with nxdomain_server() as (dns, queries):
            argv = [
                sys.executable, "-m", "swarmget", str(urls), "-o", str(work / "out"), "-q",
                "--retries", "0", "--workers", str(args.workers), "--dns-server", dns,
            ]  # fmt: skip
            first = run(argv, queries)
            again = run(argv, queries)
        journal = (work / "out" / ".swarmget" / "journal.sqlite3").stat().st_size
        lines = sum(1 for _ in (work / "out" / ".swarmget" / "manifest.jsonl").open())
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"rows: {args.rows:,}; workers: {args.workers}; journal {journal / 1e6:.0f} MB; "
          f"manifest {lines:,} lines")  # fmt: skip
    print("| run | wall s | rows/s | peak tree RSS MiB | first request after s |")
    print("|---|--:|--:|--:|--:|")
    for name, (wall, peak, first_query) in (("first", first), ("rerun", again)):
        when = f"{first_query:.3f}" if first_query is not None else "-"
        print(f"| {name} | {wall:.1f} | {args.rows / wall:,.0f} | {peak / 1024:.0f} | {when} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
