"""The sink seam: where the bytes of a row go, and how a finished row is committed.

Theory of operation
-------------------
The engine moves bytes; it does not know where they end up.  Every row it
downloads has been *planned* first (by the sink's planner, in the driver
process, see :mod:`swarmget.sinks.plan`): the plan is an :class:`Assignment`,
which says which row this is, where its bytes go and whether an earlier run
left a part to continue.  In the process that downloads, the engine talks to a
:class:`Sink`:

* :meth:`Sink.open` gives a :class:`Writer` for the body of a response, from
  byte ``start`` on (0, or where a kept part ends).  The engine hands it
  ``memoryview`` slices of its receive buffer (``write``), then ``finish()``
  once the whole body is in, or ``abort(keep)`` when the transfer failed.
* :meth:`Sink.publish` makes a batch of finished rows visible (the file sink
  renames parts into place; a memory sink hands bodies to the consumer) and
  says which of them failed doing so.

Writers are native classes under mypyc (``Writer`` is their base), so the
per-read ``write`` is one vtable call, as cheap as the direct call it replaced.
"""

from __future__ import annotations

from typing import Any, Protocol

from swarmget.errors import ErrorCode, TransferError

# How an Assignment crosses a process pipe (a tuple pickles several times faster
# than an object): the fields of Assignment, in order.
AssignmentTuple = tuple[
    int, int, str, str | None, str | None, str | None, int | None, int, str | None, int | None
]


class Hasher(Protocol):
    def update(self, data: memoryview | bytes, /) -> None: ...
    def hexdigest(self) -> str: ...


class Assignment:
    """One planned row: what to fetch, what the result must match, where it goes."""

    __slots__ = (
        "index", "key", "md5", "path", "resume_from", "sha256", "size", "total", "url", "validator",
    )  # fmt: skip

    def __init__(
        self,
        index: int,
        key: int,
        url: str,
        path: str | None = None,
        sha256: str | None = None,
        md5: str | None = None,
        size: int | None = None,
        resume_from: int = 0,
        validator: str | None = None,
        total: int | None = None,
    ) -> None:
        self.index = index  # position in the input
        self.key = key  # the row's identity across runs (see sinks/plan.py)
        self.url = url
        self.path = path  # output path relative to the output dir (file sink)
        self.sha256 = sha256
        self.md5 = md5
        self.size = size
        self.resume_from = resume_from  # bytes of a kept part to continue with Range
        self.validator = validator  # the ETag / Last-Modified the kept part came with
        # The file's length when the kept part began (None: not known): a rerun
        # whose server now tells another length (a 416, a 206) is not spliced on.
        self.total = total

    def as_tuple(self) -> AssignmentTuple:
        return (
            self.index, self.key, self.url, self.path, self.sha256, self.md5, self.size,
            self.resume_from, self.validator, self.total,
        )  # fmt: skip

    @staticmethod
    def from_tuple(fields: AssignmentTuple) -> Assignment:
        index, key, url, path, sha256, md5, size, resume_from, validator, total = fields
        return Assignment(index, key, url, path, sha256, md5, size, resume_from, validator, total)

    def expected_digests(self) -> dict[str, str]:
        digests = {}
        if self.sha256:
            digests["sha256"] = self.sha256
        if self.md5:
            digests["md5"] = self.md5
        return digests

    def __repr__(self) -> str:
        return f"<Assignment {self.index} {self.url} -> {self.path}>"


class Writer:
    """The body of one response on its way to the sink.

    ``hashers`` (name -> hashlib object) see every byte, so checksums are
    verified while streaming, not by reading the result again.  ``payload`` is
    what :meth:`Sink.publish` hands on with the row's result, for sinks whose
    rows go somewhere other than a file (the streaming iterator's bodies).
    """

    __slots__ = ("hashers", "payload", "written")

    def __init__(self, hashers: dict[str, Hasher] | None = None) -> None:
        self.hashers = hashers
        self.written = 0  # body bytes so far, including a continued part's
        self.payload: object = None

    def write(self, data: memoryview | bytes) -> None:
        raise NotImplementedError

    def _hash(self, data: memoryview | bytes) -> None:
        """Feed ``data`` to every hasher (each writer calls this with what it wrote)."""
        hashers = self.hashers
        if hashers is not None:
            for hasher in hashers.values():
                hasher.update(data)

    def finish(self) -> None:
        """The whole body is in: release what writing needed (not yet visible)."""
        raise NotImplementedError

    def abort(self, keep: bool = False) -> None:
        """The transfer failed: drop the bytes, or ``keep`` them to continue later."""
        raise NotImplementedError

    def holds_version(self, validator: str | None) -> None:
        """A whole body begins, before its first byte: it is of the version
        ``validator`` names (None: of none a later request could continue).  A
        resumable sink keeps this with the bytes (sinks/files.py)."""

    def digests(self) -> dict[str, str]:
        return {name: h.hexdigest() for name, h in (self.hashers or {}).items()}

    def verify(self, size: int | None, expected: dict[str, str]) -> None:
        """Raise ``size_mismatch`` / ``checksum`` when the body is not what the row says."""
        if size is not None and self.written != size:
            raise TransferError(
                ErrorCode.SIZE_MISMATCH, f"got {self.written} bytes, the input says {size}"
            )
        if not expected:
            return
        actual = self.digests()
        for name, want in expected.items():
            if actual.get(name) != want:
                raise TransferError(
                    ErrorCode.CHECKSUM, f"{name} is {actual.get(name)}, the input says {want}"
                )


class Sink:
    """Where the engine's bytes go (worker side).  See the module docstring."""

    # Can a failed or interrupted body be kept and continued with Range later?
    resumable = False
    # Is the caller's own function running inside this sink now (a stream's
    # ``map``, sinks/memory.py)?  A stop signal then interrupts it at once
    # (parallel/worker.py): nothing of ours is half done while it runs.
    mapping = False
    # Set by that stop signal: a caller's function about to start does not (the
    # signal may have come just before it, between two of them).
    stop_requested = False
    # A KeyboardInterrupt inside map is a stop only when stop_requested says so:
    # set in a worker process, where SIGINT is ignored (Ctrl-C is the driver's).
    stops_by_request = False

    def open(
        self, job: Assignment, start: int, length: int | None, hashers: dict[str, Hasher] | None
    ) -> Writer:
        """A writer for ``job``'s body from byte ``start``; ``length``: the bytes the
        response announces (None: unknown).  Raises TransferError (io...)."""
        raise NotImplementedError

    def publish(self, done: list[tuple[Assignment, Writer]]) -> list[TransferError | None]:
        """Make finished rows visible; one entry per row: None, or why it failed."""
        raise NotImplementedError

    def drop_part(self, job: Assignment) -> None:
        """Remove what the sink kept to continue ``job`` (a part from an earlier
        attempt or run, not open now): nothing may continue it.  Only a
        resumable sink keeps anything."""

    @property
    def busy(self) -> bool:
        """Work the sink still has after its rows were reported (map, sinks/memory.py)."""
        return False

    def events_for(self, events: Any, loop: Any) -> Any:
        """The events the engine should report to (a sink may stand in between)."""
        return events

    def release(self, token: int) -> None:
        """The driver is done with a payload this sink handed on (see sinks/memory.py)."""

    def close(self) -> None:
        pass
