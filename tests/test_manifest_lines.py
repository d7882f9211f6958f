"""A fresh run's manifest is written as rows finish (sinks/manifest_lines.py), and is
the same, line for line, as the journal's export that it saves at the end."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import swarmget
from swarmget.manifest import manifest_path
from swarmget.sinks.journal import Journal
from swarmget.sinks.manifest_lines import MAX_HELD, ManifestLines
from swarmget.testing import TestServer
from swarmget.testing.process import child_env


@pytest.fixture(scope="module")
def server() -> Iterator[TestServer]:
    with TestServer() as srv:
        yield srv


def _record(n: int) -> str:
    return json.dumps({"url": f"http://h/{n}", "status": "ok"}, separators=(",", ":"))


def test_lines_come_out_in_index_order_whatever_order_rows_finish(tmp_path: Path) -> None:
    path = str(tmp_path / "m.jsonl")
    lines = ManifestLines(path)
    order = list(range(10_000))
    random.Random(7).shuffle(order)
    for index in order:
        lines.add(index, _record(index))
    assert lines.finish()
    got = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert [r["index"] for r in got] == list(range(10_000))
    assert got[5] == {"index": 5, "url": "http://h/5", "status": "ok"}
    assert not Path(path + ".new").exists()


def test_rows_after_a_gap_that_never_finished_are_still_written(tmp_path: Path) -> None:
    path = str(tmp_path / "m.jsonl")
    lines = ManifestLines(path)
    for index in (4, 0, 2, 1):  # 3 never finished (the run was stopped)
        lines.add(index, _record(index))
    assert lines.finish()
    got = [json.loads(line)["index"] for line in Path(path).read_text().splitlines()]
    assert got == [0, 1, 2, 4]


@pytest.mark.parametrize("case", ["twice", "twice-held", "too-many-held"])
def test_anything_unusual_gives_up_and_leaves_no_file(tmp_path: Path, case: str) -> None:
    path = str(tmp_path / "m.jsonl")
    lines = ManifestLines(path)
    if case == "twice":
        lines.add(0, _record(0))
        lines.add(0, _record(0))
    elif case == "twice-held":
        lines.add(3, _record(3))
        lines.add(3, _record(3))
    else:
        for index in range(1, MAX_HELD + 2):  # row 0 holds every other one back
            lines.add(index, _record(index))
    assert not lines.active
    assert not lines.finish()
    assert not Path(path).exists() and not Path(path + ".new").exists()


def _exported(out: Path) -> list[str]:
    """The manifest as the journal's export writes it (what the lines replace)."""
    journal = Journal(str(out))
    try:
        return list(journal.records(journal.run - 1))  # as the run that wrote them
    finally:
        journal.close()


@pytest.mark.parametrize(("workers", "dedupe"), [(1, False), (2, False), (2, True)])
def test_a_fresh_runs_manifest_is_the_journals_export(
    server: TestServer, tmp_path: Path, workers: int, dedupe: bool
) -> None:
    rng = random.Random(workers)
    urls: list[object] = []
    for i in range(300):
        # Rows finish out of order (latency), some fail (404), some repeat, one is bad.
        query = {"size": 100 + i, "latency": rng.choice([0, 0, 0, 0.05])}
        if i % 37 == 0:
            query["status"] = 404
        urls.append(server.file_url(f"f{i % 250}.bin", **query))
    urls[17] = None
    report = swarmget.download(
        urls,  # type: ignore[arg-type]
        tmp_path,
        workers=workers,
        retries=0,
        dedupe=dedupe,  # the rows that repeat a URL settle when it does
    )
    assert report.ok + report.failed == 300 and report.failed >= 9
    written = Path(manifest_path(tmp_path)).read_text().splitlines()
    assert [json.loads(line)["index"] for line in written] == list(range(300))
    assert written == _exported(tmp_path)
    assert not Path(manifest_path(tmp_path) + ".new").exists()


def test_a_rerun_exports_the_manifest_and_clears_a_killed_runs_lines(
    server: TestServer, tmp_path: Path
) -> None:
    urls = [server.file_url(f"r{i}.bin", size=50) for i in range(20)]
    swarmget.download(urls[:10], tmp_path)
    stale = Path(manifest_path(tmp_path) + ".new")
    stale.write_text("left by a killed run\n")
    report = swarmget.download(urls, tmp_path)  # the journal knows 10 rows: export
    assert (report.ok, report.skipped) == (10, 10)
    written = Path(manifest_path(tmp_path)).read_text().splitlines()
    assert [json.loads(line)["index"] for line in written] == list(range(20))
    assert written == _exported(tmp_path)
    assert not stale.exists()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_stopped_by_ctrl_c_writes_the_lines_the_export_would(
    server: TestServer, tmp_path: Path, workers: int
) -> None:
    # Every seventh row stalls: rows after it finish, and wait, held, for a gap
    # that Ctrl-C leaves open.  They are written all the same, as the export does.
    urls = [
        server.file_url(f"c{workers}-{i}.bin", size=2000, latency=30 if i % 7 == 3 else 0)
        for i in range(200)
    ]
    listed = tmp_path / "urls.txt"
    listed.write_text("\n".join(urls) + "\n")
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "swarmget", str(listed), "-o", str(out), "-q"]
    argv += ["--workers", str(workers)]
    proc = subprocess.Popen(argv, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(os.listdir(out) if out.exists() else []) < 150:
        time.sleep(0.02)  # the 171 rows that do not stall are (nearly) all in
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 130, stderr.decode()
    written = Path(manifest_path(out)).read_text().splitlines()
    indexes = [json.loads(line)["index"] for line in written]
    assert 140 <= len(indexes) <= 171 and indexes == sorted(indexes)
    assert not set(indexes) & set(range(3, 200, 7))  # the stalled rows never finished
    assert written == _exported(out)
    assert not Path(manifest_path(out) + ".new").exists()
