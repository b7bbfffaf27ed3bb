"""Threads for long prefills on the CPU, chosen by measurement.

Decoding a small model runs on one thread (its steps are too small to split). A long prefill is
one big batch of matrix products that two cores finish in about half the time, but only while the
other core is free; when another process holds it the threads wait on each other and the prefill
gets slower. So the choice is measured: each long prefill records its milliseconds per token under
the thread count it ran with, the faster count is used, and every `probe_every`-th long prefill
tries the other one again, since what else runs on the machine changes.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch


class PrefillThreads:
    def __init__(self, choices: tuple[int, ...], min_tokens: int = 64, probe_every: int = 8):
        self.choices = tuple(dict.fromkeys(choices))  # distinct, in order
        self.min_tokens = min_tokens
        self.probe_every = probe_every
        self.ms_per_token: dict[int, float] = {}  # running average per thread count
        self.prefills = 0

    def pick(self) -> int:
        untried = [c for c in self.choices if c not in self.ms_per_token]
        if untried:
            return untried[0]
        best = min(self.ms_per_token, key=self.ms_per_token.get)
        if self.prefills % self.probe_every == 0:  # now and then, the other choice again
            others = [c for c in self.choices if c != best]
            return others[(self.prefills // self.probe_every) % len(others)] if others else best
        return best

    def record(self, threads: int, tokens: int, seconds: float) -> None:
        ms = seconds * 1000 / max(1, tokens)
        old = self.ms_per_token.get(threads)
        self.ms_per_token[threads] = ms if old is None else 0.5 * old + 0.5 * ms
        self.prefills += 1

    @contextmanager
    def for_prefill(self, tokens: int):
        """Run the block (a prefill of `tokens` tokens) with the chosen threads, then restore."""
        if len(self.choices) < 2 or tokens < self.min_tokens:
            yield
            return
        before = torch.get_num_threads()
        threads = self.pick()
        torch.set_num_threads(threads)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.record(threads, tokens, time.perf_counter() - start)
            torch.set_num_threads(before)

    def to_json(self) -> dict:
        return {"ms_per_token": {str(k): round(v, 3) for k, v in self.ms_per_token.items()},
                "prefills": self.prefills}
