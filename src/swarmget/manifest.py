"""The manifest journal: ``<out>/.swarmget/manifest.jsonl``, one JSON object per row.

Records are appended as rows finish and flushed at least once a second and at
the end of the run, so after a crash at most the last second is missing (and
those rows are simply redone).
"""

from __future__ import annotations

import json
import os
from typing import IO

from swarmget.report import FileResult

MANIFEST_DIR = ".swarmget"
MANIFEST_NAME = "manifest.jsonl"


def manifest_path(out_dir: str) -> str:
    return os.path.join(out_dir, MANIFEST_DIR, MANIFEST_NAME)


class ManifestWriter:
    def __init__(self, out_dir: str) -> None:
        self.path = manifest_path(out_dir)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._file: IO[str] = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        self._dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

    def write(self, result: FileResult) -> None:
        self._file.write(self._dumps(result.to_json()))
        self._file.write("\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            self._file.close()
