"""Bounded caches and the content hash they are keyed by, shared by the documents, the context
compressor and the workspace index.

The server runs for hours on one keystroke after another: every cache it keeps is bounded, and
keyed by a hash of the content it was made from, so that an unchanged text finds its entry again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import xxhash


class LRU(OrderedDict):
    """A small least-recently-used map: the caches here stay bounded in memory (and thread-safe)."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size
        self._lock = threading.Lock()

    def get(self, key, default=None):
        with self._lock:
            if key in self:
                self.move_to_end(key)
                return self[key]
            return default

    def put(self, key, value) -> None:
        with self._lock:
            self[key] = value
            self.move_to_end(key)
            while len(self) > self.size:
                self.popitem(last=False)

    def drop_where(self, predicate) -> None:
        with self._lock:
            for key in [k for k in self if predicate(k)]:
                del self[key]


def content_hash(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))
