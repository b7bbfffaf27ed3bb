"""Open documents: text, version, LSP (UTF-16) positions <-> string offsets, incremental edits and
the incremental tree-sitter parse that follows them."""

from __future__ import annotations

import bisect
import hashlib
import re
import threading
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

from .caching import LRU, content_hash
from .languages import GRAMMAR_FOR_LANGUAGE_ID, parser_for

LINE_END = re.compile(r"\r\n|\r|\n")
MAX_DOCUMENT_BYTES = 8 * 1024 * 1024  # larger files are kept but get no completions


def text_digest(text: str) -> str:
    """A short hash of a document's text (lone surrogates included, as JSON can carry them), for a
    client to check that the server's copy equals its own."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


# Larger files are no context for other files (as the workspace index skips them), and are
# completed from a window around the cursor: their cost stays that of a file this size.
LARGE_DOCUMENT_CHARS = 300_000
WINDOW_BEFORE, WINDOW_AFTER = 200_000, 50_000
WINDOW_GRID = 16_384  # window ends snap to this grid: typing does not move them, so caches hold


def memory_estimate(chars: int) -> int:
    """Bytes a document of `chars` characters takes, measured (code of 70-character lines): text,
    line starts and tree-sitter tree ~32 a character; a large one, parsed by window only, ~2."""
    return chars * (2 if chars > LARGE_DOCUMENT_CHARS else 32)


def file_path(uri: str) -> str | None:
    """The path of a file:// URI; None for any other scheme (untitled:, vscode-notebook-cell:, ...)
    and for a path no file can have (a NUL byte, a lone surrogate): such a document is kept and
    completed by its URI, and never touches the file system."""
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        return None
    path = unquote(parsed.path)  # invalid UTF-8 after %-decoding becomes U+FFFD
    if "\x00" in path or "\ufffd" in path:
        return None
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return path


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
    start_byte: int = 0  # UTF-8 byte offsets, as tree-sitter counts
    old_end_byte: int = 0
    new_end_byte: int = 0
    start_point: tuple[int, int] = (0, 0)  # (row, byte column); rows end at "\n" only, as in tree-sitter
    old_end_point: tuple[int, int] = (0, 0)
    new_end_point: tuple[int, int] = (0, 0)


def utf16_len(text: str) -> int:
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _byte_offset(text: str, offset: int) -> int:
    return offset if text.isascii() else len(_encode(text[:offset]))


def _point(text: str, offset: int) -> tuple[int, int]:
    """tree-sitter's (row, byte column) of a string offset."""
    row = text.count("\n", 0, offset)
    line_start = text.rfind("\n", 0, offset) + 1
    return row, len(_encode(text[line_start:offset]))


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


def _updated_line_starts(starts: list[int] | None, new: str, a: int, b: int, inserted: int) -> list[int] | None:
    """The line starts after [a, b) was replaced by `inserted` characters: the lines around the edit
    are rescanned (a line before too, since a "\r" + "\n" pair may have been split or joined), the
    later ones shifted, so a keystroke does not rescan the whole file."""
    if starts is None:
        return None
    delta = inserted - (b - a)
    first = max(0, bisect.bisect_right(starts, a) - 2)
    last = bisect.bisect_right(starts, b + 1)  # starts from here on lie past the edit: shifted, kept
    low = starts[first]
    high = starts[last] + delta if last < len(starts) else len(new)
    middle = [m.end() for m in LINE_END.finditer(new, low, high) if m.end() < high or last == len(starts)]
    return starts[:first + 1] + middle + [s + delta for s in starts[last:]]


RECENT_AREAS = 4  # edited areas remembered per document
RECENT_AREA_LINES = 32  # edits closer than this to a remembered one are the same area


def _recent_rows(rows: tuple[int, ...], row: int, removed: int = 0, added: int = 0) -> tuple[int, ...]:
    """`rows` after an edit at `row` that replaced `removed` line breaks by `added`: the rows below
    move (those in a deleted span come to `row`), and `row` becomes the most recent area, replacing
    one it falls in."""
    moved = [r if r <= row else row if r <= row + removed else r - removed + added for r in rows]
    return (row, *[r for r in moved if abs(r - row) >= RECENT_AREA_LINES])[:RECENT_AREAS]


@dataclass
class Document:
    uri: str
    text: str
    language: str = ""
    version: int = 0
    _line_starts: list[int] | None = field(default=None, repr=False)
    # tree-sitter: the last tree (edited to match `text` when stale) and whether it needs a re-parse
    _tree: object | None = field(default=None, repr=False)
    _tree_stale: bool = field(default=False, repr=False)
    _tree_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # a frozen copy's live document: a tree the copy parses is handed back to it while the text is the same
    _origin: Document | None = field(default=None, repr=False, compare=False)
    # where the user last edited (or looked, or yanked: DocumentStore.visit), most recent first, one
    # row per area (RECENT_AREA_LINES apart): code they worked on, which the packer offers as context
    recent_rows: tuple[int, ...] = field(default=(), compare=False)
    closed: bool = field(default=False, compare=False)  # the editor closed it (or opened the URI anew)

    @property
    def path(self) -> str:
        """The file path for file:// URIs, else the URI itself."""
        return file_path(self.uri) or self.uri

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
        old = self.text
        if start is None or end is None:
            a, b = 0, len(old)
        else:
            a, b = self.offset_at(start), self.offset_at(end)
            if b < a:
                a, b = b, a
        new = old[:a] + text + old[b:]
        # where the edit was, in rows of the text before it (LSP's line breaks, clamped positions)
        row = self.position_at(a).line if start is not None else None
        with self._tree_lock:
            if self._tree is None and len(old) > LARGE_DOCUMENT_CHARS:
                # no tree to edit: tree-sitter's byte offsets and points would scan a big file per key
                edit = TextEdit(a, b, a + len(text))
            else:
                start_byte = _byte_offset(old, a)
                edit = TextEdit(a, b, a + len(text), start_byte, start_byte + len(_encode(old[a:b])),
                                start_byte + len(_encode(text)), _point(old, a), _point(old, b),
                                _point(new, a + len(text)))
            self.text = new
            if row is not None:
                self.recent_rows = _recent_rows(self.recent_rows, row, len(LINE_END.findall(old, a, b)),
                                                len(LINE_END.findall(text)))
            self._line_starts = None if start is None else _updated_line_starts(self._line_starts, new, a, b,
                                                                                len(text))
            if self._tree is not None:
                if start is None or end is None:
                    self._tree = None  # a whole-document replacement: parse afresh
                else:
                    self._tree.edit(edit.start_byte, edit.old_end_byte, edit.new_end_byte,
                                    edit.start_point, edit.old_end_point, edit.new_end_point)
                    self._tree_stale = True
        return edit

    # --- syntax tree ----------------------------------------------------------------------------

    def snapshot(self) -> tuple[str, object | None]:
        """The text and its tree-sitter tree (None for languages without a grammar), consistent with
        each other, and the tree a copy that later edits never reach (tree.edit on the live tree
        would otherwise change it under a reader on another thread). The tree is parsed lazily and
        incrementally: edits since the last parse were applied to the old tree (tree.edit), and the
        parser reuses its unchanged parts."""
        with self._tree_lock:
            text, tree = self._parse()
            return text, tree.copy() if tree is not None else None

    def frozen(self) -> Document:
        """A copy for the engine thread: later edits of this document never reach it. It is not
        parsed here but when (and if) its tree is asked for: while the user types inside a function
        the context is built without one, and a re-parse of code that does not parse yet (a function
        half typed in the middle of a long file) costs tens of milliseconds."""
        with self._tree_lock:
            # the line starts list is replaced on edits, never changed in place: it can be shared;
            # the tree was edited to match the text, and is parsed from there on demand
            tree = None if self.large or self._tree is None else self._tree.copy()  # a large one: by window
            return Document(self.uri, self.text, self.language, self.version, self._line_starts, tree,
                            self._tree_stale, _origin=self, recent_rows=self.recent_rows)

    def _parse(self) -> tuple[str, object | None]:
        """(text, tree) with the tree brought up to date; the caller holds the lock."""
        if self._tree is None or self._tree_stale:
            parser = parser_for(self.language)
            if parser is None:
                return self.text, None
            if self._tree is not None:
                self._tree = parser.parse(_encode(self.text), self._tree)
            else:  # a file seen before (reopened, or another document with the same text)
                key = (GRAMMAR_FOR_LANGUAGE_ID[self.language], content_hash(self.text))
                cached = _PARSED_TREES.get(key)
                self._tree = cached.copy() if cached is not None else parser.parse(_encode(self.text))
                if cached is None:
                    _PARSED_TREES.put(key, self._tree.copy())  # copies: edits of one never reach another
            self._tree_stale = False
            self._hand_back()
        return self.text, self._tree

    def _hand_back(self) -> None:
        """A frozen copy's new tree goes to its live document too, when that has not changed since."""
        origin = self._origin
        if origin is None or origin.large or self._tree is None:
            return
        with origin._tree_lock:
            if origin.text is self.text and (origin._tree is None or origin._tree_stale):
                origin._tree, origin._tree_stale = self._tree.copy(), False

    @property
    def tree(self):
        """The current tree-sitter tree, or None for languages without a grammar."""
        return self.snapshot()[1]

    def around(self, cursor: int) -> tuple[Document, int]:
        """This document, or for a large one a window of whole lines around `cursor`, and the
        cursor's offset in it."""
        if not self.large:
            return self, cursor
        text = self.text
        low = max(0, (cursor - WINDOW_BEFORE) // WINDOW_GRID * WINDOW_GRID)
        high = min(len(text), ((cursor + WINDOW_AFTER) // WINDOW_GRID + 1) * WINDOW_GRID)
        start = text.rfind("\n", 0, low) + 1 if low else 0
        end = text.find("\n", high)
        end = len(text) if end < 0 or high >= len(text) else end + 1
        return Document(self.uri, text[start:end], self.language, self.version), cursor - start

    @property
    def large(self) -> bool:
        return len(self.text) > LARGE_DOCUMENT_CHARS

    @property
    def too_large(self) -> bool:
        return len(self.text) > MAX_DOCUMENT_BYTES

    @property
    def looks_binary(self) -> bool:
        return "\x00" in self.text[:8192]


# fresh parses by (grammar, xxhash of the text): a file opened again is not parsed again
_PARSED_TREES = LRU(16)


class DocumentStore:
    """The documents the editor has open, by URI, and those it closed lately: what the user has seen
    and edited is the other-file context an editor offers (llama.vim's ring of recent chunks)."""

    RECENTLY_CLOSED = 8  # closed documents kept as context (none over LARGE_DOCUMENT_CHARS)
    # The memory all open documents may take, as memory_estimate() counts it: a file opened past it
    # is not kept (and says so). An editor's open files take far less (50 files of 50,000 characters:
    # ~80 MB); a client that opens without closing cannot exhaust the machine.
    MAX_OPEN_BYTES = 256 * 2**20

    def __init__(self) -> None:
        self._docs: dict[str, Document] = {}  # most recently opened or edited last
        self._closed: dict[str, Document] = {}  # most recently closed last

    def open(self, uri: str, text: str, language: str, version: int) -> Document | None:
        """The document, now open; None when it is not kept: it would take the open documents past
        MAX_OPEN_BYTES."""
        self._closed.pop(uri, None)
        old = self._docs.pop(uri, None)
        if old is not None:  # opened again over itself: requests made on the old copy are stale
            old.closed = True
        if self.open_bytes() + memory_estimate(len(text)) > self.MAX_OPEN_BYTES:
            return None
        doc = Document(uri, text, language, version)
        self._docs[uri] = doc
        return doc

    def open_bytes(self) -> int:
        return sum(memory_estimate(len(d.text)) for d in self._docs.values())

    def get(self, uri: str) -> Document | None:
        return self._docs.get(uri)

    def touch(self, uri: str) -> None:
        """The user edited `uri`: it becomes the most recent."""
        doc = self._docs.pop(uri, None)
        if doc is not None:
            self._docs[uri] = doc

    def visit(self, uri: str, line: int) -> bool:
        """The user looked at or yanked the code at `line` of `uri` (the editor client says so): it
        counts as recent code, as an edit there would. False if `uri` is not open."""
        doc = self._docs.get(uri)
        if doc is None:
            return False
        doc.recent_rows = _recent_rows(doc.recent_rows, max(0, min(line, doc.line_count - 1)))
        self.touch(uri)  # the user was in it: as recent as an edit
        return True

    def close(self, uri: str) -> None:
        doc = self._docs.pop(uri, None)
        if doc is not None:
            doc.closed = True
        if doc is not None and not doc.large:
            self._closed.pop(uri, None)
            self._closed[uri] = doc
            while len(self._closed) > self.RECENTLY_CLOSED:
                self._closed.pop(next(iter(self._closed)))

    def all(self) -> list[Document]:
        return list(self._docs.values())

    def memory(self) -> dict:
        """What the documents hold, for memosight/status's memory report."""
        return {"open": len(self._docs), "open_chars": sum(len(d.text) for d in self._docs.values()),
                "open_estimate_mb": round(self.open_bytes() / 2**20, 1), "recently_closed": len(self._closed),
                "recently_closed_chars": sum(len(d.text) for d in self._closed.values()),
                "parse_trees_cached": len(_PARSED_TREES)}

    def recent(self) -> list[Document]:
        """The open documents, most recently edited or opened first, then those closed lately."""
        return list(reversed(self._docs.values())) + list(reversed(self._closed.values()))
