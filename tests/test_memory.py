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
