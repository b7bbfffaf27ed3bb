"""The far part of the context: the units outside the near window (the rest of this file, the other
open files) scored for the cursor, and the best of them chosen greedily into a token budget.

Each unit comes with the signatures it needs to show where it sits; what is chosen is rendered in
file order (rendering.py), and trimmed if the real token count came out higher than the estimate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .. import languages
from .packed import Region
from .regions import WEIGHTS, FileAnalysis, analyze, score_units
from .rendering import Source, header, render
from .similar import similarities

CHARS_PER_TOKEN_MAX = 12  # no tokenizer packs more into one token: longer text cannot fit, skip counting


@dataclass
class FarPart:
    text: str
    tokens: int
    regions: list[Region]


def score_sources(doc, text: str, tree, cursor_row: int, used: set[str], other_docs: list,
                  query: frozenset[str] = frozenset(), weights: dict | None = None,
                  attended: tuple[int, list[float]] | None = None, shown: set[str] = frozenset()) -> dict:
    """Scores of the current file's units and of the other open files' (those with a use or code
    like the code being written, whose names are `query`)."""
    analysis = analyze(text, tree, doc.language)
    enclosing = analysis.enclosing(cursor_row)
    similar = bool(query) and (weights or WEIGHTS)["similar_code"] != 0  # skip the Jaccard pass when off
    scores = score_units(analysis, used, cursor_row, enclosing, weights,
                         similarities(analysis, query) if similar else None, attended, shown,
                         doc.recent_rows)
    other_sources = []
    # a builtin name wants no other file's definition, unless this file imports one of that name
    builtin = languages.BUILTINS.get(languages.FAMILY.get(doc.language), frozenset()) - analysis.imports.keys()
    used_elsewhere, shown_elsewhere = used - builtin, shown - builtin
    for other in sorted(other_docs, key=lambda o: o.path):
        other_text, other_tree = other.snapshot()
        if other_tree is None:
            continue
        other_analysis = analyze(other_text, other_tree, other.language)
        other_scores = score_units(other_analysis, used_elsewhere, None, (), weights,
                                   similarities(other_analysis, query) if similar else None, None, shown_elsewhere,
                                   other.recent_rows)
        if any(other_scores):
            other_sources.append(Source(other.path, other_analysis, other_scores,
                                        (0, len(other_analysis.lines)),
                                        languages.comment_prefix(other.language)))
    return {"analysis": analysis, "scores": scores, "others": other_sources}


def choose(sources: list[Source], budget: int, marker_tokens: int, count: Callable[[str], int],
           count_tokens: Callable[[str], int], with_headers: bool, trailing: bool, gap_before: bool) -> FarPart:
    """Greedy by score: each unit with the signatures it needs, while the estimate fits; then
    rendered in file order, and trimmed if the real count came out higher. `count` is
    `count_tokens` memoized by content: the units' texts come again on every keystroke."""
    candidates = []
    for s_index, source in enumerate(sources):
        low, high = source.rows
        for u, unit in enumerate(source.analysis.units):
            if source.scores[u] > 0 and low <= unit.rows[0] and unit.rows[1] <= high:
                candidates.append((-source.scores[u], s_index, unit.rows[0], u))
    candidates.sort()
    chosen: list[set[int]] = [set(s.closers) for s in sources]
    kept_rows: list[set[int]] = [set() for _ in sources]  # rows of the chosen units, blank rows too
    header_costs = [count_tokens(header(s, sources[-1].path)) if with_headers else 0 for s in sources]
    remaining = budget - sum(count("".join(s.analysis.lines[r] for u in s.closers
                                           for r in s.analysis.units[u].extra_rows))
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
            cost = sum(count(t) for t in texts) + marker_tokens * markers
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
        text, regions = render(sources, chosen, with_headers, trailing, gap_before)
        tokens = count_tokens(text) if text else 0
        if tokens <= budget:
            return FarPart(text, tokens, regions)
        # Rare: drop the lowest-scoring chosen unit that no other chosen unit needs.
        worst = min(((source.scores[u], i, u) for i, source in enumerate(sources) for u in chosen[i]
                     if not any(u in source.analysis.required(v) for v in chosen[i] if v != u)),
                    default=None)
        if worst is None:
            return FarPart("", 0, [])
        chosen[worst[1]].discard(worst[2])


def _rows_with_blanks_above(analysis: FileAnalysis, u: int) -> list[int]:
    """The rows of unit `u` and the blank rows right above it (kept blank lines cost next to nothing)."""
    rows = analysis.units[u].all_rows()
    row = analysis.units[u].rows[0] - 1
    while row >= 0 and not analysis.lines[row].strip():
        rows.append(row)
        row -= 1
    return rows


def _unit_text(analysis: FileAnalysis, u: int) -> str:
    return "".join(analysis.lines[r] for r in analysis.units[u].all_rows() if r < len(analysis.lines))
