"""The manifest journal: ``<out>/.swarmget/manifest.jsonl``.

Theory of operation
-------------------
The manifest is both the report of a run and the memory that makes a rerun
resume.  It is an append-only journal of JSON lines; the last line for a URL
wins.  After a run that ends normally it is compacted to one line per URL.

Three kinds of line:

* ``"status": "ok"`` — the file is complete at ``path`` with ``bytes`` bytes.
  It is written (one ``write`` syscall, no user-space buffering) *before* the
  ``.part`` is renamed into place.  So a kill at any moment leaves either an ok
  line whose file may be missing (the rerun notices and downloads it again) or
  no line and only a ``.part``; never a final file the journal does not know,
  which a rerun would otherwise have to refuse as "not made by swarmget".
* ``"status": "failed"`` — with an error code; the rerun tries again.
* ``"status": "partial"`` — a large transfer has begun at ``path``; the line
  carries the server's validator (ETag or Last-Modified) so a later run can
  continue the ``.part`` with ``Range`` + ``If-Range``.

A torn last line (a kill in the middle of a write) is ignored when loading.
"""

from __future__ import annotations

import dataclasses
import json
import os

from swarmget.report import FileResult
from swarmget.sinks.files import OutputError

_quote = json.encoder.encode_basestring  # C-accelerated, keeps non-ASCII as UTF-8
_OK_LINE = (
    '{"url":%s,"path":%s,"status":"ok","http_status":%d,"bytes":%d,'
    '"error":null,"attempts":%d,"elapsed_ms":%d}\n'
)
MANIFEST_DIR = ".swarmget"
MANIFEST_NAME = "manifest.jsonl"


def manifest_path(out_dir: str) -> str:
    return os.path.join(out_dir, MANIFEST_DIR, MANIFEST_NAME)


@dataclasses.dataclass(slots=True, frozen=True)
class Previous:
    """What an earlier run recorded for one URL."""

    status: str  # "ok" | "failed" | "partial"
    path: str | None
    bytes: int = 0
    validator: str | None = None  # for "partial": the ETag or Last-Modified value


def load_journal(out_dir: str) -> dict[str, Previous]:
    """The latest record per URL from an existing manifest (empty if none)."""
    state: dict[str, Previous] = {}
    try:
        handle = open(manifest_path(out_dir), encoding="utf-8", errors="replace")  # noqa: SIM115
    except FileNotFoundError:
        return state
    with handle:
        for line in handle:
            try:
                record = json.loads(line)
                url = record["url"]
                status = record["status"]
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line after a kill
            if status == "failed":
                # A failure does not erase what we know about the file on disk.
                old = state.get(url)
                if old is None or old.status != "partial":
                    state[url] = Previous("failed", None)
                continue
            path = record.get("path")
            if not isinstance(path, str):
                continue
            state[url] = Previous(
                status, path, int(record.get("bytes") or 0), record.get("validator")
            )
    return state


class ManifestWriter:
    """Appends records with one unbuffered ``write`` each (see the module docstring)."""

    def __init__(self, out_dir: str) -> None:
        self.path = manifest_path(out_dir)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            raise OutputError(
                f"cannot write the manifest {self.path}: {exc.strerror}", True
            ) from None
        self._dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

    def write(self, result: FileResult) -> None:
        self._append(result.to_json())

    def encode(self, result: FileResult) -> str:
        """One journal line (with its newline) for ``result``."""
        if result.ok and result.digests is None and result.final_url is None:
            # The common case, formatted directly: a third of the cost of json.dumps.
            return _OK_LINE % (
                _quote(result.url), _quote(result.path or ""), result.http_status or 0,
                result.bytes, result.attempts, result.elapsed_ms,
            )  # fmt: skip
        return self._dumps(result.to_json()) + "\n"

    def write_lines(self, lines: list[str]) -> None:
        """Append many lines with one ``write`` (the engine batches a loop turn's files)."""
        data = "".join(lines).encode("utf-8")
        view = memoryview(data)
        while view:
            # Not ``view[os.write(...) :]``: mypyc evaluates a slice bound twice.
            written = os.write(self._fd, view)
            view = view[written:]

    def write_partial(self, url: str, path: str, validator: str) -> None:
        self._append({"url": url, "path": path, "status": "partial", "validator": validator})

    def _append(self, record: dict[str, object]) -> None:
        os.write(self._fd, (self._dumps(record) + "\n").encode("utf-8"))

    def flush(self) -> None:
        """Nothing is buffered in user space; kept for symmetry with file objects."""

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def compact(self) -> None:
        """Rewrite the journal with one line per URL, atomically.

        The last line per URL is kept, plus the last "partial" line of a URL
        whose file never completed after it (a later "failed" line must not
        make us forget how to resume the ``.part``).
        """
        self.close()
        last: dict[str, int] = {}
        partial: dict[str, int] = {}
        with open(self.path, "rb") as src:
            for number, line in enumerate(src):
                try:
                    record = json.loads(line)
                    url, status = record["url"], record["status"]
                except (ValueError, KeyError, TypeError):
                    continue
                last[url] = number
                if status == "partial":
                    partial[url] = number
                elif status == "ok":
                    partial.pop(url, None)
        keep = set(last.values()) | set(partial.values())
        del last, partial
        tmp = self.path + ".tmp"
        with open(self.path, "rb") as src, open(tmp, "wb") as dst:
            for number, line in enumerate(src):
                if number in keep:
                    dst.write(line if line.endswith(b"\n") else line + b"\n")
        os.replace(tmp, self.path)
