"""The journal and the planner, sans engine: claims before deals, crash recovery, ranges."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmget.engine.job import Job, Transfer, content_range_ok
from swarmget.engine.urls import split_url
from swarmget.engine.verdicts import ACCEPT, FAIL, RESTART, judge
from swarmget.errors import ErrorCode
from swarmget.options import Options
from swarmget.protocol import ResponseHead
from swarmget.protocol.request import RequestTemplate
from swarmget.report import FileResult
from swarmget.sinks.base import Assignment
from swarmget.sinks.files import FileSink, OutputError, part_path
from swarmget.sinks.journal import Journal, _logged_plans, encode, plan_log_line, storable
from swarmget.sinks.plan import FilePlanner, PlanBatch, row_key
from swarmget.sources.rows import Row
from swarmget.testing.outputs import small_tmpfs
from swarmget.testing.process import child_env, open_files


def rows(*urls: str) -> list[Row]:
    return [Row(i, url) for i, url in enumerate(urls)]


def ok(assignment: Assignment, size: int = 10) -> FileResult:
    return FileResult(
        assignment.url, assignment.path, "ok", 200, size, None, 1, 1,
        index=assignment.index, key=assignment.key,
    )  # fmt: skip


# -- commit order ------------------------------------------------------------------------------


def test_a_batch_is_claimed_in_the_plan_log_before_it_is_dealt(tmp_path: Path) -> None:
    planner = FilePlanner(str(tmp_path), Options())
    try:
        batch = planner.plan(rows("http://h/a.jpg", "http://h/b.jpg"))
        log = (tmp_path / ".swarmget" / "plans.log").read_text()
        claims = [entry for line in log.splitlines() for entry in json.loads(line)]
        assert [(c[0], c[3], c[4]) for c in claims] == [
            (a.key, a.path, True) for a in batch.assignments
        ]
        # Nothing is in the table yet: the outcome puts it there.
        assert len(planner.journal) == 0
        planner.record([ok(batch.assignments[0])])
        planner.commit()  # outcomes are written in batches, at the latest on commit
        assert len(planner.journal) == 1
    finally:
        planner.finish(interrupted=True)
    # An interrupted run keeps the claims of the rows still in flight.
    journal = Journal(str(tmp_path))
    try:
        found = journal.lookup([a.key for a in batch.assignments])
        assert {k: v.path for k, v in found.items()} == {a.key: a.path for a in batch.assignments}
    finally:
        journal.close()


def test_the_file_sink_renames_only_a_finished_part(tmp_path: Path) -> None:
    sink = FileSink(tmp_path)
    row = Assignment(0, row_key("http://h/a", None, 0), "http://h/a", "sub/a.bin")
    writer = sink.open(row, 0, 5, None)
    writer.write(b"hello")
    part = Path(part_path(str(tmp_path.resolve()), row.key))
    assert part.read_bytes() == b"hello" and not (tmp_path / "sub" / "a.bin").exists()
    writer.finish()
    assert sink.publish([(row, writer)]) == [None]
    assert (tmp_path / "sub" / "a.bin").read_bytes() == b"hello" and not part.exists()


def test_a_short_write_still_hashes_the_whole_body(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A regular file may take less than asked; what is left is written again,
    # and the checksum must still cover every byte, not only the remainder.
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, memoryview(data)[:1000]))
    body = bytes(range(256)) * 20
    writer = FileSink(tmp_path).open(
        Assignment(0, 7, "http://h/a", "a.bin"), 0, len(body), {"sha256": hashlib.sha256()}
    )
    writer.write(memoryview(body))
    writer.finish()
    assert writer.written == len(body)
    assert writer.hashers is not None
    assert writer.hashers["sha256"].hexdigest() == hashlib.sha256(body).hexdigest()


KILLED_CHILD = """
import os, sys
from swarmget.options import Options
from swarmget.sinks.plan import FilePlanner
from swarmget.sources.rows import Row
planner = FilePlanner(sys.argv[1], Options())
batch = planner.plan([Row(0, "http://h/a.jpg"), Row(1, "http://h/b.jpg")])
# The engine renamed a.jpg into place; the outcome never reached the journal.
open(os.path.join(sys.argv[1], batch.assignments[0].path), "wb").write(b"whole")
os._exit(9)  # a kill: no finish(), no commit, nothing tidied
"""


@pytest.mark.parametrize("torn_tail", [False, True])
def test_after_a_kill_a_planned_file_is_ours_not_foreign(tmp_path: Path, torn_tail: bool) -> None:
    if torn_tail:
        # A full disk (or a kill) left a line without its newline; the next
        # run appended its first claims to it, one unreadable line of both,
        # and a third run took that run's files for foreign ("exists") for good.
        state = tmp_path / ".swarmget"
        state.mkdir()
        (state / "plans.log").write_bytes(b'[[1, 0, "http://h/x.jpg", "x.jpg"')
    done = subprocess.run(
        [sys.executable, "-c", KILLED_CHILD, str(tmp_path)], env=child_env(), check=False
    )
    assert done.returncode == 9
    planner = FilePlanner(str(tmp_path), Options())
    try:
        batch = planner.plan(rows("http://h/a.jpg", "http://h/b.jpg"))
    finally:
        planner.finish(interrupted=True)
    # Not "exists": the plan log told the journal that a.jpg is ours to redo.
    assert batch.results == []
    assert [a.path for a in batch.assignments] == ["a.jpg", "b.jpg"]


def test_outcomes_go_in_as_the_run_drains_not_all_after_the_last_download(
    tmp_path: Path,
) -> None:
    planner = FilePlanner(str(tmp_path), Options())
    try:
        batch = planner.plan(rows(*(f"http://h/{i}.jpg" for i in range(1000))))
        planner.record([ok(a) for a in batch.assignments[:300]])
        # 700 rows still downloading: outcomes wait, to go in as one large batch.
        assert len(planner.journal) == 0
        planner.record([ok(a) for a in batch.assignments[300:600]])
        # 600 waiting, 400 still downloading: the run is draining, in they go
        # (they used to wait for 4,096, or the end of the run).
        assert len(planner.journal) == 600
        planner.record([ok(a) for a in batch.assignments[600:700]])
        assert len(planner.journal) == 600  # fewer than 256: not worth a batch yet
    finally:
        planner.finish(interrupted=False)


def _interrupted_at(delay: float) -> contextlib.AbstractContextManager[None]:
    """Raise KeyboardInterrupt ``delay`` seconds in, as Ctrl-C does: at whatever
    bytecode the driver runs then (parallel/interrupts.py)."""

    @contextlib.contextmanager
    def interrupt() -> Iterator[None]:
        def stop(signum: int, frame: object) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGALRM, stop)
        signal.setitimer(signal.ITIMER_REAL, delay)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    return interrupt()


def test_a_ctrl_c_while_outcomes_are_written_keeps_every_claim(tmp_path: Path) -> None:
    # Rows left the rows in flight before the table had them: a Ctrl-C in
    # between (one in two at 14,000 rows/s) lost their claims, and the rerun
    # failed each file they had published with "exists ... not downloaded by
    # swarmget".  Interrupted at several points of the write, every row ends
    # claimed and listed once, and the rerun finds every file its own.
    urls = [f"http://h/{i}.jpg" for i in range(2000)]
    calm = FilePlanner(str(tmp_path / "calm"), Options())
    batch = calm.plan(rows(*urls))
    started = time.perf_counter()
    calm.record([ok(a, 4) for a in batch.assignments])
    calm.commit()
    takes = time.perf_counter() - started
    calm.finish(interrupted=False)
    for attempt in range(5):
        out = tmp_path / str(attempt)
        planner = FilePlanner(str(out), Options())
        batch = planner.plan(rows(*urls))
        for assignment in batch.assignments[::5]:  # as the workers published them
            (out / str(assignment.path)).write_bytes(b"body")
        results = [ok(a, 4) for a in batch.assignments]
        try:
            with _interrupted_at(takes * (attempt + 1) / 6):
                planner.record(results)
                planner.commit()
                time.sleep(takes)  # the interrupt comes within the with
        except KeyboardInterrupt:
            pass
        planner.finish(interrupted=True)
        manifest = (out / ".swarmget" / "manifest.jsonl").read_text().splitlines()
        assert sorted(json.loads(line)["index"] for line in manifest) == list(range(2000))
        rerun = FilePlanner(str(out), Options())
        try:
            again = rerun.plan(rows(*urls))
        finally:
            rerun.finish(interrupted=True)
        assert [r.message for r in again.results if r.error] == []
        assert again.skipped + len(again.assignments) == 2000


def test_a_damaged_plan_log_gives_up_only_its_damaged_lines(tmp_path: Path) -> None:
    state = tmp_path / ".swarmget"
    state.mkdir()
    key = row_key("http://h/a.jpg", None, 0)
    good = json.dumps([[key, 0, "http://h/a.jpg", "a.jpg", True]]).encode()
    junk = [
        b"\x00\xff[[[ not text",  # used to stop the run with a UnicodeDecodeError
        b'{"a": 1}',
        b"[1, 2]",
        b'[[1, 0, "u", {"not": "a path"}, true]]',
        json.dumps([[1 << 70, 0, "u", "big.jpg", True]]).encode(),  # beyond SQLite's ints
        b'[[1, 0, "u"',  # torn by a kill
        b"[" * 100_000,  # nested deeper than json reads: a traceback (RecursionError)
    ]
    (state / "plans.log").write_bytes(b"\n".join([*junk, good]) + b"\n")
    (tmp_path / "a.jpg").write_bytes(b"partial")
    planner = FilePlanner(str(tmp_path), Options())
    try:
        batch = planner.plan(rows("http://h/a.jpg"))
    finally:
        planner.finish(interrupted=True)
    # The good line's claim was folded in: a.jpg is ours to redo, not foreign.
    assert batch.results == [] and [a.path for a in batch.assignments] == ["a.jpg"]


def fill_up(mount: Path) -> Path:
    """A file taking every block ``mount`` has left."""
    filler = mount / "filler"
    with contextlib.suppress(OSError), open(filler, "wb") as f:
        while True:
            f.write(b"\0" * 4096)
    return filler


def plan_again(out: Path, urls: list[str]) -> PlanBatch:
    """What a new run over ``urls`` plans in ``out`` (then stopped)."""
    again = FilePlanner(str(out), Options())
    try:
        return again.plan(rows(*urls))
    finally:
        again.finish(interrupted=True)


def test_a_plan_log_survives_a_final_commit_the_full_disk_refused(tmp_path: Path) -> None:
    """The run ends on a full disk: the last commit fails and SQLite rolls it
    back.  The plan log must stay, or the next run takes our files for foreign."""
    with small_tmpfs(tmp_path / "small", "1m") as mount:
        out = mount / "out"
        out.mkdir()
        planner = FilePlanner(str(out), Options())
        # Its room taken too (by the filler below): the commit fails even
        # when the journal's writes are redone (sinks/reserve.py).
        (out / ".swarmget" / "reserve").unlink()
        urls = [f"http://h/{i:03d}-{'x' * 120}.jpg" for i in range(60)]
        batch = planner.plan(rows(*urls))
        for a in batch.assignments:  # published, as the engine would have
            (out / a.path).write_bytes(b"body")
        filler = fill_up(mount)
        with pytest.raises(OutputError):
            planner.record([ok(a, 4) for a in batch.assignments])
            planner.finish(interrupted=False)
        assert (out / ".swarmget" / "plans.log").stat().st_size > 0
        filler.unlink()
        redo = plan_again(out, urls)
        # Every file is known as ours (redone), none is called foreign.
        assert [r.error for r in redo.results] == []
        assert [a.path for a in redo.assignments] == [a.path for a in batch.assignments]


def test_the_reserve_lets_the_last_commit_through_a_full_disk(tmp_path: Path) -> None:
    """As above, with room for a reserve at the start: the rolled-back commit is
    written again on its room, and the rows are on record, not redone."""
    with small_tmpfs(tmp_path / "small", "2m") as mount:
        out = mount / "out"
        out.mkdir()
        planner = FilePlanner(str(out), Options())
        assert (out / ".swarmget" / "reserve").stat().st_size > 0
        urls = [f"http://h/{i:03d}-{'x' * 120}.jpg" for i in range(60)]
        batch = planner.plan(rows(*urls))
        for a in batch.assignments:
            (out / a.path).write_bytes(b"body")
        filler = fill_up(mount)
        planner.record([ok(a, 4) for a in batch.assignments])
        planner.commit()  # meets the full disk: redone on the reserve's room
        planner.finish(interrupted=False)
        assert not (out / ".swarmget" / "reserve").exists()
        filler.unlink()
        redo = plan_again(out, urls)
        assert (redo.assignments, redo.results, redo.skipped) == ([], [], 60)  # done before


def test_a_run_whose_journal_spent_its_reserve_is_told_to_stop(tmp_path: Path) -> None:
    """A commit that met the full disk mid-run went through on the reserve's room.
    The run must stop then: downloading on spent the rest of that room on new
    files, the last commit failed, and the rerun fetched again every file done
    since the commit before (test_robustness's full-disk rerun, 1 run in ~90)."""
    with small_tmpfs(tmp_path / "small", "2m") as mount:
        out = mount / "out"
        out.mkdir()
        planner = FilePlanner(str(out), Options())
        urls = [f"http://h/{i:03d}-{'x' * 120}.jpg" for i in range(60)]
        batch = planner.plan(rows(*urls))
        planner.record([ok(a, 4) for a in batch.assignments[:30]])
        planner.commit()
        assert planner.out_of_room() is None  # room enough: nothing to stop for
        for a in batch.assignments:
            (out / a.path).write_bytes(b"body")
        filler = fill_up(mount)
        planner.record([ok(a, 4) for a in batch.assignments[30:]])
        planner.commit()  # meets the full disk: redone on the reserve's room
        stop = planner.out_of_room()
        assert stop is not None and stop.fatal and "No space left" in str(stop)
        planner.finish(interrupted=False)
        filler.unlink()
        redo = plan_again(out, urls)
        assert (redo.assignments, redo.results, redo.skipped) == ([], [], 60)


def test_the_reserve_is_the_manifests_room_once_the_last_commit_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It was freed only after the manifest was written: a disk with room for
    # the manifest but not for both failed the run ("cannot write the manifest").
    import swarmget
    from swarmget.sinks import plan as plan_module

    if swarmget.compiled():
        pytest.skip("plan.py is compiled: its call of write_manifest cannot be wrapped")
    first = FilePlanner(str(tmp_path), Options())
    first.record([ok(a, 4) for a in first.plan(rows("http://h/a.jpg")).assignments])
    first.finish(interrupted=False)  # its manifest was written as rows finished
    planner = FilePlanner(str(tmp_path), Options())  # over a journal: rewritten at the end
    reserve = tmp_path / ".swarmget" / "reserve"
    assert reserve.exists()
    seen: list[bool] = []
    real = plan_module.write_manifest
    monkeypatch.setattr(
        plan_module, "write_manifest", lambda *a: (seen.append(reserve.exists()), real(*a))
    )
    planner.record([ok(a, 4) for a in planner.plan(rows("http://h/b.jpg")).assignments])
    planner.finish(interrupted=False)
    assert seen == [False]


def test_a_journal_on_a_full_disk_says_the_disk_is_full(tmp_path: Path) -> None:
    # SQLite called it "disk I/O error", and the user was left to guess.
    with small_tmpfs(tmp_path / "small", "1m") as mount:
        out = mount / "out"
        out.mkdir()
        FilePlanner(str(out), Options()).finish(interrupted=False)
        fill_up(mount)
        with pytest.raises(OutputError) as info:
            FilePlanner(str(out), Options())
        assert info.value.message.endswith(("(no space left on the disk)", "disk is full"))


def test_a_journal_opened_on_a_nearly_full_disk_opens_or_says_the_disk_is_full(
    tmp_path: Path,
) -> None:
    # Opening writes outside a transaction; one that met the full disk was
    # redone in a transaction left open, and the run failed with "cannot start
    # a transaction within a transaction" (about 400 KiB free, the reserve taken).
    opened = 0
    descriptors = len(open_files())
    for left in range(300, 540, 20):
        with small_tmpfs(tmp_path / f"small{left}", "2m") as mount:
            out = mount / "out"
            out.mkdir()
            room = os.statvfs(mount)
            (mount / "filler").write_bytes(b"\0" * (room.f_bavail * room.f_frsize - left * 1024))
            try:
                planner = FilePlanner(str(out), Options())
            except OutputError as exc:
                assert exc.message.endswith(("disk is full", "(no space left on the disk)")), left
                continue
            opened += 1
            try:
                assert len(planner.plan(rows("http://h/a.jpg")).assignments) == 1
            finally:
                planner.finish(interrupted=True)
    assert opened
    assert len(open_files()) == descriptors  # an open that failed left none open


def test_a_new_journal_appends_its_rows_and_finds_them_by_key(tmp_path: Path) -> None:
    # Stored by key (a hash, the row id of schemas 1-3), each row went to a
    # random page: past the page cache, every row read and wrote a page of its
    # own (sinks/journal.py).  Rows are appended now (row ids 1, 2, ...).
    planner = FilePlanner(str(tmp_path), Options())
    urls = [f"http://h/{i}.jpg" for i in range(300)]
    planner.record([ok(a) for a in planner.plan(rows(*urls)).assignments])
    planner.finish(interrupted=False)
    journal = tmp_path / ".swarmget" / "journal.sqlite3"
    with contextlib.closing(sqlite3.connect(journal)) as db:
        ids = [rowid for (rowid,) in db.execute("SELECT rowid FROM rows ORDER BY rowid")]
    assert ids == list(range(1, 301))
    for i in range(300):
        (tmp_path / f"{i}.jpg").write_bytes(b"0123456789")  # published, as the engine would
    planner = FilePlanner(str(tmp_path), Options())
    try:
        assert planner.plan(rows(*urls)).skipped == 300  # each found by its key
    finally:
        planner.finish(interrupted=True)


def test_a_journal_of_the_schema_before_gains_the_total_column(tmp_path: Path) -> None:
    planner = FilePlanner(str(tmp_path), Options())
    planner.record([ok(a) for a in planner.plan(rows("http://h/a.jpg")).assignments])
    planner.finish(interrupted=False)
    (tmp_path / "a.jpg").write_bytes(b"0123456789")  # published, as the engine would have
    journal = tmp_path / ".swarmget" / "journal.sqlite3"
    # The table as schema 2 made it, keyed by `key` (journals made before rows
    # were stored in insertion order still are): both layouts must work.
    with contextlib.closing(sqlite3.connect(journal)) as db:
        db.executescript(
            "CREATE TABLE old (key INTEGER PRIMARY KEY, run INTEGER NOT NULL, "
            "idx INTEGER NOT NULL, path TEXT, mine INTEGER NOT NULL, status INTEGER NOT NULL, "
            "bytes INTEGER NOT NULL DEFAULT 0, validator TEXT, record TEXT);"
            "INSERT INTO old SELECT key, run, idx, path, mine, status, bytes, validator, record "
            "FROM rows; DROP TABLE rows; ALTER TABLE old RENAME TO rows;"
            "CREATE INDEX rows_path ON rows (path);"
        )
    planner = FilePlanner(str(tmp_path), Options())
    try:
        batch = planner.plan(rows("http://h/a.jpg", "http://h/b.jpg"))
    finally:
        planner.finish(interrupted=True)
    assert (batch.skipped, [a.path for a in batch.assignments]) == (1, ["b.jpg"])


def test_a_validator_that_outlived_its_part_is_void_before_the_row_goes_out_again(
    tmp_path: Path,
) -> None:
    # The part was dropped (small, or a failed check), its validator kept: the
    # next run's body (another version) went to a new part, and a SIGKILL
    # before its own validator was recorded left the old one beside it; the
    # run after resumed that part with it, splicing two versions.
    url = "http://h/big.bin"
    planner = FilePlanner(str(tmp_path), Options())
    (first,) = planner.plan(rows(url)).assignments
    planner.partial(first.key, '"e1"', 2 << 20)
    cut = FileResult(
        url, None, "failed", 200, 0, "truncated", 1, 1, index=0, key=first.key
    )  # fmt: skip
    planner.record([cut])
    planner.finish(interrupted=False)
    journal = tmp_path / ".swarmget" / "journal.sqlite3"

    def recorded() -> tuple[object, object]:
        with contextlib.closing(sqlite3.connect(journal)) as db:
            return db.execute("SELECT validator, total FROM rows").fetchone()

    assert recorded() == ('"e1"', 2 << 20)
    planner = FilePlanner(str(tmp_path), Options())  # no part on disk
    try:
        (again,) = planner.plan(rows(url)).assignments
        assert (again.resume_from, again.validator) == (0, None)
        assert recorded() == (None, None)  # committed before the row goes out
    finally:
        planner.finish(interrupted=True)


def test_a_damaged_journal_says_what_to_do(tmp_path: Path) -> None:
    planner = FilePlanner(str(tmp_path), Options())
    planner.finish(interrupted=False)
    journal = tmp_path / ".swarmget" / "journal.sqlite3"
    journal.write_bytes(b"\x13" * 8192)
    with pytest.raises(OutputError, match=r"the journal is damaged: remove it"):
        FilePlanner(str(tmp_path), Options())


def test_a_database_of_another_program_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    # It was taken for a journal: swarmget's tables were added to it, its
    # journal mode turned to WAL, and the run went on as if the journal were lost.
    state = tmp_path / ".swarmget"
    state.mkdir()
    journal = state / "journal.sqlite3"
    with contextlib.closing(sqlite3.connect(journal)) as db:
        db.executescript("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);")
    with pytest.raises(OutputError, match=r"not a swarmget journal \(its tables: users\); move"):
        FilePlanner(str(tmp_path), Options())
    with contextlib.closing(sqlite3.connect(journal)) as db:
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == [("users",)]
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)


@pytest.mark.parametrize("schema", [1, 99])
def test_a_journal_without_the_columns_we_write_names_its_version(
    tmp_path: Path, schema: int
) -> None:
    # Schema 1 (and a future layout) has no `record` column: the run began,
    # and stopped at its first outcome ("table rows has no column named
    # record"), or at the plan log's fold ("NOT NULL constraint failed").
    planner = FilePlanner(str(tmp_path), Options())
    planner.finish(interrupted=False)
    journal = tmp_path / ".swarmget" / "journal.sqlite3"
    with contextlib.closing(sqlite3.connect(journal)) as db:
        db.executescript(
            f"UPDATE meta SET value={schema} WHERE name='schema'; DROP TABLE rows;"
            "CREATE TABLE rows (key BLOB NOT NULL UNIQUE, run INTEGER NOT NULL, "
            "idx INTEGER NOT NULL, url TEXT NOT NULL, path TEXT, mine INTEGER NOT NULL, "
            "status INTEGER NOT NULL, bytes INTEGER NOT NULL DEFAULT 0, validator TEXT);"
        )
    wanted = rf"lack the columns record: another version of swarmget wrote it \(schema {schema};"
    with pytest.raises(OutputError, match=wanted):
        FilePlanner(str(tmp_path), Options())


def test_a_directory_in_place_of_the_journal_says_so_and_lets_the_output_dir_go(
    tmp_path: Path,
) -> None:
    # SQLite said "unable to open database file"; and the lock on the output
    # dir stayed held, so the next try in the same program was told another
    # swarmget run was using it.
    (tmp_path / ".swarmget" / "journal.sqlite3").mkdir(parents=True)
    for _ in range(2):
        with pytest.raises(OutputError, match=r"journal.sqlite3 is not a file, so it cannot be"):
            FilePlanner(str(tmp_path), Options())


def test_a_name_earlier_runs_took_many_times_is_found_free_in_log_lookups(
    tmp_path: Path,
) -> None:
    # The suffix count starts cold in each run: with image.jpg, image-1.jpg ...
    # image-N.jpg taken before, the next one took N queries; now log(N).
    copies = 3000
    planner = FilePlanner(str(tmp_path), Options())
    try:
        for start in range(0, copies, 256):
            batch = planner.plan(
                [Row(i, f"http://h{i}/image.jpg") for i in range(start, min(start + 256, copies))]
            )
            planner.record([ok(a) for a in batch.assignments])
    finally:
        planner.finish(interrupted=False)
    planner = FilePlanner(str(tmp_path), Options())
    queries: list[str] = []
    planner.journal._db.set_trace_callback(queries.append)
    try:
        batch = planner.plan([Row(0, "http://new/image.jpg"), Row(1, "http://new2/image.jpg")])
    finally:
        planner.journal._db.set_trace_callback(None)
        planner.finish(interrupted=True)
    assert [a.path for a in batch.assignments] == ["image-3000.jpg", "image-3001.jpg"]
    assert len(queries) < 60, len(queries)  # was more than 3,000


def test_names_taken_in_an_earlier_run_stay_taken(tmp_path: Path) -> None:
    planner = FilePlanner(str(tmp_path), Options())
    first = planner.plan(rows("http://x/photo.jpg"))
    planner.record([ok(first.assignments[0])])
    planner.finish(interrupted=False)
    (tmp_path / "photo.jpg").write_bytes(b"0123456789")
    planner = FilePlanner(str(tmp_path), Options())
    try:
        second = planner.plan(rows("http://y/photo.jpg", "http://x/photo.jpg"))
    finally:
        planner.finish(interrupted=True)
    assert [a.path for a in second.assignments] == ["photo-1.jpg"]  # x's row is skipped
    assert second.skipped == 1


def test_a_journal_on_a_full_disk_is_a_fatal_io_error(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "tiny", "64k") as mount:
        from swarmget.sinks.files import OutputError

        with pytest.raises(OutputError) as info:
            planner = FilePlanner(str(mount), Options())
            try:
                for start in range(0, 20_000, 256):
                    batch = planner.plan(
                        [Row(i, f"http://h/{i}.jpg") for i in range(start, start + 256)]
                    )
                    planner.record([ok(a) for a in batch.assignments])
                    planner.commit()
            finally:
                planner.finish(interrupted=True)
        assert info.value.code == ErrorCode.IO and info.value.fatal


# -- range planning ----------------------------------------------------------------------------


def _transfer(start: int = 0, end: int | None = None) -> Transfer:
    url = "https://h.test/big.bin"
    return Transfer(Job(Assignment(0, 1, url, "big.bin"), split_url(url)), start, end)


def _head(status: int, **headers: str) -> ResponseHead:
    fields = {k.replace("_", "-").encode(): v.encode() for k, v in headers.items()}
    length = fields.get(b"content-length")
    return ResponseHead(status, fields, int(length) if length else None, False, True)


@pytest.mark.parametrize(
    ("value", "start", "end", "answer"),
    [
        (b"bytes 100-199/200", 100, None, True),
        (b"bytes 100-199/*", 100, None, True),
        (b"bytes 100-149/200", 100, None, False),  # "to the end" but stops short
        (b"bytes 100-149/200", 100, 150, True),  # a middle range
        (b"bytes 100-199/200", 100, 300, True),  # the entity is shorter than asked
        (b"bytes 100-149/200", 100, 160, False),
        (b"bytes 101-199/200", 100, None, False),
        (b"bytes 100-99/200", 100, None, False),
        (b"bytes 100-200/200", 100, None, False),  # past the end
        (b"bytes */200", 100, None, False),
        (b"pages 100-199/200", 100, None, False),
        (b"BYTES 100-199/200", 100, None, True),  # units are case-blind (RFC 9110 14.1)
        (b"Bytes 100-199/*", 100, None, True),
        (None, 100, None, False),
    ],
)
def test_content_range_answers_the_range_asked(
    value: bytes | None, start: int, end: int | None, answer: bool
) -> None:
    assert content_range_ok(value, start, end) is answer


def test_a_range_renders_with_its_validator() -> None:
    template = RequestTemplate("h.test", {"User-Agent": "t"})
    whole = template.render("/big.bin")
    assert whole == b"GET /big.bin HTTP/1.1\r\nHost: h.test\r\nUser-Agent: t\r\n\r\n"
    transfer = _transfer(100, 150)
    assert transfer.range_header() == "bytes=100-149"
    assert _transfer(100).range_header() == "bytes=100-"
    ranged = template.render("/big.bin", byte_range="bytes=100-149", validator='"v1"')
    assert ranged.endswith(b'Range: bytes=100-149\r\nIf-Range: "v1"\r\n\r\n')


def test_verdicts_on_ranged_answers() -> None:
    options = Options()
    accept = judge(_transfer(100), _head(206, content_range="bytes 100-199/200"), options)
    assert (accept.kind, accept.start) == (ACCEPT, 100)
    whole = judge(_transfer(100), _head(200, content_length="200"), options)
    assert (whole.kind, whole.start) == (ACCEPT, 0)  # the server sent it all again
    other = judge(_transfer(100), _head(206, content_range="bytes 0-9/200"), options)
    assert other.kind == RESTART
    unasked = judge(_transfer(0), _head(206, content_range="bytes 0-9/200"), options)
    assert (unasked.kind, unasked.error and unasked.error.code) == (FAIL, ErrorCode.PROTOCOL)
    too_big = judge(
        _transfer(100),
        _head(206, content_range="bytes 100-199/200", content_length="100"),
        Options(max_size=150),
    )
    assert (too_big.kind, too_big.error and too_big.error.code) == (FAIL, ErrorCode.TOO_LARGE)


def test_an_unquoted_etag_is_no_validator_and_a_strong_last_modified_is() -> None:
    # "ETag: e1" (no quotes) was taken as the validator, then compared as a
    # Last-Modified: every 206 was refused and the file fetched twice.
    from swarmget.engine.verdicts import resume_validator

    dates = {
        "last_modified": "Mon, 02 Jan 2023 00:00:00 GMT",
        "date": "Tue, 03 Jan 2023 00:00:00 GMT",
    }
    assert resume_validator(_head(200, etag="e1", **dates)) == dates["last_modified"]
    assert resume_validator(_head(200, etag='"e1"', **dates)) == '"e1"'
    assert resume_validator(_head(200, etag='W/"e1"')) is None


@pytest.mark.parametrize(
    "last_modified",
    [
        "Mon, 02 Jan 2023 00:00:00 GMT",
        "Monday, 02-Jan-23 00:00:00 GMT",  # RFC 850's form
        "Mon Jan  2 00:00:00 2023",  # asctime's: no zone, GMT all the same
        "Mon, 02 Jan 2023 00:00:00 -0000",
    ],
)
def test_a_last_modified_in_any_of_the_http_date_forms_is_a_validator(last_modified: str) -> None:
    # RFC 9110 5.6.7: a recipient reads all three forms, all GMT.  asctime's (and
    # "-0000") parsed to a naive datetime, which could not be compared with the
    # Date's: no validator, and a cut body was fetched again from zero.
    from swarmget.engine.retry import parse_http_date
    from swarmget.engine.verdicts import resume_validator

    head = _head(200, last_modified=last_modified, date="Tue, 03 Jan 2023 00:00:00 GMT")
    assert resume_validator(head) == last_modified
    when = parse_http_date(last_modified.encode())
    assert when is not None and when.timestamp() == 1672617600


def test_a_416_says_the_part_is_whole_only_of_the_same_version_and_within_the_limits() -> None:
    def kept(total: int | None = None) -> Transfer:
        url = "http://h.test/big.bin"
        row = Assignment(0, 1, url, "big.bin", resume_from=100, validator='"v1"', total=total)
        return Transfer(Job(row, split_url(url)), 100)

    whole = _head(416, content_range="bytes */100")
    assert judge(kept(), whole, Options()).kind == ACCEPT
    assert judge(kept(100), whole, Options()).kind == ACCEPT
    # Another version's 416 (a server that ignores If-Range): not our part's.
    other = _head(416, content_range="bytes */100", etag='"v2"')
    assert judge(kept(), other, Options()).kind == RESTART
    # An earlier run was told the file has 300 bytes: 100 is not all of it.
    assert judge(kept(300), whole, Options()).kind == RESTART
    # Whole, and over --max-size: refused as a 206 or a 200 would be.
    limited = judge(kept(), whole, Options(max_size=50))
    assert (limited.kind, limited.error and limited.error.code) == (FAIL, ErrorCode.TOO_LARGE)


@given(
    url=st.text(min_size=1, max_size=40),
    path=st.text(min_size=1, max_size=20),
    numbers=st.tuples(*(st.integers(0, 1 << 40) for _ in range(3))),
    http_status=st.integers(100, 599),
)
def test_the_quick_record_of_an_ok_row_is_the_encoders(
    url: str, path: str, numbers: tuple[int, int, int], http_status: int
) -> None:
    size, attempts, elapsed = numbers
    result = FileResult(
        url, path, "ok", http_status, size, None, attempts, elapsed, index=3, key=4
    )  # fmt: skip
    record = result.to_json()
    del record["index"]
    if url.isascii():  # the quick path's rows; the others go through the encoder itself
        assert encode(result) == json.dumps(record, ensure_ascii=False, separators=(",", ":"))
    assert json.loads(encode(result)) == {**record, "url": storable(url)}


@given(
    st.lists(
        st.tuples(
            st.integers(-(1 << 63), (1 << 63) - 1),
            st.integers(0, 1 << 40),
            st.text(max_size=30),
            st.one_of(st.none(), st.text(max_size=30).map(storable)),
            st.booleans(),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_a_plan_log_line_reads_back_as_the_plans_without_their_urls(
    plans: list[tuple[int, int, str, str | None, bool]],
) -> None:
    line = plan_log_line(plans)
    assert json.loads(line) == [[k, i, None, p, m] for k, i, _u, p, m in plans]
    folded = _logged_plans(line.encode("utf-8", "surrogatepass"))
    assert folded == [(k, i, p, m) for k, i, _u, p, m in plans]


def test_a_url_with_a_nul_cannot_take_another_rows_identity() -> None:
    # "U\x005:p.bin\x000" as a plain URL hashed to the key of (U, "p.bin", 0):
    # two rows, one record, one part file.
    url = "http://h/a.jpg"
    pairs = [
        ((url, "p.bin", 0), (f"{url}\x005:p.bin\x000", None, 0)),
        ((url, None, 1), (f"{url}\x000:\x001", None, 0)),
        ((url, "p.bin", 0), (f"{url}\x005:p.bin", None, 0)),
    ]
    for first, second in pairs:
        assert row_key(*first) != row_key(*second)
    keys = {row_key(f"{url}\x00{n}", path, 0) for n in range(3) for path in (None, "x")}
    assert len(keys) == 6


def test_each_row_is_keyed_by_its_occurrence_whether_its_batch_is_all_new_or_not(
    tmp_path: Path,
) -> None:
    # A fresh run plans a batch of identities it has never seen without asking
    # the journal; a batch with a repeat (inside it, or of an earlier batch)
    # goes the long way.  Both must give the keys a rerun will look up.
    planner = FilePlanner(str(tmp_path), Options())
    batches = [
        ["http://h/a", "http://h/b"],  # all new
        ["http://h/a", "http://h/e"],  # a repeat of the first batch
        ["http://h/c", "http://h/c", "http://h/d"],  # a repeat inside the batch
        ["http://h/f"],  # all new again, after repeats
        ["http://h/a"],
    ]
    index, keys, expected = 0, [], []
    seen: dict[str, int] = {}
    for urls in batches:
        batch = [Row(index + i, url) for i, url in enumerate(urls)]
        index += len(urls)
        keys += [a.key for a in planner.plan(batch).assignments]
        for url in urls:
            expected.append(row_key(url, None, seen.get(url, 0)))
            seen[url] = seen.get(url, 0) + 1
    planner.finish(interrupted=True)
    assert keys == expected
    assert len(set(keys)) == len(keys)


def test_a_repeat_inside_a_fresh_runs_first_batch_is_its_second_occurrence(
    tmp_path: Path,
) -> None:
    planner = FilePlanner(str(tmp_path), Options())
    batch = planner.plan(rows("http://h/c", "http://h/c", "http://h/d"))
    planner.finish(interrupted=True)
    keys = [a.key for a in batch.assignments]
    assert keys == [row_key("http://h/c", None, n) for n in (0, 1)] + [
        row_key("http://h/d", None, 0)
    ]
    assert [a.path for a in batch.assignments] == ["c", "c-1", "d"]
