"""The torch CPU thread count, chosen by measurement: for long prefills and for training steps.

A small model's decoding step is too small to split, but a long prefill or a training step is one
big batch of matrix products that two cores finish in about half the time, only while the other core
is free; when another process holds it the threads wait on each other and the work gets slower. So
the choice is measured: each run of the work records its milliseconds per unit (token, step) under
the thread count it ran with, the fastest count is used, and every `probe_every`-th run tries another
count again, since what else runs on the machine changes. One chooser serves both: `PrefillThreads`
for the engine's prefills, `ThreadChooser` itself for the training loop's steps.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch


class ThreadChooser:
    """Picks the thread count for the next run of some work, from the measured ms per unit of each."""

    def __init__(self, choices: Iterable[int], probe_every: int = 8):
        self.choices = tuple(dict.fromkeys(choices))  # distinct, in order
        self.probe_every = probe_every
        self.ms_per_unit: dict[int, float] = {}  # running average per thread count
        self.runs = 0

    @property
    def best(self) -> int | None:
        return min(self.ms_per_unit, key=self.ms_per_unit.get) if self.ms_per_unit else None

    def pick(self) -> int:
        untried = [c for c in self.choices if c not in self.ms_per_unit]
        if untried:
            return untried[0]
        best = self.best
        if self.runs % self.probe_every == 0:  # now and then, another choice again
            others = [c for c in self.choices if c != best]
            return others[(self.runs // self.probe_every) % len(others)] if others else best
        return best

    def record(self, threads: int, units: int, seconds: float) -> None:
        ms = seconds * 1000 / max(1, units)
        old = self.ms_per_unit.get(threads)
        self.ms_per_unit[threads] = ms if old is None else 0.5 * old + 0.5 * ms
        self.runs += 1

    @contextmanager
    def measured(self, units: int, restore: bool = True) -> Iterator[int]:
        """Run the block (`units` of work) with the chosen thread count and record how long it took.
        `restore=False` keeps the count afterwards: a training loop pays a switch only on a change."""
        before = torch.get_num_threads()
        threads = self.pick()
        if threads != before:
            torch.set_num_threads(threads)
        start = time.perf_counter()
        try:
            yield threads
        finally:
            self.record(threads, units, time.perf_counter() - start)
            if restore and threads != before:
                torch.set_num_threads(before)


class PrefillThreads(ThreadChooser):
    """The engine's chooser: only prefills of at least `min_tokens` tokens are worth a switch."""

    def __init__(self, choices: tuple[int, ...], min_tokens: int = 64, probe_every: int = 8):
        super().__init__(choices, probe_every)
        self.min_tokens = min_tokens

    @property
    def prefills(self) -> int:
        return self.runs

    @contextmanager
    def for_prefill(self, tokens: int) -> Iterator[None]:
        """Run the block (a prefill of `tokens` tokens) with the chosen threads, then restore."""
        if len(self.choices) < 2 or tokens < self.min_tokens:
            yield
            return
        with self.measured(tokens):
            yield

    def to_json(self) -> dict:
        return {"ms_per_token": {str(k): round(v, 3) for k, v in self.ms_per_unit.items()},
                "prefills": self.prefills}
