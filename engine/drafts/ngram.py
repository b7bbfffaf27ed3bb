"""N-gram drafts, from two places.

The prompt: code repeats itself, so the tokens that followed the last few tokens the previous time
they occurred (in the prompt, including the text after the cursor) are a good guess.

A corpus table: the prompt's own n-grams find nothing for about half the steps of a completion (the
model is writing something that is not in the file yet). There, a table of what usually comes next
in code ("self" -> ".", ")" -> ":" + newline + indent) guesses right about a third of the time for
almost nothing: a few binary searches, against a verification row that on a CPU costs a few percent
of a step. Its guesses chain (each guessed token extends the context of the next guess) while their
joint share stays high. The table belongs to a tokenizer: `memosight train ngrams` builds it from a
corpus and saves it beside the model as draft_ngrams.npz.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..decoding.verify import Candidate
from .base import DraftSource, DraftState


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


class NgramDrafter(DraftSource):
    name = "ngram"

    def __init__(self, sizes: tuple[int, ...] = (4, 3, 2), max_len: int = 16, max_matches: int = 2):
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


# --- the corpus table ------------------------------------------------------------------------------

TABLE_FILE = "draft_ngrams.npz"
_PRIME = 0x100000001B3  # FNV-1a's 64-bit prime: a cheap, well-mixing fold of token ids
_BASIS = 0xCBF29CE484222325
_MASK = (1 << 64) - 1


def _hash_tail(tokens: list[int], n: int) -> int:
    key = _BASIS
    for t in tokens[-n:]:
        key = ((key ^ t) * _PRIME) & _MASK
    return key


def _hash_windows(tokens: np.ndarray, n: int) -> np.ndarray:
    """Hash of every window of n tokens, indexed by the window's first position (the same fold as
    _hash_tail, in uint64 arithmetic that wraps)."""
    count = len(tokens) - n + 1
    key = np.full(count, _BASIS, dtype=np.uint64)
    for j in range(n):
        key = (key ^ tokens[j:j + count].astype(np.uint64)) * np.uint64(_PRIME)
    return key


class NgramTable:
    """Per context length n: sorted context hashes, the most frequent next token, and its share (%)."""

    def __init__(self, orders: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]):
        self.orders = dict(sorted(orders.items(), reverse=True))  # longest context first

    def __len__(self) -> int:
        return sum(len(keys) for keys, _, _ in self.orders.values())

    def guess(self, context: list[int]) -> tuple[int, float] | None:
        """The most frequent next token after the longest known tail of `context`, and its share."""
        for n, (keys, nexts, shares) in self.orders.items():
            if len(context) < n:
                continue
            key = np.uint64(_hash_tail(context, n))
            i = int(np.searchsorted(keys, key))
            if i < len(keys) and keys[i] == key:
                return int(nexts[i]), float(shares[i]) / 100
        return None

    @classmethod
    def build(cls, tokens: np.ndarray, max_order: int = 4, min_count: int = 3,
              following: np.ndarray | None = None) -> "NgramTable":
        """Count what follows every context of 1..max_order tokens in `tokens` (documents joined by
        an end token). A context seen fewer than min_count times is dropped, and so is a longer
        context that guesses the same token as its shorter tail: the shorter one answers for it.
        `following[i]`, when given, is what to count after position i instead of tokens[i + 1]:
        the model's own greedy choice there, which is what verification accepts."""
        tokens = np.asarray(tokens, dtype=np.int64)
        following = tokens[1:] if following is None else np.asarray(following, dtype=np.int64)
        orders: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        full: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # unpruned keys -> best next, for pruning
        windows: dict[int, np.ndarray] = {}  # n -> hash of the n tokens starting at each position
        for n in range(1, max_order + 1):
            ends = np.arange(n - 1, len(tokens) - 1)  # last position of each context that has a next token
            if len(ends) == 0:
                break
            windows[n] = _hash_windows(tokens, n)
            keys = windows[n][: len(ends)]
            nexts = following[ends]
            order = np.lexsort((nexts, keys))
            keys, nexts, ends = keys[order], nexts[order], ends[order]
            pair_start = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]) | (nexts[1:] != nexts[:-1])])
            pair_count = np.diff(np.r_[pair_start, len(keys)])
            pair_key, pair_next, pair_end = keys[pair_start], nexts[pair_start], ends[pair_start]
            by_count = np.lexsort((-pair_count, pair_key))  # within a context, most frequent next first
            pair_key, pair_next = pair_key[by_count], pair_next[by_count]
            pair_count, pair_end = pair_count[by_count], pair_end[by_count]
            first = np.flatnonzero(np.r_[True, pair_key[1:] != pair_key[:-1]])
            total = np.add.reduceat(pair_count, first)
            key, best, share = pair_key[first], pair_next[first], pair_count[first] / total
            end = pair_end[first]
            keep = total >= min_count
            full[n] = (key[keep], best[keep])
            if n > 1 and len(full[n - 1][0]):  # the same guess as the shorter tail: not worth storing
                lower_keys, lower_best = full[n - 1]
                shorter = windows[n - 1][end - n + 2]
                j = np.minimum(np.searchsorted(lower_keys, shorter), len(lower_keys) - 1)
                keep &= ~((lower_keys[j] == shorter) & (lower_best[j] == best))
            orders[n] = (key[keep], best[keep].astype(np.int32),
                         np.round(share[keep] * 100).astype(np.uint8))
        return cls(orders)

    def save(self, folder: Path) -> Path:
        path = Path(folder) / TABLE_FILE
        arrays = {}
        for n, (keys, nexts, shares) in self.orders.items():
            arrays[f"keys{n}"], arrays[f"next{n}"], arrays[f"share{n}"] = keys, nexts, shares
        np.savez_compressed(path, **arrays)
        return path

    @classmethod
    def load(cls, folder: Path) -> "NgramTable | None":
        path = Path(folder) / TABLE_FILE
        if not path.is_file():
            return None
        with np.load(path) as data:
            orders = {int(name[4:]): (data[name], data[f"next{name[4:]}"], data[f"share{name[4:]}"])
                      for name in data.files if name.startswith("keys")}
        return cls(orders)


class TableDrafter(DraftSource):
    """Drafts a short chain of the corpus's most frequent next tokens."""

    name = "table"
    standby = True  # the prompt's own n-grams, when they match, are the better guess

    def __init__(self, table: NgramTable, max_len: int = 6, min_joint: float = 0.15):
        self.table = table
        self.max_len = max_len
        self.min_joint = min_joint  # the first guess is always drafted: one row costs next to nothing
        self.context_tokens = max(table.orders, default=1)  # the longest context the table knows

    @classmethod
    def for_model(cls, model, model_dir: Path | None) -> TableDrafter | None:
        table = NgramTable.load(Path(model_dir)) if model_dir else None
        return cls(table) if table is not None else None

    def propose(self, state: DraftState) -> list[Candidate]:
        context = state.context[-self.context_tokens:]
        chain: list[int] = []
        joint = 1.0
        while len(chain) < min(self.max_len, state.max_len):
            guess = self.table.guess(context)
            if guess is None:
                break
            token, share = guess
            if chain and joint * share < self.min_joint:
                break
            joint *= share
            chain.append(token)
            context.append(token)
        return [Candidate(chain, self.name, score=0.3 + 0.1 * joint)] if chain else []
