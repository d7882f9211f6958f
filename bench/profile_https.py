"""Where the client's CPU per file goes on W4 (nginx-https-50k), for issue 15.

Usage (from the repository root)::

    # CPU per file, interleaved rounds (wall time is noise here; CPU-s much less so)
    PYTHONPATH=build/compiled .venv/bin/python bench/profile_https.py cpu \
        --tools swarmget-1,pycurl --rounds 5

    # instructions per file with callgrind: each tool at --files and at --base-files
    # (same concurrency, so the same handshakes); the difference over the extra
    # files is the marginal cost of one file, independent of start-up, imports
    # and handshakes; the handshakes are measured apart (--base-files at
    # concurrency 100 against concurrency 1).  Keeps the callgrind files in --keep.
    PYTHONPATH=build/compiled .venv/bin/python bench/profile_https.py callgrind \
        --tools swarmget-1,pycurl --files 2000 --base-files 200 --keep /tmp/cg

    # the same with two worker processes: the driver's share and the workers'
    PYTHONPATH=build/compiled .venv/bin/python bench/profile_https.py callgrind --plain \
        --tools "swarmget@/tmp/old-build,swarmget" --workers 2 --files 2000

    # cProfile of the pure build, workers=1 (the Python-level calls per file)
    .venv/bin/python bench/profile_https.py cprofile --files 10000

Every tool runs as ``bench/peers.py TOOL`` does in ``bench/run.py`` (same code,
same options, the server's CA through each tool's own option), against the same
nginx (one worker, TLS 1.2/1.3, session cache) on tmpfs.  The load average is
printed with each measurement: the machine is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import servers  # noqa: E402

SIZE = 51200


def loadavg() -> str:
    with open("/proc/loadavg") as file:
        return " ".join(file.read().split()[:3])


_SERVER_PIDS: list[int] = []


def server_cpu() -> float:
    """CPU seconds the nginx processes (master and workers) have used so far."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    pids = list(_SERVER_PIDS)
    for pid in _SERVER_PIDS:
        with contextlib.suppress(OSError):
            pids += [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


@contextlib.contextmanager
def https_server(work: Path, files: int, plain: bool = False) -> Iterator[tuple[Path, Path, Path]]:
    """nginx over TLS (``plain``: HTTP, W1) with ``files`` x 50 KB; yields (jobs file,
    CA file, work dir)."""
    from swarmget.testing.nginx import make_tls_files, make_tree

    root = work / "srv"
    root.mkdir(parents=True)
    names = make_tree(root, files, SIZE)
    tls = make_tls_files(work / "tls")
    with servers.nginx(root, tls=None if plain else tls) as server:
        _SERVER_PIDS[:] = [server.inner.pid]
        jobs = work / "jobs.tsv"
        jobs.write_text("".join(f"{server.url(n)}\t{n}\n" for n in names))
        yield jobs, tls.ca_pem, work


def _jobs_subset(jobs: Path, count: int, work: Path) -> Path:
    lines = jobs.read_text().splitlines(keepends=True)[:count]
    path = work / f"jobs-{count}.tsv"
    path.write_text("".join(lines))
    return path


def run_tool(
    tool: str,
    jobs: Path,
    ca: Path,
    work: Path,
    concurrency: int,
    prefix: list[str] | None = None,
    extra_env: dict[str, str] | None = None,
) -> dict[str, object]:
    from swarmget.testing.process import child_env

    # "swarmget-1@/tmp/old-build": that build first on PYTHONPATH; "...@VAR=value": and
    # that in the environment (A/B runs of two builds or settings in one interleaving)
    tool, *extra = tool.split("@")
    build = next((e for e in extra if "=" not in e), "")
    settings = dict(e.split("=", 1) for e in extra if "=" in e)
    out = work / "out" / tool
    result = work / f"result-{tool}.json"
    shutil.rmtree(out, ignore_errors=True)
    result.unlink(missing_ok=True)
    argv = [*(prefix or []), sys.executable, str(BENCH / "peers.py"), tool, str(jobs), str(out)]
    argv += ["--concurrency", str(concurrency), "--result", str(result)]
    env = child_env()
    if build:
        env["PYTHONPATH"] = os.pathsep.join([build, env.get("PYTHONPATH", "")])
    env["BENCH_CA_FILE"] = str(ca)
    env.update(extra_env or {})
    env.update(settings)
    proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True)
    shutil.rmtree(out, ignore_errors=True)
    try:
        data: dict[str, object] = json.loads(result.read_text())
    except (OSError, ValueError):
        tail = proc.stderr.decode(errors="replace")[-2000:]
        raise SystemExit(f"{tool} gave no result (exit {proc.returncode}): {tail}") from None
    if data.get("crash") or data.get("error_count"):
        raise SystemExit(f"{tool} failed: {data}")
    return data


# -- cpu ----------------------------------------------------------------------------------


def cmd_cpu(args: argparse.Namespace) -> None:
    tools = args.tools.split(",")
    cpu: dict[str, list[float]] = {t: [] for t in tools}
    wall: dict[str, list[float]] = {t: [] for t in tools}
    with https_server(args.work, args.files, args.plain) as (jobs, ca, work):
        run_tool(tools[0], jobs, ca, work, args.concurrency)  # warm-up
        for r in range(args.rounds):
            shift = r % len(tools)
            for tool in tools[shift:] + tools[:shift]:
                before = server_cpu()
                data = run_tool(tool, jobs, ca, work, args.concurrency)
                server_s = server_cpu() - before
                cpu_s, elapsed = float(data["cpu_s"]), float(data["elapsed"])  # type: ignore[arg-type]
                cpu[tool].append(cpu_s)
                wall[tool].append(elapsed)
                rss = int(data["maxrss_kb"]) / 1024  # type: ignore[call-overload]
                print(
                    f"round {r + 1} {tool:<12} wall {elapsed:6.3f} s  rss {rss:5.1f} MiB  "
                    f"cpu {cpu_s:6.3f} s "
                    f"= {cpu_s / args.files * 1e6:6.1f} us/file  "
                    f"(server {server_s / args.files * 1e6:5.1f} us/file)  load {loadavg()}",
                    file=sys.stderr,
                    flush=True,
                )
    base = tools[-1] if "pycurl" not in tools else "pycurl"
    base_cpu = statistics.median(cpu[base])
    base_wall = statistics.median(wall[base])
    print(f"\nmedian of {args.rounds} rounds, {args.files} files, load {loadavg()}")
    print(
        f"| tool | wall s | files/s vs {base} | CPU us/file | CPU vs {base} "
        f"| CPU vs {base}, median of rounds' ratios |"
    )
    print("|---|--:|--:|--:|--:|--:|")
    for tool in tools:
        c, w = statistics.median(cpu[tool]), statistics.median(wall[tool])
        # Each round's ratio to the baseline's run in the same round: slow drifts in
        # the machine's load cancel out of these.
        paired = statistics.median(a / b for a, b in zip(cpu[tool], cpu[base], strict=True))
        print(
            f"| {tool} | {w:.3f} | {base_wall / w:.2f}x | {c / args.files * 1e6:.1f} "
            f"| {c / base_cpu:.2f}x | {paired:.3f}x |"
        )


# -- callgrind ------------------------------------------------------------------------------


def _callgrind(
    tool: str, jobs: Path, ca: Path, work: Path, concurrency: int, out_file: Path, workers: int = 1
) -> tuple[int, int]:
    """Instructions of the tool's own process and of the processes it forked
    (swarmget's workers: callgrind follows a fork, one file per process)."""
    for old in out_file.parent.glob(f"{out_file.name}.*"):
        old.unlink()
    prefix = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}.%p"]
    prefix += ["--trace-children=no"]
    run_tool(tool, jobs, ca, work, concurrency, prefix, {"SWARMGET_WORKERS": str(workers)})
    files = sorted(out_file.parent.glob(f"{out_file.name}.*"), key=lambda f: int(f.suffix[1:]))
    totals = [_total(f) for f in files]  # the first pid is the tool's process: the driver
    return totals[0], sum(totals[1:])


def _total(out_file: Path) -> int:
    for line in out_file.read_text(errors="replace").splitlines():
        if line.startswith("totals:") or line.startswith("summary:"):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {out_file}")


def cmd_callgrind(args: argparse.Namespace) -> None:
    tools = args.tools.split(",")
    keep: Path = args.keep
    keep.mkdir(parents=True, exist_ok=True)
    with https_server(args.work, args.files, args.plain) as (jobs, ca, work):
        small = _jobs_subset(jobs, args.base_files, work)
        rows = []
        for tool in tools:
            name = tool.replace("/", "_")
            big_file = keep / f"{name}-{args.files}.out"
            small_file = keep / f"{name}-{args.base_files}.out"
            one_file = keep / f"{name}-{args.base_files}-c1.out"
            workers = args.workers
            big_main, big_forked = _callgrind(
                tool, jobs, ca, work, args.concurrency, big_file, workers
            )
            base_main, base_forked = _callgrind(
                tool, small, ca, work, args.concurrency, small_file, workers
            )
            big, base = big_main + big_forked, base_main + base_forked
            one = None
            if args.handshakes:
                one = sum(_callgrind(tool, small, ca, work, 1, one_file, workers))
            extra = args.files - args.base_files
            per_file = (big - base) / extra
            # With workers: what the driver (the tool's process) and the workers spend.
            split = ((big_main - base_main) / extra, (big_forked - base_forked) / extra)
            per_handshake = (base - one) / (args.concurrency - 1) if one is not None else None
            rows.append((tool, big, per_file, split, per_handshake))
            print(
                f"{tool}: {big:,} Ir at {args.files}, {base:,} at {args.base_files}: "
                f"{per_file:,.0f} Ir/file (main process {split[0]:,.0f}, forked "
                f"{split[1]:,.0f}); handshake {per_handshake or 0:,.0f} Ir; load {loadavg()}",
                file=sys.stderr,
                flush=True,
            )
    print(
        "\n| tool | Ir per file (marginal) | of which the main process | of which its workers "
        f"| Ir per extra connection | total Ir at {args.files} |"
    )
    print("|---|--:|--:|--:|--:|--:|")
    for tool, big, per_file, split, per_handshake in rows:
        hs = f"{per_handshake:,.0f}" if per_handshake is not None else "-"
        print(f"| {tool} | {per_file:,.0f} | {split[0]:,.0f} | {split[1]:,.0f} | {hs} | {big:,} |")
    print(f"\ncallgrind files in {keep}; e.g. callgrind_annotate --inclusive=yes FILE | head -60")


# -- any wrapper (strace -c, perf record, ...) ------------------------------------------


def cmd_wrap(args: argparse.Namespace) -> None:
    """Each tool once under ``--prefix`` ({tool} is replaced by the tool's name)."""
    import shlex

    with https_server(args.work, args.files, args.plain) as (jobs, ca, work):
        for tool in args.tools.split(","):
            prefix = shlex.split(args.prefix.replace("{tool}", tool.replace("/", "_")))
            data = run_tool(
                tool, jobs, ca, work, args.concurrency, prefix, {"SWARMGET_WORKERS": "1"}
            )
            print(f"{tool}: {data['elapsed']:.3f} s, cpu {data['cpu_s']:.3f} s; load {loadavg()}")


# -- cProfile (pure build) ----------------------------------------------------------------


def cmd_cprofile(args: argparse.Namespace) -> None:
    with https_server(args.work, args.files, args.plain) as (jobs, ca, work):
        argv = [sys.executable, __file__, "_cprofile_child", str(jobs), str(ca), str(work)]
        argv += ["--concurrency", str(args.concurrency), "--top", str(args.top)]
        argv += ["--workers", str(args.workers)]
        from swarmget.testing.process import child_env

        subprocess.run(argv, env=child_env(), check=True)


def cmd_cprofile_child(args: argparse.Namespace) -> None:
    import cProfile
    import pstats

    import swarmget
    import swarmget.api

    # workers=1: the engine runs in this process; more: the profile is the driver's
    os.environ["SWARMGET_WORKERS"] = str(args.workers)
    urls = [line.split("\t")[0] for line in Path(args.jobs).read_text().splitlines()]
    out = Path(args.work) / "out-cprofile"
    profile = cProfile.Profile()
    start = time.process_time()
    profile.enable()
    report = swarmget.download(
        urls, out, concurrency=args.concurrency, per_host=args.concurrency, cacert=args.ca
    )
    profile.disable()
    cpu = time.process_time() - start
    shutil.rmtree(out, ignore_errors=True)
    if report.failed:
        print(f"warning: {report.failed} failed: {report.error_counts()}")
    print(f"compiled: {swarmget.compiled()}; {len(urls)} files; cpu {cpu:.3f} s under cProfile")
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(args.top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--files", type=int, default=10_000)
    common.add_argument("--concurrency", type=int, default=100)
    common.add_argument("--plain", action="store_true", help="plain HTTP (W1) instead")
    common.add_argument(
        "--work", type=Path, default=Path(f"/dev/shm/swarmget-profile-https-{os.getpid()}")
    )
    p = sub.add_parser("cpu", parents=[common])
    p.add_argument("--tools", default="swarmget-1,swarmget,pycurl")
    p.add_argument("--rounds", type=int, default=5)
    p = sub.add_parser("callgrind", parents=[common])
    p.add_argument("--tools", default="swarmget-1,pycurl")
    p.add_argument("--base-files", type=int, default=200)
    p.add_argument("--handshakes", action="store_true", help="also measure a handshake")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="swarmget worker processes (callgrind follows the forks; the table "
        "splits the main process, the driver, from its workers)",
    )
    p.add_argument("--keep", type=Path, default=Path("/tmp/swarmget-callgrind"))
    p = sub.add_parser("wrap", parents=[common])
    p.add_argument("--tools", default="swarmget-1,pycurl")
    p.add_argument("--prefix", required=True, help='e.g. "strace -c -f -o /tmp/{tool}.strace"')
    p = sub.add_parser("cprofile", parents=[common])
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--workers", type=int, default=1)
    p = sub.add_parser("_cprofile_child")
    p.add_argument("jobs")
    p.add_argument("ca")
    p.add_argument("work")
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    if args.command == "_cprofile_child":
        cmd_cprofile_child(args)
        return
    try:
        {
            "cpu": cmd_cpu,
            "callgrind": cmd_callgrind,
            "wrap": cmd_wrap,
            "cprofile": cmd_cprofile,
        }[args.command](args)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
