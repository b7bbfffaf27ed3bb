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
