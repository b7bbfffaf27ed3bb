"""The context compressor: packs the text around the cursor into a token budget counted in the
model's own tokens, and keeps the bounded caches that make that fast and stable while the user types.

It orchestrates the other modules of this package: near.py finds the near window (the cursor's own
function), far.py scores and chooses the far units around it, rendering.py writes them out with
elision markers, truncation.py trims by whole lines (and is the fall-back without a grammar).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import languages
from ..caching import LRU, content_hash
from .far import CHARS_PER_TOKEN_MAX, FarPart, choose, score_sources
from .near import Rows, error_near, function_rows
from .packed import PackedContext, Region
from .regions import USE_WINDOW_LINES, identifiers
from .rendering import Source, marker
from .similar import QUERY_LINES, query_names
from .truncation import head_within, tail_within, truncate_around_cursor

# Layout of what the model sees (far context in file order, the cursor's own prefix last):
#   prefix = [other open files: chosen units] [this file above the near window: chosen units]
#            [near prefix: plain lines up to the cursor, as many as NEAR_PREFIX_SHARE of the budget holds
#             (CONTIGUOUS_NEAR off: from the enclosing function's start, or a later line if it is too long)]
#   suffix = [near suffix: the rest of the enclosing function] [this file below it: chosen units]
# Skipped lines become one elision marker (`# ...`). The far parts are cached per (content of the
# far text, near window), so typing inside one function leaves them, and the prompt's head, unchanged;
# they are chosen again only when the near part outgrows the room left for it (the near prefix then
# starts lower: after about NEAR_SLACK of its share typed) or the cursor moves to another window. The
# names used near the cursor are read when a far part is chosen; one typed later waits for the next
# choice (a new choice costs the KV cache of the whole prompt after it).

NEAR_PREFIX_SHARE = 0.8  # of the prefix budget: the most the near prefix may take
# The near prefix runs on above the cursor's function as plain lines (no markers), up to its share:
# with SmolLM2-135M on held-out code (budget 512, 80 cursors) the true next line's loss fell from
# 2.701 to 2.673 nats/token (function only, share 0.7), below plain truncation's 2.676.
CONTIGUOUS_NEAR = True
NEAR_SUFFIX_SHARE = 0.85  # of the suffix budget: the rest of the function after the cursor
GROWTH_RESERVE = 0.15  # of the budget, left free when far parts are re-chosen because typing outgrew them
# ... and when chosen for the first time for a near window: the user types on there, and a choice
# that fits only what is there now is made again a few lines later (bench replay's bursts, the embedded
# model: 0.05 re-chose the far parts 4 rows into a function, each a whole prompt to prefill again)
COLD_RESERVE = 0.15
NEAR_SLACK = 0.2  # a near prefix cut inside a long function starts with this share of its budget free
QUANTUM_LINES = 8  # outside any function the near window moves by this many lines at a time
WINDOW_LINES = 16  # outside any function the near window spans this many lines above the cursor
MAX_OTHER_DOCUMENTS = 12
_WORD_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"


def bounded_share(share: float, tokens: int, budget: int) -> float:
    """`share` of `budget` after the cursor, but at most `tokens` (the suffix_tokens setting): the
    share that build() turns back into that whole number of tokens."""
    return min(share, (tokens + 0.5) / budget)


@dataclass
class _Packing:
    """What one build has so far: its inputs, then what each step adds, in the order they run."""

    doc: Any
    text: str
    cursor: int
    budget: int
    suffix_share: float
    count_tokens: Callable[[str], int]
    count: Callable[[str], int]  # count_tokens through the compressor's cache
    comment: str  # the language's line comment, for elision markers
    marker_tokens: int
    rows: Rows
    # the near window (_window): first and last rows
    def_start: int = 0
    def_end: int = 0
    # _pack_near_suffix
    near_end: int = 0  # the first row below the near window
    end_offset: int = 0  # ... and its offset
    recent_below: tuple[int, ...] = ()  # rows last worked on below it, counted from the file's end
    suffix_key: tuple = ()
    near_suffix: str = ""
    suffix_cut: bool = False  # the near suffix ends with a marker
    near_suffix_tokens: int = 0
    kept_below: FarPart | None = None  # the far part below, kept with this suffix by an earlier build
    # _pack_near_prefix
    near_start: int = 0
    near_prefix: str = ""
    near_prefix_tokens: int = 0
    # _find_used_names
    other_docs: list = field(default_factory=list)
    typing: int = 0  # characters of the word being typed at the cursor
    used: set[str] = field(default_factory=set)
    # ContextCompressor._scored: the analysis, made only if a far part is chosen anew
    scored: dict | None = None
    # _pack_below, _pack_above
    below: FarPart | None = None
    above: FarPart | None = None

    @property
    def suffix_budget(self) -> int:
        return int(self.budget * self.suffix_share)

    def tree(self):
        return self.doc.snapshot()[1]


class ContextCompressor:
    """Builds the packed context for a cursor; holds the bounded caches that keep it fast and stable."""

    def __init__(self, cache_size: int = 32, weights: dict | None = None,
                 near_prefix_share: float = NEAR_PREFIX_SHARE,
                 attention: Callable[[str, int], tuple[int, list[float]] | None] | None = None,
                 contiguous_near: bool = CONTIGUOUS_NEAR):
        # Benchmarks pass other weights (None: regions.WEIGHTS) and shares, to ablate and tune.
        self.weights = weights
        self.near_prefix_share = near_prefix_share
        # (text, cursor row) -> what the lines above the cursor attend to (regions.score_units), if known
        self.attention = attention
        self.contiguous_near = contiguous_near
        self._far_parts = LRU(cache_size)
        self._near_starts = LRU(cache_size)
        self._near_suffixes = LRU(cache_size)
        self._suffixes = LRU(cache_size)  # (uri, text after the cursor, budget) -> the suffix's parts
        self._windows = LRU(cache_size)  # uri -> the last near window (see _window)
        self._token_counts = LRU(50_000)

    def cache_entries(self) -> int:
        """Entries in the caches above (for memosight/status's memory report)."""
        return sum(len(c) for c in (self._far_parts, self._near_starts, self._near_suffixes, self._suffixes,
                                    self._windows, self._token_counts))

    # --- tokens ---------------------------------------------------------------------------------

    def _count(self, text: str, count_tokens: Callable[[str], int]) -> int:
        # hash() of a bound method is its object's and function's: one key per tokenizer, and unlike
        # the method itself it keeps no engine alive in the cache.
        key = (hash(count_tokens), content_hash(text))
        n = self._token_counts.get(key)
        if n is None:
            n = count_tokens(text)
            self._token_counts.put(key, n)
        return n

    # --- entry point ----------------------------------------------------------------------------

    def build(self, doc, cursor: int, budget: int, suffix_share: float, count_tokens: Callable[[str], int],
              others: list | tuple = ()) -> PackedContext:
        """The context at string offset `cursor` of `doc`, within `budget` tokens of `count_tokens`, of
        which about `suffix_share` after the cursor; `others` are the other open documents."""
        text = doc.text
        cursor = max(0, min(cursor, len(text)))
        if languages.parser_for(doc.language) is None:  # no grammar: a line window around the cursor
            return truncate_around_cursor(text, cursor, budget, suffix_share, count_tokens, doc.path)
        count = lambda piece: self._count(piece, count_tokens)
        comment = languages.comment_prefix(doc.language)
        p = _Packing(doc, text, cursor, budget, suffix_share, count_tokens, count, comment,
                     count(f"{comment} ...\n"), Rows(text, cursor))
        p.def_start, p.def_end = self._window(doc.uri, doc.language, text, p.tree, p.rows)
        # The near parts first: the far parts get what they leave of the budget.
        self._pack_near_suffix(p)
        self._pack_near_prefix(p)
        self._find_used_names(p, others)
        self._pack_below(p)
        self._pack_above(p)
        return self._fit_to_budget(p)

    # --- steps of build, in order ---------------------------------------------------------------

    def _pack_near_suffix(self, p: _Packing) -> None:
        """The near suffix: the rest of the near window, whole lines from the cursor (with the far part
        below it, if kept from a build with the same text after the cursor)."""
        text, rows = p.text, p.rows
        p.near_end = min(p.def_end + 1, text.count("\n") + 1)
        p.end_offset = rows.offset(p.near_end)
        # Typing at the cursor leaves the text after it unchanged, and so the suffix: reused as it
        # was, since the model reads it first (fill-in-the-middle, suffix first) and any change there
        # costs the whole prompt's KV cache, even where the function's extent shifts as it grows.
        # Where the user last worked below the near window (counted from the file's end, so that
        # lines typed above leave it as it was) scores the code there: a visit there is a new choice.
        below_rows = [r for r in p.doc.recent_rows if r >= p.near_end]
        lines_total = text.count("\n", p.end_offset) + p.near_end if below_rows else 0  # only then
        p.recent_below = tuple(lines_total - r for r in below_rows)
        p.suffix_key = (p.doc.uri, content_hash(text[p.cursor:]), p.budget, p.suffix_share, p.recent_below)
        kept = self._suffixes.get(p.suffix_key)
        if kept is not None:
            p.near_suffix, p.suffix_cut, p.near_suffix_tokens, p.kept_below = kept
        else:
            p.near_suffix, p.suffix_cut = self._near_suffix(text[p.cursor:p.end_offset],
                                                            int(p.suffix_budget * NEAR_SUFFIX_SHARE), p.comment,
                                                            p.count_tokens)
            p.near_suffix_tokens = p.count(p.near_suffix) if p.near_suffix else 0

    def _pack_near_prefix(self, p: _Packing) -> None:
        """The near prefix: from the start of the near window (or, contiguous, of the file), unless too
        long (then from a later line)."""
        near_prefix_budget = int((p.budget - p.suffix_budget) * self.near_prefix_share)
        p.near_start, p.near_prefix_tokens = self._near_start(p.doc.uri, p.text, p.rows, p.def_start,
                                                              0 if self.contiguous_near else p.def_start,
                                                              near_prefix_budget, p.count_tokens)
        p.near_prefix = p.text[p.rows.offset(p.near_start):p.cursor]
        room = p.budget - p.near_suffix_tokens
        if p.near_prefix_tokens > room:  # one enormous line: keep its tail
            p.near_prefix = tail_within(p.near_prefix, room, p.count_tokens)
            p.near_prefix_tokens = p.count_tokens(p.near_prefix)

    def _find_used_names(self, p: _Packing, others: list | tuple) -> None:
        """The other open documents that may hold definitions (same language family), and the names
        used near the cursor: their definitions are wanted (cheap; read on every keystroke)."""
        family = languages.FAMILY.get(p.doc.language)
        p.other_docs = [o for o in others if o.uri != p.doc.uri and languages.FAMILY.get(o.language) == family
                        and not o.large and not o.looks_binary][:MAX_OTHER_DOCUMENTS]
        # The word being typed at the cursor is not a name yet (`hel` of `helper`): it is left out.
        text, rows, cursor, cursor_row = p.text, p.rows, p.cursor, p.rows.cursor_row
        line = text[rows.offset(cursor_row):cursor]
        p.typing = len(line) - len(line.rstrip(_WORD_CHARS))
        p.used = identifiers(text[rows.offset(max(p.def_start, cursor_row - USE_WINDOW_LINES)):cursor - p.typing]
                             + " " + text[cursor:rows.offset(min(p.def_end + 1, cursor_row + USE_WINDOW_LINES))])

    def _pack_below(self, p: _Packing) -> None:
        """The far part below the near window, in the suffix (budget: what the near suffix left of the
        suffix share); kept with the suffix it was chosen for."""
        if p.kept_below is not None:
            p.below = p.kept_below
            return
        key = ("below", p.doc.uri, content_hash(p.text[p.end_offset:]), p.near_end - p.def_start, p.budget,
               p.recent_below)
        p.below = self._far_part(key, p.suffix_budget - p.near_suffix_tokens, p.budget,
                                 lambda b: choose(self._sources_below(p), b, p.marker_tokens, p.count,
                                                  p.count_tokens, with_headers=False, trailing=False,
                                                  gap_before=p.suffix_cut))
        self._suffixes.put(p.suffix_key, (p.near_suffix, p.suffix_cut, p.near_suffix_tokens, p.below))

    def _pack_above(self, p: _Packing) -> None:
        """The far part above the near window, and other open files, in the prefix (budget: what all
        the other parts left)."""
        others_key = tuple(sorted((o.path, content_hash(o.text), o.recent_rows) for o in p.other_docs))
        recent_above = tuple(r for r in p.doc.recent_rows if r < p.near_start)
        key = ("above", p.doc.uri, content_hash(p.text[:p.rows.offset(p.near_start)]), p.near_start, p.def_start,
               others_key, p.budget, recent_above)
        budget = p.budget - p.near_suffix_tokens - p.below.tokens - p.near_prefix_tokens
        p.above = self._far_part(key, budget, p.budget,
                                 lambda b: choose(self._sources_above(p), b, p.marker_tokens, p.count,
                                                  p.count_tokens, with_headers=bool(p.other_docs), trailing=True,
                                                  gap_before=False))

    def _fit_to_budget(self, p: _Packing) -> PackedContext:
        """The prompt: far parts around the near ones, cut where the counts of the pieces, made
        separately, do not add up to the budget; and the regions it was cut from."""
        prefix, suffix = p.above.text + p.near_prefix, p.near_suffix + p.below.text
        budget, count_tokens = p.budget, p.count_tokens
        suffix_tokens = p.count(suffix) if suffix else 0
        if suffix_tokens > budget:  # a tiny budget: its markers alone may not fit
            suffix = head_within(suffix, budget, count_tokens)
            suffix_tokens = count_tokens(suffix) if suffix else 0
        prefix_tokens = count_tokens(prefix)
        if prefix_tokens + suffix_tokens > budget:  # counts of the pieces did not add up: cut the head
            prefix = tail_within(prefix, budget - suffix_tokens, count_tokens)
            prefix_tokens = count_tokens(prefix)
        cursor_row, path = p.rows.cursor_row, p.doc.path
        regions = [*p.above.regions, Region(path, p.near_start + 1, cursor_row + 1, "cursor_prefix", 1.0)]
        if p.near_suffix:
            regions.append(Region(path, cursor_row + 1, cursor_row + 1 + p.near_suffix.count("\n"),
                                  "cursor_suffix", 1.0))
        regions.extend(p.below.regions)
        return PackedContext(prefix, suffix, prefix_tokens + suffix_tokens, regions)

    # --- the far parts' sources: analysed only when a far part is chosen anew ---------------------

    def _scored(self, p: _Packing) -> dict:
        """score_sources' analysis and scores (with `closers`), computed at most once per build, and
        only if a far part must be chosen: a kept one needs neither."""
        if p.scored is None:
            text, rows, cursor, cursor_row = p.text, p.rows, p.cursor, p.rows.cursor_row
            query = query_names(text[rows.offset(max(p.def_start, cursor_row - 3 * QUERY_LINES)):cursor - p.typing])
            attended = self.attention(text, cursor_row) if self.attention is not None else None
            # Names shown above the function (the near prefix runs on) want their definitions too, less;
            # read here, when a far part is chosen, not on every keystroke.
            shown = identifiers(text[rows.offset(max(p.near_start, cursor_row - USE_WINDOW_LINES)):
                                     rows.offset(p.def_start)]) - p.used if p.near_start < p.def_start else set()
            scored = score_sources(p.doc, text, p.tree(), cursor_row, p.used, p.other_docs, query, self.weights,
                                   attended, shown)
            analysis = scored["analysis"]
            # enclosing units whose closing rows (`}`) lie below the near window: kept there
            scored["closers"] = tuple(analysis.definitions[d].signature for d in analysis.enclosing(cursor_row)
                                      if any(r >= p.near_end for r in analysis.units[
                                          analysis.definitions[d].signature].extra_rows))
            p.scored = scored
        return p.scored

    def _sources_below(self, p: _Packing) -> list[Source]:
        scored = self._scored(p)
        analysis = scored["analysis"]
        return [Source(p.doc.path, analysis, scored["scores"], (p.near_end, len(analysis.lines)), p.comment,
                       scored["closers"])]

    def _sources_above(self, p: _Packing) -> list[Source]:
        scored = self._scored(p)
        return [*scored["others"], Source(p.doc.path, scored["analysis"], scored["scores"], (0, p.near_start),
                                          p.comment)]

    # --- steps ----------------------------------------------------------------------------------

    def _window(self, uri: str, language: str, text: str, tree: Callable[[], object], rows: Rows) -> tuple[int, int]:
        """First and last rows of the near window: the function around the cursor, else a window of
        lines that moves by whole quanta. While the code around the cursor does not parse (an
        unclosed bracket or docstring as the user types), the last window is kept if the code above
        it and below it is unchanged, so a transient error does not reshuffle the context. Typing on
        an indented line inside the last function window keeps it too, with no parse at all."""
        cursor_row, total_rows = rows.cursor_row, text.count("\n") + 1
        previous = self._windows.get(uri)

        def kept() -> tuple[int, int] | None:
            start, rows_below, above_hash, below_hash, _ = previous
            end = total_rows - rows_below
            if start <= cursor_row <= end and above_hash == content_hash(text[:rows.offset(start)]) \
                    and below_hash == content_hash(text[rows.offset(end + 1):]):
                return start, end
            return None

        line = text[rows.offset(cursor_row):rows.cursor]
        if previous is not None and previous[4] and line[:1] in (" ", "\t") and (window := kept()) is not None:
            return window
        def_start, def_end = function_rows(language, text, tree(), rows.cursor, cursor_row)
        # No function found where there was one a keystroke ago is usually a transient parse too:
        # an opened docstring or string swallows the rest of the file until it is closed.
        if previous is not None and (def_start is None or error_near(tree(), text, rows.cursor)) \
                and (window := kept()) is not None:
            return window
        in_function = def_start is not None
        if def_start is None:  # outside any function
            def_start = max(0, (cursor_row // QUANTUM_LINES) * QUANTUM_LINES - WINDOW_LINES)
            def_end = (cursor_row // QUANTUM_LINES + 2) * QUANTUM_LINES - 1
        def_end = min(max(def_end, cursor_row), total_rows - 1)
        self._windows.put(uri, (def_start, total_rows - def_end, content_hash(text[:rows.offset(def_start)]),
                                content_hash(text[rows.offset(def_end + 1):]), in_function))
        return def_start, def_end

    def _near_suffix(self, text: str, budget: int, comment: str, count_tokens) -> tuple[str, bool]:
        """Whole lines of `text` (the cursor's own line always) within `budget`, a marker if cut;
        memoized, since the text after the cursor rarely changes while typing."""
        key = (content_hash(text), budget, comment)
        cached = self._near_suffixes.get(key)
        if cached is not None:
            return cached
        kept = head_within(text, budget, count_tokens) if budget > 0 else ""
        cut = len(kept) < len(text)
        if cut and "\n" in kept:
            kept = kept[:kept.rindex("\n") + 1]
        if cut and kept.endswith("\n"):
            kept += marker(text[len(kept):], comment)
        self._near_suffixes.put(key, (kept, cut))
        return kept, cut

    def _near_start(self, uri: str, text: str, rows: Rows, def_start: int, lower: int, budget: int,
                    count_tokens) -> tuple[int, int]:
        """The first row of the near prefix, and the prefix's tokens: `lower` (the window's start, or
        the file's when the near prefix runs on) if it fits, else the first row whose tail fits with
        NEAR_SLACK to spare; remembered per window, so that it stays put while the user types."""
        cursor, cursor_row = rows.cursor, rows.cursor_row
        key = (uri, def_start, lower, content_hash(text[:rows.offset(def_start)]))
        cached = self._near_starts.get(key)
        if cached is not None and lower <= cached <= cursor_row:
            tokens = self._tail_tokens(text, rows, cached, count_tokens)
            if tokens <= budget:
                return cached, tokens
        # No tokenizer packs more than CHARS_PER_TOKEN_MAX characters a token: rows further up cannot
        # fit, and are never counted (the file above may be long).
        start = max(lower, text.count("\n", 0, max(0, cursor - budget * CHARS_PER_TOKEN_MAX)))
        tokens = self._tail_tokens(text, rows, start, count_tokens)
        if tokens > budget:
            target = int(budget * (1 - NEAR_SLACK))
            low, high = start + 1, cursor_row  # smallest row whose tail fits the target
            while low < high:
                mid = (low + high) // 2
                if count_tokens(text[rows.offset(mid):cursor]) <= target:
                    high = mid
                else:
                    low = mid + 1
            start = min(low, cursor_row)  # the cursor's own line, always
            tokens = self._tail_tokens(text, rows, start, count_tokens)
        self._near_starts.put(key, start)
        return start, tokens

    def _tail_tokens(self, text: str, rows: Rows, start: int, count_tokens) -> int:
        """Tokens of text[row `start`:cursor], counting afresh only the cursor's line and its seam
        with the lines above (memoized: they do not change while the user types on one line)."""
        line_start = rows.offset(rows.cursor_row)
        above, line = text[rows.offset(start):line_start], text[line_start:rows.cursor]
        if not above or not line:
            return self._count(above or line, count_tokens) if above or line else 0
        seam_above = above[above.rstrip().rfind("\n") + 1:]  # its last non-blank line and what follows
        joined = self._count(seam_above + line, count_tokens) - self._count(seam_above, count_tokens)
        return self._count(above, count_tokens) + joined

    def _far_part(self, key, budget: int, total_budget: int, choose_within: Callable[[int], FarPart]) -> FarPart:
        """The cached far part for `key` while it still fits `budget`; else a fresh choice that leaves
        room for the near part to grow (COLD_RESERVE the first time, GROWTH_RESERVE after). A name
        typed near the cursor brings no new choice: every new choice costs the whole prompt after it
        (bench replay, the embedded model on held-out bursts: 16 of 210 keystrokes re-prefilled ~700
        tokens each, most of them for a newly typed name; on Qwen2.5-Coder-0.5B ~10 s each)."""
        cached = self._far_parts.get(key)
        if cached is not None and cached.tokens <= budget:
            return cached
        if budget <= 0:
            return FarPart("", 0, [])
        reserve = int(total_budget * (GROWTH_RESERVE if cached is not None else COLD_RESERVE))
        part = choose_within(max(budget - reserve, budget // 2))
        self._far_parts.put(key, part)
        return part
