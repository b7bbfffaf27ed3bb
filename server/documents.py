"""Open documents: text, version, LSP (UTF-16) positions <-> string offsets, incremental edits."""

from __future__ import annotations

import bisect
import re
from urllib.parse import unquote, urlparse
from dataclasses import dataclass, field

LINE_END = re.compile(r"\r\n|\r|\n")
MAX_DOCUMENT_BYTES = 8 * 1024 * 1024  # larger files are kept but get no completions


@dataclass(frozen=True)
class Position:
    line: int
    character: int  # UTF-16 code units, as LSP counts them


@dataclass(frozen=True)
class TextEdit:
    """One applied change, in both string offsets and (row, byte column) points, for tree-sitter."""

    start: int
    old_end: int
    new_end: int


def utf16_len(text: str) -> int:
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def _utf16_to_index(line: str, units: int) -> int:
    """Index into `line` of the UTF-16 column `units` (clamped to the line; never splits a pair)."""
    if units <= 0:
        return 0
    if line.isascii():
        return min(units, len(line))
    count = 0
    for i, ch in enumerate(line):
        width = 2 if ord(ch) > 0xFFFF else 1
        if count + width > units:
            return i
        count += width
    return len(line)


@dataclass
class Document:
    uri: str
    text: str
    language: str = ""
    version: int = 0
    _line_starts: list[int] | None = field(default=None, repr=False)

    @property
    def path(self) -> str:
        """The file path for file:// URIs, else the URI itself."""
        parsed = urlparse(self.uri)
        return unquote(parsed.path) if parsed.scheme == "file" else self.uri

    # --- positions ------------------------------------------------------------------------------

    @property
    def line_starts(self) -> list[int]:
        """Offsets where each line begins; \n, \r\n and \r all end a line, as LSP says."""
        if self._line_starts is None:
            self._line_starts = [0] + [m.end() for m in LINE_END.finditer(self.text)]
        return self._line_starts

    @property
    def line_count(self) -> int:
        return len(self.line_starts)

    def line_text(self, line: int) -> str:
        """The line without its ending."""
        starts = self.line_starts
        begin = starts[line]
        end = starts[line + 1] if line + 1 < len(starts) else len(self.text)
        return self.text[begin:end].rstrip("\r\n")

    def offset_at(self, position: Position) -> int:
        """String offset of an LSP position; positions past a line's end or the file's end are clamped."""
        if position.line < 0:
            return 0
        if position.line >= self.line_count:
            return len(self.text)
        begin = self.line_starts[position.line]
        return begin + _utf16_to_index(self.line_text(position.line), position.character)

    def position_at(self, offset: int) -> Position:
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self.line_starts, offset) - 1
        begin = self.line_starts[line]
        return Position(line, utf16_len(self.text[begin:offset]))

    def clamp(self, position: Position) -> Position:
        return self.position_at(self.offset_at(position))

    # --- edits ----------------------------------------------------------------------------------

    def apply_change(self, text: str, start: Position | None = None, end: Position | None = None) -> TextEdit:
        """Replace the range [start, end) by `text`; no range replaces the whole document."""
        if start is None or end is None:
            old_len = len(self.text)
            self.text = text
            self._line_starts = None
            return TextEdit(0, old_len, len(text))
        a, b = self.offset_at(start), self.offset_at(end)
        if b < a:
            a, b = b, a
        self.text = self.text[:a] + text + self.text[b:]
        self._line_starts = None
        return TextEdit(a, b, a + len(text))

    @property
    def too_large(self) -> bool:
        return len(self.text) > MAX_DOCUMENT_BYTES

    @property
    def looks_binary(self) -> bool:
        return "\x00" in self.text[:8192]


class DocumentStore:
    """The documents the editor has open, by URI."""

    def __init__(self) -> None:
        self._docs: dict[str, Document] = {}

    def open(self, uri: str, text: str, language: str, version: int) -> Document:
        doc = Document(uri, text, language, version)
        self._docs[uri] = doc
        return doc

    def get(self, uri: str) -> Document | None:
        return self._docs.get(uri)

    def close(self, uri: str) -> None:
        self._docs.pop(uri, None)

    def all(self) -> list[Document]:
        return list(self._docs.values())
