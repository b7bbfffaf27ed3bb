"""Which cached cells a new prompt can use where they moved: the plan of a keystroke's prefill.

A FIM prompt puts the suffix behind the typed text, so a key typed before it moves the suffix's
tokens along by what was typed; a context move shifts a whole region. Their cells were computed
against the old text, but most of what they hold is their own tokens' (measured, Qwen2.5-Coder-0.5B
on held-out code: the rest of a line's loss +117-299% with every moved cell reused as it is; within
1% once the first 8 tokens of each moved run are computed again against the new text: docs/BENCHMARKS.md).
So a moved run's first `recompute` tokens are computed again, exactly, and the rest moved into
place (their positions shifted); everything else of the new prompt is computed.

This module only plans, on token ids: a `Source` is a run of cells the cache holds, a `Move` takes
part of one to a new place. The runtime (llamacpp.py) carries the plan out.
"""

from __future__ import annotations

from dataclasses import dataclass

ANCHOR = 8  # tokens a run must share to be found: shorter repeats are too common to mean "the same text"
MAX_CANDIDATES = 16  # places of one anchor looked at (a popular line of code repeats)


@dataclass(frozen=True)
class Source:
    """Cells of sequence `seq` at positions start, start+1, ... holding `tokens`."""

    seq: int
    start: int
    tokens: list[int]


@dataclass(frozen=True)
class Move:
    """The cells of `source` at positions old_start .. old_start+length go to new_start .. ."""

    source: Source
    old_start: int
    new_start: int
    length: int

    @property
    def new_end(self) -> int:
        return self.new_start + self.length

    @property
    def shift(self) -> int:
        return self.new_start - self.old_start


def plan(sources: list[Source], kept: int, new: list[int], recompute: int, min_gain: int = 16,
         max_moves: int = 16) -> list[Move]:
    """The moves that bring cached cells to the new prompt `new`, in its order, none overlapping.

    `kept`: the new prompt's first tokens that sequence 0 (the first source, starting at 0) already
    holds in place; its cells before it are not moved. Another source (a run parked in a sequence
    of its own) gives one move at most. The last token of `new` is never moved (its logits are what
    the prefill is for). The longest runs are taken first; each is moved past its first `recompute`
    tokens, where at least `min_gain` cells then move; a cached cell moves once at most."""
    end = len(new) - 1
    index: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for s, source in enumerate(sources):
        first = kept - source.start if s == 0 else 0
        for off in range(max(0, first), len(source.tokens) - ANCHOR + 1):
            places = index.setdefault(tuple(source.tokens[off:off + ANCHOR]), [])
            if len(places) < MAX_CANDIDATES:
                places.append((s, off))
    # Every run: at each new position, the longest match there. A diagonal (the same shift in the
    # same source) is extended once; the positions after its start read its end.
    ends: dict[tuple[int, int], int] = {}
    runs = []  # (length, i, s, off)
    for i in range(kept, end - ANCHOR + 1):
        best = None
        for s, off in index.get(tuple(new[i:i + ANCHOR]), ()):
            diagonal = (s, off - i)
            stop = ends.get(diagonal, -1)
            if stop <= i:
                tokens, length = sources[s].tokens, 0
                while i + length < end and off + length < len(tokens) and new[i + length] == tokens[off + length]:
                    length += 1
                stop = ends[diagonal] = i + length
            if best is None or stop - i > best[0]:
                best = (stop - i, i, s, off)
        if best is not None and best[0] - recompute >= min_gain:
            runs.append(best)
    taken_new: list[tuple[int, int]] = []
    taken_old: list[list[tuple[int, int]]] = [[] for _ in sources]
    chosen = []
    for length, i, s, off in sorted(runs, key=lambda run: (-run[0], run[1])):
        if len(chosen) == max_moves:
            break
        if _overlaps(taken_new, i, i + length) or _overlaps(taken_old[s], off, off + length) or (
                sources[s].seq != 0 and taken_old[s]):
            continue
        taken_new.append((i, i + length))
        taken_old[s].append((off, off + length))
        source = sources[s]
        chosen.append(Move(source, source.start + off + recompute, i + recompute, length - recompute))
    return sorted(chosen, key=lambda move: move.new_start)


def _overlaps(taken: list[tuple[int, int]], start: int, stop: int) -> bool:
    return any(a < stop and start < b for a, b in taken)


def pieces(moves: list[Move], kept: int, total: int) -> list[tuple[int, int, Move | None]]:
    """The new prompt after `kept` as pieces in order: (start, end, None) to compute, (start, end,
    move) to move into place."""
    out, at = [], kept
    for move in moves:
        if move.new_start > at:
            out.append((at, move.new_start, None))
        out.append((move.new_start, move.new_end, move))
        at = move.new_end
    if at < total:
        out.append((at, total, None))
    return out
