"""Cutting text to a token budget by whole lines: the helpers the compressor trims with, and plain
left/right truncation around the cursor (the fall-back for languages without a grammar, and the
baseline `memosight bench context` measures the compressor against)."""

from __future__ import annotations

from collections.abc import Callable

from .packed import PackedContext, Region

CHARS_PER_TOKEN_GUESS = 6  # generous: only bounds how much text is tokenized to find the cut


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


def tail_within(text: str, budget: int, count_tokens: Callable[[str], int]) -> str:
    return _lines_within(text, budget, count_tokens, from_end=True)


def head_within(text: str, budget: int, count_tokens: Callable[[str], int]) -> str:
    return _lines_within(text, budget, count_tokens, from_end=False)


def truncate_around_cursor(text: str, cursor: int, budget: int, suffix_share: float,
                           count_tokens: Callable[[str], int], path: str = "") -> PackedContext:
    """Plain left/right truncation: the lines nearest the cursor that fit the budget."""
    suffix_budget = int(budget * suffix_share)
    suffix = head_within(text[cursor:], suffix_budget, count_tokens) if suffix_budget else ""
    suffix_tokens = count_tokens(suffix) if suffix else 0
    prefix = tail_within(text[:cursor], budget - suffix_tokens, count_tokens)
    prefix_tokens = count_tokens(prefix)
    cursor_line = text.count("\n", 0, cursor) + 1
    regions = [Region(path, cursor_line - prefix.count("\n"), cursor_line, "cursor_prefix", 1.0)]
    if suffix:
        regions.append(Region(path, cursor_line, cursor_line + suffix.count("\n"), "cursor_suffix", 1.0))
    return PackedContext(prefix, suffix, prefix_tokens + suffix_tokens, regions)
