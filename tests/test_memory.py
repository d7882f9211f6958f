"""A 1,000,000-row run stays well inside 200 MB (rows are read lazily, failures not hoarded)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from swarmget.testing.process import child_env

CHILD = """
import swarmget
report = swarmget.download(
    None, {out!r}, sources=[{urls!r}], retries=0, dns_servers=({dns!r},)
)
assert report.failed == 1_000_000, report.failed
assert report.error_counts() == {{"dns": 1_000_000}}
assert len(report.failures) == 10_000
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print(int(line.split()[1]) // 1024)
"""


@pytest.mark.slow
def test_a_million_rows_in_under_200_mb(tmp_path: Path, nxdomain_dns: str) -> None:
    urls = tmp_path / "urls.txt"
    with urls.open("w") as f:
        for i in range(1_000_000):
            f.write(f"http://host.invalid/d/img{i:07d}.jpg\n")
    out = tmp_path / "out"
    env = child_env()
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(out=str(out), urls=str(urls), dns=nxdomain_dns)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    peak_mb = int(done.stdout.strip())
    assert peak_mb < 200, f"peak RSS {peak_mb} MB"
    with (out / ".swarmget" / "manifest.jsonl").open() as manifest:
        lines = sum(1 for _ in manifest)
    assert lines == 1_000_000


def test_a_list_over_many_hosts_keeps_a_bounded_number_of_pools(tmp_path: Path) -> None:
    # Every new host made a pool that lived for the whole run (about 6 KB with a
    # TLS session), and every connect race over a host's two addresses (here
    # ::1 and 127.0.0.1) left a reference cycle holding its pool and transfer.
    import gc

    from swarmget.engine.core import Engine
    from swarmget.engine.pool import HostPool
    from swarmget.options import Options
    from swarmget.sinks.base import Assignment
    from swarmget.sinks.files import FileSink
    from swarmget.testing import TestServer
    from swarmget.testing.events import RecordedEvents

    events = RecordedEvents()
    with TestServer() as server:
        port = server.port
        rows = [
            Assignment(i, i, f"http://h{i}.localhost:{port}/files/f{i}.bin?size=10", f"f{i}")
            for i in range(1500)
        ]
        engine = Engine(FileSink(str(tmp_path)), Options(concurrency=20, per_host=2), events)
        limit = 2 * (256 + 20)  # its floor, 2 x (window + concurrency), not 4,096
        engine._pool_limit = limit
        gc.collect()
        gc.disable()  # what is left must be freed by reference counts alone
        try:
            engine.add(rows)
            engine.close_input()
            engine.run()
            assert len(engine.pools) <= limit
            # type(), not isinstance(): that would ask lazy modules (torch's) for
            # attributes they warn about.
            alive = sum(1 for o in gc.get_objects() if type(o) is HostPool)
            assert alive <= limit + 20, alive  # was one per host: 1,500
        finally:
            gc.enable()
            engine.close()
    assert sum(1 for r in events.results if r.ok) == 1500


def test_a_host_given_up_stays_given_up_when_its_pool_is_retired() -> None:
    from swarmget.engine.pool import DIRECT, HostPool, retire_idle
    from swarmget.errors import TransferError
    from swarmget.protocol.request import RequestTemplate

    def pool(i: int) -> HostPool:
        return HostPool(("http", f"h{i}", 80), RequestTemplate(f"h{i}", {}), DIRECT)

    pools = {p.origin: p for p in map(pool, range(10))}
    dead = TransferError("connect", "h3 refused 5 connects in a row")
    pools[("http", "h3", 80)].given_up = dead
    pools[("http", "h0", 80)].open = 1  # busy: stays, however old
    # Paused for a 429 (its refused row waits on a timer): stays, or the next
    # pool for the host would forget the pause.
    pools[("http", "h1", 80)].paused_until = 120.0
    given_up: dict[tuple[str, str, int], TransferError] = {}
    retire_idle(pools, 4, given_up)
    assert len(pools) == 4 and ("http", "h0", 80) in pools and ("http", "h1", 80) in pools
    assert given_up == {("http", "h3", 80): dead}
