"""``swarmget demo``: download N files from a local test server and check them.

It answers "how fast is this on my machine?" and "does it actually work?" in
one command with nothing to set up.  The embedded test server runs in a
*subprocess*: in-process it would share the GIL with the client's event loop
and the numbers would measure the two fighting, not the client.

The URL list is a generator, so ``--files 10000000`` costs no memory up front;
rows carry explicit output paths so the check afterwards knows where each file
landed without re-deriving the engine's URL-to-path rule.  Every file's size is
checked (a ``stat`` is cheap) and a fixed-seed sample of files, or all of them
with ``--verify-all``, is compared byte for byte with ``expected_body``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from swarmget.cli import (
    EXIT_FAILED,
    EXIT_OK,
    ArgumentParser,
    add_output_flags,
    check_output,
    download_with_display,
    fail,
    parse_size,
    say,
)
from swarmget.errors import UsageError
from swarmget.options import Options
from swarmget.parallel import interrupts
from swarmget.progress import format_bytes, summary_lines
from swarmget.report import Report
from swarmget.sources.rows import Row
from swarmget.testing import expected_body, serve_in_subprocess

DEFAULT_FILES = 10_000
DEFAULT_SIZE = 51_200  # a typical thumbnail / small image: per-file overhead dominates
SAMPLE = 200  # files compared byte for byte unless --verify-all
SHOW_PROBLEMS = 5
SHM = "/dev/shm"


def build_parser() -> ArgumentParser:
    d = Options()
    parser = ArgumentParser(
        prog="swarmget demo",
        description=(
            "Start a local test server in a subprocess, download --files files of "
            "--size bytes from it with the live progress display, check them against "
            "the bytes the server must have sent, and print the rates."
        ),
        epilog=(
            "exit status: 0 when every file arrived and checked out, 1 when any failed "
            "or differed, 2 for a usage error, 130 when interrupted."
        ),
    )
    parser.add_argument(
        "--files",
        type=int,
        default=DEFAULT_FILES,
        metavar="N",
        help=f"number of files (default: {DEFAULT_FILES})",
    )
    parser.add_argument(
        "--size",
        type=parse_size,
        default=DEFAULT_SIZE,
        metavar="BYTES",
        help=f"size of each file, suffixes k/M/G allowed (default: {DEFAULT_SIZE})",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=d.concurrency,
        metavar="N",
        help=f"connections open at once (default: {d.concurrency})",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        help=(
            "download into DIR, which must be empty or new, and keep it (default: a "
            "temporary directory, on tmpfs "
            "when there is room, removed afterwards)"
        ),
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the temporary directory and print its path"
    )
    parser.add_argument(
        "--verify-all",
        action="store_true",
        help=f"compare every file byte for byte, not a sample of {SAMPLE}",
    )
    add_output_flags(parser)
    return parser


def scratch_dir(need: int) -> str:
    """A temporary directory, on tmpfs (/dev/shm) when it has room for ``need`` bytes.

    The demo measures the client, not the disk: on a slow disk (or an overlay
    filesystem in a container) creating 10,000 files can cost more than
    downloading them.  ``-o`` is the way to measure a real disk.
    """
    try:
        fs = os.statvfs(SHM)
        roomy = fs.f_bavail * fs.f_frsize > 2 * need + (64 << 20)
        if roomy and os.access(SHM, os.W_OK):
            return tempfile.mkdtemp(prefix="swarmget-demo-", dir=SHM)
    except OSError:
        pass
    return tempfile.mkdtemp(prefix="swarmget-demo-")


def file_name(index: int, files: int) -> str:
    return f"{index:0{max(6, len(str(files - 1)))}d}.bin"


def demo_rows(base_url: str, files: int, size: int) -> Iterator[Row]:
    """The URL list, made lazily: one row at a time, as the engine asks for it.

    The URLs are what ``ProcessServer.file_url(name, size=size)`` builds, spelled
    out with an f-string: our names need no quoting, and ten million rows should
    not pay for ``urlencode`` each.
    """
    for index in range(files):
        name = file_name(index, files)
        yield Row(index=index, url=f"{base_url}/files/{name}?size={size}", path=name)


def verify(dest: str, files: int, size: int, *, failed: set[str], sample: int | None) -> list[str]:
    """Problems with the downloaded files: wrong size anywhere, wrong bytes in the sample.

    Rows the report already lists as failed are skipped; they are counted there.
    Streams over the indices, so ten million files need no list of ten million names.
    """
    problems: list[str] = []
    if sample is None or sample >= files:
        to_check: range | set[int] = range(files)
    else:
        to_check = set(random.Random(0).sample(range(files), sample))
    for index in range(files):
        name = file_name(index, files)
        if name in failed:
            continue
        path = os.path.join(dest, name)
        try:
            actual = os.stat(path).st_size
        except OSError as exc:
            problems.append(f"{name}: {exc.strerror}")
            continue
        if actual != size:
            problems.append(f"{name}: {actual} bytes, expected {size}")
        elif index in to_check:
            with open(path, "rb") as f:
                if f.read() != expected_body(name, size):
                    problems.append(f"{name}: content differs from what the server sent")
    return problems


def _check_empty(dest: str) -> None:
    """The demo writes its own files, under names of its own, into ``-o DIR``:
    into a directory with files in it, it would replace the user's (it ran with
    --overwrite) or, run again, name its files around the last run's
    (``000000-1.bin``) and check the old ones."""
    check_output(dest)  # named, and a directory (made if it was not there)
    if os.listdir(dest):
        raise UsageError(f"-o {dest!r}: the demo needs an empty or new directory")


def failed_names(report: Report) -> set[str]:
    return {failure.url.rsplit("/", 1)[-1].split("?", 1)[0] for failure in report.failures}


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.files < 1:
        raise UsageError("--files must be at least 1")
    options: dict[str, Any] = {"concurrency": args.concurrency}
    Options.from_kwargs(options)
    if args.output is not None:
        _check_empty(args.output)
    talk = not (args.quiet or args.json)
    dest = args.output or scratch_dir(args.files * args.size)
    remove = args.output is None and not args.keep
    stdout_ok = True  # every line so far reached stdout
    try:
        with interrupts.StopSignalsLikeInterrupt(), serve_in_subprocess() as server:
            if talk:
                # A stdout that cannot take it (a full disk, `| head`) does not
                # stop the demo; the summary at the end says so.
                stdout_ok = say(
                    f"swarmget demo: {args.files} files of {format_bytes(args.size)} "
                    f"from {server.base_url} into {dest}\n",
                    sys.stdout,
                )
            report = download_with_display(
                demo_rows(server.base_url, args.files, args.size),
                dest,
                sources=None,
                options=options,
                quiet=args.quiet,
                stderr=sys.stderr,
            )
        problems = verify(
            dest,
            args.files,
            args.size,
            failed=failed_names(report),
            sample=None if args.verify_all else SAMPLE,
        )
    finally:
        if remove:
            shutil.rmtree(dest, ignore_errors=True)
    if report.total != args.files:
        problems.insert(0, f"the report covers {report.total} rows, expected {args.files}")
    checked = args.files if args.verify_all else min(SAMPLE, args.files)
    if args.json:
        data = report.to_json()
        if remove:
            data["manifest"] = None  # it went with the temporary directory
        data["demo"] = {
            "files": args.files,
            "size": args.size,
            "verified": checked,
            "problems": problems[:1000],
            "output": None if remove else dest,
        }
        if not say(json.dumps(data) + "\n", sys.stdout):
            return fail("cannot write the JSON summary to stdout", EXIT_FAILED)
    elif talk:
        lines = summary_lines(report)
        lines.append(
            f"verified {checked} of {args.files} files byte for byte and the size of all: "
            + (f"{len(problems)} problems" if problems else "all good")
        )
        lines += [f"  {problem}" for problem in problems[:SHOW_PROBLEMS]]
        if not remove:
            lines.append(f"files kept in {dest}")
        if not (say("\n".join(lines) + "\n", sys.stdout) and stdout_ok):
            return fail("cannot write the summary to stdout", EXIT_FAILED)
    return EXIT_OK if report.failed == 0 and not problems else EXIT_FAILED
