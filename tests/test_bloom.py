"""The planner's Bloom filter: "no" is always right, "maybe" is rarely wrong."""

from __future__ import annotations

import random

from swarmget.sinks.bloom import Bloom


def test_no_false_negatives_and_few_false_positives() -> None:
    rng = random.Random(7)
    bloom = Bloom(bits_log2=20)  # a small one, so the test is quick
    added = [rng.getrandbits(62) for _ in range(50_000)]
    for item in added:
        bloom.add(item)
    assert all(item in bloom for item in added)
    others = [rng.getrandbits(62) for _ in range(50_000)]
    false = sum(1 for item in others if item in bloom)
    assert false / len(others) < 0.02, false
    assert bloom.count == 50_000


def test_negative_hashes_of_names_work_too() -> None:
    bloom = Bloom(bits_log2=16)
    names = [f"img{i:05d}.jpg" for i in range(1000)]
    for name in names:
        bloom.add(hash(name))
    assert all(hash(name) in bloom for name in names)
