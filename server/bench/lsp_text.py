"""An independent model of a text document as LSP defines it, written from the spec and not from
documents.py: lines end at "\\n", "\\r\\n" or "\\r" only; a column counts UTF-16 code units; a
position past a line's end means the line's end, past the last line the document's end (as editors
and the server read them). The fuzz harness and the tests check the server's text against it."""

from __future__ import annotations


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
        lines = self.lines()
        if line >= len(lines):
            return len(self.text)
        start, content = lines[line]
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
