"""Every completion the model wrote, kept under the text around the cursor it was written for, and
found again while the user types along it.

A request whose text before the cursor is a cached context plus up to LOOK_BACK typed characters,
which the cached completion starts with, gets the rest of that completion at once, with no model
call: typing along a suggestion (shown or not: a late answer, a prefetch) shows what remains of it.
llama.vim keeps such a cache (250 entries, 128 characters of look-back); Tabby and Continue alike.

Entries are keyed by a hash of the last KEY_CHARS characters before the cursor, the first
KEY_CHARS after it and both lengths, so a key costs the same in a large file as in a small one; a
context is a document's text and a cursor in it, never the text cut in two (in a 5 MB file with an
emoji, each cut copied 20 MB, several times a keystroke).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..caching import LRU, content_hash
from .records import rest_after

SIZE = 250
LOOK_BACK = 128
KEY_CHARS = 2048


@dataclass
class Hit:
    rest: str  # what remains of the completion after what was typed
    source: str  # "request" or "prefetch": what computed it


def after_key(text: str, cursor: int) -> tuple:
    return len(text) - cursor, content_hash(text[cursor:cursor + KEY_CHARS])


def context_key(uri: str, text: str, cursor: int, cut: int | None = None, after_part: tuple | None = None) -> tuple:
    """The key of the context (text[:cut] | text[cursor:]): the text up to `cut` (the cursor by
    default) and all after the cursor; a lookup hashes the text after the cursor once (`after_part`)."""
    cut = cursor if cut is None else cut
    return (uri, cut, content_hash(text[max(0, cut - KEY_CHARS):cut]), *(after_part or after_key(text, cursor)))


class CompletionCache:
    def __init__(self, size: int = SIZE):
        self._entries = LRU(size)  # context key -> (completion, source)
        self._settings = None  # the settings its completions were made under
        self.hits = 0
        self.prefetch_hits = 0
        self.lookups = 0

    def made_under(self, settings) -> None:
        """The completions wanted now are made under `settings`: those made under others (another
        model, length, mode) are forgotten."""
        if settings != self._settings:
            self._entries.drop_where(lambda key: True)
            self._settings = settings

    def put(self, uri: str, text: str, cursor: int, completion: str, source: str = "request") -> None:
        if completion:
            self._entries.put(context_key(uri, text, cursor), (completion, source))

    def has(self, uri: str, text: str, cursor: int) -> bool:
        return self._entries.get(context_key(uri, text, cursor)) is not None

    def lookup(self, uri: str, text: str, cursor: int) -> Hit | None:
        """The rest of a cached completion that the text just before the cursor types into: the
        context itself first (typed = ""), then up to LOOK_BACK characters back."""
        self.lookups += 1
        after_part = after_key(text, cursor)
        for typed_chars in range(min(LOOK_BACK, cursor) + 1):
            cut = cursor - typed_chars
            entry = self._entries.get(context_key(uri, text, cursor, cut, after_part))
            if entry is None:
                continue
            completion, source = entry
            rest = rest_after(completion, text[cut:cursor])
            if rest is not None:
                self.hits += 1
                self.prefetch_hits += source == "prefetch"
                return Hit(rest, source)
        return None

    def has_document(self, uri: str) -> bool:
        return any(key[0] == uri for key in list(self._entries))

    def forget(self, uri: str) -> None:
        self._entries.drop_where(lambda key: key[0] == uri)

    def to_json(self) -> dict:
        return {"entries": len(self._entries), "lookups": self.lookups, "hits": self.hits,
                "prefetch_hits": self.prefetch_hits}
