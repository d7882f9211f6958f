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
   between 2 and 3 costs a download again, never a wrong file.  A failed row
   published nothing, so its record has ``mine`` 0 (unless an --overwrite redo
   left our earlier file there): a file found at its path later is someone
   else's, not removed.  Claimed again and killed, the plan log's claim
   (folded in) makes the path ours again.

``synchronous=OFF`` with the WAL journal: a killed process loses nothing the
OS has (every commit is in the page cache); only a power cut could, and then
at worst a planned path is forgotten and a later run calls our file foreign
(``exists``).  A full disk makes a write fail: SQLite rolls the transaction
back, the journal stays consistent, and the driver stops the run with ``io``.
The rows of that transaction are not lost with it: the journal keeps its
writes until they commit, and writes them again in a new transaction on the
room a :class:`~swarmget.sinks.reserve.Reserve` kept aside (and the parts of
the stopped downloads gave back).  Without that, a disk that filled up cost
the rerun every row done since the last commit: a short run's all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import resource
import sqlite3
import stat
from collections.abc import Iterable, Iterator
from typing import Any, Final

from swarmget.errors import UsageError
from swarmget.report import FileResult
from swarmget.sinks.files import FILE_MODE, OutputError, state_dir
from swarmget.sinks.reserve import Reserve

JOURNAL_NAME: Final = "journal.sqlite3"
PLAN_LOG_NAME: Final = "plans.log"
# What a row's plan is, as the journal keeps it: (key, index, url, path, mine).
PlanEntry = tuple[int, int, str, str | None, bool]
# A row's outcome as the journal writes it: (key, index, path, mine, status, bytes, record).
Recorded = tuple[int, int, str | None, int, int, int, str]  # mine: 1 or 0
LOCK_NAME: Final = "lock"
SCHEMA_VERSION: Final = 3  # 3: rows.total
PAGE_SIZE: Final = 16384  # bytes, for a journal made now (see _open)

# status column
PLANNED: Final = 0
OK: Final = 1
FAILED: Final = 2
PARTIAL: Final = 3  # a large body began; its part may be continued (validator)
STATUS_NAMES: Final = {OK: "ok", FAILED: "failed", PARTIAL: "partial"}
_STATUS_CODES: Final = {"ok": OK, "failed": FAILED, "partial": PARTIAL}

# Why rows are stored in the order they first came in, and found by ``key``
# through an index, rather than stored by ``key``: keys are hashes, so a table
# clustered on them puts each new row on a random leaf page.  Past what the
# 16 MiB page cache holds (about 50,000 rows) nearly every row then reads one
# 16 KiB page and writes it back through the WAL: an upsert cost 9 us at
# 500,000 rows and 25 us at 8 million (bench: batches of 4,096, one process).
# In insertion order new rows go onto the last page, and only the key index, a
# tenth of the table's size, takes random writes: 2.5 us and 11 us.  Journals
# made before keep ``key`` as the primary key; every statement here names the
# columns, so both layouts work, each way round between versions.

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS rows (
    id INTEGER PRIMARY KEY,     -- the order rows first came in (see above)
    key INTEGER NOT NULL UNIQUE,  -- the row's identity (63 bits of a hash, sinks/plan.py)
    run INTEGER NOT NULL,       -- the run that last saw it
    idx INTEGER NOT NULL,       -- its position in that run's input
    path TEXT,                  -- the output path claimed for it
    mine INTEGER NOT NULL,      -- 1: we may write at path; 0: what is there is not ours
    status INTEGER NOT NULL,
    bytes INTEGER NOT NULL DEFAULT 0,
    validator TEXT,             -- ETag / Last-Modified of a kept part
    record TEXT,                -- its manifest record: a JSON object, without "index"
    total INTEGER               -- the file's length when its kept part began (if told)
);
CREATE INDEX IF NOT EXISTS rows_path ON rows (path);
-- --dedupe: the row that downloads each distinct URL, and the rows waiting for it.
CREATE TABLE IF NOT EXISTS leaders (
    url_key INTEGER PRIMARY KEY, key INTEGER NOT NULL, run INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS followers (
    key INTEGER PRIMARY KEY, leader INTEGER NOT NULL, idx INTEGER NOT NULL,
    url TEXT NOT NULL, path TEXT NOT NULL
);
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
    digests: dict[str, str] | None = None  # what --hash recorded
    final_url: str | None = None
    run: int = 0  # the run that recorded it


@dataclasses.dataclass(slots=True, frozen=True)
class Follower:
    key: int
    leader: int
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
    total: int | None  # the file's length when the kept part began (None: not known)


def _add_total_column(db: sqlite3.Connection) -> None:
    """A journal of schema 2 gains ``rows.total`` (SQLite adds a column without
    rewriting the table; older versions of swarmget ignore it)."""
    if "total" not in [column[1] for column in db.execute("PRAGMA table_info(rows)")]:
        db.execute("ALTER TABLE rows ADD COLUMN total INTEGER")


class Journal:
    """The journal of one output directory (see the module docstring)."""

    def __init__(self, root: str) -> None:
        state = state_dir(root)
        self._state = state
        self.path = os.path.join(state, JOURNAL_NAME)
        try:
            self._lock = _lock(os.path.join(state, LOCK_NAME))
        except OSError as exc:
            raise OutputError(f"cannot open the journal in {state}: {exc.strerror}", True) from None
        try:
            self._db = self._connect(state)
        except BaseException:
            os.close(self._lock)  # the output dir is free again (a program may try again)
            raise
        # This transaction's writes, (sql, parameters, many), until it commits.
        self._uncommitted: list[tuple[str, Any, bool]] = []
        # A write or a commit met the full disk and went through on the room
        # kept for the run's last commit (see out_of_room).
        self.reserve_spent = False
        self._reserve = Reserve(state)  # after the lock: the output dir is ours
        try:
            self._open(state)
        except BaseException:
            self._db.close()  # a journal that could not open leaves nothing open
            self._reserve.free()
            os.close(self._lock)
            raise

    def _connect(self, state: str) -> sqlite3.Connection:
        try:
            # SQLite makes a new database 0o644, whatever the umask allows;
            # one made here has FILE_MODE, and SQLite gives its WAL the same.
            _make_database(self.path)
            return sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except OSError as exc:
            raise OutputError(f"cannot open the journal in {state}: {exc.strerror}", True) from None
        except sqlite3.Error as exc:
            message = f"cannot open the journal in {state}: {exc}"
            raise OutputError(
                _with_path_limit_hint(_with_full_disk_hint(message, exc, state), state), True
            ) from None

    def _open(self, state: str) -> None:
        reserved = self._reserve.size > 0
        with self._guard("open"):
            db = self._db
            # Before anything is written to it (WAL mode, our tables): a
            # database of another program, or of a swarmget that keeps rows
            # otherwise, is refused, not altered, nor failed at its first row.
            problem = _not_ours(db)
            if problem:
                raise OutputError(f"cannot open the journal {self.path}: {problem}", True)
            # A new journal gets 16 KiB pages (an existing one keeps its own): a
            # row's upsert lands on a random leaf of the key index (keys are hashes), and bigger
            # pages split less often.  Measured: 3.8 -> 3.2 us an upsert in
            # batches of 4,096, and a 10,000-row run's finish 6.5 -> 5.0 ms.
            db.execute(f"PRAGMA page_size={PAGE_SIZE}")
            db.execute("PRAGMA journal_mode=WAL")
            # The WAL is folded into the file every 4 MiB whatever the page size
            # (SQLite's default is 1,000 pages): a small disk must not fill up
            # with a WAL four times what it was.
            db.execute(f"PRAGMA wal_autocheckpoint={(4 << 20) // PAGE_SIZE}")
            db.execute("PRAGMA synchronous=OFF")
            db.execute("PRAGMA cache_size=-16384")  # 16 MiB, whatever the list's length
            # One transaction: each statement on its own would write the first
            # page to the WAL again (16 KiB each), which a nearly full disk lacks.
            db.executescript(f"BEGIN; {_SCHEMA} COMMIT;")
            _add_total_column(db)
            self.run = self._next_run()
        if reserved and not self._reserve.size:
            # Opening took the room kept for the run's last commit (a write met
            # the full disk): rows would download, and their records then fail
            # to be written.  Said before anything else is opened.
            raise OutputError(
                f"cannot open the journal in {state}: no room left for its records "
                "(no space left on the disk)",
                True,
            )
        self._plan_log_path = os.path.join(state, PLAN_LOG_NAME)
        with self._guard("open"):
            # Before the fold: a killed run's claims in an otherwise empty table
            # still mean its rows' outcomes were lost (see FilePlanner).
            self.no_outcomes_at_start = db.execute("SELECT 1 FROM rows LIMIT 1").fetchone() is None
        self._fold_plan_log()
        with self._guard("open"):
            self.empty_at_start = db.execute("SELECT 1 FROM rows LIMIT 1").fetchone() is None
            self.has_dirs = bool(self._meta("has_dirs"))
            db.execute("BEGIN")
        self.changed = False  # any row planned or recorded in this run
        try:
            # Afresh: what it held is in the table now, and a line torn by a
            # full disk or a kill must not run into this run's first line.
            self._plan_log = _open_append(self._plan_log_path, truncate=True)
        except OSError as exc:
            raise OutputError(f"cannot open the plan log: {exc.strerror}", True) from None
        self._logged = 0

    # -- reading ---------------------------------------------------------------------

    def lookup(self, keys: list[int]) -> dict[int, Previous]:
        """What is known of each of ``keys`` (absent: nothing)."""
        found: dict[int, Previous] = {}
        for chunk in _chunks(keys, 500):
            marks = ",".join("?" * len(chunk))
            query = (
                "SELECT key, run, path, mine, status, bytes, validator, total FROM rows "
                f"WHERE key IN ({marks})"
            )
            with self._guard("read"):
                for key, run, path, mine, status, size, validator, total in self._db.execute(
                    query, chunk
                ):
                    found[key] = Previous(run, path, bool(mine), status, size, validator, total)
        return found

    def holder(self, path: str) -> tuple[int, Previous, str | None] | None:
        """The row that claimed ``path`` (its key, what is known of it, and the URL
        its record names), or None."""
        query = (
            "SELECT key, run, path, mine, status, bytes, validator, total, record FROM rows "
            "WHERE path=?"
        )
        with self._guard("read"):
            found = self._db.execute(query, (path,)).fetchone()
        if found is None:
            return None
        key, run, claimed, mine, status, size, validator, total, record = found
        url = json.loads(record).get("url") if record else None
        return key, Previous(run, claimed, bool(mine), status, size, validator, total), url

    def recover(self, records: Iterable[tuple[str, str, str]]) -> int:
        """``(path, url, record)`` of the rows a manifest lists as done, kept for
        this connection only (a TEMP table): the journal is gone, the manifest
        and the files are not (see FilePlanner._recovered).  Returns how many."""
        with self._guard("write"):
            self._db.execute(
                "CREATE TEMP TABLE IF NOT EXISTS recovered "
                "(path TEXT PRIMARY KEY, url TEXT NOT NULL, record TEXT NOT NULL)"
            )
            self._db.execute("CREATE INDEX IF NOT EXISTS temp.recovered_url ON recovered (url)")
            before = self._db.total_changes
            self._db.executemany("INSERT OR REPLACE INTO recovered VALUES (?, ?, ?)", records)
            count = self._db.total_changes - before
        # Committed now, not kept to be written again: they are read once, from
        # a manifest of any length, and they are not on the output disk.
        self.commit()
        return count

    def recovered(self, path: str) -> dict[str, Any] | None:
        """The manifest record :meth:`recover` kept for ``path``, if any (only
        after it: the table is its)."""
        with self._guard("read"):
            found = self._db.execute(
                "SELECT record FROM recovered WHERE path=?", (path,)
            ).fetchone()
        return None if found is None else dict(json.loads(found[0]))

    def is_recovered(self, path: str) -> bool:
        """Does a record :meth:`recover` kept name ``path``?"""
        with self._guard("read"):
            found = self._db.execute("SELECT 1 FROM recovered WHERE path=?", (path,)).fetchone()
        return found is not None

    def recovered_paths(self, url: str) -> list[str]:
        """The paths of the records :meth:`recover` kept for ``url`` (the rows of a
        reordered list find their files by URL), in the manifest's order."""
        with self._guard("read"):
            found = self._db.execute(
                "SELECT path FROM recovered WHERE url=? ORDER BY rowid", (url,)
            ).fetchall()
        return [path for (path,) in found]

    def forget(self, key: int) -> None:
        """Drop row ``key``: another row, with its path, takes its place."""
        self.changed = True
        with self._guard("write"):
            self._write("DELETE FROM rows WHERE key=?", (key,))

    def digests(self, keys: list[int]) -> dict[int, dict[str, str]]:
        """The digests recorded for each of ``keys`` (a row done without one: an
        empty dict; a key with no record: absent)."""
        found: dict[int, dict[str, str]] = {}
        for chunk in _chunks(keys, 500):
            marks = ",".join("?" * len(chunk))
            query = f"SELECT key, record FROM rows WHERE key IN ({marks}) AND record IS NOT NULL"
            with self._guard("read"):
                for key, text in self._db.execute(query, chunk):
                    found[key] = digests_of(json.loads(text))
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

    def outcome(self, key: int) -> Outcome | None:
        with self._guard("read"):
            row = self._db.execute(
                "SELECT idx, path, status, bytes, record, run FROM rows WHERE key=?", (key,)
            ).fetchone()
        if row is None:
            return None
        index, path, status, size, text, run = row
        record = json.loads(text) if text else {}
        return Outcome(
            index, path, status, record.get("http_status"), size, record.get("error"),
            record.get("message"), digests_of(record) or None, record.get("final_url"), run,
        )  # fmt: skip

    # -- --dedupe ----------------------------------------------------------------------

    def leader(self, url_key: int) -> tuple[int, int] | None:
        """The row (key, run) that downloads this URL, if one was chosen."""
        with self._guard("read"):
            row = self._db.execute(
                "SELECT key, run FROM leaders WHERE url_key=?", (url_key,)
            ).fetchone()
        return (row[0], row[1]) if row is not None else None

    def set_leader(self, url_key: int, key: int) -> None:
        with self._guard("write"):
            self._write(
                "INSERT INTO leaders VALUES (?, ?, ?) ON CONFLICT (url_key) DO UPDATE "
                "SET key=excluded.key, run=excluded.run",
                (url_key, key, self.run),
            )

    def add_follower(self, follower: Follower) -> None:
        with self._guard("write"):
            self._write(
                "INSERT OR REPLACE INTO followers VALUES (?, ?, ?, ?, ?)",
                (follower.key, follower.leader, follower.index, follower.url, follower.path),
            )

    def followers(self, leaders: list[int]) -> list[Follower]:
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
                self._write("DELETE FROM followers WHERE key=?", [(f.key,) for f in found], True)
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
        data = (plan_log_line(plans) + "\n").encode("utf-8", "surrogatepass")
        try:
            # All of it, or the run stops: a nearly full disk writes part of a
            # line and says so only by the count (the rest raises ENOSPC next).
            # A torn line is dropped whole when the log is read; the line after
            # it starts afresh, since a fold rewrites the log.  (Counted in
            # ints: compiled, `while view:` on a memoryview wrote it twice.)
            written, size = 0, len(data)
            while written < size:
                written += os.write(self._plan_log, data[written:] if written else data)
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
                    out.write(plan_log_line(in_flight) + "\n")
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
            self._write(
                "INSERT INTO rows (key, run, idx, path, mine, status) "
                f"VALUES (?, {self.run}, ?, ?, ?, {PLANNED}) "
                "ON CONFLICT (key) DO UPDATE SET run=excluded.run, idx=excluded.idx, "
                "path=excluded.path, mine=excluded.mine, "
                f"status=CASE WHEN status={OK} THEN {PLANNED} ELSE status END",
                [(key, index, path, 1 if mine else 0) for key, index, _url, path, mine in plans],
                True,
            )

    def note_directories(self) -> None:
        """An explicit path with directories was claimed: start checking for them."""
        if not self.has_dirs:
            self.has_dirs = True
            self._set_meta("has_dirs", 1)

    def touch(self, rows: list[tuple[int, int]]) -> None:
        """``(key, index)`` of rows this run skips as done: still this run's rows."""
        if not rows:
            return
        self.changed = True
        with self._guard("write"):
            self._write(
                f"UPDATE rows SET run={self.run}, idx=? WHERE key=?",
                [(index, key) for key, index in rows],
                True,
            )

    def forget_validators(self, keys: list[int]) -> None:
        """The rows ``keys`` have no part (dropped, or never kept): the validator an
        earlier body left is void, and committed now, before their new bodies
        go to parts that it would otherwise be taken to describe."""
        if not keys:
            return
        self.changed = True
        with self._guard("write"):
            self._write(
                "UPDATE rows SET validator=NULL, total=NULL WHERE key=?",
                [(key,) for key in keys],
                True,
            )
        self.commit()

    def record(self, entries: list[tuple[FileResult, str | None, bool]]) -> list[Recorded]:
        """Outcomes, as the engines reported them (or as the planner decided), each
        with the path claimed for its row (None: none) and whether it is ours.

        Returns what was written, a tuple per row: (key, index, path, mine, status,
        bytes, record), ``record`` being its manifest record without "index"."""
        if not entries:
            return []
        self.changed = True
        # ``mine`` bound as 1 or 0, not as a bool: the sqlite3 module binds an exact
        # int directly, but looks a bool up in its adapter registry first (a
        # third of the binding's cost per row).
        rows = [
            (r.key, r.index, path, 1 if mine else 0, _STATUS_CODES[r.status], r.bytes, encode(r))
            for r, path, mine in entries
        ]
        with self._guard("write"):
            self._write(
                "INSERT INTO rows (key, run, idx, path, mine, status, bytes, record) "
                f"VALUES (?, {self.run}, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET run=excluded.run, idx=excluded.idx, "
                "path=coalesce(excluded.path, path), "
                "mine=CASE WHEN excluded.path IS NULL THEN mine ELSE excluded.mine END, "
                "status=excluded.status, bytes=excluded.bytes, record=excluded.record, "
                f"validator=CASE WHEN excluded.status={OK} THEN NULL ELSE validator END, "
                f"total=CASE WHEN excluded.status={OK} THEN NULL ELSE total END",
                rows,
                True,
            )
        return rows

    def partial(self, plan: PlanEntry, validator: str | None, total: int | None) -> None:
        """A body of the row began: its part may be continued with ``validator``
        (None: not at all; one recorded before is void) while the file has
        ``total`` bytes (None: not known)."""
        self.changed = True
        key, index, url, path, mine = plan
        # Every field of a manifest line, as for any row (readers index them);
        # no file is at its path yet: null, as for a failed row.
        record = _dumps(
            {
                "url": storable(url),
                "path": None,
                "status": "partial",
                "http_status": None,
                "bytes": 0,
                "error": None,
                "attempts": 0,
                "elapsed_ms": 0,
            }
        )
        with self._guard("write"):
            self._write(
                "INSERT INTO rows (key, run, idx, path, mine, status, validator, record, total) "
                f"VALUES (?, {self.run}, ?, ?, ?, {PARTIAL}, ?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET run=excluded.run, idx=excluded.idx, "
                "path=excluded.path, mine=excluded.mine, "
                f"status=CASE WHEN status={OK} THEN status ELSE {PARTIAL} END, "
                "validator=excluded.validator, total=excluded.total, "
                f"record=CASE WHEN status={OK} THEN record ELSE excluded.record END",
                (key, index, path, mine, validator, record, total),
            )

    def commit(self) -> None:
        with self._guard("write"):
            self._commit()
            self._db.execute("BEGIN")

    def out_of_room(self) -> OutputError | None:
        """The run must stop now: the disk filled up, and a write of this run went
        through on the room kept for its last commit.  Downloading on would
        spend the rest of that room on new files (a run's workers do not stop
        before they meet the full disk themselves), and the last commit would
        then fail: every row since the one before, whose files are on disk,
        fetched again by the rerun."""
        if not self.reserve_spent:
            return None
        return OutputError(
            f"No space left on device for the journal {self.path}: its writes went "
            "through on the room kept for the run's last commit, so the run stops",
            True,
        )

    def free_reserve(self) -> None:
        """The run's last commit is done: the reserve's room goes to the manifest."""
        self._reserve.free()

    # -- the manifest ------------------------------------------------------------------

    def records(self, run: int | None = None, earlier_failures: bool = False) -> Iterator[str]:
        """Every finished row's manifest line (without its newline): this run's rows
        in input order, then the files of rows only earlier runs had, with ``"index":
        null`` (their positions were in another input: two records must not claim
        one row; their failures are not this input's, nor any file's).
        ``run``: the run whose rows these are (default: this one).
        ``earlier_failures``: list those too (the run stopped before it read
        its whole input: they may be rows of it not reached)."""
        current = self.run if run is None else run
        earlier = "1" if earlier_failures else f"status = {OK}"
        with self._guard("read"):
            # SQLite puts most lines together itself (one string per row, no
            # Python work); only a row with a kept part needs its validator added.
            # The other columns are NULL for the common rows: no objects to make.
            kept = "validator IS NOT NULL AND status != 1"
            position = f"CASE WHEN run = {current:d} THEN idx ELSE 'null' END"
            cursor = self._db.execute(
                f"SELECT CASE WHEN NOT ({kept}) "
                f"THEN '{{\"index\":' || {position} || ',' || substr(record, 2) END, "
                f"CASE WHEN {kept} THEN {position} END, validator, "
                f"CASE WHEN {kept} THEN record END "
                f"FROM rows WHERE status != {PLANNED} AND record IS NOT NULL "
                # An earlier run's row that is not this input's: only if its file is there.
                f"AND (run = {current:d} OR {earlier}) ORDER BY run DESC, idx"
            )
            for line, index, validator, record in cursor:
                if line is None:
                    # A part is kept (partial, or failed part way): say what resumes it.
                    line = f'{{"index":{index},{record[1:-1]},"validator":{_dumps(validator)}}}'
                yield line

    def close(self) -> None:
        """Commit and let go.  The plan log is emptied only if that commit went
        through: then its rows are in the table.  If it did not (a full disk
        makes it fail, and SQLite rolls the transaction back), the log is all
        that says which planned paths are ours, and the next run folds it in:
        emptying it then would make our own files look foreign (``exists``)."""
        try:
            self._commit()
            committed = True
        except sqlite3.Error:  # a full disk, even with the reserve's room
            committed = False
        self._db.close()
        self._reserve.free()
        if committed:
            with contextlib.suppress(OSError):
                os.ftruncate(self._plan_log, 0)
        os.close(self._plan_log)
        os.close(self._lock)

    # -- internals ---------------------------------------------------------------------

    def _write(self, sql: str, parameters: Any, many: bool = False) -> None:
        """One write of the open transaction, kept until it commits (see the module
        docstring); ``many``: ``parameters`` is a list of rows (executemany)."""
        if not self._db.in_transaction:
            # A statement that commits by itself (opening the journal): once
            # more on the reserve's room, and nothing kept, nothing left open
            # (a redo's BEGIN stayed open, and the next BEGIN failed).
            try:
                self._execute(sql, parameters, many)
            except sqlite3.OperationalError as exc:
                if not _disk_full(exc):
                    raise
                self._spend_reserve()
                self._execute(sql, parameters, many)
            return
        self._uncommitted.append((sql, parameters, many))
        try:
            self._execute(sql, parameters, many)
        except sqlite3.OperationalError as exc:
            if not _disk_full(exc):
                raise
            self._redo()  # with the reserve's room; raises if even that is not enough

    def _commit(self) -> None:
        """COMMIT; if a full disk rolled the transaction back (now, or at one of
        its writes), write it again with the reserve's room and COMMIT that."""
        try:
            if self._db.in_transaction:
                self._db.execute("COMMIT")
                self._uncommitted.clear()
                return
        except sqlite3.OperationalError as exc:
            if not _disk_full(exc):
                raise
        self._redo()
        self._db.execute("COMMIT")
        self._uncommitted.clear()

    def _redo(self) -> None:
        """The open transaction's writes again, in a new transaction, on the room
        the reserve gives back (SQLite rolled them back: a full disk)."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")  # a write failed but the transaction lives on
        self._spend_reserve()
        self._db.execute("BEGIN")
        for sql, parameters, many in self._uncommitted:
            self._execute(sql, parameters, many)

    def _spend_reserve(self) -> None:
        """A write met the full disk: it goes again on the reserve's room, and the
        run is told to stop (out_of_room)."""
        self.reserve_spent = True
        self._reserve.free()

    def _execute(self, sql: str, parameters: Any, many: bool) -> None:
        if many:
            self._db.executemany(sql, parameters)
        else:
            self._db.execute(sql, parameters)

    def _fold_plan_log(self) -> None:
        """An earlier run was killed: its claims that never reached the table go in now.

        In one transaction: the connection commits each statement by itself
        otherwise, and a killed run's log may hold a hundred thousand claims --
        as many commits, each writing its pages to the WAL again.
        """
        try:
            log = open(self._plan_log_path, "rb")  # noqa: SIM115 (closed below, with the transaction)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise OutputError(f"cannot read the plan log: {exc.strerror}", True) from None
        with log, self._guard("recover"):
            db = self._db
            db.execute("BEGIN")
            try:
                for line in log:
                    plans = _logged_plans(line)
                    if plans is None:
                        continue  # torn by the kill: that batch was never dealt out
                    # A row that had failed before is the claim's now: the killed
                    # run may have published its file (a failed row's record
                    # says nothing of ours is at its path: FilePlanner._flush).
                    db.executemany(
                        "INSERT INTO rows (key, run, idx, path, mine, status) "
                        f"VALUES (?, {self.run - 1}, ?, ?, ?, {PLANNED}) "
                        "ON CONFLICT (key) DO UPDATE SET path=excluded.path, mine=excluded.mine "
                        f"WHERE status={FAILED}",
                        plans,
                    )
            except OSError as exc:  # reading the log (SQLite's errors are the guard's)
                raise OutputError(f"cannot read the plan log: {exc.strerror}", True) from None
            db.execute("COMMIT")

    def _next_run(self) -> int:
        run = self._meta("runs") + 1
        self._set_meta("runs", run)
        self._set_meta("schema", SCHEMA_VERSION)
        return run

    def _meta(self, name: str) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE name=?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def _set_meta(self, name: str, value: int) -> None:
        self._write(
            "INSERT INTO meta VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value=excluded.value",
            (name, value),
        )

    @contextlib.contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        """SQLite errors become the run-stopping ``io`` error (a full disk, mostly)."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            message = f"cannot {action} the journal {self.path}: {exc}"
            if _damaged(exc):
                message += f" ({_DAMAGED_HINT})"
            raise OutputError(_with_full_disk_hint(message, exc, self._state), True) from None
        except sqlite3.Error as exc:
            message = f"cannot {action} the journal {self.path}: {exc}"
            raise OutputError(_with_full_disk_hint(message, exc, self._state), True) from None


_INT64 = 1 << 63  # SQLite's integers

# The columns of ``rows`` every statement here may name (``total`` is added
# to a journal without it: _add_total_column).
_ROW_COLUMNS: Final = (
    "key",
    "run",
    "idx",
    "path",
    "mine",
    "status",
    "bytes",
    "validator",
    "record",
)


def _not_ours(db: sqlite3.Connection) -> str:
    """Why the database ``db`` is no journal this swarmget can keep, else ``""``
    (a new, empty database is one)."""
    tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    if not tables:
        return ""
    columns = {column[1] for column in db.execute("PRAGMA table_info(rows)")}
    if "key" not in columns:  # every swarmget journal had rows(key)
        return (
            f"it is not a swarmget journal (its tables: {', '.join(sorted(tables)[:10])}); "
            f"{_MOVE_ASIDE_HINT}"
        )
    if "meta" not in tables:
        return f"it is damaged: its table meta is missing; {_MOVE_ASIDE_HINT}"
    missing = [name for name in _ROW_COLUMNS if name not in columns]
    if not missing:
        return ""
    found = db.execute("SELECT value FROM meta WHERE name='schema'").fetchone()
    schema = f"schema {found[0]}" if found else "no schema version"
    return (
        f"its rows lack the columns {', '.join(missing)}: another version of swarmget wrote "
        f"it ({schema}; this one writes schema {SCHEMA_VERSION}); run that version, or "
        f"{_MOVE_ASIDE_HINT}"
    )


# What moving a journal aside is worth: said wherever we ask for it.
_AND_RUN_AGAIN = (
    "and run again: the files the manifest lists as done are then known as ours and kept"
)
_MOVE_ASIDE_HINT = (
    f"move it out of the .swarmget folder (with its -wal and -shm files) {_AND_RUN_AGAIN}"
)

# What a user can do about a journal SQLite cannot read (not a full disk).
_DAMAGED_HINT = (
    f"the journal is damaged: remove it (with its -wal and -shm files) {_AND_RUN_AGAIN}; "
    "without a manifest, move the .swarmget folder aside and add --overwrite"
)


def _with_full_disk_hint(message: str, exc: sqlite3.Error, state: str) -> str:
    """``message``, saying the disk of ``state`` (the .swarmget folder) is full if
    it is and SQLite did not say so (it may call that a "disk I/O error")."""
    if _disk_full(exc):
        return message
    try:
        disk = os.statvfs(state)
    except OSError:
        return message
    if disk.f_bavail * disk.f_frsize < (64 << 10):
        return f"{message} (no space left on the disk)"
    return _with_file_size_hint(message)


def _with_file_size_hint(message: str) -> str:
    """``message``, naming the limit of file size when one is set: SQLite calls
    a write past ``ulimit -f`` (EFBIG; Python ignores SIGXFSZ) a "disk I/O
    error", which sent the user looking at a disk with room to spare."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY:
        return message
    return (
        f"{message} (perhaps the limit of file size, {limit} bytes: ulimit -f; "
        "the journal grows with the list)"
    )


# SQLite's longest file name (unix VFS MAX_PATHNAME), its "-journal" included.
_SQLITE_PATH_LIMIT: Final = 512


def _with_path_limit_hint(message: str, state: str) -> str:
    """``message``, saying why when the journal's path is too long for SQLite (a
    deep output dir: "unable to open database file" said nothing of it)."""
    length = len(os.fsencode(os.path.join(state, JOURNAL_NAME + "-journal")))
    if length <= _SQLITE_PATH_LIMIT:
        return message
    return (
        f"{message} (its path is {length} bytes with '-journal', and SQLite takes at most "
        f"{_SQLITE_PATH_LIMIT}: use an output dir with a shorter absolute path)"
    )


def _disk_full(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_FULL


def _damaged(exc: sqlite3.DatabaseError) -> bool:
    text = str(exc)
    return "malformed" in text or "not a database" in text


def plan_log_line(plans: list[PlanEntry]) -> str:
    """One plan-log line: a JSON list of ``[key, index, null, path, mine]``.

    The URL keeps its place (every reader unpacks five fields) but is left
    out: folding the log needs only the key, the index, the path and ``mine``,
    and the URL was half of each line's bytes and of the time to encode it
    (one line per batch of rows, in the driver, before the batch goes out).
    """
    return (
        "["
        + ",".join(
            [
                f"[{key},{index},null,{'null' if path is None else _quote(path)},"
                f"{'true' if mine else 'false'}]"
                for key, index, _url, path, mine in plans
            ]
        )
        + "]"
    )


def _logged_plans(line: bytes) -> list[tuple[int, int, str | None, bool]] | None:
    """The plans of one plan-log line, or None for a line that is not one (torn by a
    kill, or damaged: nothing of it is trusted)."""
    try:
        entries = json.loads(line.decode("utf-8", "surrogatepass"))
        plans = [(k, i, p, bool(m)) for k, i, _url, p, m in entries]
    except (ValueError, TypeError):  # UnicodeDecodeError is a ValueError
        return None
    except RecursionError:  # nested deeper than json reads: not a line we wrote
        return None
    for key, index, path, _mine in plans:
        if type(key) is not int or type(index) is not int or not _INT64 > key >= -_INT64:
            return None
        if path is not None and not isinstance(path, str):
            return None
    return plans


_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_quote = json.encoder.encode_basestring  # C-accelerated, keeps non-ASCII as UTF-8
# Characters JSON leaves raw that end a line for some readers (Python's
# str.splitlines, JavaScript): one record must stay one line for every reader.
_LINE_ENDS = ("\x85", "\u2028", "\u2029")


def _dumps(value: object) -> str:
    text = _ENCODE(value)
    if text.isascii():
        return text
    for end in _LINE_ENDS:
        if end in text:
            text = text.replace(end, f"\\u{ord(end):04x}")
    return text


def encode(result: FileResult) -> str:
    """``result``'s manifest record as JSON text, without ``index`` (the journal adds it)."""
    if (
        result.ok
        and result.message is None
        and result.digests is None
        and result.final_url is None
        and result.path is not None
        and result.url.isascii()
    ):
        # The common case, put together directly: a third of the cost of the
        # encoder (and an f-string, which mypyc joins itself, half that of %).
        url, path = _quote(result.url), _quote(result.path)
        return (
            f'{{"url":{url},"path":{path},"status":"ok",'
            f'"http_status":{result.http_status or 0},"bytes":{result.bytes},'
            f'"error":null,"attempts":{result.attempts},"elapsed_ms":{result.elapsed_ms}}}'
        )
    record = result.to_json()
    del record["index"]
    for field in ("url", "message", "final_url"):
        value = record.get(field)
        if isinstance(value, str):
            record[field] = storable(value)
    return _dumps(record)


def digests_of(record: dict[str, object]) -> dict[str, str]:
    """The digests a manifest record holds (what --hash or the row's checks recorded)."""
    return {name: str(record[name]) for name in ("sha256", "md5") if name in record}


def _chunks(items: list[int] | list[str], size: int) -> Iterator[list[object]]:
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


def _open_append(path: str, truncate: bool = False) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    return os.open(path, flags | os.O_TRUNC if truncate else flags, FILE_MODE)


def _make_database(path: str) -> None:
    """An empty file at ``path`` unless there is one, created with FILE_MODE.
    Something else there (a directory) is refused: SQLite says only "unable to
    open database file"."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE))
        return
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise OutputError(
            f"{path} is not a file, so it cannot be swarmget's journal: move it out of the "
            f".swarmget folder {_AND_RUN_AGAIN}",
            True,
        )


def _lock(path: str) -> int:
    """Hold an exclusive lock on the output dir for this run, or fail clearly."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(
            f"another swarmget run is using {os.path.dirname(os.path.dirname(path))} "
            "(wait for it, or use another output directory)"
        ) from None
    return fd
