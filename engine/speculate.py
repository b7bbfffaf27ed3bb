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
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from . import kv
from .drafts.base import DraftSource, DraftState, DraftStats, StepOutcome
from .lean import output_layer
from .sizing import TreeSizer
from .verify import Candidate, DraftTree, accept_longest_path, build_tree, subtree, tree_attention_mask


def confidence(logits: torch.Tensor) -> float:
    """The probability the model gives its greedy choice."""
    return float(torch.softmax(logits.float(), dim=-1).max())


@torch.inference_mode()
def greedy_tokens(model, input_ids: list[int], max_new_tokens: int, eos_ids: set[int],
                  prompt_cache: kv.PromptCache, cancel: threading.Event | None = None,
                  start: tuple[torch.Tensor, torch.Tensor] | None = None,
                  confidences: list[float] | None = None) -> Iterator[int]:
    """Plain greedy decoding with a KV cache (the reference); yields each new token, EOS included.
    `start`: the cache already holds `input_ids`, and this is the (hidden state, logits) after them.
    `confidences`: if given, each token's probability is appended to it before the token is yielded."""
    if max_new_tokens <= 0:
        return
    _, logits = start if start is not None else prompt_cache.prefill_hidden(model, input_ids)
    for step in range(max_new_tokens):
        if cancel is not None and cancel.is_set():
            return
        token = int(torch.argmax(logits))
        if confidences is not None:
            confidences.append(confidence(logits))
        yield token
        if token in eos_ids or step == max_new_tokens - 1:
            return
        _, logits = prompt_cache.append(model, token)


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
        # drafted one every `explore_every` steps to notice when that changes.
        self._timing: dict[str, tuple[float, float]] = {}  # "plain"/"drafted" -> running (ms, tokens) a step
        self.explore_every = explore_every
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
        self.plain_run += 1
        every = self.explore_every * (4 if pay else 1)
        explore = self.explore_every > 1 and self.plain_run >= every
        if explore:
            self.plain_run = 0
        return pay != explore

    def reset(self) -> None:
        """A new request: what was learnt about the sources and the timings carries over."""


def _ema(old: float, new: float, keep: float = 0.9) -> float:
    return new if not old else keep * old + (1 - keep) * new


@dataclass
class Verified:
    """One verification pass over a draft tree. The logits are computed only for the nodes the
    accepted path reaches: on a CPU a float output layer costs as much as a layer or two, and a
    matrix of a few rows costs two to three times one row (measured: 12,288 x 256 output layer, 0.42
    ms for 1 row, 0.92 ms for 2, 2.8 ms for 17; SmolLM2's 49,152 x 576: 10 ms for 1 or 2 rows, 21 for
    4), while a path is usually a node or two. Where `batch_rows` rows cost about what one does (an
    int8 output layer: 1.4 ms for 1 to 16 rows), the first `batch_rows` nodes get theirs in one go."""

    tree: DraftTree
    hidden: torch.Tensor  # (N, H) the base model's last hidden state after each node
    head: torch.nn.Module  # the output layer
    past: int  # cached positions before the tree
    batch_rows: int = 1
    _logits: dict[int, torch.Tensor] = field(default_factory=dict)

    def logits(self, node: int) -> torch.Tensor:
        if node not in self._logits:
            if node < self.batch_rows and len(self.tree) > 1:
                rows = min(self.batch_rows, len(self.tree))
                self._logits.update(enumerate(self.head(self.hidden[:rows])))
            else:
                self._logits[node] = self.head(self.hidden[node])
        return self._logits[node]

    def greedy_next(self, node: int) -> int:
        """The base model's greedy choice after `node` (models with a final logit scale or soft-cap
        apply a monotonic function, which leaves the argmax unchanged)."""
        return int(torch.argmax(self.logits(node)))


class Speculator:
    """Owns the draft sources, the controller that decides how much to draft, and the statistics;
    runs the speculative loop."""

    def __init__(self, drafters: list[DraftSource], controller: DraftController | None = None):
        # A standby source is asked only when nothing asked before it has a guess: the cheap sources
        # first, then (in the list's order) the corpus table before the heads.
        self.drafters = sorted(drafters, key=lambda d: d.standby)
        self.controller = controller or DraftController()
        self.sizer = TreeSizer()
        self.batch_rows = 0  # rows of the output layer that cost about one row's time (0: not measured yet)
        self.stats = SpecStats()
        # the last request's verification steps: (nodes drafted, drafts accepted, ms drafting, ms in all)
        self.last_steps: list[tuple[int, int, float, float]] = []

    def drafter(self, name: str) -> DraftSource | None:
        return next((d for d in self.drafters if d.name == name), None)

    @torch.inference_mode()
    def tokens(self, model, prompt_cache: kv.PromptCache, input_ids: list[int], max_new_tokens: int,
               eos_ids: set[int], cancel: threading.Event | None = None,
               start: tuple[torch.Tensor, torch.Tensor] | None = None,
               confidences: list[float] | None = None) -> Iterator[int]:
        """Greedy decoding that verifies a tree of drafted tokens per forward pass. `start`: the
        cache already holds `input_ids`, and this is the (hidden state, logits) after them.
        `confidences`: as for greedy_tokens."""
        if max_new_tokens <= 0:
            return
        hidden_last, logits = start if start is not None else prompt_cache.prefill_hidden(model, input_ids)
        if self.drafters and (self.sizer.cost.missing() or not self.batch_rows):
            self.calibrate(model, prompt_cache, hidden_last)  # before the clock of any step starts
        context = list(input_ids)
        produced = 0
        self.controller.reset()
        self.last_steps = []
        while True:
            if cancel is not None and cancel.is_set():
                return
            root = int(torch.argmax(logits))
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
            verifying = time.perf_counter()
            verified = self.verify(model, prompt_cache, tree, hidden_last, self.batch_rows)
            path = accept_longest_path(tree, verified.greedy_next)
            accepted = [tree.tokens[i] for i in path]
            if len(drafts) > 1:
                known = accepted[1:] + [verified.greedy_next(path[-1])]
                self.sizer.observe(drafts, known, len(tree), (time.perf_counter() - verifying) * 1000)
            else:
                self.sizer.cost.record(1, (time.perf_counter() - verifying) * 1000)
            self.commit(prompt_cache, verified, path)
            seconds = time.perf_counter() - started
            self.account(tree, path, asked, seconds)
            self.last_steps.append((len(tree) - 1, len(path) - 1, round((drafted - started) * 1000, 3),
                                    round(seconds * 1000, 3)))
            self.observe(StepOutcome(state, proposals, accepted[1:], verified.greedy_next(path[-1]),
                                     verified=len(tree) > 1))
            context.extend(accepted)
            prompt_cache.tokens = list(context)
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

    @staticmethod
    def verify(model, prompt_cache: kv.PromptCache, tree: DraftTree, hidden_last: torch.Tensor,
               batch_rows: int = 1) -> Verified:
        """One forward pass over every node of the tree, each seeing only its ancestors."""
        past = kv.cached_length(prompt_cache.cache)
        device = next(model.parameters()).device  # where the input ids go, as in the prompt cache
        ids = torch.tensor([tree.tokens], device=device)
        if len(tree) == 1:
            hidden = kv.forward_hidden(model, ids, prompt_cache.cache)
        else:
            positions = torch.tensor([[past + d for d in tree.depths]], device=device)
            mask = tree_attention_mask(tree, past, hidden_last.dtype, device)
            hidden = kv.forward_hidden(model, ids, prompt_cache.cache, attention_mask=mask, position_ids=positions)
        return Verified(tree, hidden[0], output_layer(model), past, max(1, batch_rows))

    def calibrate(self, model, prompt_cache: kv.PromptCache, hidden_last: torch.Tensor) -> None:
        """Measure what this device charges: a verification pass of each size the sizer weighs (a
        chain of the last token, as long as a tree), and the output layer for 1 to 32 rows; the
        cache is cut back after each pass. Once per speculator, at its first drafted step."""
        past = kv.cached_length(prompt_cache.cache)
        token = prompt_cache.tokens[-1] if prompt_cache.tokens else 0
        for rows in [1] + self.sizer.cost.missing():  # the first pass also warms the kernels
            chain = DraftTree()
            for depth in range(rows):
                chain.add(token, depth - 1, "calibration")
            started = time.perf_counter()
            verified = self.verify(model, prompt_cache, chain, hidden_last)
            accept_longest_path(chain, verified.greedy_next)
            self.sizer.cost.record(rows, (time.perf_counter() - started) * 1000)
            kv.crop(prompt_cache.cache, past)
        head, hidden = output_layer(model), hidden_last.reshape(1, -1)
        ms = {}
        for rows in (1, 1, 2, 4, 8, 16, 32):  # 1 twice: the first call warms up
            batch = hidden.expand(rows, -1).contiguous()
            started = time.perf_counter()
            head(batch)
            ms[rows] = (time.perf_counter() - started) * 1000
        self.batch_rows = max(rows for rows in ms if ms[rows] <= 1.25 * ms[1])

    @staticmethod
    def commit(prompt_cache: kv.PromptCache, verified: Verified, path: list[int]) -> None:
        """Keep the accepted path's entries in the KV cache, drop the other nodes'."""
        if len(verified.tree) > 1:
            kv.keep_positions(prompt_cache.cache, verified.past, [verified.past + i for i in path])

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
