"""Decoding loops: the plain greedy loop (the reference), and streaming text with stop rules."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from . import kv
from .request import StopRule
from .stops import apply_stop_rule, held_back


class PromptCache:
    """The KV cache of the last prompt, reused when the next prompt starts with the same tokens.

    Consecutive keystrokes share most of their prompt, so only the changed tail is prefilled.
    """

    def __init__(self, prefix_tree: kv.PrefixTree | None = None) -> None:
        self.tokens: list[int] = []
        self.cache = None
        self.prompt_tokens = 0
        self.reused_tokens = 0
        self.prefix_tree = prefix_tree  # earlier prompts' blocks, for prompts that do not extend the last one
        self.reuse = True  # off for models whose cache cannot be cropped (sliding-window attention)
        self.prefill_threads = None  # threads.PrefillThreads on a multi-core CPU

    def _reuse(self, model, input_ids: list[int]) -> int:
        """Bring the cache to the longest reusable prefix of `input_ids`; returns its length."""
        keep = min(kv.common_prefix_length(self.tokens, input_ids), len(input_ids) - 1)
        if self.cache is None:
            keep = 0
        if not self.reuse:
            self.cache = kv.new_cache(model)
            return 0
        if self.prefix_tree is not None:
            block = self.prefix_tree.block_tokens
            from_tree = min(self.prefix_tree.longest_prefix(input_ids), len(input_ids) - 1) // block * block
            if from_tree > keep:
                self.cache = self.prefix_tree.build_cache(model, input_ids, from_tree)
                return from_tree
        if keep <= 0:
            self.cache = kv.new_cache(model)
            return 0
        kv.crop(self.cache, keep)
        return keep

    def remember(self) -> None:
        """Store the current prompt's blocks in the prefix tree (after a request)."""
        if self.prefix_tree is not None and self.cache is not None:
            self.prefix_tree.store(self.tokens, self.cache)

    def prefill_hidden(self, model, input_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Bring the cache to exactly `input_ids`; the last hidden state and the logits after it.

        Only the tail past the reusable prefix runs; the last token always does, for its logits."""
        keep = self._reuse(model, input_ids)
        self.tokens = list(input_ids[:keep])  # what the cache holds, should the forward fail
        device = next(model.parameters()).device
        tail = input_ids[keep:]
        with self.prefill_threads.for_prefill(len(tail)) if self.prefill_threads else contextlib.nullcontext():
            hidden = kv.forward_hidden(model, torch.tensor([tail], device=device), self.cache)
        self.tokens = list(input_ids)
        self.prompt_tokens += len(input_ids)
        self.reused_tokens += keep
        last = hidden[0, -1]
        return last, model.get_output_embeddings()(last)

    def append(self, model, token: int) -> torch.Tensor:
        device = next(model.parameters()).device
        hidden = kv.forward_hidden(model, torch.tensor([[token]], device=device), self.cache)
        self.tokens.append(token)
        return model.get_output_embeddings()(hidden[0, -1])

    def clear(self) -> None:
        self.tokens, self.cache = [], None


@torch.inference_mode()
def greedy_tokens(model, input_ids: list[int], max_new_tokens: int, eos_ids: set[int],
                  prompt_cache: PromptCache, cancel: threading.Event | None = None) -> Iterator[int]:
    """Plain greedy decoding with a KV cache; yields each new token, EOS included."""
    if max_new_tokens <= 0:
        return
    _, logits = prompt_cache.prefill_hidden(model, input_ids)
    for step in range(max_new_tokens):
        if cancel is not None and cancel.is_set():
            return
        token = int(torch.argmax(logits))
        yield token
        if token in eos_ids or step == max_new_tokens - 1:
            return
        logits = prompt_cache.append(model, token)


@dataclass
class StreamState:
    text: str = ""  # the completion so far, after stop rules
    started: float = 0.0  # time.perf_counter() when the request started (for the time budget)
    emitted: int = 0  # characters already streamed out
    tokens: int = 0
    stop_reason: str = "max_tokens"


def complete_lines(text: str) -> str:
    """`text` up to its last newline (the newline excluded): the lines already finished."""
    return text[:text.rfind("\n")] if "\n" in text else ""


def over_budget(text: str, stop: StopRule, started: float) -> bool:
    """A multi-line completion past its time budget, with at least one complete line to show."""
    if stop.single_line or stop.time_budget_ms <= 0 or not started:
        return False
    return bool(complete_lines(text).strip()) and (time.perf_counter() - started) * 1000 >= stop.time_budget_ms


def stream_text(tokens: Iterable[int], decode, stop: StopRule, end_ids: set[int],
                state: StreamState) -> Iterator[str]:
    """Turn a token stream into text pieces, applying the stop rules.

    `decode(ids)` maps token ids to text. Pieces never include text that a stop rule later cuts.
    """
    generated: list[int] = []
    for token in tokens:
        state.tokens += 1
        if token in end_ids:
            state.stop_reason = "eos"
            break
        generated.append(token)
        raw = decode(generated)
        if raw.endswith("\ufffd"):  # half of a multi-byte character: wait for the rest
            continue
        cut = apply_stop_rule(raw, stop)
        state.text = cut.text
        if cut.reason is not None:
            state.stop_reason = cut.reason
            break
        if over_budget(cut.text, stop, state.started):
            state.text = complete_lines(cut.text)
            state.stop_reason = "time_budget"
            break
        safe = len(cut.text) - held_back(cut.text, stop)
        if safe > state.emitted:
            yield cut.text[state.emitted:safe]
            state.emitted = safe
    else:
        if generated:
            state.text = apply_stop_rule(decode(generated).rstrip("\ufffd"), stop).text
    if len(state.text) > state.emitted:
        yield state.text[state.emitted:]
        state.emitted = len(state.text)


# --- speculative decoding --------------------------------------------------------------------------

@dataclass
class SpecStats:
    """Figures of the speculative loop, kept across requests for status and benchmarks."""

    steps: int = 0  # verification passes (each emits at least one token)
    plain_steps: int = 0  # steps taken without drafts (nothing drafted, or backed off)
    tokens: int = 0
    drafts: "object" = None  # DraftStats
    head_hits: list = None  # per head: times its top-1 was the greedy token
    head_tries: list = None

    def __post_init__(self):
        from .drafts import DraftStats

        self.drafts = DraftStats()
        self.head_hits, self.head_tries = [], []

    def record_heads(self, top1: list[int], truth: list[int]) -> None:
        for d in range(min(len(top1), len(truth))):
            while len(self.head_hits) <= d:
                self.head_hits.append(0)
                self.head_tries.append(0)
            self.head_tries[d] += 1
            self.head_hits[d] += int(top1[d] == truth[d])

    def to_json(self) -> dict:
        verify_steps = self.steps - self.plain_steps
        return {
            "steps": self.steps, "plain_steps": self.plain_steps, "tokens": self.tokens,
            "tokens_per_step": round(self.tokens / self.steps, 3) if self.steps else 0.0,
            "sources": self.drafts.to_json(),
            "head_accuracy": [round(h / t, 4) if t else 0.0 for h, t in zip(self.head_hits, self.head_tries)],
            "verify_steps": verify_steps,
        }


class DraftController:
    """Adapts the tree size to recent acceptance and backs off to plain decoding when drafts keep
    failing, since a verification pass that accepts nothing costs more than a plain step."""

    def __init__(self, max_nodes: int = 16, min_nodes: int = 4, patience: int = 4, backoff: int = 8,
                 min_source_rate: float = 0.05, source_backoff: int = 32, min_asks: int = 8,
                 rate_memory: float = 0.9):
        self.max_nodes, self.min_nodes = max_nodes, min_nodes
        self.nodes = max_nodes
        self.patience, self.backoff = patience, backoff
        self.misses = 0.0  # consecutive rejected steps, weighted by their tree size
        self.plain_left = 0
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

    def record_step(self, seconds: float, tokens: int) -> None:
        per_token = seconds / max(1, tokens)
        self.seconds_per_token = per_token if not self.seconds_per_token else \
            0.9 * self.seconds_per_token + 0.1 * per_token

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
        if self.plain_left > 0:
            self.plain_left -= 1
            return False
        return True

    def update(self, accepted_drafts: int, drafted_nodes: int | None = None) -> None:
        if accepted_drafts == 0:
            # A miss weighs what its tree cost: a full tree counts 1, a two-node guess 1/8, so cheap
            # guesses (the corpus table's) keep coming through a run of misses that big trees would not.
            drafted = self.max_nodes if drafted_nodes is None else drafted_nodes
            self.misses += min(1.0, drafted / self.max_nodes)
            self.nodes = max(self.min_nodes, self.nodes // 2)
            if self.misses >= self.patience:
                self.plain_left, self.misses = self.backoff, 0
        else:
            self.misses = 0
            self.nodes = min(self.max_nodes, self.nodes + 4 * accepted_drafts)

    def reset(self) -> None:
        self.nodes, self.misses, self.plain_left = self.max_nodes, 0, 0


def logits_from_hidden(model, hidden: torch.Tensor) -> torch.Tensor:
    # Only the argmax matters here; models with a final logit scale or soft-cap apply a monotonic
    # function, which leaves it unchanged.
    return model.get_output_embeddings()(hidden)


@torch.inference_mode()
def speculative_tokens(model, input_ids: list[int], max_new_tokens: int, eos_ids: set[int],
                       prompt_cache: PromptCache, drafters: list, controller: DraftController,
                       stats: SpecStats, cancel: threading.Event | None = None,
                       lookahead=None, heads_drafter=None) -> Iterator[int]:
    """Greedy decoding that verifies a tree of drafted tokens per forward pass.

    Yields exactly the tokens `greedy_tokens` would; only the number of forward passes differs.
    """
    from .drafts import DraftState
    from .verify import accept_longest_path, build_tree, tree_attention_mask

    if max_new_tokens <= 0:
        return
    device = next(model.parameters()).device
    # A standby source is asked only when nothing asked before it has a guess: the cheap sources
    # first, then (in the engine's order) the corpus table before the heads.
    drafters = sorted(drafters, key=lambda d: d.standby)
    hidden_last, logits = prompt_cache.prefill_hidden(model, input_ids)
    context = list(input_ids)
    produced = 0
    controller.reset()
    while True:
        if cancel is not None and cancel.is_set():
            return
        root = int(torch.argmax(logits))
        remaining = max_new_tokens - produced
        if root in eos_ids or remaining == 1:
            stats.steps += 1
            stats.plain_steps += 1
            stats.tokens += 1
            yield root
            return
        state = DraftState(context + [root], hidden_last, len(input_ids), max_len=remaining - 1)
        step_start = time.perf_counter()
        candidates, asked = [], {}  # source -> seconds its propose call took
        if controller.use_drafts():
            for drafter in drafters:
                if (not drafter.standby or not candidates) and controller.allows(drafter.name):
                    started = time.perf_counter()
                    candidates.extend(drafter.propose(state))
                    asked[drafter.name] = time.perf_counter() - started
        tree = build_tree(root, candidates, max_nodes=controller.nodes + 1, max_depth=remaining - 1)
        past = kv.cached_length(prompt_cache.cache)
        ids = torch.tensor([tree.tokens], device=device)
        if len(tree) == 1:
            hidden = kv.forward_hidden(model, ids, prompt_cache.cache)
        else:
            positions = torch.tensor([[past + d for d in tree.depths]], device=device)
            mask = tree_attention_mask(tree, past, hidden_last.dtype, device)
            hidden = kv.forward_hidden(model, ids, prompt_cache.cache, attention_mask=mask, position_ids=positions)
        step_logits = logits_from_hidden(model, hidden[0])  # (N, V)
        greedy_next = step_logits.argmax(dim=-1).tolist()
        path = accept_longest_path(tree, greedy_next)
        if len(tree) > 1:
            kv.keep_positions(prompt_cache.cache, past, [past + i for i in path])
        accepted = [tree.tokens[i] for i in path]
        stats.steps += 1
        stats.plain_steps += int(len(tree) == 1)
        step_drafted = Counter(tree.sources[1:])
        step_accepted = Counter(tree.sources[i] for i in path[1:])
        for source, drafted in step_drafted.items():
            stats.drafts.add(source, drafted=drafted, accepted=step_accepted[source])
            controller.update_source(source, drafted, step_accepted[source])
        controller.record_step(time.perf_counter() - step_start, len(accepted))
        for source, seconds in asked.items():
            controller.update_ask(source, seconds, step_accepted[source])
        if heads_drafter is not None and heads_drafter.name in asked and len(tree) > 1:
            stats.record_heads(heads_drafter.last_top1, accepted[1:] + [greedy_next[path[-1]]])
            if lookahead is not None and heads_drafter.last_confident:
                lookahead.remember_confident(context[-3:] + [root], heads_drafter.last_confident)
        if len(tree) > 1:
            controller.update(len(path) - 1, len(tree) - 1)
        context.extend(accepted)
        prompt_cache.tokens = list(context)
        for token in accepted:
            produced += 1
            stats.tokens += 1
            yield token
            if token in eos_ids or produced >= max_new_tokens:
                return
        logits = step_logits[path[-1]]
        hidden_last = hidden[0, path[-1]]
