"""The ``swarmget`` command: parse arguments, run the engine, report the outcome.

The contract scripts rely on is the exit status and the shape of the error
line, so both are kept strict:

* 0 every row succeeded, 1 some row failed, 2 usage error, 130 interrupted
  (Ctrl-C), 143 stopped by SIGTERM, 129 by SIGHUP.
* A usage error is ONE line on stderr, ``swarmget: error: ...``, never a
  traceback and never argparse's multi-line usage dump: in a log of a thousand
  jobs, the line that says what went wrong is the only one anybody reads.

Everything that can be checked before the run starts (option values, source
files that do not exist, ``-o`` pointing at a file) is checked here, so a typo
fails in milliseconds instead of after the progress display has come up.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any, NoReturn

import swarmget
from swarmget import __version__
from swarmget.errors import ErrorCode, SwarmgetError, TransferError, UsageError
from swarmget.options import (
    EMPTY_FIELD,
    SECRET_FIELDS,
    Options,
    check_header,
    check_output_dir,
    combine_headers,
)
from swarmget.options import parse_size as options_parse_size
from swarmget.parallel import interrupts
from swarmget.progress import make_progress, summary_lines
from swarmget.report import ProgressListener, Report
from swarmget.sources.reader import directory_hint, missing_path_hint
from swarmget.sources.rows import Row, hide_password

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C

MANIFEST = os.path.join(".swarmget", "manifest.jsonl")
JOURNAL = os.path.join(".swarmget", "journal.sqlite3")

# One line per stable code, for --help.  tests/test_cli.py checks that every
# code in ErrorCode.ALL is here, so a new code cannot ship undocumented.
ERROR_CODE_HELP: dict[str, str] = {
    ErrorCode.TIMEOUT: "connect or idle-read timeout, deadline, or below --min-speed",
    ErrorCode.CONNECT: "refused, unreachable, or reset before any response (origin or proxy)",
    ErrorCode.DNS: "the host name did not resolve",
    ErrorCode.TRUNCATED: "the connection ended before the body was complete",
    ErrorCode.PROTOCOL: "malformed or over-limit HTTP response",
    ErrorCode.TOO_LARGE: "body larger than --max-size",
    ErrorCode.BAD_URL: "not an absolute http(s) URL",
    ErrorCode.BAD_PATH: "the output path would leave the output directory (or enter .swarmget)",
    ErrorCode.EXISTS: "a file swarmget did not write is at the path (--overwrite), "
    "or an input list of the run (never replaced)",
    ErrorCode.IO: "writing the output file failed (disk full, permissions)",
    ErrorCode.TLS: "TLS handshake or record-layer failure",
    ErrorCode.TLS_VERIFY: "the server's certificate failed verification",
    ErrorCode.TOO_MANY_REDIRECTS: "redirect chain too long",
    ErrorCode.BAD_REDIRECT: "redirect with no usable Location, to a non-http(s) URL, "
    "or from https to http (--allow-downgrade)",
    ErrorCode.CHECKSUM: "the body did not match the row's sha256/md5",
    ErrorCode.SIZE_MISMATCH: "the body length did not match the row's size",
    ErrorCode.CANCELLED: "(--dedupe) the row this copy shares did not finish",
    ErrorCode.BAD_ROW: "a malformed input row; its line number is in the message",
    ErrorCode.CRASHED: "the worker process downloading the row died (a rerun retries it)",
    ErrorCode.MAP_ERROR: "(Python: swarmget.stream) the map function raised, or its value "
    "did not pickle",
    "http_<status>": "the final HTTP status was not a success, e.g. http_404 "
    "(http_407: the proxy wants user:password)",
}


def parse_size(text: str) -> int:
    """A --max-size or --min-speed: ``512k`` -> 524288 (options.parse_size)."""
    try:
        return options_parse_size(text)
    except ValueError as bad:
        raise argparse.ArgumentTypeError(str(bad)) from None


def parse_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}")
    return value


def parse_header(text: str) -> tuple[str, str]:
    """As curl reads ``-H``: ``"K: V"`` -> ``("K", "V")``; ``"K:"`` -> ``("K", "")``,
    no K sent at all (not even ours: ``"User-Agent:"``); ``"K;"`` -> K sent empty.
    The name must be an HTTP token, the value one line."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep and name.endswith(";"):
        name, sep, value = name[:-1].rstrip(), ";", EMPTY_FIELD
    if not sep:
        first = name.split(maxsplit=1)[0] if name else ""
        shown = f"{first} ***" if first.lower() in SECRET_FIELDS else text
        raise argparse.ArgumentTypeError(
            f"invalid header {shown!r} (expected 'Name: value', 'Name:' or 'Name;')"
        )
    try:
        check_header(name, value)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return name, value


def parse_user_agent(text: str) -> str:
    try:
        check_header("User-Agent", text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


class _Exit(Exception):
    """argparse wants to exit (``--help``, ``--version``): carry the status out of main."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and calling ``sys.exit``.

    ``main`` turns the exception into the one-line error and exit status 2, and
    tests can call ``main`` in-process without catching ``SystemExit``.
    """

    lost: str | None = None  # what could not be written to stdout (--help, --version)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            say(message, sys.stderr)
        if status == 0 and self.lost:
            # As for the summary: a script asking for the help or the version must
            # not take silence (a full disk, a closed stdout) for it.
            raise _Exit(fail(f"cannot write {self.lost} to stdout", EXIT_FAILED))
        raise _Exit(status)

    def print_help(self, file: Any = None) -> None:  # argparse: SupportsWrite[str]
        # argparse's own writing drops an OSError and leaves the rest to the
        # flush at exit, which fails with "Exception ignored" and status 120.
        if not say(self.format_help(), file or sys.stdout):
            self.lost = "the help"


class _VersionAction(argparse.Action):
    """``--version``, with the build that runs.  Which build that is is only
    looked up when asked: it imports the engine, which ``--help`` and a usage
    error have no need for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0,
            help="show the version and the build (compiled or pure Python), then exit",
        )  # fmt: skip

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        build = "compiled" if swarmget.compiled() else "pure Python"
        if not say(f"swarmget {__version__} ({build})\n", sys.stdout):
            setattr(parser, "lost", "the version")  # noqa: B010 (any ArgumentParser)
        parser.exit()


def _epilog() -> str:
    codes = "\n".join(f"  {code:<20}{text}" for code, text in ERROR_CODE_HELP.items())
    return f"""\
sources:
  A SOURCE is a URL list file (.txt with one URL per line, .csv/.tsv, .jsonl,
  or .parquet with swarmget[datasets]), "-" to read such a list from standard
  input (Parquet only when stdin is a file), or a URL given directly.
  Sources and options may come in any order; after "--" every argument is a
  source.  An option given twice counts as last given, as in curl (a wrapper's
  defaults can be overridden); --header and --dns-server add up.  To download
  a URL list file literally named "demo", write ./demo.

sizes:
  --max-size and --min-speed take a number of bytes with an optional suffix
  k, M, G or T in powers of 1024: 512k, 10M, 1.5G (rounded to whole bytes:
  0.1k is 102; without a suffix a fraction, 0.5 or 1.5, is an error).

output:
  Files go under DIR ("-o -" is refused: it is not stdout; ./- is a directory).
  Every input row, ok or failed, gets one record in
  DIR/{MANIFEST.replace(os.sep, "/")}, with its error code when it failed.
  An interrupted run records the rows that finished (and, as "partial", those
  whose part it kept); running the same command again does the rest.

exit status:
  0    every file was downloaded
  1    at least one file failed (see the summary and the manifest)
  2    usage error: bad option or value, unreadable input, missing -o,
       an output dir another swarmget run is using
  130  interrupted (Ctrl-C); rows that finished are already in the manifest
  143  stopped by SIGTERM (a scheduler, `kill`): the same as Ctrl-C
  129  stopped by SIGHUP (the terminal closed): the same as Ctrl-C

error codes (in the summary, in --json and in the manifest):
{codes}

demo:
  swarmget demo [--files N] [--size BYTES] ...   download from a built-in local
  server and verify the files; see swarmget demo --help.
"""


@dataclasses.dataclass(frozen=True, slots=True)
class Flag:
    """One command-line flag for one :class:`~swarmget.Options` field.

    ``help`` may say ``{default}``: the field's default, from Options itself,
    so the two can never disagree.
    """

    field: str
    help: str
    metavar: str | None = None
    parse: Callable[[str], Any] | None = int  # None: a switch (store_true)
    group: str = "transfer options"
    repeat: bool = False  # may be given several times (a list)
    name: str = ""  # the flag, when not --FIELD-WITH-DASHES

    @property
    def flag(self) -> str:
        return self.name or "--" + self.field.replace("_", "-")


_TLS = "TLS (https URLs)"
_PROXIES = "proxies"
FLAGS: tuple[Flag, ...] = (
    Flag("concurrency", "connections open at once, in total (default: {default})", "N"),
    Flag(
        "workers",
        "processes, each with its own event loop and its share of --concurrency and "
        "--per-host, never more than --per-host; 0 (the default): $SWARMGET_WORKERS, "
        "else one per CPU",
        "N",
    ),
    Flag("per_host", "connections open at once to one host (default: {default})", "N"),
    Flag(
        "timeout",
        "seconds to look a name up, to connect, and of silence while reading "
        "(default: {default:g})",
        "S",
        parse_seconds,
    ),
    Flag(
        "deadline",
        "seconds one file may take in total, its name lookup included, strictly "
        f"(default: {Options.AUTO_DEADLINE:g}, or for a body announced longer than "
        f"that takes at {Options.AUTO_DEADLINE_RATE // 1024} KiB/s, the time it takes "
        "at that rate)",
        "S",
        parse_seconds,
    ),
    Flag(
        "min_speed",
        "bytes/s a transfer must average over 30 s, 0 to disable (default: {default})",
        "B",
        parse_size,
    ),
    Flag(
        "max_size",
        "fail files larger than this with too_large; k, M, G, T are powers of 1024 "
        "(10M, 10MB, 10MiB, 10Mi) (default: no limit)",
        "BYTES",
        parse_size,
    ),
    Flag(
        "retries",
        "extra attempts after a retryable failure; a transfer cut for slowness "
        "(--min-speed, or silent for --timeout) gets one at most (default: {default})",
        "N",
    ),
    Flag(
        "host_failures",
        "give a host up after N failed connections (connect errors or timeouts) in a row, "
        "or N rows in a row refused with 429 Too Many Requests, failing its remaining rows at "
        "once; 0: never (default: {default})",
        "N",
    ),
    Flag(
        "headers",
        "send this request header; repeat for more (a name given twice is sent once, "
        "its values joined by ', ', or the last one for a field of one value: Host, "
        "Authorization, User-Agent, Referer...). As with curl, 'K:' sends no K, not even "
        "swarmget's own (User-Agent, Accept), and 'K;' sends K empty (default: none)",
        '"K: V"',
        parse_header,
        repeat=True,
        name="--header",
    ),
    Flag("user_agent", "User-Agent header (default: {default})", "UA", parse_user_agent),
    Flag(
        "dns_servers",
        "ask this name server (IP, IP:PORT or [IPv6]:PORT) instead of the system's; "
        "repeat for more (default: /etc/resolv.conf)",
        "ADDR",
        str,
        repeat=True,
        name="--dns-server",
    ),
    Flag(
        "overwrite",
        "redo every row and replace files already in DIR, even ones swarmget did not write, "
        "but never an input list (default: off: rows already done are skipped, foreign "
        "files fail with 'exists')",
        parse=None,
    ),
    Flag(
        "dedupe",
        "fetch each distinct URL once; the other rows with the same URL get a hard link "
        "(a copy where links are impossible) and a record of their own (default: off)",
        parse=None,
    ),
    Flag("max_redirects", "follow at most N redirects per file (default: {default})", "N"),
    Flag(
        "allow_downgrade",
        "follow redirects from https to http (default: refused with bad_redirect)",
        parse=None,
    ),
    Flag(
        "hash",
        "record each file's digest in the manifest: sha256 or md5, for the files this "
        "run downloads (rows skipped as done keep their record; --overwrite redoes "
        "them) (default: none; sha256/md5 columns in the input are always verified)",
        "ALGO",
        str,
    ),
    Flag(
        "cacert",
        "also trust the CA certificate(s) in this PEM file (default: the system store, "
        "or SSL_CERT_FILE / SSL_CERT_DIR when set)",
        "FILE",
        str,
        _TLS,
    ),
    Flag(
        "insecure",
        "do not verify server certificates or host names; warns once (default: verify)",
        parse=None,
        group=_TLS,
    ),
    Flag(
        "proxy",
        "send requests through this http proxy, http://[user:password@]host[:port] (port "
        "1080 if omitted; user:password for Basic auth): http URLs are forwarded to it, "
        "https URLs tunnelled with CONNECT; '' for no proxy (default: $http_proxy for http "
        "URLs, $https_proxy for https URLs, else $all_proxy; lower case wins over upper case)",
        "URL",
        str,
        _PROXIES,
    ),
    Flag(
        "no_proxy",
        "comma-separated hosts to reach directly, as curl's --noproxy: a name also covers "
        "its subdomains; IPs, CIDR ranges (10.0.0.0/8) and host:port work; '*' means no "
        "proxy at all. localhost is proxied unless listed (default: $no_proxy or $NO_PROXY)",
        "HOSTS",
        str,
        _PROXIES,
    ),
)


def build_parser() -> ArgumentParser:
    d = Options()
    parser = ArgumentParser(
        prog="swarmget",
        usage="swarmget [options] -o DIR SOURCE [SOURCE ...]\n       swarmget demo [options]",
        description="Download very many files over HTTP(S) into DIR.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # "*": parse_command_line requires one, counting those after "--" too.
    parser.add_argument("sources", nargs="*", metavar="SOURCE", help="URL list file, -, or URL")
    parser.add_argument(
        "-o", "--output", required=True, metavar="DIR", help="output directory (required)"
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for flag in FLAGS:
        group = groups.get(flag.group)
        if group is None:
            group = groups[flag.group] = parser.add_argument_group(flag.group)
        default = getattr(d, flag.field)
        text = flag.help.format(default=default)
        if flag.parse is None:
            group.add_argument(flag.flag, dest=flag.field, action="store_true", help=text)
        elif flag.repeat:
            group.add_argument(
                flag.flag, dest=flag.field, type=flag.parse, action="append", default=[],
                metavar=flag.metavar, help=text,
            )  # fmt: skip
        else:
            group.add_argument(
                flag.flag, dest=flag.field, type=flag.parse, default=default,
                metavar=flag.metavar, help=text,
            )  # fmt: skip
    add_output_flags(parser)
    parser.add_argument("--version", action=_VersionAction)
    return parser


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    """``--quiet`` and ``--json``, shared with ``swarmget demo``."""
    out = parser.add_argument_group("display")
    out.add_argument(
        "-q", "--quiet", action="store_true", help="no progress display and no summary"
    )
    out.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON on stdout instead of the summary (also with --quiet)",
    )


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The engine's keyword options, validated now so mistakes fail before the run."""
    options: dict[str, Any] = {flag.field: getattr(args, flag.field) for flag in FLAGS}
    options["headers"] = combine_headers(options["headers"])
    options["dns_servers"] = tuple(options["dns_servers"])
    # Raises UsageError naming the flag, or the environment variable, or the file.
    Options.from_kwargs(options).check_environment()
    return options


def check_sources(sources: Sequence[str]) -> None:
    """Fail fast on a source file that cannot be read; URLs and ``-`` are the reader's."""
    for source in sources:
        if source == "-" or "://" in source:
            continue
        shown = hide_password(source)
        if os.path.isdir(source):
            raise UsageError(f"cannot read {shown!r}: it is a directory{directory_hint(source)}")
        if not os.path.exists(source):
            raise UsageError(f"cannot read {shown!r}: no such file{missing_path_hint(source)}")
        if not os.access(source, os.R_OK):
            raise UsageError(f"cannot read {shown!r}: permission denied")


def check_output(dest: str) -> None:
    if not dest:
        raise UsageError("-o '': the output directory is an empty string")
    if dest == "-":
        # curl and wget read "-o -" as stdout; here it made a directory named "-".
        raise UsageError(
            "-o -: swarmget writes files into a directory, not to stdout "
            "(to stream bytes into a program, use swarmget.stream() in Python; "
            "for a directory named -, write ./-)"
        )
    check_output_dir(dest)
    try:
        os.makedirs(dest, exist_ok=True)  # now: a path no directory can be made at is a usage error
    except FileExistsError:  # with exist_ok: something other than a directory is there
        raise UsageError(f"-o {dest!r} exists and is not a directory") from None
    except OSError as exc:
        raise UsageError(f"-o {dest!r}: cannot create the directory: {exc.strerror}") from None
    # Written in: the run's state directory if a run left one (a read-only output
    # directory around a writable one of ours still works), else the directory.
    state = os.path.join(dest, ".swarmget")
    if not os.access(state if os.path.isdir(state) else dest, os.W_OK | os.X_OK):
        raise UsageError(f"-o {dest!r}: the directory is not writable")
    if not os.access(dest, os.R_OK | os.X_OK):
        # Its files are looked for before a row claims a name (never over one
        # of someone else's): a directory that cannot be listed cannot be used.
        raise UsageError(f"-o {dest!r}: the directory cannot be read")


def run_engine(
    urls: Iterable[str | Row] | None,
    dest: str,
    *,
    sources: Sequence[str] | None,
    progress: ProgressListener,
    options: dict[str, Any],
) -> Report:
    """The one place the CLI calls the engine (tests replace it with a fake)."""
    from swarmget.api import download

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CLI says it its own way (see _download_command)
        return download(urls, dest, sources=sources, progress=progress, **options)


def download_with_display(
    urls: Iterable[str | Row] | None,
    dest: str,
    *,
    sources: Sequence[str] | None,
    options: dict[str, Any],
    quiet: bool,
    stderr: IO[str],
) -> Report:
    """Run the engine under the progress display, and leave the terminal tidy however it ends."""
    display = make_progress(stderr, quiet=quiet)
    try:
        return run_engine(urls, dest, sources=sources, progress=display, options=options)
    finally:
        display.close()


def print_outcome(
    report: Report,
    dest: str,
    *,
    quiet: bool,
    as_json: bool,
    stdout: IO[str] | None,
    stopped: str | None = None,
) -> bool:
    """The summary (or ``--json``) on ``stdout``; False if it could not be written.

    ``stopped``: why the run ended before its last row ("SIGINT", "SIGTERM",
    "SIGHUP", "error", "input"), None when it ran to the end.  The JSON says it:
    without it, a run stopped by Ctrl-C after one good row read ``"failed": 0``,
    the same as a whole run done, to a script that reads stdout through a pipe
    (where the exit status is the last command's)."""
    if as_json:
        return say(json.dumps({**report.to_json(), "stopped": stopped}) + "\n", stdout)
    if not quiet:
        manifest = os.path.join(dest, MANIFEST)
        return say("\n".join(summary_lines(report, manifest=manifest)) + "\n", stdout)
    return True


def say(text: str, stream: IO[str] | None) -> bool:
    """Write ``text`` to a standard stream; False if it cannot take it: closed
    (``>&-`` makes it None), its reader gone (``| head``), its disk full.  A
    message is not worth a traceback, and the downloads are done either way."""
    if stream is None:
        return False
    try:
        try:
            stream.write(text)
        except UnicodeEncodeError:
            # A locale that cannot spell a name (日本.bin under ISO-8859-1): the
            # line is written with escapes rather than lost.
            encoding = getattr(stream, "encoding", None) or "ascii"
            stream.write(text.encode(encoding, "backslashreplace").decode(encoding))
        stream.flush()
    except (OSError, ValueError):  # ValueError: a closed file object
        # Python flushes the stream again at exit; failing there too would print
        # "Exception ignored ..." and exit 120.  Its bytes go nowhere now.
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        return False
    return True


def fail(message: str, status: int = EXIT_USAGE, prog: str = "swarmget") -> int:
    """Print the one-line error and return the exit status."""
    say(f"{prog}: error: {' '.join(message.split())}\n", sys.stderr)
    return status


def _where_listed(output: str, finished: Report | None = None) -> str:
    """Where a stopped run's finished rows can be read: the manifest, if there is
    one (a full disk may not have left room to write it)."""
    manifest = os.path.join(output, MANIFEST)
    if os.path.exists(manifest):
        return f"rows that finished are listed in {manifest}"
    if not os.path.exists(os.path.join(output, JOURNAL)):
        if finished is not None and finished.ok:
            # The output dir, or its .swarmget, was removed during the run.
            return "no journal or manifest is left to list the rows that finished"
        # Stopped before the output was set up (a Ctrl-C at once): there is
        # no journal to keep anything, and nothing had finished.
        return "no row had finished"
    return "no manifest could be written (the journal keeps what finished)"


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Options and sources in any order, as curl, wget and aria2c take them:
    ``swarmget a.txt -o out b.txt`` refused ``b.txt`` when sources had to come
    in one run.  Everything after the first ``--`` is a source, even ``-x``
    (parse_intermixed_args alone refuses one there on Python < 3.12)."""
    literal: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, literal = argv[:cut], argv[cut + 1 :]
    args = parser.parse_intermixed_args(argv)
    args.sources = [*args.sources, *literal]
    if not args.sources:
        parser.error("the following arguments are required: SOURCE")
    return args


def _download_command(argv: list[str]) -> int:
    args = parse_command_line(build_parser(), argv)
    options = options_from_args(args)
    check_sources(args.sources)
    check_output(args.output)
    # SIGTERM (a scheduler preempting the job, `kill`) and SIGHUP (the terminal
    # closed) stop the run as Ctrl-C does: the manifest is written and the
    # parts are kept for the rerun.  (Only the main thread may set a handler;
    # and a signal the parent made us ignore, as nohup does, stays ignored.)
    try:
        with interrupts.StopSignalsLikeInterrupt():
            report = download_with_display(
                None,
                args.output,
                sources=args.sources,
                options=options,
                quiet=args.quiet,
                stderr=sys.stderr,
            )
    except KeyboardInterrupt as exc:
        return _stopped_by_signal(exc, args)
    except TransferError as exc:
        # Only run-stopping errors (disk full, read-only output) get here.
        return _stopped_by_error(exc.message, exc, args)
    except UsageError as exc:
        finished = getattr(exc, "report", None)
        if isinstance(finished, Report):
            return _stopped_by_input(exc, finished, args)
        raise
    except SwarmgetError as exc:
        # The machine refused the run a process or a thread (ulimit -u).
        return _stopped_by_error(str(exc), exc, args)
    if report.total + report.skipped == 0:
        say("swarmget: warning: the input has no rows: nothing to download\n", sys.stderr)
    if not print_outcome(
        report, args.output, quiet=args.quiet, as_json=args.json, stdout=sys.stdout
    ):
        # As coreutils do: the files are there, but what was asked for on
        # stdout is lost, and a script reading it must not take silence for it.
        what = "the JSON summary" if args.json else "the summary"
        return fail(f"cannot write {what} to stdout", EXIT_FAILED)
    return EXIT_OK if report.failed == 0 else EXIT_FAILED


def _stopped_by_signal(exc: KeyboardInterrupt, args: argparse.Namespace) -> int:
    """Ctrl-C, SIGTERM or SIGHUP stopped the run: say how to resume; --json
    gets what finished, as after a full disk."""
    signum = interrupts.stopped_by
    how = f"stopped by {signal.Signals(signum).name}" if signum else "interrupted"
    say(
        f"swarmget: {how}; {_where_listed(args.output)}; run the same command again to resume\n",
        sys.stderr,
    )
    if args.json:
        print_outcome(
            _finished_before_the_stop(exc, args.output), args.output, quiet=True,
            as_json=True, stdout=sys.stdout, stopped=signal.Signals(signum or signal.SIGINT).name,
        )  # fmt: skip
    return 128 + signum if signum else EXIT_INTERRUPTED


def _finished_before_the_stop(exc: BaseException, output: str) -> Report:
    """The report a stopped run carries; an empty one when it stopped before the
    run began (a Ctrl-C while the engine loaded, a disk too full to open the
    journal): nothing had finished, and --json says so rather than print
    nothing, which a script reading stdout cannot parse."""
    finished = getattr(exc, "report", None)
    if isinstance(finished, Report):
        if finished.manifest and not os.path.exists(finished.manifest):
            finished.manifest = None  # a full disk left no room for it
        return finished
    manifest = os.path.realpath(os.path.join(output, MANIFEST))
    return Report(manifest=manifest if os.path.exists(manifest) else None)


def _stopped_by_error(message: str, exc: SwarmgetError, args: argparse.Namespace) -> int:
    """A run-stopping error (a full disk, a read-only output dir, no worker
    process to be had)."""
    if exc.report is None:  # before the run began (the output dir refused)
        say(f"swarmget: error: {message}\n", sys.stderr)
    else:
        say(
            f"swarmget: error: {message}; the run stopped; "
            f"{_where_listed(args.output, exc.report)}; "
            "fix the cause and run the same command again to resume\n",
            sys.stderr,
        )
    if args.json:
        print_outcome(
            _finished_before_the_stop(exc, args.output), args.output, quiet=True,
            as_json=True, stdout=sys.stdout, stopped="error",
        )  # fmt: skip
    return EXIT_FAILED


def _stopped_by_input(exc: UsageError, finished: Report, args: argparse.Namespace) -> int:
    """The input went bad midway (a truncated .gz): the rows read before it were
    downloaded and recorded; a script reading stdout gets them too."""
    say(
        f"swarmget: error: {exc}; the rows read before it are done, {_where_listed(args.output)}\n",
        sys.stderr,
    )
    if args.json:
        print_outcome(
            finished, args.output, quiet=True, as_json=True, stdout=sys.stdout, stopped="input"
        )
    return EXIT_USAGE


def _default_child_signal() -> None:
    """SIGCHLD as the system sets it.  A program that ignores it (SIG_IGN) passes
    that on across exec, and then the kernel reaps our workers itself: the
    driver could not learn how they ended."""
    child = getattr(signal, "SIGCHLD", None)
    if child is not None and signal.getsignal(child) == signal.SIG_IGN:
        signal.signal(child, signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``swarmget`` script and ``python -m swarmget``; returns the status."""
    if argv is None:  # the process is ours (a program calling main(argv) keeps its own)
        _default_child_signal()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv[:1] == ["demo"]:
            from swarmget import demo

            return demo.main(argv[1:])
        return _download_command(argv)
    except _Exit as exit_:
        return exit_.status
    except UsageError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        # Ctrl-C outside the run itself (while parsing), or the demo's (SIGTERM, SIGHUP too).
        signum = interrupts.stopped_by
        how = f"stopped by {signal.Signals(signum).name}" if signum else "interrupted"
        say(f"swarmget: {how}\n", sys.stderr)
        return 128 + signum if signum else EXIT_INTERRUPTED
    except SwarmgetError as exc:
        return fail(str(exc), EXIT_FAILED)
