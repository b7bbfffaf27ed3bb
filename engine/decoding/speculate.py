"""Decoding: the speculative step in named steps, and the plain greedy loop beside it.

One speculative step, in the order of the seeds and of Medusa:
  propose  every draft source guesses continuations of the text so far
  build    the guesses merge into one tree under the certain next token
  verify   the base model runs the whole tree in one forward pass
  accept   the longest path that greedy decoding agrees with
  commit   the KV cache keeps that path and drops the rest
  account  statistics, and the controller's view of which sources pay for their rows and time
  observe  every source learns what was accepted
The tokens are exactly those `greedy_tokens` produces; only the number of forward passes differs.
Both loops run on a runtime (runtime/: torch or llama.cpp), which owns the forward and the cache.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..drafts.base import DraftSource, DraftState, DraftStats, StepOutcome
from ..runtime import Runtime, confidence, greedy
from .sizing import TreeSizer
from .verify import Candidate, DraftTree, build_tree, first_chain, subtree

__all__ = ["DraftController", "SpecStats", "Speculator", "confidence", "greedy_tokens"]


def greedy_tokens(runtime: Runtime, input_ids: list[int], max_new_tokens: int, eos_ids: set[int],
                  cancel: threading.Event | None = None, start: tuple | None = None,
                  confidences: list[float] | None = None) -> Iterator[int]:
    """Plain greedy decoding with a KV cache (the reference); yields each new token, EOS included.
    `start`: the cache already holds `input_ids`, and this is the (hidden state, logits) after them.
    `confidences`: if given, each token's probability is appended to it before the token is yielded."""
    if max_new_tokens <= 0:
        return
    _, logits = start if start is not None else runtime.prefill_hidden(input_ids, cancel)
    for step in range(max_new_tokens):
        if cancel is not None and cancel.is_set():
            return
        token = greedy(logits)
        if confidences is not None:
            confidences.append(confidence(logits))
        yield token
        if token in eos_ids or step == max_new_tokens - 1:
            return
        _, logits = runtime.append(token)


@dataclass
class SpecStats:
    """Figures of the speculative loop, kept across requests for status and benchmarks."""

    steps: int = 0  # verification passes (each emits at least one token)
    plain_steps: int = 0  # steps taken without drafts (nothing drafted, or backed off)
    tokens: int = 0
    drafts: DraftStats = field(default_factory=DraftStats)

    def to_json(self) -> dict:
        return {
            "steps": self.steps, "plain_steps": self.plain_steps, "tokens": self.tokens,
            "tokens_per_step": round(self.tokens / self.steps, 3) if self.steps else 0.0,
            "sources": self.drafts.to_json(),
            "verify_steps": self.steps - self.plain_steps,
        }


class DraftController:
    """Decides whether a step drafts at all (drafted steps must make tokens faster than plain ones)
    and which sources are asked (a source whose guesses are rarely right, or dear to make, sits out
    a while). How many drafted nodes a pass carries is the TreeSizer's (sizing.py)."""

    def __init__(self, min_source_rate: float = 0.05, source_backoff: int = 32, min_asks: int = 8,
                 rate_memory: float = 0.9, explore_every: int = 8):
        # Per source: a running acceptance rate of its drafted nodes; a source below
        # min_source_rate only grows the tree, so it sits out source_backoff steps, then tries again.
        self.min_source_rate, self.source_backoff = min_source_rate, source_backoff
        self.source_rate: dict[str, float] = {}
        # How much of the running rate each step keeps: at 0.9 a source right a third of the time
        # needs ~19 misses in a row to look useless, not 7 (cheap guesses miss in runs, then hit).
        self.rate_memory = rate_memory
        self.source_pause: dict[str, int] = {}
        # Per source, in time: what asking it costs (its propose call) against the decoding time its
        # accepted tokens save. A source whose guesses are right but dear to make (the heads run the
        # vocabulary projection K times) can lose time even with a good acceptance rate.
        self.min_asks = min_asks
        self.ask_seconds: dict[str, float] = {}
        self.ask_gain: dict[str, float] = {}  # tokens accepted per ask
        self.asks: dict[str, int] = {}
        self.time_pause: dict[str, int] = {}  # doubles while a source keeps losing time, up to max_time_pause
        self.max_time_pause = 1024
        self.seconds_per_token = 0.0
        # Time per token of steps with drafts and of plain steps, across requests. On a GPU a tree's
        # extra rows are nearly free; on a CPU each costs almost what a token does (a 7.6M model:
        # 3 ms a plain step, 7-12 ms a tree of 2-17 nodes), so drafts pay only where they are right
        # often. While drafted steps make tokens slower than plain ones, steps go plain, with a
        # drafted one every `explore_every` steps to notice when that changes. Each such step that
        # finds drafts still losing doubles the wait for the next, up to `max_explore_gap` steps: on 2
        # CPU cores a drafted step of Qwen2.5-Coder-0.5B cost 69 ms a token against 21 plain, so one
        # every 8 steps took 10% off decoding for nothing.
        self._timing: dict[str, tuple[float, float]] = {}  # "plain"/"drafted" -> running (ms, tokens) a step
        self.explore_every = explore_every
        self.explore_gap = explore_every  # steps to the next drafted step while drafts lose
        self.max_explore_gap = 32 * explore_every
        self.plain_run = 0

    def allows(self, source: str) -> bool:
        left = self.source_pause.get(source, 0)
        if left > 0:
            self.source_pause[source] = left - 1
            return False
        return True

    def update_source(self, source: str, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        keep = self.rate_memory
        rate = keep * self.source_rate.get(source, 0.3) + (1 - keep) * (accepted / drafted)
        self.source_rate[source] = rate
        if rate < self.min_source_rate:
            self.source_pause[source] = self.source_backoff
            self.source_rate[source] = 0.3  # a fresh chance after the pause

    def record_step(self, seconds: float, tokens: int, drafted: bool = True) -> None:
        per_token = seconds / max(1, tokens)
        self.seconds_per_token = _ema(self.seconds_per_token, per_token)
        # running sums of time and tokens, divided: the mean of each step's ms a token would weigh a
        # missed tree (all cost, one token) as much as a hit that made five tokens
        kind = "drafted" if drafted else "plain"
        ms, made = self._timing.get(kind, (0.0, 0.0))
        self._timing[kind] = (_ema(ms, seconds * 1000), _ema(made, float(tokens)))

    @property
    def plain_ms_per_token(self) -> float:
        ms, made = self._timing.get("plain", (0.0, 0.0))
        return ms / made if made else 0.0

    @property
    def draft_ms_per_token(self) -> float:
        ms, made = self._timing.get("drafted", (0.0, 0.0))
        return ms / made if made else 0.0

    def drafts_pay(self) -> bool:
        """Whether drafted steps have made tokens faster than plain steps (true until both are known)."""
        if self.explore_every <= 1 or not (self.plain_ms_per_token and self.draft_ms_per_token):
            return True
        return self.draft_ms_per_token < self.plain_ms_per_token

    def update_ask(self, source: str, seconds: float, accepted: int) -> None:
        """After a step that asked `source`: pause it when its guesses save less time than they cost."""
        n = self.asks.get(source, 0) + 1
        self.asks[source] = n
        self.ask_seconds[source] = seconds if n == 1 else 0.9 * self.ask_seconds[source] + 0.1 * seconds
        self.ask_gain[source] = accepted if n == 1 else 0.9 * self.ask_gain[source] + 0.1 * accepted
        if n < self.min_asks:
            return
        # The saving of an accepted token is roughly a decoding step's share per token; the drafted
        # nodes cost verification time too, hence the margin. A cheap source (an n-gram lookup) is
        # never paused for this: asking it in vain loses next to nothing.
        loss = 1.5 * self.ask_seconds[source] - self.ask_gain[source] * self.seconds_per_token
        if loss > 0.1 * self.seconds_per_token:
            pause = self.time_pause.get(source, self.source_backoff)
            self.source_pause[source] = pause
            self.time_pause[source] = min(2 * pause, self.max_time_pause)  # each failed retry waits longer
            self.asks[source] = 0  # a fresh measurement after the pause
        else:
            self.time_pause[source] = self.source_backoff

    def use_drafts(self) -> bool:
        # Now and then the other kind of step than the one that pays, so that both timings stay
        # measured: a drafted one every `explore_every` steps, a plain one every 4x as many (a
        # forced plain step costs what the drafts would have saved).
        pay = self.drafts_pay()
        if pay:
            self.explore_gap = self.explore_every
        self.plain_run += 1
        every = self.explore_every * 4 if pay else self.explore_gap
        explore = self.explore_every > 1 and self.plain_run >= every
        if explore:
            self.plain_run = 0
            if not pay:
                self.explore_gap = min(2 * self.explore_gap, self.max_explore_gap)
        return pay != explore

    def reset(self) -> None:
        """A new request: what was learnt about the sources and the timings carries over."""


def _ema(old: float, new: float, keep: float = 0.9) -> float:
    return new if not old else keep * old + (1 - keep) * new


class Speculator:
    """Owns the draft sources, the controller that decides how much to draft, and the statistics;
    runs the speculative loop."""

    def __init__(self, drafters: list[DraftSource], controller: DraftController | None = None,
                 max_rows: int | None = None):
        # A standby source is asked only when nothing asked before it has a guess: the cheap sources
        # first, then (in the list's order) the corpus table before the heads.
        self.drafters = sorted(drafters, key=lambda d: d.standby)
        self.controller = controller or DraftController()
        # the runtime's widest exact pass (llama.cpp: runtime/llamacpp.py), else the sizer's own bound
        self.sizer = TreeSizer(max_rows) if max_rows else TreeSizer()
        self.batch_rows = 0  # rows of the output layer that cost about one row's time (0: not measured yet)
        self.stats = SpecStats()
        # the last request's verification steps: (nodes drafted, drafts accepted, ms drafting, ms in all)
        self.last_steps: list[tuple[int, int, float, float]] = []

    def drafter(self, name: str) -> DraftSource | None:
        return next((d for d in self.drafters if d.name == name), None)

    def tokens(self, runtime: Runtime, input_ids: list[int], max_new_tokens: int,
               eos_ids: set[int], cancel: threading.Event | None = None, start: tuple | None = None,
               confidences: list[float] | None = None) -> Iterator[int]:
        """Greedy decoding that verifies a tree of drafted tokens per forward pass. `start`: the
        cache already holds `input_ids`, and this is the (hidden state, logits) after them.
        `confidences`: as for greedy_tokens."""
        if max_new_tokens <= 0:
            return
        hidden_last, logits = start if start is not None else runtime.prefill_hidden(input_ids, cancel)
        if self.drafters and (self.sizer.cost.missing() or not self.batch_rows):
            self.calibrate(runtime)  # before the clock of any step starts
        context = list(input_ids)
        produced = 0
        self.controller.reset()
        self.last_steps = []
        while True:
            if cancel is not None and cancel.is_set():
                return
            root = greedy(logits)
            remaining = max_new_tokens - produced
            state = DraftState(context + [root], hidden_last, len(input_ids), max_len=remaining - 1)
            if root in eos_ids or remaining == 1:  # the last token: nothing left to draft for
                self.stats.steps += 1
                self.stats.plain_steps += 1
                self.stats.tokens += 1
                self.observe(StepOutcome(state, {}, [], root, verified=False))
                if confidences is not None:
                    confidences.append(confidence(logits))
                yield root
                return
            started = time.perf_counter()
            proposals, asked = self.propose(state)
            drafted = time.perf_counter()
            drafts = build_tree(root, [c for cs in proposals.values() for c in cs],
                                max_nodes=self.sizer.max_rows, max_depth=remaining - 1)
            tree = subtree(drafts, self.sizer.choose(drafts)) if len(drafts) > 1 else drafts
            if runtime.max_branches == 1 and len(tree) > 1:  # a runtime that verifies chains only
                tree = subtree(tree, first_chain(tree))
            verifying = time.perf_counter()
            verified = runtime.verify(tree, self.batch_rows)
            path = verified.accepted_path()
            accepted = [tree.tokens[i] for i in path]
            if len(drafts) > 1:
                known = accepted[1:] + [verified.greedy_next(path[-1])]
                self.sizer.observe(drafts, known, len(tree), (time.perf_counter() - verifying) * 1000)
            else:
                self.sizer.cost.record(1, (time.perf_counter() - verifying) * 1000)
            runtime.commit(verified, path)  # the cache and its tokens keep the accepted path
            seconds = time.perf_counter() - started
            self.account(tree, path, asked, seconds)
            self.last_steps.append((len(tree) - 1, len(path) - 1, round((drafted - started) * 1000, 3),
                                    round(seconds * 1000, 3)))
            self.observe(StepOutcome(state, proposals, accepted[1:], verified.greedy_next(path[-1]),
                                     verified=len(tree) > 1))
            context.extend(accepted)
            for i, token in enumerate(accepted):
                produced += 1
                self.stats.tokens += 1
                if confidences is not None:  # the root's from the last step, the others' from this one
                    confidences.append(confidence(logits if i == 0 else verified.logits(path[i - 1])))
                yield token
                if token in eos_ids or produced >= max_new_tokens:
                    return
            logits = verified.logits(path[-1])
            hidden_last = verified.hidden[path[-1]]

    def propose(self, state: DraftState) -> tuple[dict[str, list[Candidate]], dict[str, float]]:
        """Each source's guesses (standby sources only while nothing else has one), and the seconds
        each propose call took."""
        proposals: dict[str, list[Candidate]] = {}
        asked: dict[str, float] = {}
        if not self.controller.use_drafts():
            return proposals, asked
        drafted = False
        for drafter in self.drafters:
            if (not drafter.standby or not drafted) and self.controller.allows(drafter.name):
                started = time.perf_counter()
                proposals[drafter.name] = guesses = drafter.propose(state)
                asked[drafter.name] = time.perf_counter() - started
                drafted = drafted or any(not c.hint for c in guesses)
        return proposals, asked

    def calibrate(self, runtime: Runtime) -> None:
        """Measure what this runtime charges here: a verification pass of each size the sizer weighs
        (the first also warms the kernels), and how many output-layer rows cost about one. Once per
        speculator, at its first drafted step."""
        for rows in [1] + self.sizer.cost.missing():
            self.sizer.cost.record(rows, runtime.pass_ms(rows))
        self.batch_rows = runtime.output_batch_rows()

    def account(self, tree: DraftTree, path: list[int], asked: dict[str, float], seconds: float) -> None:
        """Statistics, and the controller's view of which sources pay for their rows and their time."""
        controller = self.controller
        self.stats.steps += 1
        self.stats.plain_steps += int(len(tree) == 1)
        drafted = Counter(tree.sources[1:])
        accepted = Counter(tree.sources[i] for i in path[1:])
        for source, count in drafted.items():
            self.stats.drafts.add(source, drafted=count, accepted=accepted[source])
            controller.update_source(source, count, accepted[source])
        controller.record_step(seconds, len(path), drafted=len(tree) > 1)
        for source, ask_seconds in asked.items():
            controller.update_ask(source, ask_seconds, accepted[source])

    def observe(self, outcome: StepOutcome) -> None:
        for drafter in self.drafters:
            drafter.observe(outcome)

    def finish(self, tokens: list[int]) -> None:
        """A request ended: the end of its prompt and its completion, for sources that keep them."""
        for drafter in self.drafters:
            drafter.finish(tokens)

    def reset(self) -> None:
        for drafter in self.drafters:
            drafter.reset()

    def to_json(self) -> dict:
        out = {**self.stats.to_json(), "head_accuracy": [],  # filled in by the heads, when there are any
               "ms_per_token": {"plain": round(self.controller.plain_ms_per_token, 3),
                                "drafted": round(self.controller.draft_ms_per_token, 3)},
               **self.sizer.to_json(), "output_batch_rows": self.batch_rows}
        for drafter in self.drafters:
            out.update(drafter.stats())
        return out
