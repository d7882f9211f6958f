"""SIGKILL and Ctrl-C at random moments, then rerun: the same files as an uninterrupted run."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from swarmget.parallel.worker import PipeEvents
from swarmget.testing import ProcessServer, expected_body, serve_in_subprocess
from swarmget.testing.outputs import part_for, parts
from swarmget.testing.process import child_env

SMALL = 2000
BIG = 3
BIG_SIZE = 3 << 20


@pytest.fixture(scope="module")
def server() -> Iterator[ProcessServer]:
    with serve_in_subprocess() as srv:
        yield srv


def size_of(i: int) -> int:
    return 2000 + (i * 7919) % 30000


def write_list(server: ProcessServer, path: Path) -> dict[str, int]:
    names: dict[str, int] = {}
    lines = []
    for i in range(SMALL):
        name = f"img{i:05d}.jpg"
        names[name] = size_of(i)
        lines.append(server.file_url(name, size=size_of(i), latency=0.05))
    for i in range(BIG):
        name = f"big{i}.bin"
        names[name] = BIG_SIZE
        lines.append(server.file_url(name, size=BIG_SIZE, latency=0.05))
    path.write_text("\n".join(lines) + "\n")
    return names


def swarmget(urls: Path, out: Path, *more: str, group: bool = False) -> subprocess.Popen[bytes]:
    env = child_env()
    command = [sys.executable, "-m", "swarmget", str(urls), "-o", str(out), "-q"]
    return subprocess.Popen(
        [*command, "--concurrency", "16", *more],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=group,  # its own process group, as a job under `timeout` has
    )


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(child) for child in text.split()]


def records_of(out: Path) -> list[dict[str, object]]:
    text = (out / ".swarmget/manifest.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def check_complete(out: Path, names: dict[str, int]) -> None:
    files = sorted(p for p in os.listdir(out) if p != ".swarmget")
    assert files == sorted(names), set(files) ^ set(names)
    for name, size in names.items():
        assert (out / name).read_bytes() == expected_body(name, size), name
    records = [
        json.loads(line) for line in (out / ".swarmget/manifest.jsonl").read_text().splitlines()
    ]
    assert len(records) == len(names)
    assert {r["status"] for r in records} == {"ok"}
    assert sorted(r["path"] for r in records) == sorted(names)


def test_sigkill_at_random_moments_then_resume(server: ProcessServer, tmp_path: Path) -> None:
    urls = tmp_path / "urls.txt"
    names = write_list(server, urls)
    out = tmp_path / "out"
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    kills = 0
    for _ in range(4):
        proc = swarmget(urls, out)
        time.sleep(rng.uniform(0.4, 1.4))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.communicate(timeout=30)
        # Whatever the moment, a file at its final name is always whole.
        for name in os.listdir(out):
            if name in names:
                assert (out / name).stat().st_size == names[name], (seed, name)
    assert kills >= 3, f"only {kills} of the runs were killed (seed {seed})"
    final = swarmget(urls, out)
    _, stderr = final.communicate(timeout=120)
    assert final.returncode == 0, stderr.decode()
    check_complete(out, names)

    reference = tmp_path / "reference"
    clean = swarmget(urls, reference)
    clean.communicate(timeout=120)
    assert clean.returncode == 0
    assert sorted(os.listdir(reference)) == sorted(os.listdir(out))


# SIGTERM (a scheduler preempting the job) used to end the driver at once,
# without a word and without writing the manifest; it now stops as Ctrl-C does.
# So does SIGHUP (the terminal closed), which left the journal's reserve behind.
@pytest.mark.parametrize(
    ("signum", "status", "said"),
    [
        (signal.SIGINT, 130, b"interrupted"),
        (signal.SIGTERM, 143, b"stopped by SIGTERM"),
        (signal.SIGHUP, 129, b"stopped by SIGHUP"),
    ],
)
def test_ctrl_c_stops_promptly_keeps_parts_and_resumes(
    server: ProcessServer, tmp_path: Path, signum: int, status: int, said: bytes
) -> None:
    urls = tmp_path / "urls.txt"
    size = 8 << 20
    name = f"interrupted-{signum}.bin"  # the server stalls each URL once
    # Half the body, then silence: the moment to press Ctrl-C is not a race.
    urls.write_text(server.file_url(name, size=size, fault="stall", times=1) + "\n")
    out = tmp_path / "out"
    proc = swarmget(urls, out)
    part = part_for(out, urls.read_text().strip())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (part.exists() and part.stat().st_size == size // 2):
        time.sleep(0.01)
    proc.send_signal(signum)
    started = time.monotonic()
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == status, stderr.decode()
    assert time.monotonic() - started < 3
    assert said in stderr and b"run the same command again" in stderr
    assert part.stat().st_size == size // 2 and not (out / name).exists()
    records = [
        json.loads(line) for line in (out / ".swarmget/manifest.jsonl").read_text().splitlines()
    ]
    assert [r["status"] for r in records] == ["partial"]
    assert not (out / ".swarmget/reserve").exists()
    assert not [p for p in (out / ".swarmget").iterdir() if p.name.endswith(".new")]
    # Every field a manifest line has (it had url, path and status only), and
    # no path: the file is not there yet.
    assert {"http_status", "bytes", "error", "attempts", "elapsed_ms"} <= set(records[0])
    assert records[0]["path"] is None and records[0]["validator"]
    again = swarmget(urls, out)
    again.communicate(timeout=60)
    assert again.returncode == 0
    assert (out / name).read_bytes() == expected_body(name, size)


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stop_signal_to_the_whole_process_group_stops_as_that_signal(
    server: ProcessServer, tmp_path: Path, signum: signal.Signals, status: int
) -> None:
    # `timeout` and batch schedulers signal the process group: the workers told
    # the driver they had been stopped before its own handler had run, and the
    # run ended as Ctrl-C does (130, "interrupted").  A closed terminal sends
    # SIGHUP to the group: the workers died of it, their rows lost.
    urls = tmp_path / "urls.txt"
    lines = [server.file_url(f"g{i}.bin", size=5000, latency=0.2) for i in range(40)]
    # (A name of its own: the server stalls each URL once.)
    lines.append(server.file_url(f"group-{signum}.bin", size=4 << 20, fault="stall", times=1))
    urls.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    proc = swarmget(urls, out, "--workers", "2", group=True)
    part = part_for(out, lines[-1])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not part.exists():
        time.sleep(0.01)
    time.sleep(0.2)
    os.killpg(proc.pid, signum)
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == status, stderr.decode()
    assert f"stopped by {signum.name}".encode() in stderr
    assert b"Traceback" not in stderr and b"worker" not in stderr
    assert part.exists()  # kept for the rerun


def test_a_worker_stopped_alone_hands_its_rows_on_and_the_run_goes_on(
    server: ProcessServer, tmp_path: Path
) -> None:
    # SIGTERM to one worker (a stray kill, an OOM killer's) stopped the whole
    # run as if Ctrl-C had been pressed, and its rows got no record; then its
    # rows failed as crashed, even those it had not begun.  Now they are dealt
    # again, and the run completes.
    urls = tmp_path / "urls.txt"
    names = {f"w{i}.bin": 3000 for i in range(120)}
    lines = [server.file_url(name, size=size, latency=0.3) for name, size in names.items()]
    urls.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    proc = swarmget(urls, out, "--workers", "2", "--concurrency", "4")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(children(proc.pid)) < 2:
        time.sleep(0.01)
    time.sleep(0.5)
    os.kill(children(proc.pid)[0], signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr.decode()
    check_complete(out, names)


def test_ctrl_c_keeps_small_parts_too_and_the_rerun_overwrites_them(
    server: ProcessServer, tmp_path: Path
) -> None:
    urls = tmp_path / "urls.txt"
    urls.write_text(server.file_url("small.bin", size=40_000, fault="stall", times=1) + "\n")
    out = tmp_path / "out"
    proc = swarmget(urls, out)
    part = part_for(out, urls.read_text().strip())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (part.exists() and part.stat().st_size == 20_000):
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=10)
    assert proc.returncode == 130
    assert part.stat().st_size == 20_000  # kept, though too small to resume with Range
    again = swarmget(urls, out)
    again.communicate(timeout=60)
    assert again.returncode == 0
    assert (out / "small.bin").read_bytes() == expected_body("small.bin", 40_000)
    assert not part.exists()


# A child that presses Ctrl-C on itself the moment the engine creates its first
# part file (``workers=1``: the engine runs in the process that gets SIGINT).
_INTERRUPT_AT_FIRST_PART = """
import os, signal, sys
import swarmget

real_open = os.open
created = []

def open_then_interrupt(path, flags, *args, **kwargs):
    fd = real_open(path, flags, *args, **kwargs)
    if "/parts/" in str(path) and not created:
        created.append(path)
        os.kill(os.getpid(), signal.SIGINT)
    return fd

os.open = open_then_interrupt
try:
    swarmget.download(sys.argv[2:], sys.argv[1], workers=1, concurrency=1)
except KeyboardInterrupt:
    sys.exit(130)
sys.exit(0)
"""


def test_ctrl_c_in_one_process_waits_for_the_engine_turn(
    server: ProcessServer, tmp_path: Path
) -> None:
    # Python raises KeyboardInterrupt at the next bytecode: right after the part
    # was created and before its transfer held it.  The part was left behind,
    # known to no one, and the row (whose whole body had arrived with its head)
    # was lost.  Now Ctrl-C waits for the end of the engine's turn.
    out = tmp_path / "out"
    urls = [server.file_url(f"turn{i}.bin", size=5000) for i in range(3)]
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPT_AT_FIRST_PART, str(out), *urls],
        capture_output=True,
        env=child_env(),
        timeout=60,
    )
    assert proc.returncode == 130, proc.stderr.decode()
    records = [
        json.loads(line) for line in (out / ".swarmget/manifest.jsonl").read_text().splitlines()
    ]
    assert [(r["index"], r["status"]) for r in records] == [(0, "ok")]
    assert (out / "turn0.bin").read_bytes() == expected_body("turn0.bin", 5000)
    assert parts(out) == []


# A child that reruns into an output dir with a journal (so the manifest is
# exported at the end) and presses Ctrl-C (``argv[2]`` times) as the export
# moves its file into place.  (os.replace, looked up at each call by compiled
# code too, where a function of ours is not.)
_INTERRUPT_THE_EXPORT = """
import os, signal, sys
import swarmget

out, presses, urls = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
swarmget.download(urls[:-1], out, workers=1)
real_replace = os.replace

def interrupted_replace(source, target, **kwargs):
    if str(target).endswith("manifest.jsonl"):
        for _ in range(presses):
            os.kill(os.getpid(), signal.SIGINT)
    return real_replace(source, target, **kwargs)

os.replace = interrupted_replace
try:
    swarmget.download(urls, out, workers=1)
except KeyboardInterrupt:
    sys.exit(130)
sys.exit(0)
"""


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_while_the_manifest_is_written_waits_for_it_unless_pressed_twice(
    server: ProcessServer, tmp_path: Path, presses: int
) -> None:
    """Once: the manifest is finished first (it was cut, the old one stayed, and
    its temporary file was left behind); twice: the run stops at once, and still
    leaves the old manifest whole and no temporary file."""
    out = tmp_path / "out"
    urls = [server.file_url(f"export{i}.bin", size=1000) for i in range(4)]
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPT_THE_EXPORT, str(out), str(presses), *urls],
        capture_output=True,
        env=child_env(),
        timeout=60,
    )
    assert proc.returncode == 130, proc.stderr.decode()
    listed = [r["path"] for r in records_of(out)]
    if presses == 1:
        assert listed == [f"export{i}.bin" for i in range(4)]
    else:
        assert listed == [f"export{i}.bin" for i in range(3)]  # the first run's
    assert sorted(os.listdir(out / ".swarmget")) == [
        "journal.sqlite3",
        "lock",
        "manifest.jsonl",
        "parts",
        "plans.log",
    ]


def interrupt_when(
    proc: subprocess.Popen[bytes], ready: Callable[[], bool], signum: int, settle: float = 0.0
) -> None:
    """Send ``signum`` once ``ready()`` (or after 20 s), ``settle`` seconds later,
    and wait for the run to end."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not ready():
        time.sleep(0.01)
    time.sleep(settle)
    proc.send_signal(signum)
    proc.communicate(timeout=10)


def path_lists(tmp_path: Path, path: str, old: str, new: str) -> tuple[Path, Path]:
    """Two CSV lists with one row for ``path``: of the ``old`` URL, then the ``new``."""
    first, fixed = tmp_path / "first.csv", tmp_path / "fixed.csv"
    first.write_text(f"url,path\n{old},{path}\n")
    fixed.write_text(f"url,path\n{new},{path}\n")
    return first, fixed


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT])
@pytest.mark.parametrize("begun", [False, True])
def test_a_fixed_url_takes_over_the_path_of_an_interrupted_rows(
    server: ProcessServer, tmp_path: Path, signum: int, begun: bool
) -> None:
    # A run stopped while a row was planned (no answer yet) or partly done;
    # the list is then fixed: the path gets another URL.  The unfinished row
    # kept the path for good: every rerun failed "exists ... another row's in
    # this input", --overwrite too, and its part stayed.
    if begun:
        # The server stalls each URL once: a URL of this test's own.
        old = server.file_url(f"old-{signum}.bin", size=4 << 20, fault="stall", times=1)
    else:
        old = server.file_url(f"old-{signum}.bin", size=5000, latency=30)
    new = server.file_url("new.bin", size=7000)
    first, fixed = path_lists(tmp_path, "d/f0.bin", old, new)
    out = tmp_path / "out"
    proc = swarmget(first, out)
    watched = part_for(out, old, "d/f0.bin") if begun else out / ".swarmget"
    interrupt_when(proc, watched.exists, signum, settle=0.3)
    assert not (out / "d/f0.bin").exists()
    again = swarmget(fixed, out)
    _, stderr = again.communicate(timeout=60)
    assert again.returncode == 0, stderr.decode()
    assert (out / "d/f0.bin").read_bytes() == expected_body("new.bin", 7000)
    assert [(r["url"], r["status"]) for r in records_of(out)] == [(new, "ok")]
    assert parts(out) == []


def test_a_file_put_at_an_interrupted_rows_path_is_judged_as_any_other(
    server: ProcessServer, tmp_path: Path
) -> None:
    # The path an unfinished row gives up may hold the user's file now (put
    # there after the kill, or there all along under --overwrite): it was
    # deleted as if the row had published it, and replaced without --overwrite.
    old = server.file_url("judged-old.bin", size=5000, latency=30)
    new = server.file_url("judged-new.bin", size=7000)
    first, fixed = path_lists(tmp_path, "d/p.bin", old, new)
    out = tmp_path / "out"
    proc = swarmget(first, out)
    interrupt_when(proc, (out / ".swarmget").exists, signal.SIGKILL, settle=0.3)
    (out / "d").mkdir(exist_ok=True)
    (out / "d/p.bin").write_bytes(b"the user's")
    again = swarmget(fixed, out)
    again.communicate(timeout=60)
    assert again.returncode == 1
    assert (out / "d/p.bin").read_bytes() == b"the user's"
    assert [r["error"] for r in records_of(out)] == ["exists"]
    replaced = swarmget(fixed, out, "--overwrite")
    _, stderr = replaced.communicate(timeout=60)
    assert replaced.returncode == 0, stderr.decode()
    assert (out / "d/p.bin").read_bytes() == expected_body("judged-new.bin", 7000)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT])
def test_an_overwrite_stopped_before_it_replaced_the_users_file_leaves_it_to_the_next_run(
    server: ProcessServer, tmp_path: Path, signum: int
) -> None:
    # A run with --overwrite, stopped while a row was planned over the user's
    # file: the claim said the path was ours, and the next run, without
    # --overwrite, deleted the user's file before downloading anything.
    url = server.file_url(f"kept-{signum}.bin", size=5000, latency=30)
    urls = tmp_path / "urls.txt"
    urls.write_text(url + "\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / f"kept-{signum}.bin").write_bytes(b"the user's")
    proc = swarmget(urls, out, "--overwrite")
    interrupt_when(proc, (out / ".swarmget/plans.log").exists, signum, settle=0.3)
    again = swarmget(urls, out)
    try:
        again.communicate(timeout=8)  # before the fix, it waited for the download
    finally:
        again.kill()
    assert (out / f"kept-{signum}.bin").read_bytes() == b"the user's"
    assert again.returncode == 1
    assert [r["error"] for r in records_of(out)] == ["exists"]


def test_a_path_column_added_for_an_interrupted_rows_name_goes_on_with_its_part(
    server: ProcessServer, tmp_path: Path
) -> None:
    # A row cut short by Ctrl-C, named by default; the list then gains a path
    # column naming the same file for the same URL: a new identity, whose part
    # was thrown away and the whole file fetched again.
    import swarmget as library
    from swarmget.sources.rows import Row

    size = 4 << 20
    url = server.file_url("carried.bin", size=size, fault="stall", times=1)
    urls = tmp_path / "urls.txt"
    urls.write_text(url + "\n")
    out = tmp_path / "out"
    proc = swarmget(urls, out)
    part = part_for(out, url)
    interrupt_when(proc, lambda: part.exists() and part.stat().st_size == size // 2, signal.SIGINT)
    assert part.stat().st_size == size // 2
    report = library.download([Row(0, url, path="carried.bin")], out, workers=1)
    assert (report.ok, report.reused) == (1, size // 2)  # resumed, not fetched again
    assert (out / "carried.bin").read_bytes() == expected_body("carried.bin", size)
    assert parts(out) == []


def test_a_worker_whose_driver_was_killed_stops_without_a_traceback() -> None:
    # After a SIGKILL of the driver, a worker's next report met a broken pipe
    # (often before the pipe's EOF was read): a BrokenPipeError traceback on
    # the user's terminal, one run in four, and the worker's abort cut short.
    # Now a send that finds the driver gone stops the worker between turns.
    driver, worker = multiprocessing.Pipe()
    driver.close()
    events = PipeEvents(worker, 0)
    events.flush()
    assert events.driver_gone
    events.flush()  # nothing more is sent, nor raised
    worker.close()


# The CLI, with a stop signal arriving at the first worker while it starts:
# in the child, multiprocessing closes stdin before it runs the worker's code.
_SIGTERM_WHILE_A_WORKER_STARTS = """
import os, signal, sys
from swarmget.cli import main

driver = os.getpid()
once = sys.argv.pop(1)

class Stdin:
    def close(self):
        if os.getpid() != driver:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL))  # the first worker only
            os.kill(os.getpid(), signal.SIGTERM)

sys.stdin = Stdin()
sys.exit(main(sys.argv[1:]))
"""


def test_a_stop_signal_while_a_worker_starts_waits_for_its_handlers(
    server: ProcessServer, tmp_path: Path
) -> None:
    # Ctrl-C moments after a run began: the driver stopped a worker it had
    # just forked, which still had the driver's handlers.  They raised
    # KeyboardInterrupt in multiprocessing's bootstrap: a traceback on the
    # terminal.  Now the signal waits, blocked, for the worker's own handler.
    names = {f"starting{i}.bin": 3000 for i in range(20)}
    urls = tmp_path / "urls.txt"
    urls.write_text("".join(server.file_url(name, size=3000) + "\n" for name in names))
    out = tmp_path / "out"
    command = [str(urls), "-o", str(out), "-q", "--workers", "2"]
    done = subprocess.run(
        [sys.executable, "-c", _SIGTERM_WHILE_A_WORKER_STARTS, str(tmp_path / "once"), *command],
        capture_output=True,
        env=child_env(),
        timeout=60,
    )
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    assert done.returncode == 0, done.stderr.decode()
    check_complete(out, names)
