"""What a request does with the decoding loop's tokens besides reading them: time the model's share,
and stop before the first token the model is unsure of."""

from __future__ import annotations

import time
from collections.abc import Iterator


class TimedIterator(Iterator[int]):
    """An iterator that adds up the time its source takes to produce each item (the model's share
    of a request, apart from what the caller does with the items)."""

    def __init__(self, source: Iterator[int]):
        self.source = iter(source)
        self.ms = 0.0

    def __next__(self) -> int:
        started = time.perf_counter()
        try:
            return next(self.source)
        finally:
            self.ms += (time.perf_counter() - started) * 1000


class ConfidentTokens(Iterator[int]):
    """Tokens up to the first one the model gives less than `threshold` probability (see
    StopRule.min_confidence); `confidences` is filled by the decoding loop as it yields."""

    def __init__(self, source: Iterator[int], confidences: list[float], threshold: float):
        self.source, self.confidences, self.threshold = iter(source), confidences, threshold
        self.count = 0
        self.unsure = False

    def __next__(self) -> int:
        if self.unsure:
            raise StopIteration
        token = next(self.source)
        if self.count < len(self.confidences) and self.confidences[self.count] < self.threshold:
            self.unsure = True
            raise StopIteration
        self.count += 1
        return token
