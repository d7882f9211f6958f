"""The downloaders under test, one ``prepare_<tool>`` function each, and the child
process that runs exactly one of them.

How a measurement works: ``bench/run.py`` starts a fresh process
``python bench/peers.py TOOL JOBS OUT --concurrency N --result FILE``.  That
process imports only its own tool's library, reads the job list (``url<TAB>path``
lines), calls ``prepare_<tool>`` (untimed: building an aria2 input file, a curl
config, handles), then times the returned ``run()`` and writes one JSON object:
``elapsed`` (seconds, perf_counter around ``run()``), ``maxrss_kb`` and ``cpu_s``.
For in-process tools those are this process's own (``VmHWM``, and CPU from
RUSAGE_SELF; RSS includes the interpreter and the library, as a user would see
it); for external programs they are the program's alone, not this wrapper's
(see :class:`_External`).

Each peer is written the way someone who knows that tool would write a bulk
downloader: the same concurrency as swarmget, keep-alive connections reused for
the whole run, no per-request session or handle creation, every body written to
its own file.  ``run()`` returns a list of error strings (empty when every
transfer reported success); the parent then checks the files on disk anyway.
The streaming peers (``STREAM_TOOLS``) write no files: each body goes to the
caller's code, and the runner keeps one value per item, which ``measure``
passes on (``values``) for the parent to check instead.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

Job = tuple[str, str]  # (url, output path relative to the output dir)
Runner = Callable[[], list[str]]

REPO = Path(__file__).resolve().parent.parent
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)


def _ca_file() -> str | None:
    """The CA an HTTPS scenario's server certificate chains to (run.py sets it), else None.

    Each peer gets it through its own documented option; none is told to skip
    verification, so every tool pays for the same certificate checks.
    """
    return os.environ.get("BENCH_CA_FILE") or None


def _make_dirs(out: Path, jobs: list[Job]) -> None:
    """Create each distinct parent directory once (part of the timed work)."""
    for parent in {os.path.dirname(path) for _, path in jobs}:
        os.makedirs(out / parent, exist_ok=True)


def _write_file(path: str, body: bytes) -> None:
    fd = os.open(path, _FILE_FLAGS, 0o644)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


# -- swarmget ---------------------------------------------------------------------------


def prepare_swarmget(jobs: list[Job], out: Path, concurrency: int, work: Path) -> Runner:
    """The library API in this process: ``swarmget.download(urls, dest, ...)``."""
    # ``swarmget`` imports its engine on first use; import it now, since the
    # method times no tool's imports (~80 ms here).
    import swarmget.api

    urls = [url for url, _ in jobs]
    ca = _ca_file()
    tls = {"cacert": ca} if ca else {}

    def run() -> list[str]:
        report = swarmget.download(urls, out, concurrency=concurrency, per_host=concurrency, **tls)
        if report.failed:
            counts = report.error_counts()
            return [f"{report.failed} failed: {counts}"]
        return []

    return run


def prepare_swarmget_1(jobs: list[Job], out: Path, concurrency: int, work: Path) -> Runner:
    """The library API in one process (``workers=1``): one event loop, one core."""
    os.environ["SWARMGET_WORKERS"] = "1"
    return prepare_swarmget(jobs, out, concurrency, work)


def prepare_swarmget_cli(jobs: list[Job], out: Path, concurrency: int, work: Path) -> Runner:
    """The command line, timed from exec to exit (interpreter start-up included)."""
    url_file = work / "urls.txt"
    url_file.write_text("".join(f"{url}\n" for url, _ in jobs))
    argv = [sys.executable, "-m", "swarmget", str(url_file), "-o", str(out)]
    argv += ["--concurrency", str(concurrency), "--per-host", str(concurrency), "--quiet"]
    ca = _ca_file()
    if ca:
        argv += ["--cacert", ca]
    return _external(argv)


# -- pycurl -----------------------------------------------------------------------------


def _curl_handles(concurrency: int) -> list[object]:
    import pycurl

    handles = []
    ca = _ca_file()
    for _ in range(concurrency):
        easy = pycurl.Curl()
        easy.setopt(pycurl.NOSIGNAL, 1)
        easy.setopt(pycurl.FOLLOWLOCATION, 0)
        easy.setopt(pycurl.CONNECTTIMEOUT, 30)
        easy.setopt(pycurl.LOW_SPEED_LIMIT, 1)
        easy.setopt(pycurl.LOW_SPEED_TIME, 60)
        # Bigger receive buffer: fewer recv() calls and write callbacks per body.
        easy.setopt(pycurl.BUFFERSIZE, 128 * 1024)
        if ca:
            easy.setopt(pycurl.CAINFO, ca)
        handles.append(easy)
    return handles


def _curl_multi(concurrency: int) -> object:
    import pycurl

    multi = pycurl.CurlMulti()
    # Keep every connection in the multi handle's cache between transfers.
    multi.setopt(pycurl.M_MAXCONNECTS, concurrency)
    return multi


def prepare_pycurl(jobs: list[Job], out: Path, concurrency: int, work: Path) -> Runner:
    """CurlMulti with ``concurrency`` easy handles reused for the whole run: the
    perform/select loop from pycurl's own retriever-multi example, with the select
    timeout taken from ``multi.timeout()`` as libcurl recommends.  Connections live
    in the multi handle's cache, so every reused handle gets a kept-alive one."""
    import pycurl

    multi = _curl_multi(concurrency)
    free = _curl_handles(concurrency)

    def run() -> list[str]:
        _make_dirs(out, jobs)
        pending = iter(jobs)
        errors: list[str] = []
        active = 0
        exhausted = False
        while True:
            while free and not exhausted:
                job = next(pending, None)
                if job is None:
                    exhausted = True
                    break
                easy = free.pop()
                _start_curl(easy, job, out)
                multi.add_handle(easy)
                active += 1
            if not active:
                break
            while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
                pass
            done = _collect_curl(multi, free, errors)
            active -= done
            if done:
                continue  # hand the freed handles their next URL before waiting
            timeout_ms = multi.timeout()
            multi.select(1.0 if timeout_ms < 0 else timeout_ms / 1000)
        return errors

    return run


def _start_curl(easy: object, job: Job, out: Path, *, lazy: bool = False) -> None:
    import pycurl

    url, path = job
    sink: _LazyFile | io.FileIO
    if lazy:
        sink = _LazyFile(str(out / path))
        easy.setopt(pycurl.WRITEFUNCTION, sink.write)  # type: ignore[attr-defined]
    else:
        sink = open(out / path, "wb", buffering=0)  # noqa: SIM115 - closed when the transfer ends
        easy.setopt(pycurl.WRITEDATA, sink)  # type: ignore[attr-defined]
    easy.setopt(pycurl.URL, url)  # type: ignore[attr-defined]
    easy.sink = sink  # type: ignore[attr-defined]


class _LazyFile:
    """A sink that opens its file at the first body byte.  With 10,000 transfers in
    flight, files opened up front would double the descriptors (10k sockets + 10k
    files > the 20k limit) while every body is still 2 s away."""

    __slots__ = ("fd", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def write(self, data: bytes) -> None:
        if self.fd < 0:
            self.fd = os.open(self.path, _FILE_FLAGS, 0o644)
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def close(self) -> None:
        if self.fd < 0:  # an empty body still makes an (empty) file
            self.fd = os.open(self.path, _FILE_FLAGS, 0o644)
        os.close(self.fd)
        self.fd = -1


def _collect_curl(multi: object, free: list[object], errors: list[str]) -> int:
    """Finish every completed transfer; return how many completed."""
    import pycurl

    done = 0
    while True:
        queued, ok_list, err_list = multi.info_read()  # type: ignore[attr-defined]
        for easy in ok_list:
            status = easy.getinfo(pycurl.RESPONSE_CODE)
            if status != 200:
                errors.append(f"{easy.getinfo(pycurl.EFFECTIVE_URL)}: HTTP {status}")
        for easy, errno, message in err_list:
            errors.append(f"{easy.getinfo(pycurl.EFFECTIVE_URL)}: curl {errno} {message}")
        for easy in [*ok_list, *(e for e, _, _ in err_list)]:
            easy.sink.close()
            multi.remove_handle(easy)  # type: ignore[attr-defined]
            free.append(easy)
            done += 1
        if not queued:
            return done


def prepare_pycurl_epoll(jobs: list[Job], out: Path, concurrency: int, work: Path) -> Runner:
    """CurlMulti driven by ``socket_action`` and epoll (libcurl's event API): the
    variant for thousands of connections, where select() stops at fd 1024 and
    perform() walks every handle on every call.  Files open at the first body byte
    (:class:`_LazyFile`)."""
    import selectors

    import pycurl

    multi = _curl_multi(concurrency)
    free = _curl_handles(concurrency)
    selector = selectors.DefaultSelector()
    timeout: list[float | None] = [None]
    masks = {
        pycurl.POLL_IN: selectors.EVENT_READ,
        pycurl.POLL_OUT: selectors.EVENT_WRITE,
        pycurl.POLL_INOUT: selectors.EVENT_READ | selectors.EVENT_WRITE,
    }

    def on_socket(what: int, fd: int, _multi: object, _data: object) -> None:
        if what == pycurl.POLL_REMOVE:
            if fd in selector.get_map():
                selector.unregister(fd)
        elif fd in selector.get_map():
            selector.modify(fd, masks[what])
        else:
            selector.register(fd, masks[what])

    def on_timer(ms: int) -> None:
        timeout[0] = None if ms < 0 else ms / 1000

    multi.setopt(pycurl.M_SOCKETFUNCTION, on_socket)  # type: ignore[attr-defined]
    multi.setopt(pycurl.M_TIMERFUNCTION, on_timer)  # type: ignore[attr-defined]

    def run() -> list[str]:
        _make_dirs(out, jobs)
        pending = iter(jobs)
        errors: list[str] = []
        active = 0
        exhausted = False
        while True:
            while free and not exhausted:
                job = next(pending, None)
                if job is None:
                    exhausted = True
                    break
                easy = free.pop()
                _start_curl(easy, job, out, lazy=True)
                multi.add_handle(easy)  # type: ignore[attr-defined]
                active += 1
            if not active:
                break
            events = selector.select(timeout[0])
            if not events:
                multi.socket_action(pycurl.SOCKET_TIMEOUT, 0)  # type: ignore[attr-defined]
            for key, mask in events:
                flags = (pycurl.CSELECT_IN if mask & selectors.EVENT_READ else 0) | (
                    pycurl.CSELECT_OUT if mask & selectors.EVENT_WRITE else 0
                )
                multi.socket_action(key.fd, flags)  # type: ignore[attr-defined]
            active -= _collect_curl(multi, free, errors)
        return errors

    return run


# -- aiohttp ----------------------------------------------------------------------------


def _aiohttp_session(concurrency: int) -> Any:
    """One ClientSession on a TCPConnector(limit=concurrency), verifying against the
    scenario's CA if it has one; create it inside the running event loop."""
    import ssl

    import aiohttp

    ca = _ca_file()
    tls = ssl.create_default_context(cafile=ca) if ca else True
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0, ssl=tls)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=60)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)


def prepare_aiohttp(jobs: list[Job], out: Path, concurrency: int, work: Path) -> Runner:
    """One ClientSession, TCPConnector(limit=concurrency), ``concurrency`` worker tasks
    pulling from one shared iterator (no task or semaphore per URL).  Each body is
    read whole (50 KB) and written with one ``os.write``: on tmpfs that is faster
    than any thread-offloaded file API and does not stall the loop."""
    import asyncio

    async def main() -> list[str]:
        errors: list[str] = []
        pending = iter(jobs)
        async with _aiohttp_session(concurrency) as session:

            async def worker() -> None:
                for url, path in pending:
                    try:
                        async with session.get(url) as response:
                            if response.status != 200:
                                errors.append(f"{url}: HTTP {response.status}")
                                continue
                            body = await response.read()
                        _write_file(str(out / path), body)
                    except Exception as exc:
                        errors.append(f"{url}: {exc!r}")

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        return errors

    def run() -> list[str]:
        _make_dirs(out, jobs)
        return asyncio.run(main())

    return run


# -- requests ---------------------------------------------------------------------------


def _thread_sessions() -> Callable[[], Any]:
    """A function giving each thread its own requests.Session (made on first use,
    then kept with its one kept-alive connection)."""
    import requests
    from requests.adapters import HTTPAdapter

    local = threading.local()

    def session() -> requests.Session:
        current: requests.Session | None = getattr(local, "session", None)
        if current is None:
            current = requests.Session()
            for scheme in ("http://", "https://"):
                current.mount(scheme, HTTPAdapter(pool_connections=1, pool_maxsize=1))
            current.verify = _ca_file() or True
            local.session = current
        return current

    return session


def prepare_requests(jobs: list[Job], out: Path, concurrency: int, work: Path) -> Runner:
    """ThreadPoolExecutor(concurrency), one requests.Session per thread (thread-local,
    created on first use, then kept with its one kept-alive connection)."""
    from concurrent.futures import ThreadPoolExecutor

    session = _thread_sessions()

    def fetch(job: Job) -> str | None:
        url, path = job
        try:
            response = session().get(url, timeout=(30, 60))
            if response.status_code != 200:
                return f"{url}: HTTP {response.status_code}"
            _write_file(str(out / path), response.content)
        except Exception as exc:
            return f"{url}: {exc!r}"
        return None

    def run() -> list[str]:
        _make_dirs(out, jobs)
        with ThreadPoolExecutor(concurrency) as pool:
            return [error for error in pool.map(fetch, jobs) if error is not None]

    return run


# -- streaming: every body comes back to the caller (stream-100ms, stream-nginx-50k) -----
#
# A streaming tool hands each body to the caller's code instead of writing it.
# With BENCH_MAP=decode in its environment (run.py sets it for stream-100ms) the
# tool applies workload.decode to every body, where that tool puts user code;
# without it, the caller only takes each body (workload.body_check).  Either way
# the runner keeps one value per item, by the item's index in the job list, and
# run.py checks them all: an item missing or wrong fails the run.

PREFETCH = 256  # items fetched ahead of the caller: swarmget.stream's default
LOADER_WORKERS = 8  # the DataLoader(num_workers=8)


class _StreamRunner:
    """A streaming tool's runner: ``body(values)`` fills ``values`` (index ->
    value) and returns errors; measure() passes ``values`` on to run.py."""

    def __init__(self, body: Callable[[dict[int, str]], list[str]]) -> None:
        self._body = body
        self.values: dict[int, str] = {}

    def __call__(self) -> list[str]:
        return self._body(self.values)


def _mapped() -> bool:
    return os.environ.get("BENCH_MAP") == "decode"


def _consumer(count: int, mapped: bool) -> Callable[[int, bytes], str]:
    """What the caller does with item ``index``'s body: decode it, or just take it."""
    import workload

    if mapped:
        return lambda index, body: workload.decode(body)
    sampled = workload.sample(count)
    return lambda index, body: workload.body_check(index, body, sampled)


def _decode_item(item: Any) -> str:
    """swarmget.stream's ``map``: runs in the worker process that downloaded the item."""
    import workload

    return workload.decode(item.read())


def _swarmget_stream(concurrency: int, mapped: bool) -> Callable[[list[str]], Any]:
    """``urls -> swarmget.stream(urls, ...)``, after one empty stream (untimed: the
    engine's imports and the option checks, as prepare_swarmget imports first)."""
    import swarmget

    stream = getattr(swarmget, "stream", None)
    if stream is None:
        raise RuntimeError("swarmget.stream not available")
    ca = _ca_file()
    options = {"concurrency": concurrency, "per_host": concurrency}
    options |= {"cacert": ca} if ca else {}
    options |= {"map": _decode_item} if mapped else {}
    try:
        with stream([], **options) as items:
            for _ in items:
                pass
    except (ImportError, AttributeError, TypeError) as exc:
        raise RuntimeError(f"swarmget.stream not available ({exc!r})") from exc
    return lambda urls: stream(urls, **options)


def prepare_swarmget_stream(
    jobs: list[Job], out: Path, concurrency: int, work: Path, mapped: bool | None = None
) -> Runner:
    """``with swarmget.stream(urls, map=decode, concurrency=N, per_host=N) as items``,
    every item consumed; without ``map`` (no BENCH_MAP) each body comes back here."""
    mapped = _mapped() if mapped is None else mapped
    open_stream = _swarmget_stream(concurrency, mapped)
    consume = _consumer(len(jobs), mapped)
    urls = [url for url, _ in jobs]

    def body(values: dict[int, str]) -> list[str]:
        errors = []
        with open_stream(urls) as items:
            for item in items:
                if not item.ok:
                    errors.append(f"{item.url}: {item.error} (HTTP {item.http_status})")
                elif mapped:
                    values[item.index] = item.value
                else:
                    values[item.index] = consume(item.index, item.read())
        return errors

    return _StreamRunner(body)


def prepare_swarmget_stream_nomap(
    jobs: list[Job], out: Path, concurrency: int, work: Path
) -> Runner:
    """swarmget.stream without ``map`` even in stream-100ms: the download alone,
    for that scenario's limit (see run.py)."""
    return prepare_swarmget_stream(jobs, out, concurrency, work, mapped=False)


def _fetch_requests(session: Any, index: int, url: str) -> tuple[int, bytes | None, str]:
    """(index, body, "") or (index, None, error): one outcome per job, whatever happens."""
    try:
        response = session.get(url, timeout=(30, 60))
        if response.status_code != 200:
            return index, None, f"{url}: HTTP {response.status_code}"
        return index, response.content, ""
    except Exception as exc:
        return index, None, f"{url}: {exc!r}"


def prepare_threads_requests(jobs: list[Job], out: Path, concurrency: int, work: Path) -> Runner:
    """ThreadPoolExecutor(N) threads, each with its own requests.Session, fetching
    into a bounded queue (``PREFETCH``) that the main thread drains, decoding each
    body itself: the prefetching loop people write around requests."""
    import queue
    from concurrent.futures import ThreadPoolExecutor

    session = _thread_sessions()
    consume = _consumer(len(jobs), _mapped())

    def body(values: dict[int, str]) -> list[str]:
        ready: queue.Queue[tuple[int, bytes | None, str]] = queue.Queue(PREFETCH)
        pending = enumerate(jobs)
        lock = threading.Lock()

        def fetcher() -> None:
            while True:
                with lock:
                    index, (url, _) = next(pending, (-1, ("", "")))
                if index < 0:
                    return
                ready.put(_fetch_requests(session(), index, url))

        with ThreadPoolExecutor(concurrency) as pool:
            for _ in range(concurrency):
                pool.submit(fetcher)
            return _drain(ready.get, len(jobs), consume, values)

    return _StreamRunner(body)


def _drain(
    take: Callable[[], tuple[int, bytes | None, str]],
    count: int,
    consume: Callable[[int, bytes], str],
    values: dict[int, str],
) -> list[str]:
    """The caller's loop: take ``count`` outcomes, consume each body, keep errors."""
    errors = []
    for _ in range(count):
        index, data, error = take()
        if data is None:
            errors.append(error)
        else:
            values[index] = consume(index, data)
    return errors


def prepare_aiohttp_queue(jobs: list[Job], out: Path, concurrency: int, work: Path) -> Runner:
    """One ClientSession, N fetcher tasks feeding a bounded asyncio.Queue
    (``PREFETCH``), one consumer coroutine that decodes each body on the event
    loop itself (blocking it meanwhile, as a plain ``for`` over a queue does)."""
    import asyncio

    consume = _consumer(len(jobs), _mapped())

    async def fetch(session: Any, index: int, url: str) -> tuple[int, bytes | None, str]:
        try:
            async with session.get(url) as response:
                if response.status != 200:
                    return index, None, f"{url}: HTTP {response.status}"
                return index, await response.read(), ""
        except Exception as exc:
            return index, None, f"{url}: {exc!r}"

    async def main(values: dict[int, str]) -> list[str]:
        ready: asyncio.Queue[tuple[int, bytes | None, str]] = asyncio.Queue(PREFETCH)
        pending = enumerate(jobs)
        async with _aiohttp_session(concurrency) as session:

            async def fetcher() -> None:
                for index, (url, _) in pending:
                    await ready.put(await fetch(session, index, url))

            tasks = [asyncio.create_task(fetcher()) for _ in range(concurrency)]
            errors = []
            for _ in range(len(jobs)):
                index, data, error = await ready.get()
                if data is None:
                    errors.append(error)
                else:
                    values[index] = consume(index, data)
            await asyncio.gather(*tasks)
        return errors

    return _StreamRunner(lambda values: asyncio.run(main(values)))


class _UrlDataset:
    """A map-style dataset whose ``__getitem__`` fetches its URL with requests and
    decodes the body: ``fn`` runs in the DataLoader's worker processes.  Each
    worker makes its own requests.Session on first use (a kept-alive connection;
    a bare ``requests.get`` would open one per item and only be slower).  A
    module-level class so it pickles under any start method; DataLoader needs
    nothing of torch.utils.data.Dataset but ``__getitem__`` and ``__len__``."""

    def __init__(self, jobs: list[Job], mapped: bool) -> None:
        self.urls = [url for url, _ in jobs]
        self.mapped = mapped
        self._session: Any = None  # made in each worker, never pickled across
        self._consume: Callable[[int, bytes], str] | None = None

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, index: int) -> tuple[int, str | None, str]:
        if self._session is None or self._consume is None:
            import requests

            self._session = requests.Session()
            self._session.verify = _ca_file() or True
            self._consume = _consumer(len(self.urls), self.mapped)
        index, data, error = _fetch_requests(self._session, index, self.urls[index])
        if data is None:
            return index, None, error
        return index, self._consume(index, data), ""


def _as_is(sample: Any) -> Any:
    """DataLoader's collate for batch_size=None: the item as __getitem__ returned it."""
    return sample


def prepare_torch_dataloader(jobs: list[Job], out: Path, concurrency: int, work: Path) -> Runner:
    """``torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=8)`` over
    :class:`_UrlDataset`, iterated to the end.  Its concurrency is the 8 workers
    (the issue's setting), whatever the scenario's."""
    from torch.utils.data import DataLoader

    dataset = _UrlDataset(jobs, _mapped())

    def body(values: dict[int, str]) -> list[str]:
        loader = DataLoader(
            dataset, batch_size=None, shuffle=False, num_workers=LOADER_WORKERS,
            collate_fn=_as_is,
        )  # fmt: skip
        errors = []
        for index, value, error in loader:
            if value is None:
                errors.append(error)
            else:
                values[index] = value
        return errors

    return _StreamRunner(body)


# -- external programs ------------------------------------------------------------------


class _External:
    """Runs a program to completion while a thread samples its memory every 10 ms.

    Why sample /proc rather than read ``RUSAGE_CHILDREN``: Linux carries the
    high-water RSS of the address space that called ``execve`` into the new
    program's ``ru_maxrss``, so a tool spawned by a 20 MiB Python process reports
    at least 20 MiB.  ``VmHWM`` in ``/proc/<pid>/status`` belongs to the new
    address space alone and is monotonic, so the last sample is the peak (to
    within the final 10 ms).  A tool that forks helpers is counted as the largest
    sum of VmRSS over its process tree seen in any sample."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.argv = argv
        self.env = env
        self.peak_kb = 0

    def __call__(self) -> list[str]:
        proc = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, env=self.env,
        )  # fmt: skip
        stop = threading.Event()
        sampler = threading.Thread(target=self._sample, args=(proc.pid, stop), daemon=True)
        sampler.start()
        _, stderr = proc.communicate()
        stop.set()
        sampler.join()
        if proc.returncode != 0:
            tail = stderr.decode(errors="replace").strip().splitlines()[-3:]
            return [f"{Path(self.argv[0]).name} exited {proc.returncode}: {' | '.join(tail)}"]
        return []

    def _sample(self, pid: int, stop: threading.Event) -> None:
        while True:
            hwm = proc_status_kb(pid, "VmHWM")
            tree = sum(proc_status_kb(p, "VmRSS") or 0 for p in _process_tree(pid))
            self.peak_kb = max(self.peak_kb, hwm or 0, tree)
            if stop.wait(0.01):
                return


def _cpu(external: bool) -> float:
    """User + system CPU seconds of the downloading processes so far."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = children.ru_utime + children.ru_stime
    if not external:
        own = resource.getrusage(resource.RUSAGE_SELF)
        total += own.ru_utime + own.ru_stime
    return total


_SAMPLER = """
import os, select, sys
sys.path.insert(0, {here!r})
from peers import _process_tree, proc_status_kb
peak = 0
while not select.select([sys.stdin], [], [], 0.01)[0]:
    # The tool's process and its workers, not this sampler.
    tree = [p for p in _process_tree({pid}) if p != os.getpid()]
    peak = max(peak, sum(proc_status_kb(p, "VmRSS") or 0 for p in tree))
print(peak)
"""


class _TreeSampler:
    """Samples the summed VmRSS of a process and its workers every 10 ms, from outside."""

    def __init__(self, pid: int) -> None:
        code = _SAMPLER.format(here=str(Path(__file__).parent), pid=pid)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def stop(self) -> int:
        out, _ = self._proc.communicate("stop\n", timeout=30)
        try:
            return int(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return 0


def proc_status_kb(pid: int | str, field: str) -> int | None:
    """A ``kB`` field of ``/proc/<pid>/status`` (None once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _process_tree(pid: int) -> list[int]:
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        try:
            with open(f"/proc/{current}/task/{current}/children") as children:
                todo += [int(child) for child in children.read().split()]
        except OSError:
            pass
    return tree


def _external(argv: list[str], env: dict[str, str] | None = None) -> Runner:
    return _External(argv, env)


def prepare_aria2(jobs: list[Job], out: Path, concurrency: int, work: Path) -> Runner:
    """``aria2c -i LIST -j N``: N downloads at once, one connection each (``-x 1
    -s 1``: files this small gain nothing from splitting), keep-alive on, no file
    pre-allocation, no console output."""
    binary = shutil.which("aria2c")
    if binary is None:
        raise RuntimeError("aria2c not installed (apt-get install -y aria2)")
    listing = work / "aria2.txt"
    listing.write_text("".join(f"{url}\n  out={path}\n" for url, path in jobs))
    argv = [
        binary, "--no-conf", f"--input-file={listing}", f"--dir={out}",
        f"--max-concurrent-downloads={concurrency}",
        "--max-connection-per-server=1", "--split=1",
        "--enable-http-keep-alive=true", "--enable-http-pipelining=false",
        "--file-allocation=none", "--allow-overwrite=true", "--auto-file-renaming=false",
        "--deferred-input=true", "--summary-interval=0", "--download-result=hide",
        "--console-log-level=error", "--quiet=true", "--max-tries=3", "--retry-wait=0",
        "--connect-timeout=30", "--timeout=60",
    ]  # fmt: skip
    ca = _ca_file()
    if ca:
        argv.append(f"--ca-certificate={ca}")
    return _external(argv)


def prepare_curl(jobs: list[Job], out: Path, concurrency: int, work: Path) -> Runner:
    """``curl --parallel --parallel-max N`` with a config file of url/output pairs;
    ``--parallel-immediate`` so it opens its N connections at once instead of
    waiting to learn whether the first one multiplexes (HTTP/1.1 never does)."""
    binary = shutil.which("curl")
    if binary is None:
        raise RuntimeError("curl not installed")
    help_text = subprocess.run([binary, "--help", "all"], capture_output=True, text=True).stdout
    if "--parallel-immediate" not in help_text:
        raise RuntimeError("this curl has no --parallel")
    config = work / "curl.cfg"
    config.write_text("".join(f'url = "{url}"\noutput = "{path}"\n' for url, path in jobs))
    argv = [
        binary, "-q", "--parallel", "--parallel-immediate", "--parallel-max", str(concurrency),
        "--config", str(config), "--output-dir", str(out), "--create-dirs",
        "--fail", "--silent", "--show-error", "--connect-timeout", "30",
    ]  # fmt: skip
    ca = _ca_file()
    if ca:
        argv += ["--cacert", ca]
    return _external(argv)


# img2dataset lives in a venv of its own (``./dev bench`` makes it): its pins
# (opencv, albumentations, pandas, wandb) are not ours to mix into .venv.
IMG2DATASET_VENV = REPO / ".venv-img2dataset"
IMG2DATASET_SHARD = 1000  # rows per shard: a power of ten, so a key is the row's index


def img2dataset_binary() -> Path:
    """The img2dataset command: ``$BENCH_IMG2DATASET``, else the one ./dev bench installs."""
    return Path(os.environ.get("BENCH_IMG2DATASET") or IMG2DATASET_VENV / "bin" / "img2dataset")


class _Img2Dataset(_External):
    """img2dataset writes ``<shard>/<key>.jpg`` (plus a ``.json`` per sample and a
    parquet and stats file per shard); :meth:`after` (untimed) moves each body to
    the path its job names and drops the rest, so run.py checks it like any peer."""

    def __init__(self, argv: list[str], env: dict[str, str], jobs: list[Job], out: Path):
        super().__init__(argv, env)
        self.jobs, self.out = jobs, out

    def after(self) -> None:
        kept = self.out.parent / f".{self.out.name}-img2dataset"
        self.out.rename(kept)
        self.out.mkdir()
        _make_dirs(self.out, self.jobs)
        for image in kept.glob("*/*.jpg"):
            # key = 10**3 * shard + row in shard = the row's index (IMG2DATASET_SHARD)
            image.rename(self.out / self.jobs[int(image.stem)][1])
        shutil.rmtree(kept)


def prepare_img2dataset(jobs: list[Job], out: Path, concurrency: int, work: Path) -> Runner:
    """``img2dataset --output_format files --resize_mode no --disable_all_reencoding
    True``: the bodies as served (no decode, no resize, no hash), N threads in all
    over one process per CPU (its unit of work is a shard of 1,000 rows), no
    retries; the rest as its defaults.  HTTPS: Python's ssl reads the CA from
    ``SSL_CERT_FILE`` (img2dataset has no option for it)."""
    binary = img2dataset_binary()
    if not binary.exists():
        raise RuntimeError(f"img2dataset not installed ({binary}; ./dev bench installs it)")
    listing = work / "img2dataset.txt"
    listing.write_text("".join(f"{url}\n" for url, _ in jobs))
    processes = os.cpu_count() or 1
    argv = [
        str(binary), "--url_list", str(listing), "--input_format", "txt",
        "--output_format", "files", "--output_folder", str(out),
        "--processes_count", str(processes),
        "--thread_count", str(max(1, concurrency // processes)),
        "--number_sample_per_shard", str(IMG2DATASET_SHARD),
        "--resize_mode", "no", "--disable_all_reencoding", "True", "--compute_hash", "None",
        "--retries", "0", "--timeout", "30", "--enable_wandb", "False",
        "--distributor", "multiprocessing",
    ]  # fmt: skip
    # No update check against PyPI at every import (albumentations does one).
    env = dict(os.environ, NO_ALBUMENTATIONS_UPDATE="1")
    ca = _ca_file()
    if ca:
        env["SSL_CERT_FILE"] = ca
    return _Img2Dataset(argv, env, jobs, out)


TOOLS: dict[str, tuple[Callable[[list[Job], Path, int, Path], Runner], bool]] = {
    # name: (prepare function, runs as an external program)
    "swarmget": (prepare_swarmget, False),
    "swarmget-1": (prepare_swarmget_1, False),
    "swarmget-cli": (prepare_swarmget_cli, True),
    "pycurl": (prepare_pycurl, False),
    "pycurl-epoll": (prepare_pycurl_epoll, False),
    "aiohttp": (prepare_aiohttp, False),
    "requests": (prepare_requests, False),
    "aria2c": (prepare_aria2, True),
    "img2dataset": (prepare_img2dataset, True),
    "curl": (prepare_curl, True),
    "swarmget-stream": (prepare_swarmget_stream, False),
    "swarmget-stream-nomap": (prepare_swarmget_stream_nomap, False),
    "threads-requests": (prepare_threads_requests, False),
    "aiohttp-queue": (prepare_aiohttp_queue, False),
    "torch-dataloader": (prepare_torch_dataloader, False),
}
# Tools that hand bodies to the caller and write no file: run.py checks the values
# they return (``values`` in the result), not the output directory.
STREAM_TOOLS = frozenset(
    ["swarmget-stream", "swarmget-stream-nomap", "threads-requests", "aiohttp-queue",
     "torch-dataloader"]
)  # fmt: skip


# -- the child process ------------------------------------------------------------------


def read_jobs(path: Path) -> list[Job]:
    jobs = []
    with open(path) as lines:
        for line in lines:
            url, _, rel = line.rstrip("\n").partition("\t")
            jobs.append((url, rel))
    return jobs


def measure(tool: str, jobs_file: Path, out: Path, concurrency: int) -> dict[str, object]:
    prepare, external = TOOLS[tool]
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    jobs = read_jobs(jobs_file)
    work = out.parent / f".{out.name}-work"
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    sampler: _TreeSampler | None = None
    try:
        run = prepare(jobs, out, concurrency, work)
        before = _cpu(external)
        # In-process tools may fork workers (swarmget does, one per CPU): their
        # memory is sampled from another process, since a sampling thread here
        # would itself change what the tool does (a threaded caller gets one
        # worker); their CPU arrives in RUSAGE_CHILDREN once they are reaped.
        sampler = None if external else _TreeSampler(os.getpid())
        start = time.perf_counter()
        errors = run()
        elapsed = time.perf_counter() - start
        after = _cpu(external)
        # Untimed: a tool that names its files itself gets them moved where run.py looks.
        if not errors and hasattr(run, "after"):
            run.after()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # Peak RSS of the downloading address space (see _External for why not ru_maxrss).
    if external:
        peak_kb = getattr(run, "peak_kb", 0)
    else:
        assert sampler is not None
        peak_kb = max(sampler.stop(), proc_status_kb("self", "VmHWM") or 0)
    return {
        "elapsed": elapsed,
        "maxrss_kb": peak_kb,
        "ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "cpu_s": after - before,
        "errors": errors[:5],
        "error_count": len(errors),
        **({"values": run.values} if isinstance(run, _StreamRunner) else {}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run one downloader once (used by run.py)")
    parser.add_argument("tool", choices=sorted(TOOLS))
    parser.add_argument("jobs", type=Path, help="file of url<TAB>path lines")
    parser.add_argument("out", type=Path)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        result = measure(args.tool, args.jobs, args.out, args.concurrency)
    except BaseException as exc:
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        args.result.write_text(json.dumps({"crash": text, "traceback": traceback.format_exc()}))
        return 1
    args.result.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
