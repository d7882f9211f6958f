"""A Bloom filter: "certainly not seen" in a few bits per item, for the planner.

The planner must know whether this run has already seen a row's identity or
handed out a name; the journal knows exactly, at the price of a query.  A run
whose journal started empty can ask a filter first: a "no" is certain (no
query), a "maybe" (about 3% false, at 6 million items) goes to the journal.
Its size is fixed (8 MiB) whatever the list's length; past the number of
items it was made for it answers "maybe" more and more often, which costs
queries, never a wrong answer.
"""

from __future__ import annotations

import mmap
from typing import Final

BITS_LOG2: Final = 26  # 2**26 bits = 8 MiB
HASH_BITS: Final = 62  # items are hashes of this many bits (mypyc's fast integers)
_LOW: Final = (1 << HASH_BITS) - 1


class Bloom:
    """Two probes per item, taken from the low and the high bits of its (already
    random) hash: shifts and masks only, no multiplication, so that under mypyc it
    all stays in machine integers.

    Two, not the three that would give the fewest false answers: each probe is
    a read and a write of one byte of the mapping through the generic item
    protocol (~250 ns; the planner makes four filter operations a row), and
    the third probe bought little: 1.3% -> 2.7% false at 6 million items, a few
    more rows per batch looked up in the journal, for a third less time.
    """

    __slots__ = ("_bits", "_mask", "_shift", "count")

    def __init__(self, bits_log2: int = BITS_LOG2) -> None:
        # Anonymous memory, not a bytearray: the OS hands out zeroed pages as they
        # are first written, so making the filter costs nothing up front (a
        # bytearray zeroes all 8 MiB at once: ~5 ms before the first row could be
        # dealt).  And pages never written before the driver forks its workers
        # are not shared with them, so no write after the fork copies a page.
        self._bits = _zeroed(1 << (bits_log2 - 3))
        self._mask = (1 << bits_log2) - 1
        self._shift = HASH_BITS - bits_log2  # the two windows do not overlap
        self.count = 0

    def add(self, item: int) -> None:
        """Add a hash (a row key, or ``hash()`` of a name)."""
        bits, mask, shift = self._bits, self._mask, self._shift
        h = item & _LOW
        p = h & mask
        bits[p >> 3] |= 1 << (p & 7)
        p = (h >> shift) & mask
        bits[p >> 3] |= 1 << (p & 7)
        self.count += 1

    def __contains__(self, item: int) -> bool:
        bits, mask, shift = self._bits, self._mask, self._shift
        h = item & _LOW
        p = h & mask
        if not bits[p >> 3] & (1 << (p & 7)):
            return False
        p = (h >> shift) & mask
        return bool(bits[p >> 3] & (1 << (p & 7)))


def _zeroed(size: int) -> mmap.mmap:
    """``size`` bytes of private anonymous memory (Python's default is shared, which
    the kernel backs with shared-memory pages: a heavier fault, and pages a fork
    would share for nothing)."""
    private = getattr(mmap, "MAP_PRIVATE", None)
    if private is None:  # Windows: no flags, and no fork either
        return mmap.mmap(-1, size)
    return mmap.mmap(-1, size, flags=private)
