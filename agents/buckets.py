"""Nodes grouped into buckets by a key, smallest key first: the node index's structure.

One :class:`Buckets` per scheduling class holds the nodes where the class fits, keyed by
how many more copies of it they hold (:mod:`agents.nodes`). Every operation is O(1)
amortised, plus O(log B) for a new key (B distinct keys); node ids are small integers.
"""

from __future__ import annotations

import heapq
from array import array


class Buckets:
    """The nodes (by id) where one class fits, grouped by key; the smallest key first.

    Keys are non-zero integers; 0 means "not here". Each bucket is a list with the position
    of every node kept alongside, so removing is a swap with the last element.
    """

    __slots__ = ("_buckets", "_heap", "_in_heap", "_key_of", "_pos_of", "size")

    def __init__(self, capacity: int) -> None:
        self._key_of = array("q", [0]) * capacity
        self._pos_of = array("q", [0]) * capacity
        self._buckets: dict[int, list[int]] = {}
        self._heap: list[int] = []
        self._in_heap: set[int] = set()
        self.size = 0

    def grow(self, capacity: int) -> None:
        """Make room for node ids below ``capacity``."""
        missing = capacity - len(self._key_of)
        if missing > 0:
            self._key_of.extend(array("q", [0]) * missing)
            self._pos_of.extend(array("q", [0]) * missing)

    def key(self, nid: int) -> int:
        return self._key_of[nid]

    def set(self, nid: int, key: int) -> None:
        """Move node ``nid`` to bucket ``key`` (0: out of every bucket)."""
        old = self._key_of[nid]
        if old == key:
            return
        if old:
            self._remove(nid, old)
        if key:
            self._insert(nid, key)

    def first(self) -> int | None:
        """A node of the smallest non-empty bucket, or None."""
        heap = self._heap
        while heap:
            bucket = self._buckets.get(heap[0])
            if bucket:
                return bucket[-1]
            self._in_heap.discard(heapq.heappop(heap))
        return None

    def _insert(self, nid: int, key: int) -> None:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = []
            if key not in self._in_heap:
                self._in_heap.add(key)
                heapq.heappush(self._heap, key)
        self._pos_of[nid] = len(bucket)
        bucket.append(nid)
        self._key_of[nid] = key
        self.size += 1

    def _remove(self, nid: int, key: int) -> None:
        bucket = self._buckets[key]
        last = bucket.pop()
        if last != nid:
            position = self._pos_of[nid]
            bucket[position] = last
            self._pos_of[last] = position
        if not bucket:
            del self._buckets[key]  # its key stays in the heap until first() meets it
        self._key_of[nid] = 0
        self.size -= 1
