"""Where the near window around the cursor lies: the rows of the outermost function around it, and
whether the code at the cursor fails to parse; read from the tree-sitter tree.

The compressor keeps the near window whole (the cursor's own function, from its start) and chooses
far code around it; ContextCompressor._window decides the window from what these functions find.
"""

from __future__ import annotations

from .. import languages


class Rows:
    """String offsets of rows (tree-sitter's: lines ending at "\\n") near the cursor, found by
    scanning from it, so that a keystroke never pays for the whole file's line table."""

    def __init__(self, text: str, cursor: int):
        self.text, self.cursor = text, cursor
        self.cursor_row = text.count("\n", 0, cursor)
        self._offsets = {self.cursor_row: text.rfind("\n", 0, cursor) + 1}

    def offset(self, row: int) -> int:
        """Where `row` starts; rows past the end are the end of the text."""
        if row in self._offsets:
            return self._offsets[row]
        known = min(self._offsets, key=lambda r: abs(r - row))
        at = self._offsets[known]
        text = self.text
        while known > row:
            at = text.rfind("\n", 0, at - 1) + 1
            known -= 1
            self._offsets[known] = at
        while known < row:
            nl = text.find("\n", at)
            if nl < 0:
                return len(text)
            at, known = nl + 1, known + 1
            self._offsets[known] = at
        return at


def function_rows(language: str, text: str, tree, cursor: int, cursor_row: int) -> tuple[int | None, int | None]:
    """First and last rows of the outermost function-like definition around the cursor (its
    decorators and `export` included), or (None, None) outside any function."""
    spec = languages.spec_for(language)
    outer = _outermost_function(tree, _byte_at(text, cursor), spec.function_types, None)
    if outer is None and cursor > 0 and text[cursor - 1] not in "\r\n":
        # at the end of a function's last line: the byte at the cursor (the newline) is outside its node
        outer = _outermost_function(tree, _byte_at(text, cursor - 1), spec.function_types, None)
    if outer is None and language == "python":
        # A blank line below a function's last statement is still inside it when indented past its `def`.
        line_start = text.rfind("\n", 0, cursor) + 1
        line = text[line_start:cursor]
        before = text[:line_start].rstrip()
        if before and not line.strip() and line:
            outer = _outermost_function(tree, _byte_at(text, len(before) - 1), spec.function_types, len(line))
    if outer is None:
        return None, None
    if outer.parent is not None and outer.parent.type in spec.wrappers:
        outer = outer.parent
    return outer.start_point[0], max(outer.end_point[0], cursor_row)


def error_near(tree, text: str, cursor: int) -> bool:
    """Whether the top-level statement at the cursor (or just before it) fails to parse."""
    root = tree.root_node
    if not root.has_error:
        return False
    for offset in (cursor, max(0, len(text[:cursor].rstrip()) - 1)):
        node = root.descendant_for_byte_range(_byte_at(text, offset), _byte_at(text, offset))
        while node is not None and node.parent is not None and node.parent != root:
            node = node.parent
        if node is not None and (node.has_error or node.is_error):
            return True
    return False


def _byte_at(text: str, offset: int) -> int:
    return offset if text.isascii() else len(text[:offset].encode("utf-8", "surrogatepass"))


def _outermost_function(tree, at: int, function_types: tuple[str, ...], below_column: int | None):
    node = tree.root_node.descendant_for_byte_range(at, at)
    outer = None
    while node is not None:
        if node.type in function_types and (below_column is None or node.start_point[1] < below_column):
            outer = node
        node = node.parent
    return outer
