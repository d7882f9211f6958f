"""The ``swarmget`` command line: parsing, exit statuses, output, and ``swarmget demo``.

Most tests run ``main()`` in-process with the engine replaced by a fake, so they
check the CLI alone.  A few run ``python -m swarmget`` in a subprocess, because
"one line and no traceback" is about what a user's terminal really shows; and
the end-to-end tests at the bottom use the real engine and test server.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

import swarmget
from swarmget import cli
from swarmget.errors import ErrorCode, UsageError
from swarmget.options import Options
from swarmget.progress import ProgressListener
from swarmget.report import FileResult, Report, Snapshot
from swarmget.sources.rows import Row
from swarmget.testing.nginx import ServedTree
from swarmget.testing.process import child_env


def run_subprocess(
    *args: str, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = child_env()
    return subprocess.run(
        [sys.executable, "-m", "swarmget", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


class FakeEngine:
    """Stands in for ``swarmget.api.download``; records how it was called."""

    def __init__(self, report: Report | None = None, raises: BaseException | None = None) -> None:
        self.report = report if report is not None else Report(ok=3, bytes=300, elapsed=0.5)
        self.raises = raises
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self,
        urls: Iterable[str | Row] | None,
        dest: str,
        *,
        sources: Sequence[str] | None,
        progress: ProgressListener,
        options: dict[str, Any],
    ) -> Report:
        self.calls.append({"urls": urls, "dest": dest, "sources": sources, "options": options})
        progress.start()
        progress.update(Snapshot(1, 0, 100, 0.1, 3, True, 2))
        if self.raises is not None:
            raise self.raises
        progress.finish(self.report)
        return self.report


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeEngine]:
    def install(report: Report | None = None, raises: BaseException | None = None) -> FakeEngine:
        fake = FakeEngine(report, raises)
        monkeypatch.setattr(cli, "run_engine", fake)
        return fake

    install()  # every test gets a fake by default: no test here may reach the network
    return install


@pytest.fixture
def urls_file(tmp_path: Path) -> str:
    path = tmp_path / "urls.txt"
    path.write_text("http://127.0.0.1:9/a\nhttp://127.0.0.1:9/b\n")
    return str(path)


# -- sizes and other value types ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("512", 512),
        ("512k", 512 * 1024),
        ("512K", 512 * 1024),
        ("10M", 10 * 1024**2),
        ("10MB", 10 * 1024**2),
        ("10MiB", 10 * 1024**2),
        ("10Mi", 10 * 1024**2),  # the IEC prefix alone: 1GiB passed and 1Gi was refused
        ("1Gi", 1024**3),
        ("3ki", 3 * 1024),
        ("1.5G", 3 * 1024**3 // 2),
        ("2t", 2 * 1024**4),
        (".5k", 512),
        (" 7 ", 7),
        ("100b", 100),
        # Fractions with a unit, rounded to whole bytes; whole bytes written "1.0".
        ("1.5M", 3 * 1024**2 // 2),
        ("0.5G", 1024**3 // 2),
        ("1.0001k", 1024),
        ("1.0009k", 1025),  # rounded, not cut
        ("0.0009765625k", 1),
        ("1.0", 1),
        ("0.0M", 0),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert cli.parse_size(text) == value


@pytest.mark.parametrize(
    "text",
    # 0.5 was read as 0 (--max-size 0.5 failed every file with too_large).
    [
        "",
        "k",
        "10X",
        "-5",
        "1e6",
        "1.2.3M",
        "10 MBs",
        "nan",
        "0.5",
        "1.5",
        "0.5b",
        "0.0001k",
        "5ib",
        "5i",
        "5kbi",
    ],
)
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(Exception, match="invalid size"):
        cli.parse_size(text)


def test_parse_header() -> None:
    assert cli.parse_header("Authorization:  Bearer x:y ") == ("Authorization", "Bearer x:y")
    assert cli.parse_header("X-Empty:") == ("X-Empty", "")
    for bad in ["no colon", ": value", "Bad Name: v", "X: a\nb"]:
        with pytest.raises(Exception, match="invalid header"):
            cli.parse_header(bad)


@pytest.mark.parametrize(
    "options",
    [
        # A line break in a value sent a header of the value's choosing; a
        # character outside Latin-1 crashed the workers (every row `crashed`).
        {"user_agent": "ua\r\nX-Injected: yes"},
        {"user_agent": "snow\u2603"},
        {"headers": {"X-Ok": "v\r\nX-Injected: yes"}},
        {"headers": {"X-Name": "\u2603"}},
        {"headers": {"X-Nul": "a\x00b"}},
        {"headers": {"Bad Name": "v"}},
        {"headers": [("X-List", "v")]},
        # Fields that frame a request or ask for ranges are swarmget's own.
        {"headers": {"Content-Length": "5"}},
        {"headers": {"transfer-encoding": "chunked"}},
        {"headers": {"Upgrade": "h2c"}},
        {"headers": {"Range": "bytes=0-9"}},
        {"headers": {"If-Range": '"x"'}},
        # NaN passed every range check: a NaN timeout never fired, and a NaN
        # --max-size refused every file.
        {"timeout": math.nan},
        {"deadline": math.nan},
        {"min_speed_window": math.nan},
        {"max_size": math.nan},
        {"deadline": math.inf},
    ],
)
def test_the_library_refuses_what_the_cli_refuses(options: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        Options.from_kwargs(options)


@pytest.mark.parametrize("option", ["max_size", "min_speed"])
def test_the_library_takes_sizes_as_the_cli_does(option: str) -> None:
    # max_size="10M" was "--max-size must be a whole number, not '10M'".
    for text in ["10M", "512k", "1.5G", "1000", " 7 "]:
        assert getattr(Options.from_kwargs({option: text}), option) == cli.parse_size(text)
    assert getattr(Options.from_kwargs({option: 2048}), option) == 2048
    with pytest.raises(
        UsageError, match=f"^{option}: invalid size '10X' \\(use bytes or a k/M/G/T"
    ):
        Options.from_kwargs({option: "10X"})
    with pytest.raises(UsageError, match=f"^{option}: invalid size '0.5' \\(a fraction of a"):
        Options.from_kwargs({option: "0.5"})
    with pytest.raises(UsageError, match="whole number of bytes or a size such as '10M', not True"):
        Options.from_kwargs({option: True})


def test_a_framing_header_is_a_usage_error_naming_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-o", "o", "http://127.0.0.1:9/x", "--header", "Content-Length: 5"]) == 2
    err = capsys.readouterr().err
    assert "'Content-Length: 5' cannot be given: a GET carries no body" in err
    # Host stays the user's to set (virtual hosts), as curl lets it be, and so
    # does "Connection: close" (one response per connection, for a server that
    # keeps them badly).
    assert cli.parse_header("Host: example.test") == ("Host", "example.test")
    assert cli.parse_header("Connection: close") == ("Connection", "close")


def test_header_values_outside_one_line_of_latin_1_are_refused_by_the_cli() -> None:
    assert cli.parse_header("X-Tab: a\tb \u00e9") == ("X-Tab", "a\tb \u00e9")
    for bad in ["X: \u2603", "X: a\x00b", "X: a\rb"]:
        with pytest.raises(Exception, match="invalid header"):
            cli.parse_header(bad)
    for bad in ["a\nb", "\u2603"]:
        with pytest.raises(Exception, match="invalid header"):
            cli.parse_user_agent(bad)
    assert cli.main(["-q", "--user-agent", "a\r\nX: y", "-o", "out", "http://h/x"]) == 2


@pytest.mark.parametrize(
    ("header", "shown"),
    [
        # A CR left in $TOKEN (a file saved on Windows), a NUL, a non-Latin-1
        # letter: the message printed the token whole, into the CI log.
        ("Authorization: Bearer s3cr3t\ra", "'Authorization: ***' (a line break or control "),
        ("cookie: id=s3cr3t\x01", "'cookie: ***' (a line break or control character: '\\x01' at"),
        ("Proxy-Authorization: Basic s3cr3t\u2603", "'Proxy-Authorization: ***' (only Latin-1"),
        ("Authorization Bearer s3cr3t", "'Authorization ***' (expected 'Name: value'"),
    ],
)
def test_a_bad_credential_header_is_refused_without_its_value(
    header: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["-q", "-o", "out", "http://127.0.0.1:9/x", "--header", header]) == 2
    err = capsys.readouterr().err
    assert shown in err
    assert "s3cr3t" not in err
    with pytest.raises(UsageError) as info:
        Options.from_kwargs({"headers": {"Authorization": "Bearer s3cr3t\n"}})
    assert "s3cr3t" not in str(info.value)
    # Other fields are shown as given, where the fault is.
    with pytest.raises(Exception, match=r"'X: a\\x01b' .*'\\x01' at character 2 of the value"):
        cli.parse_header("X: a\x01b")


def test_an_empty_output_directory_is_refused_not_the_current_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # an unset $OUT: `-o "$OUT"`
    assert cli.main(["-q", "-o", "", "http://127.0.0.1:9/x.bin"]) == 2
    with pytest.raises(UsageError, match="empty"):
        swarmget.download(["http://127.0.0.1:9/x.bin"], "")
    assert list(tmp_path.iterdir()) == []


# -- --help and --version -----------------------------------------------------------------------


def test_help_documents_options_defaults_exit_statuses_and_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    d = Options()
    flat = " ".join(text.split())  # argparse wraps option help anywhere
    for flag, default in [
        ("--concurrency", d.concurrency),
        ("--per-host", d.per_host),
        ("--timeout", f"{d.timeout:g}"),
        ("--min-speed", d.min_speed),
        ("--retries", d.retries),
    ]:
        assert f"{flag} " in flat
        assert f"(default: {default})" in flat
    # With none given, a long body gets longer than the hour (Options.long_file_rate).
    assert f"(default: {Options.AUTO_DEADLINE:g}, or for a body announced longer" in flat
    for flag in ["--max-size", "--header", "--overwrite", "--quiet", "--json", "-o DIR"]:
        assert flag in text
    assert "10M" in text and "1024" in text
    assert "DIR/.swarmget/manifest.jsonl" in text
    for status in ["0 ", "1 ", "2 ", "130", "143"]:
        assert f"\n  {status}" in text
    for code in ErrorCode.ALL:
        assert f"\n  {code} " in text, code
    assert "http_<status>" in text
    assert "swarmget demo" in text


def test_every_error_code_is_documented() -> None:
    assert set(cli.ERROR_CODE_HELP) == ErrorCode.ALL | {"http_<status>"}


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    build = "compiled" if swarmget.compiled() else "pure Python"
    assert capsys.readouterr().out == f"swarmget {swarmget.__version__} ({build})\n"


def test_compiled_reports_the_build_in_use() -> None:
    # ./dev runs the suite twice: on the .py files and on the mypyc build, and
    # says which through SWARMGET_EXPECT_BUILD, so a build that silently fell
    # back to plain Python (no compiler, a failed extension) is caught here.
    from swarmget.engine import connection

    compiled = swarmget.compiled()
    assert compiled == connection.__file__.endswith(".so")
    expected = os.environ.get("SWARMGET_EXPECT_BUILD")
    if expected is not None:
        assert expected in ("compiled", "pure"), expected
        assert compiled == (expected == "compiled"), connection.__file__


def test_demo_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    assert "--files" in text and "(default: 10000)" in text
    assert "--size" in text and "(default: 51200)" in text
    assert "--keep" in text


# -- usage errors -------------------------------------------------------------------------------


def usage_cases(urls: str, tmp: Path) -> list[list[str]]:
    a_file = tmp / "not-a-dir"
    a_file.write_text("x")
    return [
        [],
        [urls],  # no -o
        ["-o", str(tmp / "out")],  # no source
        [urls, "-o", str(tmp / "out"), "--bogus"],
        [urls, "-o", str(tmp / "out"), "--concurrency", "many"],
        [urls, "-o", str(tmp / "out"), "--concurrency", "0"],
        [urls, "-o", str(tmp / "out"), "--per-host", "-1"],
        [urls, "-o", str(tmp / "out"), "--timeout", "0"],
        [urls, "-o", str(tmp / "out"), "--deadline", "inf"],
        [urls, "-o", str(tmp / "out"), "--timeout", "nan"],
        [urls, "-o", str(tmp / "out"), "--max-size", "10X"],
        [urls, "-o", str(tmp / "out"), "--min-speed", "fast"],
        [urls, "-o", str(tmp / "out"), "--retries", "-1"],
        [urls, "-o", str(tmp / "out"), "--header", "NoColon"],
        [str(tmp / "missing.txt"), "-o", str(tmp / "out")],
        [str(tmp), "-o", str(tmp / "out")],  # a directory as a source
        [urls, "-o", str(a_file)],
        ["demo", "--files", "lots"],
        ["demo", "--size", "big"],
        ["demo", "--bogus"],
    ]


def test_usage_errors_are_one_line_exit_2(
    engine: Callable[..., FakeEngine],
    urls_file: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake = engine()
    for argv in usage_cases(urls_file, tmp_path):
        assert cli.main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "", argv
        assert err.count("\n") == 1 and err.startswith("swarmget: error: "), (argv, err)
        assert "Traceback" not in err
    assert fake.calls == []


def test_usage_error_from_the_engine(
    engine: Callable[..., FakeEngine], urls_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The reader finds out late that an input is malformed: still exit 2, one line.
    engine(raises=UsageError("urls.txt line 3: not valid JSON"))
    assert cli.main([urls_file, "-o", "out"]) == 2
    assert capsys.readouterr().err == "swarmget: error: urls.txt line 3: not valid JSON\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "the following arguments are required"),
        (("http://x/a", "--max-size", "12Q", "-o", "o"), "invalid size '12Q'"),
        (("no-such-file.txt", "-o", "o"), "cannot read 'no-such-file.txt'"),
    ],
)
def test_usage_error_in_a_real_process(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    proc = run_subprocess(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("swarmget: error: ")
    assert proc.stderr.count("\n") == 1
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_in_a_real_process() -> None:
    proc = run_subprocess("--help")
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: swarmget")
    assert proc.stderr == ""


@pytest.mark.parametrize(
    ("args", "what"),
    [(["--help"], "the help"), (["--version"], "the version"), (["demo", "--help"], "the help")],
)
def test_help_or_version_to_a_full_stdout_is_an_error(args: list[str], what: str) -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "swarmget", *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
            timeout=60,
        )
    assert proc.returncode == 1
    assert proc.stderr == f"swarmget: error: cannot write {what} to stdout\n"


# The script's first moments: a Ctrl-C arriving while the CLI's modules are still
# being imported.  The import is made to raise KeyboardInterrupt, as SIGINT would.
_INTERRUPTED_IMPORT = """
import builtins, sys
real = builtins.__import__
def interrupted(name, *args, **kwargs):
    if name == "swarmget.cli":
        raise KeyboardInterrupt
    return real(name, *args, **kwargs)
builtins.__import__ = interrupted
from swarmget.__main__ import run
sys.exit(run())
"""


def test_ctrl_c_while_the_script_imports_exits_130_without_a_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_IMPORT],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert proc.returncode == 130
    assert proc.stderr == "swarmget: interrupted\n"


# A Ctrl-C while the engine's modules load (the first few hundred ms of a run):
# the run had not begun, and nothing had finished.
_INTERRUPTED_ENGINE_IMPORT = """
import builtins, sys
real = builtins.__import__
def interrupted(name, *args, **kwargs):
    if name == "swarmget.api":
        raise KeyboardInterrupt
    return real(name, *args, **kwargs)
builtins.__import__ = interrupted
from swarmget.__main__ import run
sys.exit(run())
"""


def test_json_after_a_ctrl_c_before_the_run_began_is_an_empty_summary(tmp_path: Path) -> None:
    # Printed nothing: a script reading stdout with --json got no JSON to parse.
    json_to = ["-o", str(tmp_path / "out"), "--json", "-q"]
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_ENGINE_IMPORT, "http://127.0.0.1:9/a", *json_to],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert proc.returncode == 130, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["ok"], summary["failed"], summary["stopped"]) == (0, 0, "SIGINT")
    assert summary["manifest"] is None  # none was written: read_manifest would not find one


def test_importing_swarmget_loads_none_of_its_modules_until_a_name_is_used() -> None:
    code = (
        "import sys, swarmget\n"
        "before = sorted(m for m in sys.modules if m.startswith('swarmget.'))\n"
        "swarmget.Options; swarmget.read_manifest\n"
        "print(before, 'swarmget.options' in sys.modules, 'swarmget.manifest' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60
    )
    assert proc.stdout.split() == ["[]", "True", "True"], proc.stderr


# -- what reaches the engine ---------------------------------------------------------------------


def test_options_reach_the_engine(
    engine: Callable[..., FakeEngine], urls_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = engine()
    argv = [
        urls_file,
        "-",
        "https://example.com/x.jpg",
        "-o",
        "out",
        "--concurrency",
        "64",
        "--per-host",
        "8",
        "--timeout",
        "2.5",
        "--deadline",
        "60",
        "--min-speed",
        "10k",
        "--max-size",
        "1.5M",
        "--retries",
        "0",
        "--header",
        "Authorization: Bearer t",
        "--header",
        "X-A: 1",
        "--overwrite",
        "--dns-server",
        "127.0.0.1:5353",
        "--dns-server",
        "[::1]:53",
        "--insecure",
        "--dedupe",
        "--host-failures",
        "0",
    ]
    assert cli.main(argv) == 0
    (call,) = fake.calls
    assert call["urls"] is None
    assert call["dest"] == "out"
    assert call["sources"] == [urls_file, "-", "https://example.com/x.jpg"]
    assert call["options"] == {
        "dedupe": True,
        "host_failures": 0,
        "concurrency": 64,
        "per_host": 8,
        "timeout": 2.5,
        "deadline": 60.0,
        "min_speed": 10240,
        "max_size": 1572864,
        "retries": 0,
        "overwrite": True,
        "max_redirects": 10,
        "allow_downgrade": False,
        "hash": None,
        "headers": {"Authorization": "Bearer t", "X-A": "1"},
        "user_agent": Options().user_agent,
        "dns_servers": ("127.0.0.1:5353", "[::1]:53"),
        "cacert": None,
        "insecure": True,
        "workers": 0,
        "proxy": None,
        "no_proxy": None,
    }
    Options.from_kwargs(call["options"])  # the engine will accept them


def test_defaults_reach_the_engine(engine: Callable[..., FakeEngine], urls_file: str) -> None:
    fake = engine()
    assert cli.main([urls_file, "-o", "out", "-q"]) == 0
    assert Options.from_kwargs(fake.calls[0]["options"]) == Options()


def test_a_file_named_demo_is_a_source(
    engine: Callable[..., FakeEngine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = engine()
    monkeypatch.chdir(tmp_path)
    Path("demo").write_text("http://127.0.0.1:9/a\n")
    assert cli.main(["./demo", "-o", "out", "-q"]) == 0
    assert fake.calls[0]["sources"] == ["./demo"]


# -- output and exit statuses ---------------------------------------------------------------------


def failing_report() -> Report:
    report = Report(elapsed=1.0, manifest="out/.swarmget/manifest.jsonl")
    report.add(FileResult(url="http://h/ok", path="ok", status="ok", bytes=100))
    report.add(
        FileResult(
            url="http://h/gone",
            path=None,
            status="failed",
            http_status=404,
            error="http_404",
            attempts=1,
            message="Not Found",
        )
    )
    return report


def test_summary_when_all_ok(
    engine: Callable[..., FakeEngine], urls_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine(Report(ok=10000, bytes=512_000_000, elapsed=1.23))
    assert cli.main([urls_file, "-o", "out"]) == 0
    out, err = capsys.readouterr()
    assert out == "10000 files ok, 0 failed, 512.0 MB in 1.23 s (8130 files/s, 416.3 MB/s)\n"
    assert err == ""  # not a terminal, and too short for a plain progress line


def test_exit_1_and_failures_in_the_summary(
    engine: Callable[..., FakeEngine], urls_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine(failing_report())
    assert cli.main([urls_file, "-o", "out"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("1 file ok, 1 failed, 100 B in 1.00 s")
    assert "errors: http_404 1" in out
    assert "  http://h/gone -> http_404: Not Found" in out
    assert "out/.swarmget/manifest.jsonl" in out


def test_json_output_shape(
    engine: Callable[..., FakeEngine], urls_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine(failing_report())
    for extra in ([], ["--quiet"]):
        assert cli.main([urls_file, "-o", "out", "--json", *extra]) == 1
        out, err = capsys.readouterr()
        assert err == ""
        data = json.loads(out)
        assert out.count("\n") == 1  # one document, one line: easy to append to a log
        assert data["ok"] == 1 and data["failed"] == 1 and data["total"] == 2
        assert data["errors"] == {"http_404": 1}
        assert data["failures"][0]["url"] == "http://h/gone"
        assert data["failures"][0]["error"] == "http_404"
        assert data["manifest"] == "out/.swarmget/manifest.jsonl"
        assert set(data) >= {"bytes", "elapsed_s", "files_per_s", "mb_per_s"}
        assert data["stopped"] is None  # the run went to its end


def test_quiet_prints_nothing(
    engine: Callable[..., FakeEngine], urls_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    engine(failing_report())
    assert cli.main([urls_file, "-o", "out", "--quiet"]) == 1
    assert capsys.readouterr() == ("", "")


def test_ctrl_c_exits_130_with_one_line(
    engine: Callable[..., FakeEngine],
    urls_file: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine(raises=KeyboardInterrupt())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / ".swarmget").mkdir(parents=True)
    (tmp_path / "out" / ".swarmget" / "manifest.jsonl").write_text("")  # as a run leaves it
    assert cli.main([urls_file, "-o", "out"]) == 130
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("swarmget: interrupted")
    assert os.path.join("out", ".swarmget", "manifest.jsonl") in err


def test_demo_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    from swarmget import demo

    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 0

    monkeypatch.setattr(demo, "main", fake_main)
    assert cli.main(["demo", "--files", "5"]) == 0
    assert seen == [["--files", "5"]]


# -- end to end: the real engine ------------------------------------------------------------------


def read_manifest(out: Path) -> list[dict[str, Any]]:
    lines = (out / ".swarmget" / "manifest.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_real_download_with_a_failure_exits_1(
    nginx_server: ServedTree, out_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = nginx_server.names[:20]
    missing = nginx_server.url("no-such-file.jpg")
    list_file = tmp_path / "urls.txt"
    list_file.write_text("".join(nginx_server.url(n) + "\n" for n in names))
    assert cli.main([str(list_file), missing, "-o", str(out_dir), "--json"]) == 1
    out, err = capsys.readouterr()
    assert err == ""
    report = json.loads(out)
    assert (report["ok"], report["failed"], report["total"]) == (20, 1, 21)
    assert report["bytes"] == 20 * nginx_server.size
    assert report["errors"] == {"http_404": 1}
    assert report["failures"][0]["url"] == missing
    assert report["manifest"] == str(out_dir / ".swarmget" / "manifest.jsonl")
    records = read_manifest(out_dir)
    assert len(records) == 21
    by_url = {r["url"]: r for r in records}
    for name in names:
        record = by_url[nginx_server.url(name)]
        assert record["status"] == "ok"
        assert (out_dir / record["path"]).read_bytes() == nginx_server.expected(name)


def test_real_download_summary_in_a_real_process(nginx_server: ServedTree, out_dir: Path) -> None:
    urls = [nginx_server.url(n) for n in nginx_server.names[:5]]
    proc = run_subprocess(*urls, "-o", str(out_dir))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert re.fullmatch(
        r"5 files ok, 0 failed, 256\.0 kB in \d+\.\d\d s \(\S+ files/s, \S+ \S?B/s\)\n",
        proc.stdout,
    )
    # Run it again: the files are already there and the answer is still "all ok".
    again = run_subprocess(*urls, "-o", str(out_dir), "--json", "--quiet")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["failed"] == 0


# -- swarmget demo ------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_demo_end_to_end_in_a_real_process() -> None:
    """The whole path a new user takes first: server subprocess, engine, progress, check."""
    proc = run_subprocess("demo", "--files", "300", "--size", "4k", timeout=110)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("swarmget demo: 300 files of 4.1 kB from http://127.0.0.1:")
    assert lines[1].startswith("300 files ok, 0 failed, 1.2 MB in ")
    assert lines[2] == ("verified 200 of 300 files byte for byte and the size of all: all good")
    assert len(lines) == 3
    # The temporary directory is gone.
    dest = lines[0].rsplit(" into ", 1)[1]
    assert not os.path.exists(dest)


def test_demo_json_into_a_kept_directory(out_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--files", "40", "--size", "1000", "-o", str(out_dir), "--json", "--verify-all"]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["ok"], data["failed"], data["bytes"]) == (40, 0, 40_000)
    assert data["demo"] == {
        "files": 40,
        "size": 1000,
        "verified": 40,
        "problems": [],
        "output": str(out_dir),
    }
    from swarmget.testing import expected_body

    assert (out_dir / "000007.bin").read_bytes() == expected_body("000007.bin", 1000)
    assert len(read_manifest(out_dir)) == 40
    assert data["manifest"] == str(out_dir / ".swarmget" / "manifest.jsonl")


def test_demo_json_into_a_temporary_directory_names_no_manifest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # It named the manifest inside the directory it had just removed.
    assert cli.main(["demo", "--files", "20", "--size", "100", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["ok"], data["manifest"], data["demo"]["output"]) == (20, None, None)


def test_demo_verify_finds_bad_files(tmp_path: Path) -> None:
    from swarmget import demo
    from swarmget.testing import expected_body

    names = [demo.file_name(i, 5) for i in range(5)]
    for name in names:
        (tmp_path / name).write_bytes(expected_body(name, 100))
    (tmp_path / names[1]).write_bytes(b"x" * 100)  # right size, wrong bytes
    (tmp_path / names[2]).write_bytes(b"short")
    (tmp_path / names[3]).unlink()
    (tmp_path / names[4]).unlink()  # ... but the report already counts it as failed
    problems = demo.verify(str(tmp_path), 5, 100, failed={names[4]}, sample=None)
    assert problems == [
        f"{names[1]}: content differs from what the server sent",
        f"{names[2]}: 5 bytes, expected 100",
        f"{names[3]}: No such file or directory",
    ]


def signal_when(
    args: list[str], ready: Callable[[], bool], signum: int
) -> tuple[subprocess.Popen[str], str, str]:
    """Run the CLI with ``args``; once ``ready()`` (or after 30 s), send ``signum``;
    the process (ended) and its stdout and stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarmget", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        deadline = time.monotonic() + 30
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc, out, err


@pytest.mark.timeout(60)
def test_ctrl_c_in_a_real_process(out_dir: Path) -> None:
    from swarmget.testing import TestServer

    with TestServer() as srv:
        urls = [srv.file_url(f"slow{i}.bin", size=100, latency=30) for i in range(3)]
        urls.append(srv.file_url("fast.bin", size=100))

        # The server having answered is not enough: wait until the client has
        # the fast file in place, or Ctrl-C may land before it arrives.  And
        # all four requests must be in: with two workers, the one without
        # fast.bin may still be connecting when the other has it.
        def ready() -> bool:
            return (out_dir / "fast.bin").exists() and srv.stats.requests == 4

        proc, out, err = signal_when([*urls, "-o", str(out_dir)], ready, signal.SIGINT)
        assert srv.stats.requests == 4
    assert proc.returncode == 130
    assert out == ""
    manifest = out_dir / ".swarmget" / "manifest.jsonl"
    assert err == (
        f"swarmget: interrupted; rows that finished are listed in {manifest}; "
        "run the same command again to resume\n"
    )
    # The one row that finished is on record.
    assert [r["url"] for r in read_manifest(out_dir) if r["status"] == "ok"] == [urls[-1]]


@pytest.mark.parametrize(
    ("redirect", "flags"),
    [(">/dev/full", ["--json"]), (">&-", []), ("| true", ["--json"]), ("2>&- >&-", [])],
)
def test_a_stdout_that_cannot_take_the_summary_is_one_line_not_a_traceback(
    tmp_path: Path, redirect: str, flags: list[str]
) -> None:
    # A full disk, a closed stdout or a reader that is gone raised a traceback
    # (BrokenPipeError, AttributeError on None, ENOSPC) after every row was done.
    from swarmget.testing import TestServer

    with TestServer() as srv:
        urls = [srv.file_url(f"s{i}.bin", size=100) for i in range(3)]
        command = [sys.executable, "-m", "swarmget", "-o", str(tmp_path / "out"), *flags, *urls]
        script = " ".join(f"'{word}'" for word in command) + f" {redirect}; exit ${{PIPESTATUS[0]}}"
        done = subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, env=child_env(), timeout=60
        )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    if "2>&-" not in redirect:
        assert (
            done.stderr.strip().splitlines()[-1].startswith("swarmget: error: cannot write the")
        ), done.stderr
    assert len(swarmget.read_manifest(tmp_path / "out")) == 3


def test_a_low_open_files_limit_scales_concurrency_or_is_a_usage_error(tmp_path: Path) -> None:
    # With `ulimit -n 64` a fixed reserve of 64 descriptors left room for one
    # connection (40 files at 0.2 s took 8 s); below what a run needs at all,
    # the error blamed the input list ("cannot read input: Too many open files").
    from swarmget.testing import TestServer

    with TestServer() as srv:
        urls = [srv.file_url(f"u{i}.bin", size=100, latency=0.2) for i in range(40)]
        quoted = " ".join(f"'{url}'" for url in urls)
        runs = {}
        for limit in (64, 20):
            out = tmp_path / str(limit)
            command = (
                f"ulimit -n {limit}; exec '{sys.executable}' -m swarmget -q -o '{out}' {quoted}"
            )
            runs[limit] = subprocess.run(
                ["bash", "-c", command], capture_output=True, text=True, env=child_env(), timeout=60
            )
    fits = runs[64]
    assert fits.returncode == 0, fits.stderr
    match = re.search(r"using --concurrency (\d+)", fits.stderr)
    assert match and int(match.group(1)) >= 16
    assert len(swarmget.read_manifest(tmp_path / "64")) == 40
    assert runs[20].returncode == 2
    assert "the limit of open files is 20" in runs[20].stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_rows_from_a_slow_producer_start_as_they_come(tmp_path: Path, workers: str) -> None:
    # `crawler | swarmget -o out -`: nothing started until 256 lines or the end
    # of the input came (the supervisor waited in next() for a whole batch).
    from swarmget.testing import TestServer

    with TestServer() as srv:
        urls = [srv.file_url(f"slow{i}.bin", size=10) for i in range(5)]
        out = tmp_path / "out"
        command = [
            sys.executable,
            "-m",
            "swarmget",
            "-q",
            "-o",
            str(out),
            "--workers",
            workers,
            "-",
        ]
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, env=child_env())
        assert proc.stdin is not None
        try:
            proc.stdin.write("".join(url + "\n" for url in urls).encode())
            proc.stdin.flush()
            deadline = time.monotonic() + 20
            names = [f"slow{i}.bin" for i in range(5)]
            while time.monotonic() < deadline and not all((out / n).exists() for n in names):
                time.sleep(0.02)
            assert all((out / n).exists() for n in names)  # with the pipe still open
            assert proc.poll() is None
            proc.stdin.write((srv.file_url("last.bin", size=10) + "\n").encode())
        finally:
            proc.stdin.close()
            proc.wait(30)
    assert proc.returncode == 0
    assert len(swarmget.read_manifest(out)) == 6


@pytest.mark.parametrize("workers", ["1", "2"])
def test_rows_of_a_list_before_a_named_pipe_start_while_it_waits(
    tmp_path: Path, workers: str
) -> None:
    # `swarmget -o out a.txt <(crawler)`, or a FIFO nobody has opened yet: the
    # run waits for the pipe's writer, as cat does, but a.txt's rows waited
    # with it (the supervisor blocked in opening the pipe, filling a batch).
    from swarmget.testing import TestServer

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with TestServer() as srv:
        listed = tmp_path / "a.txt"
        listed.write_text("".join(srv.file_url(f"a{i}.bin", size=10) + "\n" for i in range(3)))
        out = tmp_path / "out"
        command = [sys.executable, "-m", "swarmget", "-q", "-o", str(out), "--workers", workers]
        proc = subprocess.Popen([*command, str(listed), str(fifo)], env=child_env())
        try:
            names = [f"a{i}.bin" for i in range(3)]
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not all((out / n).exists() for n in names):
                time.sleep(0.02)
            assert all((out / n).exists() for n in names)  # the pipe not opened yet
            assert proc.poll() is None
            with open(fifo, "w") as pipe:
                pipe.write(srv.file_url("last.bin", size=10) + "\n")
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert len(swarmget.read_manifest(out)) == 4


def test_the_demo_never_writes_into_a_directory_with_files(tmp_path: Path) -> None:
    # It ran with --overwrite: a file of the user's named 000000.bin was
    # replaced; run twice into one directory, it named its files around the
    # last run's (000000-1.bin) and checked the old ones.
    mine = tmp_path / "000000.bin"
    mine.write_bytes(b"precious")
    assert cli.main(["demo", "--files", "2", "--size", "100", "-o", str(tmp_path), "-q"]) == 2
    assert mine.read_bytes() == b"precious" and sorted(os.listdir(tmp_path)) == ["000000.bin"]


@pytest.mark.timeout(60)
def test_sigterm_stops_the_demo_cleanly() -> None:
    # The demo had no SIGTERM handler: tracebacks from every worker, and its
    # temporary directory (on tmpfs: memory) left behind.
    env = child_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarmget", "demo", "--files", "2000000", "--size", "100"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    banner = proc.stdout.readline()
    dest = banner.rsplit(" into ", 1)[1].strip()
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    assert not os.path.exists(dest)


def test_an_output_directory_that_cannot_be_made_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    for dest in (tmp_path / "afile" / "sub", "/proc/swarmget-cannot"):
        assert cli.main(["-q", "-o", str(dest), "http://127.0.0.1:9/x"]) == 2


def test_an_output_directory_that_cannot_be_written_is_a_usage_error() -> None:
    # As a user without write permission (root may write anywhere: it runs as
    # nobody then), the same status as a directory that cannot be made.
    import shutil
    import tempfile

    as_user: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: no user to lack the permission")
        as_user = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    top = tempfile.mkdtemp(prefix="swarmget-ro-")
    try:
        os.chmod(top, 0o755)
        for name, mode, why in [
            ("wx", 0o733, "cannot be read"),  # files there cannot be looked for
            ("ro", 0o555, "is not writable"),
        ]:
            dest = os.path.join(top, name)
            os.mkdir(dest)
            os.chmod(dest, mode)
            command = [
                *as_user,
                sys.executable,
                "-m",
                "swarmget",
                "-q",
                "-o",
                dest,
                "http://127.0.0.1:9/x",
            ]
            proc = subprocess.run(
                command, capture_output=True, text=True, env=child_env(), timeout=60, cwd=top
            )
            assert proc.returncode == 2, proc.stderr
            assert proc.stderr == f"swarmget: error: -o '{dest}': the directory {why}\n"
            os.chmod(dest, 0o755)
            assert os.listdir(dest) == []
    finally:
        shutil.rmtree(top)


def test_a_stopped_run_names_the_manifest_only_if_there_is_one(tmp_path: Path) -> None:
    from swarmget.cli import _where_listed

    # Stopped before there was a journal (a Ctrl-C at once): it said the
    # journal kept what finished.
    assert _where_listed(str(tmp_path)) == "no row had finished"
    (tmp_path / ".swarmget").mkdir()
    (tmp_path / ".swarmget" / "journal.sqlite3").write_text("")
    assert _where_listed(str(tmp_path)).startswith("no manifest could be written")
    (tmp_path / ".swarmget" / "manifest.jsonl").write_text("")
    assert "rows that finished are listed in" in _where_listed(str(tmp_path))


def test_a_run_without_a_stderr_downloads_in_silence(tmp_path: Path) -> None:
    # `2>&-` (cron, a daemon): the first progress line, two seconds in, raised
    # on a stderr that is None, and the run stopped with nothing downloaded.
    from swarmget.testing import TestServer

    with TestServer() as srv:
        urls = [srv.file_url(f"q{i}.bin", size=100, latency=i * 0.8) for i in range(4)]
        command = [sys.executable, "-m", "swarmget", "-o", str(tmp_path / "out"), "--json", *urls]
        script = " ".join(f"'{word}'" for word in command) + " 2>&-"
        done = subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, env=child_env(), timeout=60
        )
    assert done.returncode == 0, done.stdout
    assert json.loads(done.stdout)["ok"] == 4
    assert len(swarmget.read_manifest(tmp_path / "out")) == 4


@pytest.mark.parametrize("redirect", [">/dev/full", "| head -c 5 >/dev/null"])
def test_the_demo_with_a_stdout_that_cannot_take_it_is_one_line_not_a_traceback(
    redirect: str,
) -> None:
    command = [sys.executable, "-m", "swarmget", "demo", "--files", "20", "--size", "1000"]
    script = " ".join(f"'{word}'" for word in command) + f" {redirect}; exit ${{PIPESTATUS[0]}}"
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=child_env(), timeout=120
    )
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    if redirect.startswith(">"):
        assert done.returncode == 1
        assert done.stderr.strip().splitlines()[-1] == (
            "swarmget: error: cannot write the summary to stdout"
        )


def test_a_locale_that_cannot_spell_a_name_fails_only_that_row(tmp_path: Path) -> None:
    # Under an ASCII (or Latin-1) file system encoding, 日本.bin cannot be a file
    # name: the worker died at the rename, after the download, and took the run
    # with it; and a failure line with such a URL lost the whole summary.
    from swarmget.testing import TestServer

    env = child_env()
    env.update(LC_ALL="C", PYTHONUTF8="0")
    env.pop("PYTHONIOENCODING", None)
    with TestServer() as srv:
        rows = [
            {"url": srv.file_url("plain.bin", size=100)},
            {"url": srv.file_url("\u65e5\u672c.bin", size=100)},
            {"url": srv.file_url("named.bin", size=100), "path": "\u65e5/\u672c.bin"},
            {"url": srv.url("/files/%E6%97%A5.bin", status=404)},
            {"url": srv.file_url("after.bin", size=100)},
        ]
        source = tmp_path / "list.jsonl"
        source.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        done = subprocess.run(
            [sys.executable, "-m", "swarmget", str(source), "-o", str(tmp_path / "out")],
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
            env=env,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1
    records = {r["index"]: r for r in swarmget.read_manifest(tmp_path / "out")}
    assert [records[i]["status"] for i in range(5)] == ["ok", "ok", "failed", "failed", "ok"]
    assert records[1]["path"] == "__.bin"  # what the file system can spell
    assert (records[2]["error"], records[3]["error"]) == ("bad_path", "http_404")
    assert "3 files ok, 2 failed" in done.stdout
    assert "\\u65e5" in done.stdout  # the failure lines, with escapes


@pytest.mark.timeout(60)
def test_json_after_sigterm_says_what_finished(out_dir: Path) -> None:
    # A job preempted with SIGTERM, its stdout read by a script: the summary of
    # what finished, as after a full disk, not nothing.
    from swarmget.testing import TestServer

    with TestServer() as srv:
        urls = [srv.file_url("slow.bin", size=100, latency=30), srv.file_url("quick.bin", size=100)]
        reported = [0.0]

        def ready() -> bool:
            # The quick file in place and both requests in, then a moment for
            # the quick row's report to reach the driver.
            if not ((out_dir / "quick.bin").exists() and srv.stats.requests >= 2):
                return False
            reported[0] = reported[0] or time.monotonic()
            return time.monotonic() - reported[0] > 0.3

        args = [*urls, "-o", str(out_dir), "--json", "-q"]
        proc, out, err = signal_when(args, ready, signal.SIGTERM)
    assert proc.returncode == 143, err
    summary = json.loads(out)
    assert (summary["ok"], summary["failed"]) == (1, 0)
    assert summary["manifest"] == str(out_dir / ".swarmget" / "manifest.jsonl")
    # "failed": 0 read as a whole run done, to a script that sees only stdout.
    assert summary["stopped"] == "SIGTERM"


def test_a_later_source_without_a_url_column_fails_before_any_download(tmp_path: Path) -> None:
    from swarmget.testing import TestServer

    with TestServer() as srv:
        first = tmp_path / "a.txt"
        first.write_text("".join(srv.file_url(f"ls{i}.bin", size=10) + "\n" for i in range(5)))
        second = tmp_path / "b.csv"
        second.write_text("foo,bar\n1,2\n")
        seen = len(srv.requests)
        status = cli.main(["-q", "-o", str(tmp_path / "out"), str(first), str(second)])
        assert status == 2
        assert len(srv.requests) == seen


def test_input_that_breaks_midway_still_gives_the_json_of_what_was_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import gzip

    from swarmget.testing import TestServer

    with TestServer() as srv:
        body = "".join(srv.file_url(f"tg{i}.bin", size=10) + "\n" for i in range(300))
        cut = tmp_path / "list.gz"
        cut.write_bytes(gzip.compress(body.encode())[:-4])  # the gzip trailer lost
        status = cli.main(["-q", "--json", "-o", str(tmp_path / "out"), str(cut)])
    out, err = capsys.readouterr()
    assert status == 2
    assert "cannot read input" in err and "the rows read before it are done" in err
    summary = json.loads(out)
    assert summary["ok"] == 300
    assert summary["stopped"] == "input"
    assert len(swarmget.read_manifest(tmp_path / "out")) == 300


# -- sources anywhere on the command line, and "--" -------------------------------------------


def test_sources_may_follow_options_as_with_curl(tmp_path: Path) -> None:
    # "a.txt -o out b.txt" refused b.txt: "unrecognized arguments".
    from swarmget.testing import TestServer

    with TestServer() as srv:
        first = tmp_path / "a.txt"
        first.write_text(srv.file_url("mix1.bin", size=10) + "\n")
        second = tmp_path / "b.txt"
        second.write_text(srv.file_url("mix2.bin", size=20) + "\n")
        out = tmp_path / "out"
        argv = ["-q", str(first), "-o", str(out), str(second)]
        assert cli.main(argv) == 0
        assert (out / "mix1.bin").stat().st_size == 10
        assert (out / "mix2.bin").stat().st_size == 20
        # URLs between options, as "-o o --retries 5 URL1 --timeout 3 URL2".
        out2 = tmp_path / "out2"
        argv = ["-q", "-o", str(out2), "--retries", "5", srv.file_url("mix3.bin", size=3)]
        argv += ["--timeout", "3", srv.file_url("mix4.bin", size=4)]
        assert cli.main(argv) == 0
        assert sorted(p.name for p in out2.glob("mix*")) == ["mix3.bin", "mix4.bin"]


def test_options_between_sources_reach_the_engine(
    engine: Callable[..., FakeEngine], urls_file: str
) -> None:
    fake = engine()
    argv = ["-o", "out", "--retries", "5", "http://h/1", "--timeout", "3", urls_file, "-q"]
    assert cli.main(argv) == 0
    (call,) = fake.calls
    assert call["sources"] == ["http://h/1", urls_file]
    assert (call["options"]["retries"], call["options"]["timeout"]) == (5, 3.0)


def test_double_dash_still_ends_the_options(
    engine: Callable[..., FakeEngine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = engine()
    monkeypatch.chdir(tmp_path)
    Path("-x.txt").write_text("http://127.0.0.1:9/a\n")
    Path("--").write_text("http://127.0.0.1:9/b\n")
    assert cli.main(["-q", "-o", "out", "--", "-x.txt", "--"]) == 0
    assert cli.main(["-q", "-o", "out", "./--", "--", "-x.txt"]) == 0
    assert [call["sources"] for call in fake.calls] == [["-x.txt", "--"], ["./--", "-x.txt"]]


def test_a_missing_source_or_output_is_still_one_line(
    engine: Callable[..., FakeEngine], capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, missing in [
        (["-o", "out", "-q"], "SOURCE"),
        (["-o", "out", "--"], "SOURCE"),
        (["http://h/x", "-q"], "-o/--output"),
    ]:
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err == f"swarmget: error: the following arguments are required: {missing}\n"


def test_dash_as_the_output_is_a_usage_error_not_a_directory(
    engine: Callable[..., FakeEngine],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # curl and wget read "-o -" as stdout; swarmget made a directory named "-".
    fake = engine()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["-q", "-o", "-", "http://h/x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("swarmget: error: -o -: swarmget writes files into a directory")
    assert err.count("\n") == 1 and "swarmget.stream()" in err
    assert not Path("-").exists() and fake.calls == []
    # Said as a path, it is one.
    assert cli.main(["-q", "-o", "./-", "http://h/x"]) == 0
    assert Path("-").is_dir() and fake.calls[0]["dest"] == "./-"


# -- repeated and empty --header, as curl reads -H ----------------------------------------------


def header_lines_sent(head: bytes) -> list[str]:
    return head.decode("latin-1").split("\r\n")[1:]


def test_repeated_and_emptied_headers_reach_the_server_as_with_curl(tmp_path: Path) -> None:
    from swarmget.testing import TestServer

    with TestServer() as srv:
        url = srv.file_url("hdr.bin", size=5)
        seen = len(srv.requests)
        argv = ["-q", "-o", str(tmp_path / "out"), url, "--workers", "1"]
        for header in [
            "X-Dup: 1",  # a dict kept only the last value
            "x-dup: 2",
            "Cookie: a=1",
            "Cookie: b=2",
            "User-Agent:",  # "Name:" takes away one of ours (curl's rule) ...
            "Accept:",
            "X-Gone:",  # ... or sends nothing: it sent an empty header
            "X-Blank;",  # "Name;" sends it empty
        ]:
            argv += ["--header", header]
        assert cli.main(argv) == 0
        (head,) = srv.requests[seen:]
    lines = header_lines_sent(head)
    assert "X-Dup: 1, 2" in lines
    assert "Cookie: a=1; b=2" in lines
    assert [line for line in lines if line.lower().startswith("x-blank:")] == ["X-Blank:  "]
    names = [line.partition(":")[0].lower() for line in lines if line]
    assert "x-gone" not in names and "user-agent" not in names and "accept" not in names
    assert names.count("x-dup") == 1 and "accept-encoding" in names


def test_combine_headers() -> None:
    pairs = [("X-A", "1"), ("x-a", ""), ("X-A", "2"), ("X-B", ""), ("X-C", " "), ("X-C", "")]
    assert cli.combine_headers(pairs) == {"X-A": "1, 2", "X-B": "", "X-C": " "}
    assert cli.parse_header("X-Blank ; ") == ("X-Blank", " ")
    with pytest.raises(Exception, match="invalid header"):
        cli.parse_header("X;y")


def test_taking_host_away_is_a_usage_error(
    engine: Callable[..., FakeEngine], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = engine()
    out = str(tmp_path / "out")
    assert cli.main(["-q", "-o", out, "http://127.0.0.1:9/x", "--header", "Host:"]) == 2
    assert "HTTP/1.1 requires a Host" in capsys.readouterr().err
    assert fake.calls == []


# -- fractional sizes ---------------------------------------------------------------------------


def test_a_fraction_of_a_byte_is_a_usage_error_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from swarmget.testing import TestServer

    with TestServer() as srv:
        url = srv.file_url("frac.bin", size=10)
        for flag, value in [("--max-size", "0.5"), ("--min-speed", "0.0001k")]:
            seen = len(srv.requests)
            assert cli.main(["-q", "-o", str(tmp_path / "out"), url, flag, value]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"swarmget: error: argument {flag}: invalid size {value!r}")
            assert len(srv.requests) == seen and not (tmp_path / "out").exists()


def test_a_fractional_size_with_a_unit_is_honoured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from swarmget.testing import TestServer

    with TestServer() as srv:
        small, large = srv.file_url("half-in.bin", size=512), srv.file_url("half-out.bin", size=513)
        argv = ["-q", "--json", "-o", str(tmp_path / "out"), small, large, "--max-size", "0.5k"]
        assert cli.main(argv) == 1
    summary = json.loads(capsys.readouterr().out)
    assert (summary["ok"], summary["failed"]) == (1, 1)
    records = {
        r["url"].partition("?")[0].rsplit("/")[-1]: r for r in read_manifest(tmp_path / "out")
    }
    assert records["half-in.bin"]["status"] == "ok"
    assert (tmp_path / "out" / "half-in.bin").stat().st_size == 512
    assert records["half-out.bin"]["error"] == ErrorCode.TOO_LARGE


# -- a URL without its scheme ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        ("user:s3cret@127.0.0.1/x", "user:***@127.0.0.1/x"),
        ("me:pa/ss@wd@host.test/a@b", "me:***@b"),  # a / or @ in it: all of it goes
        ("list@2024.txt", "list@2024.txt"),  # no password: nothing to hide
    ],
)
def test_a_url_without_its_scheme_is_not_echoed_with_its_password(
    source: str, shown: str, tmp_path: Path
) -> None:
    proc = run_subprocess(source, "-o", "out", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == (
        f"swarmget: error: cannot read {shown!r}: no such file (a URL needs http:// or https://)\n"
    )
    assert "s3cret" not in proc.stderr and "pa/ss" not in proc.stderr


def test_an_option_given_again_overrides_the_earlier_one() -> None:
    # As in curl and wget: a wrapper's defaults (an alias, a script) can be
    # overridden on the command line; repeatable options add up instead.
    argv = ["l.txt", "-o", "a", "--concurrency", "16", "--header", "X-A: 1"]
    argv += ["--concurrency", "4", "-o", "b", "--header", "X-B: 2"]
    args = cli.parse_command_line(cli.build_parser(), argv)
    options = cli.options_from_args(args)
    assert (args.output, options["concurrency"]) == ("b", 4)
    assert options["headers"] == {"X-A": "1", "X-B": "2"}


def test_a_header_of_one_value_given_twice_is_sent_once_with_the_last_value(
    tmp_path: Path,
) -> None:
    """Joined, "Host: a, b" was a Host every server must refuse (RFC 9112 3.2)
    and "Authorization: Bearer x, Bearer y" credentials no scheme reads; names
    that differ only in case in ``headers`` sent two Host lines.  List fields
    are still joined, whichever way they came."""
    from swarmget.testing import TestServer

    with TestServer() as srv:
        url = srv.file_url("one.bin", size=5)
        seen = len(srv.requests)
        argv = ["-q", "-o", str(tmp_path / "cli"), url, "--workers", "1"]
        for header in [
            "Host: first.test",
            "host: second.test",
            "Authorization: Bearer x",
            "Authorization: Bearer y",
            "User-Agent: a/1",
            "user-agent: b/2",
        ]:
            argv += ["--header", header]
        assert cli.main(argv) == 0
        given = {"host": "first.test", "Host": "second.test", "X-A": "1", "x-a": "2"}
        report = swarmget.download([url], tmp_path / "api", workers=1, headers=given)
        assert report.ok == 1
        cli_head, api_head = srv.requests[seen:]
    lines = header_lines_sent(cli_head)
    names = [line.partition(":")[0].lower() for line in lines if line]
    assert "Host: second.test" in lines and names.count("host") == 1
    assert "Authorization: Bearer y" in lines and names.count("authorization") == 1
    assert "User-Agent: b/2" in lines and names.count("user-agent") == 1
    lines = header_lines_sent(api_head)
    names = [line.partition(":")[0].lower() for line in lines if line]
    assert "host: second.test" in lines and names.count("host") == 1
    assert "X-A: 1, 2" in lines and names.count("x-a") == 1
    assert Options(headers={"Host": "a", "HOST": "b"}).headers == {"Host": "b"}
