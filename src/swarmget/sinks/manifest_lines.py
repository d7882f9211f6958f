"""A fresh run's manifest, written while the run goes: input order, bounded memory.

Why
---
The manifest lists this run's rows in input order.  Exporting it from the
journal once the last file is in (``Journal.records``) is a pass over every
row after the downloads are over: on W1 (10,000 small files) about 25 ms of a
0.5 s run, and in a single process nothing else runs meanwhile.  In a run
whose journal started empty, though, every line of the manifest is one of
this run's outcomes, recorded once, with the same text the export would
give it.  So a line can be written as soon as every row before it has one,
while the engines are still downloading, and the end of the run only renames
the file into place.

Rows that finish out of order are held until the rows before them are in,
up to :data:`MAX_HELD`.  Anything out of the ordinary gives up (a row recorded
twice, a part kept with a validator, too many rows held, an error writing)
and the journal's export writes the manifest at the end, as it always did;
the file written so far is removed.  Rows never recorded (the run stopped)
are left out, as the export leaves them out.
"""

from __future__ import annotations

import contextlib
import os
from typing import Final, TextIO

# Lines held for rows that finished ahead of an earlier row (~200 bytes each).
MAX_HELD: Final = 65536
_CHUNK: Final = 4096  # lines joined into one write


class ManifestLines:
    """The lines of ``path`` (a manifest), written in index order as rows finish."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._tmp = _lines_path(path)
        self._file: TextIO | None = None
        self._next = 0  # the index of the next line to write
        self._held: dict[int, str] = {}  # lines of rows after a gap
        self._ready: list[str] = []  # lines in order, not written yet
        self.active = True
        try:
            # Like write_manifest: undecodable input bytes are already escaped.
            self._file = open(self._tmp, "w", encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
        except OSError:
            self.active = False

    def add(self, index: int, record: str) -> None:
        """Row ``index`` finished with ``record`` (its JSON object without "index")."""
        if not self.active:
            return
        if index < self._next or index in self._held:
            self.give_up()  # recorded twice: only the journal knows which record stands
            return
        # The line Journal.records' SQL puts together: "index" first, then the record.
        line = f'{{"index":{index},{record[1:]}'
        if index != self._next:
            if len(self._held) >= MAX_HELD:
                self.give_up()
                return
            self._held[index] = line
            return
        ready = self._ready
        ready.append(line)
        following = index + 1
        held = self._held
        if held:
            while following in held:
                ready.append(held.pop(following))
                following += 1
        self._next = following
        if len(ready) >= _CHUNK:
            self._write()

    def finish(self) -> bool:
        """Write what is held (rows after gaps: the gaps never finished) and move the
        file into place.  False: given up, the caller exports the manifest."""
        if not self.active:
            return False
        self._ready.extend(self._held[index] for index in sorted(self._held))
        self._held.clear()
        self._write()
        file = self._file
        if file is None:  # given up while writing
            return False
        try:
            file.close()
            os.replace(self._tmp, self.path)
        except OSError:
            self.give_up()
            return False
        self._file = None
        self.active = False
        return True

    def give_up(self) -> None:
        """Stop here and remove the file written so far (the export will write it)."""
        self.active = False
        self._held.clear()
        self._ready.clear()
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)

    def _write(self) -> None:
        ready = self._ready
        if not ready or self._file is None:
            return
        try:
            self._file.write("\n".join(ready) + "\n")
        except OSError:
            self.give_up()
            return
        ready.clear()


def remove_stale(path: str) -> None:
    """A run that was killed may have left its lines behind: they are not wanted."""
    for stale in (_lines_path(path), f"{path}.tmp"):  # the lines, an export's file
        with contextlib.suppress(OSError):
            os.unlink(stale)


def _lines_path(path: str) -> str:
    """Where the lines of the manifest at ``path`` go until the run ends."""
    return f"{path}.new"
