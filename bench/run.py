"""swarmget's benchmark: wall time, files/s, MB/s and peak RSS against peer tools.

Usage (from the repository root, with the venv's python)::

    .venv/bin/python bench/run.py [--scenario nginx-50k|nginx-https-50k|latency-100ms|
        latency-100ms-nginx|scale-10k|stream-100ms|stream-100ms-nginx|
        stream-nginx-50k|all]
        [--rounds 5] [--tools swarmget,pycurl,...] [--files N] [--timeout S]

Method (``bench/README.md`` says why): every run of every tool is a fresh process
(``bench/peers.py``) so its RSS is its own; output goes to tmpfs under
``/dev/shm`` and is deleted between runs; tools are interleaved round-robin within
each round so machine noise hits all of them alike; the table reports medians over
rounds.  Every run is verified on disk (file count, total bytes, spot-checked
content), or for a streaming tool by the value it returned for every item: a
tool that did not fetch (or process) everything is marked failed, not fast.
Raw results go to ``bench/results/<time>-<scenario>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import servers
import swarmget
import workload
from peers import STREAM_TOOLS, img2dataset_binary
from swarmget.testing.process import child_env

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"
TMPFS = Path("/dev/shm")
SIZE = 51200
BIG_SIZE = 1 << 30  # nginx-1g
BASELINE = "pycurl"
STREAM = "stream-100ms"  # W6: the scenarios whose tables show the limit
STREAM_NGINX = "stream-100ms-nginx"
STREAMS = (STREAM, STREAM_NGINX)
NOMAP = "swarmget-stream-nomap"  # W6's download-only run, the limit's first term
W6_TOOLS = ["swarmget-stream", NOMAP, "threads-requests", "aiohttp-queue", "torch-dataloader"]

Job = tuple[str, str]


@dataclasses.dataclass
class Case:
    """One workload: the job list every tool gets, and how to check a result."""

    label: str
    concurrency: int
    jobs: list[Job]
    size: int
    expected: Callable[[str], bytes]  # content of the file at a job's output path
    jobs_file: Path = Path()
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # for the tool's process
    # stream-100ms: what workload.decode returns for each job (by index), and the
    # CPU it took over all the bodies in one process (the limit's "CPU of fn").
    decoded: dict[int, str] = dataclasses.field(default_factory=dict)
    decode_cpu_s: float | None = None


Setup = tuple[servers.BenchServer, list[Case]]


@dataclasses.dataclass
class Scenario:
    name: str
    title: str
    tools: list[str]  # default tool set
    default_files: int
    timeout: float  # per tool run, seconds
    setup: Callable[[Path, int], contextlib.AbstractContextManager[Setup]]
    baseline: str = BASELINE  # the "vs" column's reference, and the warm-up run's tool


# -- scenarios --------------------------------------------------------------------------


@contextlib.contextmanager
def setup_nginx(work: Path, files: int) -> Iterator[Setup]:
    from swarmget.testing.nginx import make_tree

    root = work / "srv"
    root.mkdir()
    names = make_tree(root, files, SIZE)
    with servers.nginx(root) as server:
        jobs = [(server.url(name), name) for name in names]
        yield server, [Case("", 100, jobs, SIZE, lambda rel: (root / rel).read_bytes())]


@contextlib.contextmanager
def setup_nginx_big(work: Path, files: int) -> Iterator[Setup]:
    """Big files: ``files`` of 1 GiB from nginx, a few at a time."""
    from swarmget.testing.nginx import make_tree

    root = work / "srv"
    root.mkdir()
    names = make_tree(root, files, BIG_SIZE, name_fmt="{prefix}{i:03d}.bin", prefix="big")
    with servers.nginx(root) as server:
        jobs = [(server.url(name), name) for name in names]
        yield server, [Case("", 8, jobs, BIG_SIZE, lambda rel: (root / rel).read_bytes())]


@contextlib.contextmanager
def setup_nginx_https(work: Path, files: int) -> Iterator[Setup]:
    from swarmget.testing.nginx import make_tls_files, make_tree

    root = work / "srv"
    root.mkdir()
    names = make_tree(root, files, SIZE)
    tls = make_tls_files(work / "tls")
    with servers.nginx(root, tls=tls) as server:
        jobs = [(server.url(name), name) for name in names]
        # Every peer trusts the throwaway CA through its own option (peers.py).
        env = {"BENCH_CA_FILE": str(tls.ca_pem)}
        yield server, [Case("", 100, jobs, SIZE, lambda rel: (root / rel).read_bytes(), env=env)]


def _latency_jobs(server: servers.ScriptedServer, files: int, latency: float) -> list[Job]:
    names = [f"f{i:06d}.bin" for i in range(files)]
    return [(server.file_url(name, SIZE, latency), name) for name in names]


def _latency_body(rel: str) -> bytes:
    from swarmget.testing import expected_body

    return expected_body(os.path.basename(rel), SIZE)


@contextlib.contextmanager
def setup_latency(work: Path, files: int) -> Iterator[Setup]:
    with servers.scripted_server() as server:
        jobs = _latency_jobs(server, files, 0.1)
        yield server, [Case("", 200, jobs, SIZE, _latency_body)]


@contextlib.contextmanager
def setup_latency_nginx(work: Path, files: int) -> Iterator[Setup]:
    # The same workload from nginx: the delay is a timer in nginx, so what is
    # left of the run's time beyond the ideal is the client's own.
    from swarmget.testing.nginx import make_tree

    root = work / "srv"
    root.mkdir()
    names = make_tree(root, files, SIZE)
    with servers.nginx(root, delay=0.1) as server:
        jobs = [(server.url(f"delayed/{name}"), name) for name in names]
        yield server, [Case("", 200, jobs, SIZE, lambda rel: (root / rel).read_bytes())]


@contextlib.contextmanager
def setup_scale(work: Path, files: int) -> Iterator[Setup]:
    # All connections at once: one file per connection, each answered after 2 s.
    # The baseline fetches the same files over 100 connections; a shorter delay
    # keeps it short and does not change what a connection costs in memory.
    # The issue asks what a connection costs in *one* process: one worker.
    one = {"SWARMGET_WORKERS": "1"}
    with servers.scripted_server() as server:
        wide = min(files, 10_000)
        yield (
            server,
            [
                Case(
                    f"{wide} conns", wide, _latency_jobs(server, files, 2.0), SIZE,
                    _latency_body, env=one,
                ),
                Case(
                    "100 conns", 100, _latency_jobs(server, files, 0.02), SIZE,
                    _latency_body, env=one,
                ),
            ],
        )  # fmt: skip


def _decoding(
    setup: Callable[[Path, int], contextlib.AbstractContextManager[Setup]],
) -> Callable[[Path, int], contextlib.AbstractContextManager[Setup]]:
    """W6 on ``setup``'s server and files: each body decoded where the tool runs
    user code (BENCH_MAP tells the peers; swarmget-stream-nomap ignores it)."""

    @contextlib.contextmanager
    def decoding(work: Path, files: int) -> Iterator[Setup]:
        with setup(work, files) as (server, cases):
            for case in cases:
                case.env = {**case.env, "BENCH_MAP": "decode"}
                case.decoded, case.decode_cpu_s = decode_all(case)
            yield server, cases

    return decoding


setup_stream_latency = _decoding(setup_latency)
# W6 from nginx: the 100 ms is a timer in nginx, so the server costs the two
# cores next to nothing, as a remote server would.  The scripted server's
# Python (stream-100ms) takes a share of them that every tool pays for.
setup_stream_latency_nginx = _decoding(setup_latency_nginx)


def decode_all(case: Case) -> tuple[dict[int, str], float]:
    """workload.decode over every expected body, here, in one process: the values
    each tool must return, and the CPU seconds decoding costs on this machine."""
    bodies = [case.expected(rel) for _, rel in case.jobs]
    start = time.process_time()
    decoded = {index: workload.decode(body) for index, body in enumerate(bodies)}
    cpu = time.process_time() - start
    print(
        f"  decode: {cpu:.2f} s of CPU for {len(bodies):,} bodies "
        f"({cpu / max(1, len(bodies)) * 1e3:.2f} ms each)",
        file=sys.stderr, flush=True,
    )  # fmt: skip
    return decoded, cpu


# The file-writing peers of W1 and of the big files.
FILE_TOOLS = [
    "swarmget",
    "swarmget-1",
    "swarmget-cli",
    "pycurl",
    "aiohttp",
    "requests",
    "aria2c",
    "curl",
    "img2dataset",
]

SCENARIOS = {
    "nginx-50k": Scenario(
        "nginx-50k",
        "{files:,} x 50 KB from nginx (1 worker) on loopback, concurrency 100",
        FILE_TOOLS,
        10_000,
        180.0,
        setup_nginx,
    ),
    "nginx-1g": Scenario(
        "nginx-1g",
        "{files:,} x 1 GiB from nginx (1 worker) on loopback, up to 8 at a time",
        [tool for tool in FILE_TOOLS if tool != "img2dataset"],  # it holds bodies in memory
        1,
        300.0,
        setup_nginx_big,
    ),
    "nginx-https-50k": Scenario(
        "nginx-https-50k",
        "{files:,} x 50 KB from nginx (1 worker) over HTTPS on loopback, concurrency 100",
        [
            "swarmget",
            "swarmget-1",
            "swarmget-cli",
            "pycurl",
            "aiohttp",
            "aria2c",
            "curl",
            "img2dataset",
        ],
        10_000,
        180.0,
        setup_nginx_https,
    ),
    "latency-100ms": Scenario(
        "latency-100ms",
        "{files:,} x 50 KB, every response delayed 100 ms, concurrency 200 "
        "(ideal: files / 200 x 0.1 s)",
        ["swarmget", "swarmget-1", "swarmget-cli", "pycurl", "aiohttp", "aria2c", "curl"],
        2_000,
        120.0,
        setup_latency,
    ),
    "latency-100ms-nginx": Scenario(
        "latency-100ms-nginx",
        "{files:,} x 50 KB from nginx (1 worker), every response delayed 100 ms by nginx, "
        "concurrency 200 (ideal: files / 200 x 0.1 s)",
        ["swarmget", "swarmget-1", "swarmget-cli", "pycurl", "aiohttp", "aria2c", "curl"],
        2_000,
        120.0,
        setup_latency_nginx,
    ),
    "scale-10k": Scenario(
        "scale-10k",
        "{files:,} x 50 KB, every response delayed 2 s, all connections at once vs 100",
        ["swarmget"],
        10_000,
        300.0,
        setup_scale,
    ),
    STREAM: Scenario(
        STREAM,
        "{files:,} x 50 KB, every response delayed 100 ms, each body decoded "
        "(~2 ms of CPU holding the GIL), concurrency 200",
        W6_TOOLS,
        2_000,
        180.0,
        setup_stream_latency,
        baseline="swarmget-stream",
    ),
    STREAM_NGINX: Scenario(
        STREAM_NGINX,
        "{files:,} x 50 KB from nginx (1 worker), every response delayed 100 ms by nginx, "
        "each body decoded (~2 ms of CPU holding the GIL), concurrency 200",
        W6_TOOLS,
        2_000,
        180.0,
        setup_stream_latency_nginx,
        baseline="swarmget-stream",
    ),
    "stream-nginx-50k": Scenario(
        "stream-nginx-50k",
        "{files:,} x 50 KB from nginx (1 worker) on loopback, every body into the caller "
        "(swarmget.stream without map) vs the CLI writing files, concurrency 100",
        ["swarmget-stream", "swarmget-cli"],
        10_000,
        180.0,
        setup_nginx,  # W1's server and files; the stream tools hand bodies to the caller
        baseline="swarmget-cli",
    ),
}

NOTES = {
    "swarmget-1": "swarmget-1 is the API with workers=1: one process, one event loop; "
    "swarmget (the default) uses one worker process per CPU.",
    "swarmget-cli": "swarmget-cli is timed from exec to exit: interpreter start-up and "
    "imports included. Every other Python tool is timed around its download call.",
    "aria2c": "aria2c: `-j N -x 1 -s 1` (N downloads at once, one connection each); "
    "aria2's `-x`/--max-connection-per-server caps connections *per download* at 16, "
    "not per host, so `-j N` still opens N connections to one host (see the conns column).",
    "curl": "curl: `--parallel --parallel-immediate --parallel-max N` with a config file of "
    "url/output pairs (curl caps --parallel-max at 300).",
    "requests": "requests: ThreadPoolExecutor(N), one Session per thread.",
    "img2dataset": "img2dataset 1.47: `--output_format files --resize_mode no "
    "--disable_all_reencoding True --compute_hash None`, one process per CPU with N/CPUs "
    "threads each, shards of 1,000 rows; timed from exec to exit (its imports: pandas, "
    "pyarrow, opencv). Its files are moved to the job's names after the clock stops.",
    "swarmget-stream": "swarmget-stream: `with swarmget.stream(urls, concurrency=N, "
    "per_host=N) as items`, every item consumed; in stream-100ms with `map=decode` "
    "(decode runs in the worker process that downloaded the item), elsewhere without "
    "map (each body comes back to the caller, `item.read()`).",
    NOMAP: f"{NOMAP}: swarmget.stream without map, bodies into the caller and not decoded: "
    "the download alone, the limit's first term.",
    "threads-requests": "threads-requests: ThreadPoolExecutor(N), a requests.Session per "
    "thread, bodies into a queue.Queue(256) drained by the main thread, which decodes them.",
    "aiohttp-queue": "aiohttp-queue: one ClientSession, N fetcher tasks into an "
    "asyncio.Queue(256), one consumer coroutine decoding on the event loop.",
    "torch-dataloader": "torch-dataloader: DataLoader(num_workers=8, batch_size=None) over "
    "a map-style dataset whose __getitem__ fetches with requests (a Session per worker) "
    "and decodes; 8 workers whatever the concurrency. Its peak RSS sums 9 processes "
    "that each map torch (shared pages count in every one of them).",
}


# -- running one tool once --------------------------------------------------------------


@dataclasses.dataclass
class Run:
    tool: str
    case: str
    round: int
    ok: bool
    elapsed: float | None = None
    maxrss_kb: int | None = None
    cpu_s: float | None = None
    files: int = 0
    bytes: int = 0
    conns_opened: int | None = None
    conns_peak: int | None = None
    problem: str = ""
    server_cpu_s: float | None = None  # the server's CPU during the run (servers.py)


def run_once(
    tool: str, case: Case, round_no: int, work: Path, server: servers.BenchServer, timeout: float
) -> Run:
    out = work / "out" / tool
    result_file = work / f"result-{tool}.json"
    stderr_file = work / f"stderr-{tool}.txt"
    _clear(out)
    result_file.unlink(missing_ok=True)
    _settle()
    _counters(server, reset=True)
    server_cpu = _server_cpu(server)
    argv = [sys.executable, str(BENCH / "peers.py"), tool, str(case.jobs_file), str(out)]
    argv += ["--concurrency", str(case.concurrency), "--result", str(result_file)]
    env = child_env()  # the swarmget this script imports, compiled or not
    env.update(case.env)
    run = Run(tool, case.label, round_no, ok=False)
    with open(stderr_file, "wb") as stderr:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, env=env,
            start_new_session=True,
        )  # fmt: skip
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            run.problem = f"timed out after {timeout:g} s"
        finally:  # also on Ctrl-C: nothing the tool started may linger
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    server_cpu_after = _server_cpu(server)
    if server_cpu is not None and server_cpu_after is not None:
        run.server_cpu_s = round(server_cpu_after - server_cpu, 3)
    counters = _counters(server)
    if counters:
        run.conns_opened, run.conns_peak = counters["opened"], counters["peak_open"]
    result = _read_json(result_file)
    if run.problem:
        pass
    elif result is None:
        run.problem = f"exited {proc.returncode} without a result: {_tail(stderr_file)}"
    elif "crash" in result:
        run.problem = f"crashed: {result['crash']}"
    else:
        run.elapsed = result["elapsed"]
        run.maxrss_kb = result["maxrss_kb"]
        run.cpu_s = result["cpu_s"]
        if result["error_count"]:
            run.problem = f"{result['error_count']} errors, e.g. {result['errors'][0]}"
    run.files, run.bytes, check_problem = check_output(tool, case, out, result)
    if check_problem and not run.problem:
        run.problem = check_problem
    run.ok = not run.problem
    _clear(out)
    return run


def check_output(
    tool: str, case: Case, out: Path, result: dict[str, Any] | None
) -> tuple[int, int, str]:
    """(files, bytes, problem or ""): on disk, or a streaming tool's returned values."""
    if tool not in STREAM_TOOLS:
        return verify(out, case)
    got = {int(index): value for index, value in (result or {}).get("values", {}).items()}
    return verify_values(got, expected_values(tool, case), case.size)


def expected_values(tool: str, case: Case) -> dict[int, str]:
    """What ``tool`` must return per item: decode's value where the case decodes,
    else workload.body_check (length, and a digest for a spread sample)."""
    if case.decoded and tool != NOMAP:
        return case.decoded
    sampled = workload.sample(len(case.jobs))
    size = str(case.size)
    return {
        index: workload.body_check(index, case.expected(rel), sampled) if index in sampled
        else size
        for index, (_, rel) in enumerate(case.jobs)
    }  # fmt: skip


def verify_values(got: dict[int, str], want: dict[int, str], size: int) -> tuple[int, int, str]:
    """A streaming tool fetched everything if it returned the right value for every
    item; a skipped or wrong item fails the run.  Bytes are nominal (count x size)."""
    count = len(got.keys() & want.keys())
    if count != len(want) or len(got) != len(want):
        return count, count * size, f"returned {len(got):,} items for {len(want):,} jobs"
    wrong = [index for index in want if got[index] != want[index]]
    if wrong:
        return count, count * size, f"{len(wrong):,} wrong values, e.g. item {wrong[0]}"
    return count, count * size, ""


def verify(out: Path, case: Case) -> tuple[int, int, str]:
    """Count files and bytes under ``out`` (ignoring a ``.swarmget`` state dir) and
    spot-check content; return (files, bytes, problem or "")."""
    files = total = 0
    by_name: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(out):
        dirnames[:] = [d for d in dirnames if d != ".swarmget"]
        for name in filenames:
            path = os.path.join(dirpath, name)
            files += 1
            total += os.stat(path).st_size
            by_name.setdefault(name, path)
    want_files, want_bytes = len(case.jobs), len(case.jobs) * case.size
    if files != want_files or total != want_bytes:
        return files, total, f"on disk: {files:,}/{want_files:,} files, {total:,}/{want_bytes:,} B"
    step = max(1, len(case.jobs) // 20)
    for _, rel in case.jobs[::step]:
        # Peers write the path they were given; swarmget names files itself, so fall
        # back to the base name, and skip the check when that is not found either.
        path = out / rel if (out / rel).is_file() else by_name.get(os.path.basename(rel))
        if path is not None and Path(path).read_bytes() != case.expected(rel):
            return files, total, f"wrong content in {rel}"
    return files, total, ""


def _counters(server: servers.BenchServer, reset: bool = False) -> dict[str, int | None] | None:
    """The server's connection counters; None (an empty cell) if it cannot answer."""
    try:
        if reset:
            server.reset_counters()
            return None
        return server.counters()
    except Exception:
        return None


def _server_cpu(server: servers.BenchServer) -> float | None:
    try:
        return server.cpu_seconds()
    except Exception:
        return None  # an empty cell, never a failed run


def _settle(quiet: float = 0.9, window: float = 0.1, longest: float = 3.0) -> None:
    """Wait until the machine is quiet: the CPUs at least ``quiet`` idle over one
    ``window`` (at most ``longest`` seconds).  The tool run before may leave work
    behind -- the server closing its connections, the kernel freeing its pages --
    and without this the next tool would pay for it: on 2 cores, a tool that
    keeps both busy lost ~6% after a peer that left the server busy."""
    deadline = time.monotonic() + longest
    while time.monotonic() < deadline:
        before = _cpu_times()
        time.sleep(window)
        after = _cpu_times()
        if before is None or after is None:
            return  # no /proc/stat: nothing to wait on
        total = after[0] - before[0]
        if total <= 0 or (after[1] - before[1]) / total >= quiet:
            return


def _cpu_times() -> tuple[int, int] | None:
    """(all, idle) jiffies of every CPU together, from /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields), fields[3] + fields[4]  # idle + iowait


def _clear(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


# -- a scenario -------------------------------------------------------------------------


def run_scenario(
    scenario: Scenario, tools: list[str], rounds: int, files: int, timeout: float | None
) -> dict[str, Any]:
    work = Path(f"{TMPFS}/swarmget-bench-{os.getpid()}")
    _clear(work)
    work.mkdir(parents=True)
    runs: list[Run] = []
    title = scenario.title.format(files=files)
    print(f"\n== {scenario.name}: {title}; {rounds} rounds", file=sys.stderr, flush=True)
    try:
        with scenario.setup(work, files) as (server, cases):
            for index, case in enumerate(cases):
                case.jobs_file = work / f"jobs-{index}.tsv"
                case.jobs_file.write_text("".join(f"{u}\t{p}\n" for u, p in case.jobs))
            units = [(tool, case) for tool in tools for case in cases]
            # One untimed pass first, so no tool pays for cold server caches.
            warm = scenario.baseline if scenario.baseline in tools else tools[0]
            for case in cases:
                run = run_once(warm, case, -1, work, server, timeout or scenario.timeout)
                _progress(run)
            for round_no in range(rounds):
                shift = round_no % len(units)
                for tool, case in units[shift:] + units[:shift]:
                    run = run_once(tool, case, round_no, work, server, timeout or scenario.timeout)
                    runs.append(run)
                    _progress(run)
    finally:
        _clear(work)
    return {
        "scenario": scenario.name,
        "title": title,
        "files": files,
        "rounds": rounds,
        "tools": tools,
        "cases": [
            {
                "label": c.label,
                "concurrency": c.concurrency,
                "size": c.size,
                "decode_cpu_s": c.decode_cpu_s,
            }
            for c in cases
        ],
        "runs": [dataclasses.asdict(r) for r in runs],
    }


def _progress(run: Run) -> None:
    label = f"{run.tool}{' @ ' + run.case if run.case else ''}"
    if run.ok:
        assert run.elapsed is not None and run.maxrss_kb is not None
        line = f"{run.elapsed:7.3f} s  {run.maxrss_kb / 1024:7.1f} MiB  conns {run.conns_opened}"
    else:
        line = f"FAILED: {run.problem}"
    when = "warm-up" if run.round < 0 else f"round {run.round + 1}"
    print(f"  {when:<8} {label:<28} {line}", file=sys.stderr, flush=True)


# -- summaries --------------------------------------------------------------------------


@dataclasses.dataclass
class Summary:
    tool: str
    case: str
    ok_runs: int
    runs: int
    elapsed: float | None
    elapsed_min: float | None
    elapsed_max: float | None
    maxrss_mib: float | None
    cpu_s: float | None
    cpu_ms_per_file: float | None  # the client's CPU (all its processes) per file
    conns_opened: int | None
    conns_peak: int | None
    files_per_s: float | None
    mb_per_s: float | None
    problem: str
    server_cpu_s: float | None = None  # median over the good runs


def summarize(data: dict[str, Any]) -> list[Summary]:
    runs = [Run(**r) for r in data["runs"]]
    sizes = {c["label"]: c["size"] for c in data["cases"]}
    summaries = []
    for case in (c["label"] for c in data["cases"]):
        for tool in data["tools"]:
            mine = [r for r in runs if r.tool == tool and r.case == case]
            good = [r for r in mine if r.ok]
            problem = next((r.problem for r in mine if not r.ok), "")
            if not good:
                summaries.append(Summary(tool, case, 0, len(mine), *([None] * 10), problem=problem))
                continue
            wall = statistics.median(r.elapsed for r in good if r.elapsed is not None)
            count = data["files"]
            cpu = statistics.median(r.cpu_s for r in good if r.cpu_s is not None)
            summaries.append(
                Summary(
                    tool,
                    case,
                    len(good),
                    len(mine),
                    wall,
                    min(r.elapsed for r in good if r.elapsed is not None),
                    max(r.elapsed for r in good if r.elapsed is not None),
                    statistics.median(r.maxrss_kb / 1024 for r in good if r.maxrss_kb),
                    cpu,
                    cpu / count * 1e3,
                    _median_int([r.conns_opened for r in good]),
                    _median_int([r.conns_peak for r in good]),
                    count / wall,
                    count * sizes[case] / 1e6 / wall,
                    problem,
                    _median_float([r.server_cpu_s for r in good]),
                )
            )
    return summaries


def _median_float(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _server(s: Summary) -> str:
    return "-" if s.server_cpu_s is None else f"{s.server_cpu_s:.2f}"


def _median_int(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return int(statistics.median(present)) if present else None


def markdown(data: dict[str, Any]) -> str:
    summaries = summarize(data)
    lines = [f"### {data['scenario']}: {data['title']}", ""]
    lines.append(
        f"Median of {data['rounds']} rounds; {_machine_line(data['machine'])}; "
        f"output on tmpfs; {data['date']}."
    )
    lines.append("")
    baseline = SCENARIOS[data["scenario"]].baseline if data["scenario"] in SCENARIOS else BASELINE
    if data["scenario"] == "scale-10k":
        lines += _scale_table(summaries)
    elif data["scenario"] in STREAMS:
        lines += _stream_table(summaries, stream_limit(data, summaries))
    else:
        lines += _speed_table(summaries, baseline)
        lines += _stream_nginx_goal(summaries) if data["scenario"] == "stream-nginx-50k" else []
    notes = [NOTES[t] for t in data["tools"] if t in NOTES]
    if notes:
        lines.append("")
        lines += [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def _speed_table(summaries: list[Summary], baseline: str) -> list[str]:
    base = next((s for s in summaries if s.tool == baseline and s.files_per_s), None)
    peak = any(s.conns_peak is not None for s in summaries)
    head = "| tool | wall s (min-max) | client CPU ms/file | files/s | MB/s | vs " + baseline
    head += " | peak RSS MiB | CPU s | server CPU s | conns" + (" (peak open) |" if peak else " |")
    lines = [head + " result |", "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for s in summaries:
        if s.elapsed is None:
            lines.append(f"| {s.tool} |{' - |' * 9} FAILED: {_cell(s.problem)} |")
            continue
        assert s.files_per_s is not None and s.mb_per_s is not None
        ratio = f"{s.files_per_s / base.files_per_s:.2f}x" if base and base.files_per_s else "-"
        lines.append(
            f"| {s.tool} | {_wall(s)} | {s.cpu_ms_per_file:.3f} | {s.files_per_s:,.0f} "
            f"| {s.mb_per_s:,.1f} | {ratio} | {s.maxrss_mib:,.1f} | {s.cpu_s:.2f} "
            f"| {_server(s)} | {_conns(s, peak)} | {_result(s)} |"
        )
    return lines


def _wall(s: Summary) -> str:
    return f"{s.elapsed:.3f} ({s.elapsed_min:.3f}-{s.elapsed_max:.3f})"


def _conns(s: Summary, peak: bool) -> str:
    conns = "-" if s.conns_opened is None else f"{s.conns_opened:,}"
    if peak and s.conns_peak is not None:
        conns += f" ({s.conns_peak:,})"
    return conns


def _result(s: Summary) -> str:
    return "ok" if s.ok_runs == s.runs else f"{s.ok_runs}/{s.runs} ok: {_cell(s.problem)}"


def _stream_nginx_goal(summaries: list[Summary]) -> list[str]:
    """Issue 14's goal for W1 without map, when both rows have a figure."""
    speed = {s.tool: s.files_per_s for s in summaries if s.files_per_s}
    if "swarmget-stream" not in speed or "swarmget-cli" not in speed:
        return []
    ratio = speed["swarmget-stream"] / speed["swarmget-cli"]
    return [
        "",
        f"- Goal (issue 14, W1 without map): swarmget-stream at >= 0.8x the files/s of "
        f"swarmget-cli writing files: **{ratio:.2f}x** ({'met' if ratio >= 0.8 else 'not met'}).",
    ]


# -- W6: the limit and the stream table ---------------------------------------------------

PEERS_TODAY = ["threads-requests", "aiohttp-queue", "torch-dataloader"]


def stream_limit(data: dict[str, Any], summaries: list[Summary]) -> dict[str, float] | None:
    """Issue 14's limit for W6: max(download-only wall, (CPU of decode over every
    body + the download-only run's CPU) / usable cores); None without a good
    swarmget-stream-nomap row."""
    nomap = next((s for s in summaries if s.tool == NOMAP and s.elapsed), None)
    decode_cpu = data["cases"][0].get("decode_cpu_s")
    if nomap is None or nomap.cpu_s is None or nomap.elapsed is None or decode_cpu is None:
        return None
    cores = data["machine"].get("usable_cores") or data["machine"]["cpus"]
    cpu_bound = (decode_cpu + nomap.cpu_s) / cores
    return {
        "download_wall_s": nomap.elapsed,
        "download_cpu_s": nomap.cpu_s,
        "decode_cpu_s": decode_cpu,
        "cores": cores,
        "cpu_bound_s": cpu_bound,
        "limit_s": max(nomap.elapsed, cpu_bound),
    }


def _stream_table(summaries: list[Summary], limit: dict[str, float] | None) -> list[str]:
    ours = next((s for s in summaries if s.tool == "swarmget-stream" and s.elapsed), None)
    lines = [
        "| tool | wall s (min-max) | files/s | wall / limit | wall / swarmget-stream "
        "| peak RSS MiB | CPU s | server CPU s | conns (peak open) | result |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for s in summaries:
        if s.elapsed is None:
            lines.append(f"| {s.tool} |{' - |' * 8} FAILED: {_cell(s.problem)} |")
            continue
        to_limit = f"{s.elapsed / limit['limit_s']:.2f}x" if limit else "-"
        to_ours = f"{s.elapsed / ours.elapsed:.2f}x" if ours and ours.elapsed else "-"
        lines.append(
            f"| {s.tool} | {_wall(s)} | {s.files_per_s:,.0f} | {to_limit} | {to_ours} "
            f"| {s.maxrss_mib:,.1f} | {s.cpu_s:.2f} | {_server(s)} | {_conns(s, True)} "
            f"| {_result(s)} |"
        )
    return [*lines, "", *_stream_goals(summaries, limit, ours)]


def _stream_goals(
    summaries: list[Summary], limit: dict[str, float] | None, ours: Summary | None
) -> list[str]:
    if limit is None:
        return [f"- Limit: - (needs a good {NOMAP} row)"]
    lines = [
        f"- Limit = max(download only: {NOMAP}'s wall {limit['download_wall_s']:.3f} s, "
        f"(decode's CPU {limit['decode_cpu_s']:.2f} s + the download's CPU "
        f"{limit['download_cpu_s']:.2f} s) / {limit['cores']:g} cores = "
        f"{limit['cpu_bound_s']:.3f} s) = **{limit['limit_s']:.3f} s**"
    ]
    if ours is None or ours.elapsed is None:
        return lines
    ratio = ours.elapsed / limit["limit_s"]
    lines.append(
        f"- Goal (issue 14, W6): swarmget-stream within 1.2x the limit: **{ratio:.2f}x** "
        f"({'met' if ratio <= 1.2 else 'not met'})"
    )
    today = [s for s in summaries if s.tool in PEERS_TODAY and s.elapsed]
    if today:
        best = min(today, key=lambda s: s.elapsed or 0.0)
        assert best.elapsed is not None
        times = best.elapsed / ours.elapsed
        lines.append(
            f"- Goal (issue 14, W6): at least 2x faster than the best of today's ways "
            f"({best.tool}, {best.elapsed:.3f} s): **{times:.2f}x** "
            f"({'met' if times >= 2 else 'not met'}; rows that failed are not counted)"
        )
    return lines


def _scale_table(summaries: list[Summary]) -> list[str]:
    lines = [
        "| tool | connections | wall s (min-max) | files/s | peak RSS MiB | CPU s "
        "| peak open at server | result |",
        "|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    by_tool: dict[str, list[Summary]] = {}
    for s in summaries:
        by_tool.setdefault(s.tool, []).append(s)
        if s.elapsed is None:
            lines.append(f"| {s.tool} | {s.case} | - | - | - | - | - | FAILED: {s.problem} |")
            continue
        result = "ok" if s.ok_runs == s.runs else f"{s.ok_runs}/{s.runs} ok: {_cell(s.problem)}"
        lines.append(
            f"| {s.tool} | {s.case} | {s.elapsed:.3f} ({s.elapsed_min:.3f}-{s.elapsed_max:.3f}) "
            f"| {s.files_per_s:,.0f} | {s.maxrss_mib:,.1f} | {s.cpu_s:.2f} "
            f"| {s.conns_peak if s.conns_peak is not None else '-'} | {result} |"
        )
    lines.append("")
    for tool, (wide, narrow) in ((t, pair) for t, pair in by_tool.items() if len(pair) == 2):
        if wide.maxrss_mib is None or narrow.maxrss_mib is None:
            continue
        n_wide, n_narrow = int(wide.case.split()[0]), int(narrow.case.split()[0])
        if n_wide <= n_narrow:
            continue
        per_conn = (wide.maxrss_mib - narrow.maxrss_mib) * 1024 / (n_wide - n_narrow)
        lines.append(
            f"- {tool}: memory per connection = (peak RSS at {n_wide:,} - at {n_narrow:,}) "
            f"/ {n_wide - n_narrow:,} = **{per_conn:.1f} KiB**"
        )
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")[:160]


def _machine_line(machine: dict[str, Any]) -> str:
    return f"{machine['cpus']} CPUs ({machine['cpu']}), Linux {machine['kernel']}"


def machine_info() -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "versions": _versions(),
    }


def _package_versions(python: str, packages: tuple[str, ...]) -> dict[str, str]:
    """The versions of ``packages`` as ``python`` has them (pycurl's libcurl too),
    the ones it lacks left out; {} if that python cannot run."""
    probe = (
        "import importlib.metadata as m\n"
        f"for p in {packages!r}:\n"
        "    try: print(p, m.version(p))\n"
        "    except Exception: pass\n"
        "try:\n"
        "    import pycurl; print('pycurl-libcurl', pycurl.version)\n"
        "except Exception: pass\n"
    )
    try:
        proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(line.partition(" ")[::2] for line in proc.stdout.splitlines())


def _versions() -> dict[str, str]:
    versions = {}
    commands = {
        "aria2c": ["aria2c", "--version"],
        "curl": ["curl", "--version"],
        "nginx": ["nginx", "-v"],
        "swarmget": ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
    }
    for name, argv in commands.items():
        with contextlib.suppress(OSError):
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            text = (proc.stdout or proc.stderr).strip().splitlines()
            versions[name] = text[0] if text else ""
    versions |= _package_versions(sys.executable, ("pycurl", "aiohttp", "requests", "torch"))
    versions |= _package_versions(str(img2dataset_binary().parent / "python"), ("img2dataset",))
    build = "compiled with mypyc" if swarmget.compiled() else "pure Python"
    versions["swarmget"] = f"{versions.get('swarmget', '?')} ({build})"
    return versions


# -- command line -----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", default="all", choices=[*SCENARIOS, "all"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tools", help="comma-separated (default: the scenario's set)")
    parser.add_argument("--files", type=int, help="files per run (default: the scenario's)")
    parser.add_argument("--timeout", type=float, help="seconds per tool run")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so servers stop and temp dirs go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not TMPFS.is_dir():
        parser.error(f"{TMPFS} (tmpfs) is missing")
    from peers import TOOLS

    chosen = [SCENARIOS[args.scenario]] if args.scenario != "all" else list(SCENARIOS.values())
    RESULTS.mkdir(exist_ok=True)
    machine = machine_info()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for scenario in chosen:
        tools = args.tools.split(",") if args.tools else scenario.tools
        unknown = [t for t in tools if t not in TOOLS]
        if unknown:
            parser.error(f"unknown tool(s) {unknown}; known: {', '.join(TOOLS)}")
        started = time.time()
        data = run_scenario(scenario, tools, args.rounds, args.files or scenario.default_files,
                            args.timeout)  # fmt: skip
        data["machine"] = machine
        data["date"] = datetime.date.today().isoformat()
        data["bench_seconds"] = round(time.time() - started, 1)
        data["summary"] = [dataclasses.asdict(s) for s in summarize(data)]
        if scenario.name in STREAMS:
            data["limit"] = stream_limit(data, summarize(data))
        path = RESULTS / f"{stamp}-{scenario.name}.json"
        path.write_text(json.dumps(data, indent=1))
        print("\n" + markdown(data))
        print(f"(raw results: {path.relative_to(REPO)})\n", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
