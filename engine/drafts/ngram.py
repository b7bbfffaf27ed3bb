"""N-gram drafts: code repeats itself, so the tokens that followed the last few tokens the previous
time they occurred (in the prompt, including the text after the cursor) are a good guess."""

from __future__ import annotations

from ..verify import Candidate
from . import DraftState


def lookup(tokens: list[int], tail: list[int], max_len: int, max_matches: int, *,
           search_end: int | None = None) -> list[list[int]]:
    """Continuations that followed earlier occurrences of `tail` in `tokens`, most recent first."""
    n = len(tail)
    end = (len(tokens) if search_end is None else search_end) - n
    found: list[list[int]] = []
    short: list[list[int]] = []  # matches right at the end (runs like "===="): kept as a last resort
    first = tail[0]
    for i in range(end - 1, -1, -1):
        if tokens[i] == first and tokens[i:i + n] == tail:
            cont = tokens[i + n:i + n + max_len]
            target = found if len(cont) >= min(max_len, 4) else short
            if cont and cont not in target:
                target.append(cont)
                if len(found) >= max_matches:
                    break
    return (found + short)[:max_matches]


class NgramDrafter:
    name = "ngram"
    standby = False

    def __init__(self, sizes: tuple[int, ...] = (4, 3, 2), max_len: int = 10, max_matches: int = 2):
        self.sizes = sizes
        self.max_len = max_len
        self.max_matches = max_matches

    def propose(self, state: DraftState) -> list[Candidate]:
        ctx = state.context
        for n in self.sizes:  # the longest matching n-gram is the most specific guess
            if len(ctx) <= n:
                continue
            conts = lookup(ctx, ctx[-n:], min(self.max_len, state.max_len), self.max_matches,
                           search_end=len(ctx))
            if conts:
                return [Candidate(c, self.name, score=0.5 + 0.1 * n - 0.01 * k) for k, c in enumerate(conts)]
        return []

    def observe(self, state: DraftState, accepted: list[int]) -> None:
        pass
