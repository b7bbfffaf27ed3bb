"""Packing text around the cursor into a token budget counted in the model's own tokens."""

from __future__ import annotations

import re
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


def _tail_within(text: str, budget: int, count_tokens: Callable[[str], int]) -> str:
    """The longest run of whole lines at the end of `text` (the cursor's own line always, even if
    partial) that fits in `budget` tokens."""
    text = text[-budget * CHARS_PER_TOKEN_GUESS:]
    if count_tokens(text) <= budget:
        return text
    lines = text.splitlines(keepends=True)
    # Drop whole lines from the front; binary search on how many to keep.
    low, high = 1, len(lines)
    while low < high:
        mid = (low + high + 1) // 2
        if count_tokens("".join(lines[-mid:])) <= budget:
            low = mid
        else:
            high = mid - 1
    kept = "".join(lines[-low:])
    while kept and count_tokens(kept) > budget:  # a single over-long line: cut characters
        kept = kept[len(kept) // 4 or 1:]
    return kept


def _head_within(text: str, budget: int, count_tokens: Callable[[str], int]) -> str:
    text = text[: budget * CHARS_PER_TOKEN_GUESS]
    if count_tokens(text) <= budget:
        return text
    lines = text.splitlines(keepends=True)
    low, high = 0, len(lines)
    while low < high:
        mid = (low + high + 1) // 2
        if count_tokens("".join(lines[:mid])) <= budget:
            low = mid
        else:
            high = mid - 1
    kept = "".join(lines[:low])
    if not kept and lines:  # the cursor's own line is too long: keep what fits of it
        kept = lines[0]
        while kept and count_tokens(kept) > budget:
            kept = kept[: len(kept) * 3 // 4]
    return kept


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
# far text, near window), so typing inside one function leaves them, and the prompt's head, unchanged.

NEAR_PREFIX_SHARE = 0.7  # of the prefix budget: the most the cursor's own function may take
NEAR_SUFFIX_SHARE = 0.6  # of the suffix budget: the rest of the function after the cursor
GROWTH_RESERVE = 0.1  # of the budget, left free when far parts are re-chosen because typing outgrew them
COLD_RESERVE = 0.03  # ... and when chosen for the first time for a near window
NEAR_SLACK = 0.2  # a near prefix cut inside a long function starts with this share of its budget free
QUANTUM_LINES = 8  # outside any function the near window moves by this many lines at a time
WINDOW_LINES = 16  # outside any function the near window spans this many lines above the cursor
MAX_OTHER_DOCUMENTS = 12
_NEWLINE = re.compile("\n")
CHARS_PER_TOKEN_MAX = 12  # no tokenizer packs more into one token: longer text cannot fit, skip counting


@dataclass
class FarPart:
    text: str
    tokens: int
    regions: list[Region]


@dataclass
class _Source:
    """One file whose units may be chosen: the current document or another open one."""

    path: str
    analysis: object  # regions.FileAnalysis
    scores: list[float]
    rows: tuple[int, int]  # units must lie inside these rows
    comment: str


class ContextCompressor:
    """Builds the packed context for a cursor; holds the bounded caches that keep it fast and stable."""

    def __init__(self, cache_size: int = 32):
        from .regions import LRU

        self._far_parts = LRU(cache_size)
        self._near_starts = LRU(cache_size)
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
        from . import languages
        from .regions import content_hash

        text, tree = doc.snapshot()
        cursor = max(0, min(cursor, len(text)))
        if tree is None:  # no grammar: a line window around the cursor
            return truncate_around_cursor(text, cursor, budget, suffix_share, count_tokens, doc.path)
        comment = languages.comment_prefix(doc.language)
        marker_tokens = count_tokens(f"{comment} ...\n")
        starts = [0] + [m.end() for m in _NEWLINE.finditer(text)]  # tree-sitter rows end at "\n" only
        n_rows = len(starts)
        cursor_row = text.count("\n", 0, cursor)
        def_start, def_end = _near_window(doc.language, text, tree, cursor, cursor_row)
        in_function = def_start is not None
        if not in_function:
            def_start = max(0, (cursor_row // QUANTUM_LINES) * QUANTUM_LINES - WINDOW_LINES)
            def_end = min(n_rows, (cursor_row // QUANTUM_LINES + 2) * QUANTUM_LINES) - 1
        def_end = max(def_end, cursor_row)

        suffix_budget = int(budget * suffix_share)
        near_prefix_budget = int((budget - suffix_budget) * NEAR_PREFIX_SHARE)

        # Near suffix: the rest of the near window, whole lines from the cursor.
        near_end = min(def_end + 1, n_rows)
        end_offset = starts[near_end] if near_end < n_rows else len(text)
        near_suffix_text = text[cursor:end_offset]
        near_suffix = _head_within(near_suffix_text, int(suffix_budget * NEAR_SUFFIX_SHARE), count_tokens) \
            if suffix_budget else ""
        suffix_cut = len(near_suffix) < len(near_suffix_text)
        if suffix_cut and "\n" in near_suffix:  # whole lines only, past the cursor's own
            near_suffix = near_suffix[:near_suffix.rindex("\n") + 1]
        if suffix_cut and near_suffix.endswith("\n"):
            near_suffix += _marker(near_suffix_text[len(near_suffix):], comment)
        near_suffix_tokens = count_tokens(near_suffix) if near_suffix else 0

        # Near prefix: from the start of the near window, unless too long (then from a later line).
        near_start = self._near_start(doc.uri, text, starts, def_start, cursor, cursor_row, near_prefix_budget,
                                      count_tokens)
        near_prefix = text[starts[near_start]:cursor]
        near_prefix_tokens = count_tokens(near_prefix)
        if near_prefix_tokens > budget - near_suffix_tokens:  # one enormous line: keep its tail
            near_prefix = _tail_within(near_prefix, budget - near_suffix_tokens, count_tokens)
            near_prefix_tokens = count_tokens(near_prefix)

        family = languages.FAMILY.get(doc.language)
        other_docs = [o for o in others if o.uri != doc.uri and languages.FAMILY.get(o.language) == family
                      and not o.too_large and not o.looks_binary][:MAX_OTHER_DOCUMENTS]
        others_key = tuple(sorted((o.path, content_hash(o.text)) for o in other_docs))
        window = (def_start, def_end, near_start, near_end)
        state = {}  # analysis and scores, computed once if either far part must be rebuilt

        def sources(side: str) -> list[_Source]:
            if not state:
                state.update(self._score(doc, text, tree, cursor_row, window, other_docs))
            analysis, scores, other_sources = state["analysis"], state["scores"], state["others"]
            if side == "below":
                return [_Source(doc.path, analysis, scores, (near_end, len(analysis.lines)), comment)]
            return [*other_sources, _Source(doc.path, analysis, scores, (0, near_start), comment)]

        # Below the near window, in the suffix (budget: what the near suffix left of the suffix share).
        below_budget = suffix_budget - near_suffix_tokens
        below_key = ("below", doc.uri, content_hash(text[end_offset:]), near_end - def_start, budget)
        below = self._far_part(below_key, below_budget, int(budget * GROWTH_RESERVE), lambda b: self._choose(
            sources("below"), b, marker_tokens, count_tokens, header=False, trailing=False, gap_before=suffix_cut))
        suffix = near_suffix + below.text
        suffix_tokens = near_suffix_tokens + below.tokens

        # Above the near window, and other open files, in the prefix.
        above_budget = budget - suffix_tokens - near_prefix_tokens
        above_key = ("above", doc.uri, content_hash(text[:starts[near_start]]), near_start, def_start,
                     in_function, others_key, budget)
        above = self._far_part(above_key, above_budget, int(budget * GROWTH_RESERVE), lambda b: self._choose(
            sources("above"), b, marker_tokens, count_tokens, header=bool(other_docs), trailing=True,
            gap_before=False))
        prefix = above.text + near_prefix

        prompt_tokens = count_tokens(prefix) + (count_tokens(suffix) if suffix else 0)
        if prompt_tokens > budget:  # token counts of pieces did not add up: cut, whatever stability says
            suffix_tokens = count_tokens(suffix) if suffix else 0
            prefix = _tail_within(prefix, budget - suffix_tokens, count_tokens)
            prompt_tokens = count_tokens(prefix) + suffix_tokens
        regions = [*above.regions, Region(doc.path, near_start + 1, cursor_row + 1, "cursor_prefix", 1.0)]
        if near_suffix:
            regions.append(Region(doc.path, cursor_row + 1, cursor_row + 1 + near_suffix.count("\n"),
                                  "cursor_suffix", 1.0))
        regions.extend(below.regions)
        return PackedContext(prefix, suffix, prompt_tokens, regions)

    # --- steps ----------------------------------------------------------------------------------

    def _near_start(self, uri: str, text: str, starts: list[int], def_start: int, cursor: int, cursor_row: int,
                    budget: int, count_tokens) -> int:
        """The first row of the near prefix: the window's start if it fits, else the first row whose
        tail fits with NEAR_SLACK to spare; remembered, so it stays put while the user types."""
        from .regions import content_hash

        key = (uri, def_start, content_hash(text[:starts[def_start]]))
        cached = self._near_starts.get(key)
        if cached is not None and def_start <= cached <= cursor_row \
                and count_tokens(text[starts[cached]:cursor]) <= budget:
            return cached
        start = def_start
        if count_tokens(text[starts[def_start]:cursor]) > budget:
            target = int(budget * (1 - NEAR_SLACK))
            low, high = def_start + 1, cursor_row  # smallest row whose tail fits the target
            while low < high:
                mid = (low + high) // 2
                if count_tokens(text[starts[mid]:cursor]) <= target:
                    high = mid
                else:
                    low = mid + 1
            start = low
        self._near_starts.put(key, start)
        return start

    def _far_part(self, key, budget: int, reserve: int, choose: Callable[[int], FarPart]) -> FarPart:
        """The cached far part for `key` while it still fits `budget`; else a fresh choice that leaves
        room (GROWTH_RESERVE) for the near part to grow."""
        cached = self._far_parts.get(key)
        if cached is not None and cached.tokens <= budget:
            return cached
        if budget <= 0:
            return FarPart("", 0, [])
        if cached is None:
            reserve = int(reserve * COLD_RESERVE / GROWTH_RESERVE)
        part = choose(max(0, budget - reserve) if budget > 2 * reserve else budget // 2)
        self._far_parts.put(key, part)
        return part

    def _score(self, doc, text: str, tree, cursor_row: int, window: tuple[int, int, int, int],
               other_docs: list) -> dict:
        """Scores of the current file's units and of the other open files' (those with a use)."""
        from .regions import USE_WINDOW_LINES, analyze, identifiers, score_units

        def_start, def_end, _, _ = window
        analysis = analyze(text, tree, doc.language)
        lines = analysis.lines
        low, high = max(def_start, cursor_row - USE_WINDOW_LINES), min(def_end + 1, cursor_row + USE_WINDOW_LINES)
        used = identifiers("".join(lines[low:high]))
        enclosing = analysis.enclosing(cursor_row)
        scores = score_units(analysis, used, cursor_row, enclosing)
        other_sources = []
        for other in sorted(other_docs, key=lambda o: o.path):
            other_text, other_tree = other.snapshot()
            if other_tree is None:
                continue
            other_analysis = analyze(other_text, other_tree, other.language)
            other_scores = score_units(other_analysis, used, None)
            if any(other_scores):
                other_sources.append(_Source(other.path, other_analysis, other_scores,
                                             (0, len(other_analysis.lines)),
                                             _comment_for(other.language)))
        return {"analysis": analysis, "scores": scores, "others": other_sources}

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
        chosen: list[set[int]] = [set() for _ in sources]
        header_costs = [count_tokens(_header(s, sources[-1].path)) if header else 0 for s in sources]
        remaining = budget
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
                cost = sum(self._count(t, count_tokens) for t in texts) + marker_tokens * len(need)
                if not chosen[s_index]:
                    cost += header_costs[s_index]
                if cost <= remaining:
                    chosen[s_index].update(need)
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
