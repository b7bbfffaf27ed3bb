"""Training examples in the prompt format the server really sends: the compressor's packed context
around a cursor (elision markers, far definitions first, other open files), and the text the user
goes on to write there.

A small model pretrained on whole files has never seen a prompt with elided spans and definitions
pulled from far away, so it barely uses them. `memosight train context` fine-tunes it on these.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..documents import Document
from .packing import ContextCompressor
from .truncation import truncate_around_cursor

MIN_ROW = 40  # cursors this far down a file, so there is far context to choose from
BUDGETS = (384, 512, 768, 1024)  # the bench's 512 and the server's default 1,024, and between


@dataclass
class Example:
    prefix: str
    suffix: str
    middle: str  # what the user writes at the cursor; the model learns to write it, then stop
    compressed: bool


def cursor_cut(lines: list[str], row: int, rng: random.Random) -> tuple[str, int, str]:
    """Remove what the user is about to write at `row`: the rest of the line from a line start (half
    the time) or mid-line, sometimes with up to 3 more lines. Returns (text, cursor offset, middle)."""
    line = lines[row]
    indent = len(line) - len(line.lstrip())
    column = indent if rng.random() < 0.5 else rng.randint(indent, max(indent, len(line) - 1))
    extra = rng.choice((1, 2, 3)) if rng.random() < 0.25 else 0
    last = min(len(lines) - 1, row + extra)
    middle = "\n".join([line[column:], *lines[row + 1:last + 1]])
    kept_line = line[:column]
    text = "\n".join([*lines[:row], kept_line, *lines[last + 1:]])
    cursor = sum(len(x) + 1 for x in lines[:row]) + len(kept_line)
    return text, cursor, middle


def context_examples(documents: list, count_tokens: Callable[[str], int], rng: random.Random,
                     per_file: int = 8, truncated_share: float = 0.3, suffix_share: float = 0.25,
                     open_files: int = 4) -> Iterator[Example]:
    """Up to `per_file` examples from each of `documents` (server Documents), at code lines at least
    MIN_ROW lines down. Most contexts come from the compressor, with up to `open_files` other files
    of the same folder as the editor's open tabs; `truncated_share` of them are plain truncation (the
    fall-back for languages without a grammar), so the model keeps that format too."""
    compressor = ContextCompressor()
    by_folder: dict[str, list] = {}
    for doc in documents:
        by_folder.setdefault(doc.uri.rsplit("/", 1)[0], []).append(doc)
    for doc in documents:
        lines = doc.text.split("\n")
        rows = [r for r in range(MIN_ROW, len(lines)) if len(lines[r].strip()) >= 2]
        if not rows:
            continue
        siblings = [d for d in by_folder[doc.uri.rsplit("/", 1)[0]] if d is not doc and d.language == doc.language]
        for row in rng.sample(rows, min(per_file, len(rows))):
            text, cursor, middle = cursor_cut(lines, row, rng)
            if not middle.strip():
                continue
            budget = rng.choice(BUDGETS)
            if rng.random() < truncated_share:
                packed = truncate_around_cursor(text, cursor, budget, suffix_share, count_tokens)
                yield Example(packed.prefix, packed.suffix, middle, compressed=False)
                continue
            current = Document(doc.uri, text, doc.language)
            others = rng.sample(siblings, min(open_files, len(siblings)))
            packed = compressor.build(current, cursor, budget, suffix_share, count_tokens, others)
            yield Example(packed.prefix, packed.suffix, middle, compressed=True)
