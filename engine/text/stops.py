"""Stop rules on the generated text, and the streaming of text pieces that applies them.

Where a completion ends besides EOS and the token limit: the server says which rules apply (a
StopRule in the request); the engine applies them here, as tokens come, so that no piece it streams
is later taken back. Pure text functions (no torch), shared by every engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from ..protocol import StopRule

OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = {v: k for k, v in OPENERS.items()}


@dataclass(frozen=True)
class Cut:
    text: str  # the completion, cut where a rule fired
    reason: str | None  # which rule fired, None while generation may go on


def _bracket_depth(text: str) -> int:
    depth = 0
    for ch in text:
        if ch in OPENERS:
            depth += 1
        elif ch in CLOSERS:
            depth -= 1
    return depth


def _suffix_repeat_at(text: str, suffix_line: str) -> int:
    """Index where `text` starts repeating the rest of the cursor's line, or -1.

    Only counts an occurrence at bracket depth <= 0, so `f(a(b)` is not cut at the inner `)`.
    """
    needle = suffix_line.strip()
    if not needle:
        return -1
    start = 0
    while (i := text.find(needle, start)) != -1:
        if _bracket_depth(text[:i]) <= 0:
            return i
        start = i + 1
    return -1


def apply_stop_rule(text: str, rule: StopRule) -> Cut:
    """Cut `text` at the first place a rule fires."""
    if rule.after_whitespace:
        text = text.lstrip(" \t")
    best, reason = len(text), None
    if rule.single_line and (i := text.find("\n")) != -1 and i < best:
        best, reason = i, "newline"
    for s in rule.stop_strings:
        if s and (i := text.find(s)) != -1 and i < best:
            best, reason = i, "stop_string"
    first_line_end = text.find("\n")
    first_line = text if first_line_end == -1 else text[:first_line_end]
    if (i := _suffix_repeat_at(first_line, rule.suffix_line)) != -1 and i < best:
        best, reason = i, "suffix"
    if rule.next_suffix_line.strip():
        needle = rule.next_suffix_line.strip()
        offset = 0
        for line in text.split("\n")[:-1]:  # only complete lines can equal the next line
            if line.strip() == needle and offset > 0 and offset < best:
                best, reason = offset, "suffix"
                break
            offset += len(line) + 1
    if rule.block_indent >= 0:
        offset = 0
        for n, line in enumerate(text.split("\n")[:-1]):  # a line counts once it is complete
            indent = len(line) - len(line.lstrip(" \t"))
            if n > 0 and line.strip() and indent <= rule.block_indent and offset < best:
                best, reason = offset, "block_end"
                break
            offset += len(line) + 1
    cut = text[:best]
    if reason in ("suffix",):
        cut = cut.rstrip(" \t") if cut.endswith((" ", "\t")) and "\n" not in cut else cut
    if reason in ("suffix", "block_end") and cut.endswith("\n"):
        cut = cut[:-1]
    return Cut(cut, reason)


def held_back(text: str, rule: StopRule) -> int:
    """How many trailing characters to keep back while streaming: they may yet begin a stop match."""
    candidates = [s for s in rule.stop_strings if s]
    if rule.suffix_line.strip():
        candidates.append(rule.suffix_line.strip())
    keep = 0
    if (rule.next_suffix_line.strip() or rule.block_indent >= 0) and "\n" in text:
        # The current line may turn out to repeat the next line, or to end the block.
        keep = len(text) - text.rfind("\n")
    for s in candidates:
        for n in range(min(len(s), len(text)), 0, -1):
            if text.endswith(s[:n]):
                keep = max(keep, n)
                break
    trailing = len(text) - len(text.rstrip())  # trailing blanks and newlines: trimmed at the end (_stream)
    return max(keep, trailing)


# --- streaming -------------------------------------------------------------------------------------

@dataclass
class StreamState:
    text: str = ""  # the completion so far, after stop rules
    started: float = 0.0  # time.perf_counter() when the request started (for the time budget)
    emitted: int = 0  # characters already streamed out
    tokens: int = 0
    stop_reason: str = "max_tokens"
    first_text: float = 0.0  # time.perf_counter() when the first text arrived


def complete_lines(text: str) -> str:
    """`text` up to its last newline (the newline excluded): the lines already finished."""
    return text[:text.rfind("\n")] if "\n" in text else ""


def over_budget(text: str, stop: StopRule, state: StreamState) -> str | None:
    """What a completion past its time budget ends with, or None while within it (or with nothing
    to show yet). A multi-line one ends at its last complete line, its budget counting from the
    request's start; a single line where it got to, its budget counting from its first token (a line
    that will not end would run to the token cap; a slow prefill alone must not cut it to a word)."""
    started = state.first_text if stop.single_line else state.started
    if stop.time_budget_ms <= 0 or not started:
        return None
    shown = text if stop.single_line else complete_lines(text)
    if not shown.strip() or (time.perf_counter() - started) * 1000 < stop.time_budget_ms:
        return None
    return shown


def stream_text(tokens: Iterable[int], decode: Callable[[list[int]], str], stop: StopRule, end_ids: set[int],
                state: StreamState) -> Iterator[str]:
    """Turn a token stream into text pieces, applying the stop rules.

    `decode(ids)` maps token ids to text. Pieces never include text that a stop rule later cuts.
    """
    def texts() -> Iterator[str]:
        generated: list[int] = []
        for token in tokens:
            state.tokens += 1
            if token in end_ids:
                state.stop_reason = "eos"
                return
            generated.append(token)
            yield decode(generated)

    yield from _stream(texts(), stop, state)


def stream_pieces(pieces: Iterable[str], stop: StopRule, state: StreamState) -> Iterator[str]:
    """The same for text that arrives in pieces (a remote server's stream): the stop rules apply
    to the whole text so far, and closing the iterator closes `pieces` (the connection)."""
    def texts() -> Iterator[str]:
        text = ""
        for piece in pieces:
            state.tokens += 1
            text += piece
            yield text

    yield from _stream(texts(), stop, state)


def _stream(texts: Iterator[str], stop: StopRule, state: StreamState) -> Iterator[str]:
    """Stream `texts` (the raw completion, growing) as pieces a stop rule never takes back."""
    raw = ""
    stopped = False
    for raw in texts:
        if raw.endswith("\ufffd"):  # half of a multi-byte character: wait for the rest
            continue
        if not state.first_text:
            state.first_text = time.perf_counter()
        cut = apply_stop_rule(raw, stop)
        state.text = cut.text
        if cut.reason is not None:
            state.stop_reason = cut.reason
            stopped = True
            break
        if (ended := over_budget(cut.text, stop, state)) is not None:
            state.text = ended
            state.stop_reason = "time_budget"
            stopped = True
            break
        safe = len(cut.text) - held_back(cut.text, stop)
        if safe > state.emitted:
            yield cut.text[state.emitted:safe]
            state.emitted = safe
    texts.close()  # a stop rule fired: the source stops too (a remote stream closes its connection)
    if not stopped and raw:
        state.text = apply_stop_rule(raw.rstrip("\ufffd"), stop).text
    state.text = state.text.rstrip()  # a suggestion never ends in blanks (held back, never streamed)
    if len(state.text) > state.emitted:
        yield state.text[state.emitted:]
        state.emitted = len(state.text)
