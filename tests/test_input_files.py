"""The files a run reads its rows from are never written over or removed by it.

An input list kept in the output directory is a file at a path a row may be
given: by default (the URL of ``urls.txt``), by a ``path`` column, or by a
hard link of another name.  Such a row fails with ``exists`` and the list is
read to its end, whatever ``--overwrite`` says.  The list is known by what it
is (st_dev, st_ino), not by how it was named.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import swarmget
from swarmget.report import Report
from swarmget.sources.rows import Row
from swarmget.testing import TestServer, expected_body
from swarmget.testing.process import child_env

records = swarmget.read_manifest


@pytest.fixture(scope="module")
def server() -> Iterator[TestServer]:
    with TestServer() as srv:
        yield srv


def _list_named_like_its_first_url(server: TestServer, out: Path, other: str) -> tuple[Path, bytes]:
    """``out/urls.txt``, listing the URL of a ``urls.txt`` (its default name is
    the list's) and of ``other``; and its bytes, to see it left alone."""
    out.mkdir()
    listed = out / "urls.txt"
    listed.write_text(f"{server.file_url('urls.txt', size=50)}\n{server.file_url(other, size=5)}\n")
    return listed, listed.read_bytes()


def _input_failure(report: Report, path: str) -> None:
    (failure,) = report.failures
    assert failure.error == "exists"
    assert failure.message.startswith(f"{path} is an input list of this run"), failure.message


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("overwrite", [True, False])
def test_a_url_named_like_its_list_in_the_output_dir_leaves_the_list_alone(
    server: TestServer, tmp_path: Path, workers: int, overwrite: bool
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    urls = [server.file_url(f"in{i}.bin", size=100 + i) for i in range(40)]
    urls.insert(20, server.file_url("urls.txt", size=50))  # its default name: the list's
    listed = out / "urls.txt"
    listed.write_text("\n".join(urls) + "\n")
    before = listed.read_bytes()
    # Named another way than the row names it: the comparison is by file.
    source = str(tmp_path / "out" / ".." / "out" / "urls.txt")
    report = swarmget.download(None, out, sources=[source], overwrite=overwrite, workers=workers)
    assert listed.read_bytes() == before
    assert (report.ok, report.failed) == (40, 1)  # read to its end
    _input_failure(report, "urls.txt")
    assert (out / "in39.bin").read_bytes() == expected_body("in39.bin", 139)


def test_a_path_column_or_a_hard_link_naming_the_list_fails_that_row(
    server: TestServer, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    listed = out / "list.csv"
    rows = [
        f"{server.file_url('a.bin', size=10)},a.bin",
        f"{server.file_url('self.bin', size=11)},list.csv",  # the list itself
        f"{server.file_url('link.bin', size=12)},sub/other-name.csv",  # its hard link
        f"{server.file_url('b.bin', size=13)},b.bin",
    ]
    listed.write_text("url,path\n" + "\n".join(rows) + "\n")
    (out / "sub").mkdir()
    os.link(listed, out / "sub" / "other-name.csv")
    os.symlink(listed, tmp_path / "via-symlink.csv")
    before = listed.read_bytes()
    report = swarmget.download(
        None, out, sources=[str(tmp_path / "via-symlink.csv")], overwrite=True
    )
    assert listed.read_bytes() == before
    assert os.path.samefile(listed, out / "sub" / "other-name.csv")
    assert (report.ok, report.failed) == (2, 2)
    assert {f.message.split(" ")[0] for f in report.failures} == {
        "list.csv",
        "sub/other-name.csv",
    }
    assert {f.error for f in report.failures} == {"exists"}
    assert (out / "b.bin").read_bytes() == expected_body("b.bin", 13)


def test_a_file_an_earlier_run_wrote_is_not_removed_once_it_is_the_list(
    server: TestServer, tmp_path: Path
) -> None:
    # The journal says urls.txt is ours (run 1 downloaded it); the user then
    # wrote a list into it, in place.  Run 2 judged the file changed since
    # and removed it to fetch it again: the list, deleted as it was read.
    out = tmp_path / "out"
    own = server.file_url("urls.txt", size=30)
    assert swarmget.download([own], out).ok == 1
    listed = out / "urls.txt"
    other = server.file_url("other.bin", size=20)
    with open(listed, "w") as f:  # same inode: the journal's file, changed
        f.write(f"{own}\n{other}\n")
    before = listed.read_bytes()
    report = swarmget.download(None, out, sources=[str(listed)])
    assert listed.read_bytes() == before
    assert (report.ok, report.failed) == (1, 1)
    _input_failure(report, "urls.txt")


def test_stdin_from_a_file_in_the_output_dir_is_an_input_too(
    server: TestServer, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    listed, before = _list_named_like_its_first_url(server, out, "s.bin")
    with open(listed, "rb") as stdin:
        done = subprocess.run(
            [sys.executable, "-m", "swarmget", "-", "-o", str(out), "--overwrite", "-q"],
            stdin=stdin,
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=60,
        )
    assert done.returncode == 1, done.stderr
    assert listed.read_bytes() == before
    (failed,) = [r for r in records(out) if r["status"] == "failed"]
    assert failed["error"] == "exists"
    assert failed["message"].startswith("urls.txt is an input list of this run")
    assert (out / "s.bin").read_bytes() == expected_body("s.bin", 5)


def test_a_symlink_into_the_state_directory_leads_no_row_to_the_journal(
    server: TestServer, tmp_path: Path
) -> None:
    # The name .swarmget is refused in a path; a symlink of the user's to it
    # was not, and s/journal.sqlite3 replaced the run's own journal.
    out = tmp_path / "out"
    first = server.file_url("first.bin", size=10)
    assert swarmget.download([first], out).ok == 1
    os.symlink(".swarmget", out / "s")
    state = sorted(os.listdir(out / ".swarmget"))
    journal = (out / ".swarmget" / "journal.sqlite3").stat()
    rows = [
        Row(0, first),
        Row(1, server.file_url("j.bin", size=10), "s/journal.sqlite3"),
        Row(2, server.file_url("m.bin", size=10), "s/manifest.jsonl"),
        Row(3, server.file_url("n.bin", size=10), "s/new.bin"),
    ]
    report = swarmget.download(rows, out, overwrite=True)
    assert (report.ok, report.failed) == (1, 3)
    assert {f.error for f in report.failures} == {"bad_path"}
    assert all("resolves into swarmget's own .swarmget" in f.message for f in report.failures)
    assert sorted(os.listdir(out / ".swarmget")) == state
    assert (out / ".swarmget" / "journal.sqlite3").stat().st_ino == journal.st_ino
    assert {r["index"] for r in records(out)} == {0, 1, 2, 3}


def test_only_lists_a_path_in_the_output_dir_can_lead_to_are_compared(tmp_path: Path) -> None:
    # A list kept outside the output dir, the usual case, costs no stat a row.
    from swarmget.sources.reader import input_files

    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "outside.txt"
    inside = out / "inside.txt"
    linked = tmp_path / "linked.txt"  # outside, with a hard link in out
    for path in (outside, inside, linked):
        path.write_text("http://h/a\n")
    os.link(linked, out / "other-name.txt")
    os.symlink(inside, tmp_path / "to-inside.txt")

    def identity(path: Path) -> tuple[int, int]:
        info = path.stat()
        return info.st_dev, info.st_ino

    sources = [str(p) for p in (outside, linked, tmp_path / "to-inside.txt")]
    assert input_files(sources, within=str(out)) == {identity(linked), identity(inside)}
    assert input_files(sources) == {identity(outside), identity(linked), identity(inside)}
    with open(inside, "rb") as stdin:
        assert input_files(["-"], stdin, within=str(out)) == {identity(inside)}
    with open(outside, "rb") as stdin:
        assert input_files(["-"], stdin, within=str(out)) == frozenset()


def test_sources_given_as_a_generator_are_read_and_guarded(
    server: TestServer, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    listed, before = _list_named_like_its_first_url(server, out, "g.bin")
    report = swarmget.download(None, out, sources=(s for s in [str(listed)]), overwrite=True)
    assert listed.read_bytes() == before
    assert (report.ok, report.failed) == (1, 1)
    _input_failure(report, "urls.txt")
