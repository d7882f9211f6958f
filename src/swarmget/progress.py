"""Progress display: a live bar on a terminal, periodic plain lines otherwise.

The engine calls :meth:`ProgressListener.update` from its event-loop thread, so
an update must cost next to nothing: every listener here first compares the
clock with the time of its last render and returns at once when it is too
soon.  Rendering happens at most ~10 times a second on a terminal and every
~2 s in plain mode, on the caller's thread; rich's own refresh thread is never
started because it would compete with the loop for the GIL all run long.

When no row has finished for ``STALL_AFTER`` seconds and something has waited
that long (``Snapshot.waiting``: a connect to a black-holed host, a server that
accepted and says nothing), the line says what instead of the files/s and ETA it
can no longer tell: ``waiting: 3 connecting to 10.0.0.7:8443 for 12 s``.  Rows
sitting out a backoff (a retry's delay, a 429's pause) are a wait too:
``waiting: 3 backing off from 10.0.0.7:8443, next try in 25 s``.

Rates come from the snapshots themselves (``Snapshot.elapsed``), not from the
clock, so a test can drive a listener with synthetic snapshots and a fake clock
and get exact output.  The clock only decides *when* to render.

The helpers at the bottom (:func:`format_bytes`, :func:`summary_lines` ...)
are shared with the CLI and ``swarmget demo`` so the live display and the final
summary speak the same units: decimal kB/MB/GB, like ``Report.mb_per_s``.
"""

from __future__ import annotations

import collections
import os
import re
import threading
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Protocol

from swarmget.report import ProgressListener, Report, Snapshot, Waiting

if TYPE_CHECKING:
    from rich.console import Console

Clock = Callable[[], float]

PLAIN_INTERVAL = 2.0  # seconds between plain lines: often enough to see life in a CI log
LIVE_INTERVAL = 0.1  # seconds between terminal renders: smooth to the eye, cheap for the loop
RATE_WINDOW = 5.0  # seconds of history behind the live rate: steady, yet follows changes
# Seconds without a finished row (and of a wait) before the line says what it waits on:
# the live rate has read 0.0 files/s by then.
STALL_AFTER = RATE_WINDOW


class Display(ProgressListener, Protocol):
    """A listener the CLI owns: it can also be torn down when a run dies (Ctrl-C)."""

    def close(self) -> None:
        """Leave the terminal tidy; safe to call twice, and after ``finish``."""
        ...


class NullProgress:
    """Shows nothing (``--quiet``, or library use without a listener)."""

    def start(self) -> None:
        pass

    def update(self, snapshot: Snapshot) -> None:
        pass

    def finish(self, report: Report) -> None:
        pass

    def close(self) -> None:
        pass


class RateMeter:
    """Files/s and bytes/s over the last ``window`` seconds of snapshots.

    A whole-run average hides a stall for minutes; an instantaneous rate jumps
    about with every batch.  A few seconds of history sits in between.
    """

    def __init__(self, window: float = RATE_WINDOW) -> None:
        self._window = window
        self._samples: collections.deque[tuple[float, int, int]] = collections.deque()

    def add(self, snapshot: Snapshot) -> tuple[float, float]:
        """Record ``snapshot``; return ``(files_per_s, bytes_per_s)``."""
        now = snapshot.elapsed
        samples = self._samples
        if not samples:
            # The run started at (0, 0, 0): the first rate is the average so far.
            samples.append((0.0, 0, 0))
        # Keep one sample older than the window so the span never collapses to zero.
        while len(samples) > 1 and now - samples[1][0] >= self._window:
            samples.popleft()
        then, done, nbytes = samples[0]
        samples.append((now, snapshot.done, snapshot.bytes))
        span = now - then
        if span <= 0:
            return 0.0, 0.0
        return (snapshot.done - done) / span, (snapshot.bytes - nbytes) / span


class StallWatch:
    """Says what a run waits on once no row has finished for ``after`` seconds.

    Times come from the snapshots (``elapsed``), as the rates do; one comparison
    per render.
    """

    def __init__(self, after: float = STALL_AFTER) -> None:
        self._after = after
        self._done = 0
        self._done_at = 0.0  # elapsed seconds when ``done`` last changed

    def waiting(self, snapshot: Snapshot) -> str | None:
        """``waiting: ...`` when the run is stalled on something, else None."""
        if snapshot.done != self._done:
            self._done, self._done_at = snapshot.done, snapshot.elapsed
            return None
        wait = snapshot.waiting
        if wait is None or snapshot.elapsed - self._done_at < self._after:
            return None
        if wait.seconds < self._after:
            return None  # rows stall, but nothing has waited long: between quick attempts
        return format_waiting(wait)


class PlainProgress:
    """One line to ``stream`` every ``interval`` seconds; for logs and pipes.

    ``swarmget: 1234/10000 files, 0 failed, 61.7 MB, 4120 files/s``.  Until the
    whole input has been read the total is a lower bound, shown as ``5000+``.
    """

    def __init__(
        self,
        stream: IO[str],
        *,
        interval: float = PLAIN_INTERVAL,
        clock: Clock = time.monotonic,
    ) -> None:
        self._stream = stream
        self._interval = interval
        self._clock = clock
        self._next = 0.0
        self._meter = RateMeter(window=interval)
        self._stall = StallWatch()
        self._last: Snapshot | None = None  # the latest update, shown or not
        self._shown = False  # whether a line was written

    def start(self) -> None:
        # The first line waits a full interval: a run that ends sooner needs no progress.
        self._next = self._clock() + self._interval

    def update(self, snapshot: Snapshot) -> None:
        self._last = snapshot
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self._interval
        files_per_s, _ = self._meter.add(snapshot)
        waiting = self._stall.waiting(snapshot)
        self._write(snapshot, waiting or format_files_rate(files_per_s))

    def finish(self, report: Report) -> None:
        """A last line with the run's totals, once lines were shown: the latest
        one was up to an interval old (a log read after a piped
        ``download(progress=True)``, which prints no summary, ended on it)."""
        if not self._shown or self._last is None:
            return  # a short run: no progress was shown, and none is due
        done = report.total + report.skipped
        final = Snapshot(
            done=done,
            failed=report.failed,
            bytes=report.received,
            elapsed=report.elapsed,
            rows_seen=max(done, self._last.rows_seen),
            input_done=self._last.input_done,
            active=0,
        )
        self._write(final, format_files_rate(report.files_per_s))

    def _write(self, snapshot: Snapshot, rate: str) -> None:
        line = (
            f"swarmget: {format_done_total(snapshot)} files, {snapshot.failed} failed, "
            f"{format_bytes(snapshot.bytes)}, {rate}\n"
        )
        self._shown = True
        try:
            self._stream.write(line)
            self._stream.flush()
        except (OSError, ValueError):
            # A closed or broken stderr must not kill a download run.
            pass

    def close(self) -> None:
        pass


class RichProgress:
    """A live one-line display on a terminal, rendered with rich.

    Rendering (text layout, ANSI output) happens inside :meth:`update` at most
    once per ``interval``.  A lock keeps a late update from the loop thread off
    a display the main thread is stopping (Ctrl-C).  The display is transient:
    when the run ends the line is wiped, and the summary printed after it is
    what stays on screen.
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        interval: float = LIVE_INTERVAL,
        clock: Clock = time.monotonic,
    ) -> None:
        # rich is imported here, not at module level: plain and quiet runs never pay for it.
        from rich.console import Console
        from rich.live import Live

        if console is None:
            console = Console(stderr=True)
        self._console = console
        self._interval = interval
        self._clock = clock
        self._next = 0.0
        self._meter = RateMeter()
        self._stall = StallWatch()
        self._lock = threading.Lock()
        self._live = Live(
            console=console,
            auto_refresh=False,
            transient=True,
            # stdout may carry --json output and is not ours to swap; stray stderr
            # writes (warnings) are routed above the bar instead of through it.
            redirect_stdout=False,
            redirect_stderr=True,
        )
        self._state = "new"  # "new" -> "live" -> "closed"

    def start(self) -> None:
        with self._lock:
            if self._state != "new":
                return
            self._live.start()
            self._state = "live"
        self._next = self._clock()

    def update(self, snapshot: Snapshot) -> None:
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self._interval
        self._render(snapshot)

    def finish(self, report: Report) -> None:
        self.close()

    def close(self) -> None:
        """Wipe the display; safe to call twice and from any thread."""
        with self._lock:
            if self._state == "live":
                self._live.stop()
            self._state = "closed"

    def _render(self, snapshot: Snapshot) -> None:
        from rich.console import RenderableType
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        files_per_s, bytes_per_s = self._meter.add(snapshot)
        total = snapshot.rows_seen if snapshot.input_done else None
        # One line, always: a wrapped live display leaves its extra lines behind
        # on every redraw.  The bar takes what room the numbers leave, up to 30
        # cells, and goes away on a very narrow terminal; the text is cut last.
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"{format_done_total(snapshot)} files", style="bold")
        text.append("  ")
        text.append(f"{snapshot.failed} failed", style="red" if snapshot.failed else "dim")
        text.append(f"  {format_bytes(snapshot.bytes)}")
        waiting = self._stall.waiting(snapshot)
        if waiting is None:
            text.append(f"  {format_files_rate(files_per_s)}  {format_bytes(bytes_per_s)}/s")
            text.append(f"  ETA {format_eta(total, snapshot.done, files_per_s)}", style="cyan")
        else:  # 0.0 files/s and no ETA tell nothing: say why instead
            text.append(f"  {format_bytes(bytes_per_s)}/s")
            text.append(f"  {waiting}", style="yellow")
        bar_width = min(30, self._console.width - text.cell_len - 1)
        line: RenderableType = text
        if bar_width >= 10:
            bar = ProgressBar(
                total=total,
                completed=snapshot.done,
                width=bar_width,
                pulse=total is None,
                animation_time=snapshot.elapsed,
            )
            grid = Table.grid(padding=(0, 1))
            grid.add_column(width=bar_width, no_wrap=True)
            grid.add_column(no_wrap=True, overflow="ellipsis")
            grid.add_row(bar, text)
            line = grid
        with self._lock:
            if self._state != "live":
                return
            self._live.update(line, refresh=True)


def make_progress(stream: IO[str] | None, *, quiet: bool = False) -> Display:
    """The listener the CLI uses: nothing, plain lines, or a live bar on a terminal.
    ``stream`` is None when the process has no stderr at all (``2>&-``, a daemon):
    then nothing, as with ``quiet``."""
    if quiet or stream is None:
        return NullProgress()
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):
        interactive = False
    # A terminal that cannot move the cursor (TERM=dumb: an editor's shell, some
    # CI consoles) gets plain lines: rich draws nothing live there.
    if interactive and os.environ.get("TERM") != "dumb":
        from rich.console import Console

        return RichProgress(Console(file=stream))
    return PlainProgress(stream)


# -- formatting shared with the summary -------------------------------------------------------


def format_done_total(snapshot: Snapshot) -> str:
    """``1234/10000``, or ``1234/5000+`` while the input is still being read."""
    suffix = "" if snapshot.input_done else "+"
    return f"{snapshot.done}/{snapshot.rows_seen}{suffix}"


def format_bytes(n: float) -> str:
    """Decimal units, like ``Report.mb_per_s``: ``999 B``, ``51.2 kB``, ``61.7 MB``."""
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1000
        if n < 1000 or unit == "TB":
            break
    return f"{n:.1f} {unit}"


def format_files_rate(files_per_s: float) -> str:
    if files_per_s >= 10:
        return f"{files_per_s:.0f} files/s"
    return f"{files_per_s:.1f} files/s"


def format_waiting(wait: Waiting) -> str:
    """``waiting: 3 connecting to 10.0.0.7:8443 for 12 s``, or for rows sitting out
    a backoff ``waiting: 3 backing off from 10.0.0.7:8443, next try in 25 s``
    (when something will happen says more than how long nothing has).  The host
    comes from the input: made printable."""
    if wait.next_try_in is not None:
        said = f"{wait.stage} {wait.host}, next try in {wait.next_try_in:.0f} s"
    else:
        said = f"{wait.stage} {wait.host} for {wait.seconds:.0f} s"
    return printable(f"waiting: {wait.count} {said}")


def format_eta(total: int | None, done: int, files_per_s: float) -> str:
    """``M:SS`` or ``H:MM:SS`` until ``total``; ``-:--`` when it cannot be known yet."""
    if total is None or files_per_s <= 0:
        return "-:--"
    seconds = round(max(total - done, 0) / files_per_s)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{seconds:02d}"
    return f"{minutes}:{seconds:02d}"


# What a terminal would act on or draw as something else: C0 (ESC starts a
# sequence that can set the window title, clear the screen or write the
# clipboard), DEL, C1, bidirectional controls, line and paragraph separators.
_UNPRINTABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def printable(text: str) -> str:
    """``text`` with what a terminal would not just show escaped (``\\x1b``): URLs
    and messages come from the input and from servers."""
    return _UNPRINTABLE.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def _clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters: a summary line is for reading (a 1 MB
    URL made a 1 MB line); the manifest has the whole of it."""
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def summary_lines(report: Report, *, manifest: str | None = None, show: int = 5) -> list[str]:
    """The human summary the CLI prints when a run ends.

    ``10000 files ok, 0 failed, 512.0 MB in 1.23 s (8130 files/s, 416.3 MB/s)``,
    then, when anything failed, a count per error code, the first ``show``
    failures and where the manifest lists them all.
    """
    lines = [
        f"{_files(report.ok)} ok, {report.failed} failed, {format_bytes(report.bytes)} "
        f"in {report.elapsed:.2f} s ({format_files_rate(report.files_per_s)}, "
        f"{format_bytes(report.mb_per_s * 1e6)}/s)"
    ]
    if report.reused:
        lines.append(
            f"{format_bytes(report.reused)} of it was already on disk (parts kept by an "
            "earlier run, --dedupe copies): not counted in the rate"
        )
    if report.skipped:
        lines.append(f"{_files(report.skipped)} skipped: already downloaded by an earlier run")
    if not report.failed:
        return lines
    counts = ", ".join(f"{code} {n}" for code, n in report.error_counts().items())
    lines.append(f"errors: {counts}")
    shown = min(show, len(report.failures))
    lines.append("failures:" if shown == report.failed else f"first {shown} failures:")
    for failure in report.failures[:show]:
        detail = failure.error or "unknown"
        if failure.message:
            detail += ": " + " ".join(failure.message.split())  # one line per failure
        lines.append(printable(f"  {_clip(failure.url, 200)} -> {_clip(detail, 300)}"))
    where = report.manifest or manifest
    if where:
        lines.append(f"every row is listed in {where}")
    return lines


def _files(count: int) -> str:
    return "1 file" if count == 1 else f"{count} files"
