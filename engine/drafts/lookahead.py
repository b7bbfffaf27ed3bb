"""The lookahead cache: continuations worth remembering beyond the current step.

Two kinds go in: high-confidence head predictions for positions past the accepted ones (kept from
earlier steps instead of being recomputed), and the whole continuation of recent suggestions, so
that when the user types the start of the last suggestion its rest is drafted at once.
"""

from __future__ import annotations

from collections import deque

from ..verify import Candidate
from . import DraftState
from .ngram import lookup


class LookaheadCache:
    name = "lookahead"
    standby = False

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

    def observe(self, state: DraftState, accepted: list[int]) -> None:
        pass

    def remember_confident(self, context_tail: list[int], tokens: list[int]) -> None:
        """Head predictions above the confidence threshold, after the accepted tokens."""
        if tokens:
            self.remember(context_tail + tokens)
