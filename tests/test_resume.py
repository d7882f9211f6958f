"""Reruns resume; large files continue with Range; integrity checks; safety."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import swarmget
import swarmget.sinks.noreplace
from swarmget.sinks.journal import LOCK_NAME
from swarmget.sources.rows import Row
from swarmget.testing import RouteHandler, ScriptedConnection, TestServer, expected_body
from swarmget.testing.outputs import part_for, parts, small_tmpfs
from swarmget.testing.process import child_env, open_files

MiB = 1 << 20


@pytest.fixture(scope="module")
def server() -> Iterator[TestServer]:
    with TestServer() as srv:
        yield srv


def run(urls: list[Any], out: Path, **options: Any) -> swarmget.Report:
    options.setdefault("retries", 0)
    return swarmget.download(urls, out, **options)


def journal(out: Path) -> list[dict[str, Any]]:
    text = (out / ".swarmget" / "manifest.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def range_requests(server: TestServer, since: int = 0) -> list[bytes]:
    return [r for r in server.requests[since:] if b"\r\nrange:" in r.lower()]


def test_rerun_skips_completed_rows_and_overwrite_redoes_them(
    server: TestServer, out_dir: Path
) -> None:
    urls = [server.file_url(f"s{i}.bin", size=1000 + i) for i in range(50)]
    assert run(urls, out_dir).ok == 50
    server.reset_stats()
    again = run(urls, out_dir)
    assert (again.ok, again.failed, again.skipped) == (0, 0, 50)
    assert server.stats.requests == 0
    records = journal(out_dir)
    assert len(records) == 50 and {r["status"] for r in records} == {"ok"}
    redo = run(urls, out_dir, overwrite=True)
    assert (redo.ok, redo.skipped) == (50, 0)
    assert len(journal(out_dir)) == 50  # compacted: one line per URL


def test_a_symlink_in_place_of_a_done_file_is_replaced_not_skipped(
    server: TestServer, out_dir: Path, tmp_path: Path
) -> None:
    url = server.file_url("ln.bin", size=1000)
    assert run([url], out_dir).ok == 1
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x" * 1000)  # the same size: a size check alone passes it
    (out_dir / "ln.bin").unlink()
    (out_dir / "ln.bin").symlink_to(outside)
    again = run([url], out_dir)
    assert (again.ok, again.skipped) == (1, 0)
    assert not (out_dir / "ln.bin").is_symlink()
    assert (out_dir / "ln.bin").read_bytes() == expected_body("ln.bin", 1000)
    assert outside.read_bytes() == b"x" * 1000


def test_dedupe_lends_no_symlink_put_in_place_of_an_earlier_runs_file(
    server: TestServer, out_dir: Path, tmp_path: Path
) -> None:
    # An earlier run's file of the URL, replaced by a symlink to a file of the
    # same size outside the output dir, was still lent to a new row of that URL:
    # its "copy" was a hard link to the symlink, recorded ok and "linked", and
    # reading it read the file outside.
    url = server.file_url("lent.bin", size=6)
    assert run([url], out_dir, dedupe=True).ok == 1
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"SECRET")  # the same size: a size check alone passes it
    (out_dir / "lent.bin").unlink()
    (out_dir / "lent.bin").symlink_to(outside)
    again = run([f"{url}#again"], out_dir, dedupe=True)  # the same request, a new row
    assert (again.ok, again.failed) == (1, 0)
    (record,) = [r for r in journal(out_dir) if r["index"] == 0]
    copy = out_dir / record["path"]
    assert not copy.is_symlink()
    assert copy.read_bytes() == expected_body("lent.bin", 6)
    assert outside.read_bytes() == b"SECRET"


def _claims(out: Path) -> dict[str, tuple[int, int, int]]:
    """The journal's rows by path: (key, index, mine)."""
    with contextlib.closing(sqlite3.connect(out / ".swarmget" / "journal.sqlite3")) as db:
        found = db.execute("SELECT path, key, idx, mine FROM rows").fetchall()
    return {path: (key, index, mine) for path, key, index, mine in found}


def test_a_file_put_where_a_failed_row_would_go_is_left_to_its_owner(
    server: TestServer, out_dir: Path
) -> None:
    # A row failed (404); its file was fetched another way and put where the
    # row's file goes.  The rerun took the failed row's claim for a file of
    # its own, removed the file and asked again (404 again: the file lost).
    url = server.file_url("missing.bin", size=10, status=404)
    assert run([url], out_dir).failed == 1
    (out_dir / "missing.bin").write_bytes(b"the user's")
    (failure,) = run([url], out_dir).failures
    assert failure.error == "exists"
    assert (out_dir / "missing.bin").read_bytes() == b"the user's"


def test_a_failed_overwrite_of_a_foreign_file_leaves_it_foreign(
    server: TestServer, out_dir: Path
) -> None:
    # --overwrite over a file swarmget did not write, and the download fails:
    # the file is still there, still not ours.  Its record said ours, and the
    # next run (without --overwrite) removed it.
    url = server.file_url("theirs.bin", size=10, status=404)
    (out_dir / "theirs.bin").write_bytes(b"theirs")
    assert run([url], out_dir, overwrite=True).failed == 1
    (failure,) = run([url], out_dir).failures
    assert failure.error == "exists"
    assert (out_dir / "theirs.bin").read_bytes() == b"theirs"


def test_a_failed_overwrite_of_our_own_file_leaves_it_ours(
    server: TestServer, out_dir: Path
) -> None:
    answers = [200]

    def answer(head: bytes, conn: ScriptedConnection) -> None:
        status = b"200 OK" if answers[0] == 200 else b"404 Not Found"
        conn.send(b"HTTP/1.1 " + status + b"\r\nContent-Length: 4\r\n\r\nmine")

    with server.routed("/redone.bin", answer) as url:
        assert run([url], out_dir).ok == 1
        answers[0] = 404
        assert run([url], out_dir, overwrite=True).failed == 1
        assert (out_dir / "redone.bin").read_bytes() == b"mine"  # verified or absent: kept
        answers[0] = 200
        report = run([url], out_dir)
    assert (report.ok, report.failed) == (1, 0)


def test_a_failed_rows_file_published_before_a_kill_is_still_ours(
    server: TestServer, out_dir: Path
) -> None:
    # A row failed in one run; the next run downloaded it, published its file
    # and was killed before recording it: the plan log's claim (ours) is all
    # that says so.  (The kill is played by writing what it leaves.)
    url = server.file_url("late.bin", size=10, status=404, times=1)
    assert run([url], out_dir).failed == 1
    key, index, mine = _claims(out_dir)["late.bin"]
    assert mine == 0  # nothing of ours is at a failed row's path
    (out_dir / "late.bin").write_bytes(expected_body("late.bin", 10))
    with open(out_dir / ".swarmget" / "plans.log", "a") as log:
        log.write(f'[[{key},{index},null,"late.bin",true]]\n')
    report = run([url], out_dir)
    assert (report.ok, report.failed) == (1, 0)
    assert (out_dir / "late.bin").read_bytes() == expected_body("late.bin", 10)


def test_rerun_redoes_failed_rows_and_missing_files(server: TestServer, out_dir: Path) -> None:
    urls = [server.file_url(f"f{i}.bin", size=500, status=503, times=1) for i in range(5)]
    urls += [server.file_url("gone.bin", size=700)]
    first = run(urls, out_dir)
    assert (first.ok, first.failed) == (1, 5)
    (out_dir / "gone.bin").unlink()
    second = run(urls, out_dir)
    assert (second.ok, second.failed, second.skipped) == (6, 0, 0)
    assert (out_dir / "gone.bin").read_bytes() == expected_body("gone.bin", 700)


def test_a_file_not_made_by_swarmget_is_not_overwritten(server: TestServer, out_dir: Path) -> None:
    (out_dir / "mine.txt").write_bytes(b"precious")
    url = server.file_url("mine.txt", size=100)
    report = run([url], out_dir)
    assert report.failures[0].error == "exists"
    assert (out_dir / "mine.txt").read_bytes() == b"precious"
    report = run([url], out_dir, overwrite=True)
    assert report.ok == 1
    assert (out_dir / "mine.txt").read_bytes() == expected_body("mine.txt", 100)


def test_symlink_at_the_final_name_is_not_followed(server: TestServer, out_dir: Path) -> None:
    target = out_dir.parent / f"{out_dir.name}-outside"
    target.write_bytes(b"outside")
    try:
        (out_dir / "link.bin").symlink_to(target)
        report = run([server.file_url("link.bin", size=10)], out_dir)
        assert report.failures[0].error == "exists"
        report = run([server.file_url("link.bin", size=10)], out_dir, overwrite=True)
        assert report.ok == 1
        assert target.read_bytes() == b"outside"  # the link was replaced, not followed
        assert not (out_dir / "link.bin").is_symlink()
    finally:
        target.unlink()


def test_a_symlinked_part_is_never_followed_and_does_not_block_its_row(
    server: TestServer, out_dir: Path
) -> None:
    # It failed the row with io ("too many levels of symbolic links") on every
    # rerun, --overwrite or not.
    target = out_dir.parent / f"{out_dir.name}-victim"
    target.write_bytes(b"victim")
    try:
        url = server.file_url("p.bin", size=10)
        part = part_for(out_dir, url)
        part.parent.mkdir(parents=True)
        part.symlink_to(target)
        report = run([url], out_dir)
        assert report.ok == 1
        assert (out_dir / "p.bin").read_bytes() == expected_body("p.bin", 10)
        assert target.read_bytes() == b"victim"
    finally:
        target.unlink()


def test_symlinked_directory_escape_is_refused(server: TestServer, out_dir: Path) -> None:
    outside = out_dir.parent / f"{out_dir.name}-dir"
    outside.mkdir()
    try:
        (out_dir / "sub").symlink_to(outside)
        rows = [Row(0, server.file_url("x.bin", size=10), path="sub/x.bin")]
        report = run(rows, out_dir)
        assert report.failures[0].error == "bad_path"
        assert list(outside.iterdir()) == []
    finally:
        outside.rmdir()


def test_a_rerun_never_removes_a_file_through_a_directory_symlinked_since(
    server: TestServer, out_dir: Path, tmp_path: Path
) -> None:
    # The row's new sha256 means its old file must go before it is redone: that
    # unlink followed sub -> outside and deleted a file swarmget never wrote.
    url = server.file_url("victim", size=10)
    assert run([Row(0, url, path="sub/victim")], out_dir).ok == 1
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"precious")
    (out_dir / "sub").rename(out_dir / "old-sub")
    (out_dir / "sub").symlink_to(outside)
    again = run([Row(0, url, path="sub/victim", sha256="0" * 64)], out_dir)
    assert again.failures[0].error == "bad_path"
    assert (outside / "victim").read_bytes() == b"precious"


def test_a_directory_swapped_for_a_symlink_during_a_download_is_refused(
    server: TestServer, out_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()

    async def swap_mid_body(head: bytes, conn: ScriptedConnection) -> None:
        # The body's directory was checked when its head came; it goes before the rest.
        await conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab")
        await asyncio.sleep(0.3)
        (out_dir / "sub").rename(out_dir / "old-sub")
        (out_dir / "sub").symlink_to(outside)
        conn.send(b"cd")

    with server.routed("/swap.bin", swap_mid_body) as url:
        report = run([Row(0, url, path="sub/b")], out_dir)
    assert report.failures[0].error == "bad_path"
    assert list(outside.iterdir()) == []


# Resumed within the run only past RESUME_MIN_BYTES (1 MiB): 2 MiB, cut at 1.5.
_WHOLE = bytes(range(256)) * 8192  # the file as the first reply announces it
_CUT = 1_572_864  # where the first reply's body stops
_HEAD = b'HTTP/1.1 200 OK\r\nETag: "v1"\r\nContent-Length: 2097152\r\n\r\n'


def _cut_short(conn: ScriptedConnection) -> None:
    """The first reply: the whole file announced, then the connection closes."""
    conn.send(_HEAD + _WHOLE[:_CUT])
    conn.close()


def _cut_first(
    calls: list[bytes], then: Callable[[bytes, ScriptedConnection], None]
) -> RouteHandler:
    """A route that keeps every request in ``calls``, answers the first with
    :func:`_cut_short` and the others with ``then``."""

    async def handler(head: bytes, conn: ScriptedConnection) -> None:
        calls.append(head)
        if len(calls) == 1:
            _cut_short(conn)
        else:
            then(head, conn)

    return handler


def _partial(last: int, total: bytes, etag: bytes = b'ETag: "v1"\r\n') -> bytes:
    length = last + 1 - _CUT
    return (
        b"HTTP/1.1 206 Partial Content\r\n%sContent-Range: bytes %d-%d/%s\r\n"
        b"Content-Length: %d\r\n\r\n" % (etag, _CUT, last, total, length)
    ) + b"x" * length


@pytest.mark.parametrize("across_runs", [False, True], ids=["retry", "rerun"])
@pytest.mark.parametrize(
    "second",
    [
        # The part is "the whole file", says a 416 (with or without the ETag).
        b'HTTP/1.1 416 Range Not Satisfiable\r\nETag: "v1"\r\n'
        b"Content-Range: bytes */1572864\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 416 Range Not Satisfiable\r\n"
        b"Content-Range: bytes */1572864\r\nContent-Length: 0\r\n\r\n",
        # Another version's 416, to our If-Range "v1".
        b'HTTP/1.1 416 Range Not Satisfiable\r\nETag: "v2"\r\n'
        b"Content-Range: bytes */1572864\r\nContent-Length: 0\r\n\r\n",
        # The rest, of a file of another length, under the same ETag.
        _partial(2_097_251, b"2097252"),
        _partial(2_097_051, b"2097052"),
        _partial(2_097_251, b"*"),
    ],
    ids=["416", "416-no-etag", "416-other-etag", "206-longer", "206-shorter", "206-unknown"],
)
def test_a_resume_told_another_length_than_the_cut_reply_starts_again_from_zero(
    server: TestServer, out_dir: Path, second: bytes, across_runs: bool
) -> None:
    # The first reply announced 2 MiB and was cut; what the retry (or, the
    # part kept, a rerun) hears must agree with it before anything is spliced
    # on or published as whole.  Across runs the length was not kept with the
    # part: a rerun published v1's first 1.5 MiB as the whole file (a 416), or
    # spliced on the rest of a file of another length (a 206).
    calls: list[bytes] = []

    def contradicting(head: bytes, conn: ScriptedConnection) -> None:
        conn.send(second if b"range:" in head.lower() else _HEAD + _WHOLE)

    with server.routed("/cut.bin", _cut_first(calls, contradicting)) as url:
        if across_runs:
            assert run([url], out_dir).error_counts() == {"truncated": 1}  # the part is kept
        report = run([url], out_dir, retries=2)
    assert (report.ok, report.error_counts()) == (1, {}), [f.message for f in report.failures]
    assert (out_dir / "cut.bin").read_bytes() == _WHOLE
    assert b"range: bytes=1572864-" in calls[1].lower() and b"range:" not in calls[2].lower()


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 206 X\r\nContent-Length: 3\r\nContent-Range: bytes 0-4/5\r\n\r\nhel",
        # Close-delimited, past its Content-Range.
        b"HTTP/1.1 206 X\r\nContent-Range: bytes 0-4/5\r\nConnection: close\r\n\r\nhelloEXTRA",
    ],
)
def test_a_206_to_a_plain_get_whose_lengths_disagree_fails_once_not_for_ever(
    server: TestServer, out_dir: Path, reply: bytes
) -> None:
    # "Again from zero, without a Range" asked a request that had no Range the
    # same question: 12,734 identical GETs in 3 s, until --deadline.
    calls: list[bytes] = []

    async def same_answer(head: bytes, conn: ScriptedConnection) -> None:
        calls.append(head)
        conn.send(reply)
        conn.close()

    with server.routed("/twisted.bin", same_answer) as url:
        report = run([url], out_dir, retries=1, deadline=20)
    assert report.error_counts() == {"protocol": 1}, [f.message for f in report.failures]
    assert len(calls) <= 2  # one attempt, and at most its one retry
    assert parts(out_dir) == []


@pytest.mark.parametrize("across_runs", [False, True], ids=["retry", "rerun"])
def test_a_200_of_no_length_shorter_than_its_version_was_announced_is_cut(
    server: TestServer, out_dir: Path, across_runs: bool
) -> None:
    # The server ignores our Range and sends the same version (ETag "v1")
    # again, without a length, cut at 1.5 of the 2 MiB its first reply
    # announced: published as a whole file, "ok".  curl -C - refuses it too.
    calls: list[bytes] = []

    def short_again(head: bytes, conn: ScriptedConnection) -> None:
        if len(calls) == 2:
            conn.send(b'HTTP/1.1 200 OK\r\nETag: "v1"\r\nConnection: close\r\n\r\n')
            conn.send(_WHOLE[:1_500_000])
            conn.close()
        else:
            conn.send(_HEAD + _WHOLE)

    with server.routed("/short.bin", _cut_first(calls, short_again)) as url:
        if across_runs:
            assert run([url], out_dir).error_counts() == {"truncated": 1}
        report = run([url], out_dir, retries=2)
    assert (report.ok, report.error_counts()) == (1, {}), [f.message for f in report.failures]
    assert (out_dir / "short.bin").read_bytes() == _WHOLE
    assert len(calls) == 3


@pytest.mark.parametrize("total", [b"2097152", b"*"])
def test_a_retry_answered_with_the_rest_of_the_same_length_is_spliced(
    server: TestServer, out_dir: Path, total: bytes
) -> None:
    calls: list[bytes] = []

    def honest(head: bytes, conn: ScriptedConnection) -> None:
        rest = _WHOLE[_CUT:]
        conn.send(
            b'HTTP/1.1 206 Partial Content\r\nETag: "v1"\r\n'
            b"Content-Range: bytes 1572864-2097151/%s\r\nContent-Length: %d\r\n\r\n"
            % (total, len(rest))
            + rest
        )

    with server.routed("/honest.bin", _cut_first(calls, honest)) as url:
        report = run([url], out_dir, retries=2)
    assert (report.ok, report.error_counts()) == (1, {}), [f.message for f in report.failures]
    assert (out_dir / "honest.bin").read_bytes() == _WHOLE
    assert len(calls) == 2 and b"range: bytes=1572864-" in calls[1].lower()


def test_without_renameat2_a_file_is_published_by_a_link(
    server: TestServer, out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(swarmget.sinks.noreplace, "_renameat2", None)
    url = server.file_url("linked.bin", size=1000)
    assert run([url], out_dir).ok == 1
    assert (out_dir / "linked.bin").read_bytes() == expected_body("linked.bin", 1000)
    assert (out_dir / "linked.bin").stat().st_nlink == 1  # the part's name is gone
    assert parts(out_dir) == []


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_file_under_a_mount_point_inside_the_output_dir_is_published(
    server: TestServer, out_dir: Path, overwrite: bool
) -> None:
    # The parts live under <out>/.swarmget; a directory of the output dir that
    # is another file system (a mount: tmpfs here, NFS or a volume for users)
    # cannot be renamed into.  The file is copied beside its name, then moved.
    url = server.file_url("m.bin", size=300_000)
    with small_tmpfs(out_dir / "mnt", "4m") as mnt:
        if overwrite:
            (mnt / "m.bin").write_bytes(b"an older copy")
        report = run([Row(0, url, path="mnt/m.bin")], out_dir, overwrite=overwrite)
        assert (report.ok, report.error_counts()) == (1, {})
        assert (mnt / "m.bin").read_bytes() == expected_body("m.bin", 300_000)
        assert sorted(p.name for p in mnt.iterdir()) == ["m.bin"]  # no copy left beside it
        assert parts(out_dir) == []


def test_a_full_mount_point_fails_its_rows_and_the_rest_of_the_run_goes_on(
    server: TestServer, out_dir: Path
) -> None:
    urls = [server.file_url(f"full{i}.bin", size=300_000) for i in range(3)]
    with small_tmpfs(out_dir / "mnt", "64k") as mnt:
        # A copy a kill left beside the final name (of some earlier run) is not
        # in the way either: each copy gets a name of its own.
        leftover = mnt / ".swarmget-leftover"
        leftover.write_bytes(b"x")
        rows = [Row(0, urls[0], path="mnt/full0.bin")]
        rows += [Row(i, url, path=f"elsewhere/full{i}.bin") for i, url in enumerate(urls) if i]
        report = run(rows, out_dir)
        assert report.ok == 2 and report.error_counts() == {"io": 1}
        assert "another file system" in report.failures[0].message
        assert sorted(p.name for p in mnt.iterdir()) == [".swarmget-leftover"]
        assert sorted(p.name for p in (out_dir / "elsewhere").iterdir()) == [
            "full1.bin",
            "full2.bin",
        ]


def test_a_copy_a_kill_left_under_a_mount_point_goes_when_its_row_is_done_again(
    server: TestServer, out_dir: Path
) -> None:
    # A kill during the copy beside the final name left it there; the copy's
    # name was new each time, so nothing ever removed it.  It is the row's own
    # name now, and the row's next copy takes its place.
    url = server.file_url("again.bin", size=300_000)
    with small_tmpfs(out_dir / "mnt", "4m") as mnt:
        leftover = mnt / f".swarmget-{part_for(out_dir, url, 'mnt/again.bin').name}"
        leftover.write_bytes(b"half a copy")
        report = run([Row(0, url, path="mnt/again.bin")], out_dir)
        assert (report.ok, report.error_counts()) == (1, {})
        assert (mnt / "again.bin").read_bytes() == expected_body("again.bin", 300_000)
        assert sorted(p.name for p in mnt.iterdir()) == ["again.bin"]


def test_a_file_that_appears_under_a_mount_point_is_not_replaced(
    server: TestServer, out_dir: Path
) -> None:
    with small_tmpfs(out_dir / "mnt", "4m") as mnt:

        def someone_writes_it(head: bytes, conn: ScriptedConnection) -> None:
            (mnt / "m2.bin").write_bytes(b"USER DATA")
            conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

        with server.routed("/m2.bin", someone_writes_it) as url:
            report = run([Row(0, url, path="mnt/m2.bin")], out_dir)
        assert report.error_counts() == {"exists": 1}
        assert (mnt / "m2.bin").read_bytes() == b"USER DATA"
        assert sorted(p.name for p in mnt.iterdir()) == ["m2.bin"]  # the copy is gone
        assert parts(out_dir) == []


@pytest.mark.parametrize("publish", ["renameat2", "link"])
def test_a_file_that_appears_while_its_row_downloads_is_not_replaced(
    publish: str, server: TestServer, out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if publish == "link":  # a system without renameat2(RENAME_NOREPLACE)
        monkeypatch.setattr(swarmget.sinks.noreplace, "_renameat2", None)

    def someone_writes_it(head: bytes, conn: ScriptedConnection) -> None:
        (out_dir / "a.bin").write_bytes(b"USER DATA")
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    server.route("/a.bin", someone_writes_it)
    try:
        url = server.url("/a.bin")
        report = run([url], out_dir)
        assert report.failures[0].error == "exists"
        assert (out_dir / "a.bin").read_bytes() == b"USER DATA"
        assert parts(out_dir) == []
        # Not ours on the rerun either (it is not removed as a leftover of ours).
        assert run([url], out_dir).failures[0].error == "exists"
        assert (out_dir / "a.bin").read_bytes() == b"USER DATA"
        assert run([url], out_dir, overwrite=True).ok == 1
        assert (out_dir / "a.bin").read_bytes() == b"ok"
    finally:
        server.unroute("/a.bin")


@pytest.mark.parametrize("link", [".swarmget", ".swarmget/parts"])
def test_a_symlink_in_the_state_directory_is_refused(
    link: str, server: TestServer, out_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "manifest.jsonl").write_text("someone else's file")
    (out_dir / link).parent.mkdir(exist_ok=True)
    (out_dir / link).symlink_to(outside)
    with pytest.raises(swarmget.TransferError, match="is a symbolic link"):
        run([server.file_url("s.bin", size=10)], out_dir)
    assert [p.name for p in outside.iterdir()] == ["manifest.jsonl"]
    assert (outside / "manifest.jsonl").read_text() == "someone else's file"


def test_large_file_keeps_its_part_and_resumes_with_range(
    server: TestServer, out_dir: Path
) -> None:
    size = 3 * MiB
    url = server.file_url("big.bin", size=size, fault="truncate", times=1)
    first = run([url], out_dir)
    assert first.failures[0].error == "truncated"
    part = part_for(out_dir, url)
    assert part.stat().st_size == size // 2
    assert not (out_dir / "big.bin").exists()
    # One record for the row: failed, with the validator its kept part resumes with.
    (record,) = journal(out_dir)
    assert (record["status"], record["error"]) == ("failed", "truncated")
    assert record["validator"]
    seen = len(server.requests)  # (reset_stats would also reset the times=1 counter)
    second = run([url], out_dir)
    assert second.ok == 1
    assert (out_dir / "big.bin").read_bytes() == expected_body("big.bin", size)
    assert not part.exists()
    # The file is all there, but only its second half came in this run: the
    # rate counts that half (half the bytes in the same time is not the speed
    # of all of them).
    assert (second.bytes, second.reused, second.received) == (size, size // 2, size // 2)
    summary = second.to_json()
    assert (summary["bytes"], summary["reused_bytes"]) == (size, size // 2)
    assert summary["mb_per_s"] == round(size // 2 / 1e6 / second.elapsed, 2)
    ranged = range_requests(server, seen)
    assert len(ranged) == 1 and f"bytes={size // 2}-".encode() in ranged[0]
    assert b"if-range:" in ranged[0].lower()


def test_a_big_chunked_body_cut_short_is_continued_from_its_part(
    server: TestServer, out_dir: Path
) -> None:
    # A chunked body has no length to call it big by, so its validator was
    # never recorded and 3 MiB that had come were thrown away: the rerun began
    # at zero.  Its last chunk missing, it is known to be cut (a body read to
    # the close is not), so it is kept as a body of a stated length is.
    size = 3 * MiB
    url = server.file_url("chunked.bin", size=size, fault="chunk_cut", times=1)
    (failure,) = run([url], out_dir).failures
    assert failure.error == "truncated"
    kept = part_for(out_dir, url).stat().st_size
    assert kept >= size // 2 and failure.message.endswith(
        f"; {kept} bytes are kept: run again to resume"
    )
    seen = len(server.requests)
    second = run([url], out_dir)
    assert second.ok == 1 and second.reused == kept
    assert (out_dir / "chunked.bin").read_bytes() == expected_body("chunked.bin", size)
    (ranged,) = range_requests(server, seen)
    assert f"bytes={kept}-".encode() in ranged and b"if-range:" in ranged.lower()
    assert parts(out_dir) == []


def test_a_small_chunked_body_records_no_version(server: TestServer, out_dir: Path) -> None:
    # Only a cut body of at least RESUME_MIN_BYTES is kept: a small one is
    # fetched again whole, and a body that ends well leaves nothing behind.
    url = server.file_url("small.bin", size=200_000, fault="chunk_cut", times=1)
    (failure,) = run([url], out_dir).failures
    assert failure.error == "truncated" and "kept" not in failure.message
    assert parts(out_dir) == []
    seen = len(server.requests)
    assert run([url], out_dir).ok == 1
    assert range_requests(server, seen) == []


@pytest.mark.parametrize(
    ("fault", "cause"),
    [
        ("stall", "no data for 1s"),  # the "hangs at 99%" of a big file
        ("reset", "connection lost mid-response: Connection reset by peer"),
    ],
)
def test_a_failure_that_keeps_its_part_says_how_much_and_that_a_rerun_resumes(
    server: TestServer, out_dir: Path, fault: str, cause: str
) -> None:
    # "timeout: no data for 1s" alone told neither that half the file had
    # come nor that it was kept: a user saw a failure, not a resume waiting.
    size = 3 * MiB
    url = server.file_url(f"{fault}.bin", size=size, fault=fault, times=1)
    (failure,) = run([url], out_dir, timeout=1).failures
    kept = size // 2
    assert failure.message == f"{cause}; {kept} of {size} bytes are kept: run again to resume"
    assert part_for(out_dir, url).stat().st_size == kept
    assert run([url], out_dir).ok == 1


def test_a_failure_that_keeps_no_part_does_not_say_it_does(
    server: TestServer, out_dir: Path
) -> None:
    # The resumed file's checksum fails: its part goes (the bytes that came
    # before may be the wrong ones), and the message must not offer a resume.
    size = 2 * MiB
    url = server.file_url("wrong.bin", size=size, fault="truncate", times=1)
    row = Row(0, url, sha256="0" * 64)
    (first,) = run([row], out_dir).failures
    assert first.message.endswith(f"; {size // 2} of {size} bytes are kept: run again to resume")
    (second,) = run([row], out_dir).failures
    assert second.error == "checksum" and "kept" not in second.message
    assert parts(out_dir) == [] and not (out_dir / "wrong.bin").exists()
    small = server.file_url("small.bin", size=100_000, fault="truncate")
    (cut,) = run([small], out_dir).failures
    assert cut.message == "connection closed after 50000 of 100000 body bytes"


def test_a_server_that_takes_no_ranges_leaves_no_part_to_resume(
    server: TestServer, out_dir: Path
) -> None:
    # "Accept-Ranges: none": the part was kept and the failure said "run again
    # to resume", but the rerun could only fetch the file again from zero.
    size = 3 * MiB
    url = server.file_url("norange.bin", size=size, fault="truncate", norange=1, times=1)
    (failure,) = run([url], out_dir).failures
    assert failure.error == "truncated" and "kept" not in failure.message, failure.message
    assert parts(out_dir) == []
    assert "validator" not in journal(out_dir)[0]
    assert run([url], out_dir).ok == 1
    assert (out_dir / "norange.bin").read_bytes() == expected_body("norange.bin", size)


@pytest.mark.parametrize(
    ("fault", "size"), [("chunk_cut", 100_000), ("truncate", 3 * MiB // 2)], ids=str
)
def test_a_body_cut_before_a_part_is_worth_keeping_leaves_no_validator_in_the_manifest(
    server: TestServer, out_dir: Path, fault: str, size: int
) -> None:
    # The README: a row whose part is kept for resuming has its validator.  A
    # body that began as resumable (chunked, or of 1 MiB or more) and was cut
    # before 1 MiB had come lost its part but kept its validator in the record,
    # offering a resume there was nothing for.
    url = server.file_url(f"{fault}.bin", size=size, fault=fault)
    (failure,) = run([url], out_dir).failures
    assert failure.error == "truncated" and "kept" not in failure.message
    assert parts(out_dir) == []
    (record,) = journal(out_dir)
    assert "validator" not in record


def test_a_kept_part_that_is_the_whole_file_is_published_not_fetched_again(
    server: TestServer, out_dir: Path
) -> None:
    # A run stopped between a big file's last byte and its rename keeps a part
    # that is the whole file: the rerun's Range starts at its end, the server
    # answers 416 with "bytes */SIZE", and the part is the file.  It was fetched
    # again from byte 0.
    size = 3 * MiB
    url = server.file_url("whole.bin", size=size, fault="truncate", times=1)
    assert run([url], out_dir).failures[0].error == "truncated"
    part = part_for(out_dir, url)
    part.write_bytes(expected_body("whole.bin", size))  # the rest came, then the stop
    seen = len(server.requests)
    report = run([url], out_dir, hash="sha256")
    assert (report.ok, report.error_counts()) == (1, {})
    assert (out_dir / "whole.bin").read_bytes() == expected_body("whole.bin", size)
    assert not part.exists()
    requests = server.requests[seen:]
    assert len(requests) == 1 and f"bytes={size}-".encode() in requests[0]
    assert (report.bytes, report.reused, report.received) == (size, size, 0)
    (record,) = journal(out_dir)
    assert record["status"] == "ok" and record["http_status"] == 416
    assert record["sha256"] == hashlib.sha256(expected_body("whole.bin", size)).hexdigest()


def test_a_416_for_a_part_of_another_length_starts_again(server: TestServer, out_dir: Path) -> None:
    size = 3 * MiB
    url = server.file_url("longer.bin", size=size, fault="truncate", times=1)
    assert run([url], out_dir).failed == 1
    part = part_for(out_dir, url)
    part.write_bytes(expected_body("longer.bin", size) + b"and more")  # longer than the file
    report = run([url], out_dir)
    assert report.ok == 1
    assert (out_dir / "longer.bin").read_bytes() == expected_body("longer.bin", size)
    assert report.reused == 0


def test_retry_within_a_run_continues_the_part(server: TestServer, out_dir: Path) -> None:
    size = 3 * MiB
    seen = len(server.requests)
    report = run([server.file_url("r.bin", size=size, fault="reset", times=1)], out_dir, retries=2)
    assert report.ok == 1
    assert report.reused == 0  # every byte came in this run, before and after the cut
    assert (out_dir / "r.bin").read_bytes() == expected_body("r.bin", size)
    assert len(range_requests(server, seen)) == 1


def test_server_ignoring_range_restarts_from_zero(server: TestServer, out_dir: Path) -> None:
    size = 2 * MiB
    url = server.file_url("nr.bin", size=size, fault="truncate", times=1, norange=1)
    assert run([url], out_dir).failed == 1
    report = run([url], out_dir)
    assert report.ok == 1
    assert (out_dir / "nr.bin").read_bytes() == expected_body("nr.bin", size)
    assert report.reused == 0  # the kept part was written over: all received now


def test_changed_validator_restarts_from_zero(server: TestServer, out_dir: Path) -> None:
    size = 2 * MiB
    url = server.file_url("cv.bin", size=size, fault="truncate", times=1)
    assert run([url], out_dir).failed == 1
    assert any(r.get("validator") for r in journal(out_dir))
    # Pretend the earlier run saw another version of the file.
    with contextlib.closing(sqlite3.connect(out_dir / ".swarmget" / "journal.sqlite3")) as db:
        db.execute("""UPDATE rows SET validator='"another-version"' WHERE validator IS NOT NULL""")
        db.commit()
    part_for(out_dir, url).write_bytes(b"X" * (size // 2))  # and other bytes
    report = run([url], out_dir)
    assert report.ok == 1
    assert (out_dir / "cv.bin").read_bytes() == expected_body("cv.bin", size)


def test_mismatched_content_range_restarts_from_zero(server: TestServer, out_dir: Path) -> None:
    body = bytes(range(256)) * 8192  # 2 MiB
    head = (f'HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nETag: "v1"\r\n\r\n').encode()
    calls: list[bytes] = []

    def handler(request: bytes, conn: ScriptedConnection) -> None:
        calls.append(request)
        if b"range:" in request.lower():
            conn.send(
                b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-9/2097152\r\n"
                b'Content-Length: 10\r\nETag: "v1"\r\n\r\n' + body[:10]
            )
        elif len(calls) == 1:
            conn.send(head + body[: len(body) // 2])
            conn.close()
        else:
            conn.send(head + body)

    server.route("/cr.bin", handler)
    try:
        url = server.url("/cr.bin")
        assert run([url], out_dir).failed == 1
        report = run([url], out_dir)
        assert report.ok == 1
        assert report.bytes == len(body)
        assert (out_dir / "cr.bin").read_bytes() == body
        assert report.failures == []
    finally:
        server.unroute("/cr.bin")


_V1 = bytes(range(256)) * 8192  # 2 MiB
_V2 = bytes(reversed(range(256))) * 8192


def _ranged(request: bytes) -> int | None:
    """The START of a request's ``Range: bytes=START-``, None for a plain GET."""
    lowered = request.lower()
    if b"\r\nrange: bytes=" not in lowered:
        return None
    return int(lowered.split(b"\r\nrange: bytes=")[1].split(b"-")[0])


def _if_range(request: bytes) -> bytes | None:
    for line in request.split(b"\r\n"):
        if line.lower().startswith(b"if-range:"):
            return line.partition(b":")[2].strip()
    return None


def _cut_200(conn: ScriptedConnection, body: bytes, fields: str) -> None:
    """A 200 for all of ``body`` (Content-Length) that ends halfway."""
    conn.send(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{fields}\r\n".encode())
    conn.send(body[: len(body) // 2])
    conn.close()


def _rest_of_v1(start: int, fields: str) -> bytes:
    """A 206 of _V1 from ``start`` to its end, with ``fields`` (CRLF-ended lines)."""
    return (
        f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-"
        f"{len(_V1) - 1}/{len(_V1)}\r\nContent-Length: {len(_V1) - start}\r\n"
        f"{fields}\r\n".encode()
        + _V1[start:]
    )


def _honest(conn: ScriptedConnection, request: bytes, etag: str) -> None:
    """An honest server of _V1 under ``etag``: the rest if If-Range matches, else all."""
    start = _ranged(request)
    if start is not None and _if_range(request) == etag.encode():
        conn.send(_rest_of_v1(start, f"ETag: {etag}\r\n"))
    else:
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(_V1)}\r\nETag: {etag}\r\n\r\n"
        conn.send(head.encode() + _V1)


def test_a_part_rewritten_from_zero_forgets_the_validator_of_the_bytes_it_lost(
    server: TestServer, out_dir: Path
) -> None:
    # Run 1 kept half of v1 ("A").  Run 2's If-Range got a 200 of v2, chunked,
    # with another ETag, cut: the part held v2's bytes and the journal still
    # said "A".  Run 3, at a server that has v1 again (a rollback, or another
    # backend) and honours If-Range "A": v1's rest was spliced onto v2's start.
    phase = {"n": 1}

    def handler(request: bytes, conn: ScriptedConnection) -> None:
        if phase["n"] == 1:
            _cut_200(conn, _V1, 'ETag: "A"\r\n')
        elif phase["n"] == 2:
            conn.send(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nETag: "B"\r\n\r\n')
            conn.send(b"%x\r\n" % (len(_V2) // 2) + _V2[: len(_V2) // 2] + b"\r\n")
            conn.close()
        else:
            _honest(conn, request, '"A"')

    server.route("/rewritten.bin", handler)
    try:
        url = server.url("/rewritten.bin")
        for phase["n"] in (1, 2):
            assert run([url], out_dir).failed == 1
        phase["n"] = 3
        assert run([url], out_dir).ok == 1
        assert (out_dir / "rewritten.bin").read_bytes() == _V1
    finally:
        server.unroute("/rewritten.bin")


@pytest.mark.parametrize(("age", "resumed"), [(0, False), (3600, True)])
def test_a_last_modified_resumes_only_when_it_is_older_than_the_reply(
    server: TestServer, out_dir: Path, age: int, resumed: bool
) -> None:
    # A file changed within the second of its Last-Modified keeps that date: as
    # If-Range it would let the changed file's rest be spliced on (RFC 9110
    # 8.8.2.2: only a date a second or more before the Date is strong).
    date = "Thu, 26 Nov 2026 10:00:00 GMT"
    modified = date if age == 0 else "Thu, 26 Nov 2026 09:00:00 GMT"
    fields = f"Date: {date}\r\nLast-Modified: {modified}\r\n"
    requests: list[bytes] = []

    def handler(request: bytes, conn: ScriptedConnection) -> None:
        requests.append(request)
        start = _ranged(request)
        if len(requests) == 1:
            _cut_200(conn, _V1, fields)
        elif start is not None:
            conn.send(_rest_of_v1(start, fields))
        else:
            conn.send(f"HTTP/1.1 200 OK\r\nContent-Length: {len(_V1)}\r\n{fields}\r\n".encode())
            conn.send(_V1)

    server.route("/dated.bin", handler)
    try:
        url = server.url("/dated.bin")
        assert run([url], out_dir).failed == 1
        assert run([url], out_dir).ok == 1
    finally:
        server.unroute("/dated.bin")
    assert (out_dir / "dated.bin").read_bytes() == _V1
    assert (_ranged(requests[1]) is not None) == resumed
    if resumed:
        assert _if_range(requests[1]) == modified.encode()


def test_a_kept_part_continues_at_the_redirect_target(server: TestServer, out_dir: Path) -> None:
    # The first request of a rerun goes to the row's URL; the redirect's hop
    # went out without Range, so a redirected big file never resumed.
    targets: list[bytes] = []

    def redirect(request: bytes, conn: ScriptedConnection) -> None:
        conn.send(b"HTTP/1.1 302 Found\r\nLocation: /target.bin\r\nContent-Length: 0\r\n\r\n")

    def target(request: bytes, conn: ScriptedConnection) -> None:
        targets.append(request)
        if len(targets) == 1:
            _cut_200(conn, _V1, 'ETag: "v1"\r\n')
        else:
            _honest(conn, request, '"v1"')

    server.route("/moved.bin", redirect)
    server.route("/target.bin", target)
    try:
        url = server.url("/moved.bin")
        assert run([url], out_dir).failed == 1
        assert run([url], out_dir).ok == 1
    finally:
        server.unroute("/moved.bin")
        server.unroute("/target.bin")
    assert (out_dir / "moved.bin").read_bytes() == _V1
    assert _ranged(targets[1]) == len(_V1) // 2


def _bad_answer(kind: str, start: int) -> bytes:
    """A reply to ``Range: bytes=START-`` that must not be spliced onto our part."""
    rest = len(_V1) - start
    content_range = f"Content-Range: bytes {start}-{len(_V1) - 1}/{len(_V1)}\r\n"
    head = "HTTP/1.1 206 Partial Content\r\n" + content_range
    if kind == "short-length":  # its own length disagrees with its range
        return f'{head}Content-Length: 1000\r\nETag: "v1"\r\n\r\n'.encode() + _V1[start:][:1000]
    if kind in ("short-close", "long-close"):  # framed by the close: stops early, or runs on
        body = _V1[start:][:1000] if kind == "short-close" else _V1[start:] + b"extra"
        return f'{head}ETag: "v1"\r\nConnection: close\r\n\r\n'.encode() + body
    if kind == "new-etag":  # ignores If-Range: the rest of the new version
        return f'{head}Content-Length: {rest}\r\nETag: "v2"\r\n\r\n'.encode() + _V2[start:]
    if kind == "no-validator":  # ... and does not say which version it is
        return f"{head}Content-Length: {rest}\r\n\r\n".encode() + _V2[start:]
    if kind == "other-validator":  # ... or says it with a validator of another kind
        modified = "Last-Modified: Tue, 24 Nov 2026 10:00:00 GMT\r\n"
        return f"{head}Content-Length: {rest}\r\n{modified}\r\n".encode() + _V2[start:]
    assert kind == "416"
    return b"HTTP/1.1 416 Range Not Satisfiable\r\nContent-Length: 0\r\n\r\n"


@pytest.mark.parametrize(
    ("kind", "final"),
    [
        ("short-length", _V1),
        ("short-close", _V1),
        ("long-close", _V1),
        ("new-etag", _V2),
        ("no-validator", _V2),
        ("other-validator", _V2),
        ("416", _V1),
    ],
)
def test_a_206_is_spliced_on_only_when_it_is_the_rest_of_the_same_file(
    server: TestServer, out_dir: Path, kind: str, final: bytes
) -> None:
    # A short 206 was published as a whole file, a 206 of another version was
    # spliced onto our part, a 416 failed the row on every rerun.
    requests: list[bytes] = []

    def handler(request: bytes, conn: ScriptedConnection) -> None:
        requests.append(request)
        ranged = [r for r in requests if b"\r\nrange:" in r.lower()]
        if len(requests) == 1:  # cut halfway: the part is kept, with validator "v1"
            conn.send(
                f'HTTP/1.1 200 OK\r\nContent-Length: {len(_V1)}\r\nETag: "v1"\r\n\r\n'.encode()
            )
            conn.send(_V1[: len(_V1) // 2])
            conn.close()
        elif request in ranged:
            start = int(request.lower().split(b"range: bytes=")[1].split(b"-")[0])
            if len(ranged) == 1:
                conn.send(_bad_answer(kind, start))
                conn.close()
            else:  # a well-behaved 206
                conn.send(
                    f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-"
                    f"{len(_V1) - 1}/{len(_V1)}\r\nContent-Length: {len(_V1) - start}\r\n"
                    f'ETag: "v1"\r\n\r\n'.encode()
                    + _V1[start:]
                )
        else:  # from zero: the version the server has now
            etag = "v2" if final is _V2 else "v1"
            head = f'HTTP/1.1 200 OK\r\nContent-Length: {len(final)}\r\nETag: "{etag}"\r\n\r\n'
            conn.send(head.encode() + final)

    server.route("/splice.bin", handler)
    try:
        url = server.url("/splice.bin")
        assert run([url], out_dir).failed == 1
        assert part_for(out_dir, url).stat().st_size == len(_V1) // 2
        report = run([url], out_dir, retries=1)
        assert report.ok == 1, report.failures
        assert (out_dir / "splice.bin").read_bytes() == final
    finally:
        server.unroute("/splice.bin")
    assert server.errors == []
    assert parts(out_dir) == []


def test_checksums_and_sizes_are_verified_while_streaming(
    server: TestServer, out_dir: Path
) -> None:
    good = hashlib.sha256(expected_body("a.bin", 3000)).hexdigest()
    good_md5 = hashlib.md5(expected_body("c.bin", 3000)).hexdigest()
    rows = [
        Row(0, server.file_url("a.bin", size=3000), sha256=good),
        Row(1, server.file_url("b.bin", size=3000), sha256="0" * 64),
        Row(2, server.file_url("c.bin", size=3000), md5=good_md5, size=3000),
        Row(3, server.file_url("d.bin", size=3000), size=2999),
        Row(4, server.file_url("e.bin", size=3000), md5="f" * 32),
    ]
    report = run(rows, out_dir)
    assert report.ok == 2
    errors = {f.url.split("/")[-1].split("?")[0]: f.error for f in report.failures}
    assert errors == {"b.bin": "checksum", "d.bin": "size_mismatch", "e.bin": "checksum"}
    for name in ("b.bin", "d.bin", "e.bin"):
        assert not (out_dir / name).exists()
    assert not parts(out_dir)
    assert (out_dir / "a.bin").read_bytes() == expected_body("a.bin", 3000)


def test_a_size_the_content_length_contradicts_fails_at_the_head(
    server: TestServer, out_dir: Path
) -> None:
    # It failed only after the whole body was in: 64 MiB for a row that says 1000.
    def huge(request: bytes, conn: ScriptedConnection) -> None:
        conn.send(f"HTTP/1.1 200 OK\r\nContent-Length: {64 * MiB}\r\n\r\n".encode())
        conn.send(b"x" * 1000)
        conn.sleep(5)  # the rest would take a while
        conn.close()

    server.route("/huge.bin", huge)
    try:
        started = time.monotonic()
        report = run([Row(0, server.url("/huge.bin"), size=1000)], out_dir, timeout=10)
        elapsed = time.monotonic() - started
    finally:
        server.unroute("/huge.bin")
    assert report.failures[0].error == "size_mismatch"
    assert "announces 67108864 bytes" in report.failures[0].message
    assert elapsed < 3
    assert not (out_dir / "huge.bin").exists() and not parts(out_dir)


def test_hash_option_records_digests(server: TestServer, out_dir: Path) -> None:
    report = run([server.file_url("h.bin", size=5000)], out_dir, hash="sha256")
    assert report.ok == 1
    record = journal(out_dir)[0]
    assert record["sha256"] == hashlib.sha256(expected_body("h.bin", 5000)).hexdigest()


def test_checksum_verified_across_a_resume(server: TestServer, out_dir: Path) -> None:
    size = 2 * MiB
    digest = hashlib.sha256(expected_body("hr.bin", size)).hexdigest()
    row = Row(0, server.file_url("hr.bin", size=size, fault="truncate", times=1), sha256=digest)
    assert run([row], out_dir).failed == 1
    report = run([row], out_dir)
    assert report.ok == 1


def test_a_rerun_checks_done_files_against_the_checks_the_list_gained(
    server: TestServer, out_dir: Path
) -> None:
    """A file done before is skipped only if it passed the size, sha256 and md5 its
    row comes with now.  One never checked against them is checked on disk: kept
    if it passes (no request), else done again and verified."""
    names = [f"g{i}.bin" for i in range(6)]
    urls = [server.file_url(name, size=2000) for name in names]
    sha = [hashlib.sha256(expected_body(name, 2000)).hexdigest() for name in names]
    md5 = [hashlib.md5(expected_body(name, 2000)).hexdigest() for name in names]
    assert run([Row(0, urls[0], sha256=sha[0]), *urls[1:]], out_dir).ok == 6
    server.reset_stats()
    rows = [
        Row(0, urls[0], sha256=sha[0].upper()),  # checked with this digest: skipped
        Row(1, urls[1], sha256="0" * 64),  # never checked, fails on disk: redone, refused
        Row(2, urls[2], sha256=sha[2]),  # never checked, right on disk: kept
        Row(3, urls[3], size=1999),  # its size says otherwise: redone, and refused
        Row(4, urls[4], size=2000, md5=md5[4]),  # no md5 recorded, right on disk: kept
        Row(5, urls[5], size=2000),  # the size it had: skipped
    ]
    report = run(rows, out_dir)
    assert (report.ok, report.skipped) == (2, 2)
    errors = {f.index: f.error for f in report.failures}
    assert errors == {1: "checksum", 3: "size_mismatch"}
    assert server.stats.requests == 2
    assert report.received == 0  # rows 2 and 4: checked where they were
    # What the checks refuse is not left in place; the rest is.
    assert sorted(p.name for p in out_dir.glob("*.bin")) == ["g0.bin", "g2.bin", "g4.bin", "g5.bin"]
    records = {r["index"]: r for r in journal(out_dir)}
    assert records[2]["sha256"] == sha[2] and records[4]["md5"] == md5[4]
    assert records[2]["message"] == "already on disk: checked against the input's sha256"
    # Checked now, they are skipped from now on.
    server.reset_stats()
    again = run([rows[0], rows[2], rows[4], rows[5]], out_dir)
    assert (again.ok, again.skipped, server.stats.requests) == (0, 4, 0)


def test_a_checksum_column_added_while_the_server_is_gone_keeps_the_files_it_vouches_for(
    out_dir: Path,
) -> None:
    with TestServer() as gone:
        urls = [gone.file_url(name, size=3000) for name in ("k1.bin", "k2.bin")]
        assert run(urls, out_dir).ok == 2
    good = hashlib.sha256(expected_body("k1.bin", 3000)).hexdigest()
    report = run(
        [Row(0, urls[0], sha256=good, size=3000), Row(1, urls[1], sha256="1" * 64)], out_dir
    )
    assert (report.ok, report.error_counts()) == (1, {"connect": 1})
    assert (out_dir / "k1.bin").read_bytes() == expected_body("k1.bin", 3000)
    # The file its checksum refuses is not left in place (verified or absent).
    assert not (out_dir / "k2.bin").exists()


def test_max_size_refuses_before_and_during_transfer(server: TestServer, out_dir: Path) -> None:
    urls = [
        server.file_url("cl.bin", size=10000),
        server.file_url("ch.bin", size=10000, chunked=1, chunk=1000),
        server.file_url("ok.bin", size=100),
    ]
    report = run(urls, out_dir, max_size=5000)
    assert report.ok == 1
    assert {f.error for f in report.failures} == {"too_large"}
    for name in ("cl.bin", "ch.bin"):
        assert not (out_dir / name).exists()
    assert not parts(out_dir)


@pytest.mark.parametrize("norange", [0, 2], ids=["206", "200"])
def test_a_kept_part_goes_with_its_row_when_the_file_is_over_max_size(
    server: TestServer, out_dir: Path, norange: int
) -> None:
    # A resumed row refused at the head (its 206's Content-Range, or the whole
    # 200 of a server that ignores Range, says the file is over --max-size)
    # left its part and the part's version behind for good: nothing had opened
    # them in this run, so nothing removed them, and the journal still offered
    # the part to every rerun.
    size = 3 * MiB
    name = f"over-{norange}.bin"
    url = server.file_url(name, size=size, fault="truncate", times=1, norange=norange)
    assert run([url], out_dir).failures[0].error == "truncated"
    part = part_for(out_dir, url)
    assert part.exists() and Path(f"{part}.version").exists()
    seen = len(server.requests)
    report = run([url], out_dir, max_size=2 * MiB)
    assert [f.error for f in report.failures] == ["too_large"]
    assert len(range_requests(server, seen)) == 1  # it was a resume
    assert not (out_dir / name).exists()
    assert [p for p in (out_dir / ".swarmget").rglob("*") if p.name.startswith(part.name)] == []
    assert parts(out_dir) == []
    (record,) = journal(out_dir)
    assert (record["status"], record["error"]) == ("failed", "too_large")
    assert "validator" not in record  # no part: nothing to continue


def test_disk_full_stops_the_run_cleanly(server: TestServer, tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "small", "1m") as mount:
        urls = [server.file_url(f"d{i}.bin", size=200_000) for i in range(40)]
        with pytest.raises(swarmget.TransferError) as info:
            run(urls, mount, concurrency=4)
        assert info.value.code == "io"
        records = journal(mount)
        assert all(r["status"] in ("ok", "failed", "partial") for r in records)
        for record in records:
            if record["status"] == "ok":
                assert (mount / record["path"]).stat().st_size == 200_000
        assert len([r for r in records if r["status"] == "ok"]) < 40
        assert not parts(mount)


def test_a_lost_journal_is_made_good_from_the_manifest(server: TestServer, out_dir: Path) -> None:
    # The journal deleted (or a disk put back without it): every file the
    # manifest lists as done for the same URL, and still of its size, is done;
    # they used to fail `exists`, all of them, and the manifest said so.
    urls = [server.file_url(f"lost{i}.bin", size=1000 + i) for i in range(3)]
    rows = [*urls[:2], Row(2, urls[2], path="sub/third.bin")]
    assert run(rows, out_dir).ok == 3
    (out_dir / ".swarmget" / "journal.sqlite3").unlink()
    (out_dir / "lost1.bin").write_bytes(b"changed since")  # not vouched for: not taken
    (out_dir / ".swarmget" / "parts").mkdir(exist_ok=True)
    (out_dir / ".swarmget" / "parts" / "0123456789abcdef").write_bytes(b"orphan")
    seen = len(server.requests)
    again = run(rows, out_dir)
    assert (again.ok, again.error_counts()) == (2, {"exists": 1})
    assert len(server.requests) == seen
    by_index = {r["index"]: r for r in journal(out_dir)}
    assert by_index[0]["status"] == by_index[2]["status"] == "ok"
    assert by_index[2]["path"] == "sub/third.bin" and "journal was lost" in by_index[2]["message"]
    assert by_index[1]["error"] == "exists"
    assert parts(out_dir) == []  # no row knew the part: it is gone
    third = run(rows, out_dir)
    assert (third.skipped, third.failed) == (2, 1)


def test_a_lost_journal_is_made_good_for_a_reordered_list(
    server: TestServer, out_dir: Path
) -> None:
    # Two URLs with one default name (a.jpg, a-1.jpg) and one URL twice: with
    # the journal lost and the list reordered, each row's default name is
    # another row's file.  Every row failed `exists`, and the manifest was
    # rewritten to say so (the records recovery reads were gone for good).
    first, second = server.file_url("x/a.jpg", size=1100), server.file_url("y/a.jpg", size=1200)
    twice = server.file_url("t.bin", size=1300)
    assert run([first, second, twice, twice], out_dir).ok == 4
    before = {r["path"]: r["url"] for r in journal(out_dir)}
    assert sorted(before) == ["a-1.jpg", "a.jpg", "t-1.bin", "t.bin"]
    (out_dir / ".swarmget" / "journal.sqlite3").unlink()
    seen = len(server.requests)
    again = run([twice, second, twice, first], out_dir)
    assert (again.ok, again.failed) == (4, 0), again.error_counts()
    assert len(server.requests) == seen
    assert {r["path"]: r["url"] for r in journal(out_dir)} == before
    assert all("journal was lost" in r["message"] for r in journal(out_dir))
    assert sorted(p.name for p in out_dir.iterdir()) == [".swarmget", *sorted(before)]


def test_a_lost_journal_and_a_changed_file_keep_every_row_to_its_own_path(
    server: TestServer, out_dir: Path
) -> None:
    # Three URLs, one default name; the journal lost, x-1 changed, the list
    # reversed.  x-1's row fell back to the default name x (another URL's
    # whole file) and failed exists there, and so did x's row after it.
    urls = [server.file_url(f"{d}/x", size=100 + n) for n, d in enumerate("abc")]
    assert run(urls, out_dir).ok == 3
    before = {r["path"]: r["url"] for r in journal(out_dir)}
    (out_dir / ".swarmget" / "journal.sqlite3").unlink()
    (out_dir / "x-1").write_bytes(b"shrunk")
    seen = len(server.requests)
    again = run(urls[::-1], out_dir)
    assert (again.ok, again.error_counts()) == (2, {"exists": 1})
    (failure,) = again.failures
    assert failure.url == urls[1] and "x-1 changed since" in str(failure.message)
    assert len(server.requests) == seen
    assert (out_dir / "x-1").read_bytes() == b"shrunk"  # not known to be ours: kept
    replaced = run(urls[::-1], out_dir, overwrite=True)
    assert (replaced.ok, replaced.failed) == (3, 0)
    assert {r["path"]: r["url"] for r in journal(out_dir)} == before
    assert (out_dir / "x-1").read_bytes() == expected_body("b/x", 101)


def test_a_lost_journals_files_are_named_around_by_new_rows(
    server: TestServer, out_dir: Path
) -> None:
    # A new URL whose default name is the file of a row further on (the
    # journal lost) took that name and failed "exists ... was not downloaded
    # by swarmget"; the row whose file it is then failed too.
    old = server.file_url("p/a.jpg", size=300)
    assert run([old], out_dir).ok == 1
    (out_dir / ".swarmget" / "journal.sqlite3").unlink()
    new = server.file_url("q/a.jpg", size=400)
    seen = len(server.requests)
    report = run([new, Row(1, new, path="a.jpg"), old], out_dir)
    assert (report.ok, report.error_counts()) == (2, {"exists": 1})
    assert len(server.requests) == seen + 1  # the new URL's, once
    by_url = {(r["url"], r["index"]): r for r in journal(out_dir)}
    assert by_url[(new, 0)]["path"] == "a-1.jpg" and by_url[(old, 2)]["path"] == "a.jpg"
    assert (out_dir / "a.jpg").read_bytes() == expected_body("p/a.jpg", 300)
    assert (out_dir / "a-1.jpg").read_bytes() == expected_body("q/a.jpg", 400)
    assert by_url[(new, 1)]["message"] == (
        f"a.jpg holds the file an earlier run downloaded from {old} (use --overwrite to replace it)"
    )


def test_a_damaged_journal_removed_as_its_message_says_keeps_every_file(
    server: TestServer, out_dir: Path
) -> None:
    # The advice was to move .swarmget aside and add --overwrite: every file
    # downloaded again, and any file not ours overwritten.
    urls = [server.file_url(f"d{i}.bin", size=3000) for i in range(5)]
    assert swarmget.download(urls, out_dir).ok == 5
    state = out_dir / ".swarmget"
    (state / "journal.sqlite3").write_bytes(b"\x13" * 8192)
    with pytest.raises(swarmget.TransferError) as info:
        swarmget.download(urls, out_dir)
    assert "remove it (with its -wal and -shm files) and run again" in info.value.message
    for name in ("journal.sqlite3", "journal.sqlite3-wal", "journal.sqlite3-shm"):
        (state / name).unlink(missing_ok=True)
    inodes = {p.name: p.stat().st_ino for p in out_dir.glob("*.bin")}
    again = swarmget.download(urls, out_dir)
    assert (again.ok, again.failed) == (5, 0)  # kept as the manifest's: not fetched again
    assert {p.name: p.stat().st_ino for p in out_dir.glob("*.bin")} == inodes


PLANNED_THEN_KILLED = """
import os, sys
from swarmget.options import Options
from swarmget.sinks.plan import FilePlanner
from swarmget.sources.rows import Row
planner = FilePlanner(sys.argv[1], Options())
planner.plan([Row(i, url) for i, url in enumerate(sys.argv[2:])])
os._exit(9)  # killed with its rows planned: the plan log holds their claims
"""


def test_a_journal_lost_after_a_killed_run_is_made_good_from_the_manifest(
    server: TestServer, out_dir: Path
) -> None:
    # A run killed (its claims left in the plan log), then the journal lost
    # (or removed, as the message of a damaged one says): the log's claims
    # were folded into the empty table, so the journal no longer looked lost.
    # Every file of the earlier runs failed `exists`, and the manifest was
    # rewritten with those failures: the records recovery reads, gone.
    urls = [server.file_url(f"k{i}.bin", size=2000 + i) for i in range(4)]
    assert run(urls[:3], out_dir).ok == 3
    killed = [sys.executable, "-c", PLANNED_THEN_KILLED, str(out_dir), *urls]
    assert subprocess.run(killed, env=child_env(), check=False).returncode == 9
    state = out_dir / ".swarmget"
    for name in ("journal.sqlite3", "journal.sqlite3-wal", "journal.sqlite3-shm"):
        (state / name).unlink(missing_ok=True)
    inodes = {p.name: p.stat().st_ino for p in out_dir.glob("*.bin")}
    seen = len(server.requests)
    again = run(urls, out_dir)
    assert (again.ok, again.failed) == (4, 0), again.error_counts()
    assert len(server.requests) == seen + 1  # only the row the first run never had
    assert {p.name: p.stat().st_ino for p in out_dir.glob("*.bin") if p.name in inodes} == inodes


def test_a_lost_journals_manifest_with_damaged_lines_still_vouches_for_the_rest(
    server: TestServer, out_dir: Path
) -> None:
    # A line nested deeper than json reads stopped the run with a traceback
    # (RecursionError) as the lost journal was made good, and read_manifest
    # raised it too, not the ValueError naming the line that other bad lines give.
    urls = [server.file_url(f"m{i}.bin", size=1500 + i) for i in range(3)]
    assert run(urls, out_dir).ok == 3
    state = out_dir / ".swarmget"
    with open(state / "manifest.jsonl", "ab") as manifest:
        manifest.write(b"[" * 100_000 + b"\n")
    (state / "journal.sqlite3").unlink()
    with pytest.raises(ValueError, match=r"line 4: not a JSON record"):
        swarmget.read_manifest(out_dir)
    seen = len(server.requests)
    again = run(urls, out_dir)
    assert (again.ok, again.failed, len(server.requests)) == (3, 0, seen)


def test_the_manifest_keeps_an_earlier_lists_files_not_its_failures(
    server: TestServer, out_dir: Path
) -> None:
    # Rows only an earlier run had come after this run's, with "index": null,
    # because their files are still there; its failures stayed listed too,
    # though they are neither this input's rows nor any file.
    first = [server.file_url("kept.bin", size=100), server.file_url("gone.bin", status=404)]
    assert swarmget.download(first, out_dir, retries=0).failed == 1
    second = [server.file_url("new.bin", size=100)]
    assert swarmget.download(second, out_dir).ok == 1
    listed = [(r["index"], r["path"], r["status"]) for r in journal(out_dir)]
    assert listed == [(0, "new.bin", "ok"), (None, "kept.bin", "ok")]


def test_a_run_that_stops_before_its_input_ends_keeps_the_earlier_failures_listed(
    server: TestServer, out_dir: Path
) -> None:
    # Rows not read yet may be the same input's: their failures stay on record.
    first = [server.file_url("kept.bin", size=100), server.file_url("gone.bin", status=404)]
    assert swarmget.download(first, out_dir, retries=0).failed == 1

    def stops() -> Iterator[str]:
        yield first[0]
        raise RuntimeError("the input broke")

    with pytest.raises(RuntimeError):
        swarmget.download(stops(), out_dir, retries=0)
    listed = [(r["index"], r["path"], r["status"]) for r in journal(out_dir)]
    assert listed == [(0, "kept.bin", "ok"), (None, None, "failed")]


@pytest.mark.parametrize("second", ["chunked, no validator", 'whole, ETag "B"'])
def test_a_kill_before_the_journal_hears_of_a_new_version_does_not_splice_it(
    server: TestServer, out_dir: Path, second: str
) -> None:
    # As above, but run 2 is killed (SIGKILL, the whole tree) while v2's bytes
    # are in the part and before the journal's next commit (once a second): the
    # journal still said "A" for bytes of v2, and run 3 spliced v1's rest on.
    # The part's own record of its version (beside it) now disagrees: no resume.
    phase = {"n": 1}
    half = len(_V2) // 2

    def handler(request: bytes, conn: ScriptedConnection) -> None:
        if phase["n"] == 1:
            _cut_200(conn, _V1, 'ETag: "A"\r\n')
        elif phase["n"] == 2:  # half of v2, then silence: the kill comes meanwhile
            if second.startswith("chunked"):
                conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                conn.send(b"%x\r\n" % half + _V2[:half] + b"\r\n")
            else:
                conn.send(
                    f'HTTP/1.1 200 OK\r\nContent-Length: {len(_V2)}\r\nETag: "B"\r\n\r\n'.encode()
                )
                conn.send(_V2[:half])
        else:
            _honest(conn, request, '"A"')

    with server.routed("/killed.bin", handler) as url:
        assert run([url], out_dir).failed == 1
        part = part_for(out_dir, url)
        assert part.stat().st_size == len(_V1) // 2
        phase["n"] = 2
        command = [
            sys.executable,
            "-m",
            "swarmget",
            url,
            "-o",
            str(out_dir),
            "-q",
            "--workers",
            "2",
        ]
        proc = subprocess.Popen(command, env=child_env(), start_new_session=True)
        try:
            deadline = time.monotonic() + 20
            while not _holds(part, _V2[:half]):
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.005)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            _until_unlocked(out_dir)  # the workers die a moment after the driver
        phase["n"] = 3
        assert run([url], out_dir).ok == 1
        assert (out_dir / "killed.bin").read_bytes() == _V1
        assert parts(out_dir) == []


def _holds(part: Path, body: bytes) -> bool:
    """Is ``part`` exactly ``body`` now?"""
    try:
        return part.read_bytes() == body
    except FileNotFoundError:
        return False


def _until_unlocked(out: Path) -> None:
    """Wait until no process of a killed run holds ``out``'s journal lock."""
    with open(out / ".swarmget" / LOCK_NAME, "rb") as lock:
        deadline = time.monotonic() + 10
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                assert time.monotonic() < deadline, "the killed run's processes lived on"
                time.sleep(0.01)
                continue
            fcntl.flock(lock, fcntl.LOCK_UN)
            return


def test_overwrite_leaves_no_version_of_a_part_it_does_not_continue(
    server: TestServer, out_dir: Path
) -> None:
    # The part of run 1 (ETag "A") is not continued under --overwrite, and the
    # new body has no validator: the part was replaced, but its version stayed.
    phase = {"n": 1}

    def handler(request: bytes, conn: ScriptedConnection) -> None:
        if phase["n"] == 1:
            _cut_200(conn, _V1, 'ETag: "A"\r\n')
        else:
            conn.send(f"HTTP/1.1 200 OK\r\nContent-Length: {len(_V2)}\r\n\r\n".encode() + _V2)

    with server.routed("/overwritten.bin", handler) as url:
        assert run([url], out_dir).failed == 1
        assert len(parts(out_dir)) == 2  # the part and its version
        phase["n"] = 2
        assert run([url], out_dir, overwrite=True).ok == 1
    assert (out_dir / "overwritten.bin").read_bytes() == _V2
    assert parts(out_dir) == []


def test_a_version_that_cannot_be_written_closes_the_part(
    server: TestServer, out_dir: Path
) -> None:
    # A failure to record the version (here a directory in its place, which
    # nothing can take back) failed the row and left its part open for good.
    url = server.file_url("versioned.bin", size=2 << 20)
    version = Path(f"{part_for(out_dir, url)}.version")
    version.mkdir(parents=True)
    report = run([url], out_dir, workers=1)
    (failure,) = report.failures
    assert failure.error == "io" and "version" in (failure.message or "")
    assert str(part_for(out_dir, url)) not in open_files()
    assert parts(out_dir) == [version]  # not the part: it was removed with its row
