"""What a completion request is made of: the suggestion and answer it gets, its view of the
document (Ticket), the model run it may share with later requests (Generation), and the
running counters. Plain data, no engine."""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from ..documents import LARGE_DOCUMENT_CHARS, Document


@dataclass
class Suggestion:
    text: str
    offset: int  # where it is inserted, as a string offset in the text the request saw
    latency_ms: float
    prompt_tokens: int
    stop_reason: str


@dataclass
class Answer:
    """What a completion request gets back."""

    suggestion: Suggestion | None  # None: no suggestion (superseded, cancelled, empty, an error)
    seen: Document  # the document as the request saw it: the answer's positions refer to this text
    messages: list[str] = field(default_factory=list)  # for the user: a model that fell back, an error


@dataclass
class Ticket:
    """One request's view of its document, to tell when it has gone stale."""

    doc: Document  # the live document: edits keep arriving while the request waits
    seen: Document  # a copy as the request saw it
    cursor: int  # in the seen text

    @classmethod
    def of(cls, doc: Document, cursor: int) -> Ticket:
        """Taken as the request arrives: the text is shared, not copied (strings do not change), and
        so are the line starts (replaced on an edit, never changed in place)."""
        return cls(doc, Document(doc.uri, doc.text, doc.language, doc.version, doc._line_starts), cursor)

    def stale(self) -> bool:
        """An edit arrived since the request was made, or the document was closed: the editor sends a
        newer request. (The text is compared too: an edit lands a moment before its version number.)"""
        return self.doc.closed or self.doc.version != self.seen.version or self.doc.text is not self.seen.text


@dataclass
class Generation:
    """One model run for a cursor; a later request typed into its output may wait for it and share it."""

    text: str  # the document's text it was started for (the same string, not a copy)
    cursor: int  # and the cursor in it
    cancel: threading.Event = field(default_factory=threading.Event)
    partial: str = ""  # text streamed so far
    future: Future | None = None
    settings: object = None  # the settings it runs under: a request under others never joins it
    source: str = "request"  # or "prefetch": started ahead of any request, for the text after a Tab
    # A multi-line run's first finished line(s), as a Suggestion, as soon as they are written: the
    # request shows them while the run goes on; the rest lands in the completion cache.
    first_lines: Future = field(default_factory=Future)


# Typed into a suggestion: the one rule. Every path that asks "did the user type along what the
# model wrote?" asks these two: the completion cache (typing through a finished completion), a
# request joining a running generation, and a joined request's answer.

def typed_into(old_text: str, old_cursor: int, text: str, cursor: int) -> str | None:
    """The characters typed at the cursor since a suggestion was made at `old_cursor` of
    `old_text`, or None when the document changed in any other way (an edit elsewhere, a deletion,
    a cursor move)."""
    if len(text) - cursor != len(old_text) - old_cursor or cursor < old_cursor:
        return None
    if text is not old_text and not _same_around(old_text, old_cursor, text, cursor):
        return None
    return text[old_cursor:cursor]


SAME_WINDOW = 2048  # characters either side compared in a large document, as completion_cache's keys do


def _same_around(old_text: str, old_cursor: int, text: str, cursor: int) -> bool:
    """Whether `text` is `old_text` with characters inserted at `old_cursor` (their lengths
    agree): all of it compared in a document of ordinary size; in a large one the characters
    around the cursor, as the completion cache keys contexts (whole, a 5 MB file was copied twice
    a keystroke)."""
    if len(text) <= LARGE_DOCUMENT_CHARS:
        return text.startswith(old_text[:old_cursor]) and text.endswith(old_text[old_cursor:])
    low = max(0, old_cursor - SAME_WINDOW)
    return (text[low:old_cursor] == old_text[low:old_cursor]
            and text[cursor:cursor + SAME_WINDOW] == old_text[old_cursor:old_cursor + SAME_WINDOW])


def rest_after(offered: str, typed: str, *, running: bool = False) -> str | None:
    """What is left of the model's text `offered` once `typed` was typed along it; None when the
    user typed off it, or all of it. `running`: `offered` is still being written, so typing ahead
    of it is along it too while what it wrote so far agrees (the rest is "" until it catches up)."""
    if offered.startswith(typed) and len(offered) > len(typed):
        return offered[len(typed):]
    if running and typed.startswith(offered):
        return ""
    return None


@dataclass
class Counters:
    requests: int = 0
    completed: int = 0
    empty: int = 0
    cancelled: int = 0
    superseded: int = 0
    typed_through: int = 0  # answered from the rest of the suggestion being typed, no model call
    joined: int = 0  # waited for a running generation that the typed text still matched
    warm_ups: int = 0  # prompts prefilled ahead: after an edit, on entering a file
    refreshes: int = 0  # pauses in which what keystrokes reused approximately was made exact
    first_lines: int = 0  # answered with a multi-line run's first line while the rest was still written
    prefetched: int = 0  # suggestions computed ahead for the text after taking the one on screen
    streamed: int = 0  # requests whose text the editor showed while it was written (a Tab may take it then)
    accepted: int = 0
    accepted_chars: int = 0
    errors: int = 0
    latencies_ms: deque = field(default_factory=lambda: deque(maxlen=500))
    longest_answer: int = 0  # characters of the longest suggestion answered: no acceptance is longer

    def answered(self, text: str, latency_ms: float) -> None:
        self.completed += 1
        self.latencies_ms.append(latency_ms)
        self.longest_answer = max(self.longest_answer, len(text))

    def streaming(self, text: str, first: bool) -> None:
        """A request's text as it is written, shown in the editor: a Tab may take it before the answer."""
        self.streamed += first
        self.longest_answer = max(self.longest_answer, len(text))

    def accept(self, chars: int) -> None:
        """What the client reports taking, kept to what can be true: no more acceptances than
        suggestions shown (answered, or streamed while written), none longer than the longest shown
        (a client once sent 4e30)."""
        if self.accepted >= self.completed + self.streamed:
            return
        self.accepted += 1
        self.accepted_chars += min(max(0, chars), self.longest_answer)

    def to_json(self) -> dict:
        lat = sorted(self.latencies_ms)
        pick = (lambda q: round(lat[min(len(lat) - 1, int(len(lat) * q))], 2)) if lat else (lambda q: None)
        return {
            "requests": self.requests, "completed": self.completed, "empty": self.empty,
            "cancelled": self.cancelled, "superseded": self.superseded, "typed_through": self.typed_through,
            "joined": self.joined, "first_lines": self.first_lines, "warm_ups": self.warm_ups, "refreshes": self.refreshes,
            "prefetched": self.prefetched,
            "streamed": self.streamed, "accepted": self.accepted,
            "accepted_chars": self.accepted_chars, "errors": self.errors,
            "latency_ms": {"last": round(self.latencies_ms[-1], 2) if lat else None,
                           "p50": pick(0.5), "p95": pick(0.95)},
            "acceptance_rate": round(self.accepted / self.completed, 4) if self.completed else None,
        }
