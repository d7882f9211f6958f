"""What earlier runs left behind, and what this run leaves for the next one.

The journal (see :mod:`swarmget.manifest`) says which rows an earlier run
finished and which large files it left as a ``.part`` with a validator.  For
each new job :meth:`ResumeState.already_done` decides: skip it (done, file
still there with the recorded size), continue its ``.part`` with ``Range``, or
refuse to overwrite a file no run of ours made.  While this run goes, large
bodies get a "partial" journal line as they start, and a failed or interrupted
large part is kept for the next attempt or run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Mapping

from swarmget.engine.job import Job
from swarmget.errors import ErrorCode, TransferError
from swarmget.manifest import MANIFEST_DIR, ManifestWriter, load_journal
from swarmget.options import Options
from swarmget.protocol import ResponseHead
from swarmget.sinks.files import PART_SUFFIX, Hasher, PartFile

# Bodies at least this large keep their .part on failure and resume with Range.
RESUME_MIN_BYTES = 1 << 20


class ResumeState:
    def __init__(self, root: str, options: Options, fresh_dir: bool | None = None) -> None:
        self.options = options
        self.journal = load_journal(root)
        # In an output dir that starts empty, every file is ours: no need to look
        # for foreign files before each download (one syscall less per file).
        # Worker processes are told: by the time they look, siblings have written.
        self.fresh_dir = is_fresh(root, self.journal) if fresh_dir is None else fresh_dir
        # A fresh journal with one line per row is already compact.
        self.needs_compaction = bool(self.journal)

    def already_done(self, job: Job) -> bool:
        """True to skip ``job``; may set ``resume_from``; raises ``exists``."""
        previous = self.journal.get(job.row.url)
        ours = previous is not None and previous.path == job.rel_path
        overwrite = self.options.overwrite
        if ours and previous is not None and not overwrite:
            if previous.status == "ok":
                with contextlib.suppress(OSError):
                    if os.stat(job.final).st_size == previous.bytes:
                        return True
            elif previous.status == "partial" and previous.validator:
                with contextlib.suppress(OSError):
                    job.resume_from = os.stat(job.final + PART_SUFFIX).st_size
                    job.validator = previous.validator
        if not ours and not overwrite and not self.fresh_dir and os.path.lexists(job.final):
            raise TransferError(
                ErrorCode.EXISTS,
                f"{job.rel_path} already exists and was not downloaded by swarmget "
                "(use --overwrite to replace it)",
            )
        return False

    def hashers_for(self, job: Job) -> dict[str, Hasher] | None:
        """Digests to compute while streaming: the row's checksums and ``--hash``."""
        row = job.row
        if row.sha256 is None and row.md5 is None and not self.options.hash:
            return None
        names = set(job.expected_digests())
        if self.options.hash:
            names.add(self.options.hash)
        return {name: hashlib.new(name) for name in sorted(names)} or None

    def note_partial(self, job: Job, head: ResponseHead, manifest: ManifestWriter) -> None:
        """A large body is starting: journal its validator so a later run can resume it."""
        length = head.content_length
        if length is None or length < RESUME_MIN_BYTES:
            return
        validator = head.get(b"etag")
        if validator is None or validator.startswith(b"W/"):  # If-Range needs a strong one
            validator = head.get(b"last-modified")
        if validator is None:
            job.validator = None
            return
        job.validator = validator.decode("latin-1")
        manifest.write_partial(job.row.url, job.rel_path, job.validator)
        self.needs_compaction = True

    def keep_part(self, job: Job, part: PartFile) -> bool:
        """Keep a failed or interrupted ``.part`` for resuming?  Only large, validated ones."""
        if job.validator is None or part.written < RESUME_MIN_BYTES:
            job.resume_from = 0
            return False
        job.resume_from = part.written
        return True


def is_fresh(root: str, journal: Mapping[str, object] | None = None) -> bool:
    """No earlier run's journal and no file in the output dir."""
    if journal is None:
        journal = load_journal(root)
    return not journal and not _has_files(root)


def _has_files(root: str) -> bool:
    with os.scandir(root) as entries:
        return any(entry.name != MANIFEST_DIR for entry in entries)
