"""Output naming: sanitised default names, confined explicit paths, unique allocation."""

from __future__ import annotations

import os
import tracemalloc
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmget.errors import ErrorCode, TransferError
from swarmget.sinks.naming import (
    MAX_NAME_BYTES,
    NameAllocator,
    confine,
    default_name,
    split_ext,
    with_suffix,
)
from swarmget.sources.rows import Row

OUT = os.path.abspath("/srv/out")

# -- default_name: examples ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("http://h/a/b/c.jpg", "c.jpg"),
        ("https://h:8080/c.jpg?x=1/2&y=../z#frag/x", "c.jpg"),
        ("http://h/a#b?c/d", "a"),
        ("http://h/a%20b%C3%A9.jpg", "a bé.jpg"),
        ("http://h/bad%FFutf8", "bad%FFutf8"),  # not UTF-8: kept as written
        ("http://h/a%fe%C3%A9%ff.jpg", "a%fe\u00e9%ff.jpg"),
        ("http://h/%e6%97%a5%E6%9C%AC.jpg", "\u65e5\u672c.jpg"),
        ("http://h/x%C3", "x%C3"),  # cut short
        ("http://h/%zz", "%zz"),
        ("http://h/a%2Fb", "a_b"),
        ("http://h/a%2F..%2F..%2Fetc", "a_.._.._etc"),
        ("http://h/..%5C..%5Cwin.ini", "_.._win.ini"),
        ("http://h/a\\b.jpg", "a_b.jpg"),
        ("http://h/a%00b", "a_b"),
        ("http://h/a\x01\x1f\x7f\x80\x9fb", "a_____b"),
        ("http://h/tab%09new%0Aline", "tab_new_line"),
        ("http://h/raw\ttab\r\nbreak.jpg", "rawtabbreak.jpg"),  # the request drops them too
        ("http://h/line%E2%80%A8para%E2%80%A9.txt", "line_para_.txt"),
        ("http://h/x/..", "index"),
        ("http://h/x/.", "index"),
        ("http://h/%2e%2e", "index"),
        ("http://h/...", "index"),
        ("http://h/.bashrc", "bashrc"),
        ("http://h/..hidden.txt", "hidden.txt"),
        ("http://h/.swarmget", "swarmget"),
        ("http://h/name. . ", "name"),
        ("http://h/name%20%20", "name"),
        ("http://h/", "index"),
        ("http://h/dir/", "index"),
        ("http://h", "index"),
        ("http://h?q=a/b", "index"),
        ("http://h#a/b", "index"),
        ("", "index"),
        ("not a url", "not a url"),
        ("relative/x.png", "x.png"),
    ],
)
def test_default_name(url: str, name: str) -> None:
    assert default_name(url) == name


def test_default_name_truncates_keeping_the_extension() -> None:
    name = default_name("http://h/" + "a" * 300 + ".jpeg")
    assert name == "a" * (MAX_NAME_BYTES - 5) + ".jpeg"
    assert len(name.encode()) == MAX_NAME_BYTES


def test_default_name_truncates_on_a_character_boundary() -> None:
    name = default_name("http://h/" + "é" * 300 + ".jpg")  # 2 bytes each
    assert name.endswith(".jpg")
    assert name == "é" * 98 + ".jpg"
    name = default_name("http://h/" + "€" * 300)  # 3 bytes each, no extension
    assert name == "€" * 66


def test_default_name_long_tail_is_not_an_extension() -> None:
    name = default_name("http://h/x." + "b" * 300)
    assert name == ("x." + "b" * 300)[:MAX_NAME_BYTES]


# -- default_name: properties --------------------------------------------------------------


def is_control(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Cs")


def assert_safe_name(name: str) -> None:
    assert name
    assert "/" not in name and "\\" not in name and "\x00" not in name
    assert not any(is_control(ch) for ch in name)
    assert name not in (".", "..")
    assert not name.startswith(".")
    assert not name.endswith((".", " "))
    assert len(name.encode()) <= MAX_NAME_BYTES
    joined = os.path.normpath(os.path.join(OUT, name))
    assert os.path.dirname(joined) == OUT


# Printable text, raw control characters, percent-escapes and path punctuation.
url_piece = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["/", "\\", ".", "..", "%2F", "%2e", "%00", "%5C", "%FF", "?", "#", "%", " "]),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=80),
    st.characters(min_codepoint=0, max_codepoint=0x9F).map(lambda c: c * 3),
)
urlish = st.builds(
    lambda prefix, pieces: prefix + "".join(pieces),
    st.sampled_from(["", "http://h/", "https://h.example:8443/a/", "http://h", "x://"]),
    st.lists(url_piece, max_size=12),
)


@given(st.text())
def test_default_name_is_safe_for_any_string(url: str) -> None:
    assert_safe_name(default_name(url))


@given(urlish)
def test_default_name_is_safe_for_url_like_strings(url: str) -> None:
    assert_safe_name(default_name(url))


@given(st.text(min_size=150, max_size=400))
def test_default_name_is_bounded_for_long_names(segment: str) -> None:
    assert_safe_name(default_name("http://h/" + segment))


# -- confine: examples ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "normal"),
    [
        ("a.jpg", "a.jpg"),
        ("d/e/a.jpg", "d/e/a.jpg"),
        ("./a//b/./c.jpg", "a/b/c.jpg"),
        (".hidden/.file", ".hidden/.file"),
        ("swarmget/x", "swarmget/x"),
        ("a..b/c...", "a..b/c..."),
        ("sp ace/é.jpg", "sp ace/é.jpg"),
        ("a" * 255, "a" * 255),
        ("é" * 127 + "/x", "é" * 127 + "/x"),
    ],
)
def test_confine_accepts_and_normalises(path: str, normal: str) -> None:
    assert confine(path) == normal


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("", "is empty"),
        ("/etc/passwd", "is absolute"),
        ("//x", "is absolute"),
        ("..", "has a '..' component"),
        ("../x", "has a '..' component"),
        ("a/../../x", "has a '..' component"),
        ("a/..", "has a '..' component"),
        ("a/../b", "has a '..' component"),
        ("a\x00b", "contains a control character"),
        ("a\nb", "contains a control character"),
        ("a\x7fb", "contains a control character"),
        ("a\x85b", "contains a control character"),
        ("a\u2028b", "contains a control character"),
        ("a\\b", "contains a backslash"),
        ("..\\..\\x", "contains a backslash"),
        (".", "names a directory, not a file"),
        ("./", "names a directory, not a file"),
        ("a/", "names a directory, not a file"),
        ("a/.", "names a directory, not a file"),
        (".swarmget", "is inside a reserved '.swarmget' directory"),
        (".swarmget/x", "is inside a reserved '.swarmget' directory"),
        ("./.swarmget/x", "is inside a reserved '.swarmget' directory"),
        (".SwarmGet/x", "is inside a reserved '.swarmget' directory"),
        ("inner/.swarmget/parts/zz", "is inside a reserved '.swarmget' directory"),
        ("x/.swarmget", "is inside a reserved '.swarmget' directory"),
        ("a/.SWARMGET/journal.sqlite3", "is inside a reserved '.swarmget' directory"),
        ("a" * 256, "has a component longer than 255 bytes"),
        ("d/" + "é" * 128, "has a component longer than 255 bytes"),
        ("/".join(["d" * 250] * 17), "is longer than 4095 bytes (PATH_MAX, with the output dir)"),
    ],
)
def test_confine_rejects(path: str, problem: str) -> None:
    with pytest.raises(TransferError) as info:
        confine(path)
    assert info.value.code == ErrorCode.BAD_PATH == "bad_path"
    shown = path if len(path) <= 200 else path[:200] + "..."
    assert info.value.message == f"output path {shown!r} {problem}"


def test_a_path_is_measured_against_path_max_as_it_is_made() -> None:
    # "./" padding was counted: a path that normalises to "short.txt" failed
    # as longer than PATH_MAX.
    assert confine("./" * 2100 + "short.txt") == "short.txt"


def test_confine_error_message_is_bounded() -> None:
    with pytest.raises(TransferError) as info:
        confine("../" + "x" * 10_000)
    assert len(info.value.message) < 300


# -- confine: properties -------------------------------------------------------------------

path_piece = st.one_of(
    st.sampled_from(["", ".", "..", ".swarmget", ".SWARMGET", "a", "b.jpg", "\\", "\x00", " "]),
    st.text(max_size=20),
    st.text(alphabet="./\\ab", max_size=10),
)
pathish = st.one_of(st.text(), st.lists(path_piece, max_size=8).map("/".join))


@given(pathish)
def test_confine_stays_inside_or_fails(path: str) -> None:
    try:
        normal = confine(path)
    except TransferError as exc:
        assert exc.code == ErrorCode.BAD_PATH
        return
    parts = normal.split("/")
    assert all(part not in ("", ".", "..") for part in parts)
    assert parts[0].lower() != ".swarmget"
    assert not any(is_control(ch) for ch in normal) and "\\" not in normal
    assert all(len(part.encode()) <= 255 for part in parts)
    joined = os.path.normpath(os.path.join(OUT, normal))
    assert joined.startswith(OUT + os.sep)
    assert confine(normal) == normal  # normalised means a fixed point


# -- NameAllocator ---------------------------------------------------------------------------


def allocate_all(*rows: Row | str) -> list[str]:
    names = NameAllocator()
    return [names.allocate(Row(i, r) if isinstance(r, str) else r) for i, r in enumerate(rows)]


def test_distinct_names() -> None:
    assert allocate_all("http://h/a.jpg", "http://h/b.jpg") == ["a.jpg", "b.jpg"]


def test_collisions_get_suffixes_in_input_order() -> None:
    got = allocate_all("http://h/a.jpg", "http://x/a.jpg", "http://h/b.jpg", "http://y/a.jpg?v=2")
    assert got == ["a.jpg", "a-1.jpg", "b.jpg", "a-2.jpg"]


def test_suffix_goes_before_the_extension() -> None:
    got = allocate_all(
        *["http://h/", "http://h/a.tar.gz", "http://h/.x", "http://h/v1.2 notes"] * 2
    )
    assert got[4:] == ["index-1", "a-1.tar.gz", "x-1", "v1.2 notes-1"]


def outcomes(*rows: Row | str) -> list[str]:
    """Each row's name, or the code of the error it fails with."""
    names = NameAllocator()
    got = []
    for i, r in enumerate(rows):
        try:
            got.append(names.allocate(Row(i, r) if isinstance(r, str) else r))
        except TransferError as exc:
            got.append(exc.code)
    return got


def test_names_already_in_the_input_are_skipped() -> None:
    got = allocate_all(
        "http://h/a-1.jpg",
        Row(1, "http://h/q", path="a-2.jpg"),
        "http://h/a.jpg",
        "http://h/a.jpg",
        "http://h/a.jpg",
    )
    assert got == ["a-1.jpg", "a-2.jpg", "a.jpg", "a-3.jpg", "a-4.jpg"]


def test_explicit_paths_are_that_path_or_none() -> None:
    # Never renamed: a path the input gives that another row of it has is the
    # row's failure (`exists`), not a "-1" the user did not ask for.
    got = outcomes(
        Row(0, "http://h/a.jpg", path="./d//a.jpg"),
        Row(1, "http://h/a.jpg"),
        Row(2, "http://h/z", path="a.jpg"),
        Row(3, "http://h/z", path="d/a.jpg"),
        Row(4, "http://h/z", path="d/b.jpg"),
    )
    assert got == ["d/a.jpg", "a.jpg", "exists", "exists", "d/b.jpg"]


def test_bad_explicit_path_fails_that_row_only() -> None:
    names = NameAllocator()
    with pytest.raises(TransferError) as info:
        names.allocate(Row(0, "http://h/a", path="../a"))
    assert info.value.code == ErrorCode.BAD_PATH
    assert names.allocate(Row(1, "http://h/a", path="a")) == "a"


def test_file_where_a_directory_is_needed() -> None:
    names = NameAllocator()
    assert names.allocate(Row(0, "http://h/d")) == "d"
    with pytest.raises(TransferError) as info:
        names.allocate(Row(1, "http://h/x", path="d/x.jpg"))
    assert info.value.code == ErrorCode.EXISTS
    assert info.value.message == (
        "output path 'd/x.jpg' needs directory 'd', which is another row's file"
    )


def test_directory_where_a_file_would_go() -> None:
    got = outcomes(Row(0, "http://h/x", path="d/e/x.jpg"), "http://h/d", Row(2, "u", path="d/e"))
    assert got == ["d/e/x.jpg", "d-1", "exists"]


def test_suffix_keeps_long_components_within_255_bytes() -> None:
    long_name = "a" * 250 + ".jpg"
    assert len(with_suffix(long_name, 12345).encode()) == 255
    assert with_suffix("d/" + long_name, 7).endswith("a-7.jpg")
    got = allocate_all(f"http://h/{long_name}", f"http://x/{long_name}")
    assert got[1] == with_suffix(got[0], 1) and len(got[1].encode()) <= 255


def test_split_ext() -> None:
    assert split_ext("a.jpg") == ("a", ".jpg")
    assert split_ext("a.TAR.GZ") == ("a", ".TAR.GZ")
    assert split_ext(".tar.gz") == (".tar", ".gz")
    assert split_ext(".bashrc") == (".bashrc", "")
    assert split_ext("index") == ("index", "")
    assert split_ext("x.abcdefghijklmnopq") == ("x.abcdefghijklmnopq", "")


@given(st.lists(st.one_of(urlish, st.sampled_from(["http://h/a.jpg", "http://h/a-1.jpg"]))))
def test_allocation_is_unique_and_deterministic(url_list: list[str]) -> None:
    first = allocate_all(*url_list)
    assert len(set(first)) == len(first)
    assert allocate_all(*url_list) == first
    for name in first:
        assert name and "/" not in name and len(name.encode()) <= 255


# -- memory ----------------------------------------------------------------------------------

# Measured at 1,000,000 rows: ~95 MB for distinct names, ~98 MB when every URL
# ends in image.jpg.  The tests use 50,000 rows (tracemalloc slows allocation
# down a lot) and hold the per-row cost to what extrapolates to < 130 MB.
MEMORY_ROWS = 50_000
BYTES_PER_ROW = 130


def peak_allocating(urls: list[str]) -> tuple[int, NameAllocator]:
    names = NameAllocator()
    tracemalloc.start()
    try:
        for i, url in enumerate(urls):
            names.allocate(Row(i, url))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, names


def test_memory_distinct_names() -> None:
    urls = [f"http://example.com/images/{i:08d}.jpg" for i in range(MEMORY_ROWS)]
    peak, names = peak_allocating(urls)
    assert len(names) == MEMORY_ROWS
    assert peak < MEMORY_ROWS * BYTES_PER_ROW, f"{peak / MEMORY_ROWS:.0f} B/row"


def test_memory_and_time_all_colliding() -> None:
    # Quadratic probing (a-1, a-2, ... a-n for every row) would not finish here.
    urls = ["http://example.com/x/image.jpg"] * MEMORY_ROWS
    peak, names = peak_allocating(urls)
    assert names.allocate(Row(0, urls[0])) == f"image-{MEMORY_ROWS}.jpg"
    assert peak < MEMORY_ROWS * BYTES_PER_ROW, f"{peak / MEMORY_ROWS:.0f} B/row"


def test_a_path_past_path_max_with_the_output_dir_fails_before_any_directory_is_made(
    tmp_path: Path,
) -> None:
    # It failed io ("File name too long") and left 16 nested empty directories.
    from swarmget.options import Options
    from swarmget.sinks.plan import FilePlanner

    planner = FilePlanner(str(tmp_path), Options())
    room = 4095 - len(str(tmp_path).encode()) - 1
    fits = "/".join(["d" * 200] * (room // 201)) + "/f"
    too_long = "/".join(["e" * 250] * 16) + "/" + "f" * 200
    try:
        batch = planner.plan([Row(0, "http://h/a", path=fits), Row(1, "http://h/b", path=too_long)])
    finally:
        planner.finish(interrupted=True)
    assert [a.path for a in batch.assignments] == [fits]
    (failure,) = batch.results
    assert failure.error == "bad_path" and "PATH_MAX" in (failure.message or "")
    assert not (tmp_path / ("e" * 250)).exists()


def test_a_default_name_goes_past_a_path_a_later_row_of_the_batch_asks_for(
    tmp_path: Path,
) -> None:
    # Row 0's default name took "a.jpg", and row 1, whose path column says
    # a.jpg, failed with "exists" ("another row's in this input").
    from swarmget.options import Options
    from swarmget.sinks.plan import FilePlanner

    planner = FilePlanner(str(tmp_path), Options())
    try:
        batch = planner.plan([Row(0, "http://h/x/a.jpg"), Row(1, "http://h/y/b.jpg", path="a.jpg")])
    finally:
        planner.finish(interrupted=True)
    assert batch.results == []
    assert [(a.index, a.path) for a in batch.assignments] == [(0, "a-1.jpg"), (1, "a.jpg")]


def test_a_default_name_goes_past_a_directory_a_later_row_of_the_batch_needs(
    tmp_path: Path,
) -> None:
    # Row 0's default name took "d", and row 1, whose path is d/a.jpg, failed
    # with "needs directory 'd', which is another row's file"; in the other
    # order row 0 was "d-1" and both were done.
    from swarmget.options import Options
    from swarmget.sinks.plan import FilePlanner

    planner = FilePlanner(str(tmp_path), Options())
    try:
        batch = planner.plan(
            [Row(0, "http://h/x/d"), Row(1, "http://h/y", path="d/e/a.jpg"), Row(2, "http://h/e")]
        )
    finally:
        planner.finish(interrupted=True)
    assert batch.results == []
    got = [(a.index, a.path) for a in batch.assignments]
    assert got == [(0, "d-1"), (1, "d/e/a.jpg"), (2, "e")]


def test_a_row_whose_path_is_a_directory_on_disk_takes_no_other_rows_with_it(
    tmp_path: Path,
) -> None:
    # Row 0 asks for "existdir", where the user has a directory: it fails with
    # exists.  Row 1, "existdir/in.bin", failed too: "needs directory
    # 'existdir', which is another row's file" (it is no file; it is the
    # directory row 1 needs).
    import swarmget
    from swarmget.testing import TestServer

    out = tmp_path / "out"
    (out / "existdir").mkdir(parents=True)
    listing = tmp_path / "list.csv"
    with TestServer() as server:
        listing.write_text(
            "url,path\n"
            f"{server.file_url('d0.bin', size=10)},existdir\n"
            f"{server.file_url('d1.bin', size=10)},existdir/in.bin\n"
        )
        report = swarmget.download([], out, sources=[str(listing)], retries=0)
    assert report.error_counts() == {"exists": 1}
    assert (out / "existdir" / "in.bin").stat().st_size == 10


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_path_no_file_can_take_fails_before_its_download(tmp_path: Path, overwrite: bool) -> None:
    # A file of the user's where a row's directory must go ("a" for a/b.bin),
    # and a directory of the user's at a row's path under --overwrite (which
    # replaces files only): each row downloaded its body, then failed as `io`
    # ("cannot create directory", "Is a directory"), the body thrown away.
    import swarmget
    from swarmget.testing import TestServer

    out = tmp_path / "out"
    (out / "d").mkdir(parents=True)
    (out / "d" / "mine.txt").write_text("kept")
    (out / "a").write_text("the user's")
    listing = tmp_path / "list.csv"
    with TestServer() as server:
        listing.write_text(
            "url,path\n"
            f"{server.file_url('x.bin', size=10)},a/b.bin\n"
            f"{server.file_url('y.bin', size=10)},d\n"
            f"{server.file_url('z.bin', size=10)},z.bin\n"
        )
        report = swarmget.download([], out, sources=[str(listing)], retries=0, overwrite=overwrite)
        asked = b"".join(server.requests)
    assert report.error_counts() == {"exists": 2}
    assert b"x.bin" not in asked and b"y.bin" not in asked  # nothing fetched to be lost
    messages = sorted(str(r.message) for r in report.failures)
    assert messages[0].startswith("a file is where a directory of a/b.bin must go")
    assert messages[1] == (
        "d is a directory"
        + ("" if overwrite else ", not swarmget's")
        + " (--overwrite replaces files, not directories)"
    )
    assert (out / "a").read_text() == "the user's"
    assert (out / "d" / "mine.txt").read_text() == "kept"
    assert (out / "z.bin").stat().st_size == 10
