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

import os
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

    def pick(self, probe: bool = True) -> int:
        """The count for the next run: the fastest known, or (`probe`) now and then another one."""
        untried = [c for c in self.choices if c not in self.ms_per_unit]
        if untried and (probe or self.best is None):
            return untried[0]
        best = self.best
        if probe and self.runs % self.probe_every == 0:  # now and then, another choice again
            others = [c for c in self.choices if c != best]
            return others[(self.runs // self.probe_every) % len(others)] if others else best
        return best

    def record(self, threads: int, units: int, seconds: float) -> None:
        ms = seconds * 1000 / max(1, units)
        old = self.ms_per_unit.get(threads)
        self.ms_per_unit[threads] = ms if old is None else 0.5 * old + 0.5 * ms
        self.runs += 1

    @contextmanager
    def measured(self, units: int, restore: bool = True, probe: bool = True) -> Iterator[int]:
        """Run the block (`units` of work) with the chosen thread count and record how long it took.
        `restore=False` keeps the count afterwards: a training loop pays a switch only on a change.
        `probe=False`: the fastest known count, no try of another."""
        before = torch.get_num_threads()
        threads = self.pick(probe)
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
    """The engine's chooser: only prefills of at least `min_tokens` tokens are worth a switch.

    A try of more threads is dear when another process holds a core: the threads wait on each other
    at every operation (measured here, SmolLM2 in int8 with another process busy on the second core:
    a 256-token prefill took 10.8 s on 2 threads, 0.2 s on 1). So a try runs on one chunk of
    `probe_tokens` only (the caller splits a long prefill), and none is made while the load average
    says the cores are taken."""

    def __init__(self, choices: tuple[int, ...], min_tokens: int = 32, probe_every: int = 8,
                 probe_tokens: int = 32):
        super().__init__(choices, probe_every)
        self.min_tokens = min_tokens
        self.probe_tokens = probe_tokens

    def pick(self, probe: bool = True) -> int:
        return super().pick(probe and cores_free(max(self.choices)))

    @property
    def prefills(self) -> int:
        return self.runs

    @contextmanager
    def for_prefill(self, tokens: int, probe: bool = True) -> Iterator[None]:
        """Run the block (a prefill of `tokens` tokens) with the chosen threads, then restore.
        `probe=False`: the fastest known count (a chunk after the one that may try another)."""
        if len(self.choices) < 2 or tokens < self.min_tokens:
            yield
            return
        with self.measured(tokens, probe=probe):
            yield

    @contextmanager
    def fastest(self) -> Iterator[None]:
        """Run the block on the fastest count known (all cores before any is known), without a try
        or a record: for work unlike a prefill's, whose timings would mislead the choice."""
        before = torch.get_num_threads()
        threads = self.best or max(self.choices)
        if threads != before:
            torch.set_num_threads(threads)
        try:
            yield
        finally:
            if threads != before:
                torch.set_num_threads(before)

    def chunks(self, tokens: int) -> list[tuple[int, int, bool]]:
        """How a prefill of `tokens` tokens is split: (start, end, whether a try is allowed) — the
        first `probe_tokens` may try another count, the rest runs on the fastest known."""
        if tokens < self.min_tokens + self.probe_tokens:
            return [(0, tokens, tokens <= self.probe_tokens * 2)]
        return [(0, self.probe_tokens, True), (self.probe_tokens, tokens, False)]

    def to_json(self) -> dict:
        return {"ms_per_token": {str(k): round(v, 3) for k, v in self.ms_per_unit.items()},
                "prefills": self.prefills}


def cores_free(threads: int) -> bool:
    """Whether `threads` cores look free: the 1-minute load average (this process's running
    thread included) leaves room for them. Where the system does not tell, assume so."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return True
    return load <= (os.cpu_count() or 1) - threads + 1.0
