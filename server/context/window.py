"""The context llama.vim sends to llama.cpp's /infill, as a baseline for the packer: the lines
around the cursor in a 4:1 ratio (256 before, 64 after), and chunks of other files the user has seen
recently (its ring of 64-line chunks), all cut to a token budget."""

from __future__ import annotations

import os
from collections.abc import Callable

from .packed import PackedContext, Region
from .truncation import head_within, tail_within, truncate_around_cursor

LINES_BEFORE, LINES_AFTER = 256, 64  # llama.vim's n_prefix and n_suffix
CHUNK_LINES = 64  # llama.vim's ring_chunk_size
MAX_CHUNKS = 16  # llama.vim's ring_n_chunks
CHUNK_SHARE = 0.5  # of the budget, at most, for the chunks; the window has the rest
MIN_CHUNK_TOKENS = 32  # a chunk cut shorter than this says too little to be worth its header


def window(text: str, cursor: int, budget: int, count_tokens: Callable[[str], int], fim: bool,
           path: str = "") -> PackedContext:
    """Up to LINES_BEFORE lines before the cursor and LINES_AFTER after it, cut to `budget` tokens
    from the far ends, keeping their 4:1 ratio (a model without FIM tokens gets the lines before)."""
    start = cursor
    for _ in range(LINES_BEFORE):  # the cursor's own line and the lines above it
        start = text.rfind("\n", 0, start)
        if start < 0:
            break
    start += 1  # past the newline found (-1: the file's start)
    end = cursor
    for _ in range(LINES_AFTER):  # the rest of the cursor's line and the lines below it
        end = text.find("\n", end) + 1
        if end == 0:
            end = len(text)
            break
    else:
        end = len(text) if (last := text.find("\n", end)) < 0 else last
    share = LINES_AFTER / (LINES_BEFORE + LINES_AFTER) if fim else 0.0
    context = truncate_around_cursor(text[start:end], cursor - start, budget, share, count_tokens, path)
    first_line = text.count("\n", 0, start)
    regions = [Region(r.path, r.start_line + first_line, r.end_line + first_line, r.kind, r.score)
               for r in context.regions]
    return PackedContext(context.prefix, context.suffix, context.prompt_tokens, regions)


def chunk_of(text: str, row: int) -> str:
    """The CHUNK_LINES lines of `text` centred on `row`, as llama.vim takes them around a cursor."""
    lines = text.split("\n")
    low = max(0, min(row - CHUNK_LINES // 2, len(lines) - CHUNK_LINES))
    return "\n".join(lines[low:low + CHUNK_LINES]) + "\n"


def window_with_chunks(text: str, cursor: int, budget: int, count_tokens: Callable[[str], int], fim: bool,
                       chunks: list[tuple[str, str]], comment: str = "#", path: str = "") -> PackedContext:
    """The window, after chunks of other files (`chunks`: (path, text), most recent last, so that
    it is nearest the window), within the same `budget`: the chunks take up to CHUNK_SHARE of it,
    newest first, the last one cut to its first lines, and the window the rest."""
    taken: list[tuple[str, str]] = []
    spent = 0
    for chunk_path, chunk in reversed(chunks[-MAX_CHUNKS:]):
        try:
            name = os.path.relpath(chunk_path, os.path.dirname(path)) if path else chunk_path
        except ValueError:
            name = chunk_path
        head = f"{comment} file: {name}\n"
        room = int(budget * CHUNK_SHARE) - spent - count_tokens(head)
        if room < MIN_CHUNK_TOKENS:
            break
        kept = head_within(chunk, room, count_tokens)  # the chunk's first lines, when it is not whole
        if not kept.strip():
            break
        rendered = head + kept if kept.endswith("\n") else head + kept + "\n"
        taken.append((chunk_path, rendered))
        spent += count_tokens(rendered)
    extra = "".join(rendered for _, rendered in reversed(taken))
    if extra:  # back to the file being edited
        extra += f"{comment} file: {os.path.basename(path) or 'current'}\n"
    rest = budget - (count_tokens(extra) if extra else 0)
    near = window(text, cursor, rest, count_tokens, fim, path)
    prefix = extra + near.prefix
    tokens = count_tokens(prefix) + (count_tokens(near.suffix) if near.suffix else 0)
    if tokens > budget:  # the pieces' counts did not add up: cut from the far end
        prefix = tail_within(prefix, budget - (tokens - count_tokens(prefix)), count_tokens)
        tokens = count_tokens(prefix) + (count_tokens(near.suffix) if near.suffix else 0)
    regions = [Region(p, 1, CHUNK_LINES, "other_files", 1.0) for p, _ in reversed(taken)] + near.regions
    return PackedContext(prefix, near.suffix, tokens, regions)
