"""Parquet input lists (``pip install swarmget[datasets]``): read as a CSV with a
header is, the known columns in any case, one bad value one bad row, and a
download from one end to the other against the scripted server."""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow", reason="the datasets extra (pyarrow) is not installed")
pq = pytest.importorskip("pyarrow.parquet")

import swarmget  # noqa: E402
from swarmget.errors import UsageError  # noqa: E402
from swarmget.sources import read_rows  # noqa: E402
from swarmget.sources.parquet import BATCH_ROWS  # noqa: E402
from swarmget.testing import TestServer, expected_body  # noqa: E402

SHA = "ab" * 32


def write_parquet(path: Path, columns: dict[str, list[object]], **options: object) -> str:
    pq.write_table(pa.table(columns), path, **options)
    return str(path)


def test_known_columns_in_any_case_and_others_ignored(tmp_path: Path) -> None:
    # LAION's lists say URL and TEXT; a caption column is never decoded.
    source = write_parquet(
        tmp_path / "laion.parquet",
        {
            "URL": ["http://h/a.jpg", "http://h/b.jpg"],
            "TEXT": ["a cat", "a dog"],
            "Path": ["x/a.jpg", None],
            "SHA256": [SHA.upper(), None],
            "size": [10, None],
        },
    )
    rows = list(read_rows([source]))
    assert [(r.index, r.url, r.path, r.sha256, r.size, r.problem) for r in rows] == [
        (0, "http://h/a.jpg", "x/a.jpg", SHA, 10, None),
        (1, "http://h/b.jpg", None, None, None, None),
    ]


def test_a_bad_value_fails_its_row_alone_named_by_its_row_number(tmp_path: Path) -> None:
    source = write_parquet(
        tmp_path / "list.parquet",
        {"url": ["http://h/1", None, "http://h/3", ""], "size": [1, 2, -5, 4]},
    )
    rows = list(read_rows([source]))
    assert [r.index for r in rows] == [0, 1, 2, 3]
    assert rows[0].problem is None and rows[0].size == 1
    assert rows[1].url == "" and rows[1].problem is not None
    assert f"input {source!r}, row 2: missing or empty 'url'" in rows[1].problem
    assert rows[2].url == "http://h/3"  # the manifest still names its URL
    assert rows[2].problem is not None and "row 3: 'size' must be >= 0" in rows[2].problem
    assert rows[3].problem is not None and "row 4:" in rows[3].problem


def test_a_url_column_that_is_not_text_fails_each_row(tmp_path: Path) -> None:
    source = write_parquet(tmp_path / "ints.parquet", {"url": [1, 2]})
    rows = list(read_rows([source]))
    assert all(r.problem and "'url' must be a string, got int" in r.problem for r in rows)


def test_a_url_too_long_to_use_fails_its_row_holding_none_of_it(tmp_path: Path) -> None:
    # No line limit bounds a Parquet value: a 50 MB URL reached the engine
    # (which refuses one over 64 Ki characters) and peaked the driver at 700 MB.
    long_url = "http://h/" + "a" * 100_000
    source = write_parquet(tmp_path / "list.parquet", {"url": [long_url, "http://h/2"]})
    rows = list(read_rows([source]))
    assert rows[1].problem is None
    assert rows[0].problem is not None and rows[0].problem.startswith(
        f"input {source!r}, row 1: 'url' is 100,009 characters long (at most 65,536)"
    )
    assert len(rows[0].url) == 200


def test_binary_text_columns_and_pandas_float_sizes_are_read_as_meant(tmp_path: Path) -> None:
    # Some writers store text as binary; pandas writes an int column with gaps
    # as float64, a gap as NaN.  A float that is no whole number stays wrong.
    source = write_parquet(
        tmp_path / "list.parquet",
        {
            "url": pa.array([b"http://h/1", b"http://h/2", b"http://h/\xff", b"http://h/4"]),
            "size": pa.array([12.0, float("nan"), 3.0, 1.5]),
        },
    )
    rows = list(read_rows([source]))
    assert [(r.url, r.size, r.problem is None) for r in rows[:2]] == [
        ("http://h/1", 12, True),
        ("http://h/2", None, True),
    ]
    assert rows[2].problem is not None and "'url' is not valid UTF-8" in rows[2].problem
    assert rows[3].problem is not None and "got the number 1.5" in rows[3].problem


def test_indices_run_on_across_parquet_and_text_inputs(tmp_path: Path) -> None:
    first = write_parquet(tmp_path / "a.parquet", {"url": ["http://h/1", "http://h/2"]})
    second = tmp_path / "b.txt"
    second.write_text("http://h/3\n")
    rows = list(read_rows([first, str(second), "http://h/4"]))
    assert [(r.index, r.url) for r in rows] == [
        (0, "http://h/1"), (1, "http://h/2"), (2, "http://h/3"), (3, "http://h/4"),
    ]  # fmt: skip


def test_known_by_its_first_bytes_whatever_its_name(tmp_path: Path) -> None:
    source = write_parquet(tmp_path / "urls.txt", {"url": ["http://h/1"]})
    assert [r.url for r in read_rows([source])] == ["http://h/1"]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"link": ["http://h/1"]}, "has no 'url' column (columns found: 'link')"),
        ({"url": ["a"], "URL": ["b"]}, "column 'url' appears more than once ('url' and 'URL')"),
    ],
)
def test_a_list_without_one_url_column_stops_at_once(
    tmp_path: Path, columns: dict[str, list[object]], message: str
) -> None:
    source = write_parquet(tmp_path / "list.parquet", columns)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        next(read_rows([source]))


def test_a_file_named_parquet_that_is_not_one_stops_at_once(tmp_path: Path) -> None:
    source = tmp_path / "list.parquet"
    source.write_text("http://h/1\n")
    with pytest.raises(UsageError, match="not a readable Parquet file"):
        next(read_rows([str(source)]))


def test_a_gzipped_parquet_file_says_to_gunzip_it(tmp_path: Path) -> None:
    source = write_parquet(tmp_path / "list.parquet", {"url": ["http://h/1"]})
    packed = tmp_path / "list.parquet.gz"
    packed.write_bytes(gzip.compress(Path(source).read_bytes()))
    with pytest.raises(UsageError, match="it is gzip-compressed: gunzip it first"):
        next(read_rows([str(packed)]))


def test_a_truncated_file_stops_at_once(tmp_path: Path) -> None:
    whole = write_parquet(
        tmp_path / "whole.parquet", {"url": [f"http://h/{i}" for i in range(100)]}
    )
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(Path(whole).read_bytes()[:-20])
    with pytest.raises(UsageError, match=r"cut\.parquet"):
        list(read_rows([str(cut)]))


def test_parquet_on_stdin_from_a_file_is_read(tmp_path: Path) -> None:
    # `swarmget - < list.parquet`: stdin is the file itself, seekable.
    source = write_parquet(tmp_path / "list.parquet", {"url": ["http://h/1", "http://h/2"]})
    with open(source, "rb") as stdin:
        assert [r.url for r in read_rows(["-"], stdin=stdin)] == ["http://h/1", "http://h/2"]
        assert not stdin.closed  # stdin is not ours to close
    assert [r.url for r in read_rows(["-"], stdin=io.BytesIO(Path(source).read_bytes()))] == [
        "http://h/1",
        "http://h/2",
    ]


def test_parquet_from_a_pipe_on_stdin_says_to_give_its_path(tmp_path: Path) -> None:
    source = write_parquet(tmp_path / "list.parquet", {"url": ["http://h/1"]})
    proc = subprocess.run(
        f"cat {shlex.quote(source)} | {shlex.quote(sys.executable)} -m swarmget - "
        f"-o {shlex.quote(str(tmp_path / 'out'))}",
        shell=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "it is a Parquet file: give its path" in proc.stderr


def test_read_a_batch_at_a_time_not_the_whole_file(tmp_path: Path) -> None:
    # More rows than one batch, in several row groups: the first row comes
    # out before the last batch is read (the generator is lazy), and all come.
    count = 3 * BATCH_ROWS + 5
    source = write_parquet(
        tmp_path / "big.parquet",
        {"url": [f"http://h/{i}" for i in range(count)]},
        row_group_size=BATCH_ROWS,
    )
    rows = read_rows([source])
    assert next(rows).url == "http://h/0"
    assert sum(1 for _ in rows) == count - 1


def test_without_pyarrow_the_run_stops_saying_how_to_get_it(tmp_path: Path) -> None:
    source = write_parquet(tmp_path / "list.parquet", {"url": ["http://h/1"]})
    code = (
        "import sys; sys.modules['pyarrow'] = None; sys.modules['pyarrow.parquet'] = None\n"
        "from swarmget.sources import read_rows\n"
        f"list(read_rows([{source!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "pip install 'swarmget[datasets]'" in proc.stderr


def test_a_parquet_list_downloads_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with TestServer() as server:
        source = write_parquet(
            tmp_path / "list.parquet",
            {
                "URL": [server.file_url(f"f{i}.bin", size=1000 + i) for i in range(20)],
                "caption": [f"file {i}" for i in range(20)],
            },
        )
        report = swarmget.download([], out, sources=[source], retries=0)
    assert report.ok == 20 and report.failed == 0
    for i in range(20):
        assert (out / f"f{i}.bin").read_bytes() == expected_body(f"f{i}.bin", 1000 + i)


def test_the_command_line_reads_a_parquet_list(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with TestServer() as server:
        source = write_parquet(
            tmp_path / "list.parquet",
            {"url": [server.file_url("a.bin", size=10), "not a url"], "path": ["x/a.bin", None]},
        )
        proc = subprocess.run(
            [sys.executable, "-m", "swarmget", source, "-o", str(out), "--json", "--retries", "0"],
            capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"}, timeout=60,
        )  # fmt: skip
    assert (out / "x" / "a.bin").read_bytes() == expected_body("a.bin", 10)
    summary = json.loads(proc.stdout)
    assert summary["ok"] == 1 and summary["failed"] == 1, proc.stderr


def test_a_schema_pyarrow_cannot_read_stops_with_a_usage_error(tmp_path: Path) -> None:
    # The Arrow schema stored in the footer says the size column is a 128-bit
    # integer: pyarrow raises ArrowNotImplementedError, a RuntimeError (not
    # the ValueError of ArrowInvalid), which came out as a traceback.
    whole = write_parquet(tmp_path / "whole.parquet", {"url": ["http://h/1"], "size": [1]})
    data = Path(whole).read_bytes()
    stored = pq.ParquetFile(whole).metadata.metadata[b"ARROW:schema"]
    schema = base64.b64decode(stored)
    width = schema.index((64).to_bytes(4, "little"))  # the Int's bitWidth
    wider = base64.b64encode(schema[:width] + (128).to_bytes(4, "little") + schema[width + 4 :])
    assert len(wider) == len(stored) and data.count(stored) == 1
    odd = tmp_path / "odd.parquet"
    odd.write_bytes(data.replace(stored, wider))
    with pytest.raises(UsageError, match=r"cannot read input '.*odd\.parquet'.*64 bits"):
        list(read_rows([str(odd)]))


@pytest.mark.slow
def test_memory_stays_flat_over_many_row_groups(tmp_path: Path) -> None:
    # A LAION-like list (a caption column never read), 20 row groups: one
    # iter_batches over the whole file kept what it had read, RSS growing
    # row group after row group (by ~17 MiB from 40% to the end here, ~130 MiB
    # over 3 million rows); read a group at a time it stays level.
    source = tmp_path / "laion.parquet"
    schema = pa.schema([("URL", pa.string()), ("TEXT", pa.string()), ("size", pa.int64())])
    group = 50_000
    with pq.ParquetWriter(source, schema) as writer:
        for start in range(0, 20 * group, group):
            numbers = range(start, start + group)
            writer.write_table(
                pa.table(
                    {
                        "URL": [f"http://example.com/images/{i:09d}.jpg" for i in numbers],
                        "TEXT": [f"caption number {i} " * 5 for i in numbers],
                        "size": list(numbers),
                    },
                    schema=schema,
                )
            )
    code = (
        "from swarmget.sources import read_rows\n"
        "def rss(): return int(open('/proc/self/statm').read().split()[1]) * 4096\n"
        "seen = {}\n"
        f"for i, row in enumerate(read_rows([{str(source)!r}])):\n"
        f"    if i in ({8 * group}, {20 * group - 1}): seen[i] = rss()\n"
        "print(list(seen.values()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    middle, end = json.loads(proc.stdout)
    assert end - middle < 6 * 2**20, (middle >> 20, end >> 20)


def test_a_damaged_column_chunk_is_named_on_one_line(tmp_path: Path) -> None:
    # The damaged second row group stops the run with pyarrow's message, which
    # spans lines ("...Invalid data\nDeserializing page header failed.\n"):
    # told on one line, as every usage error is.
    source = write_parquet(
        tmp_path / "list.parquet", {"url": [f"http://h/{i}" for i in range(30)]}, row_group_size=10
    )
    chunk = pq.ParquetFile(source).metadata.row_group(1).column(0)
    data = bytearray(Path(source).read_bytes())
    start, length = chunk.data_page_offset, chunk.total_compressed_size
    data[start : start + length] = bytes(length)
    Path(source).write_bytes(bytes(data))
    rows: list[str] = []
    with pytest.raises(UsageError) as caught:
        rows.extend(row.url for row in read_rows([source]))
    message = str(caught.value)
    assert message.startswith(f"cannot read input {source!r}: ") and "\n" not in message
    # Read a row group at a time, the first group's rows came before it.
    assert rows == [f"http://h/{i}" for i in range(10)]
