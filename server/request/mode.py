"""Where a completion ends: the one place that decides it.

Single line mid-line; several lines after a block opener (or on a blank line right below one),
ending with that block. The decision is an Ending: the StopRule the engine applies as it generates
(engine/text/stops.py: no piece it streams is taken back, and the text never ends in whitespace)
and the token limit. Nothing trims the text after the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from memosight.engine.protocol import StopRule

from ..config import Settings
from ..documents import Document

BRACE_LANGUAGES_OPENERS = ("{", "(", "[", "=>")
# A single-line suggestion ends at the line's end; a line of code is rarely longer than this many
# tokens (about 100 characters), and generation that runs past it is nearly always a loop.
SINGLE_LINE_MAX_TOKENS = 32


@dataclass(frozen=True)
class Ending:
    stop: StopRule  # applied by the engine as tokens come
    multiline: bool  # the suggestion may span several lines
    max_new_tokens: int


def completion_ending(doc: Document, cursor: int, settings: Settings) -> Ending:
    """Where a completion at `cursor` ends."""
    text = doc.text
    line_start = text.rfind("\n", 0, cursor) + 1
    line_end = text.find("\n", cursor)
    line_end = len(text) if line_end == -1 else line_end
    before, after = text[line_start:cursor], text[cursor:line_end].rstrip("\r")
    following = text[line_end + 1:].split("\n", 40)
    next_line = next((line.rstrip("\r") for line in following[:40] if line.strip()), "")
    multiline = settings.multiline == "always"
    after_whitespace = before[-1:] in (" ", "\t")  # the document has that whitespace already
    opener_line = before
    if settings.multiline == "auto" and not after.strip():
        if not before.strip():  # blank line: look at the line above
            above = text[:line_start].rstrip("\r\n").rsplit("\n", 1)[-1]
            opener_line = above
        openers = (":",) if doc.language == "python" else BRACE_LANGUAGES_OPENERS
        multiline = opener_line.rstrip().endswith(openers)
    budget = float(settings.latency_budget_ms)
    if not multiline:
        stop = StopRule(single_line=True, suffix_line=after, min_confidence=settings.min_confidence,
                        time_budget_ms=budget, after_whitespace=after_whitespace)
        return Ending(stop, False, min(settings.max_new_tokens, SINGLE_LINE_MAX_TOKENS))
    indent = len(opener_line) - len(opener_line.lstrip(" \t"))
    stop = StopRule(suffix_line=after, next_suffix_line=next_line, block_indent=indent, stop_strings=("\n\n\n",),
                    time_budget_ms=budget, after_whitespace=after_whitespace)
    return Ending(stop, True, settings.max_new_tokens)
