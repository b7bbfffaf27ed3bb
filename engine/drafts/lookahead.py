"""The lookahead cache: continuations worth remembering beyond the current step.

Two kinds go in: confident guesses other sources made for positions past the accepted ones (the
heads' hints, kept from earlier steps instead of being recomputed), and the whole continuation of
recent suggestions, so that when the user types the start of the last suggestion its rest is
drafted at once.
"""

from __future__ import annotations

from collections import deque

from ..decoding.verify import Candidate
from .base import DraftSource, DraftState, StepOutcome
from .ngram import lookup


class LookaheadCache(DraftSource):
    name = "lookahead"

    def __init__(self, max_sequences: int = 64, match: int = 3, max_len: int = 16):
        self.sequences: deque[list[int]] = deque(maxlen=max_sequences)
        self.match = match
        self.max_len = max_len

    def remember(self, tokens: list[int]) -> None:
        if len(tokens) > self.match:
            self.sequences.append(list(tokens))

    def propose(self, state: DraftState) -> list[Candidate]:
        ctx = state.context
        if len(ctx) < self.match:
            return []
        tail = ctx[-self.match:]
        out: list[Candidate] = []
        for seq in reversed(self.sequences):
            for cont in lookup(seq, tail, min(self.max_len, state.max_len), 1):
                out.append(Candidate(cont, self.name, score=0.9))
            if len(out) >= 2:
                break
        return out

    def observe(self, outcome: StepOutcome) -> None:
        """Keep the hints of a verified step, after the tokens that led to them (the last `match`
        tokens and the root), so that they match when the text gets there."""
        if not outcome.verified:
            return
        lead = outcome.state.context[-(self.match + 1):]
        for candidates in outcome.proposals.values():
            for hint in (c for c in candidates if c.hint and c.tokens):
                self.remember(lead + hint.tokens)

    def finish(self, tokens: list[int]) -> None:
        self.remember(tokens)

    def reset(self) -> None:
        self.sequences = deque(maxlen=self.sequences.maxlen)
