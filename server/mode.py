"""Completion mode and post-processing: where a suggestion may end, and its final tidy-up.

Single line mid-line; several lines after a block opener (or on a blank line right below one),
ending with that block. The engine applies the StopRule as it generates; post_process trims what
is left.
"""

from __future__ import annotations

from memosight.engine.protocol import StopRule

from .config import Settings
from .documents import Document

BRACE_LANGUAGES_OPENERS = ("{", "(", "[", "=>")
# A single-line suggestion ends at the line's end; a line of code is rarely longer than this many
# tokens (about 100 characters), and generation that runs past it is nearly always a loop.
SINGLE_LINE_MAX_TOKENS = 32


def completion_mode(doc: Document, cursor: int, settings: Settings) -> tuple[StopRule, bool]:
    """The stop rule for a completion at `cursor`, and whether it may span several lines."""
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
    if not multiline:
        return StopRule(single_line=True, suffix_line=after, min_confidence=settings.min_confidence,
                        time_budget_ms=float(settings.latency_budget_ms), after_whitespace=after_whitespace), False
    indent = len(opener_line) - len(opener_line.lstrip(" \t"))
    return StopRule(suffix_line=after, next_suffix_line=next_line, block_indent=indent,
                    stop_strings=("\n\n\n",), time_budget_ms=float(settings.latency_budget_ms),
                    after_whitespace=after_whitespace), True


def max_new_tokens(settings: Settings, multiline: bool) -> int:
    return settings.max_new_tokens if multiline else min(settings.max_new_tokens, SINGLE_LINE_MAX_TOKENS)


def finished_lines(text: str) -> str:
    """`text` up to its last newline: the lines the model has finished writing."""
    return text[:text.rfind("\n")] if "\n" in text else ""


def post_process(text: str, multiline: bool) -> str:
    """Final tidy-up: no trailing whitespace, no dangling blank lines."""
    text = text.rstrip()
    return text if multiline else text.split("\n", 1)[0]
