"""What `memosight bench fuzz` checks the server's answers against: each completion answer against
the document as its request saw it (an item must not be built on a later version), the client-fed
acceptance counters against what was shown, the memory reports, and how a server left.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from ..rpc.connection import CONTENT_MODIFIED, INVALID_PARAMS
from .fuzz_stream import COMPLETION, SMALL_CHARS, Asked, QuickText
from .typist import percentile

# No acceptance is longer than the longest suggestion: 64 tokens of at most 32 characters.
MAX_ACCEPTED_CHARS = 64 * 32


def word_before(text: str, offset: int) -> str:
    """The identifier characters just before `offset`: what the server's completion item replaces."""
    start = offset
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    return text[start:offset]


def built_on_another_version(asked: Asked, item: dict) -> bool:
    """Whether a textDocument/completion item was built on another text than the request's: its
    textEdit must end at the request's cursor, cover the word before it in the request's version
    (the server's items replace that word, for clients that filter on it), and its newText start
    with that word. An item without a textEdit has nothing to check."""
    edit = item.get("textEdit") if isinstance(item, dict) else None
    if edit is None:
        return False
    model = QuickText(asked.text)
    try:
        start, end = (edit["range"][k] for k in ("start", "end"))
        start, end = (int(start["line"]), int(start["character"])), (int(end["line"]), int(end["character"]))
        covered = asked.text[model.offset(*start):model.offset(*end)]
        new_text = str(edit["newText"])
    except (KeyError, TypeError, ValueError):
        return True  # an edit nobody can place
    cursor = model.offset(*asked.position)
    return end != tuple(asked.position) or covered != word_before(asked.text, cursor) \
        or not new_text.startswith(covered)


def latency_summary(latencies_ms: list[float]) -> dict:
    return {"count": len(latencies_ms), "p50": percentile(latencies_ms, 0.5), "p95": percentile(latencies_ms, 0.95),
            "max": round(max(latencies_ms), 1) if latencies_ms else None}


def completion_items(result) -> list:
    """The items of a completion or inline completion answer (a list, or an object with `items`)."""
    items = result.get("items") if isinstance(result, dict) else result
    return items if isinstance(items, list) else []


@dataclass
class AnswerTally:
    """The answers to completion requests, each checked against the document as its request saw it
    (fuzz_stream.Asked), and how long each took from sending to answer."""
    latencies_ms: list[float] = field(default_factory=list)
    heavy_latencies_ms: list[float] = field(default_factory=list)  # those of requests in heavy documents
    not_open: int = 0  # -32602 "... is not open": the document was open when the request was sent
    content_modified: int = 0  # -32801: closed (or opened anew) behind the request, LSP's answer for that
    other_errors: collections.Counter = field(default_factory=collections.Counter)  # by code (-32800: cancelled)
    items_checked: int = 0  # textDocument/completion items with a range
    on_another_version: int = 0
    examples: dict[str, list] = field(default_factory=dict)  # the first wrong answers of each kind, to look into

    def add(self, asked: Asked, answer: dict, answered_at: float) -> None:
        self.latencies_ms.append((answered_at - asked.sent_at) * 1000)
        if len(asked.text) >= SMALL_CHARS:
            self.heavy_latencies_ms.append(self.latencies_ms[-1])
        error = answer.get("error")
        if isinstance(error, dict):
            self._error(asked, answer.get("id"), error)
            return
        for item in completion_items(answer.get("result")) if asked.method == COMPLETION else []:
            self.items_checked += isinstance(item, dict) and "textEdit" in item
            if built_on_another_version(asked, item):
                self.on_another_version += 1
                self._example("built on another version", asked, answer.get("id"), item)

    def _error(self, asked: Asked, msg_id, error: dict) -> None:
        code = error.get("code")
        if code == INVALID_PARAMS and "not open" in str(error.get("message")):
            self.not_open += 1
            self._example("not open", asked, msg_id, error)
        elif code == CONTENT_MODIFIED:
            self.content_modified += 1
        else:
            self.other_errors[str(code)] += 1

    def _example(self, what: str, asked: Asked, msg_id, answer) -> None:
        examples = self.examples.setdefault(what, [])
        if len(examples) < 3:
            cursor = QuickText(asked.text).offset(*asked.position)
            examples.append({"id": msg_id, "method": asked.method, "uri": asked.uri, "version": asked.version,
                             "position": list(asked.position),
                             "text_before_cursor": asked.text[max(0, cursor - 40):cursor], "answer": answer})

    def to_json(self) -> dict:
        return {"latency_ms": latency_summary(self.latencies_ms),
                "latency_in_heavy_documents_ms": latency_summary(self.heavy_latencies_ms), "not_open": self.not_open,
                "content_modified": self.content_modified, "other_errors": dict(self.other_errors),
                "items_checked": self.items_checked, "built_on_another_version": self.on_another_version,
                "examples": self.examples}


def acceptances_bounded(requests: dict) -> bool:
    """The counters the client feeds (memosight.accepted) kept to what can be true: no more
    acceptances than suggestions shown (answered, or streamed while written), none longer than a
    suggestion can be."""
    shown = requests.get("completed", 0) + requests.get("streamed", 0)
    return (requests.get("accepted", 0) <= shown
            and requests.get("accepted_chars", 0) <= shown * MAX_ACCEPTED_CHARS)


@dataclass
class MemoryWatch:
    """The server's memosight/status answers through a run: its memory report taken at the highest
    RSS it reported, and whether its acceptance counters stayed bounded in every one."""
    reports: int = 0
    at_peak: dict | None = None
    counters: dict = field(default_factory=dict)  # the last report's completed/accepted/accepted_chars
    unbounded_reports: int = 0

    def add(self, status: dict) -> None:
        self.reports += 1
        memory = status.get("memory")
        if isinstance(memory, dict) and (memory.get("rss_mb") or 0) >= ((self.at_peak or {}).get("rss_mb") or 0):
            self.at_peak = memory
        requests = status.get("requests") or {}
        self.counters = {k: requests.get(k) for k in ("completed", "accepted", "accepted_chars")}
        self.unbounded_reports += not acceptances_bounded(requests)

    def bounded(self) -> bool:
        return self.reports > 0 and self.unbounded_reports == 0


def left_cleanly(code: int | None) -> bool:
    """0 or 1 (exit after shutdown or not); None: it did not leave; below 0: a signal ended it."""
    return code in (0, 1)
