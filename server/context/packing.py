"""Packing text around the cursor into a token budget counted in the model's own tokens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

CHARS_PER_TOKEN_GUESS = 6  # generous: only bounds how much text is tokenized to find the cut


@dataclass
class Region:
    path: str
    start_line: int  # 1-based, inclusive
    end_line: int
    kind: str  # "cursor_prefix", "cursor_suffix", "function", "imports", ...
    score: float


@dataclass
class PackedContext:
    prefix: str
    suffix: str
    prompt_tokens: int
    regions: list[Region] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "prefix": self.prefix,
            "suffix": self.suffix,
            "prompt_tokens": self.prompt_tokens,
            "regions": [r.__dict__ for r in self.regions],
        }


def _lines_within(text: str, budget: int, count_tokens: Callable[[str], int], from_end: bool) -> str:
    """The most whole lines of `text` that fit in `budget` tokens, taken from its end (the text
    before the cursor) or its start (the text after it). The line touching the cursor is cut by
    characters when even it alone does not fit."""
    if budget <= 0:
        return ""
    text = text[-budget * CHARS_PER_TOKEN_GUESS:] if from_end else text[: budget * CHARS_PER_TOKEN_GUESS]
    if count_tokens(text) <= budget:
        return text
    lines = text.splitlines(keepends=True)
    take = (lambda n: "".join(lines[len(lines) - n:])) if from_end else (lambda n: "".join(lines[:n]))
    low, high = 0, len(lines)  # binary search on how many lines to keep
    while low < high:
        mid = (low + high + 1) // 2
        if count_tokens(take(mid)) <= budget:
            low = mid
        else:
            high = mid - 1
    kept = take(low) if low else (lines[-1] if from_end else lines[0])
    while kept and count_tokens(kept) > budget:
        kept = kept[len(kept) // 4 or 1:] if from_end else kept[: len(kept) * 3 // 4]
    return kept


def _tail_within(text: str, budget: int, count_tokens: Callable[[str], int]) -> str:
    return _lines_within(text, budget, count_tokens, from_end=True)


def _head_within(text: str, budget: int, count_tokens: Callable[[str], int]) -> str:
    return _lines_within(text, budget, count_tokens, from_end=False)


def truncate_around_cursor(text: str, cursor: int, budget: int, suffix_share: float,
                           count_tokens: Callable[[str], int], path: str = "") -> PackedContext:
    """Plain left/right truncation: the lines nearest the cursor that fit the budget."""
    suffix_budget = int(budget * suffix_share)
    suffix = _head_within(text[cursor:], suffix_budget, count_tokens) if suffix_budget else ""
    suffix_tokens = count_tokens(suffix) if suffix else 0
    prefix = _tail_within(text[:cursor], budget - suffix_tokens, count_tokens)
    prefix_tokens = count_tokens(prefix)
    cursor_line = text.count("\n", 0, cursor) + 1
    regions = [Region(path, cursor_line - prefix.count("\n"), cursor_line, "cursor_prefix", 1.0)]
    if suffix:
        regions.append(Region(path, cursor_line, cursor_line + suffix.count("\n"), "cursor_suffix", 1.0))
    return PackedContext(prefix, suffix, prefix_tokens + suffix_tokens, regions)


# --- the context compressor ---------------------------------------------------------------------
# Layout of what the model sees (far context in file order, the cursor's own prefix last):
#   prefix = [other open files: chosen units] [this file above the near window: chosen units]
#            [near prefix: the enclosing function from its start (or, if too long, a later line) to the cursor]
#   suffix = [near suffix: the rest of the enclosing function] [this file below it: chosen units]
# Skipped lines become one elision marker (`# ...`). The far parts are cached per (content of the
# far text, near window), so typing inside one function leaves them, and the prompt's head, unchanged;
# they are chosen again only when the near part outgrows the room left for it, or when the user
# completes a name whose definition they did not consider (its definition should come in).

NEAR_PREFIX_SHARE = 0.7  # of the prefix budget: the most the cursor's own function may take
NEAR_SUFFIX_SHARE = 0.85  # of the suffix budget: the rest of the function after the cursor
GROWTH_RESERVE = 0.15  # of the budget, left free when far parts are re-chosen because typing outgrew them
COLD_RESERVE = 0.05  # ... and when chosen for the first time for a near window
NEAR_SLACK = 0.2  # a near prefix cut inside a long function starts with this share of its budget free
QUANTUM_LINES = 8  # outside any function the near window moves by this many lines at a time
WINDOW_LINES = 16  # outside any function the near window spans this many lines above the cursor
MAX_OTHER_DOCUMENTS = 12
_WORD_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
CHARS_PER_TOKEN_MAX = 12  # no tokenizer packs more into one token: longer text cannot fit, skip counting


@dataclass
class FarPart:
    text: str
    tokens: int
    regions: list[Region]
    known: frozenset[str] = frozenset()  # names with a definition outside the near window, when chosen
    considered: frozenset[str] = frozenset()  # those of them then used near the cursor, or shown in it

    def misses(self, used: set[str]) -> bool:
        """Whether a name now used near the cursor has a definition this part did not consider."""
        return bool((used & self.known) - self.considered)


@dataclass
class _Source:
    """One file whose units may be chosen: the current document or another open one."""

    path: str
    analysis: object  # regions.FileAnalysis
    scores: list[float]
    rows: tuple[int, int]  # units must lie inside these rows
    comment: str
    closers: tuple[int, ...] = ()  # units kept for their closing rows in range (`}` of enclosing blocks)


class ContextCompressor:
    """Builds the packed context for a cursor; holds the bounded caches that keep it fast and stable."""

    def __init__(self, cache_size: int = 32):
        from .regions import LRU

        self._far_parts = LRU(cache_size)
        self._near_starts = LRU(cache_size)
        self._near_suffixes = LRU(cache_size)
        self._suffixes = LRU(cache_size)  # (uri, text after the cursor, budget) -> the suffix's parts
        self._windows = LRU(cache_size)  # uri -> the last near window (see _window)
        self._token_counts = LRU(50_000)

    # --- tokens ---------------------------------------------------------------------------------

    def _count(self, text: str, count_tokens: Callable[[str], int]) -> int:
        from .regions import content_hash

        owner = getattr(count_tokens, "__self__", None)
        key = (id(owner) if owner is not None else id(count_tokens), content_hash(text))
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
        from . import languages
        from .regions import USE_WINDOW_LINES, content_hash, identifiers

        text, tree = doc.snapshot()
        cursor = max(0, min(cursor, len(text)))
        if tree is None:  # no grammar: a line window around the cursor
            return truncate_around_cursor(text, cursor, budget, suffix_share, count_tokens, doc.path)
        count = lambda piece: self._count(piece, count_tokens)  # noqa: E731 - memoized by content
        comment = languages.comment_prefix(doc.language)
        marker_tokens = count(f"{comment} ...\n")
        rows = _Rows(text, cursor)
        cursor_row = rows.cursor_row
        def_start, def_end = self._window(doc.uri, doc.language, text, tree, rows)
        suffix_budget = int(budget * suffix_share)

        # Near suffix: the rest of the near window, whole lines from the cursor.
        near_end = min(def_end + 1, text.count("\n") + 1)
        end_offset = rows.offset(near_end)
        # Typing at the cursor leaves the text after it unchanged, and so the suffix: reused as it
        # was, since the model reads it first (fill-in-the-middle, suffix first) and any change there
        # costs the whole prompt's KV cache, even where the function's extent shifts as it grows.
        suffix_key = (doc.uri, content_hash(text[cursor:]), budget, suffix_share)
        kept_suffix = self._suffixes.get(suffix_key)
        if kept_suffix is not None:
            near_suffix, suffix_cut, near_suffix_tokens, kept_below = kept_suffix
        else:
            near_suffix, suffix_cut = self._near_suffix(text[cursor:end_offset],
                                                        int(suffix_budget * NEAR_SUFFIX_SHARE), comment, count_tokens)
            near_suffix_tokens = count(near_suffix) if near_suffix else 0
            kept_below = None

        # Near prefix: from the start of the near window, unless too long (then from a later line).
        near_prefix_budget = int((budget - suffix_budget) * NEAR_PREFIX_SHARE)
        near_start, near_prefix_tokens = self._near_start(doc.uri, text, rows, def_start, near_prefix_budget,
                                                          count_tokens)
        near_prefix = text[rows.offset(near_start):cursor]
        if near_prefix_tokens > budget - near_suffix_tokens:  # one enormous line: keep its tail
            near_prefix = _tail_within(near_prefix, budget - near_suffix_tokens, count_tokens)
            near_prefix_tokens = count_tokens(near_prefix)

        family = languages.FAMILY.get(doc.language)
        other_docs = [o for o in others if o.uri != doc.uri and languages.FAMILY.get(o.language) == family
                      and not o.too_large and not o.looks_binary][:MAX_OTHER_DOCUMENTS]
        # The names used near the cursor: their definitions are wanted (cheap; read on every keystroke).
        # The word being typed at the cursor is not a name yet (`hel` of `helper`): it is left out.
        line = text[rows.offset(cursor_row):cursor]
        typing = len(line) - len(line.rstrip(_WORD_CHARS))
        used = identifiers(text[rows.offset(max(def_start, cursor_row - USE_WINDOW_LINES)):cursor - typing]
                           + " " + text[cursor:rows.offset(min(def_end + 1, cursor_row + USE_WINDOW_LINES))])
        state = {}  # analysis and scores, computed once if either far part must be rebuilt

        def known() -> frozenset[str]:
            sources("above")
            return state["known"]

        def sources(side: str) -> list[_Source]:
            if not state:
                state.update(self._score(doc, text, tree, cursor_row, used, other_docs))
                analysis = state["analysis"]
                state["closers"] = tuple(analysis.definitions[d].signature for d in analysis.enclosing(cursor_row)
                                         if any(r >= near_end for r in analysis.units[
                                             analysis.definitions[d].signature].extra_rows))
            analysis, scores, other_sources = state["analysis"], state["scores"], state["others"]
            if side == "below":
                return [_Source(doc.path, analysis, scores, (near_end, len(analysis.lines)), comment,
                                state["closers"])]
            return [*other_sources, _Source(doc.path, analysis, scores, (0, near_start), comment)]

        # Below the near window, in the suffix (budget: what the near suffix left of the suffix share).
        if kept_below is not None and not kept_below.misses(used):
            below = kept_below
        else:  # first time here, or a newly typed name has a definition below that was not considered
            below_key = ("below", doc.uri, content_hash(text[end_offset:]), near_end - def_start, budget)
            below = self._far_part(below_key, suffix_budget - near_suffix_tokens, budget, used,
                                   lambda b: self._choose(sources("below"), b, marker_tokens, count_tokens,
                                                          header=False, trailing=False, gap_before=suffix_cut),
                                   known)
            self._suffixes.put(suffix_key, (near_suffix, suffix_cut, near_suffix_tokens, below))
        suffix = near_suffix + below.text

        # Above the near window, and other open files, in the prefix.
        others_key = tuple(sorted((o.path, content_hash(o.text)) for o in other_docs))
        above_key = ("above", doc.uri, content_hash(text[:rows.offset(near_start)]), near_start, def_start,
                     others_key, budget)
        above_budget = budget - near_suffix_tokens - below.tokens - near_prefix_tokens
        above = self._far_part(above_key, above_budget, budget, used, lambda b: self._choose(
            sources("above"), b, marker_tokens, count_tokens, header=bool(other_docs), trailing=True,
            gap_before=False), known)
        prefix = above.text + near_prefix

        suffix_tokens = count(suffix) if suffix else 0
        if suffix_tokens > budget:  # a tiny budget: its markers alone may not fit
            suffix = _head_within(suffix, budget, count_tokens)
            suffix_tokens = count_tokens(suffix) if suffix else 0
        prefix_tokens = count_tokens(prefix)
        if prefix_tokens + suffix_tokens > budget:  # counts of the pieces did not add up: cut the head
            prefix = _tail_within(prefix, budget - suffix_tokens, count_tokens)
            prefix_tokens = count_tokens(prefix)
        regions = [*above.regions, Region(doc.path, near_start + 1, cursor_row + 1, "cursor_prefix", 1.0)]
        if near_suffix:
            regions.append(Region(doc.path, cursor_row + 1, cursor_row + 1 + near_suffix.count("\n"),
                                  "cursor_suffix", 1.0))
        regions.extend(below.regions)
        return PackedContext(prefix, suffix, prefix_tokens + suffix_tokens, regions)

    # --- steps ----------------------------------------------------------------------------------

    def _window(self, uri: str, language: str, text: str, tree, rows: "_Rows") -> tuple[int, int]:
        """First and last rows of the near window: the function around the cursor, else a window of
        lines that moves by whole quanta. While the code around the cursor does not parse (an
        unclosed bracket or docstring as the user types), the last window is kept if the code above
        it and below it is unchanged, so a transient error does not reshuffle the context."""
        from .regions import content_hash

        cursor_row, total_rows = rows.cursor_row, text.count("\n") + 1
        def_start, def_end = _near_window(language, text, tree, rows.cursor, cursor_row)
        previous = self._windows.get(uri)
        # No function found where there was one a keystroke ago is usually a transient parse too:
        # an opened docstring or string swallows the rest of the file until it is closed.
        if previous is not None and (def_start is None or _error_near(tree, text, rows.cursor)):
            start, rows_below, above_hash, below_hash = previous
            end = total_rows - rows_below
            if start <= cursor_row <= end and above_hash == content_hash(text[:rows.offset(start)]) \
                    and below_hash == content_hash(text[rows.offset(end + 1):]):
                return start, end
        if def_start is None:  # outside any function
            def_start = max(0, (cursor_row // QUANTUM_LINES) * QUANTUM_LINES - WINDOW_LINES)
            def_end = (cursor_row // QUANTUM_LINES + 2) * QUANTUM_LINES - 1
        def_end = min(max(def_end, cursor_row), total_rows - 1)
        self._windows.put(uri, (def_start, total_rows - def_end, content_hash(text[:rows.offset(def_start)]),
                                content_hash(text[rows.offset(def_end + 1):])))
        return def_start, def_end

    def _near_suffix(self, text: str, budget: int, comment: str, count_tokens) -> tuple[str, bool]:
        """Whole lines of `text` (the cursor's own line always) within `budget`, a marker if cut;
        memoized, since the text after the cursor rarely changes while typing."""
        from .regions import content_hash

        key = (content_hash(text), budget, comment)
        cached = self._near_suffixes.get(key)
        if cached is not None:
            return cached
        kept = _head_within(text, budget, count_tokens) if budget > 0 else ""
        cut = len(kept) < len(text)
        if cut and "\n" in kept:
            kept = kept[:kept.rindex("\n") + 1]
        if cut and kept.endswith("\n"):
            kept += _marker(text[len(kept):], comment)
        self._near_suffixes.put(key, (kept, cut))
        return kept, cut

    def _near_start(self, uri: str, text: str, rows: "_Rows", def_start: int, budget: int,
                    count_tokens) -> tuple[int, int]:
        """The first row of the near prefix, and the prefix's tokens: the window's start if it fits,
        else the first row whose tail fits with NEAR_SLACK to spare; remembered, so that it stays put
        while the user types."""
        from .regions import content_hash

        cursor, cursor_row = rows.cursor, rows.cursor_row
        key = (uri, def_start, content_hash(text[:rows.offset(def_start)]))
        cached = self._near_starts.get(key)
        if cached is not None and def_start <= cached <= cursor_row:
            tokens = self._tail_tokens(text, rows, cached, count_tokens)
            if tokens <= budget:
                return cached, tokens
        start = def_start
        tokens = self._tail_tokens(text, rows, start, count_tokens)
        if tokens > budget:
            target = int(budget * (1 - NEAR_SLACK))
            low, high = def_start + 1, cursor_row  # smallest row whose tail fits the target
            while low < high:
                mid = (low + high) // 2
                if count_tokens(text[rows.offset(mid):cursor]) <= target:
                    high = mid
                else:
                    low = mid + 1
            start = low
            tokens = self._tail_tokens(text, rows, start, count_tokens)
        self._near_starts.put(key, start)
        return start, tokens

    def _tail_tokens(self, text: str, rows: "_Rows", start: int, count_tokens) -> int:
        """Tokens of text[row `start`:cursor], counting afresh only the cursor's line and its seam
        with the lines above (memoized: they do not change while the user types on one line)."""
        line_start = rows.offset(rows.cursor_row)
        above, line = text[rows.offset(start):line_start], text[line_start:rows.cursor]
        if not above or not line:
            return self._count(above or line, count_tokens) if above or line else 0
        seam_above = above[above.rstrip().rfind("\n") + 1:]  # its last non-blank line and what follows
        joined = self._count(seam_above + line, count_tokens) - self._count(seam_above, count_tokens)
        return self._count(above, count_tokens) + joined

    def _far_part(self, key, budget: int, total_budget: int, used: set[str], choose: Callable[[int], FarPart],
                  known: Callable[[], frozenset[str]]) -> FarPart:
        """The cached far part for `key` while it still fits `budget` and no newly typed name near
        the cursor has a definition it did not consider; else a fresh choice that leaves room for
        the near part to grow (COLD_RESERVE the first time, GROWTH_RESERVE after)."""
        from .regions import identifiers

        cached = self._far_parts.get(key)
        if cached is not None and cached.tokens <= budget and not cached.misses(used):
            return cached
        if budget <= 0:
            return FarPart("", 0, [])
        reserve = int(total_budget * (GROWTH_RESERVE if cached is not None else COLD_RESERVE))
        part = choose(max(budget - reserve, budget // 2))
        part.known = known()
        # names already visible in the part need no new choice when the user types them
        part.considered = frozenset((used & part.known) | identifiers(part.text))
        self._far_parts.put(key, part)
        return part

    def _score(self, doc, text: str, tree, cursor_row: int, used: set[str], other_docs: list) -> dict:
        """Scores of the current file's units and of the other open files' (those with a use), and
        the names all these files define."""
        from .regions import analyze, score_units

        analysis = analyze(text, tree, doc.language)
        known = set(analysis.symbols) | set(analysis.imports) | set(analysis.binds)
        enclosing = analysis.enclosing(cursor_row)
        scores = score_units(analysis, used, cursor_row, enclosing)
        other_sources = []
        for other in sorted(other_docs, key=lambda o: o.path):
            other_text, other_tree = other.snapshot()
            if other_tree is None:
                continue
            other_analysis = analyze(other_text, other_tree, other.language)
            known |= other_analysis.symbols.keys()
            other_scores = score_units(other_analysis, used, None)
            if any(other_scores):
                other_sources.append(_Source(other.path, other_analysis, other_scores,
                                             (0, len(other_analysis.lines)),
                                             _comment_for(other.language)))
        # names of one or two letters (`i`, `x`) are local more often than not: typing one is no reason
        # for a new choice
        known = frozenset(name for name in known if len(name) > 2)
        return {"analysis": analysis, "scores": scores, "others": other_sources, "known": known}

    def _choose(self, sources: list[_Source], budget: int, marker_tokens: int, count_tokens,
                header: bool, trailing: bool, gap_before: bool) -> FarPart:
        """Greedy by score: each unit with the signatures it needs, while the estimate fits; then
        rendered in file order, and trimmed if the real count came out higher."""
        candidates = []
        for s_index, source in enumerate(sources):
            low, high = source.rows
            for u, unit in enumerate(source.analysis.units):
                if source.scores[u] > 0 and low <= unit.rows[0] and unit.rows[1] <= high:
                    candidates.append((-source.scores[u], s_index, unit.rows[0], u))
        candidates.sort()
        chosen: list[set[int]] = [set(s.closers) for s in sources]
        kept_rows: list[set[int]] = [set() for _ in sources]  # rows of the chosen units, blank rows too
        header_costs = [count_tokens(_header(s, sources[-1].path)) if header else 0 for s in sources]
        remaining = budget - sum(self._count("".join(s.analysis.lines[r] for u in s.closers
                                                     for r in s.analysis.units[u].extra_rows), count_tokens)
                                 + marker_tokens * len(s.closers) for s in sources)
        misses = 0
        for _, s_index, _, u in candidates:
            if u in chosen[s_index]:
                continue
            source = sources[s_index]
            low, high = source.rows
            need = [u] + [r for r in source.analysis.required(u) if r not in chosen[s_index]
                          and low <= source.analysis.units[r].rows[0] and source.analysis.units[r].rows[1] <= high]
            texts = [_unit_text(source.analysis, r) for r in need]
            if sum(len(t) for t in texts) > remaining * CHARS_PER_TOKEN_MAX:
                misses += 1
            else:
                # a marker for each unit that does not follow on from kept lines (an estimate)
                rows = {r for v in need for r in _rows_with_blanks_above(source.analysis, v)}
                markers = sum(1 for v in need if source.analysis.units[v].rows[0] - 1 not in kept_rows[s_index] | rows
                              and source.analysis.units[v].rows[0] > low)
                cost = sum(self._count(t, count_tokens) for t in texts) + marker_tokens * markers
                if not chosen[s_index]:
                    cost += header_costs[s_index]
                if cost <= remaining:
                    chosen[s_index].update(need)
                    kept_rows[s_index].update(rows)
                    remaining -= cost
                    misses = 0
                    continue
                misses += 1
            if misses >= 64 or remaining < marker_tokens:
                break
        while True:
            part = _render(sources, chosen, header, trailing, gap_before)
            tokens = count_tokens(part.text) if part.text else 0
            if tokens <= budget:
                return FarPart(part.text, tokens, part.regions)
            # Rare: drop the lowest-scoring chosen unit that no other chosen unit needs.
            worst = min(((source.scores[u], i, u) for i, source in enumerate(sources) for u in chosen[i]
                         if not any(u in source.analysis.required(v) for v in chosen[i] if v != u)),
                        default=None)
            if worst is None:
                return FarPart("", 0, [])
            chosen[worst[1]].discard(worst[2])


def _rows_with_blanks_above(analysis, u: int) -> list[int]:
    """The rows of unit `u` and the blank rows right above it (kept blank lines cost next to nothing)."""
    rows = analysis.units[u].all_rows()
    row = analysis.units[u].rows[0] - 1
    while row >= 0 and not analysis.lines[row].strip():
        rows.append(row)
        row -= 1
    return rows


class _Rows:
    """String offsets of rows (tree-sitter's: lines ending at "\n") near the cursor, found by
    scanning from it, so that a keystroke never pays for the whole file's line table."""

    def __init__(self, text: str, cursor: int):
        self.text, self.cursor = text, cursor
        self.cursor_row = text.count("\n", 0, cursor)
        self._offsets = {self.cursor_row: text.rfind("\n", 0, cursor) + 1}

    def offset(self, row: int) -> int:
        """Where `row` starts; rows past the end are the end of the text."""
        if row in self._offsets:
            return self._offsets[row]
        known = min(self._offsets, key=lambda r: abs(r - row))
        at = self._offsets[known]
        text = self.text
        while known > row:
            at = text.rfind("\n", 0, at - 1) + 1
            known -= 1
            self._offsets[known] = at
        while known < row:
            nl = text.find("\n", at)
            if nl < 0:
                return len(text)
            at, known = nl + 1, known + 1
            self._offsets[known] = at
        return at


def _near_window(language: str, text: str, tree, cursor: int, cursor_row: int) -> tuple[int | None, int | None]:
    """First and last rows of the outermost function-like definition around the cursor (its
    decorators and `export` included), or (None, None) outside any function."""
    from . import languages

    spec = languages.spec_for(language)
    outer = _outermost_function(tree, _byte_at(text, cursor), spec.function_types, None)
    if outer is None and language == "python":
        # A blank line below a function's last statement is still inside it when indented past its `def`.
        line_start = text.rfind("\n", 0, cursor) + 1
        line = text[line_start:cursor]
        before = text[:line_start].rstrip()
        if before and not line.strip() and line:
            outer = _outermost_function(tree, _byte_at(text, len(before) - 1), spec.function_types, len(line))
    if outer is None:
        return None, None
    if outer.parent is not None and outer.parent.type in spec.wrappers:
        outer = outer.parent
    return outer.start_point[0], max(outer.end_point[0], cursor_row)


def _error_near(tree, text: str, cursor: int) -> bool:
    """Whether the top-level statement at the cursor (or just before it) fails to parse."""
    root = tree.root_node
    if not root.has_error:
        return False
    for offset in (cursor, max(0, len(text[:cursor].rstrip()) - 1)):
        node = root.descendant_for_byte_range(_byte_at(text, offset), _byte_at(text, offset))
        while node is not None and node.parent is not None and node.parent != root:
            node = node.parent
        if node is not None and (node.has_error or node.is_error):
            return True
    return False


def _byte_at(text: str, offset: int) -> int:
    return offset if text.isascii() else len(text[:offset].encode("utf-8", "surrogatepass"))


def _outermost_function(tree, at: int, function_types: tuple[str, ...], below_column: int | None):
    node = tree.root_node.descendant_for_byte_range(at, at)
    outer = None
    while node is not None:
        if node.type in function_types and (below_column is None or node.start_point[1] < below_column):
            outer = node
        node = node.parent
    return outer


def _comment_for(language: str) -> str:
    from . import languages

    return languages.comment_prefix(language)


def _unit_text(analysis, u: int) -> str:
    return "".join(analysis.lines[r] for r in analysis.units[u].all_rows() if r < len(analysis.lines))


def _marker(skipped: str, comment: str) -> str:
    """The elision marker for `skipped` lines, indented like the first of them that is not blank."""
    for line in skipped.split("\n"):
        if line.strip():
            indent = line[:len(line) - len(line.lstrip(" \t"))]
            return f"{indent}{comment} ...\n"
    return ""


def _header(source: _Source, current_path: str) -> str:
    import os

    try:
        name = os.path.relpath(source.path, os.path.dirname(current_path))
    except ValueError:
        name = source.path
    return f"{source.comment} file: {name}\n"


def _render(sources: list[_Source], chosen: list[set[int]], header: bool, trailing: bool,
            gap_before: bool) -> FarPart:
    """The chosen units of each source in file order; runs of skipped lines become one marker."""
    out: list[str] = []
    regions: list[Region] = []
    for source, units in zip(sources, chosen):
        low, high = source.rows
        is_current = source is sources[-1]
        if not units and not (is_current and header):
            continue
        if header:
            out.append(_header(source, sources[-1].path))
        lines = source.analysis.lines
        rows = sorted({r for u in units for r in source.analysis.units[u].all_rows() if low <= r < high})
        row_unit = {r: u for u in units for r in source.analysis.units[u].all_rows()}
        previous = low - 1
        for r in rows:
            if r > previous + 1:
                gap = lines[previous + 1:r]
                if previous < low and gap_before:
                    pass  # the caller's text already ends with a marker for these lines
                elif any(line.strip() for line in gap):
                    out.append(_marker("".join(gap), source.comment) or f"{source.comment} ...\n")
                elif out:
                    out.extend(gap)  # blank lines between kept units stay as they are
            out.append(lines[r])
            unit = source.analysis.units[row_unit[r]]
            if regions and regions[-1].path == source.path and regions[-1].end_line == r \
                    and regions[-1].kind == unit.kind:
                regions[-1].end_line = r + 1
            else:
                regions.append(Region(source.path, r + 1, r + 1, unit.kind,
                                      round(source.scores[row_unit[r]], 3)))
            previous = r
        if out and not out[-1].endswith("\n"):
            out.append("\n")
        tail = lines[previous + 1:high]
        if (trailing or not is_current) and any(line.strip() for line in tail):
            out.append(_marker("".join(tail), source.comment) or f"{source.comment} ...\n")
        elif trailing and out:
            out.extend(tail)
    return FarPart("".join(out), 0, regions)
