"""Rebuild this corpus from a checkout of curl's test suite.

    python tests/data/curl_replies/extract.py /path/to/curl [--commit SHA]

For every case that :func:`select` keeps, this writes ``NNNN.reply`` (the raw
bytes curl's test server sends), ``NNNN.json`` (curl's verdict) and, when curl
saves a file, ``NNNN.body`` (the bytes it saves).  The rules below emulate the
parts of curl's ``runtests.pl`` (``prepro``, ``getpart``, ``subnewlines``) and
of its test server ``sws`` that decide those bytes; README.md says which cases
are kept and why.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The values runtests.pl substitutes; only their shape matters here.
VARIABLES = {
    "HOSTIP": "127.0.0.1",
    "HTTPPORT": "8990",
    "HTTPSPORT": "8991",
    "PROXYPORT": "8993",
    "CLIENTIP": "127.0.0.1",
    "VERSION": "8.99.0",
    "LOGDIR": "log/1",
    "SRCDIR": ".",
}
FEATURES = {"large-time"}  # %if conditions that hold on a typical 64-bit build

# Options that do not change how curl reads the reply (what it sends, where it
# writes, naming, proxies, credentials for a reply that asks for none).
NEUTRAL = {
    "-i", "--include", "-s", "--silent", "-S", "--show-error", "-sS", "-v", "--verbose",
    "--no-progress-meter", "-0", "--http1.0", "--http1.1", "-N", "--no-buffer", "-4",
    "-6", "-L", "--location", "--location-trusted", "--basic", "-O", "--remote-name",
    "-J", "--remote-header-name", "--create-dirs", "-g", "--globoff", "--path-as-is",
    "-q", "--disable", "--no-keepalive", "--tcp-nodelay",
}  # fmt: skip
NEUTRAL_WITH_ARG = {
    "-u", "--user", "-U", "--proxy-user", "-x", "--proxy", "--noproxy", "-b", "--cookie",
    "-c", "--cookie-jar", "-D", "--dump-header", "-A", "--user-agent", "-e", "--referer",
    "-H", "--header", "--resolve", "--connect-to", "--max-redirs", "--output-dir",
}  # fmt: skip
# Options with a swarmget counterpart (see ``options`` in the .json files).
MAPPED_WITH_ARG = {"--max-filesize", "-m", "--max-time"}
# --tr-encoding asks for Transfer-Encoding gzip/deflate, which swarmget always
# undoes; -f/--fail is how swarmget treats every status >= 400 anyway.
MAPPED = {"--tr-encoding", "-f", "--fail", "--fail-with-body"}
# Everything else is out: uploads and other methods (-d -F -T -X -I), ranges
# and conditions (-C -r -z), --compressed (Content-Encoding is not swarmget's
# business), --raw, --ignore-content-length, --http0.9, -w and -o (output
# mixing), --retry, auth schemes with several round trips, config files.
SERVER_COMMANDS_OUT = re.compile(r"auth_required|idle|stream|upgrade|connection-monitor|skip")


@dataclass
class Case:
    test: int
    name: str
    reply: bytes
    close: bool  # sws closes the connection after the reply
    hold: float  # seconds it waits before that
    curl_exit: int
    status: int | None
    verdict: str  # "ok": curl saves ``body``; "fail": it saves nothing
    options: dict[str, float]
    tr_encoding: bool
    keywords: list[str]
    body: bytes | None = None
    body_source: str = ""
    local_exit: int | None = None
    local_body: bytes | None = None


# -- runtests.pl emulation ----------------------------------------------------------


def _percent(text: str) -> str:
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), text)


def _variables(line: str, testnum: int) -> str:
    line = line.replace("%TESTNUMBER", str(testnum))
    for name in sorted(VARIABLES, key=len, reverse=True):
        line = line.replace("%" + name, VARIABLES[name])
    return line


def _macros(line: str, tests_dir: Path) -> str:
    """``subchars`` then ``subbase64``: %CR..., %b64[], %hex[], %repeat[], %include."""
    for macro, char in (("%SP", " "), ("%TAB", "\t"), ("%CR", "\r"), ("%LT", "<")):
        line = line.replace(macro, char)
    line = line.replace("%GT", ">").replace("%AMP", "&")
    for pattern, make in (
        (r"%b64\[(.*?)\]b64%", lambda m: base64.b64encode(_latin(_percent(m.group(1)))).decode()),
        (r"%hex\[(.*?)\]hex%", lambda m: _percent(m.group(1))),
        (r"%repeat\[(\d+) x (.*?)\]%", lambda m: _percent(m.group(2)) * int(m.group(1))),
    ):
        while (match := re.search(pattern, line, re.I)) is not None:
            line = line[: match.start()] + make(match) + line[match.end() :]
    return _include(line, tests_dir, text=False)


def _latin(text: str) -> bytes:
    return text.encode("latin-1")


class _Newlines:
    """``subnewlines``: CRLF for lines that look like HTTP header lines."""

    def __init__(self) -> None:
        self.previous = False

    def __call__(self, line: str, force: bool) -> str:
        if force:
            return re.sub(r"\r*\n", "\r\n", line, count=1)
        if (
            re.match(r"^HTTP/(1.1|1.0|2|3) ([1-5]|9)[^\r]*\Z", line)
            or re.match(r"^(GET|HEAD|POST|PUT|DELETE|CONNECT) \S+ HTTP/\d+(\.\d+)?", line)
            or (
                re.match(r"^[a-z0-9_-]+: [^\r]*\Z", line, re.I)
                and not re.match(r"^curl: \(\d+\) ", line)
            )
        ):
            self.previous = True
            return re.sub(r"\r*\n", "\r\n", line, count=1)
        if line == "\n" and self.previous:
            line = "\r\n"
        self.previous = False
        return line


def _include(line: str, tests_dir: Path, *, text: bool) -> str:
    """``%includetext FILE%`` (text mode) or ``%include FILE%``, relative to tests/."""

    def read(match: re.Match[str]) -> str:
        path = tests_dir / match.group(1)
        if not path.is_file():  # outside tests/: never part of a reply we keep
            return ""
        data = path.read_bytes().decode("latin-1")
        return data.replace("\r\n", "\n") if text else data

    pattern = r"%includetext ([^%]*)%[\n\r]+" if text else r"%include ([^%]*)%[\n\r]+"
    return re.sub(pattern, read, line)


def prepro(lines: list[str], testnum: int, tests_dir: Path) -> list[str]:
    """runtests.pl's ``prepro``: %if blocks, variables, macros, per-section CRLF."""
    show, stack, alternatives, out, crlf = True, [], [], [], ""
    newlines = _Newlines()
    for line in lines:
        if match := re.match(r"^ *%if ([A-Za-z0-9!_-]*)", line):
            cond = match.group(1)
            holds = cond.lstrip("!") in FEATURES
            wanted = holds != cond.startswith("!")
            stack.append(show)
            alternatives.append(show and not wanted)
            show = show and wanted
            continue
        if re.match(r"^ *%else", line):
            show = alternatives[-1]
            continue
        if re.match(r"^ *%endif", line):
            show = stack.pop()
            alternatives.pop()
            continue
        if not show:
            continue
        if match := re.match(r"^ *<(data|connect)(.*)>", line):
            crlf = "yes" if 'crlf="yes"' in match.group(2) else crlf
            crlf = "headers" if 'crlf="headers"' in match.group(2) else crlf
        elif re.match(r"^ *</(data|connect)", line):
            crlf = ""
        line = _variables(line, testnum)
        included = _include(line, tests_dir, text=True)
        if included != line:
            line = _variables(included, testnum)
        line = _macros(line, tests_dir)
        if crlf:
            line = newlines(line, crlf == "yes")
        out.append(line)
    return out


def getpart(xml: list[str], section: str, part: str) -> list[str]:
    this: list[str] = []
    inside = 0
    for line in xml:
        if not inside and re.match(rf"^ *<{section}", line):
            inside = 1
        elif inside >= 1 and re.match(rf"^ *<{part}[ >]", line):
            if inside > 1:
                this.append(line)
            inside += 1
        elif inside >= 2 and re.match(rf"^ *</{part}[ >]", line):
            if inside > 2:
                this.append(line)
            inside -= 1
        elif inside >= 1 and re.match(rf"^ *</{section}", line):
            return this
        elif inside >= 2:
            this.append(line)
    return this


def getpartattr(xml: list[str], section: str, part: str) -> dict[str, str] | None:
    """The attributes of ``<part>`` in ``<section>``, None when there is no such part."""
    inside = False
    for line in xml:
        if not inside and re.match(rf"^ *<{section}", line):
            inside = True
        elif inside and (match := re.match(rf"^ *<{part}([ >].*)", line)):
            return dict(re.findall(r'([\w-]+)="([^"]*)"', match.group(1).split(">")[0]))
        elif inside and re.match(rf"^ *</{section}>", line):
            return None
    return None


def part_bytes(xml: list[str], section: str, part: str) -> bytes | None:
    attrs = getpartattr(xml, section, part)
    if attrs is None:
        return None
    data = _latin("".join(getpart(xml, section, part)))
    if attrs.get("base64") == "yes":
        data = base64.b64decode(data)
    if attrs.get("nonewline") == "yes" and data.endswith(b"\n"):
        data = data[:-1]
    return data


# -- reading the reply the way curl's test expectations are laid out --------------


def split_heads(data: bytes) -> tuple[list[tuple[int | None, bytes]], bytes]:
    """Cut ``data`` into its response heads (1xx ones first) and the rest.

    A head ends at the first empty line, CRLF or LF alike; that is only used to
    find where curl's ``--include`` output stops being headers.
    """
    heads: list[tuple[int | None, bytes]] = []
    rest = data
    while rest.startswith(b"HTTP/"):
        match = re.search(rb"\n\r?\n", rest)
        if match is None:
            break
        status_match = re.match(rb"HTTP/\S+ +(\d{3})(?!\d)", rest)
        status = int(status_match.group(1)) if status_match else None
        heads.append((status, rest[: match.end()]))
        rest = rest[match.end() :]
        if status is None or not 100 <= status < 200 or status == 101:
            break
    return heads, rest


def final_status(reply: bytes) -> int | None:
    heads, _ = split_heads(reply)
    return heads[-1][0] if heads else None


def saved_body(xml: list[str], include: bool, reply: bytes) -> bytes | None:
    """What curl writes to its output file, minus the headers --include adds."""
    if part_bytes(xml, "reply", "datacheck") is not None:
        output = b"".join(
            part_bytes(xml, "reply", "datacheck" + suffix) or b""
            for suffix in ("", "1", "2", "3", "4")
        )
    else:
        output = part_bytes(xml, "reply", "data") or b""
    if not include:
        return output
    heads, rest = split_heads(reply)
    for _ in heads:
        match = re.search(rb"\n\r?\n", output)
        if match is None:
            return None  # nothing but headers, and not even all of them
        output = output[match.end() :]
    # --include also writes the trailer of a chunked body after the body, its
    # lines ending in CRLF whatever they ended with.
    trailer = re.search(rb"\n0+(?:;[^\n]*)?\r?\n((?:[^\r\n][^\n]*\n)+)\r?\n\Z", rest)
    if trailer is not None:
        lines = trailer.group(1).splitlines()
        written = b"".join(line.rstrip(b"\r") + b"\r\n" for line in lines)
        if output.endswith(written):
            output = output[: -len(written)]
    return output


def classes(reply: bytes) -> list[str]:
    """What about ``reply`` is out of the ordinary (for the agreement report by class)."""
    heads, rest = split_heads(reply)
    if not heads:
        return ["no-head"]
    text = b"".join(block for _, block in heads)
    fields = [line.rstrip(b"\r") for _, block in heads for line in block.split(b"\n")[1:]]
    names = [line.partition(b":")[0].lower() for line in fields if line[:1] not in (b" ", b"\t")]
    final = heads[-1][1]
    checks = {
        "bare-lf": re.search(rb"(?<!\r)\n", text) is not None,
        "obs-fold": any(line[:1] in (b" ", b"\t") for line in fields),
        "interim-1xx": len(heads) > 1,
        "no-reason": re.match(rb"HTTP/1\.\d \d{3}[ \t]*\r?\n", final) is not None,
        "http/1.0": final.startswith(b"HTTP/1.0"),
        "chunked": re.search(rb"(?im)^transfer-encoding:.*chunked", final) is not None,
        "te-coding": re.search(rb"(?im)^transfer-encoding:.*(gzip|deflate|identity|,)", final)
        is not None,
        "cl+te": b"content-length" in names and b"transfer-encoding" in names,
        "cl-repeated": names.count(b"content-length") > 1
        or re.search(rb"(?im)^content-length:[^\n]*,", final) is not None,
        "no-length": b"content-length" not in names and b"transfer-encoding" not in names,
        "nul-or-cr": b"\x00" in text or re.search(rb"\r(?!\n)", text) is not None,
        "large-head": len(text) > 8192,
        "chunk-lf": re.match(rb"[0-9a-fA-F]+(;[^\r\n]*)?\n", rest) is not None
        and b"chunked" in final.lower(),
    }
    return [name for name, hit in checks.items() if hit] or ["plain"]


# -- selection ----------------------------------------------------------------------


# Bodies neither the test data nor the local curl gives: read off the reply.
MANUAL_BODIES = {
    1473: (b"-foo-\n", "Content-Length: 6 (the test does not check it; curl 7.88 fails it)"),
}
LOCAL_ERRORS = {5, 6, 7, 23, 49}  # proxy/host resolution, connect, local write, bad option


def parse_command(command: str) -> tuple[str, dict[str, float], bool] | str:
    """The one URL, the mapped options and --tr-encoding; or why the case is out."""
    try:
        args = shlex.split(command)
    except ValueError:
        return "unparsable command"
    urls: list[str] = []
    options: dict[str, float] = {}
    tr_encoding = False
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            urls.append(arg)
        elif arg in NEUTRAL or arg in MAPPED:
            tr_encoding = tr_encoding or arg == "--tr-encoding"
        elif arg in NEUTRAL_WITH_ARG:
            i += 1
        elif arg in MAPPED_WITH_ARG and i + 1 < len(args):
            i += 1
            options["max_size" if arg == "--max-filesize" else "deadline"] = float(args[i])
        else:
            return f"option {arg}"
        i += 1
    if len(urls) != 1:
        return "not exactly one URL"
    url = urls[0] if "://" in urls[0] else "http://" + urls[0]
    if not url.startswith("http://") or re.search(r"[{}\[\]]", url):
        return "not one plain http URL"
    return url, options, tr_encoding


def reply_part(url: str) -> str:
    """The ``<dataN>`` sws answers ``url`` with (from the number after the last slash)."""
    path = url.split("://", 1)[1].split("#")[0].split("?")[0]
    tail = path.rsplit("/", 1)[-1] if "/" in path else ""
    match = re.match(r"\d+", tail)
    number = int(match.group()) if match else 0
    return f"data{number % 10000}" if number > 10000 else "data"


def _hold(xml: list[str]) -> float:
    """Seconds sws waits after the reply before closing (``<postcmd>wait N``)."""
    match = re.search(r"^wait (\d+)", "".join(getpart(xml, "reply", "postcmd")), re.M)
    return float(match.group(1)) if match else 0.0


def select(path: Path, disabled: set[int]) -> Case | str:
    """The case for curl test ``path``, or why it is not one."""
    testnum = int(path.name[4:])
    if testnum in disabled:
        return "disabled in curl"
    lines = path.read_bytes().decode("latin-1").splitlines(keepends=True)
    xml = prepro(lines, testnum, path.parent.parent)
    if "".join(getpart(xml, "client", "server")).split() != ["http"]:
        return "not an http-only test"
    if "".join(getpart(xml, "client", "tool")).strip():
        return "libcurl tool"
    command_attrs = getpartattr(xml, "client", "command") or {}
    if command_attrs.get("type"):
        return "not a curl command"
    parsed = parse_command("".join(getpart(xml, "client", "command")).strip())
    if isinstance(parsed, str):
        return parsed
    url, options, tr_encoding = parsed
    part = reply_part(url)
    if part == "data" and any(re.match(r"^ *<data\d+[ >]", line) for line in xml):
        return "several replies"
    servercmd = "".join(getpart(xml, "reply", "servercmd"))
    if SERVER_COMMANDS_OUT.search(servercmd):
        return "server command"
    reply = part_bytes(xml, "reply", part)
    if reply is None:
        return "no reply"
    errorcode = "".join(getpart(xml, "verify", "errorcode")).strip() or "0"
    curl_exit = int(errorcode.split(",")[0])
    if curl_exit in LOCAL_ERRORS:
        return f"curl fails for a local reason ({curl_exit})"
    status = final_status(reply)
    if status is not None and 300 <= status < 400:
        return "final status is a redirect (a policy, not reading)"
    close = b"swsclose" in reply or "swsclose" in servercmd or not reply
    case = Case(
        test=testnum,
        name="".join(getpart(xml, "client", "name")).strip(),
        reply=reply,
        close=close,
        hold=_hold(xml),
        curl_exit=curl_exit,
        status=status,
        verdict="ok" if curl_exit == 0 and (status is None or status < 400) else "fail",
        options=options,
        tr_encoding=tr_encoding,
        keywords=[k.strip() for k in getpart(xml, "info", "keywords") if k.strip()],
    )
    attrs = getpartattr(xml, "reply", part) or {}
    if case.verdict == "ok" and attrs.get("nocheck") != "yes":
        include = "no-include" not in command_attrs.get("option", "")
        case.body = saved_body(xml, include, reply)
        case.body_source = "curl test data" if case.body is not None else ""
    return case


# -- the local curl, to fill in bodies the test data does not check -------------------


def run_local_curl(cases: list[Case]) -> str:
    """Run the curl on PATH against every reply; returns its version line."""
    import subprocess
    import tempfile

    from swarmget.testing import TestServer
    from swarmget.testing.replies import replay

    version = subprocess.run(["curl", "--version"], capture_output=True, text=True, check=True)
    with TestServer() as srv, tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            path = f"/curl/{case.test:04d}"
            srv.route(path, replay(case.reply, close=case.close, hold=min(case.hold, 3.0)))
            out = Path(tmp) / f"{case.test}.out"
            deadline = str(case.options.get("deadline", 3))
            command = ["curl", "-s", "-f", "-o", str(out), "-m", deadline]
            if "max_size" in case.options:
                command += ["--max-filesize", str(int(case.options["max_size"]))]
            if case.tr_encoding:
                command.append("--tr-encoding")
            result = subprocess.run([*command, srv.url(path)], capture_output=True, check=False)
            saved = out.read_bytes() if out.exists() else b""
            case.local_exit = result.returncode
            case.local_body = saved if result.returncode == 0 else None
    return " ".join(version.stdout.split()[:2])


def write_case(case: Case, directory: Path, source: str, local_version: str) -> None:
    stem = f"{case.test:04d}"
    (directory / f"{stem}.reply").write_bytes(case.reply)
    body_file = body = None
    if case.verdict == "ok":
        body = case.body
        if body is None and case.test in MANUAL_BODIES:
            body, case.body_source = MANUAL_BODIES[case.test]
        elif body is None and case.local_exit == 0:
            body = case.local_body
            case.body_source = f"{local_version} run on the reply (the test does not check it)"
        if body is not None:
            body_file = f"{stem}.body"
            (directory / body_file).write_bytes(body)
    record = {
        "test": case.test,
        "name": case.name,
        "source": f"{source}tests/data/test{case.test}",
        "keywords": case.keywords,
        "classes": classes(case.reply),
        "curl_exit": case.curl_exit,
        "status": case.status,
        "verdict": case.verdict,
        "body": body_file,
        "body_source": case.body_source or None,
        "close": case.close,
        "hold": case.hold,
        "options": case.options,
        "tr_encoding": case.tr_encoding,
        "local_curl": {
            "version": local_version,
            "exit": case.local_exit,
            "same_body": None if body_file is None else case.local_body == body,
        },
    }
    text = json.dumps(record, indent=1, ensure_ascii=True) + "\n"
    (directory / f"{stem}.json").write_text(text, encoding="ascii")


def main() -> int:
    parser = argparse.ArgumentParser(description="Rebuild the curl reply corpus.")
    parser.add_argument("curl", type=Path, help="a curl checkout (with tests/data)")
    parser.add_argument("--commit", default="", help="the curl commit, for the record")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    data = args.curl / "tests" / "data"
    disabled = {int(x) for x in re.findall(r"^(\d+)$", (data / "DISABLED").read_text(), re.M)}
    reasons: dict[str, int] = {}
    cases: list[Case] = []
    for path in sorted(data.glob("test[0-9]*"), key=lambda p: int(p.name[4:])):
        result = select(path, disabled)
        if isinstance(result, Case):
            cases.append(result)
        else:
            reasons[result] = reasons.get(result, 0) + 1
    local_version = run_local_curl(cases)
    for old in args.out.glob("[0-9][0-9][0-9][0-9].*"):
        old.unlink()
    source = f"curl/curl@{args.commit} " if args.commit else "curl/curl "
    for case in cases:
        write_case(case, args.out, source, local_version)
    print(f"{len(cases)} cases written; left out:", file=sys.stderr)
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        print(f"  {count:4d}  {reason}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
