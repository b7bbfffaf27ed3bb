"""A draft model: a small causal LM with the target's tokenizer guesses the next tokens.

The draft keeps its own KV cache in step with the text: each step it is brought to the current
context (prompt, accepted tokens, the certain root token), which crops what the target rejected and
reuses everything before it, across steps and across keystrokes, like the target's cache. From
there it decodes greedily while it is sure, stopping when its confidence falls under a threshold θ;
where it is unsure but not hopeless it also offers its second choice as a branch, so the tree the
target verifies holds both. θ follows the measured acceptance (the seed's dynamic threshold): a
draft whose guesses keep failing drafts shorter, one whose guesses hold drafts longer.

What is accepted is decided by the target's verification alone, so the output is greedy's.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..decoding import kv
from ..decoding.verify import Candidate
from .base import DraftSource, DraftState, StepOutcome

log = logging.getLogger(__name__)


class DraftModel(DraftSource):
    name = "draft_model"

    def __init__(self, model, max_len: int = 8, threshold: float = 0.3, branch_below: float = 0.7,
                 min_threshold: float = 0.05, max_threshold: float = 0.8, vocab_size: int | None = None):
        self.model = model.eval()
        self.vocab_size = vocab_size  # a padded output layer's extra rows are no tokens of the target
        self.max_len = max_len
        self.threshold = self.start_threshold = threshold
        self.branch_below = branch_below  # a guess less sure than this also offers the runner-up
        self.min_threshold, self.max_threshold = min_threshold, max_threshold
        self.runtime = _draft_runtime(model)
        self.proposed = 0
        self.accepted = 0

    @classmethod
    def for_model(cls, model, model_dir: Path | None) -> DraftModel | None:
        return None  # a draft model is chosen by the user (load_engine(draft_model=...)), not found beside one

    def propose(self, state: DraftState) -> list[Candidate]:
        try:
            return self._propose(state)
        except Exception:  # noqa: BLE001 - a failed draft (out of memory midway) costs its guesses only
            log.exception("the draft model failed; its cache starts afresh")
            self.runtime = _draft_runtime(self.model, self.runtime)  # some layers may have grown and others not
            return []

    @torch.inference_mode()
    def _propose(self, state: DraftState) -> list[Candidate]:
        limit = min(self.max_len, state.max_len)
        if limit <= 0:
            return []
        _, logits = self.runtime.prefill_hidden(state.context)
        chain: list[int] = []
        branches: list[Candidate] = []
        score = 1.0
        for depth in range(limit):
            probs = torch.softmax(logits[..., :self.vocab_size].float(), dim=-1)
            top = torch.topk(probs, 2)
            p, token = float(top.values[0]), int(top.indices[0])
            if p < self.threshold:
                break
            if p < self.branch_below and float(top.values[1]) >= self.threshold / 2:
                branches.append(Candidate(chain + [int(top.indices[1])], self.name, score=score * float(top.values[1])))
            chain.append(token)
            score *= p
            if depth + 1 < limit:
                _, logits = self.runtime.append(token)
        out = [Candidate(chain, self.name, score=score)] if chain else []
        return out + branches

    @torch.inference_mode()
    def warm(self, tokens: list[int]) -> None:
        """Start from `tokens` already in the cache (what a keystroke finds after the last one)."""
        self.runtime.cache.clear()
        self.runtime.prefill_hidden(tokens)

    def observe(self, outcome: StepOutcome) -> None:
        """Move θ by what happened to this step's chain: kept whole, drafting was too timid; cut
        short, too bold."""
        ours = [c for c in outcome.proposals.get(self.name, []) if c.tokens]
        if not ours or not outcome.verified:
            return
        chain = ours[0].tokens
        kept = 0
        while kept < min(len(chain), len(outcome.accepted)) and chain[kept] == outcome.accepted[kept]:
            kept += 1
        self.proposed += len(chain)
        self.accepted += kept
        if kept == len(chain):
            self.threshold = max(self.min_threshold, self.threshold * 0.9)
        else:
            self.threshold = min(self.max_threshold, self.threshold * 1.1)

    def reset(self) -> None:
        self.runtime = _draft_runtime(self.model, self.runtime)
        self.threshold = self.start_threshold
        self.proposed = self.accepted = 0

    def stats(self) -> dict:
        return {"draft_model": {"threshold": round(self.threshold, 3), "proposed": self.proposed,
                                "accepted": self.accepted}}


def _draft_runtime(model, old=None):
    """Where the draft's forward runs, with a cache of its own: on a GPU the static cache and its CUDA
    graphs, as the target's (through the dynamic path a draft token cost about what a target step
    did, so on an H200 the controller let it draft 2 nodes in a whole run); else the dynamic cache.
    `old`: the runtime to start afresh from (a static one is emptied and kept, its graphs with it)."""
    from ..runtime import static_cache
    from ..runtime.torch_runtime import TorchRuntime

    if isinstance(old, static_cache.StaticRuntime):
        old.clear()
        return old
    mode = static_cache.mode_for(model)
    if mode is None:
        return TorchRuntime(model, kv.PromptCache())
    runtime = static_cache.StaticRuntime(model, graphs=mode)
    runtime.warm_up(0)
    return runtime

