"""An independent model of a text document as LSP defines it, and hypothesis strategies for
documents and edits with any characters. Written from the spec, not from documents.py: lines end at
"\\n", "\\r\\n" or "\\r" only; a column counts UTF-16 code units.

MEMOSIGHT_FUZZ_EXAMPLES sets how many examples each fuzz test tries (CI: the default; a long run:
e.g. MEMOSIGHT_FUZZ_EXAMPLES=2000)."""

from __future__ import annotations

import os

from hypothesis import strategies as st

from memosight.server.bench.lsp_text import LspText, units  # noqa: F401 - the tests' import of them

FUZZ_EXAMPLES = int(os.environ.get("MEMOSIGHT_FUZZ_EXAMPLES", "40"))

# Characters that other line-splitting rules (str.splitlines, Unicode) take for line breaks, astral
# characters (two UTF-16 units), a lone surrogate (which JSON can carry), and plain code.
PIECES = ["\n", "\r", "\r\n", "\x0c", "\x0b", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\t", " ",
          "é", "中", "😀", "𝔘", "\ud800", "\udfff", "\x00", "def f(x):", "    return x", "a", "b", "(", ")", "#"]


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
