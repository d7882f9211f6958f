"""What happened: one :class:`FileResult` per input row, summed up in a :class:`Report`."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from swarmget.errors import UsageError

_FIELDS = (
    "url", "path", "status", "http_status", "bytes", "error", "attempts", "elapsed_ms",
    "message", "digests", "final_url", "index", "key", "payload", "reused",
)  # fmt: skip


class FileResult:
    """One manifest record (``<out>/.swarmget/manifest.jsonl`` holds one per row).

    A plain class rather than a dataclass: one is made per row, and under
    mypyc a hand-written ``__init__`` is native code where a dataclass's is
    generated Python.  It compares, prints and pickles like the dataclass it was.
    """

    __slots__ = _FIELDS

    def __init__(
        self,
        url: str,
        path: str | None,  # relative to the output dir; None when the row failed
        status: str,  # "ok" | "failed"
        http_status: int | None = None,
        bytes: int = 0,
        error: str | None = None,  # a stable code from ErrorCode or http_<n>
        attempts: int = 0,
        elapsed_ms: int = 0,
        message: str | None = None,  # human-readable detail for a failure
        digests: dict[str, str] | None = None,  # e.g. {"sha256": "..."} with --hash
        final_url: str | None = None,  # where redirects led, when not ``url``
        index: int = -1,  # the row's position in the input
        key: int = -1,  # the row's identity across runs (sinks/plan.py); not recorded
        payload: Any = None,  # what a sink hands on (a stream's body); not recorded
        reused: int = 0,  # of ``bytes``, those not received now (a kept part, a link); not recorded
    ) -> None:
        self.url = url
        self.path = path
        self.status = status
        self.http_status = http_status
        self.bytes = bytes
        self.error = error
        self.attempts = attempts
        self.elapsed_ms = elapsed_ms
        self.message = message
        self.digests = digests
        self.final_url = final_url
        self.index = index
        self.key = key
        self.payload = payload
        self.reused = reused

    def __reduce__(self) -> tuple[type[FileResult], tuple[Any, ...]]:
        # Spelled out, in _FIELDS' order: one is pickled per row that a worker
        # reports, and getattr by name over a generator cost 2,000 instructions.
        return (
            FileResult,
            (
                self.url, self.path, self.status, self.http_status, self.bytes, self.error,
                self.attempts, self.elapsed_ms, self.message, self.digests, self.final_url,
                self.index, self.key, self.payload, self.reused,
            ),
        )  # fmt: skip

    def _compared(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in _FIELDS[:12])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FileResult):
            return NotImplemented
        return self._compared() == other._compared()

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass was

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS[:12])
        return f"FileResult({fields})"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "index": self.index,
            "url": self.url,
            "path": self.path,
            "status": self.status,
            "http_status": self.http_status,
            "bytes": self.bytes,
            "error": self.error,
            "attempts": self.attempts,
            "elapsed_ms": self.elapsed_ms,
        }
        if self.message is not None:
            record["message"] = self.message
        if self.final_url is not None:
            record["final_url"] = self.final_url
        if self.digests:
            record.update(self.digests)
        return record


MAX_FAILURES_KEPT = 10_000


@dataclasses.dataclass(slots=True)
class Report:
    """Totals for a run, counts per error code, and the failures (the first 10,000)."""

    ok: int = 0
    failed: int = 0
    skipped: int = 0  # rows already complete from an earlier run (not counted in ok)
    bytes: int = 0
    elapsed: float = 0.0
    # The first MAX_FAILURES_KEPT failures; every one is in the manifest, and
    # error_counts() counts them all (a million failed rows must not mean a
    # million objects in memory).
    failures: list[FileResult] = dataclasses.field(default_factory=list, repr=False)
    manifest: str | None = None
    # Of ``bytes``, those this run did not receive: what parts kept by an earlier
    # run already held, and the files --dedupe linked from another row's
    # download.  Not in the transfer rate (mb_per_s).
    reused: int = 0
    _error_counts: dict[str, int] = dataclasses.field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        # Not the dataclass default: printing a report of a million rows must not
        # print up to ten thousand failures.  They are in .failures and the manifest.
        errors = ", ".join(f"{code}: {n}" for code, n in self.error_counts().items())
        return (
            f"Report(ok={self.ok}, failed={self.failed}, skipped={self.skipped}, "
            f"bytes={self.bytes}, elapsed={self.elapsed:.3f}, errors={{{errors}}}, "
            f"manifest={self.manifest!r})"
        )

    @property
    def total(self) -> int:
        return self.ok + self.failed

    @property
    def files_per_s(self) -> float:
        return self.total / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def received(self) -> int:
        """Body bytes of the files done that came over the network in this run."""
        return self.bytes - self.reused

    @property
    def mb_per_s(self) -> float:
        """The run's transfer rate: bytes received in this run (not a resumed part's
        bytes from an earlier run: 2 GB resumed of 4 GB is not twice the speed;
        nor a --dedupe copy's)."""
        return self.received / 1e6 / self.elapsed if self.elapsed > 0 else 0.0

    def add(self, result: FileResult) -> None:
        if result.ok:
            self.ok += 1
            self.bytes += result.bytes
            self.reused += result.reused
        else:
            self.failed += 1
            if len(self.failures) < MAX_FAILURES_KEPT:
                self.failures.append(result)
            key = result.error or "unknown"
            self._error_counts[key] = self._error_counts.get(key, 0) + 1

    def merge(self, other: Report) -> None:
        """Add another process's report of the same run to this one."""
        self.ok += other.ok
        self.failed += other.failed
        self.skipped += other.skipped
        self.bytes += other.bytes
        self.reused += other.reused
        room = MAX_FAILURES_KEPT - len(self.failures)
        self.failures.extend(other.failures[: max(0, room)])
        for code, count in other._error_counts.items():
            self._error_counts[code] = self._error_counts.get(code, 0) + count

    def error_counts(self) -> dict[str, int]:
        """Failures per error code (all of them), most frequent first."""
        return dict(sorted(self._error_counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "failed": self.failed,
            "skipped": self.skipped,
            "total": self.total,
            "bytes": self.bytes,
            "reused_bytes": self.reused,
            "elapsed_s": round(self.elapsed, 3),
            "files_per_s": round(self.files_per_s, 1),
            "mb_per_s": round(self.mb_per_s, 2),
            "errors": self.error_counts(),
            "failures": [f.to_json() for f in self.failures[:1000]],
            "manifest": self.manifest,
        }


# Not frozen: worker processes pickle it into Progress, and a frozen dataclass
# compiled by mypyc cannot be unpickled (FrozenInstanceError on setattr).
@dataclasses.dataclass(slots=True)
class Waiting:
    """What a run has waited on longest: ``count`` requests at one ``stage`` on one
    ``host``, the oldest of them silent for ``seconds``.  A progress display shows
    it when no row has finished for a while (``0.0 files/s`` says nothing of why).

    ``stage`` reads after the count: "3 connecting to", "1 in TLS handshake with".

    Rows waiting out a backoff (a retry's delay, a host's 429 pause) wait on no
    connection: ``seconds`` is how long they have waited so far, ``next_try_in``
    how long until the first of them goes out (None for a wait on a connection).
    Without them a run whose rows all sat out a ``Retry-After`` showed a frozen
    line with no reason given.
    """

    count: int
    stage: str
    host: str  # host[:port] as in messages
    seconds: float
    next_try_in: float | None = None


def longest_waiting(waits: list[Waiting | None]) -> Waiting | None:
    """The longest wait of several engines (worker processes), its count summed
    over those waiting at the same stage on the same host."""
    longest: Waiting | None = None
    for wait in waits:
        if wait is not None and (longest is None or wait.seconds > longest.seconds):
            longest = wait
    if longest is None:
        return None
    count = 0
    next_try_in = longest.next_try_in
    for wait in waits:
        if wait is not None and (wait.stage, wait.host) == (longest.stage, longest.host):
            count += wait.count
            if wait.next_try_in is not None and next_try_in is not None:
                next_try_in = min(next_try_in, wait.next_try_in)  # the soonest of all
    return Waiting(count, longest.stage, longest.host, longest.seconds, next_try_in)


@dataclasses.dataclass(slots=True, frozen=True)
class Snapshot:
    """Progress so far, handed to a progress listener a few times a second."""

    done: int  # rows finished: ok, failed, or skipped as already done
    failed: int
    bytes: int  # body bytes received so far (including files still in flight)
    elapsed: float  # seconds since the run started
    rows_seen: int  # rows read from the input so far
    input_done: bool  # True once the whole input has been read (rows_seen is the total)
    active: int  # transfers in flight
    waiting: Waiting | None = None  # what has waited longest, if anything


class ProgressListener(Protocol):
    """What the engine reports to.  ``start`` once, ``update`` often, ``finish`` once."""

    def start(self) -> None: ...

    def update(self, snapshot: Snapshot) -> None:
        """Called from the loop thread a few times a second; must never block."""
        ...

    def finish(self, report: Report) -> None: ...


def check_progress(value: object) -> None:
    """``progress=`` must be True, False, None or a :class:`ProgressListener`: a
    string or a number was taken for a listener, and its missing ``start``
    failed the run after the output dir was locked."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, type):
        # The class has the methods too, unbound: start() failed mid-run.
        raise UsageError(
            f"progress must be a listener object, not the class {value.__name__}: "
            f"pass {value.__name__}()"
        )
    if all(callable(getattr(value, name, None)) for name in ("start", "update", "finish")):
        return
    raise UsageError(
        f"progress must be True, False or a listener with start, update and finish, not {value!r}"
    )
