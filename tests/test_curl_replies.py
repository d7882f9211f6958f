"""swarmget reads what curl reads: replies from curl's own test suite, curl's verdicts.

``tests/data/curl_replies/`` holds raw replies taken from curl's test cases with
what curl does with each (see its README.md): save the body (which bytes) or
fail.  Every reply is served by the scripted test server the way curl's test
server sends it (20-byte writes; the connection closed after it only when the
case says so) and downloaded with ``swarmget.download``; the same replies also
go through the sans-I/O parser alone.  Agreement is "same verdict, and for a
saved file the same bytes".  curl is taken with ``--fail`` semantics (a status
>= 400 saves nothing), which is what swarmget always does.

The figure and every disagreement are printed (``pytest -s``); the test fails
below :data:`REQUIRED`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import swarmget
from swarmget.errors import TransferError
from swarmget.protocol import ResponseHead, ResponseParser
from swarmget.testing import TestServer
from swarmget.testing.replies import SWS_PIECE, replay

CORPUS = Path(__file__).parent / "data" / "curl_replies"
REQUIRED = 0.98
TIME_SCALE = 0.25  # curl's -m and sws's waits, scaled down to keep the run short
TIMEOUT = 1.5  # swarmget's silence timeout: curl would wait forever, tests must not


@dataclass(frozen=True)
class CurlCase:
    test: int
    name: str
    reply: bytes
    close: bool
    hold: float
    verdict: str  # "ok" or "fail"
    body: bytes | None  # what curl saves when the verdict is "ok"
    curl_exit: int
    options: dict[str, float]
    classes: list[str]  # what is out of the ordinary about the reply

    @property
    def id(self) -> str:
        return f"{self.test:04d}"

    def download_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"timeout": TIMEOUT}
        if "max_size" in self.options:
            options["max_size"] = int(self.options["max_size"])
        if "deadline" in self.options:
            options["deadline"] = self.options["deadline"] * TIME_SCALE
        return options


def load_cases() -> list[CurlCase]:
    cases = []
    for meta in sorted(CORPUS.glob("[0-9][0-9][0-9][0-9].json")):
        record = json.loads(meta.read_text())
        body = (CORPUS / record["body"]).read_bytes() if record["body"] else None
        cases.append(
            CurlCase(
                test=record["test"],
                name=record["name"],
                reply=meta.with_suffix(".reply").read_bytes(),
                close=record["close"],
                hold=record["hold"],
                verdict=record["verdict"],
                body=body,
                curl_exit=record["curl_exit"],
                options=record["options"],
                classes=record["classes"],
            )
        )
    return cases


CASES = load_cases()


@dataclass(frozen=True)
class Outcome:
    ok: bool
    body: bytes | None = None
    error: str = ""  # swarmget's code and message when it failed


def disagreement(case: CurlCase, outcome: Outcome) -> str | None:
    """Why swarmget's outcome differs from curl's verdict, or None when it does not."""
    if case.verdict == "fail":
        if outcome.ok:
            saved = len(outcome.body or b"")
            return f"curl fails (exit {case.curl_exit}), swarmget saves {saved} B"
        return None
    if not outcome.ok:
        return f"curl saves {len(case.body or b'')} B, swarmget fails: {outcome.error}"
    if case.body is not None and outcome.body != case.body:
        return f"different bytes: curl {case.body[:40]!r}, swarmget {(outcome.body or b'')[:40]!r}"
    return None


def report(kind: str, cases: list[CurlCase], outcomes: dict[int, Outcome]) -> float:
    """Print the agreement figure and the disagreements; return the figure."""
    misses = [(c, why) for c in cases if (why := disagreement(c, outcomes[c.test])) is not None]
    agreement = 1 - len(misses) / len(cases)
    print(f"\n{kind}: swarmget agrees with curl on {len(cases) - len(misses)}/{len(cases)} "
          f"replies ({agreement:.1%})")  # fmt: skip
    missed = {case.test for case, _ in misses}
    by_class: dict[str, list[int]] = {}
    for case in cases:
        for name in case.classes:
            by_class.setdefault(name, [0, 0])[case.test in missed] += 1
    print("  by class: " + ", ".join(f"{n} {a}/{a + m}" for n, (a, m) in sorted(by_class.items())))
    for case, why in misses:
        print(f"  test{case.test} ({case.name}): {why}")
    return agreement


# -- end to end -----------------------------------------------------------------------


def download_all(cases: list[CurlCase], out: Path) -> dict[int, Outcome]:
    """Each case's outcome through ``swarmget.download`` against the scripted server."""
    outcomes: dict[int, Outcome] = {}
    with TestServer() as srv:
        groups: dict[str, list[CurlCase]] = {}
        for case in cases:
            hold = case.hold * TIME_SCALE
            srv.route(f"/curl/{case.id}", replay(case.reply, close=case.close, hold=hold))
            groups.setdefault(json.dumps(case.download_options(), sort_keys=True), []).append(case)
        for key, group in groups.items():
            dest = out / str(len(outcomes))
            urls = [srv.url(f"/curl/{case.id}") for case in group]
            result = swarmget.download(
                urls, dest, retries=0, workers=1, concurrency=64, per_host=64, **json.loads(key)
            )
            failures = {f.url: f for f in result.failures}
            for case, url in zip(group, urls, strict=True):
                failure = failures.get(url)
                if failure is None:
                    outcomes[case.test] = Outcome(True, (dest / case.id).read_bytes())
                else:
                    error = f"{failure.error}: {failure.message}"
                    outcomes[case.test] = Outcome(False, error=error)
    return outcomes


def test_swarmget_downloads_what_curl_downloads(out_dir: Path) -> None:
    agreement = report("end to end", CASES, download_all(CASES, out_dir))
    assert agreement >= REQUIRED


# -- sans-I/O -------------------------------------------------------------------------


def parse(case: CurlCase, piece: int) -> Outcome:
    """The parser alone: the reply in ``piece``-byte slices, then EOF if the server closes."""
    heads: list[ResponseHead] = []
    body = bytearray()
    parser = ResponseParser(heads.append, body.extend)
    view = memoryview(case.reply)
    try:
        done = False
        for i in range(0, len(view), piece):
            done = parser.feed(view[i : i + piece])
            if done:
                break
        if not done and case.close:
            done = parser.feed_eof()
    except TransferError as exc:
        return Outcome(False, error=str(exc))
    if not done:
        return Outcome(False, error="would wait for more (timeout)")
    status = heads[0].status
    if not 200 <= status < 300:
        return Outcome(False, error=f"http_{status}")
    if "max_size" in case.options and len(body) > case.options["max_size"]:
        return Outcome(False, error="too_large")
    return Outcome(True, bytes(body))


def sans_io_cases() -> Iterator[CurlCase]:
    # -m (a clock) is the engine's business, not the parser's.
    return (case for case in CASES if "deadline" not in case.options)


@pytest.mark.parametrize("piece", [1, SWS_PIECE, 1 << 20])
def test_the_parser_reads_what_curl_reads(piece: int) -> None:
    cases = list(sans_io_cases())
    outcomes = {case.test: parse(case, piece) for case in cases}
    assert report(f"sans-I/O, {piece}-byte pieces", cases, outcomes) >= REQUIRED


def test_the_corpus_is_whole() -> None:
    # Every case has its reply, and every case curl saves has its bytes.
    assert len(CASES) >= 150
    for case in CASES:
        assert case.verdict in ("ok", "fail"), case
        assert case.verdict == "fail" or case.body is not None, case
