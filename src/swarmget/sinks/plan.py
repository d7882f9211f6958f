"""Planning rows for the file sink: identity, output path, resume, skip (driver side).

Theory of operation
-------------------
Every input row is planned here, in the driver, before any engine sees it,
and identically whatever the number of worker processes: the same checks
(the row parsed, the URL is http(s), the path is confined and not reserved),
the same names, the same resume decisions.

**Identity.**  A row is known across runs by its *key*: a hash of its URL, its
explicit ``path`` column (if any) and its *occurrence* -- how many rows with
the same URL and path came before it in this run's input.  So a list that is
reordered between runs maps every row to what it was before (its file is
skipped, not fetched twice), and a list with duplicates has one identity per
copy: the first ``a.jpg`` and the second are two rows, with two files
(``a.jpg``, ``a-1.jpg``) and two records, every run.

**Names.**  A row the journal already knows keeps the path it was given, even
if the list changed around it; a new row gets its default or explicit name,
suffixed past every path claimed in this run or an earlier one
(:class:`~swarmget.sinks.naming.NameAllocator` over the journal).

**Decisions**, per row:

* done in an earlier run (ok, and the file is there with its size): skipped;
* a part was kept with a validator: continued with ``Range`` + ``If-Range``;
* a file is at the path that this run did not plan (and no earlier run
  claimed): it is someone else's, and the row fails with ``exists`` unless
  ``--overwrite``;
* otherwise: dealt out, to be downloaded.

All of a batch's decisions are committed to the journal before the batch is
dealt, so a file at a planned path is always known to be ours.

**Duplicates with ``--dedupe``.**  The first row of each distinct URL is
downloaded; the others wait for it in the journal and get its file by a hard
link (a copy where links are impossible) and a record of their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Iterator
from hashlib import blake2b
from typing import Final

from swarmget.engine.urls import UrlSplitter, redact, redact_failure, split_url
from swarmget.errors import ErrorCode, TransferError
from swarmget.manifest import manifest_path, write_manifest
from swarmget.options import Options
from swarmget.report import FileResult
from swarmget.sinks.base import Assignment
from swarmget.sinks.bloom import Bloom
from swarmget.sinks.files import (
    PARTS_DIR,
    STATE_DIR,
    VERSION_SUFFIX,
    AppearedMeanwhile,
    OutputDir,
    OutputError,
    move_part,
    part_path,
    part_version,
    remove_part,
    version_path,
)
from swarmget.sinks.journal import (
    FAILED,
    OK,
    Follower,
    Journal,
    Outcome,
    PlanEntry,
    Previous,
    digests_of,
    storable,
)
from swarmget.sinks.manifest_lines import ManifestLines, remove_stale
from swarmget.sinks.naming import NameAllocator, NameStore, parents_of
from swarmget.sources.rows import Row

_MAX_CACHED = 65536  # bounded caches: a list's length must not cost memory
# Rows in the plan log before it is started afresh (see Journal.checkpoint).
CHECKPOINT_ROWS = 100_000
FLUSH_ROWS = 4096  # outcomes written to the journal together
MIN_FLUSH_ROWS = 256  # ... and as the run drains, fewer (see _record_now)


def _requested(url: str) -> str:
    """What is asked for, for --dedupe: the URL as it goes on the wire.  Its
    ``#fragment`` never leaves the client, and ``HTTP://Host:80/a/../b`` is
    ``http://host/b``: the same request, the same file.  A URL that does not
    parse stays as it is (its row fails, as each of its copies does)."""
    try:
        location = split_url(url)
    except TransferError:
        return url
    scheme, host, port = location.origin
    # A credential is part of the request: another user may be served another file.
    return f"{scheme}://{host}:{port}{location.target} {location.authorization}"


def row_key(url: str, path: str | None, occurrence: int) -> int:
    """The identity of the ``occurrence``-th row with this URL and path column.

    62 bits of a hash: an integer SQLite indexes compactly (the journal's rows
    are stored in arrival order, found by it: sinks/journal.py) and mypyc keeps
    unboxed.  Two rows of a ten-million-row list share one with odds
    of about 1 in 10^4.
    """
    if "\x00" in url:
        # A NUL in the URL (a bad row, but it has a record too) would make the
        # forms below ambiguous: ``U\x005:p.bin\x000`` read as a plain URL is
        # the key of (U, "p.bin", 0).  Its own hash, of lengths and parts.
        path = path or ""
        text = f"{len(url)}:{url}{len(path)}:{path}{occurrence}"
        own = blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8, person=b"nul")
        return int.from_bytes(own.digest(), "big") >> 2
    if path is None and occurrence == 0:
        text = url  # most rows: nothing else makes them what they are
    else:
        path = path or ""
        # Unambiguous: the URL has no NUL, and the path carries its length.
        text = f"{url}\x00{len(path)}:{path}\x00{occurrence}"
    # A copy of an empty hasher, then update: the same digest as
    # blake2b(data, digest_size=8), without parsing the keywords a row (a third
    # less time: the key is computed for every row, in the driver).
    hasher = _ROW_HASHER.copy()
    hasher.update(text.encode("utf-8", "surrogatepass"))
    return int.from_bytes(hasher.digest(), "big") >> 2


_ROW_HASHER: Final = blake2b(digest_size=8)


@dataclasses.dataclass(slots=True)
class PlanBatch:
    """What planning a batch of rows decided."""

    assignments: list[Assignment]  # to download
    results: list[FileResult]  # decided now (bad_row, bad_url, bad_path, exists, dedupe)
    skipped: int = 0  # done in an earlier run


class JournalNames(NameStore):
    """Names handed out, kept in the journal (see NameStore).

    A name is *held* in memory from the moment it is claimed until its row's
    outcome is in the journal's table (:meth:`release`): that is, for the rows
    in flight, a number bounded by the workers' backlogs, never by the list.
    The planner announces a batch's candidate names (:meth:`prefetch`) so that
    one query answers them all.
    """

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._held: dict[str, None] = {}  # claimed, not yet in the table
        self._held_dirs: dict[str, int] = {}  # directories they imply, with counts
        self._known: dict[str, bool] = {}  # prefetched: taken or not
        self._explicit: set[str] = set()  # the batch's explicit paths
        self._suffixes: dict[str, int] = {}
        self._filter: Bloom | None = None
        # The journal was lost: the paths the manifest lists are kept for
        # their URLs' rows (FilePlanner._recovered_by_url), not default names.
        self.recovering = False

    def reserved(self, name: str) -> bool:
        return self.recovering and name not in self._held and self._journal.is_recovered(name)

    def asked_for(self, name: str) -> bool:
        return name in self._explicit

    def expect(self, names: set[str]) -> None:
        """The explicit paths of the batch being planned (see NameStore.asked_for)."""
        self._explicit = names

    def use_filter(self, names: Bloom) -> None:
        """The journal started empty: names not in ``names`` were never claimed."""
        self._filter = names

    def prefetch(self, names: list[str]) -> None:
        filter_ = self._filter
        if filter_ is not None:
            maybe = [name for name in names if hash(name) in filter_]
            taken = self._journal.taken(maybe) if maybe else set()
        else:
            taken = self._journal.taken(names)
        self._known = {name: name in taken for name in names}

    def freed(self, name: str) -> None:
        """An earlier run's row gave ``name`` up (FilePlanner._take_explicit)."""
        self._known[name] = False

    def release(self, name: str) -> None:
        """``name``'s row is in the table now: the journal answers for it."""
        self._held.pop(name, None)
        self._known.pop(name, None)
        if not self._held_dirs:
            return  # most runs: no name with a directory in it
        for parent in parents_of(name):
            count = self._held_dirs.get(parent, 0) - 1
            if count > 0:
                self._held_dirs[parent] = count
            else:
                self._held_dirs.pop(parent, None)

    def taken(self, name: str) -> bool:
        if name in self._held:
            return True
        known = self._known.get(name)
        if known is not None:
            return known
        if self._filter is not None and hash(name) not in self._filter:
            return False
        return bool(self._journal.taken([name]))

    def is_dir(self, name: str) -> bool:
        return name in self._held_dirs or self._journal.is_directory(name)

    def claim(self, name: str, parents: list[str]) -> None:
        self._held[name] = None
        if self._filter is not None:
            self._filter.add(hash(name))
        if parents:
            for parent in parents:
                self._held_dirs[parent] = self._held_dirs.get(parent, 0) + 1
            self._journal.note_directories()

    def next_suffix(self, name: str) -> int:
        return self._suffixes.get(name, 1)

    def set_next_suffix(self, name: str, n: int) -> None:
        if len(self._suffixes) >= _MAX_CACHED:
            self._suffixes.clear()  # only a head start: counting from 1 is still right
        self._suffixes[name] = n

    def __len__(self) -> int:
        return len(self._journal) + len(self._held)


class FilePlanner:
    """Plans rows for the file sink and keeps the journal (see the module docstring)."""

    def __init__(
        self, root: str, options: Options, inputs: frozenset[tuple[int, int]] = frozenset()
    ) -> None:
        self.output = OutputDir(root)
        self.root = self.output.root
        self.options = options
        self.journal = Journal(self.root)
        self._names_store = JournalNames(self.journal)
        self.names = NameAllocator(self._names_store, self.root)
        # In an output dir that starts empty, every file is ours: no need to look
        # for foreign files before each download (one syscall less per file).
        self.fresh = self.journal.empty_at_start and not _has_files(self.root)
        # The files the rows are read from (st_dev, st_ino), which no row may
        # replace or remove: `swarmget out/urls.txt -o out --overwrite` wrote the
        # file of http://h/urls.txt over its own list.  None can be in an output
        # dir that starts empty: then nothing is looked at.
        self._inputs = frozenset() if self.fresh else inputs
        self._split = UrlSplitter().split
        self._occurrences: dict[tuple[str, str | None], int] = {}
        # Rows planned and dealt out whose outcome is not in the table yet.
        self._in_flight: dict[int, PlanEntry] = {}
        # A journal that started empty knows only this run's rows: filters of
        # their keys and names answer most questions without a query (bloom.py).
        self._seen_keys = Bloom() if self.journal.empty_at_start else None
        if self.journal.empty_at_start:
            self._names_store.use_filter(Bloom())
        self._foreign: dict[int, str] = {}  # `exists` rows not yet written: their claimed path
        # Rows redone with --overwrite over a file of ours, which stays at the
        # path until the download replaces it: should it fail, the file is
        # still ours (see _flush).
        self._kept: set[int] = set()
        # Rows that go on with an earlier row's part (_take_explicit): its validator.
        self._carried: dict[int, tuple[str, int | None]] = {}  # (validator, total)
        # Rows whose recorded validator outlived their part (see plan()).
        self._stale_validators: list[int] = []
        self._batch: dict[int, Previous] = {}  # see plan()
        self._pending: list[FileResult] = []  # outcomes not yet written (see _record_now)
        self._flushing = False  # a _flush is under way (or was cut short by Ctrl-C)
        # A journal that started empty holds only this run's outcomes: the manifest
        # can be written as they come, not exported after the last one.
        manifest = manifest_path(self.root)
        remove_stale(manifest)
        # A journal that starts empty beside a manifest was lost (deleted, or a
        # disk put back without it): what the manifest lists as done is kept
        # for the rows that find their file there (_recovered).  Empty but for
        # the claims a killed run left in the plan log, too: those are folded
        # in as the journal opens, and it was lost all the same.
        self._recovering = (
            self.journal.no_outcomes_at_start
            and not self.fresh
            and self.journal.recover(_done_records(manifest)) > 0
        )
        self._names_store.recovering = self._recovering
        if self.journal.empty_at_start:
            _remove_parts(self.root)  # no row knows them: nothing can continue them
        # Versions a kill left beside (or without) their parts: looked for row by
        # row (_plan_row) only if the parts folder holds any at the start, as
        # only workers of this run write them, for rows planned already.  An
        # unlink a row was a tenth of a rerun's cost per row.
        self._stray_versions = not self.journal.empty_at_start and _has_versions(self.root)
        self._lines = ManifestLines(manifest) if self.journal.empty_at_start else None

    # -- planning --------------------------------------------------------------------

    def plan(self, rows: list[Row]) -> PlanBatch:
        """Decide every row of ``rows``; commit the plan before returning it."""
        batch = PlanBatch([], [])
        keys, previous = self._identify(rows)
        self._batch = previous  # the rows of this batch the journal knows (_take_explicit)
        candidates = self._prefetch_names(rows, previous, keys)
        plans: list[PlanEntry] = []
        skips: list[tuple[int, int]] = []
        digests = self._recorded_digests(rows, keys, previous)
        for row, key, candidate in zip(rows, keys, candidates, strict=True):
            known = previous.get(key)
            if known is not None and not self._checks_hold(row, known, digests.get(key)):
                checked = self._checked_on_disk(row, key, known)
                if checked is not None:
                    batch.results.append(checked)  # done: its file passes the new checks
                    continue
                self._unpublish(known)
                known = dataclasses.replace(known, status=FAILED)
            self._plan_row(row, key, known, candidate, batch, plans, skips)
        journal = self.journal
        if self._stale_validators:
            journal.forget_validators(self._stale_validators)
            self._stale_validators = []
        journal.log_plans(plans)  # the claim, before any of these rows goes out
        for plan in plans:
            self._in_flight[plan[0]] = plan
        journal.touch(skips)
        self._record_now(batch.results)
        batch.skipped = len(skips)
        return batch

    def _plan_row(
        self,
        row: Row,
        key: int,
        previous: Previous | None,
        candidate: str | None,
        batch: PlanBatch,
        plans: list[PlanEntry],
        skips: list[tuple[int, int]],
    ) -> None:
        url = storable(redact(row.url))
        problem = row.problem
        if problem:
            batch.results.append(_failed(row, key, url, ErrorCode.BAD_ROW, problem))
            return
        found = self._path_or_result(row, key, url, previous, candidate)
        if isinstance(found, FileResult):
            batch.results.append(found)  # settled already: done, or failed
            return
        path = found
        overwrite = self.options.overwrite
        ours = previous is not None and previous.path == path and previous.mine
        if not ours and not overwrite and not self.fresh and self._occupied(path):
            recovered = self._recovered(row, key, url, path) if self._recovering else None
            if recovered is not None:
                batch.results.append(recovered)
                return
            message = self._input_file(path) or self._foreign_file(path, url)
            # The name stays claimed (not ours): later rows are named around it.
            self._foreign[key] = path
            batch.results.append(_failed(row, key, url, ErrorCode.EXISTS, message))
            return
        if ours and not overwrite and previous is not None:
            if self._done(previous):
                skips.append((key, row.index))
                return
            # What an earlier run left at the path (a file whose record the
            # kill lost, or one changed since) goes now: the download is
            # published only where nothing is (sinks/files.py).  Not an input.
            self._unpublish(previous)
        blocked = self._cannot_take(path, ours, overwrite)
        if blocked:
            self._foreign[key] = path  # claimed, not ours: never removed later
            batch.results.append(_failed(row, key, url, ErrorCode.EXISTS, blocked))
            return
        # With --overwrite, a file at the path that is not ours stays not ours
        # until our download replaces it: a run stopped before then must not
        # leave the claim saying it is (the next run, without --overwrite,
        # removed it as a file of ours whose record the stop had cut short).
        mine = ours or not overwrite or self.fresh or not self._occupied(path)
        if ours and overwrite:
            self._kept.add(key)
        plans.append((key, row.index, url, path, mine))
        if self.options.dedupe and not _checked(row) and self._follows(row, key, url, path, batch):
            return
        # The row's own part, kept to resume, ours or not its path is (a failed
        # row's is not: _flush).
        again = previous is not None and previous.path == path
        resume_from, validator, total = self._resume_point(key, previous, again and not overwrite)
        assignment = Assignment(
            row.index, key, row.url, path, row.sha256, row.md5, row.size, resume_from, validator,
            total,
        )  # fmt: skip
        batch.assignments.append(assignment)

    def _cannot_take(self, path: str, ours: bool, overwrite: bool) -> str:
        """Why the row's file cannot go at ``path``, else ``""``.  Checked before
        the download, not found at its end (as ``io``, the body thrown away): a
        directory there (someone's, made where this row's file was, or one
        --overwrite does not remove either), a file where one of the path's
        directories must go (one lstat for both), or an input list of the run
        (compared only where the file could be replaced: with --overwrite, or
        to redo a row of ours)."""
        if not self.fresh and (ours or overwrite or "/" in path):
            message = self._blocked(path, ours)
            if message:
                return message
        if self._inputs and (overwrite or ours):
            return self._input_file(path)
        return ""

    def _resume_point(
        self, key: int, previous: Previous | None, continuing: bool
    ) -> tuple[int, str | None, int | None]:
        """Where the row's download starts: (the bytes of the part kept for it,
        the validator they need, the file's length then), or (0, None, None).
        ``continuing``: the row is ours and done again, not overwritten."""
        carried = self._carried.pop(key, None) if self._carried else None
        if continuing and previous is not None and previous.validator:
            carried = (previous.validator, previous.total)
        if carried is None:
            if previous is not None and self._stray_versions:
                # A version written beside a part before the journal heard of it
                # (a kill), or of a part --overwrite does not continue: a stray.
                with contextlib.suppress(OSError):
                    os.unlink(version_path(part_path(self.root, key)))
            return 0, None, None
        part = part_path(self.root, key)
        # The part's own record of its version must agree: the journal may not
        # have heard of a new one yet when a kill came (sinks/files.py).
        if part_version(part) == carried[0]:
            resume_from = _part_size(part)
            if resume_from:
                return resume_from, carried[0], carried[1]
        remove_part(part)  # nothing can continue it: it would be a stray
        if previous is not None and previous.validator:
            self._stale_validators.append(key)
        return 0, None, None

    def _path_or_result(
        self, row: Row, key: int, url: str, previous: Previous | None, candidate: str | None
    ) -> FileResult | str:
        """The row's output path, or its result when that settles it already: done
        with an earlier run's file, or failed (``bad_url``, ``bad_path``, ``exists``)."""
        try:
            self._split(row.url)
            if previous is not None and previous.path is not None:
                return previous.path  # claimed before: it keeps it, whatever moved around it
            return self._new_path(row, key, url, candidate)
        except TransferError as exc:
            shown, message = redact_failure(url, exc)
            return _failed(row, key, shown, exc.code, message)

    # -- --dedupe ----------------------------------------------------------------------

    def _follows(self, row: Row, key: int, url: str, path: str, batch: PlanBatch) -> bool:
        """Does another row fetch this URL?  Then this one gets its result, now or later."""
        # One per distinct request, whatever the path and however the URL spells it.
        url_key = row_key(_requested(row.url), None, -1)
        journal = self.journal
        leader = journal.leader(url_key)
        if leader is not None and leader[0] != key:
            leader_key, run = leader
            outcome = journal.outcome(leader_key)
            # A leader chosen in this run is settled only by an outcome of this
            # run: until then the table holds what an earlier run made of it (a
            # failure it is now trying again), which is not its outcome.
            settled = (
                outcome is not None
                and outcome.status in (OK, FAILED)
                and (run != journal.run or outcome.run == journal.run)
            )
            # An earlier run's leader lends its file only to a run that keeps
            # files (with --overwrite every row is fetched anew: a copy linked
            # to the old file before the leader's new download would keep it).
            earlier = settled and not self.options.overwrite and self._leader_file(outcome)
            if run == journal.run or earlier:
                follower = Follower(key, leader_key, row.index, url, path)
                if settled and outcome is not None:
                    batch.results.append(self._settle(follower, outcome))
                else:
                    journal.add_follower(follower)
                return True
        journal.set_leader(url_key, key)  # this row fetches the URL
        return False

    def _leader_file(self, outcome: Outcome | None) -> bool:
        """An earlier run's leader is still good if its file is there (or it failed here)."""
        if outcome is None or outcome.status != OK or outcome.path is None:
            return False
        # A symlink put in its place is not the file it wrote: lent, it made
        # the copy a link to whatever the symlink names, outside the output dir too.
        return self._whole(outcome.path, outcome.bytes)

    def _settle(self, follower: Follower, leader: Outcome) -> FileResult:
        """The row that fetched ``follower``'s URL is done: give it the same result."""
        # An earlier run's row number is not one of this input's.
        earlier = leader.run not in (0, self.journal.run)
        note = (
            "same URL as a row of an earlier run" if earlier else f"same URL as row {leader.index}"
        )
        if leader.status == OK and leader.path is not None:
            try:
                # final_path, as a download's file: its directories are made,
                # and a symlinked one that leads out of the output dir refused.
                target = self.output.final_path(follower.path)
                replace = self.options.overwrite
                link_or_copy(os.path.join(self.root, leader.path), target, replace=replace)
            except OSError as exc:
                return _failed_follower(follower, ErrorCode.IO, f"{note}: {exc}")
            except TransferError as exc:  # bad_path, or io (an OutputError)
                return _failed_follower(follower, exc.code, f"{note}: {exc.message}")
            return FileResult(
                follower.url,
                follower.path,
                "ok",
                leader.http_status,
                leader.bytes,
                None,
                0,
                0,
                # By the file, not a row number: the record outlives this run
                # (a rerun skips the row and keeps it), and a number would then
                # name a row of another input.
                f"same URL as {leader.path}: linked",
                leader.digests,
                leader.final_url,
                index=follower.index,
                key=follower.key,
                reused=leader.bytes,  # not received: another row's download
            )
        error = leader.error or ErrorCode.CANCELLED
        message = f"{note}, which failed: {leader.message}"
        return _failed_follower(follower, error, message, leader.http_status)

    def _recorded_digests(
        self, rows: list[Row], keys: list[int], previous: dict[int, Previous]
    ) -> dict[int, dict[str, str]]:
        """The digests recorded for the rows done before that come with a sha256 or
        md5 of their own now (one query for the batch; most batches: none)."""
        wanted = [
            key
            for row, key in zip(rows, keys, strict=True)
            if (row.sha256 is not None or row.md5 is not None)
            and key in previous
            and previous[key].status == OK
        ]
        return self.journal.digests(wanted) if wanted else {}

    @staticmethod
    def _checks_hold(row: Row, previous: Previous, digests: dict[str, str] | None) -> bool:
        """Did the file done before pass the checks this row comes with now?  A
        list that gained (or changed) a size, sha256 or md5 column since must not
        skip a file those were never checked against: the row is done again, and
        its download verified."""
        if previous.status != OK:
            return True  # not done: nothing to skip
        if row.size is not None and row.size != previous.bytes:
            return False
        if row.sha256 is None and row.md5 is None:
            return True
        recorded = digests or {}
        if row.sha256 is not None and row.sha256.lower() != recorded.get("sha256"):
            return False
        return row.md5 is None or row.md5.lower() == recorded.get("md5")

    def _checked_on_disk(self, row: Row, key: int, previous: Previous) -> FileResult | None:
        """A file done before, never checked against the sha256 or md5 this row
        comes with now: checked here, on disk.  When it passes, the row is done
        (with the digests on its record); else None, and it is done again.  A
        list that gains a checksum column must not cost the files it vouches
        for (with the server gone, a good file would simply be lost).  With no
        digest to check, only the size (an earlier row's file of this URL,
        :meth:`_take_explicit`)."""
        if self.options.overwrite or not previous.mine or not self._done(previous):
            return None
        if row.size is not None and row.size != previous.bytes:
            return None
        assert previous.path is not None  # _done
        wanted = {"sha256": row.sha256, "md5": row.md5}
        found: dict[str, str] = {}
        try:
            with open(os.path.join(self.root, previous.path), "rb") as file:
                for name, digest in wanted.items():
                    if digest is not None:
                        file.seek(0)
                        found[name] = hashlib.file_digest(file, name).hexdigest()
        except OSError:
            return None
        if any(
            digest is not None and digest.lower() != found[name] for name, digest in wanted.items()
        ):
            return None
        return FileResult(
            storable(redact(row.url)),
            previous.path,
            "ok",
            None,
            previous.bytes,
            None,
            0,
            0,
            f"already on disk: checked against the input's {' and '.join(found)}"
            if found
            else "already on disk: the file of an earlier row with this URL",
            found or None,
            index=row.index,
            key=key,
            reused=previous.bytes,
        )

    def _input_file(self, path: str) -> str:
        """Why the row cannot have ``path`` when the file there is one its run
        reads rows from (compared as files, not as names), else ``""``."""
        if not self._is_input(path):
            return ""
        return (
            f"{path} is an input list of this run (swarmget never writes over or removes "
            "its input, even with --overwrite; give the row another path)"
        )

    def _is_input(self, path: str) -> bool:
        if not self._inputs:
            return False
        try:
            found = os.stat(f"{self.root}/{path}")  # through a symlink too: it may lead there
        except (OSError, ValueError):
            return False
        return (found.st_dev, found.st_ino) in self._inputs

    def _foreign_file(self, path: str, url: str) -> str:
        """Why the file at ``path`` is not this row's (``exists``)."""
        earlier = self.journal.recovered(path) if self._recovering else None
        blocked = self._blocked(path, foreign=True)  # a directory: --overwrite would not help
        if blocked:
            return blocked
        if earlier is None:
            what = "already exists and was not downloaded by swarmget"
        elif earlier.get("url") == url:
            what = "changed since an earlier run's manifest listed it as this URL's"
        else:
            what = f"holds the file an earlier run downloaded from {earlier.get('url')}"
        return f"{path} {what} (use --overwrite to replace it)"

    def _new_path(self, row: Row, key: int, url: str, candidate: str | None) -> FileResult | str:
        """The path of a row the journal holds none for, or its result when an
        earlier run's file makes it done.  Raises ``exists``/``bad_path``."""
        if row.path is not None and candidate is not None:
            done = self._take_explicit(row, key, url, candidate)
            if done is not None:
                return done
        elif self._recovering:
            done, again = self._recovered_by_url(row, key, url)
            if done is not None:
                return done
            if again is not None:
                # The manifest lists it as this URL's file, but it changed since:
                # the row keeps to it (its default name may be another URL's
                # file now), and it is replaced only when asked, as a file not
                # known to be ours is.
                self._names_store.claim(again, parents_of(again))
                if not self.options.overwrite:
                    raise TransferError(ErrorCode.EXISTS, self._foreign_file(again, url))
                return again
        return self.names.allocate(row, candidate)

    def _recovered_by_url(
        self, row: Row, key: int, url: str
    ) -> tuple[FileResult | None, str | None]:
        """A row named by default, after the journal was lost: the files the
        manifest lists as done for its URL that no row of this run has claimed
        (the list may have been reordered since, so its default name may now
        be another row's file).  ``(done, None)`` with the first that is still
        whole; else ``(None, path)``: the first, changed since; else
        ``(None, None)``."""
        store = self._names_store
        again = None
        for path in self.journal.recovered_paths(url):
            if store.taken(path):
                continue  # another row of this run has it (the same URL twice)
            done = self._recovered(row, key, url, path)
            if done is not None:
                store.claim(path, parents_of(path))
                return done, None
            again = again or path
        return None, again

    def _recovered(self, row: Row, key: int, url: str, path: str) -> FileResult | None:
        """The row's file is at its path, the journal does not know it, and the
        manifest of the run that wrote it lists it as done, for this URL and
        of this size: it is this row's, done (else None: not ours to judge)."""
        record = self.journal.recovered(path)
        if record is None or record.get("url") != url:
            return None
        size = record.get("bytes")
        if not isinstance(size, int):
            return None
        done = Previous(self.journal.run, path, True, OK, size, None, None)
        digests = digests_of(record)
        # Its file still whole, and vouched for by what this row comes with.
        if not self._done(done) or not self._checks_hold(row, done, digests):
            return None
        self._in_flight[key] = (key, row.index, url, path, True)  # ours, recorded so
        http_status = record.get("http_status")
        return FileResult(
            url, path, "ok", http_status if isinstance(http_status, int) else None, size,
            None, 0, 0,
            "already on disk: an earlier run's manifest lists it as done (its journal was lost)",
            digests or None, index=row.index, key=key, reused=size,
        )  # fmt: skip

    def _take_explicit(self, row: Row, key: int, url: str, name: str) -> FileResult | None:
        """A ``path`` the input gives that a row of an earlier run claimed (the
        list changed: a URL fixed or updated, a path column added).  That row
        is not in this input, so it gives the path up:

        * its file is there and is of this URL: this row is done, with it;
        * its file is there, of another URL: replaced with --overwrite, else
          this row fails ``exists`` (a file swarmget wrote is not overwritten
          unasked);
        * it has no file there (it failed, or never finished: planned or
          partly done when a run stopped): this row takes the path over, and
          any file there is judged as any other.

        Returns the row's result when it is done; raises ``exists``; else None
        (the path is free for :meth:`NameAllocator.allocate`, which refuses
        one claimed in this run)."""
        store = self._names_store
        if not store.taken(name):
            if store.reserved(name) and not self.options.overwrite:
                # The journal was lost, and the manifest lists the file there as
                # another URL's: as when the journal holds that row (below).
                earlier = self.journal.recovered(name)
                if earlier is not None and earlier.get("url") != url:
                    raise TransferError(ErrorCode.EXISTS, self._foreign_file(name, url))
            return None
        found = self.journal.holder(name)
        if found is None or found[1].run == self.journal.run or found[0] in self._batch:
            return None  # a row of this input has it: allocate refuses it
        holder_key, holder, holder_url = found
        # Planned or partly done when a run stopped, the row never finished: the
        # path goes to the first row of this input that asks for it, as a failed
        # row's does.  (Kept for it, the path was stuck for good when the row had
        # left the list; should it still be further on in this input, it now
        # fails ``exists``, as a second row with one path does.)  A file at the
        # path is judged as any other: the row may have been planned over a
        # user's file with --overwrite, or the user put one there since.
        whole = holder.status == OK and holder.mine and self._done(holder)
        if whole and holder_url == url and not self.options.overwrite:
            done = self._checked_on_disk(row, key, holder)
            if done is not None:
                self.journal.forget(holder_key)
                store.claim(name, parents_of(name))
                self._in_flight[key] = (key, row.index, url, name, True)
                return done
            self._unpublish(holder)  # its file fails this row's checks: verified or absent
            whole = False
        if whole and not self.options.overwrite:
            raise TransferError(
                ErrorCode.EXISTS,
                f"{name} holds the file an earlier run downloaded from {holder_url} "
                "(use --overwrite to replace it)",
            )
        self.journal.forget(holder_key)
        part = part_path(self.root, holder_key)
        if holder_url == url and holder.validator and not self.options.overwrite:
            # The same download under a new identity (a path column added for
            # the name it had): its part goes on, as the row's own would.
            with contextlib.suppress(OSError):
                move_part(part, part_path(self.root, key))
                self._carried[key] = (holder.validator, holder.total)
        remove_part(part)  # a part it kept is of no use now
        store.freed(name)
        return None

    def _unpublish(self, previous: Previous) -> None:
        """A file done before that this row's checks do not vouch for is not left in
        place: whatever its redo gives, the file is verified or absent."""
        if previous.mine and previous.path is not None:
            self._remove(previous.path)

    def _done(self, previous: Previous) -> bool:
        """Was the row finished by an earlier run, and is its file still whole?"""
        if previous.status != OK or previous.path is None:
            return False
        return self._whole(previous.path, previous.bytes)

    def _whole(self, path: str, size: int) -> bool:
        """Is the file we wrote at ``path``, ``size`` bytes, still there?"""
        if not self.output.resolves_inside(path):
            return False  # a directory on the way is a symlink out now: done again, refused
        try:
            # lstat: a symlink put in its place (to a file of the same size,
            # anywhere) is not the file we wrote; the row is done again.
            found = os.lstat(f"{self.root}/{path}")
        except OSError:
            return False
        return stat.S_ISREG(found.st_mode) and found.st_size == size

    def _blocked(self, path: str, ours: bool = False, foreign: bool = False) -> str:
        """Why no file can be published at ``path`` whatever ``--overwrite`` says
        (a directory is there, or a file is where one of its directories must
        be), else ``""``.  One lstat: ENOTDIR tells the second case.  ``ours``:
        the path held this row's file in an earlier run; ``foreign``: what is
        there is known not to be swarmget's."""
        try:
            found = os.lstat(f"{self.root}/{path}")
        except NotADirectoryError:
            return (
                f"a file is where a directory of {path} must go "
                "(swarmget replaces files, never turns one into a directory)"
            )
        except (OSError, ValueError):
            return ""
        if stat.S_ISDIR(found.st_mode):
            if ours:  # not ours to remove; someone made it since
                return f"{path} is a directory now (it held this row's file)"
            whose = ", not swarmget's" if foreign else ""
            return f"{path} is a directory{whose} (--overwrite replaces files, not directories)"
        return ""

    def _occupied(self, path: str) -> bool:
        return os.path.lexists(f"{self.root}/{path}")  # per row: not os.path.join

    def _prefetch_names(
        self, rows: list[Row], previous: dict[int, Previous], keys: list[int]
    ) -> list[str | None]:
        """Each row's candidate name (None: it has a path already, or a bad one);
        one journal query learns which of them are taken."""
        candidates: list[str | None] = []
        explicit: set[str] = set()
        for row, key in zip(rows, keys, strict=True):
            known = previous.get(key)
            name = None
            if known is None or known.path is None:
                # Not contextlib.suppress: this runs once per row, and a plain
                # try is free under mypyc.  A bad name fails the row in _plan_row.
                try:  # noqa: SIM105
                    name = self.names.candidate(row)
                except TransferError:
                    pass
                if name is not None and row.path is not None:
                    explicit.add(name)
                    if "/" in name:
                        # And the directories it needs: a default name "A" of an
                        # earlier row took "A" of "A/c", which failed "exists".
                        explicit.update(parents_of(name))
            candidates.append(name)
        store = self._names_store
        store.prefetch([name for name in candidates if name is not None])
        store.expect(explicit)
        return candidates

    # -- identity --------------------------------------------------------------------

    def _identify(self, rows: list[Row]) -> tuple[list[int], dict[int, Previous]]:
        """The key of each row -- (url, path column, occurrence in this run's input) --
        and what the journal knows of each key, in as few queries as possible."""
        if self._seen_keys is not None:
            keys = self._identify_new(rows, self._seen_keys)
            if keys is not None:
                return keys, {}
        journal = self.journal
        idents = [(row.url, row.path) for row in rows]
        occurrences = self._occurrences
        start: dict[tuple[str, str | None], int] = {}  # each identity's first occurrence here
        for ident in idents:
            if ident not in start:
                start[ident] = occurrences.get(ident, 0) if occurrences else 0
        first_keys = {ident: row_key(ident[0], ident[1], n) for ident, n in start.items()}
        guesses = {key: ident for ident, key in first_keys.items()}
        found = journal.lookup(self._maybe_known(list(guesses)))
        rekeyed = False
        for key, ident in guesses.items():
            seen = found.get(key)
            if key in self._in_flight or (seen is not None and seen.run == journal.run):
                # An earlier batch of this run had this identity already.
                start[ident] = self._first_free(ident, start[ident])
                first_keys[ident] = row_key(ident[0], ident[1], start[ident])
                rekeyed = True
        # Most batches: every identity new, once each.  Then every key is a
        # guess already looked up, and no count needs remembering.
        plain = len(start) == len(idents) and not rekeyed and not occurrences
        keys = []
        following = dict(start)
        for ident in idents:
            occurrence = following[ident]
            following[ident] = occurrence + 1
            if occurrence == start[ident]:
                keys.append(first_keys[ident])  # most rows: the key is known already
            else:
                keys.append(row_key(ident[0], ident[1], occurrence))
        if not plain:
            for ident, after in following.items():
                if after > 1 or ident in occurrences:
                    self._remember(ident, after)
        previous = {k: v for k, v in found.items() if v.run != journal.run} if found else {}
        unknown = [] if plain else self._maybe_known([key for key in keys if key not in guesses])
        if unknown:
            previous.update(
                (k, v) for k, v in journal.lookup(unknown).items() if v.run != journal.run
            )
        seen_keys = self._seen_keys
        if seen_keys is not None:
            for key in keys:
                seen_keys.add(key)
        return keys, previous

    @staticmethod
    def _identify_new(rows: list[Row], seen: Bloom) -> list[int] | None:
        """The keys of a batch whose identities are all new, or None when one may not be.

        Most batches of a run whose journal started empty: the filter of this
        run's keys has never seen the key of any row's first occurrence (every
        identity this run has met put that key in it).  Then each row is the
        first occurrence of its identity, and no earlier run knows it: nothing
        to look up, nothing to remember.  Any doubt (a "maybe" from the filter,
        two rows alike in the batch) and :meth:`_identify` does it the long way.
        """
        keys = [row_key(row.url, row.path, 0) for row in rows]
        for key in keys:
            if key in seen:
                return None
        if len(set(keys)) != len(keys):
            return None
        for key in keys:
            seen.add(key)
        return keys

    def _maybe_known(self, keys: list[int]) -> list[int]:
        """The keys the journal may know: all of them, unless it started empty and
        the filter of this run's keys says a key is new."""
        seen = self._seen_keys
        if seen is None:
            return keys
        return [key for key in keys if key in seen]

    def _first_free(self, ident: tuple[str, str | None], taken: int) -> int:
        """The first occurrence of ``ident`` after ``taken`` that this run has not planned.

        Rows of one identity are planned as 0, 1, 2...: gallop, then bisect.
        """
        url, path = ident
        low, step = taken, 1
        high = low + step
        while self._planned_now(url, path, high):
            low, step = high, step * 2
            high = low + step
        while high - low > 1:
            middle = (low + high) // 2
            if self._planned_now(url, path, middle):
                low = middle
            else:
                high = middle
        return high

    def _planned_now(self, url: str, path: str | None, occurrence: int) -> bool:
        key = row_key(url, path, occurrence)
        if key in self._in_flight:
            return True
        if self._seen_keys is not None and key not in self._seen_keys:
            return False
        found = self.journal.lookup([key]).get(key)
        return found is not None and found.run == self.journal.run

    def _remember(self, ident: tuple[str, str | None], following: int) -> None:
        if len(self._occurrences) >= _MAX_CACHED:
            self._occurrences.clear()  # a cache: the journal still knows
        self._occurrences[ident] = following

    # -- outcomes --------------------------------------------------------------------

    def record(self, results: list[FileResult]) -> list[FileResult]:
        """Record outcomes; with --dedupe, the results of the rows that waited for them."""
        self._record_now(results)
        if not self.options.dedupe:
            return []
        settled = [r.key for r in results if r.status in ("ok", "failed")]
        followers = self.journal.followers(settled) if settled else []
        if not followers:
            return []
        outcomes = {r.key: r for r in results}
        more = [self._settle(f, _outcome_of(outcomes[f.leader])) for f in followers]
        self._record_now(more)
        return more

    def _record_now(self, results: list[FileResult]) -> None:
        """Into the table soon, in large batches sorted by key: SQLite's B-tree work
        per row drops by about a third that way.  Until a row is written, its
        plan stays in ``_in_flight`` and its name held, so nothing asks the table
        about it too early.  With --dedupe a leader's outcome is read back from the
        table at once, so nothing waits then.

        As the run drains (fewer rows still downloading than outcomes waiting),
        smaller batches go in: otherwise the last few thousand rows' writes
        would all come after the last download, with the workers done and the
        driver alone (14 ms of a 0.5 s run at 10,000 small files)."""
        pending = self._pending
        pending.extend(results)
        waiting = len(pending)
        if (
            waiting >= FLUSH_ROWS
            or self.options.dedupe
            or (waiting >= MIN_FLUSH_ROWS and waiting >= len(self._in_flight) - waiting)
        ):
            self._flush()

    def _flush(self) -> None:
        """Write the outcomes waiting in ``_pending`` to the table.

        A row leaves ``_in_flight`` only once the table has it, and ``_pending``
        is emptied last: Ctrl-C lands at whatever bytecode the driver runs
        (parallel/interrupts.py), and rows taken out before their write were
        in neither when the run stopped.  Their claims were lost, and the next
        run took the files they had published for a user's (``exists``).  A
        flush cut short is done again whole by the next one (the write is an
        upsert); its manifest lines may be part written, so the journal's
        export writes the manifest instead."""
        results = self._pending
        if not results:
            return
        if self._flushing and self._lines is not None:
            self._lines.give_up()
        self._flushing = True
        results.sort(key=_key_of)
        in_flight, foreign, kept = self._in_flight, self._foreign, self._kept
        entries: list[tuple[FileResult, str | None, bool]] = []
        for result in results:
            plan = in_flight.get(result.key)
            if plan is None:
                entries.append((result, foreign.get(result.key), False))
            elif result.ok:
                entries.append((result, plan[3], True))
            else:
                # A failed row published nothing: the path keeps its claim (later
                # rows are named around it), but whatever is found there later
                # is not ours, unless it is the file of ours an --overwrite
                # redo left in place.  Taken for ours, a file its owner put
                # where the row had failed was removed by the rerun; and a
                # foreign file a failed --overwrite left was, too.
                ours = result.key in kept and result.error != ErrorCode.EXISTS
                entries.append((result, plan[3], ours))
        recorded = self.journal.record(entries)
        names = self._names_store
        for result, path, _mine in entries:
            in_flight.pop(result.key, None)
            foreign.pop(result.key, None)
            if kept:
                kept.discard(result.key)
            if path is not None:
                names.release(path)
        lines = self._lines
        if lines is not None and lines.active:
            for entry in recorded:
                lines.add(entry[1], entry[6])
        self._pending = []
        self._flushing = False

    def partial(self, key: int, validator: str | None, total: int | None) -> None:
        plan = self._in_flight.get(key)
        if plan is not None:
            self.journal.partial(plan, validator, total)
            if self._lines is not None:
                # The row's line may gain a validator: only the export knows.
                self._lines.give_up()

    def redeal(self, rows: list[Assignment]) -> None:
        """A dead worker's rows go out again: a file it published without living
        to report it is at the row's path (this run's claim: nothing else can be
        there), and the redo is published only where nothing is."""
        for row in rows:
            if row.path is not None:
                self._remove(row.path)

    def _remove(self, path: str) -> None:
        """Remove our file at ``path``, if any, never through a directory that
        leads out of the output dir (one replaced by a symlink since)."""
        if self.output.resolves_inside(path) and not self._is_input(path):
            with contextlib.suppress(OSError):
                os.unlink(f"{self.root}/{path}")

    def out_of_room(self) -> OutputError | None:
        """Why the run must stop now for lack of room (None: it need not)."""
        return self.journal.out_of_room()

    def commit(self) -> None:
        self._flush()
        journal = self.journal
        if journal.logged >= CHECKPOINT_ROWS:
            journal.checkpoint(list(self._in_flight.values()))
        else:
            journal.commit()

    def finish(self, interrupted: bool, whole: bool = False) -> None:
        """The run is over: keep the claims of rows that did not finish, write the
        manifest, let go of the output dir.

        The manifest is written however the run ended (``interrupted`` or not),
        so what finished is always on record.  ``whole``: the run read its
        whole input and every row ended (an earlier list's failures are then
        known not to be rows of this one).
        """
        journal = self.journal
        try:
            self._flush()
            journal.park(list(self._in_flight.values()))
            self._in_flight.clear()
            journal.commit()
            journal.free_reserve()  # its room is the manifest's now
            manifest = manifest_path(self.root)
            streamed = self._lines is not None and self._lines.finish()  # written as rows finished
            if not streamed and (journal.changed or not os.path.exists(manifest)):
                write_manifest(manifest, journal.records(earlier_failures=not whole))
        finally:
            if self._lines is not None:
                self._lines.give_up()  # a no-op once finished
            journal.close()


def _key_of(result: FileResult) -> int:
    return result.key


def _outcome_of(result: FileResult) -> Outcome:
    status = OK if result.ok else FAILED
    return Outcome(
        result.index,
        result.path,
        status,
        result.http_status,
        result.bytes,
        result.error,
        result.message,
        result.digests,
        result.final_url,
    )


def _checked(row: Row) -> bool:
    """Does the row have checks of its own (sha256, md5, size)?  Then --dedupe
    downloads and verifies it itself: a copy of another row's file skipped
    them ("ok" for a file its own checksum refuses)."""
    return row.sha256 is not None or row.md5 is not None or row.size is not None


def _failed_follower(
    follower: Follower, code: str, message: str, http_status: int | None = None
) -> FileResult:
    return FileResult(
        follower.url,
        None,
        "failed",
        http_status,  # the leader's, beside its error (an http_404 said null)
        0,
        code,
        0,
        0,
        message,
        index=follower.index,
        key=follower.key,
    )


def _has_versions(root: str) -> bool:
    """Does ``root``'s parts folder hold a part's version (see sinks/files.py)?"""
    parts = os.path.join(root, STATE_DIR, PARTS_DIR)
    try:
        with os.scandir(parts) as entries:
            return any(entry.name.endswith(VERSION_SUFFIX) for entry in entries)
    except OSError:
        return False


def _remove_parts(root: str) -> None:
    """Every part under ``root``'s state directory (regular files only)."""
    parts = os.path.join(root, STATE_DIR, PARTS_DIR)
    try:
        with os.scandir(parts) as entries:
            names = [entry.name for entry in entries if entry.is_file(follow_symlinks=False)]
    except OSError:
        return
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(parts, name))


def _done_records(manifest: str) -> Iterator[tuple[str, str, str]]:
    """``(path, url, record)`` of each row a manifest lists as done; what does not
    read as a record (a damaged line, a missing file) is passed over."""
    try:
        with open(manifest, "rb") as lines:
            for line in lines:
                try:
                    text = line.decode().strip()  # the manifest's own text of the record
                    record = json.loads(text)
                except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deeply
                    continue
                if not isinstance(record, dict) or record.get("status") != "ok":
                    continue
                path, url = record.get("path"), record.get("url")
                if isinstance(path, str) and isinstance(url, str):
                    yield path, url, text
    except OSError:
        return


def _failed(row: Row, key: int, url: str, code: str, message: str) -> FileResult:
    return FileResult(url, None, "failed", None, 0, code, 0, 0, message, index=row.index, key=key)


def _part_size(part: str) -> int:
    """The size of a kept part; 0 when there is none, or a symlink is in its place."""
    try:
        found = os.lstat(part)
    except OSError:
        return 0
    return found.st_size if stat.S_ISREG(found.st_mode) else 0


def _has_files(root: str) -> bool:
    try:
        with os.scandir(root) as entries:
            return any(entry.name != STATE_DIR for entry in entries)
    except OSError:  # not listable (mode 733): assume there are, and look before each write
        return True


def link_or_copy(source: str, target: str, *, replace: bool) -> None:
    """Give ``target`` the content of ``source``: a hard link, else a copy.  Over
    a file already there only if ``replace`` (``--overwrite``); else such a file
    (not ours: the planner found the path free) fails the row with ``exists``."""
    if replace:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)
    try:
        os.link(source, target)
    except FileExistsError:
        raise AppearedMeanwhile(
            f"{target} appeared before its copy was made and was not written by swarmget "
            "(use --overwrite to replace it)"
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise OutputError(f"cannot link {target}: {exc.strerror}") from None
        if os.path.lexists(target):
            raise AppearedMeanwhile(f"{target} appeared before its copy was made") from None
        shutil.copyfile(source, target)
