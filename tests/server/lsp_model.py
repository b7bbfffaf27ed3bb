"""An independent model of a text document as LSP defines it, and hypothesis strategies for
documents and edits with any characters. Written from the spec, not from documents.py: lines end at
"\\n", "\\r\\n" or "\\r" only; a column counts UTF-16 code units.

MEMOSIGHT_FUZZ_EXAMPLES sets how many examples each fuzz test tries (CI: the default; a long run:
e.g. MEMOSIGHT_FUZZ_EXAMPLES=2000)."""

from __future__ import annotations

import os

from hypothesis import strategies as st

FUZZ_EXAMPLES = int(os.environ.get("MEMOSIGHT_FUZZ_EXAMPLES", "40"))

# Characters that other line-splitting rules (str.splitlines, Unicode) take for line breaks, astral
# characters (two UTF-16 units), a lone surrogate (which JSON can carry), and plain code.
PIECES = ["\n", "\r", "\r\n", "\x0c", "\x0b", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\t", " ",
          "é", "中", "😀", "𝔘", "\ud800", "\udfff", "\x00", "def f(x):", "    return x", "a", "b", "(", ")", "#"]


def units(ch: str) -> int:
    return 2 if ord(ch) > 0xFFFF else 1


class LspText:
    def __init__(self, text: str) -> None:
        self.text = text

    def lines(self) -> list[tuple[int, str]]:
        """(offset, content without its line break) of every line."""
        out, start, i, text = [], 0, 0, self.text
        while i < len(text):
            if text[i] == "\r" and i + 1 < len(text) and text[i + 1] == "\n":
                out.append((start, text[start:i]))
                i += 2
                start = i
            elif text[i] in "\r\n":
                out.append((start, text[start:i]))
                i += 1
                start = i
            else:
                i += 1
        out.append((start, text[start:]))
        return out

    def line_starts(self) -> list[int]:
        return [start for start, _ in self.lines()]

    def line_count(self) -> int:
        return len(self.lines())

    def offset(self, line: int, character: int) -> int:
        start, content = self.lines()[line]
        count = 0
        for i, ch in enumerate(content):
            if count >= character:
                return start + i
            count += units(ch)
        return start + len(content)

    def position(self, line: int, index: int) -> tuple[int, int]:
        """The LSP position of the `index`-th character of `line`."""
        _, content = self.lines()[line]
        return line, sum(units(ch) for ch in content[:index])

    def apply(self, start: tuple[int, int], end: tuple[int, int], new_text: str) -> None:
        a, b = self.offset(*start), self.offset(*end)
        self.text = self.text[:a] + new_text + self.text[b:]


class edits:
    """Strategies: documents() for a text, change(model) for one valid edit of it."""

    @staticmethod
    def documents(max_pieces: int = 40):
        return st.lists(st.sampled_from(PIECES) | st.text(max_size=3), max_size=max_pieces).map("".join)

    @staticmethod
    @st.composite
    def change(draw, model: LspText):
        lines = model.lines()

        def position():
            line = draw(st.integers(0, len(lines) - 1))
            return model.position(line, draw(st.integers(0, len(lines[line][1]))))
        start, end = sorted([position(), position()])
        return start, end, draw(edits.documents(max_pieces=6))
