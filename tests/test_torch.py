"""swarmget.torch.URLDataset in real DataLoaders: shares, ranks, epochs, map, failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import swarmget
from swarmget.sources.rows import Row
from swarmget.testing import TestServer, expected_body
from swarmget.testing.process import child_env

if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
    import torch  # under CI torch is installed by ./dev: a missing one is a failure
else:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (./dev test installs it)")

from torch.utils.data import DataLoader

from swarmget.torch import URLDataset


@pytest.fixture(scope="module")
def server() -> Iterator[TestServer]:
    with TestServer() as srv:
        yield srv


def _size(item: Any) -> int:
    return len(item.read())


def test_each_loader_worker_takes_a_disjoint_share(server: TestServer) -> None:
    urls = [server.file_url(f"t{i}.bin", size=100 + i) for i in range(50)]
    loader = DataLoader(URLDataset(urls), num_workers=2, batch_size=None)
    seen = list(loader)
    assert sorted(s["index"] for s in seen) == list(range(50))
    for sample in seen:
        i = sample["index"]
        assert sample["url"] == urls[i]
        assert sample["data"] == expected_body(f"t{i}.bin", 100 + i)


def test_map_values_and_failures_are_skipped_and_counted(server: TestServer) -> None:
    urls = [server.file_url(f"m{i}.bin", size=10 * (i + 1)) for i in range(6)]
    urls[2] = server.file_url("gone.bin", status=404)
    dataset = URLDataset(urls, map=_size, retries=0)
    with pytest.warns(RuntimeWarning, match="http_404"):
        values = sorted(dataset)
    assert values == [10, 20, 40, 50, 60]
    assert dataset.failed == 1


def test_rows_keep_their_own_index(server: TestServer) -> None:
    # A shard of a larger list, its indices keys into the captions: they came
    # back as 0, 1, 2..., each sample joined to another row's caption.
    rows = [Row(1000 + i, server.file_url(f"own{i}.bin", size=20 + i)) for i in range(6)]
    samples = list(DataLoader(URLDataset(rows), num_workers=2, batch_size=None))
    assert sorted(s["index"] for s in samples) == [1000 + i for i in range(6)]
    for sample in samples:
        assert sample["data"] == expected_body(
            f"own{sample['index'] - 1000}.bin", sample["index"] - 980
        )
    shuffled = URLDataset(rows, map=_index, shuffle=True)
    assert sorted(shuffled) == [1000 + i for i in range(6)]


def test_bytes_urls_are_read_as_stream_reads_them(server: TestServer) -> None:
    # A binary column's URLs were read as their repr, "b'http://...'": every
    # item failed as bad_url and was skipped.
    urls: list[Any] = [server.file_url(f"b{i}.bin", size=30).encode() for i in range(3)]
    samples = list(DataLoader(URLDataset(urls), batch_size=None))
    assert [s["data"] for s in samples] == [expected_body(f"b{i}.bin", 30) for i in range(3)]
    with pytest.warns(RuntimeWarning, match="bad_row: input item 0 is None"):
        dataset = URLDataset([None])
        assert list(dataset) == []


def _index(item: Any) -> int:
    return int(item.index)


def test_set_epoch_gives_a_reproducible_new_order(server: TestServer) -> None:
    # As the README writes it (no ordered=True) the samples came in completion
    # order: the same seed and epoch gave another order when the server's
    # timing differed.
    def order(epoch: int, slow: int) -> list[int]:
        urls = [
            server.file_url(f"s{i}.bin", size=10, latency=0.04 if i % 3 == slow else 0)
            for i in range(30)
        ]
        dataset = URLDataset(urls, shuffle=True, seed=7)
        dataset.set_epoch(epoch)
        return [sample["index"] for sample in dataset]

    first = order(0, slow=0)
    assert sorted(first) == list(range(30)) and first != list(range(30))
    assert order(0, slow=1) == first  # the same seed and epoch: the same order
    assert order(1, slow=2) != first


def _loader_order(dataset: URLDataset, **loader: Any) -> Iterator[list[int]]:
    for epoch in range(3):
        dataset.set_epoch(epoch)
        yield [int(sample["index"]) for sample in DataLoader(dataset, **loader)]


def test_set_epoch_reaches_persistent_loader_workers(server: TestServer) -> None:
    # Loader workers that persist between epochs hold their own copy of the
    # dataset: set_epoch in the main process never reached them, and every
    # epoch came out in the first one's order.
    urls = [server.file_url(f"p{i}.bin", size=10, latency=0.01 * (i % 3)) for i in range(24)]
    dataset = URLDataset(urls, shuffle=True, seed=3)
    loader = DataLoader(dataset, num_workers=2, batch_size=None, persistent_workers=True)
    persistent = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        persistent.append([int(sample["index"]) for sample in loader])
    fresh = list(
        _loader_order(URLDataset(urls, shuffle=True, seed=3), num_workers=2, batch_size=None)
    )
    assert persistent == fresh
    assert len({tuple(order) for order in persistent}) == 3
    assert all(sorted(order) == list(range(24)) for order in persistent)


def test_failures_are_counted_across_loader_workers(server: TestServer) -> None:
    # The count lived in each loader process: the main process read 0.
    urls = [server.file_url(f"f{i}.bin", size=10) for i in range(12)]
    for i in (1, 4, 7, 10):
        urls[i] = server.file_url(f"gone{i}.bin", status=404)
    dataset = URLDataset(urls, map=_size, retries=0)
    with warnings.catch_warnings():  # raised in the loader processes, as they fork
        warnings.simplefilter("ignore", RuntimeWarning)
        values = list(DataLoader(dataset, num_workers=2, batch_size=None))
    assert len(values) == 8
    assert dataset.failed == 4


def test_loader_workers_may_be_spawned(server: TestServer) -> None:
    """The shared epoch and failure count were made in the fork context, whose
    lock refuses to go to a spawned process: the DataLoader failed at once."""
    urls = [server.file_url(f"s{i}.bin", size=10) for i in range(6)]
    urls[2] = server.file_url("gone.bin", status=404)
    dataset = URLDataset(urls, map=_size, retries=0)
    loader = DataLoader(dataset, num_workers=1, batch_size=None, multiprocessing_context="spawn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        values = list(loader)
    assert values == [10] * 5
    assert dataset.failed == 1


def test_shuffle_needs_a_list() -> None:
    # A set is no iterator (those are refused before): it was called one.
    with pytest.raises(swarmget.UsageError, match=r"needs a sequence .*, not a set$"):
        URLDataset({"http://h/a"}, shuffle=True)


def test_bad_input_or_options_fail_when_the_dataset_is_made() -> None:
    # A str was iterated as URLs of one character each (all failed, silently);
    # an iterator gave its rows to the first epoch and none to the next; a
    # typo surfaced only inside the loader workers, at the first iteration.
    with pytest.raises(TypeError, match="not a single str") as single:
        URLDataset("http://h/one")
    assert "sources=" not in str(single.value)  # URLDataset takes none
    with pytest.raises(swarmget.UsageError, match="not an iterator or a generator"):
        URLDataset(url for url in ["http://h/a"])
    with pytest.raises(swarmget.UsageError, match="unknown option"):
        URLDataset(["http://h/a"], concurency=4)
    with pytest.raises(swarmget.UsageError, match="--timeout must be a number"):
        URLDataset(["http://h/a"], timeout="x")
    with pytest.raises(swarmget.UsageError, match=r"^min_speed_window must be positive"):
        URLDataset(["http://h/a"], min_speed_window=0)  # it named --min-speed
    with pytest.raises(swarmget.UsageError, match=r"^--min-speed must be >= 0"):
        URLDataset(["http://h/a"], min_speed=-1)


def test_shuffle_and_seed_are_checked_when_the_dataset_is_made(server: TestServer) -> None:
    # shuffle=1 was taken, then every iteration (in every loader worker) failed
    # with "ordered must be True or False, not 1": an option never passed.
    urls = [server.file_url(f"b{i}.bin", size=10) for i in range(4)]
    for value in (1, 0, "no"):
        with pytest.raises(
            swarmget.UsageError, match=f"shuffle must be True or False, not {value!r}"
        ):
            URLDataset(urls, shuffle=value)
    with pytest.raises(swarmget.UsageError, match="seed must be a whole number"):
        URLDataset(urls, shuffle=True, seed="7")
    dataset = URLDataset(urls, shuffle=False)
    assert sorted(s["index"] for s in DataLoader(dataset, num_workers=2, batch_size=None)) == [
        0, 1, 2, 3,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"on_error": "bogus"}, "on_error must be one of"),
        ({"ordered": "false"}, "ordered must be True or False"),
        ({"prefetch": "10"}, "prefetch must be a whole number"),
        ({"max_buffer_bytes": "x"}, "max_buffer_bytes must be a whole number"),
        ({"progress": "yes"}, "progress must be True, False or a listener"),
        ({"spill_dir": 5}, "spill_dir must be a path"),
        ({"map": 5}, "map must be a function"),
        ({"workers": 2}, "use DataLoader\\(num_workers=...\\)"),
        ({"sources": ["list.txt"]}, "does not take sources=.*pass the rows as urls"),
    ],
)
def test_stream_options_are_checked_when_the_dataset_is_made(
    option: dict[str, Any], message: str
) -> None:
    # All of these were taken, and failed later in every loader worker; sources=
    # was read whole by each loader worker, every input K times over.
    with pytest.raises(swarmget.UsageError, match=message):
        URLDataset(["http://127.0.0.1:9/a"], **option)


@pytest.mark.parametrize("workers", [1, None])
def test_workers_of_one_may_be_asked_for(server: TestServer, workers: int | None) -> None:
    # workers=1 (allowed, as the only choice) was passed to the stream twice:
    # "got multiple values for keyword argument 'workers'" at every iteration.
    urls = [server.file_url(f"w{i}.bin", size=10) for i in range(4)]
    dataset = URLDataset(urls, map=_size, workers=workers)
    assert sorted(DataLoader(dataset, num_workers=2, batch_size=None)) == [10] * 4


def test_loader_workers_share_per_host_and_concurrency() -> None:
    # Each loader worker took the whole of per_host: per_host=3 with two
    # loader workers opened 6 connections at once to the host.
    with TestServer() as server:
        urls = [server.file_url(f"h{i}.bin", size=100, latency=0.2) for i in range(24)]
        for limits in ({"per_host": 3}, {"concurrency": 3}):
            server.reset_stats()
            dataset = URLDataset(urls, **limits)
            seen = list(DataLoader(dataset, num_workers=2, batch_size=None))
            assert sorted(s["index"] for s in seen) == list(range(24))
            assert 2 <= server.stats.peak_active <= 3, (limits, server.stats.peak_active)


TORCH_MAP_CHILD = """
import json, sys
import torch
import swarmget

a = torch.randn(256, 256)
(a @ a).sum()  # the parent's OpenMP thread pool now exists


def m(item):
    x = torch.randn(256, 256)
    return float((x @ x).sum())


with swarmget.stream(json.loads(sys.argv[1]), map=m, workers=2) as items:
    print(sum(1 for item in items if item.ok))
"""


def test_a_map_using_torch_after_the_caller_did_finishes(server: TestServer) -> None:
    # The forked workers waited for OpenMP threads left behind in the parent
    # (a futex wait), for good.  In its own session, so that a hang's workers
    # are ended with it.
    urls = [server.file_url(f"o{i}.bin", size=10) for i in range(4)]
    child = subprocess.Popen(
        [sys.executable, "-c", TORCH_MAP_CHILD, json.dumps(urls)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        pytest.fail("a map using torch hung in the worker processes")
    assert child.returncode == 0, err
    assert out.split() == ["4"]


RANK_CHILD = """
import json, sys
from torch.utils.data import DataLoader
from swarmget.torch import URLDataset
urls = json.loads(sys.argv[1])
loader = DataLoader(URLDataset(urls), num_workers=2, batch_size=None)
print(json.dumps([sample["index"] for sample in loader]))
"""


def test_two_ranks_of_two_loader_workers_cover_every_input_once(server: TestServer) -> None:
    urls = [server.file_url(f"r{i}.bin", size=50) for i in range(101)]
    ranks = []
    for rank in range(2):
        env = dict(child_env(), RANK=str(rank), WORLD_SIZE="2")
        done = subprocess.run(
            [sys.executable, "-c", RANK_CHILD, json.dumps(urls)],
            capture_output=True, text=True, env=env, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        ranks.append(json.loads(done.stdout))
    assert not set(ranks[0]) & set(ranks[1])
    assert sorted(ranks[0] + ranks[1]) == list(range(101))
    assert abs(len(ranks[0]) - len(ranks[1])) <= 1


PERSISTENT_CHILD = """
import json, sys
from torch.utils.data import DataLoader
from swarmget.torch import URLDataset
urls, spill_dir = json.loads(sys.argv[1]), sys.argv[2]
dataset = URLDataset(urls, spill_dir=spill_dir, max_buffer_bytes=0)
loader = DataLoader(dataset, num_workers=2, batch_size=None, persistent_workers=True)
for sample in loader:
    break  # the loader workers stay, their streams open, until the exit
print("left")
"""


def test_persistent_loader_workers_leave_no_spill_folder_at_exit(
    server: TestServer, tmp_path: Any
) -> None:
    # At the interpreter's exit, multiprocessing ends daemonic loader workers
    # with SIGTERM (torch leaves them to it): their streams' spill folders,
    # bodies and all, stayed until a later stream swept them, a minute on.
    urls = [server.file_url(f"e{i}.bin", size=1000, latency=0.05) for i in range(40)]
    done = subprocess.run(
        [sys.executable, "-c", PERSISTENT_CHILD, json.dumps(urls), str(tmp_path)],
        capture_output=True, text=True, env=child_env(), timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["left"]
    assert os.listdir(tmp_path) == []
