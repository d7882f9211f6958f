"""The run's journal: every row's plan and outcome, on disk, indexed (SQLite).

Theory of operation
-------------------
The journal is what makes a rerun resume, and what the user-facing manifest
(``manifest.jsonl``, see :mod:`swarmget.manifest`) is written from.  It lives
in ``<out>/.swarmget/journal.sqlite3``, one table with one row per input row
identity (``key``: see ``sinks/plan.py``), kept by one process only: the
driver, which plans rows before they are dealt out and records the outcomes
the engines report.  Nothing needs a lock across processes or machines.

Why SQLite and not an append-only JSONL file read back at start: a list of
ten million rows must cost neither ten million objects in memory nor a
minute of parsing before the first request.  Here memory is SQLite's page
cache (bounded), and a rerun looks up only the rows it reads, a batch at a
time (:meth:`Journal.lookup`).

Crash safety comes from the order of events, not from fsync:

1. A row's output path is recorded (``status`` PLANNED, ``mine`` 1) and
   committed *before* the row is dealt to an engine.  So any file at a
   planned path is ours, whatever moment a kill comes: a rerun may overwrite
   it, and never mistakes it for a user's file.
2. The engine writes the body to a part and renames it into place when it is
   complete and verified; only then does it report the row.
3. The outcome is recorded (batched, committed a few times a second).  A kill
   between 2 and 3 costs a download again, never a wrong file.

``synchronous=OFF`` with the WAL journal: a killed process loses nothing the
OS has (every commit is in the page cache); only a power cut could, and then
at worst a planned path is forgotten and a later run calls our file foreign
(``exists``).  A full disk makes a write fail: SQLite rolls the transaction
back, the journal stays consistent, and the driver stops the run with ``io``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import sqlite3
from collections.abc import Iterator
from typing import Final

from swarmget.errors import UsageError
from swarmget.report import FileResult
from swarmget.sinks.files import STATE_DIR, OutputError

JOURNAL_NAME: Final = "journal.sqlite3"
PLAN_LOG_NAME: Final = "plans.log"
# What a row's plan is, as the journal keeps it: (key, index, url, path, mine).
PlanEntry = tuple[bytes, int, str, str | None, bool]
LOCK_NAME: Final = "lock"
SCHEMA_VERSION: Final = 1

# status column
PLANNED: Final = 0
OK: Final = 1
FAILED: Final = 2
PARTIAL: Final = 3  # a large body began; its part may be continued (validator)
STATUS_NAMES: Final = {OK: "ok", FAILED: "failed", PARTIAL: "partial"}
_STATUS_CODES: Final = {"ok": OK, "failed": FAILED, "partial": PARTIAL}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS rows (
    key BLOB NOT NULL UNIQUE,   -- the row's identity (sinks/plan.py)
    run INTEGER NOT NULL,       -- the run that last saw it
    idx INTEGER NOT NULL,       -- its position in that run's input
    url TEXT NOT NULL,          -- with any password removed
    path TEXT,                  -- the output path claimed for it
    mine INTEGER NOT NULL,      -- 1: we may write at path; 0: someone else's file is there
    status INTEGER NOT NULL,
    http_status INTEGER,
    bytes INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    elapsed_ms INTEGER NOT NULL DEFAULT 0,
    message TEXT,
    final_url TEXT,
    digests TEXT,               -- JSON object, e.g. {"sha256": "..."}
    validator TEXT              -- ETag / Last-Modified of a kept part
);
CREATE INDEX IF NOT EXISTS rows_path ON rows (path);
-- --dedupe: the row that downloads each distinct URL, and the rows waiting for it.
CREATE TABLE IF NOT EXISTS leaders (
    url_key BLOB PRIMARY KEY, key BLOB NOT NULL, run INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS followers (
    key BLOB PRIMARY KEY, leader BLOB NOT NULL, idx INTEGER NOT NULL, url TEXT NOT NULL,
    path TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS followers_leader ON followers (leader);
"""


@dataclasses.dataclass(slots=True, frozen=True)
class Outcome:
    """A row's outcome, as --dedupe passes it on to rows with the same URL."""

    index: int
    path: str | None
    status: int
    http_status: int | None
    bytes: int
    error: str | None
    message: str | None


@dataclasses.dataclass(slots=True, frozen=True)
class Follower:
    key: bytes
    leader: bytes
    index: int
    url: str
    path: str


@dataclasses.dataclass(slots=True, frozen=True)
class Previous:
    """What the journal knows of one row identity."""

    run: int
    path: str | None
    mine: bool
    status: int
    bytes: int
    validator: str | None


class Journal:
    """The journal of one output directory (see the module docstring)."""

    def __init__(self, root: str) -> None:
        state = os.path.join(root, STATE_DIR)
        try:
            os.makedirs(state, exist_ok=True)
            self._lock = _lock(os.path.join(state, LOCK_NAME))
            self._db = sqlite3.connect(
                os.path.join(state, JOURNAL_NAME), isolation_level=None, check_same_thread=False
            )
        except OSError as exc:
            raise OutputError(f"cannot open the journal in {state}: {exc.strerror}", True) from None
        except sqlite3.Error as exc:
            raise OutputError(f"cannot open the journal in {state}: {exc}", True) from None
        self.path = os.path.join(state, JOURNAL_NAME)
        with self._guard("open"):
            db = self._db
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=OFF")
            db.execute("PRAGMA cache_size=-16384")  # 16 MiB, whatever the list's length
            db.executescript(_SCHEMA)
            self.run = self._next_run()
        self._plan_log_path = os.path.join(state, PLAN_LOG_NAME)
        self._fold_plan_log()
        with self._guard("open"):
            self.empty_at_start = db.execute("SELECT 1 FROM rows LIMIT 1").fetchone() is None
            self.has_dirs = bool(self._meta("has_dirs"))
            db.execute("BEGIN")
        self.changed = False  # any row planned or recorded in this run
        try:
            self._plan_log = _open_append(self._plan_log_path)
        except OSError as exc:
            raise OutputError(f"cannot open the plan log: {exc.strerror}", True) from None
        self._logged = 0

    # -- reading ---------------------------------------------------------------------

    def lookup(self, keys: list[bytes]) -> dict[bytes, Previous]:
        """What is known of each of ``keys`` (absent: nothing)."""
        found: dict[bytes, Previous] = {}
        for chunk in _chunks(keys, 500):
            marks = ",".join("?" * len(chunk))
            query = (
                "SELECT key, run, path, mine, status, bytes, validator FROM rows "
                f"WHERE key IN ({marks})"
            )
            with self._guard("read"):
                for key, run, path, mine, status, size, validator in self._db.execute(query, chunk):
                    found[key] = Previous(run, path, bool(mine), status, size, validator)
        return found

    def taken(self, paths: list[str]) -> set[str]:
        """Which of ``paths`` some row has claimed (in this run or an earlier one)."""
        taken: set[str] = set()
        for chunk in _chunks(paths, 500):
            marks = ",".join("?" * len(chunk))
            with self._guard("read"):
                rows = self._db.execute(f"SELECT path FROM rows WHERE path IN ({marks})", chunk)
                taken.update(path for (path,) in rows)
        return taken

    def is_directory(self, path: str) -> bool:
        """Does a claimed path lie under ``path`` (so ``path`` must stay a directory)?"""
        if not self.has_dirs:
            return False
        with self._guard("read"):
            row = self._db.execute(
                "SELECT 1 FROM rows WHERE path > ? AND path < ? LIMIT 1", (path + "/", path + "0")
            ).fetchone()
        return row is not None

    def outcome(self, key: bytes) -> Outcome | None:
        with self._guard("read"):
            row = self._db.execute(
                "SELECT idx, path, status, http_status, bytes, error, message FROM rows "
                "WHERE key=?",
                (key,),
            ).fetchone()
        return Outcome(*row) if row is not None else None

    # -- --dedupe ----------------------------------------------------------------------

    def leader(self, url_key: bytes) -> tuple[bytes, int] | None:
        """The row (key, run) that downloads this URL, if one was chosen."""
        with self._guard("read"):
            row = self._db.execute(
                "SELECT key, run FROM leaders WHERE url_key=?", (url_key,)
            ).fetchone()
        return (row[0], row[1]) if row is not None else None

    def set_leader(self, url_key: bytes, key: bytes) -> None:
        with self._guard("write"):
            self._db.execute(
                "INSERT INTO leaders VALUES (?, ?, ?) ON CONFLICT (url_key) DO UPDATE "
                "SET key=excluded.key, run=excluded.run",
                (url_key, key, self.run),
            )

    def add_follower(self, follower: Follower) -> None:
        with self._guard("write"):
            self._db.execute(
                "INSERT OR REPLACE INTO followers VALUES (?, ?, ?, ?, ?)",
                (follower.key, follower.leader, follower.index, follower.url, follower.path),
            )

    def followers(self, leaders: list[bytes]) -> list[Follower]:
        """The rows waiting for any of ``leaders``; they are forgotten as they are read."""
        found: list[Follower] = []
        for chunk in _chunks(leaders, 500):
            marks = ",".join("?" * len(chunk))
            with self._guard("read"):
                rows = self._db.execute(
                    f"SELECT key, leader, idx, url, path FROM followers WHERE leader IN ({marks})",
                    chunk,
                ).fetchall()
            found.extend(Follower(*row) for row in rows)
        if found:
            with self._guard("write"):
                self._db.executemany("DELETE FROM followers WHERE key=?", [(f.key,) for f in found])
        return found

    def __len__(self) -> int:
        with self._guard("read"):
            (count,) = self._db.execute("SELECT count(*) FROM rows").fetchone()
        return int(count)

    # -- writing ---------------------------------------------------------------------

    def log_plans(self, plans: list[PlanEntry]) -> None:
        """Claim ``plans`` before their rows go out: one append to the plan log.

        Cheap on purpose (one ``write`` per batch, no index touched): the rows
        table learns of a row when its outcome is recorded.  Should the run be
        killed before that, the next run folds the log into the table
        (:meth:`_fold_plan_log`), so every planned path is known to be ours.
        """
        if not plans:
            return
        self.changed = True
        line = json.dumps([[k.hex(), i, u, p, m] for k, i, u, p, m in plans], ensure_ascii=False)
        try:
            os.write(self._plan_log, (line + "\n").encode("utf-8", "surrogatepass"))
        except OSError as exc:
            raise OutputError(f"cannot write the plan log: {exc.strerror}", True) from None
        self._logged += len(plans)

    def checkpoint(self, in_flight: list[PlanEntry]) -> None:
        """Commit, and start the plan log afresh with only the rows still in flight.

        Called now and then, so that a crash never leaves more than a short log
        to fold (the rest is in the rows table by then).
        """
        self.commit()
        tmp = self._plan_log_path + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8", errors="surrogatepass") as out:
                if in_flight:
                    entries = [[k.hex(), i, u, p, m] for k, i, u, p, m in in_flight]
                    out.write(json.dumps(entries, ensure_ascii=False) + "\n")
            os.replace(tmp, self._plan_log_path)
            os.close(self._plan_log)
            self._plan_log = _open_append(self._plan_log_path)
        except OSError as exc:
            raise OutputError(f"cannot rewrite the plan log: {exc.strerror}", True) from None
        self._logged = len(in_flight)

    @property
    def logged(self) -> int:
        """Rows in the plan log (see :meth:`checkpoint`)."""
        return self._logged

    def park(self, plans: list[PlanEntry]) -> None:
        """Rows planned but not finished (the run stopped): keep their claims."""
        if not plans:
            return
        self.changed = True
        with self._guard("write"):
            self._db.executemany(
                "INSERT INTO rows (key, run, idx, url, path, mine, status) "
                f"VALUES (?, {self.run}, ?, ?, ?, ?, {PLANNED}) "
                "ON CONFLICT (key) DO UPDATE SET run=excluded.run, idx=excluded.idx, "
                "url=excluded.url, path=excluded.path, mine=excluded.mine, "
                f"status=CASE WHEN status={OK} THEN {PLANNED} ELSE status END",
                plans,
            )

    def note_directories(self) -> None:
        """An explicit path with directories was claimed: start checking for them."""
        if not self.has_dirs:
            self.has_dirs = True
            self._set_meta("has_dirs", 1)

    def touch(self, rows: list[tuple[bytes, int]]) -> None:
        """``(key, index)`` of rows this run skips as done: still this run's rows."""
        if not rows:
            return
        self.changed = True
        with self._guard("write"):
            self._db.executemany(
                f"UPDATE rows SET run={self.run}, idx=? WHERE key=?",
                ((index, key) for key, index in rows),
            )

    def record(self, entries: list[tuple[FileResult, str | None, bool]]) -> None:
        """Outcomes, as the engines reported them (or as the planner decided), each
        with the path claimed for its row (None: none) and whether it is ours."""
        if not entries:
            return
        self.changed = True
        with self._guard("write"):
            self._db.executemany(
                "INSERT INTO rows (key, run, idx, url, path, mine, status, http_status, bytes, "
                "error, attempts, elapsed_ms, message, final_url, digests) "
                f"VALUES (?, {self.run}, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET run=excluded.run, idx=excluded.idx, "
                "url=excluded.url, path=coalesce(excluded.path, path), "
                "mine=CASE WHEN excluded.path IS NULL THEN mine ELSE excluded.mine END, "
                "status=excluded.status, http_status=excluded.http_status, "
                "bytes=excluded.bytes, error=excluded.error, attempts=excluded.attempts, "
                "elapsed_ms=excluded.elapsed_ms, message=excluded.message, "
                "final_url=excluded.final_url, digests=excluded.digests, "
                f"validator=CASE WHEN excluded.status={OK} THEN NULL ELSE validator END",
                [_record_values(result, path, mine) for result, path, mine in entries],
            )

    def partial(self, plan: PlanEntry, validator: str) -> None:
        """A large body of the row began: its part may be continued with ``validator``."""
        self.changed = True
        key, index, url, path, mine = plan
        with self._guard("write"):
            self._db.execute(
                "INSERT INTO rows (key, run, idx, url, path, mine, status, validator) "
                f"VALUES (?, {self.run}, ?, ?, ?, ?, {PARTIAL}, ?) "
                "ON CONFLICT (key) DO UPDATE SET run=excluded.run, idx=excluded.idx, "
                "path=excluded.path, mine=excluded.mine, "
                f"status=CASE WHEN status={OK} THEN status ELSE {PARTIAL} END, "
                "validator=excluded.validator",
                (key, index, url, path, mine, validator),
            )

    def commit(self) -> None:
        with self._guard("write"):
            self._db.execute("COMMIT")
            self._db.execute("BEGIN")

    # -- the manifest ------------------------------------------------------------------

    def records(self) -> Iterator[dict[str, object]]:
        """Every finished row's record, in the order rows were first seen."""
        with self._guard("read"):
            cursor = self._db.execute(
                "SELECT idx, url, path, status, http_status, bytes, error, attempts, "
                "elapsed_ms, message, final_url, digests, validator FROM rows "
                f"WHERE status != {PLANNED} ORDER BY run DESC, idx"
            )
            for row in cursor:
                yield _record_json(row)

    def close(self) -> None:
        """Commit and let go; the plan log is emptied (its rows are in the table now)."""
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("COMMIT")
        self._db.close()
        with contextlib.suppress(OSError):
            os.ftruncate(self._plan_log, 0)
        os.close(self._plan_log)
        os.close(self._lock)

    # -- internals ---------------------------------------------------------------------

    def _fold_plan_log(self) -> None:
        """An earlier run was killed: its claims that never reached the table go in now."""
        try:
            with open(self._plan_log_path, encoding="utf-8", errors="surrogatepass") as log:
                for line in log:
                    try:
                        entries = json.loads(line)
                    except ValueError:
                        continue  # torn by the kill: that batch was never dealt out
                    plans = [(bytes.fromhex(k), i, u, p, bool(m)) for k, i, u, p, m in entries]
                    with self._guard("recover"):
                        self._db.executemany(
                            "INSERT INTO rows (key, run, idx, url, path, mine, status) "
                            f"VALUES (?, {self.run - 1}, ?, ?, ?, ?, {PLANNED}) "
                            "ON CONFLICT (key) DO NOTHING",
                            plans,
                        )
        except FileNotFoundError:
            return
        except OSError as exc:
            raise OutputError(f"cannot read the plan log: {exc.strerror}", True) from None

    def _next_run(self) -> int:
        run = self._meta("runs") + 1
        self._set_meta("runs", run)
        self._set_meta("schema", SCHEMA_VERSION)
        return run

    def _meta(self, name: str) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE name=?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def _set_meta(self, name: str, value: int) -> None:
        self._db.execute(
            "INSERT INTO meta VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value=excluded.value",
            (name, value),
        )

    @contextlib.contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        """SQLite errors become the run-stopping ``io`` error (a full disk, mostly)."""
        try:
            yield
        except sqlite3.Error as exc:
            raise OutputError(f"cannot {action} the journal {self.path}: {exc}", True) from None


def _record_values(result: FileResult, path: str | None, mine: bool) -> tuple[object, ...]:
    digests = json.dumps(result.digests) if result.digests else None
    message = storable(result.message) if result.message is not None else None
    final_url = storable(result.final_url) if result.final_url is not None else None
    return (
        result.key, result.index, storable(result.url), path, mine,
        _STATUS_CODES[result.status], result.http_status, result.bytes, result.error,
        result.attempts, result.elapsed_ms, message, final_url, digests,
    )  # fmt: skip


def _record_json(row: tuple[object, ...]) -> dict[str, object]:
    index, url, path, status, http_status, size, error, attempts = row[:8]
    elapsed_ms, message, final_url, digests, validator = row[8:]
    name = STATUS_NAMES[int(status)]  # type: ignore[call-overload]
    record: dict[str, object] = {
        "index": index,
        "url": url,
        "path": path if name != "failed" else None,
        "status": name,
        "http_status": http_status,
        "bytes": size,
        "error": error,
        "attempts": attempts,
        "elapsed_ms": elapsed_ms,
    }
    if name == "partial":
        record = {"index": index, "url": url, "path": path, "status": name}
    if message is not None:
        record["message"] = message
    if final_url is not None:
        record["final_url"] = final_url
    if digests:
        record.update(json.loads(str(digests)))
    if validator is not None and name != "ok":
        record["validator"] = validator
    return record


def _chunks(items: list[bytes] | list[str], size: int) -> Iterator[list[object]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def storable(text: str) -> str:
    """``text`` as it can be stored and written (lone surrogates from undecodable
    input bytes become ``\\udcXX`` escapes; SQLite and UTF-8 files refuse them)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _open_append(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)


def _lock(path: str) -> int:
    """Hold an exclusive lock on the output dir for this run, or fail clearly."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(
            f"another swarmget run is using {os.path.dirname(os.path.dirname(path))} "
            "(wait for it, or use another output directory)"
        ) from None
    return fd
