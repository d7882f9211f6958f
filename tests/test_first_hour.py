"""What a new user meets in the first hour: duplicates, --dedupe, progress, API traps."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import swarmget
from swarmget import cli
from swarmget.report import Report, Snapshot
from swarmget.sources.rows import Row
from swarmget.testing import TestServer, expected_body
from swarmget.testing.process import child_env


@pytest.fixture(scope="module")
def server() -> Iterator[TestServer]:
    with TestServer() as srv:
        yield srv


records = swarmget.read_manifest  # one dict per manifest line


def requests_for(server: TestServer, name: str, since: int) -> int:
    return sum(1 for r in server.requests[since:] if f"/files/{name}?".encode() in r)


@pytest.mark.parametrize("workers", [1, 2])
def test_duplicates_get_a_record_each_and_a_rerun_does_nothing(
    server: TestServer, tmp_path: Path, workers: int
) -> None:
    a, b = server.file_url("a.jpg", size=300), server.file_url("b.jpg", size=400)
    urls = [a, b, a, a]
    first = swarmget.download(urls, tmp_path, workers=workers)
    assert (first.ok, first.failed) == (4, 0)
    assert sorted(os.listdir(tmp_path)) == [".swarmget", "a-1.jpg", "a-2.jpg", "a.jpg", "b.jpg"]
    got = sorted((r["index"], r["path"]) for r in records(tmp_path))
    assert got == [(0, "a.jpg"), (1, "b.jpg"), (2, "a-1.jpg"), (3, "a-2.jpg")]
    seen = len(server.requests)
    again = swarmget.download(urls, tmp_path, workers=workers)
    assert (again.ok, again.failed, again.skipped) == (0, 0, 4)
    assert len(server.requests) == seen
    assert sorted(r["index"] for r in records(tmp_path)) == [0, 1, 2, 3]


def test_duplicates_across_dealing_batches_keep_their_identity(
    server: TestServer, tmp_path: Path
) -> None:
    # 600 rows: the copies of one URL fall into different batches of 256.
    urls = [server.file_url(f"u{i % 200}.bin", size=100) for i in range(600)]
    assert swarmget.download(urls, tmp_path, workers=1).ok == 600
    again = swarmget.download(urls, tmp_path, workers=1)
    assert (again.ok, again.skipped) == (0, 600)
    assert len(records(tmp_path)) == 600


@pytest.mark.parametrize("workers", [1, 2])
def test_dedupe_fetches_each_url_once_and_links_the_rest(
    server: TestServer, tmp_path: Path, workers: int
) -> None:
    a, b = server.file_url("da.bin", size=5000), server.file_url("db.bin", size=6000)
    urls = [a, b, a, a, b]
    seen = len(server.requests)
    report = swarmget.download(urls, tmp_path, workers=workers, dedupe=True)
    assert (report.ok, report.failed) == (5, 0)
    assert requests_for(server, "da.bin", seen) == 1
    assert requests_for(server, "db.bin", seen) == 1
    # The copies' bytes are the run's files, not what it received (mb_per_s).
    assert (report.bytes, report.received) == (2 * 6000 + 3 * 5000, 5000 + 6000)
    copies = ["da.bin", "da-1.bin", "da-2.bin"]
    for name in copies:
        assert (tmp_path / name).read_bytes() == expected_body("da.bin", 5000)
    assert len({(tmp_path / name).stat().st_ino for name in copies}) == 1  # hard links
    by_index = {r["index"]: r for r in records(tmp_path)}
    assert sorted(by_index) == [0, 1, 2, 3, 4]
    assert {r["status"] for r in by_index.values()} == {"ok"}
    assert by_index[2]["message"] == "same URL as da.bin: linked"
    seen = len(server.requests)
    again = swarmget.download(urls, tmp_path, workers=workers, dedupe=True)
    assert (again.ok, again.skipped) == (0, 5)
    assert len(server.requests) == seen


def test_dedupe_takes_urls_that_ask_for_the_same_thing_as_one(
    server: TestServer, tmp_path: Path
) -> None:
    # The fragment never leaves the client; scheme and host are case-blind; the
    # default port and dot segments are spelled away.  Another credential is
    # another request.
    a = server.file_url("dn.bin", size=3000)
    head, _, tail = a.partition("://")
    host, _, rest = tail.partition("/")
    same = [
        f"{a}#one",
        f"HTTP://{host.upper()}/x/../{rest}",
        f"{head}://{host}/./{rest}#two",
    ]
    other = f"{head}://user:pw@{host}/{rest}"
    seen = len(server.requests)
    paths = ["a.bin", "b.bin", "c.bin", "d.bin"]
    rows = [
        Row(i, url, path) for i, (url, path) in enumerate(zip([*same, other], paths, strict=True))
    ]
    report = swarmget.download(rows, tmp_path, dedupe=True)
    assert (report.ok, report.failed) == (4, 0)
    assert requests_for(server, "dn.bin", seen) == 2
    assert len({(tmp_path / p).stat().st_ino for p in paths[:3]}) == 1
    assert (tmp_path / "d.bin").stat().st_ino != (tmp_path / "a.bin").stat().st_ino


def test_dedupe_copies_record_what_their_file_was_checked_and_fetched_as(
    server: TestServer, tmp_path: Path
) -> None:
    """A copy's record has the digests --hash recorded and where redirects led,
    as the row that fetched the file has: every record of a file says the same."""
    url = server.file_url("dh.bin", size=4000, redirect=2)
    report = swarmget.download([url, url], tmp_path, workers=1, dedupe=True, hash="sha256")
    assert report.ok == 2
    first, copy = records(tmp_path)
    assert first["sha256"] == hashlib.sha256(expected_body("dh.bin", 4000)).hexdigest()
    assert first["final_url"] != url
    assert (copy["sha256"], copy["final_url"]) == (first["sha256"], first["final_url"])


def test_a_dedupe_rerun_waits_for_the_leaders_new_outcome(
    server: TestServer, tmp_path: Path
) -> None:
    # The first run fails all three (one request, a 503); the rerun's request
    # succeeds, and the copies follow it, not the first run's failure.
    url = server.file_url("again.bin", size=1000, status=503, times=1)
    first = swarmget.download([url] * 3, tmp_path, workers=1, dedupe=True, retries=0)
    assert (first.ok, first.failed) == (0, 3)
    again = swarmget.download([url] * 3, tmp_path, workers=1, dedupe=True, retries=0)
    assert (again.ok, again.failed, again.error_counts()) == (3, 0, {})
    body = expected_body("again.bin", 1000)
    assert [(tmp_path / n).read_bytes() for n in ("again.bin", "again-1.bin", "again-2.bin")] == [
        body
    ] * 3


def test_dedupe_with_overwrite_fetches_anew_whatever_the_order(tmp_path: Path) -> None:
    # The copies came first in the reordered rerun: they were linked to the old
    # file of an earlier run's leader before the leader's new download.
    from swarmget.testing import ScriptedConnection

    version = [b"version1"]

    def serve(head: bytes, conn: ScriptedConnection) -> None:
        body = version[0]
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    with TestServer() as srv:
        srv.route("/v.bin", serve)
        url = srv.url("/v.bin")
        rows = [Row(i, url, path=f"x{i}.bin") for i in range(3)]
        first = swarmget.download(rows, tmp_path, workers=1, dedupe=True)
        assert first.ok == 3
        version[0] = b"version2!"
        again = [Row(i, row.url, path=row.path) for i, row in enumerate(reversed(rows))]
        second = swarmget.download(again, tmp_path, workers=1, dedupe=True, overwrite=True)
    assert second.ok == 3
    assert {(tmp_path / f"x{i}.bin").read_bytes() for i in range(3)} == {b"version2!"}


def test_a_copy_of_an_earlier_runs_file_says_so(server: TestServer, tmp_path: Path) -> None:
    url = server.file_url("early.bin", size=500)
    assert swarmget.download([url], tmp_path, workers=1, dedupe=True).ok == 1
    again = swarmget.download([url, url], tmp_path, workers=1, dedupe=True)
    assert (again.ok, again.skipped) == (1, 1)
    (copy,) = [r for r in records(tmp_path) if r["index"] == 1]
    # Not "row 0": that number was the earlier input's, not this one's.
    assert copy["message"] == "same URL as early.bin: linked"
    assert (tmp_path / "early-1.bin").read_bytes() == expected_body("early.bin", 500)


def test_dedupe_passes_a_failure_on_to_every_copy(server: TestServer, tmp_path: Path) -> None:
    bad = server.file_url("gone.bin", status=404)
    report = swarmget.download([bad, bad, bad], tmp_path, workers=1, dedupe=True, retries=0)
    assert report.failed == 3
    assert report.error_counts() == {"http_404": 3}
    # Each copy's record says the status beside its error, as the first row's does.
    assert [r["http_status"] for r in records(tmp_path)] == [404, 404, 404]


def test_a_reordered_list_reruns_cleanly(server: TestServer, tmp_path: Path) -> None:
    # Two URLs with the same last segment: their names depend on input order.
    x = server.file_url("x/photo.jpg", size=111)
    y = server.file_url("y/photo.jpg", size=222)
    z = server.file_url("z.jpg", size=333)
    assert swarmget.download([x, y, z], tmp_path).ok == 3
    names = {r["url"]: r["path"] for r in records(tmp_path)}
    seen = len(server.requests)
    again = swarmget.download([z, y, x], tmp_path)
    assert (again.ok, again.failed, again.skipped) == (0, 0, 3)
    assert len(server.requests) == seen
    assert {r["url"]: r["path"] for r in records(tmp_path)} == names
    assert {r["url"]: r["index"] for r in records(tmp_path)} == {z: 0, y: 1, x: 2}
    assert (tmp_path / names[y]).read_bytes() == expected_body("y/photo.jpg", 222)


def test_progress_with_workers_counts_every_row_and_skipped_ones(
    server: TestServer, tmp_path: Path
) -> None:
    urls = [server.file_url(f"p{i}.bin", size=200) for i in range(301)]

    class Recorder:
        def __init__(self) -> None:
            self.last: Snapshot | None = None
            self.final: Report | None = None

        def start(self) -> None:
            pass

        def update(self, snapshot: Snapshot) -> None:
            self.last = snapshot

        def finish(self, report: Report) -> None:
            self.final = report

    first = swarmget.download(urls[:150], tmp_path, workers=2)
    assert first.ok == 150
    recorder = Recorder()
    report = swarmget.download(urls, tmp_path, workers=2, progress=recorder)
    assert (report.ok, report.skipped) == (151, 150)
    assert recorder.final is report
    # The last update before the end already counts every row, skipped ones too.
    snapshot = recorder.last
    assert snapshot is not None
    assert (snapshot.done, snapshot.failed, snapshot.rows_seen) == (301, 0, 301)
    assert snapshot.input_done and snapshot.active == 0


def test_a_string_is_not_a_list_of_urls(tmp_path: Path) -> None:
    for wrong in ("http://h/a.jpg", b"http://h/a.jpg"):
        with pytest.raises(TypeError, match=r"pass \[url\] for one URL"):
            swarmget.download(wrong, tmp_path)  # type: ignore[arg-type]
    assert not (tmp_path / ".swarmget").exists()


def test_urls_that_are_not_iterable_are_refused_before_the_run(tmp_path: Path) -> None:
    # It raised "'int' object is not iterable" from the first read of the rows,
    # the output dir made and its state written already.
    for wrong in (5, None.__class__, object()):
        with pytest.raises(TypeError, match=r"`urls` must be an iterable of URLs"):
            swarmget.download(wrong, tmp_path / "out")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"`urls` must be an iterable of URLs"):
            swarmget.stream(wrong)  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()


def test_a_dest_or_sources_of_the_wrong_type_is_named(tmp_path: Path) -> None:
    # os.fspath's "expected str, bytes or os.PathLike object, not int" named
    # neither, and sources=5 raised "'int' object is not iterable".
    for dest in (5, None, ["out"]):
        with pytest.raises(TypeError, match=r"`dest` must be a path"):
            swarmget.download([], dest)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"`dest` must be a path"):
            swarmget.download(None, dest, sources=[str(tmp_path / "list.txt")])  # type: ignore[arg-type]
    # A false one (0, "") too: stream() took it for no sources at all.
    for sources in (5, [5], ["a.txt", None], 0, "", b""):
        with pytest.raises(TypeError, match=r"`sources` must be a list of paths or URLs"):
            swarmget.download(None, tmp_path / "out", sources=sources)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"`sources` must be a list of paths or URLs"):
            swarmget.stream(sources=sources)  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()


def test_a_misspelt_option_is_refused_with_the_name_it_is_closest_to(tmp_path: Path) -> None:
    with pytest.raises(swarmget.UsageError, match=r"concurency \(did you mean concurrency\?\)$"):
        swarmget.download([], tmp_path, concurency=8)
    with pytest.raises(swarmget.UsageError, match=r"perhost \(did you mean per_host\?\)$"):
        swarmget.stream([], perhost=8)
    with pytest.raises(swarmget.UsageError, match=r"^unknown option\(s\): zzz$"):
        swarmget.download([], tmp_path, zzz=1)  # nothing close: no hint
    assert not any(tmp_path.iterdir())


def test_items_that_are_not_str_urls(server: TestServer, tmp_path: Path) -> None:
    url = server.file_url("nb.bin", size=10)
    items: list[object] = [url.encode(), None, 7, {"url": url}, ("a", "b"), url]
    report = swarmget.download(items, tmp_path, retries=0)  # type: ignore[arg-type]
    assert (report.ok, report.failed) == (2, 4)
    records = {r["index"]: r for r in swarmget.read_manifest(tmp_path)}
    assert records[0]["status"] == "ok"  # bytes: decoded
    assert records[1]["error"] == "bad_row" and "is None, not a URL" in records[1]["message"]
    assert "of type int" in records[2]["message"]
    assert records[3]["error"] == "bad_row" and records[3]["url"].startswith("{'url'")


def test_urls_after_sources_are_numbered_on_from_them(server: TestServer, tmp_path: Path) -> None:
    listed = tmp_path / "list.txt"
    listed.write_text("".join(server.file_url(f"s{i}.bin", size=10) + "\n" for i in range(3)))
    more = [server.file_url(f"m{i}.bin", size=10) for i in range(2)]
    report = swarmget.download(more, tmp_path / "out", sources=[str(listed)])
    assert report.ok == 5
    paths = {r["index"]: r["path"] for r in swarmget.read_manifest(tmp_path / "out")}
    # They used to start again at 0: two records per index, an ordered stream confused.
    assert paths == {0: "s0.bin", 1: "s1.bin", 2: "s2.bin", 3: "m0.bin", 4: "m1.bin"}


def test_no_two_rows_share_an_index(server: TestServer, tmp_path: Path) -> None:
    # A Row keeps its index; the rows around it are numbered on from the
    # highest so far.  A URL after Row(1) was numbered by its place: 1 as well.
    urls = [server.file_url(f"n{i}.bin", size=10) for i in range(4)]
    items = [Row(1, urls[0]), urls[1], Row(7, urls[2]), urls[3]]
    report = swarmget.download(items, tmp_path / "out")
    assert report.ok == 4
    paths = {r["index"]: r["path"] for r in swarmget.read_manifest(tmp_path / "out")}
    assert paths == {1: "n0.bin", 2: "n1.bin", 7: "n2.bin", 8: "n3.bin"}
    # Any order, when only Rows give them (a shuffled epoch).
    with swarmget.stream([Row(9, urls[0]), Row(3, urls[1])], ordered=True) as stream:
        assert [item.index for item in stream] == [9, 3]


def test_a_rows_own_index_may_be_any_int_when_swarmget_numbered_none(
    server: TestServer, tmp_path: Path
) -> None:
    # Negative ones too (they were refused, "above -1"); a bool is the int it
    # is, alike in both builds (a compiled Row stores True as 1).
    urls = [server.file_url(f"m{i}.bin", size=10) for i in range(3)]
    report = swarmget.download([Row(-5, urls[0]), Row(True, urls[1]), Row(-1, urls[2])], tmp_path)
    assert report.ok == 3
    records = swarmget.read_manifest(tmp_path)
    assert sorted(r["index"] for r in records) == [-5, -1, 1]
    assert all(type(r["index"]) is int for r in records)


def test_a_row_index_that_sources_rows_may_have_is_refused(
    server: TestServer, tmp_path: Path
) -> None:
    # The rows of sources= are 0, 1 and 2: a Row(0) after them was a second
    # record of index 0 in the manifest, and a second item 0 in a stream.
    listed = tmp_path / "list.txt"
    listed.write_text("".join(server.file_url(f"s{i}.bin", size=10) + "\n" for i in range(3)))
    mine = [Row(0, server.file_url("mine.bin", size=10))]
    refused = "urls item 0 is a Row with index 0, which may be another row's"
    with pytest.raises(swarmget.UsageError, match=refused):
        swarmget.download(mine, tmp_path / "out", sources=[str(listed)])
    indices = [r["index"] for r in swarmget.read_manifest(tmp_path / "out")]
    assert sorted(indices) == [0, 1, 2]  # what was read before it is done and recorded
    stream = swarmget.stream(mine, sources=[str(listed)])
    with stream, pytest.raises(swarmget.UsageError, match=refused):
        list(stream)
    with pytest.raises(swarmget.UsageError, match="index -1, which may be another row's"):
        swarmget.download([Row(-1, mine[0].url)], tmp_path / "neg", sources=[str(listed)])
    # Above them, a Row's own index is taken as it is.
    report = swarmget.download([Row(3, mine[0].url)], tmp_path / "ok", sources=[str(listed)])
    assert report.ok == 4
    assert sorted(r["index"] for r in swarmget.read_manifest(tmp_path / "ok")) == [0, 1, 2, 3]


def test_an_empty_input_warns_at_the_callers_line(tmp_path: Path) -> None:
    # The warning named swarmget's own wrapper (swarmget/__init__.py) as its
    # place, in the pure build; the line to fix is the caller's.
    from swarmget.api import download

    for entry in (swarmget.download, download):
        with pytest.warns(UserWarning, match="no rows") as caught:
            report = entry([], tmp_path)
        assert report.total == 0
        assert caught[0].filename == __file__, caught[0].filename


def test_the_cli_warns_about_an_empty_list(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing yet\n")
    done = subprocess.run(
        [sys.executable, "-m", "swarmget", str(empty), "-o", str(tmp_path / "out"), "-q"],
        capture_output=True, text=True, env=child_env(), timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0
    assert "no rows" in done.stderr


def test_the_manifest_reads_back(server: TestServer, tmp_path: Path) -> None:
    urls = [server.file_url("m1.bin", size=10), server.file_url("m2.bin", status=404)]
    swarmget.download(urls, tmp_path, retries=0)
    got = swarmget.read_manifest(tmp_path)
    assert [(r["index"], r["status"]) for r in got] == [(0, "ok"), (1, "failed")]
    assert got[1]["error"] == "http_404"
    with pytest.raises(swarmget.UsageError, match="no manifest"):
        swarmget.read_manifest(tmp_path / "nowhere")


def test_a_damaged_manifest_names_its_line_and_the_file_itself_reads(
    server: TestServer, tmp_path: Path
) -> None:
    swarmget.download([server.file_url(f"dm{i}.bin", size=10) for i in range(3)], tmp_path)
    manifest = tmp_path / ".swarmget" / "manifest.jsonl"
    assert len(records(manifest)) == 3  # the file, not only its directory
    lines = manifest.read_bytes().splitlines(keepends=True)
    manifest.write_bytes(lines[0] + b"{not json\n" + lines[2])
    with pytest.raises(ValueError, match=r"manifest.jsonl, line 2: not a JSON record"):
        records(tmp_path)
    manifest.write_bytes(lines[0] + lines[1] + b'{"url": "\xff"}\n')
    with pytest.raises(ValueError, match="line 3"):
        records(tmp_path)
    with pytest.raises(swarmget.UsageError, match="no manifest"):
        records(tmp_path / "nowhere")


def test_the_manifest_as_a_table(server: TestServer, tmp_path: Path) -> None:
    pyarrow = pytest.importorskip("pyarrow")
    swarmget.download([server.file_url("t.bin", size=10)], tmp_path)
    table = swarmget.manifest_table(tmp_path)
    assert isinstance(table, pyarrow.Table)
    assert table.column("status").to_pylist() == ["ok"]
    assert table.column("bytes").to_pylist() == [10]


def test_dedupe_copies_into_new_directories_and_never_out_of_the_output_dir(
    server: TestServer, tmp_path: Path
) -> None:
    # A copy's file goes where a download's would: its directories are made
    # (it failed with `io`), and a symlinked one leading out of the output dir
    # is refused (the copy was written, even replaced, outside it).
    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    (outside / "victim.bin").write_bytes(b"victim")
    (out / "away").symlink_to(outside)
    url = server.file_url("dd.bin", size=5000)
    rows = [
        Row(0, url, path="dd.bin"),
        Row(1, url, path="new/dir/dd.bin"),
        Row(2, url, path="away/dd.bin"),
        Row(3, url, path="away/victim.bin"),
    ]
    for overwrite in (False, True):
        report = swarmget.download(rows, out, workers=1, dedupe=True, overwrite=overwrite)
        by_index = {r["index"]: r for r in records(out)}
        assert (by_index[0]["status"], by_index[1]["status"]) == ("ok", "ok"), by_index
        assert (out / "new/dir/dd.bin").read_bytes() == expected_body("dd.bin", 5000)
        assert by_index[2]["error"] == "bad_path", by_index
        # Without --overwrite the file already there is someone else's.
        assert by_index[3]["error"] == ("bad_path" if overwrite else "exists"), by_index
        assert sorted(p.name for p in outside.iterdir()) == ["victim.bin"]
        assert (outside / "victim.bin").read_bytes() == b"victim"
        assert report.failed == 2


def test_a_path_thousands_of_levels_deep_is_made_without_recursion(
    server: TestServer, tmp_path: Path
) -> None:
    # os.makedirs recursed once per level: RecursionError, reported as `protocol`.
    deep = "q/" * 1500 + "deep.bin"
    report = swarmget.download(
        [Row(0, server.file_url("deep.bin", size=100), path=deep)], tmp_path, workers=1
    )
    try:
        assert report.ok == 1, [r["message"] for r in records(tmp_path)]
        assert (tmp_path / deep).read_bytes() == expected_body("deep.bin", 100)
    finally:  # shutil.rmtree (pytest's clean-up) recurses once per level too
        (tmp_path / deep).unlink(missing_ok=True)
        level = (tmp_path / deep).parent
        while level != tmp_path:
            if level.is_dir():
                level.rmdir()
            level = level.parent


def test_urls_read_from_a_file_object_keep_no_line_ends(server: TestServer, tmp_path: Path) -> None:
    # The "\n" stayed in the URL: the files were named "a.bin_" ("a.bin__" for CRLF).
    urls = tmp_path / "urls.txt"
    a, b = server.file_url("fa.bin", size=10), server.file_url("fb.tar.gz", size=20)
    urls.write_bytes(f"{a}\n  {b}\r\n".encode())
    with open(urls) as lines:
        report = swarmget.download(lines, tmp_path / "out", workers=1)
    assert report.ok == 2
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name != ".swarmget") == [
        "fa.bin",
        "fb.tar.gz",
    ]
    assert [r["url"] for r in records(tmp_path / "out")] == [a, b]


def test_dedupe_never_skips_a_rows_own_checksums_or_size(
    server: TestServer, tmp_path: Path
) -> None:
    # A copy took the first row's file whatever its own sha256 or size said.
    import hashlib

    url = server.file_url("dv.bin", size=700)
    good = hashlib.sha256(expected_body("dv.bin", 700)).hexdigest()
    rows = [
        Row(0, url, path="lead.bin"),
        Row(1, url, path="badsha.bin", sha256="0" * 64),
        Row(2, url, path="badsize.bin", size=5),
        Row(3, url, path="goodcopy.bin", sha256=good, size=700),
        Row(4, url, path="plaincopy.bin"),
    ]
    report = swarmget.download(rows, tmp_path, workers=1, dedupe=True, retries=0)
    by_path = {r["index"]: r for r in records(tmp_path)}
    assert (by_path[1]["error"], by_path[2]["error"]) == ("checksum", "size_mismatch")
    assert not (tmp_path / "badsha.bin").exists() and not (tmp_path / "badsize.bin").exists()
    for name in ("lead.bin", "goodcopy.bin", "plaincopy.bin"):
        assert (tmp_path / name).read_bytes() == expected_body("dv.bin", 700)
    assert (report.ok, report.failed) == (3, 2)


class _Listener:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.bytes: list[int] = []

    def start(self) -> None:
        self.calls.append("start")

    def update(self, snapshot: Snapshot) -> None:
        self.bytes.append(snapshot.bytes)

    def finish(self, report: Report) -> None:
        self.calls.append("finish")


def test_a_progress_listener_is_finished_however_the_run_ends(
    server: TestServer, tmp_path: Path
) -> None:
    # finish() came only after a run that ended well: not after the input
    # raised, a fatal error or Ctrl-C.
    def rows() -> Iterator[str]:
        yield server.file_url("pf0.bin", size=10)
        raise RuntimeError("the caller's list broke")

    listener = _Listener()
    with pytest.raises(RuntimeError, match="list broke"):
        swarmget.download(rows(), tmp_path / "a", workers=1, progress=listener)
    assert listener.calls == ["start", "finish"]


def test_progress_bytes_never_go_down(server: TestServer, tmp_path: Path) -> None:
    # A transfer cut halfway left the in-flight sum, and its retry (from zero,
    # the server ignores Range) waited 0.5 s for its answer: 1.5 MiB -> 0.
    url = server.file_url("pb.bin", size=3 << 20, fault="stall", times=1, norange=1, latency=0.5)
    listener = _Listener()
    report = swarmget.download([url], tmp_path, workers=1, retries=2, timeout=1, progress=listener)
    assert report.ok == 1
    assert listener.bytes == sorted(listener.bytes) and listener.bytes[-1] == 3 << 20


def test_rows_only_an_earlier_run_had_are_listed_without_an_index(
    server: TestServer, tmp_path: Path
) -> None:
    """A shorter list: every index in the manifest is a row of this input, once."""
    urls = [server.file_url(f"short{i}.bin", size=100) for i in range(5)]
    assert swarmget.download(urls, tmp_path, workers=1).ok == 5
    again = swarmget.download(urls[2:], tmp_path, workers=1)
    assert again.skipped == 3
    listed = records(tmp_path)
    assert [r["index"] for r in listed] == [0, 1, 2, None, None]
    assert [r["path"] for r in listed] == [f"short{i}.bin" for i in (2, 3, 4, 0, 1)]


def test_rows_from_python_are_held_to_the_rules_of_a_csv_row(
    server: TestServer, tmp_path: Path
) -> None:
    """A Row whose url is not a str failed the whole run (its rows unrecorded); an
    upper-case digest or a size given as text failed a good file after its download."""
    body = expected_body("rv.bin", 1000)
    url = server.file_url("rv.bin", size=1000)
    try:
        ill_typed = [
            Row(0, url, sha256=hashlib.sha256(body).hexdigest().upper(), size="1000"),  # type: ignore[arg-type]
            Row(1, None),  # type: ignore[arg-type]
            Row(4, 42),  # type: ignore[arg-type]
        ]
    except TypeError:  # the compiled Row checks its types itself: nothing to get through
        ill_typed = [
            Row(0, url, sha256=hashlib.sha256(body).hexdigest().upper(), size=1000),
            Row(1, url, size=-2),
            Row(4, url, md5="xyz"),
        ]
    rows = [
        *ill_typed[:2],
        Row(2, url, md5=hashlib.md5(body).hexdigest().upper()),
        Row(3, url, size=-1),
        ill_typed[2],
        Row(5, url, sha256="ab"),
    ]
    seen = len(server.requests)
    report = swarmget.download(rows, tmp_path, workers=1, retries=0)
    assert report.ok == 2
    assert {f.index: f.error for f in report.failures} == {
        1: "bad_row",
        3: "bad_row",
        4: "bad_row",
        5: "bad_row",
    }
    assert len(server.requests) - seen == 2  # the bad rows were never fetched
    assert [r["index"] for r in records(tmp_path)] == [0, 1, 2, 3, 4, 5]


# -- a path column is that path, across runs -------------------------------------------


def test_a_fixed_url_gets_the_path_its_failed_predecessor_claimed(
    server: TestServer, tmp_path: Path
) -> None:
    wrong = server.file_url("fx.bin", size=10, status=404)
    right = server.file_url("fx.bin", size=10)
    assert swarmget.download([Row(0, wrong, "img.jpg")], tmp_path).failed == 1
    report = swarmget.download([Row(0, right, "img.jpg")], tmp_path)
    assert (report.ok, report.failed) == (1, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".swarmget", "img.jpg"]
    assert (tmp_path / "img.jpg").read_bytes() == expected_body("fx.bin", 10)


def test_a_new_url_for_a_done_path_needs_overwrite_and_is_never_renamed(
    server: TestServer, tmp_path: Path
) -> None:
    v1, v2 = server.file_url("v1.bin", size=10), server.file_url("v2.bin", size=12)
    assert swarmget.download([Row(0, v1, "data.bin")], tmp_path).ok == 1
    kept = swarmget.download([Row(0, v2, "data.bin")], tmp_path)
    assert kept.error_counts() == {"exists": 1}
    assert "use --overwrite" in kept.failures[0].message
    assert (tmp_path / "data.bin").read_bytes() == expected_body("v1.bin", 10)
    replaced = swarmget.download([Row(0, v2, "data.bin")], tmp_path, overwrite=True)
    assert (replaced.ok, replaced.failed) == (1, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".swarmget", "data.bin"]
    assert (tmp_path / "data.bin").read_bytes() == expected_body("v2.bin", 12)
    # The earlier row is gone from the manifest: one file, one record.
    assert [(r["url"], r["path"]) for r in records(tmp_path)] == [(v2, "data.bin")]


def test_a_manifest_fed_back_as_the_input_is_done_already(
    server: TestServer, tmp_path: Path
) -> None:
    urls = [server.file_url(f"mf{i}.bin", size=100 + i) for i in range(3)]
    assert swarmget.download(urls, tmp_path).ok == 3
    rows = [Row(r["index"], r["url"], r["path"]) for r in records(tmp_path)]
    seen = len(server.requests)
    again = swarmget.download(rows, tmp_path)
    assert (again.ok, again.failed, again.received) == (3, 0, 0)
    assert len(server.requests) == seen
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".swarmget",
        *(f"mf{i}.bin" for i in range(3)),
    ]
    assert [(r["index"], r["path"]) for r in records(tmp_path)] == [
        (i, f"mf{i}.bin") for i in range(3)
    ]
    third = swarmget.download(rows, tmp_path)
    assert (third.ok, third.skipped) == (0, 3)
    assert len(server.requests) == seen


def test_two_rows_of_one_input_with_one_path_the_second_fails(
    server: TestServer, tmp_path: Path
) -> None:
    a, b = server.file_url("tw1.bin", size=10), server.file_url("tw2.bin", size=10)
    report = swarmget.download([Row(0, a, "same.bin"), Row(1, b, "same.bin")], tmp_path)
    assert report.error_counts() == {"exists": 1}
    assert report.failures[0].index == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [".swarmget", "same.bin"]


# -- the library's own arguments -------------------------------------------------------


def test_download_progress_true_shows_the_display_on_stderr(
    server: TestServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Not a terminal here: plain lines, the first after PLAIN_INTERVAL.
    from swarmget.progress import PLAIN_INTERVAL

    slow = server.file_url("pt.bin", size=10, latency=PLAIN_INTERVAL + 0.3)
    report = swarmget.download([slow], tmp_path, progress=True)
    assert report.ok == 1
    assert "0/1" in capfd.readouterr().err


def test_download_output_directory_arguments(server: TestServer, tmp_path: Path) -> None:
    url = server.file_url("od.bin", size=10)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(swarmget.UsageError, match="exists and is not a directory"):
        swarmget.download([url], tmp_path / "afile")
    assert (tmp_path / "afile").read_text() == "x"
    # A dangling symlink: not "exists and is not a directory" (where no file is).
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(
        swarmget.UsageError, match=r"is a symlink to .*gone.*, which does not exist"
    ):
        swarmget.download([url], tmp_path / "link")
    assert not (tmp_path / "gone").exists()
    assert swarmget.download([url], os.fsencode(tmp_path / "as-bytes")).ok == 1
    assert (tmp_path / "as-bytes" / "od.bin").read_bytes() == expected_body("od.bin", 10)


def test_an_output_directory_inside_a_runs_state_directory_is_refused(
    server: TestServer, tmp_path: Path
) -> None:
    url = server.file_url("sd.bin", size=10)
    assert swarmget.download([url], tmp_path / "out").ok == 1
    # Also through a symlink: the run's files went in beside the journal.
    (tmp_path / "state").symlink_to(tmp_path / "out" / ".swarmget")
    (tmp_path / "parts").symlink_to(tmp_path / "out" / ".swarmget" / "parts")
    for inner in (
        tmp_path / "out" / ".swarmget",
        tmp_path / "out" / ".swarmget" / "parts",
        tmp_path / "state",
        tmp_path / "state" / "new",
        tmp_path / "parts",
    ):
        with pytest.raises(swarmget.UsageError, match=r"inside a run's \.swarmget directory"):
            swarmget.download([url], inner)
    assert cli.main(["-q", "-o", str(tmp_path / "state"), url]) == 2
    assert (
        sorted(p.name for p in (tmp_path / "out" / ".swarmget").iterdir() if p.suffix == ".bin")
        == []
    )


def test_a_directory_made_where_a_done_file_was_fails_at_once(
    server: TestServer, tmp_path: Path
) -> None:
    url = server.file_url("dir-now", size=10)
    assert swarmget.download([url], tmp_path).ok == 1
    (tmp_path / "dir-now").unlink()
    (tmp_path / "dir-now").mkdir()
    seen = len(server.requests)
    report = swarmget.download([url], tmp_path)
    assert report.error_counts() == {"exists": 1}
    assert report.failures[0].message == "dir-now is a directory now (it held this row's file)"
    assert len(server.requests) == seen  # not downloaded only to fail at the rename
    assert (tmp_path / "dir-now").is_dir()


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_earlier_runs_row_still_in_the_input_keeps_its_path(
    server: TestServer, tmp_path: Path, overwrite: bool
) -> None:
    # The row that holds the path is in this input too (explicit or by its
    # default name, after the newcomer): it is not made to give the path up.
    # Two rows at one path, both "ok", was the outcome with --overwrite.
    a, b = server.file_url("keep-a.bin", size=10), server.file_url("new-b.bin", size=20)
    for first, second in [(Row(0, a, "x.bin"), Row(1, a, "x.bin")), (Row(0, a), Row(1, a))]:
        out = tmp_path / f"{overwrite}-{first.path}"
        assert swarmget.download([first], out).ok == 1
        name = first.path or "keep-a.bin"
        report = swarmget.download([Row(0, b, name), second], out, overwrite=overwrite)
        assert report.error_counts() == {"exists": 1} and report.failures[0].index == 0
        assert (out / name).read_bytes() == expected_body("keep-a.bin", 10)
        assert [r["path"] for r in records(out)] == [None, name]


def test_a_row_index_beyond_64_bits_is_refused_by_name(tmp_path: Path) -> None:
    # It raised OverflowError from deep in the journal (SQLite INTEGER).
    with pytest.raises(swarmget.UsageError, match="must fit in 64 bits"):
        swarmget.download([Row(2**70, "http://127.0.0.1:9/x")], tmp_path)


def test_an_output_dir_too_deep_for_the_journal_says_so(tmp_path: Path) -> None:
    # SQLite takes paths of 512 bytes at most: "unable to open database file"
    # alone left the user guessing.
    deep = tmp_path.joinpath(*["d" * 200] * 3)
    deep.mkdir(parents=True)
    with pytest.raises(swarmget.SwarmgetError, match="SQLite takes at most 512"):
        swarmget.download(["http://127.0.0.1:9/x"], deep)
