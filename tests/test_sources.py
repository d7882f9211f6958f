"""Input sources: every format, sniffing, laziness, and every error message."""

from __future__ import annotations

import gzip
import io
import itertools
import os
import time
import tracemalloc
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO, cast

import pytest

from swarmget.errors import UsageError
from swarmget.sources import Row, read_rows
from swarmget.sources.reader import Format, check_sources, format_from_name, sniff

NOT_SIZE = "'size' must be a whole number of bytes"
SHA = "ab" * 32
MD5 = "cd" * 16


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def rows(*sources: str | os.PathLike[str], stdin: str | None = None) -> list[Row]:
    return list(read_rows(sources, stdin=None if stdin is None else io.StringIO(stdin)))


def urls(*sources: str | os.PathLike[str], stdin: str | None = None) -> list[str]:
    return [row.url for row in rows(*sources, stdin=stdin)]


def usage_error(*sources: str | os.PathLike[str], stdin: str | None = None) -> str:
    with pytest.raises(UsageError) as info:
        rows(*sources, stdin=stdin)
    return str(info.value)


# -- URLs given directly, plain lists, stdin ---------------------------------------------


def test_url_given_directly_is_one_row() -> None:
    assert rows("http://h/a.jpg") == [Row(0, "http://h/a.jpg")]


def test_index_runs_across_sources_in_order(tmp_path: Path) -> None:
    listing = write(tmp_path / "l.txt", "http://h/b\nhttp://h/c\n")
    got = rows("http://h/a", listing, "-", "http://h/e", stdin="http://h/d\n")
    assert [(r.index, r.url) for r in got] == [
        (0, "http://h/a"),
        (1, "http://h/b"),
        (2, "http://h/c"),
        (3, "http://h/d"),
        (4, "http://h/e"),
    ]


def test_plain_list_skips_blanks_and_comments_and_strips(tmp_path: Path) -> None:
    text = "# my list\n\n  http://h/a  \r\n\t\n#http://h/commented\nhttp://h/b#frag\nhttp://h/c"
    assert urls(write(tmp_path / "urls.txt", text)) == [
        "http://h/a",
        "http://h/b#frag",
        "http://h/c",
    ]


def test_pathlike_source(tmp_path: Path) -> None:
    path = tmp_path / "urls"
    path.write_text("http://h/a\n")
    assert urls(path) == ["http://h/a"]


def test_bom_is_dropped(tmp_path: Path) -> None:
    assert urls(write(tmp_path / "u.txt", "\ufeffhttp://h/a\n")) == ["http://h/a"]
    assert urls("-", stdin="\ufeffhttp://h/a\n") == ["http://h/a"]
    csv_path = write(tmp_path / "u.csv", "\ufeffURL,path\nhttp://h/a,x\n")
    assert rows(csv_path) == [Row(0, "http://h/a", path="x")]


def test_bad_urls_are_rows_not_usage_errors(tmp_path: Path) -> None:
    # Decided: they fail one by one with bad_url in the engine.
    text = "ftp://x\nnot a url\nhttp://\n"
    assert urls(write(tmp_path / "u.txt", text)) == ["ftp://x", "not a url", "http://"]


def test_stdin_plain() -> None:
    assert urls("-", stdin="http://h/a\n\nhttp://h/b\n") == ["http://h/a", "http://h/b"]


def test_stdin_given_twice_is_an_error() -> None:
    assert usage_error("-", "-", stdin="") == "'-' (stdin) can be given as an input only once"


def test_empty_inputs_give_no_rows(tmp_path: Path) -> None:
    for name in ("e.txt", "e.csv", "e.tsv", "e.jsonl"):
        assert rows(write(tmp_path / name, "\n\n")) == []
    assert rows("-", stdin="") == []
    assert rows() == []


# -- CSV / TSV -----------------------------------------------------------------------------


def test_csv_all_columns(tmp_path: Path) -> None:
    text = (
        "id,URL,Path,SHA256,md5,size,extra\n"
        f"1,http://h/a,out/a.jpg,{SHA.upper()},{MD5},123,x\n"
        "2,http://h/b,,,,,\n"
    )
    assert rows(write(tmp_path / "in.csv", text)) == [
        Row(0, "http://h/a", path="out/a.jpg", sha256=SHA, md5=MD5, size=123),
        Row(1, "http://h/b"),
    ]


def test_csv_quoting_spaces_short_rows_and_blank_rows(tmp_path: Path) -> None:
    text = 'url, path\n"http://h/a,b", "x, y.jpg"\nhttp://h/c\n\n,,\nhttp://h/d , d.jpg\r\n'
    assert rows(write(tmp_path / "in.csv", text)) == [
        Row(0, "http://h/a,b", path="x, y.jpg"),
        Row(1, "http://h/c"),
        Row(2, "http://h/d", path="d.jpg"),
    ]


def test_single_column_csv(tmp_path: Path) -> None:
    assert urls(write(tmp_path / "in.csv", "url\nhttp://h/a\n")) == ["http://h/a"]


def test_tsv(tmp_path: Path) -> None:
    text = f"path\turl\tsha256\na b.jpg\thttp://h/a,1\t{SHA}\n"
    assert rows(write(tmp_path / "in.tsv", text)) == [
        Row(0, "http://h/a,1", path="a b.jpg", sha256=SHA)
    ]


def test_csv_without_url_column(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", "link,file\nhttp://h/a,a\n")
    assert usage_error(path) == (
        f"input {path!r} has no 'url' column (columns found: 'link', 'file'); "
        "the first line must name the columns, e.g. url,path"
    )


def test_csv_without_header(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", "http://h/a,a.jpg\n")
    assert "has no 'url' column (columns found: 'http://h/a', 'a.jpg')" in usage_error(path)


def test_csv_more_fields_than_header(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", "url\nhttp://h/a,\nhttp://h/a,b\n")
    assert usage_error(path) == f"input {path!r}, line 3: 2 fields but the header has 1"
    path = write(tmp_path / "in.tsv", "url\tpath\nhttp://h/a\tb\tc\n")
    assert usage_error(path) == f"input {path!r}, line 2: 3 fields but the header has 2"


def test_csv_duplicate_column(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", "url,URL\nhttp://h/a,http://h/b\n")
    assert usage_error(path) == f"input {path!r}: column 'url' appears more than once"


def test_csv_empty_url(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", "url,path\nhttp://h/a,a\n,b\n")
    assert usage_error(path) == f"input {path!r}, line 3: missing or empty 'url' field"


def test_csv_short_row_without_url(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", "path,url\na\n")
    assert usage_error(path) == f"input {path!r}, line 2: missing or empty 'url' field"


def test_csv_bad_quoting(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", 'url\nhttp://h/a\n"http://h/b"x\n')
    assert usage_error(path).startswith(f"input {path!r}, line 3: not valid CSV: ")


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ("size\n-1", "'size' must be a whole number of bytes, got '-1'"),
        ("size\n1.5", "'size' must be a whole number of bytes, got '1.5'"),
        ("size\n1_000", "'size' must be a whole number of bytes, got '1_000'"),
        ("size\nlots", "'size' must be a whole number of bytes, got 'lots'"),
        ("sha256\nabc", "'sha256' must be 64 hex digits, got 'abc'"),
        ("sha256\n" + "g" * 64, "'sha256' must be 64 hex digits, got '" + "g" * 64 + "'"),
        ("md5\n" + "a" * 31, "'md5' must be 32 hex digits, got '" + "a" * 31 + "'"),
    ],
)
def test_csv_bad_optional_fields(tmp_path: Path, cells: str, message: str) -> None:
    head, value = cells.split("\n")
    path = write(tmp_path / "in.csv", f"url,{head}\nhttp://h/a,{value}\n")
    assert usage_error(path) == f"input {path!r}, line 2: {message}"


def test_size_edge_values(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", f"url,size\nhttp://h/a,0\nhttp://h/b, {2**70} \n")
    assert [r.size for r in rows(path)] == [0, 2**70]


# -- JSONL ---------------------------------------------------------------------------------


def test_jsonl_all_fields(tmp_path: Path) -> None:
    text = (
        f'{{"url": "http://h/a", "path": "d/a", "sha256": "{SHA}", "md5": "{MD5.upper()}",'
        ' "size": 5, "other": [1]}\n'
        "\n"
        '{"url": "http://h/b", "path": null, "size": "7", "sha256": ""}\n'
    )
    assert rows(write(tmp_path / "in.jsonl", text)) == [
        Row(0, "http://h/a", path="d/a", sha256=SHA, md5=MD5, size=5),
        Row(1, "http://h/b", size=7),
    ]


def test_ndjson_suffix(tmp_path: Path) -> None:
    assert urls(write(tmp_path / "in.ndjson", '{"url":"http://h/a"}\n')) == ["http://h/a"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"url": "http://h/a"', "not valid JSON: Expecting ',' delimiter (column 21)"),
        ("http://h/a", "not valid JSON: Expecting value (column 1)"),
        ('["http://h/a"]', "expected a JSON object, got an array"),
        ('"http://h/a"', "expected a JSON object, got str"),
        ("{}", "missing or empty 'url' field"),
        ('{"url": ""}', "missing or empty 'url' field"),
        ('{"url": null}', "missing or empty 'url' field"),
        ('{"url": 5}', "'url' must be a string, got int"),
        ('{"url": "http://h/a", "size": -1}', "'size' must be >= 0, got -1"),
        ('{"url": "http://h/a", "size": 1.5}', f"{NOT_SIZE}, got the number 1.5"),
        ('{"url": "http://h/a", "size": true}', f"{NOT_SIZE}, got a boolean"),
        ('{"url": "http://h/a", "size": "x"}', "'size' must be a whole number of bytes, got 'x'"),
        ('{"url": "http://h/a", "path": 3}', "'path' must be a string, got int"),
        ('{"url": "http://h/a", "md5": "zz"}', "'md5' must be 32 hex digits, got 'zz'"),
        ("[" * 100_000, "not valid JSON: nested too deeply"),
    ],
)  # fmt: skip
def test_jsonl_errors_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path / "in.jsonl", '{"url": "http://h/ok"}\n\n' + line + "\n")
    assert usage_error(path) == f"input {path!r}, line 3: {message}"


def test_error_comes_after_the_good_rows(tmp_path: Path) -> None:
    path = write(tmp_path / "in.jsonl", '{"url": "http://h/ok"}\n{"url": 1}\n')
    stream = read_rows([path])
    assert next(stream).url == "http://h/ok"
    with pytest.raises(UsageError, match="line 2"):
        next(stream)


# -- sniffing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "fmt"),
    [
        ('{"url": "x"}', Format.JSONL),
        ("[1]", Format.JSONL),
        ("url\tpath", Format.TSV),
        ("path\t URL ", Format.TSV),
        ("url,path", Format.CSV),
        ('"url","path"', Format.CSV),
        ("URL", Format.CSV),
        ("http://h/a,b", Format.TEXT),
        ("http://h/a\tb", Format.TEXT),
        ("# url, path", Format.TEXT),
        ("http://h/url", Format.TEXT),
        ("http://h/a,url,b", Format.TEXT),
        ("http://h/a?x\turl", Format.TEXT),
    ],
)
def test_sniff(line: str, fmt: Format) -> None:
    assert sniff(line) is fmt


def test_format_from_name() -> None:
    assert format_from_name("a.CSV") is Format.CSV
    assert format_from_name("a.tsv.gz") is Format.TSV
    assert format_from_name("a.ndjson.GZ") is Format.JSONL
    assert format_from_name("a.txt") is None
    assert format_from_name("a.gz") is None
    assert format_from_name("csv") is None


def test_sniffed_formats_from_stdin() -> None:
    assert rows("-", stdin='\n{"url": "http://h/a", "size": 1}\n') == [Row(0, "http://h/a", size=1)]
    assert rows("-", stdin="url,path\nhttp://h/a,a\n") == [Row(0, "http://h/a", path="a")]
    assert rows("-", stdin="path\turl\na\thttp://h/a\n") == [Row(0, "http://h/a", path="a")]
    assert rows("-", stdin="url\nhttp://h/a\n") == [Row(0, "http://h/a")]


def test_sniffed_txt_file(tmp_path: Path) -> None:
    path = write(tmp_path / "list.txt", "\n\nurl,sha256\nhttp://h/a," + SHA + "\n")
    assert rows(path) == [Row(0, "http://h/a", sha256=SHA)]
    path = write(tmp_path / "list2.txt", "url,size\nhttp://h/a,x\n")
    assert (
        usage_error(path)
        == f"input {path!r}, line 2: 'size' must be a whole number of bytes, got 'x'"
    )


def test_stdin_errors_are_named() -> None:
    assert (
        usage_error("-", stdin='{"url": 1}')
        == "input '<stdin>', line 1: 'url' must be a string, got int"
    )


# -- gzip ----------------------------------------------------------------------------------


def write_gz(path: Path, text: str) -> str:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return str(path)


def test_gzip_inputs(tmp_path: Path) -> None:
    assert urls(write_gz(tmp_path / "u.txt.gz", "http://h/a\nhttp://h/b\n")) == [
        "http://h/a",
        "http://h/b",
    ]
    assert urls(write_gz(tmp_path / "u.gz", "url\thttp\nhttp://h/c\tx\n")) == ["http://h/c"]
    assert rows(write_gz(tmp_path / "u.jsonl.gz", '{"url":"http://h/d","size":3}\n')) == [
        Row(0, "http://h/d", size=3)
    ]
    assert rows(write_gz(tmp_path / "u.csv.gz", "url,path\nhttp://h/e,e\n")) == [
        Row(0, "http://h/e", path="e")
    ]


def test_not_gzip(tmp_path: Path) -> None:
    path = write(tmp_path / "u.txt.gz", "http://h/a\n")
    assert (
        usage_error(path) == f"cannot read input {path!r}: not a gzip file (the name ends in .gz)"
    )


def test_truncated_gzip(tmp_path: Path) -> None:
    data = gzip.compress(("http://h/a\n" * 10_000).encode())
    path = tmp_path / "u.txt.gz"
    path.write_bytes(data[: len(data) // 2])
    message = usage_error(path)
    assert message.startswith(f"cannot read input {str(path)!r}: Compressed file ended")


# -- unreadable input ----------------------------------------------------------------------


def test_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert usage_error("x.txt") == "cannot read input 'x.txt': No such file or directory"


def test_missing_file_fails_before_any_row(tmp_path: Path) -> None:
    good = write(tmp_path / "good.txt", "http://h/a\n")
    stream = read_rows(["http://h/0", good, str(tmp_path / "nope.csv")])
    with pytest.raises(UsageError, match=r"nope\.csv': No such file or directory"):
        next(stream)


def test_directory(tmp_path: Path) -> None:
    assert usage_error(tmp_path) == f"cannot read input {str(tmp_path)!r}: Is a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads everything")
def test_permission_denied(tmp_path: Path) -> None:
    path = write(tmp_path / "secret.txt", "http://h/a\n")
    os.chmod(path, 0)
    assert usage_error(path) == f"cannot read input {path!r}: Permission denied"


def test_check_sources_alone(tmp_path: Path) -> None:
    check_sources(["http://h/a", "-", write(tmp_path / "a.txt", "")])
    with pytest.raises(UsageError, match="No such file"):
        check_sources([tmp_path / "missing"])


def test_invalid_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "u.txt"
    good = b"".join(b"http://h/%d\n" % i for i in range(5000))
    path.write_bytes(good + b"http://h/\xff\n")
    assert usage_error(path) == (
        f"input {str(path)!r}, line 5001: not valid UTF-8 text (invalid start byte)"
    )


def test_fifo_input(tmp_path: Path) -> None:
    # A pipe (like bash's <(command)) must not be opened by the up-front check.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    pid = os.fork()
    if pid == 0:  # child: write the list and leave
        try:
            with open(fifo, "w") as f:
                f.write("http://h/a\nhttp://h/b\n")
        finally:
            os._exit(0)
    try:
        assert urls(fifo) == ["http://h/a", "http://h/b"]
    finally:
        os.waitpid(pid, 0)


# -- laziness, memory, speed ---------------------------------------------------------------


class EndlessStdin:
    """A stdin that never ends: reading ahead would hang the test."""

    def __init__(self) -> None:
        self.lines_read = 0

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        self.lines_read += 1
        return f"http://h/{self.lines_read}\n"


def test_reading_is_lazy() -> None:
    stdin = EndlessStdin()
    first = list(itertools.islice(read_rows(["-"], stdin=cast(TextIO, stdin)), 3))
    assert [r.url for r in first] == ["http://h/1", "http://h/2", "http://h/3"]
    assert stdin.lines_read == 3


@pytest.fixture(scope="module")
def million_lines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / "urls.txt"
    with open(path, "w") as f:
        for start in range(0, 1_000_000, 50_000):
            f.write(
                "".join(f"http://example.com/i/{i:08d}.jpg\n" for i in range(start, start + 50_000))
            )
    return path


def test_million_lines_stream_in_little_memory(million_lines: Path) -> None:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        last = deque(read_rows([million_lines]), maxlen=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert last[0] == Row(999_999, "http://example.com/i/00999999.jpg")
    assert peak < 20 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB"


def test_plain_text_speed(million_lines: Path) -> None:
    start = time.perf_counter()
    count = sum(1 for _ in read_rows([million_lines]))
    rate = count / (time.perf_counter() - start)
    print(f"plain text: {rate / 1e6:.2f} M rows/s")
    # ~1.5 M rows/s on an idle core; the floor leaves room for a loaded CI box.
    assert rate > 250_000
