"""The manifest: ``<out>/.swarmget/manifest.jsonl``, one JSON record per input row.

It is the user-facing record of a run, written from the journal
(``sinks/journal.py``) when a run ends, however it ends: normally, on Ctrl-C,
or stopped by a full disk.  (A run whose journal started empty writes it as
its rows finish instead, ``sinks/manifest_lines.py``: the same lines, without
a pass over every row at the end.)  It is written to a temporary file and
renamed over the old one, so it is never torn: a reader sees the previous
manifest or the new one.  Records come in the order rows were first seen; a
row that an earlier run finished and this run skipped keeps its record, with
this run's ``index``; rows that only earlier runs had come last, with
``"index": null``.

Three kinds of record:

* ``"status": "ok"`` -- the file is complete at ``path`` with ``bytes`` bytes;
* ``"status": "failed"`` -- with an ``error`` code and a ``message``; a rerun
  tries again;
* ``"status": "partial"`` -- a large transfer stopped part way; its part is
  kept (with the server's ``validator``), and a rerun continues it with
  ``Range`` + ``If-Range``.

Read it back with :func:`read_manifest` (dicts), :func:`manifest_table`
(a pyarrow Table, with ``swarmget[datasets]``) or :func:`manifest_frame`
(a pandas DataFrame).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

from swarmget.errors import UsageError
from swarmget.sinks.files import STATE_DIR, OutputError

MANIFEST_NAME = "manifest.jsonl"
# Columns of the table forms, in order (digest columns appear when present).
COLUMNS = (
    "index", "url", "path", "status", "http_status", "bytes", "error", "attempts",
    "elapsed_ms", "message", "final_url",
)  # fmt: skip


def manifest_path(out_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(out_dir), STATE_DIR, MANIFEST_NAME)


def write_manifest(path: str, lines: Iterable[str]) -> int:
    """Write ``lines`` (JSON records) to ``path`` atomically; the count written."""
    tmp = f"{path}.tmp"
    count = 0
    try:
        with open(tmp, "w", encoding="utf-8", errors="backslashreplace") as out:
            chunk: list[str] = []
            for line in lines:
                chunk.append(line)
                count += 1
                if len(chunk) >= 4096:
                    out.write("\n".join(chunk) + "\n")
                    chunk.clear()
            if chunk:
                out.write("\n".join(chunk) + "\n")
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # interrupted too: never a temporary file left behind
        if isinstance(exc, OSError):
            message = f"cannot write the manifest {path}: {exc.strerror}"
            raise OutputError(message, True) from None
        raise
    return count


def read_manifest(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of the manifest in ``out_dir`` (see the module docstring)."""
    return list(iter_manifest(out_dir))


def iter_manifest(out_dir: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """:func:`read_manifest`, lazily.  ``out_dir`` may also be the manifest file
    itself (``out/.swarmget/manifest.jsonl``)."""
    given = os.fspath(out_dir)
    path = given if os.path.isfile(given) else manifest_path(out_dir)
    try:
        # Bytes: json.loads reads UTF-8 itself, and a bad byte is then an error
        # of the line it is in.
        handle = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(f"no manifest in {given!r} (expected {path})") from None
    with handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError as exc:  # not JSON, or not UTF-8
                    raise ValueError(f"{path}, line {number}: not a JSON record ({exc})") from None
                except RecursionError:  # nested deeper than json reads
                    message = f"{path}, line {number}: not a JSON record (nested too deeply)"
                    raise ValueError(message) from None


def manifest_table(out_dir: str | os.PathLike[str]) -> Any:
    """The manifest as a ``pyarrow.Table`` (``pip install swarmget[datasets]``)."""
    pyarrow = _optional("pyarrow", "manifest_table", "pip install 'swarmget[datasets]'")
    records = read_manifest(out_dir)
    names = list(COLUMNS) + sorted({k for r in records for k in r} - set(COLUMNS))
    return pyarrow.table({name: [record.get(name) for record in records] for name in names})


def manifest_frame(out_dir: str | os.PathLike[str]) -> Any:
    """The manifest as a ``pandas.DataFrame`` (needs pandas)."""
    pandas = _optional("pandas", "manifest_frame", "pip install pandas")
    records = read_manifest(out_dir)
    frame = pandas.DataFrame.from_records(records)
    return frame.reindex(columns=list(COLUMNS) + [c for c in frame.columns if c not in COLUMNS])


def _optional(module: str, needed_by: str, install: str) -> Any:
    """An optional dependency, or a usage error that says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(f"{needed_by} needs {module}: {install}") from None
