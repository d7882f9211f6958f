"""Input sources: every format, sniffing, laziness, and every error message."""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import itertools
import json
import os
import subprocess
import sys
import time
import tracemalloc
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO, cast

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from swarmget import cli
from swarmget.errors import UsageError
from swarmget.sources import Row, read_rows, reader
from swarmget.sources.reader import Format, check_sources, format_from_name, sniff
from swarmget.sources.rows import strip_url
from swarmget.testing import expected_body

NOT_SIZE = "'size' must be a whole number of bytes"
SHA = "ab" * 32
MD5 = "cd" * 16


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


Stdin = str | bytes | None  # text is given as io.StringIO, bytes as io.BytesIO


def rows(*sources: str | os.PathLike[str], stdin: Stdin = None) -> list[Row]:
    stream: io.StringIO | io.BytesIO | None = None
    if isinstance(stdin, bytes):
        stream = io.BytesIO(stdin)
    elif stdin is not None:
        stream = io.StringIO(stdin)
    return list(read_rows(sources, stdin=stream))


def urls(*sources: str | os.PathLike[str], stdin: Stdin = None) -> list[str]:
    return [row.url for row in rows(*sources, stdin=stdin)]


def usage_error(*sources: str | os.PathLike[str], stdin: Stdin = None) -> str:
    with pytest.raises(UsageError) as info:
        rows(*sources, stdin=stdin)
    return str(info.value)


def bad(index: int, url: str, problem: str) -> Row:
    """The row for a malformed input row (the engine fails it with bad_row)."""
    return Row(index, url, problem=problem)


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


def test_tsv_quotes_in_a_caption_are_text(tmp_path: Path) -> None:
    """A caption that begins with a quote failed its row; one never closed, with
    a later line ending in a quote, took the rows between into the caption."""
    text = (
        "url\tcaption\n"
        'http://h/a\t"Best" laptop\n'
        'http://h/b\t"never closed\n'
        "http://h/c\tplain\n"
        'http://h/d\tends with a quote"\n'
        '"http://h/e"\t"quoted whole"\n'
    )
    assert urls(write(tmp_path / "in.tsv", text)) == [f"http://h/{c}" for c in "abcde"]


def test_a_huge_field_in_a_column_we_do_not_read_is_no_problem(tmp_path: Path) -> None:
    text = "url,caption\nhttp://h/a," + "x" * 3_000_000 + "\nhttp://h/b,short\n"
    assert urls(write(tmp_path / "in.csv", text)) == ["http://h/a", "http://h/b"]


def test_jsonl_column_names_in_any_case(tmp_path: Path) -> None:
    text = '{"URL": "http://h/a", "Path": "p"}\n{"url": "http://h/b", "PATH": "q", "Size": 3}\n'
    got = rows(write(tmp_path / "in.jsonl", text))
    assert got[0] == Row(0, "http://h/a", path="p")
    # "url" itself there: the other columns in another case were dropped unsaid.
    assert got[1] == Row(1, "http://h/b", path="q", size=3)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        # "url" itself was taken and "URL" ignored: which was meant cannot be told.
        ('{"url": "http://h/a", "URL": "http://h/b"}', "'url' and 'URL'"),
        ('{"URL": "http://h/a", "Url": "http://h/b"}', "'URL' and 'Url'"),
        ('{"url": "http://h/a", "path": "p", "Path": "q"}', "'path' and 'Path'"),
        ('{"url": "http://h/a", "sha256": null, "SHA256": "x"}', "'sha256' and 'SHA256'"),
        # The same key twice: json.loads kept the last one, and nobody said.
        ('{"url": "http://h/a", "url": "http://h/b"}', "'url' twice"),
        ('{"url": "http://h/a", "path": "p", "path": "q"}', "'path' twice"),
        ('{"url": "http://h/a", "Size": 1, "Size": 2}', "'Size' twice"),
    ],
)
def test_jsonl_a_column_spelled_twice_fails_its_row(
    tmp_path: Path, line: str, problem: str
) -> None:
    path = write(tmp_path / "two.jsonl", '{"url": "http://h/0"}\n' + line + "\n")
    first, only = rows(path)
    assert first == Row(0, "http://h/0")
    column = problem.split("'")[1].lower()
    assert only.problem == (
        f"input {path!r}, line 2: column {column!r} appears more than once ({problem})"
    )
    assert only.url == line  # named by its line, not by one of its two urls


def test_jsonl_keys_repeated_elsewhere_are_no_problem(tmp_path: Path) -> None:
    # In a nested object, or a column swarmget does not read: not its business.
    text = (
        '{"url": "http://h/a", "meta": {"url": "x", "url": "y"}, "tag": 1, "tag": 2}\n'
        '{"meta": {"path": "x", "path": "y"}, "url": "http://h/b", "path": "p"}\n'
    )
    assert rows(write(tmp_path / "in.jsonl", text)) == [
        Row(0, "http://h/a"),
        Row(1, "http://h/b", path="p"),
    ]


def test_csv_without_url_column(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", "link,file\nhttp://h/a,a\n")
    assert usage_error(path) == (
        f"input {path!r} has no 'url' column (columns found: 'link', 'file'); "
        "the first line must name the columns, e.g. url,path"
    )


def test_a_csv_named_tsv_is_told_so(tmp_path: Path) -> None:
    # It said "columns found: 'url,path'; the first line must name the
    # columns, e.g. url,path".
    path = write(tmp_path / "list.tsv", "url,path\nhttp://h/a,p\n")
    assert usage_error(path).endswith(
        "its columns are separated by commas: name the file .csv (or pipe it to stdin)"
    )


def test_csv_without_header(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", "http://h/a,a.jpg\n")
    assert "has no 'url' column (columns found: 'http://h/a', 'a.jpg')" in usage_error(path)


@pytest.mark.parametrize(
    ("name", "text", "header"),
    [
        ("cc3m.tsv", 'a man\'s "best" friend\thttp://h/a.jpg\n', "caption<TAB>url"),
        ("cc12m.tsv", "http://h/a.jpg\ta cat\n", "url<TAB>caption"),
        ("wide.csv", "a,b,http://h/a.jpg\n", "col1,col2,url"),
    ],
)
def test_a_table_without_its_header_line_is_told_the_header_to_add(
    tmp_path: Path, name: str, text: str, header: str
) -> None:
    # It said "the first line must name the columns, e.g. url,path": not that
    # the line it read was a row, nor where the url column is.
    said = usage_error(write(tmp_path / name, text))
    assert said.endswith(f"add a header line naming the columns, such as {header}")
    assert "the first line is a row, not a header" in said


def test_csv_more_fields_than_header(tmp_path: Path) -> None:
    # Most likely an unquoted comma in a URL: the raw line is the row's url.
    path = write(tmp_path / "in.csv", "url\nhttp://h/a,\nhttp://h/a,b\nhttp://h/c\n")
    assert rows(path) == [
        Row(0, "http://h/a"),
        bad(1, "http://h/a,b", f"input {path!r}, line 3: 2 fields but the header has 1"),
        Row(2, "http://h/c"),
    ]
    path = write(tmp_path / "in.tsv", "url\tpath\nhttp://h/a\tb\tc\n")
    assert rows(path) == [
        bad(0, "http://h/a\tb\tc", f"input {path!r}, line 2: 3 fields but the header has 2")
    ]


def test_csv_duplicate_column(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", "url,URL\nhttp://h/a,http://h/b\n")
    assert usage_error(path) == f"input {path!r}: column 'url' appears more than once"


def test_csv_empty_url(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", "url,path\nhttp://h/a,a\n,b\nhttp://h/c,c\n")
    assert rows(path) == [
        Row(0, "http://h/a", path="a"),
        bad(1, ",b", f"input {path!r}, line 3: missing or empty 'url' field"),
        Row(2, "http://h/c", path="c"),
    ]


def test_csv_short_row_without_url(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", "path,url\na\n")
    assert rows(path) == [bad(0, "a", f"input {path!r}, line 2: missing or empty 'url' field")]


def test_csv_bad_quoting(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", 'url\nhttp://h/a\n"http://h/b"x\nhttp://h/c\n')
    assert rows(path) == [
        Row(0, "http://h/a"),
        bad(1, '"http://h/b"x', f"input {path!r}, line 3: not valid CSV: ',' expected after '\"'"),
        Row(2, "http://h/c"),
    ]


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
    # The URL is good, so the row names it (not the whole line).
    head, value = cells.split("\n")
    path = write(tmp_path / "in.csv", f"url,{head}\nhttp://h/a,{value}\nhttp://h/b,\n")
    assert rows(path) == [
        bad(0, "http://h/a", f"input {path!r}, line 2: {message}"),
        Row(1, "http://h/b"),
    ]


def test_sizes_pandas_wrote_as_floats(tmp_path: Path) -> None:
    # A size column with gaps is float64 in pandas: to_csv writes 12.0 and an
    # empty cell, to_json 12.0 and null (json.dumps NaN).  Every such row failed.
    csv_path = write(
        tmp_path / "in.csv", "url,size\nhttp://h/a,12.0\nhttp://h/b,\nhttp://h/c,0.00\n"
    )
    assert [r.size for r in rows(csv_path)] == [12, None, 0]
    lines = ['{"url": "http://h/a", "size": 12.0}', '{"url": "http://h/b", "size": NaN}']
    assert [r.size for r in rows(write(tmp_path / "in.jsonl", "\n".join(lines)))] == [12, None]
    # A fraction is still no size, nor is a float in any other shape.
    for cell in ("12.5", "12.", ".0", "1e3", "-1.0", "12.0.0"):
        path = write(tmp_path / "bad.csv", f"url,size\nhttp://h/a,{cell}\n")
        assert rows(path)[0].problem == (f"input {path!r}, line 2: {NOT_SIZE}, got {cell!r}"), cell
    for number in ("12.5", "Infinity", "-1.0"):
        path = write(tmp_path / "bad.jsonl", f'{{"url": "http://h/a", "size": {number}}}\n')
        assert rows(path)[0].problem is not None, number


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
def test_jsonl_bad_rows_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    text = '{"url": "http://h/ok"}\n\n' + line + '\n{"url": "http://h/next"}\n'
    path = write(tmp_path / "in.jsonl", text)
    # The row's url is its URL when that one is good, else the line (clipped).
    url = "http://h/a" if line.startswith('{"url": "http://h/a", ') else line[:200]
    assert rows(path) == [
        Row(0, "http://h/ok"),
        bad(1, url, f"input {path!r}, line 3: {message}"),
        Row(2, "http://h/next"),
    ]


def test_bad_row_is_yielded_in_order_and_reading_goes_on(tmp_path: Path) -> None:
    path = write(
        tmp_path / "in.jsonl", '{"url": "http://h/ok"}\n{"url": 1}\n{"url": "http://h/b"}\n'
    )
    stream = read_rows([path])
    assert next(stream) == Row(0, "http://h/ok")
    assert next(stream).problem == f"input {path!r}, line 2: 'url' must be a string, got int"
    assert next(stream) == Row(2, "http://h/b")
    assert next(stream, None) is None  # and the file is closed


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
        # Headers without a url column are still headers (refused for the
        # column they lack): read as plain lists, their rows went out as URLs.
        ("image_url,caption", Format.CSV),
        ("Image URL\tCaption\tsha256", Format.TSV),
        ("key,img-src.1", Format.CSV),
        ("# urls, collected", Format.TEXT),
        ("url;path", Format.CSV),  # refused, for its separator
        ("http://h/a;b", Format.TEXT),
        ("a,", Format.TEXT),
    ],
)
def test_sniff(line: str, fmt: Format) -> None:
    assert sniff(line) is fmt


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("image_url,caption\nhttp://h/a.jpg,a cat\n", "has no 'url' column"),
        ("http://h/a.jpg\ta cat\nhttp://h/b.jpg\ta dog\n", "line 1: a tab after the URL"),
        ("\n\nhttp://h/a.jpg\thttp://h/m/a.jpg\n", "line 3: a tab after the URL"),
        # A spreadsheet's CSV in a locale that separates with ';': each row went
        # out as 'URL;path' (a server that ignores ';' params saved it so named).
        ("url;path\nhttp://h/a.jpg;a\n", "columns separated by ';' are not read"),
        ("Image URL;Caption\nhttp://h/a.jpg;a cat\n", "columns separated by ';' are not read"),
        # A comment before the header: the input was sniffed by the comment,
        # as a plain list, and each row went out as 'URL,path'.
        (
            "# made by x\nurl,path\nhttp://h/a.jpg,a\n",
            "line 1: a '#' comment, but the input is a CSV",
        ),
        (
            "\n# x\n\n# y\npath\turl\na\thttp://h/a\n",
            "line 2: a '#' comment, but the input is a TSV",
        ),
        ('# x\n{"url": "http://h/a"}\n', "line 1: a '#' comment, but the input is JSON Lines"),
        ("# x\nhttp://h/a.jpg\ta cat\n", "line 2: a tab after the URL"),
        # Conceptual Captions' caption<TAB>url: each row failed alone, bad_url.
        (
            'a man\'s "best" friend, the dog\thttp://h/a.jpg\nsunset\thttp://h/b.jpg\n',
            "line 1: a tab before the URL: .* such as caption<TAB>url",
        ),
    ],
)
def test_a_table_read_as_a_plain_list_is_refused_before_any_row(text: str, said: str) -> None:
    # CC12M's headerless url<TAB>caption, or a header without a url column, on
    # stdin or in a .txt: every row went out as a URL with its columns glued on.
    with pytest.raises(UsageError, match=said):
        rows("-", stdin=text)


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


def test_a_plain_list_opening_with_comments_is_still_one() -> None:
    text = "# my list\n#url,path\n\nhttp://h/a,b\n# more\nhttp://h/c\n"
    assert urls("-", stdin=text) == ["http://h/a,b", "http://h/c"]
    comments = "# x\n" * 2000  # looked past up to a bound: then it is a plain list
    assert urls("-", stdin=comments + "url,path\nhttp://h/a,b\n") == ["url,path", "http://h/a,b"]


def test_sniffed_txt_file(tmp_path: Path) -> None:
    path = write(tmp_path / "list.txt", "\n\nurl,sha256\nhttp://h/a," + SHA + "\n")
    assert rows(path) == [Row(0, "http://h/a", sha256=SHA)]
    path = write(tmp_path / "list2.txt", "url,size\nhttp://h/a,x\n")
    assert rows(path) == [
        bad(
            0,
            "http://h/a",
            f"input {path!r}, line 2: 'size' must be a whole number of bytes, got 'x'",
        )
    ]


def test_stdin_bad_rows_are_named() -> None:
    assert rows("-", stdin='{"url": 1}') == [
        bad(0, '{"url": 1}', "input '<stdin>', line 1: 'url' must be a string, got int")
    ]


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
    assert usage_error("x.txt") == (
        "cannot read input 'x.txt': No such file or directory (a URL needs http:// or https://)"
    )
    # A URL without its scheme is read as a path: its password is not shown.
    assert usage_error("user:secret@host/x") == (
        "cannot read input 'user:***@host/x': No such file or directory "
        "(a URL needs http:// or https://)"
    )


def test_missing_file_fails_before_any_row(tmp_path: Path) -> None:
    good = write(tmp_path / "good.txt", "http://h/a\n")
    stream = read_rows(["http://h/0", good, str(tmp_path / "nope.csv")])
    with pytest.raises(UsageError, match=r"nope\.csv': No such file or directory"):
        next(stream)


def test_directory(tmp_path: Path) -> None:
    assert usage_error(tmp_path) == (
        f"cannot read input {str(tmp_path)!r}: Is a directory "
        "(give the list files in it as sources)"
    )


def test_a_directory_of_shards_names_the_files_to_give(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A Hugging Face dataset's layout, given whole: it said "Is a directory",
    # and the command line "it is a directory", with no word of what to give.
    dataset = tmp_path / "dataset"
    shards = dataset / "data"
    shards.mkdir(parents=True)
    for k in range(2):
        write(shards / f"train-{k:05d}-of-00002.parquet", "")
    write(dataset / "README.md", "")
    pattern = str(shards / "*.parquet")
    hint = (
        f"(give the list files in it as sources: {pattern} unquoted, for the shell to "
        f"expand; in Python, sorted(glob.glob({pattern!r})))"
    )
    assert usage_error(dataset) == f"cannot read input {str(dataset)!r}: Is a directory {hint}"
    assert cli.main([str(dataset), "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.endswith(f"it is a directory {hint}\n")


def test_a_pattern_no_shell_expanded_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It said "(a URL needs http:// or https://)".
    pattern = str(tmp_path / "data" / "train-*.parquet")
    hint = (
        "(swarmget does not expand patterns: leave it unquoted for the shell to expand; "
        "in Python, sorted(glob.glob(pattern)))"
    )
    assert usage_error(pattern).endswith(f"No such file or directory {hint}")
    assert cli.main([pattern, "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.endswith(f"no such file {hint}\n")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads everything")
def test_permission_denied(tmp_path: Path) -> None:
    path = write(tmp_path / "secret.txt", "http://h/a\n")
    os.chmod(path, 0)
    assert usage_error(path) == f"cannot read input {path!r}: Permission denied"


def test_check_sources_alone(tmp_path: Path) -> None:
    check_sources(["http://h/a", "-", write(tmp_path / "a.txt", "")])
    with pytest.raises(UsageError, match="No such file"):
        check_sources([tmp_path / "missing"])


def test_invalid_utf8_in_a_long_list_is_one_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "u.txt"
    good = b"".join(b"http://h/%d\n" % i for i in range(5000))
    path.write_bytes(good + b"http://h/\xff\nhttp://h/after\n")
    got = rows(path)
    assert len(got) == 5002
    assert got[5000] == bad(
        5000,
        "http://h/\\xff",
        f"input {str(path)!r}, line 5001: not valid UTF-8 (byte 0xff at column 10)",
    )
    assert got[5001] == Row(5001, "http://h/after")


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


@pytest.mark.parametrize(
    ("suffix", "rows_text"),
    [
        (".txt", b"http://h/a\nhttp://h/b\xff\n"),
        (".jsonl", b'{"url": "http://h/a"}\n{"url": 1}\n'),
        (".csv", b"url\nhttp://h/a\nhttp://h/b,extra\n"),
    ],
)
def test_blank_lines_before_the_first_row_are_counted_not_held(
    tmp_path: Path, suffix: str, rows_text: bytes
) -> None:
    # Every blank line before the first non-blank one was kept for the parser:
    # 20 MB of \r\n (a gzip bomb of them is 20 KB) held 750 MB.
    blanks = 300_000
    source = tmp_path / f"blank{suffix}"
    source.write_bytes(b"\r\n" * blanks + rows_text)
    got, peak = _rows_and_peak(source)
    assert peak < 4 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB"
    assert [row.problem is None for row in got] == [True, False]
    assert got[0].url == "http://h/a"
    last = blanks + rows_text.count(b"\n")
    assert got[1].problem is not None and f"line {last}:" in got[1].problem


def _rows_and_peak(source: Path) -> tuple[list[Row], int]:
    """The rows read from ``source``, and the most memory Python held meanwhile."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        got = list(read_rows([str(source)]))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return got, peak


def test_comments_looked_past_for_the_first_row_are_bounded_in_characters(
    tmp_path: Path,
) -> None:
    # Up to 1,000 comment lines were held to find the line that tells the
    # format, each up to 16 Mi characters: 16 GB.  Past 1 Mi characters of
    # them, the list is a plain one (as past 1,000 lines).
    source = tmp_path / "comments.txt"
    source.write_text(("#" + "c" * (1 << 20) + "\n") * 24 + "http://h/a\n")
    got, peak = _rows_and_peak(source)
    assert got == [Row(0, "http://h/a")]
    assert peak < 12 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB"


def test_plain_text_speed(million_lines: Path) -> None:
    start = time.perf_counter()
    count = sum(1 for _ in read_rows([million_lines]))
    rate = count / (time.perf_counter() - start)
    print(f"plain text: {rate / 1e6:.2f} M rows/s")
    # ~1.5 M rows/s on an idle core; the floor leaves room for a loaded CI box.
    assert rate > 250_000


# -- malformed rows: one bad row each, and the rows after it go on ----------------------------


def test_bad_rows_take_their_index_across_sources(tmp_path: Path) -> None:
    listing = write(
        tmp_path / "l.jsonl", '{"url": "http://h/b"}\n{"url": 1}\n{"url": "http://h/d"}\n'
    )
    got = rows("http://h/a", listing, "http://h/e")
    assert [(r.index, r.url, r.problem is not None) for r in got] == [
        (0, "http://h/a", False),
        (1, "http://h/b", False),
        (2, '{"url": 1}', True),
        (3, "http://h/d", False),
        (4, "http://h/e", False),
    ]


def test_bad_row_url_is_clipped_to_200_characters(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", "url\n  " + '"' + "x" * 300 + '"y\n')
    (row,) = rows(path)
    assert row.url == '"' + "x" * 199
    assert row.problem == f"input {path!r}, line 2: not valid CSV: ',' expected after '\"'"


@pytest.mark.parametrize("suffix", [".txt", ".csv", ".jsonl"])
def test_a_url_or_path_too_long_to_use_fails_its_row_as_it_is_read(
    tmp_path: Path, suffix: str
) -> None:
    # Read whole and carried on to the engine (which refuses a URL over 64 Ki
    # characters), each one cost about five copies in the driver: a list of 60
    # URLs of 15 MB held 4.5 GB.  Its row now holds 200 characters of it.
    long_url = "http://h/" + "a" * 70_000
    long_path = "d/" + "p" * 70_000
    lines = {
        ".txt": ["http://h/0", long_url, "http://h/2"],
        ".csv": ["url,path", "http://h/0,", f"{long_url},", f"http://h/2,{long_path}"],
        ".jsonl": [
            json.dumps({"url": "http://h/0"}),
            json.dumps({"url": long_url}),
            json.dumps({"url": "http://h/2", "path": long_path}),
        ],
    }[suffix]
    path = write(tmp_path / f"in{suffix}", "\n".join(lines) + "\n")
    got = rows(path)
    assert [(r.index, r.problem is None) for r in got] == [
        (0, True),
        (1, False),
        (2, suffix == ".txt"),
    ]
    assert got[1].problem is not None and got[1].problem.startswith(
        f"input {path!r}, line {2 if suffix != '.csv' else 3}: 'url' is 70,009 characters long "
        "(at most 65,536): 'http://h/aaa"
    )
    assert len(got[1].url) <= 200 and len(got[1].problem) < 300
    if suffix != ".txt":
        assert got[2].url == "http://h/2"  # a good URL still names the row
        assert got[2].problem is not None and "'path' is 70,002 characters long" in got[2].problem


def test_csv_unclosed_quote_does_not_swallow_the_rows_after_it(tmp_path: Path) -> None:
    # The quote opened on line 3 runs on to line 5, where `"h` is an error:
    # line 3 is the bad row and lines 4 and 5 are read again.
    text = 'url,path\nhttp://h/a,a\n"http://h/b,b\nhttp://h/c,c\n"http://h/d",d\nhttp://h/e,e\n'
    path = write(tmp_path / "in.csv", text)
    assert rows(path) == [
        Row(0, "http://h/a", path="a"),
        bad(
            1,
            '"http://h/b,b',
            f"input {path!r}, line 3: not valid CSV: ',' expected after '\"' "
            "(the record runs on to line 5: is a quote not closed?)",
        ),
        Row(2, "http://h/c", path="c"),
        Row(3, "http://h/d", path="d"),
        Row(4, "http://h/e", path="e"),
    ]


def test_csv_unclosed_quote_at_the_end(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", 'url,path\nhttp://h/a,"a\nhttp://h/b,b\n')
    assert rows(path) == [
        bad(
            0,
            'http://h/a,"a',
            f"input {path!r}, line 2: not valid CSV: unexpected end of data "
            "(the record runs on to line 3: is a quote not closed?)",
        ),
        Row(1, "http://h/b", path="b"),
    ]
    path = write(tmp_path / "end.csv", 'url\nhttp://h/a\n"http://h/b')
    assert rows(path) == [
        Row(0, "http://h/a"),
        bad(1, '"http://h/b', f"input {path!r}, line 3: not valid CSV: unexpected end of data"),
    ]


def test_csv_quote_closed_later_in_a_column_we_read(tmp_path: Path) -> None:
    # Valid CSV, but a path with a URL after its line break is a quote gone
    # wrong: it took in the row of the line after it.
    path = write(tmp_path / "in.csv", 'url,path\nhttp://h/a,"a\nhttp://h/b,b"\nhttp://h/c,c\n')
    assert rows(path) == [
        bad(
            0,
            'http://h/a,"a',
            f"input {path!r}, line 2: 'path' has a line break with a URL after it "
            "(the record runs on to line 3: is a quote not closed?)",
        ),
        Row(1, "http://h/b", path='b"'),  # read again alone: a stray quote, not an opening one
        Row(2, "http://h/c", path="c"),
    ]
    # Past the header's last column blank cells are let by (trailing commas),
    # one blank but for a line break too: its second line holds no row.  Read
    # again, that line (`"`) was a bad row of its own.
    path = write(tmp_path / "past.csv", 'url\nhttp://h/a,"\n"\nhttp://h/c\n')
    assert [(r.index, r.url, r.problem) for r in rows(path)] == [
        (0, "http://h/a", None),
        (1, "http://h/c", None),
    ]


def test_csv_field_spanning_lines_in_an_ignored_column_is_fine(tmp_path: Path) -> None:
    text = (
        'url,notes,path\nhttp://h/a,"two\nlines, and ""quotes""",a\n'
        'http://h/b,"x",b\nhttp://h/c,,c\n'
    )
    path = write(tmp_path / "in.csv", text)
    assert rows(path) == [
        Row(0, "http://h/a", path="a"),
        Row(1, "http://h/b", path="b"),
        Row(2, "http://h/c", path="c"),
    ]
    # ... and the line of a bad row after it is still right.
    path = write(tmp_path / "in2.csv", text + "http://h/d,,d,extra\n")
    assert rows(path)[3].problem == f"input {path!r}, line 6: 4 fields but the header has 3"


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".csv.gz", ".tsv.gz"])
def test_quoted_line_break_in_a_column_we_read_is_kept(tmp_path: Path, suffix: str) -> None:
    # RFC 4180: a quoted value may hold a line break.  Such a value in the url
    # or path column was a bad row, and its next line a row of its own.
    lines = [
        ["url", "path"],
        ["http://h/a", '"dir/two\nlines.jpg"'],  # a path with a line break
        ['"http://h/b\n"', "b"],  # a spreadsheet cell that ends in a line break
        ['"http://h/very/\r\nlong"', ""],  # a wrapped URL (CRLF in the value)
        ['"\nhttp://h/c"', "c"],  # a url cell that begins with a line break
        ["http://h/d", '"x'],  # bad: its line number must count the breaks above
        ["http://h/e", "e"],
    ]
    delimiter = "\t" if ".tsv" in suffix else ","
    text = "".join(delimiter.join(cells) + "\n" for cells in lines)
    writer = write_gz if suffix.endswith(".gz") else write
    path = writer(tmp_path / f"in{suffix}", text)
    kind = "TSV" if delimiter == "\t" else "CSV"
    assert rows(path) == [
        Row(0, "http://h/a", path="dir/two\nlines.jpg"),
        Row(1, "http://h/b", path="b"),
        Row(2, "http://h/very/\r\nlong"),  # the request leaves the break out
        Row(3, "http://h/c", path="c"),
        bad(
            4,
            f'http://h/d{delimiter}"x',
            f"input {path!r}, line 10: not valid {kind}: unexpected end of data "
            "(the record runs on to line 11: is a quote not closed?)",
        ),
        Row(5, "http://h/e", path="e"),
    ]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('http://h/1,p,"', "'size' has a line break with a URL after it"),
        ('http://h/1,"', "'path' has a line break with a URL after it"),
    ],
)
def test_quote_closed_by_a_later_line_takes_in_no_row(line: str, problem: str) -> None:
    # Valid CSV, and a value may hold a line break, but not these: each is a
    # quote left open that the next line's stray quote closed.
    data = f'url,path,size\n{line}\nhttp://h/2,q,"\nhttp://h/3,r,\n'
    got = rows("-", stdin=data.encode())
    assert [(r.url, r.problem) for r in got] == [
        (line, f"input '<stdin>', line 2: {problem} (the record runs on to line 3: "
               "is a quote not closed?)"),
        ('http://h/2,q,"', "input '<stdin>', line 3: not valid CSV: unexpected end of data "
                           "(the record runs on to line 4: is a quote not closed?)"),
        ("http://h/3", None),
    ]  # fmt: skip


def test_a_quoted_caption_that_holds_a_line_like_a_row_is_one_record() -> None:
    # Valid CSV: the caption's quote closes on its second line.  A check that
    # took such a line for a row swallowed by an open quote failed the row and
    # downloaded the URL quoted in the caption; an unclosed quote that a later
    # stray quote closes reads the same, and is read as the csv module reads it.
    data = (
        'url,caption\nhttp://h/c1,"See also:\nhttp://h/phantom,which is nice"\nhttp://h/c2,plain\n'
    )
    got = rows("-", stdin=data.encode())
    assert [(r.url, r.problem) for r in got] == [("http://h/c1", None), ("http://h/c2", None)]


@pytest.mark.parametrize("header", ["path,url", "path,url,x"])
def test_a_quote_opened_before_a_url_column_takes_in_no_row(header: str) -> None:
    # The url cell begins with a line break, as a wrapped URL does, but what
    # follows it is the next line's fields (p2,http://...): a quote left open.
    # Read as a wrapped URL, two rows were one, and the second's URL was lost.
    data = f'{header}\np1,"\np2,http://h/2"\np3,http://h/3\n'
    got = rows("-", stdin=data.encode())
    assert [(r.index, r.url.startswith("p1,"), r.problem is not None) for r in got[:1]] == [
        (0, True, True)
    ]
    assert got[0].problem is not None and "'url' has a line break with a URL after it" in (
        got[0].problem
    )
    assert [(r.index, r.url) for r in got[1:]] == [(1, 'http://h/2"'), (2, "http://h/3")]


@pytest.mark.parametrize("delimiter", [",", "\t"])
def test_a_size_or_digest_with_a_line_break_inside_is_one_bad_row(delimiter: str) -> None:
    # As the csv module reads it: one record, whose size (or digest) is not
    # one.  Read again line by line, the quote's second line (`6"`) was a row
    # of its own, with no problem, made up out of half a size.
    data = f'url{delimiter}path{delimiter}size\nhttp://h/1{delimiter}p{delimiter}"5\n6"\n'
    data += f"http://h/3{delimiter}r{delimiter}\n"
    got = rows("-", stdin=data.encode())
    assert [(r.index, r.url, r.problem) for r in got] == [
        (0, "http://h/1", "input '<stdin>', line 2: 'size' must be a whole number of bytes, "
                          "got '5\\n6'"),
        (1, "http://h/3", None),
    ]  # fmt: skip
    data = f'url{delimiter}md5\nhttp://h/1{delimiter}"abc\ndef"\nhttp://h/2{delimiter}\n'
    got = rows("-", stdin=data.encode())
    assert [(r.url, r.problem is not None) for r in got] == [
        ("http://h/1", True),
        ("http://h/2", False),
    ]
    assert got[0].problem is not None and "'md5' must be 32 hex digits" in got[0].problem
    (row,) = rows("-", stdin=b'url,size\nhttp://h/1,"5\n"\n')  # from a spreadsheet cell
    assert (row.url, row.size, row.problem) == ("http://h/1", 5, None)


def test_csv_bad_row_in_a_multiline_record_is_the_whole_record(tmp_path: Path) -> None:
    # A field error is not a quoting error: the record is one row, nothing is read again.
    path = write(tmp_path / "in.csv", 'url,notes,size\nhttp://h/a,"x\ny",-1\nhttp://h/b,,\n')
    assert rows(path) == [
        bad(
            0,
            "http://h/a",
            f"input {path!r}, line 2: 'size' must be a whole number of bytes, got '-1'",
        ),
        Row(1, "http://h/b"),
    ]


def test_csv_field_larger_than_the_csv_limit(tmp_path: Path) -> None:
    # An unclosed quote with no quote after it: the field limit ends the
    # record; the lines it swallowed are read again.
    from swarmget.sources.formats import FIELD_LIMIT

    lines = [f"http://h/{i:07d}" for i in range(FIELD_LIMIT // 16)]  # 18 bytes a line
    path = write(tmp_path / "in.csv", 'url\n"http://h/x\n' + "\n".join(lines) + "\n")
    got = rows(path)
    assert got[0].problem is not None
    assert got[0].problem.startswith(f"input {path!r}, line 2: not valid CSV: field larger than")
    assert len(got) == len(lines) + 1
    assert got[1:] == [Row(i + 1, url) for i, url in enumerate(lines)]


def test_csv_header_problems_are_usage_errors(tmp_path: Path) -> None:
    path = write(tmp_path / "in.csv", '\nurl,"path\nhttp://h/a,a\n')
    assert usage_error(path) == (
        f"input {path!r}, line 2: the header is not valid CSV: unexpected end of data"
    )
    path = write(tmp_path / "semi.csv", "url;path\nhttp://h/a;a\n")
    assert usage_error(path) == (
        f"input {path!r} has no 'url' column (columns found: 'url;path'); "
        "columns separated by ';' are not read: use ',' (CSV) or tabs (TSV)"
    )
    path = write(tmp_path / "tabs.csv", "url\tpath\nhttp://h/a\ta\n")
    assert usage_error(path) == (
        f"input {path!r} has no 'url' column (columns found: 'url\\tpath'); "
        "its columns are separated by tabs: name the file .tsv (or pipe it to stdin)"
    )


def test_undecodable_bytes_in_columns(tmp_path: Path) -> None:
    # Inputs are decoded with surrogateescape, so a bad byte costs its own row
    # and only if it is in a column swarmget reads.
    path = tmp_path / "in.csv"
    path.write_bytes(
        b"url,path,notes\n"
        b"http://h/caf\xe9,a,x\n"
        b"http://h/b,caf\xe9,x\n"
        b"http://h/c,c,caf\xe9 latin-1 in a column nobody reads\n"
    )
    name = str(path)
    assert rows(path) == [
        bad(
            0,
            "http://h/caf\\xe9,a,x",
            f"input {name!r}, line 2: 'url' is not valid UTF-8: 'http://h/caf\\xe9'",
        ),
        bad(1, "http://h/b", f"input {name!r}, line 3: 'path' is not valid UTF-8: 'caf\\xe9'"),
        Row(2, "http://h/c", path="c"),
    ]


def test_jsonl_lone_surrogate_and_huge_numbers(tmp_path: Path) -> None:
    text = (
        '{"url": "http://h/0"}\n'
        '{"url": "http://h/\\ud800"}\n'
        '{"url": "http://h/a", "path": "\\udcff"}\n'
        '{"url": "http://h/b", "size": 1' + "0" * 5000 + "}\n"
        '{"url": "http://h/c", "size": 1e400}\n'
        '{"url": "http://h/d"} {"url": "http://h/e"}\n'
        "{\"url\": 'http://h/f'}\n"
    )
    path = write(tmp_path / "in.jsonl", text)
    got = rows(path)
    assert [(r.index, r.url) for r in got][1:3] == [
        (1, '{"url": "http://h/\\ud800"}'),
        (2, "http://h/a"),
    ]
    assert [r.problem for r in got] == [
        None,
        f"input {path!r}, line 2: 'url' is not valid UTF-8: 'http://h/\\ud800'",
        f"input {path!r}, line 3: 'path' is not valid UTF-8: '\\xff'",
        f"input {path!r}, line 4: 'size' must be a whole number of bytes, got the number inf",
        f"input {path!r}, line 5: 'size' must be a whole number of bytes, got the number inf",
        f"input {path!r}, line 6: not valid JSON: Extra data (column 23)",
        f"input {path!r}, line 7: not valid JSON: Expecting value (column 9)",
    ]
    for row in got:  # every bad row can be written to a UTF-8 manifest
        (row.url + (row.problem or "")).encode("utf-8")


def test_jsonl_an_integer_too_long_for_int_in_a_column_not_read_is_no_problem(
    tmp_path: Path,
) -> None:
    # json.loads refuses an integer of over 4,300 digits (a ValueError saying to
    # call sys.set_int_max_str_digits()): the row failed for a column swarmget
    # never reads, and on the first line the whole input, where 1e400 was fine.
    huge = "9" * 5000
    text = f'{{"url": "http://h/a", "id": {huge}}}\n{{"url": "http://h/b", "id": -{huge}}}\n'
    assert rows(write(tmp_path / "in.jsonl", text)) == [Row(0, "http://h/a"), Row(1, "http://h/b")]


def test_text_line_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "u.txt"
    path.write_bytes(
        b"http://h/a\n  http://h/caf\xe9 \n# comment in latin-1: caf\xe9\nhttp://h/b\n"
    )
    assert rows(path) == [
        Row(0, "http://h/a"),
        bad(
            1,
            "http://h/caf\\xe9",
            f"input {str(path)!r}, line 2: not valid UTF-8 (byte 0xe9 at column 15)",
        ),
        Row(2, "http://h/b"),  # comments are not read, whatever their bytes
    ]


def test_a_latin_1_letter_on_the_first_line_fails_that_row_not_the_input(
    tmp_path: Path,
) -> None:
    # The whole input was refused (exit 2) for it, while the same line further
    # down failed alone.
    path = tmp_path / "u.txt"
    path.write_bytes(b"\n\nhttp://h/caf\xe9\nhttp://h/b\n")
    assert rows(path) == [
        bad(
            0,
            "http://h/caf\\xe9",
            f"input {str(path)!r}, line 3: not valid UTF-8 (byte 0xe9 at column 13)",
        ),
        Row(1, "http://h/b"),
    ]


@pytest.mark.parametrize(
    "first",
    [
        b"\xc9tiquette,url",
        b"url\tn\xe9",
        b"caf\xe9 \xe0 la carte,url",
        b"url,informa\xe7\xe3o",  # two side by side: common in Portuguese, German
    ],
)
def test_a_latin_1_header_is_a_table_not_binary(tmp_path: Path, first: bytes) -> None:
    # Refused whole (exit 2) when the accented letter came first, or in a
    # short header: "not valid UTF-8", as if the file were binary.
    delimiter = b"\t" if b"\t" in first else b","
    path = tmp_path / ("u.tsv" if delimiter == b"\t" else "u.csv")
    second = b"http://h/a" + delimiter + b"x" if first.startswith(b"url") else b"x,http://h/a"
    path.write_bytes(first + b"\n" + second + b"\n")
    assert [row.url for row in rows(path)] == ["http://h/a"]


@pytest.mark.parametrize(
    "first",
    [b"\x89PNG\r\n", b"\xff\xd8\xff\xe0 JFIF", b"\xd0\xcf\x11\xe0 doc"],
)
def test_binary_first_lines_are_still_refused(tmp_path: Path, first: bytes) -> None:
    path = tmp_path / "u.txt"
    path.write_bytes(first + b"\nhttp://h/a\n")
    with pytest.raises(UsageError, match="line 1: not valid UTF-8"):
        rows(path)


def test_text_given_as_text_is_checked_too() -> None:
    # Text that the reader did not decode (stdin= a text stream) may hold lone
    # surrogates too: every line is checked.
    assert rows("-", stdin="http://h/a\nhttp://h/\udcff\n") == [
        Row(0, "http://h/a"),
        bad(
            1, "http://h/\\xff", "input '<stdin>', line 2: not valid UTF-8 (byte 0xff at column 10)"
        ),
    ]


# -- the first line is the verdict on the whole input ---------------------------------------


_ONLY_GZIP = "only gzip is read as it is"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            b"\xff\xfeh\x00t\x00t\x00p\x00\n\x00",
            "not valid UTF-8 (byte 0xff at column 1); it is UTF-16 text: save it as UTF-8",
        ),
        (  # UTF-32's byte order mark was taken for UTF-16's
            "http://h/a\n".encode("utf-32"),
            "not valid UTF-8 (byte 0xff at column 1); it is UTF-32 text: save it as UTF-8",
        ),
        (
            "http://h/a\n".encode("utf-16-le"),
            "not text (a NUL byte at column 2); "
            "it looks like UTF-16 text without a byte order mark: save it as UTF-8",
        ),
        (
            "http://h/a\n".encode("utf-16-be"),
            "not text (a NUL byte at column 1); "
            "it looks like UTF-16 text without a byte order mark: save it as UTF-8",
        ),
        (
            b"\n\n\xe9\xe8\xe0\xf9 caf\xe9\nhttp://h/b\n",  # mostly 8-bit: not a list
            "not valid UTF-8 (byte 0xe9 at column 1); "
            "swarmget reads UTF-8 text, plain or gzip-compressed",
        ),
        (
            b"http://h/a\x01\xe9\nhttp://h/b\n",  # a control byte: not text either
            "not valid UTF-8 (byte 0xe9 at column 12); "
            "swarmget reads UTF-8 text, plain or gzip-compressed",
        ),
        (
            b"PK\x03\x04\x14\x00\x00\x00\x08\x00",
            "not text (a NUL byte at column 6); "
            "it is a zip archive: an Excel workbook? save it as CSV",
        ),
        (
            b"\xfd7zXZ\x00\x00\x04\xe6\xd6\xb4F",
            f"not valid UTF-8 (byte 0xfd at column 1); it is xz-compressed: {_ONLY_GZIP}, xzcat it",
        ),
        (
            b"BZh91AY&SY\xa3\xf1",
            "not valid UTF-8 (byte 0xa3 at column 11); "
            f"it looks bzip2-compressed: {_ONLY_GZIP}, bzcat it",
        ),
        (  # a bzip2 stream whose first line is valid UTF-8 (its CRC holds a \n)
            b"BZh91AY&SY\x0a\x12\x13\x14\x15",
            "not text (an archive's first bytes); "
            f"it looks bzip2-compressed: {_ONLY_GZIP}, bzcat it",
        ),
        (
            b"\x28\xb5\x2f\xfd\x04",
            "not valid UTF-8 (byte 0xb5 at column 2); "
            f"it is zstd-compressed: {_ONLY_GZIP}, zstdcat it",
        ),
    ],
)
def test_first_line_not_text_is_a_usage_error(tmp_path: Path, data: bytes, message: str) -> None:
    line = 3 if data.startswith(b"\n\n") else 1
    path = tmp_path / "list"
    path.write_bytes(data)
    assert usage_error(path) == f"input {str(path)!r}, line {line}: {message}"
    assert usage_error("-", stdin=data) == f"input '<stdin>', line {line}: {message}"


def test_jsonl_first_line_not_an_object_is_a_usage_error(tmp_path: Path) -> None:
    hint = (
        "the input is read as JSON Lines, one JSON object per line "
        "(jq -c '.[]' turns a JSON array into that, jq -c . pretty-printed JSON)"
    )
    array = write(tmp_path / "a.json", '[{"url": "http://h/a"},\n {"url": "http://h/b"}]\n')
    assert usage_error(array) == (
        f"input {array!r}, line 1: not valid JSON: Expecting value (column 24); {hint}"
    )
    assert usage_error("-", stdin='\n["http://h/a"]\n') == (
        f"input '<stdin>', line 2: expected a JSON object, got an array; {hint}"
    )
    pretty = write(tmp_path / "p.jsonl", '{\n  "url": "http://h/a"\n}\n')
    assert usage_error(pretty).startswith(f"input {pretty!r}, line 1: not valid JSON: ")
    # A good object with a bad column is a row, even on the first line.
    assert rows("-", stdin='{"url": "http://h/a", "size": -1}\n')[0].problem is not None


# -- bytes on stdin, gzip sniffed like on files ---------------------------------------------


def test_stdin_bytes_are_decoded_as_utf8_with_bom() -> None:
    assert rows("-", stdin="\ufeffhttp://h/é\r\nhttp://h/b\r".encode()) == [
        Row(0, "http://h/é"),
        Row(1, "http://h/b"),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://h/a\nhttp://h/b\n", [Row(0, "http://h/a"), Row(1, "http://h/b")]),
        ('{"url": "http://h/a", "size": 3}\n', [Row(0, "http://h/a", size=3)]),
        ("url,path\nhttp://h/a,a\n", [Row(0, "http://h/a", path="a")]),
        ("\ufeffurl\tpath\nhttp://h/a\ta\n", [Row(0, "http://h/a", path="a")]),
    ],
)
def test_stdin_gzip_is_sniffed(text: str, expected: list[Row]) -> None:
    assert rows("-", stdin=gzip.compress(text.encode())) == expected


def test_stdin_gzip_concatenated_members() -> None:
    data = gzip.compress(b"http://h/a\n") + gzip.compress(b"http://h/b\n")
    assert urls("-", stdin=data) == ["http://h/a", "http://h/b"]


def test_stdin_bad_bytes_are_bad_rows() -> None:
    data = b"url\nhttp://h/a\nhttp://h/\xff\n\xfe\xfe\nhttp://h/b\n"
    expected = [
        Row(0, "http://h/a"),
        bad(
            1,
            "http://h/\\xff",
            "input '<stdin>', line 3: 'url' is not valid UTF-8: 'http://h/\\xff'",
        ),
        bad(2, "\\xfe\\xfe", "input '<stdin>', line 4: 'url' is not valid UTF-8: '\\xfe\\xfe'"),
        Row(3, "http://h/b"),
    ]
    assert rows("-", stdin=data) == expected
    assert rows("-", stdin=gzip.compress(data)) == expected


def test_stdin_truncated_or_corrupt_gzip_is_a_usage_error() -> None:
    data = gzip.compress(b"http://h/a\n" * 10_000)
    assert usage_error("-", stdin=data[: len(data) // 2]).startswith(
        "cannot read input '<stdin>': Compressed file ended"
    )
    assert usage_error("-", stdin=b"\x1f\x8b\x00garbage").startswith(
        "cannot read input '<stdin>': "
    )
    assert usage_error("-", stdin=b"\x1f").startswith("cannot read input '<stdin>': ")


def test_gzip_file_without_gz_name(tmp_path: Path) -> None:
    path = tmp_path / "urls.txt"
    path.write_bytes(gzip.compress(b"http://h/a\n"))
    assert urls(path) == ["http://h/a"]
    path = tmp_path / "list.csv"
    path.write_bytes(gzip.compress(b"url,size\nhttp://h/a,1\n"))
    assert rows(path) == [Row(0, "http://h/a", size=1)]


def test_real_stdin_is_read_as_bytes_and_left_open(monkeypatch: pytest.MonkeyPatch) -> None:
    buffer = io.BufferedReader(io.BytesIO(gzip.compress(b"http://h/a\n")))  # type: ignore[arg-type]
    fake = io.TextIOWrapper(buffer, encoding="ascii", errors="strict")
    monkeypatch.setattr("sys.stdin", fake)
    assert list(read_rows(["-"])) == [Row(0, "http://h/a")]
    assert not buffer.closed
    assert not fake.closed


# -- properties: garbage anywhere costs exactly its own row ----------------------------------
#
# A list mixes good rows with garbage lines.  Every good row must come out
# exactly as written, with the index it has among all rows; every other line
# must become exactly one row (a bad one when it cannot be read, with its line
# number), unless it is documented as skipped: blank lines, `#` comments in
# plain text, blank records (`,,`) in CSV/TSV.  The first line is always good
# (a first line that is not is the whole input's problem, tested above).

# Text with no line break the text layer or the csv module would split on.
_ONE_LINE = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\r\n"))
_BYTES_LINE = st.binary(max_size=30).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))


@dataclasses.dataclass
class Line:
    data: bytes
    row: Row | None = None  # the row it must give (index set later), if it is a good row
    bad: bool = False  # it must give one row with a problem
    skipped: bool = False  # it must give no row


def _check(lines: list[Line], got: list[Row], name: str = "<stdin>") -> None:
    expected = [(n, line) for n, line in enumerate(lines, 1) if not line.skipped]
    assert len(got) == len(expected), (expected, got)
    for index, ((lineno, line), row) in enumerate(zip(expected, got, strict=True)):
        assert row.index == index
        if line.row is not None:
            assert row == dataclasses.replace(line.row, index=index), (lineno, line)
        if line.bad:
            assert row.problem is not None, (lineno, line, row)
            assert row.problem.startswith(f"input {name!r}, line {lineno}: "), row.problem
        if row.problem is not None:  # whatever it is, it can go into a UTF-8 manifest
            (row.url + row.problem).encode("utf-8")
            assert len(row.url) <= 200


def _run(lines: list[Line], gzipped: bool) -> list[Row]:
    data = b"".join(line.data + b"\n" for line in lines)
    return rows("-", stdin=gzip.compress(data) if gzipped else data)


_GOOD_URL = st.integers(0, 10**6).map(lambda i: f"http://h/{i}")


@st.composite
def text_line(draw: st.DrawFn) -> Line:
    kind = draw(st.sampled_from(["good", "text", "bytes", "blank", "comment"]))
    if kind == "good":
        url = draw(_GOOD_URL)
        pad = draw(st.sampled_from(["", " ", "\t", "  "]))
        return Line(f"{pad}{url}{pad}".encode(), row=Row(0, url))
    if kind == "blank":
        return Line(draw(st.sampled_from(["", " ", "\t \x0c"])).encode(), skipped=True)
    if kind == "comment":
        return Line(b"#" + draw(_BYTES_LINE), skipped=True)
    data = draw(_ONE_LINE).encode() if kind == "text" else draw(_BYTES_LINE)
    text = strip_url(data.decode("utf-8", "surrogateescape"))
    if not text or text[0] == "#" or text.isspace():
        return Line(data, skipped=True)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return Line(data, bad=True)
    return Line(data, row=Row(0, text))  # any other text is a URL (maybe a bad_url one)


@given(first=_GOOD_URL, lines=st.lists(text_line(), max_size=30), gzipped=st.booleans())
@settings(max_examples=200, deadline=None)
def test_property_text(first: str, lines: list[Line], gzipped: bool) -> None:
    lines = [Line(first.encode(), row=Row(0, first)), *lines]
    _check(lines, _run(lines, gzipped))


_DIGEST = st.text("0123456789abcdefABCDEF", min_size=64, max_size=64)


@st.composite
def good_json_row(draw: st.DrawFn) -> Line:
    url = draw(_GOOD_URL)
    fields: dict[str, object] = {"url": url}
    path = draw(st.none() | _ONE_LINE.filter(lambda t: t.strip() != ""))
    size = draw(st.none() | st.integers(0, 2**70))
    sha = draw(st.none() | _DIGEST)
    if path is not None:
        fields["path"] = path
    if size is not None:
        fields["size"] = size if draw(st.booleans()) else str(size)
    if sha is not None:
        fields["sha256"] = sha
    fields.update(draw(st.dictionaries(st.sampled_from(["id", "note"]), _ONE_LINE, max_size=2)))
    data = json.dumps(fields, ensure_ascii=draw(st.booleans())).encode()
    row = Row(0, url, path=path.strip() if path else None, size=size, sha256=sha and sha.lower())
    return Line(data, row=row)


@st.composite
def json_line(draw: st.DrawFn) -> Line:
    kind = draw(st.integers(0, 9))
    if kind <= 2:
        return draw(good_json_row())
    if kind == 3:
        return Line(draw(st.sampled_from(["", " ", "\t"])).encode(), skipped=True)
    if kind == 4:  # not JSON: a control character is never valid JSON, in a string or not
        return Line((draw(_ONE_LINE) + "\x01" + draw(_ONE_LINE)).encode(), bad=True)
    if kind == 5:  # JSON, but not an object
        value = draw(st.lists(st.integers()) | st.integers() | st.text() | st.none())
        return Line(json.dumps(value).encode(), bad=True)
    if kind == 6:  # an object with a bad column
        good = draw(good_json_row())
        column, value = draw(
            st.sampled_from(
                [
                    ("url", None), ("url", ""), ("url", 5), ("url", ["x"]), ("size", -1),
                    ("size", 1.5), ("size", "1k"), ("size", True), ("sha256", "abc"),
                    ("md5", "g" * 32), ("path", 3), ("url", "http://h/\ud800"),
                ]
            )
        )  # fmt: skip
        fields = json.loads(good.data)
        fields[column] = value
        return Line(json.dumps(fields).encode(), bad=True)
    if kind == 7:  # a good row cut short
        data = draw(good_json_row()).data
        return Line(data[: draw(st.integers(1, len(data) - 1))], bad=True)
    if kind == 8:  # a good row with bytes that are not UTF-8 in its url
        url = draw(_GOOD_URL).encode() + b"\xe9"
        return Line(b'{"url": "' + url + b'"}', bad=True)
    data = draw(_BYTES_LINE)  # anything: one row at most, bad unless it happens to be good
    return Line(data, skipped=not data.decode("utf-8", "surrogateescape").strip())


@given(first=good_json_row(), lines=st.lists(json_line(), max_size=30), gzipped=st.booleans())
@settings(max_examples=200, deadline=None)
def test_property_jsonl(first: Line, lines: list[Line], gzipped: bool) -> None:
    lines = [first, *lines]
    _check(lines, _run(lines, gzipped))


@st.composite
def good_csv_row(draw: st.DrawFn, delimiter: str) -> Line:
    url = draw(_GOOD_URL)
    path = draw(_ONE_LINE)
    size = draw(st.none() | st.integers(0, 2**70))
    out = io.StringIO()
    quoting = draw(st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL, csv.QUOTE_NONNUMERIC]))
    cells = [url, path, "" if size is None else str(size)]
    csv.writer(out, delimiter=delimiter, quoting=quoting, lineterminator="").writerow(cells)
    row = Row(0, url, path=path.strip() or None, size=size)
    return Line(out.getvalue().encode(), row=row)


def _alone(line: bytes, delimiter: str) -> list[str] | None:
    """The record ``line`` is on its own (None: not valid CSV alone)."""
    text = line.decode("utf-8", "surrogateescape")
    try:
        return next(csv.reader([text], delimiter=delimiter, strict=True, skipinitialspace=True))
    except csv.Error:
        return None


@st.composite
def csv_line(draw: st.DrawFn, delimiter: str) -> Line:
    kind = draw(st.integers(0, 9))
    d = delimiter.encode()
    if kind <= 2:
        return draw(good_csv_row(delimiter))
    if kind == 3:
        return Line(draw(st.sampled_from([b"", b" ", d + d, b'""', b'" "' + d])), skipped=True)
    if kind == 4:  # a quote that is not closed: it must not swallow the good rows after it
        url = draw(_GOOD_URL).encode()
        data = draw(st.sampled_from([b'"' + url, url + d + b'"x', url + d + b"p" + d + b'"']))
        return Line(data, bad=True)
    if kind == 5:  # a stray character after a closing quote
        return Line(b'"' + draw(_GOOD_URL).encode() + b'"x' + d + b"p", bad=True)
    if kind == 6:  # more fields than the header
        return Line(draw(_GOOD_URL).encode() + d + b"p" + d + b"1" + d + b"extra", bad=True)
    if kind == 7:  # a bad column, or none
        choices = [
            d + b"p" + d + b"1",
            b"http://h/x" + d + d + b"-1",
            b"http://h/\xe9" + d + b"p",
            b"http://h/x" + d + b"\xff",
        ]
        data = draw(st.sampled_from(choices))
        return Line(data, bad=True)
    # Anything: exactly one row if it is a record on its own, a bad one if it is not.
    data = draw(_ONE_LINE).encode() if kind == 8 else draw(_BYTES_LINE)
    record = _alone(data, delimiter)
    if record is None:
        return Line(data, bad=True)
    return Line(data, skipped=not any(cell.strip() for cell in record))


@pytest.mark.parametrize("delimiter", [",", "\t"])
@given(data=st.data(), gzipped=st.booleans())
@settings(max_examples=200, deadline=None)
def test_property_csv(delimiter: str, data: st.DataObject, gzipped: bool) -> None:
    header = Line(delimiter.join(["url", "path", "size"]).encode(), skipped=True)
    first = data.draw(good_csv_row(delimiter))
    lines = [header, first, *data.draw(st.lists(csv_line(delimiter), max_size=30))]
    assume(not _quote_closed_into_one_value(lines, delimiter))
    _check(lines, _run(lines, gzipped))


def _quote_closed_into_one_value(lines: list[Line], delimiter: str) -> bool:
    """Does a line open a quote that a later line closes, making a record that
    is valid CSV with no URL after a line break in it?  The parser reads that
    as one row (RFC 4180: a quoted value may hold a line break), so "a row per
    line" does not hold there; the examples above test it.  (Conservative: the
    parser rejects some of these, a size with a line break, say.)"""
    texts = [line.data.decode("utf-8", "surrogateescape") + "\n" for line in lines]
    for i, line in enumerate(lines):
        if _alone(line.data, delimiter) is not None:
            continue  # valid alone: it opens no quote
        reader = csv.reader(
            iter(texts[i:]), delimiter=delimiter, strict=True, skipinitialspace=True
        )
        try:
            record = next(reader)
        except (csv.Error, StopIteration):
            continue  # read again line by line
        if reader.line_num > 1 and not any("://" in cell.partition("\n")[2] for cell in record):
            return True
    return False


@pytest.mark.parametrize("delimiter", [",", "\t"])
def test_two_lines_of_one_unclosed_quote_each_are_two_bad_rows(delimiter: str) -> None:
    # Together they parse as one record whose only cell is a line break; it
    # used to pass for a blank record, and both lines vanished without a row.
    data = f'url{delimiter}path\nhttp://h/1{delimiter}a\n"\n"\nhttp://h/2{delimiter}b\n'
    got = rows("-", stdin=data.encode())
    assert [row.url if not row.problem else "bad" for row in got] == [
        "http://h/1",
        "bad",
        "bad",
        "http://h/2",
    ]


# -- end to end: bytes piped into a real `python -m swarmget - -o DIR` ----------------------


def test_cli_a_size_cell_with_a_line_break_is_part_of_its_row(tmp_path: Path) -> None:
    # Two rows, two records in the manifest: the one whose size holds a line
    # break fails for its size, and no third row is made of its second line.
    from swarmget.testing.server import TestServer

    with TestServer() as server:
        bad_size, good = server.file_url("a.bin", size=10), server.file_url("b.bin", size=5)
        data = f'url,size\n{bad_size},"10\n0"\n{good},5\n'.encode()
        proc = run_cli(data, tmp_path / "out")
    assert proc.returncode == 1, proc.stderr
    records = manifest(tmp_path / "out")
    assert sorted(records) == sorted([bad_size, good]), records
    assert (records[bad_size]["status"], records[bad_size]["error"]) == ("failed", "bad_row")
    assert "'size' must be a whole number of bytes" in str(records[bad_size]["message"])
    assert records[good]["status"] == "ok"
    assert (tmp_path / "out" / "b.bin").read_bytes() == expected_body("b.bin", 5)


def run_cli(data: bytes, out: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    from swarmget.testing.process import child_env

    return subprocess.run(
        [sys.executable, "-m", "swarmget", "-", "-o", str(out), "--quiet", *args],
        input=data,
        capture_output=True,
        env=child_env(),
        timeout=120,
    )


def manifest(out: Path) -> dict[str, dict[str, object]]:
    """The manifest's records by URL."""
    records = (out / ".swarmget" / "manifest.jsonl").read_text().splitlines()
    return {str(record["url"]): record for record in map(json.loads, records)}


@pytest.mark.parametrize("workers", ["1", "2"])
def test_cli_gzip_on_stdin(tmp_path: Path, workers: str) -> None:
    # `cat list.jsonl.gz | swarmget - -o out`: sniffed, decompressed, downloaded.
    from swarmget.testing.server import TestServer

    with TestServer() as server:
        wanted = [server.file_url(f"f{i}.bin", size=100 + i) for i in range(3)]
        text = "".join(
            json.dumps({"url": url, "path": f"f{i}"}) + "\n" for i, url in enumerate(wanted)
        )
        proc = run_cli(gzip.compress(text.encode()), tmp_path / "out", "--workers", workers)
    assert (proc.returncode, proc.stderr) == (0, b"")
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name != ".swarmget") == [
        "f0",
        "f1",
        "f2",
    ]
    assert (tmp_path / "out" / "f2").stat().st_size == 102


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            "http://h/a\n".encode("utf-16"),
            "input '<stdin>', line 1: not valid UTF-8 (byte 0xff at column 1); "
            "it is UTF-16 text: save it as UTF-8",
        ),
        (
            gzip.compress(b"\x89PNG\r\n\x1a\n\x00\x00"),
            "input '<stdin>', line 1: not valid UTF-8 (byte 0x89 at column 1); "
            "swarmget reads UTF-8 text, plain or gzip-compressed",
        ),
        (
            gzip.compress(b"http://h/a\n")[:12],
            "cannot read input '<stdin>': Compressed file ended before the end-of-stream "
            "marker was reached",
        ),
        (
            b'[{"url": "http://h/a"}]\n',
            "input '<stdin>', line 1: expected a JSON object, got an array; the input is read "
            "as JSON Lines, one JSON object per line (jq -c '.[]' turns a JSON array into "
            "that, jq -c . pretty-printed JSON)",
        ),
    ],
)
def test_cli_unreadable_stdin_is_a_usage_error(tmp_path: Path, data: bytes, message: str) -> None:
    for workers in ("1", "2"):
        proc = run_cli(data, tmp_path / "out", "--workers", workers)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.decode() == f"swarmget: error: {message}\n"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_cli_bad_rows_end_to_end(tmp_path: Path, workers: str) -> None:
    from swarmget.testing.server import TestServer

    with TestServer() as server:
        good = [server.file_url(f"g{i}.bin", size=10) for i in range(3)]
        data = (
            b"url,path\n"
            + f"{good[0]},g0\n".encode()
            + b'"http://h/unclosed,x\n'  # line 3: bad quoting, must not swallow line 4
            + f"{good[1]},g1\n".encode()
            + b"http://h/caf\xe9,x\n"  # line 5: not UTF-8
            + f"{good[2]},g2,extra\n".encode()  # line 6: too many fields
        )
        proc = run_cli(gzip.compress(data), tmp_path / "out", "--workers", workers)
    assert proc.returncode == 1, proc.stderr
    assert b"Traceback" not in proc.stderr
    records = manifest(tmp_path / "out")
    expected = {
        good[0]: (0, None),
        '"http://h/unclosed,x': (1, 3),  # bad rows: their url is the line, clipped
        good[1]: (2, None),
        "http://h/caf\\xe9,x": (3, 5),  # undecodable bytes shown as \xe9
        f"{good[2]},g2,extra": (4, 6),
    }
    assert set(records) == set(expected)
    for url, (index, line) in expected.items():
        record = records[url]
        assert record.get("index", index) == index
        if line is None:
            assert (record["status"], record["error"]) == ("ok", None)
        else:
            assert (record["status"], record["error"]) == ("failed", "bad_row")
            assert f"input '<stdin>', line {line}: " in str(record["message"])


@pytest.mark.parametrize("suffix", [".txt", ".csv", ".jsonl"])
def test_an_endless_line_ends_the_input_instead_of_filling_memory(
    tmp_path: Path, suffix: str
) -> None:
    # /dev/zero, or a binary file without a newline, was read as one line,
    # whole: 5 GB of memory for a 300 MB line, a MemoryError at the end.
    first = {
        ".txt": "http://h/a\n",
        ".csv": "url\nhttp://h/a\n",
        ".jsonl": '{"url": "http://h/a"}\n',
    }
    source = tmp_path / f"long{suffix}"
    with source.open("w") as out:
        out.write(first[suffix])
        out.write("x" * (reader.MAX_LINE + 10))
    rows = read_rows([str(source)])
    assert next(rows).url == "http://h/a"  # what comes before it is read
    with pytest.raises(UsageError, match=r"line \d+: longer than 16 Mi characters"):
        next(rows)


@pytest.mark.parametrize(
    ("suffix", "line"),
    [(".txt", "{url}\r\n"), (".jsonl", '{{"url": "{url}"}}\r\n'), (".csv", "url\r\n{url}\r\n")],
)
def test_files_joined_with_their_byte_order_marks_read_whole(
    tmp_path: Path, suffix: str, line: str
) -> None:
    # Two files saved with a BOM each, joined with cat: the second's BOM, mid-
    # file now, failed its row (bad_url "\ufeffhttp://...", bad_row in JSONL).
    source = tmp_path / f"joined{suffix}"
    parts = [line.format(url=f"http://h/{name}") for name in ("a", "b")]
    if suffix == ".csv":
        parts[1] = parts[1].partition("\r\n")[2]  # one header: the second file's rows only
    source.write_bytes(b"".join(b"\xef\xbb\xbf" + part.encode() for part in parts))
    rows = list(read_rows([str(source)]))
    assert [(row.url, row.problem) for row in rows] == [("http://h/a", None), ("http://h/b", None)]
