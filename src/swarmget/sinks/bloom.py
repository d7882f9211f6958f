"""A Bloom filter: "certainly not seen" in a few bits per item, for the planner.

The planner must know whether this run has already seen a row's identity or
handed out a name; the journal knows exactly, at the price of a query.  A run
whose journal started empty can ask a filter first: a "no" is certain (no
query), a "maybe" (about 2% false, at 6 million items) goes to the journal.
Its size is fixed (8 MiB) whatever the list's length; past the number of
items it was made for it answers "maybe" more and more often, which costs
queries, never a wrong answer.
"""

from __future__ import annotations

from typing import Final

BITS_LOG2: Final = 26  # 2**26 bits = 8 MiB
_MIX: Final = 0x9E3779B97F4A7C15  # spreads a hash's bits for the second and third probe
_MASK64: Final = (1 << 64) - 1


class Bloom:
    __slots__ = ("_bits", "_mask", "count")

    def __init__(self, bits_log2: int = BITS_LOG2) -> None:
        self._bits = bytearray(1 << (bits_log2 - 3))
        self._mask = (1 << bits_log2) - 1
        self.count = 0

    def add(self, item: int) -> None:
        """Add a 64-bit hash (a row key, or ``hash()`` of a name)."""
        bits, mask = self._bits, self._mask
        h = item & _MASK64
        for _ in range(3):
            p = h & mask
            bits[p >> 3] |= 1 << (p & 7)
            h = ((h * _MIX) & _MASK64) >> 7
        self.count += 1

    def __contains__(self, item: int) -> bool:
        bits, mask = self._bits, self._mask
        h = item & _MASK64
        for _ in range(3):
            p = h & mask
            if not bits[p >> 3] & (1 << (p & 7)):
                return False
            h = ((h * _MIX) & _MASK64) >> 7
        return True
