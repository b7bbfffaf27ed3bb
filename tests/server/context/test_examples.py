"""Training examples in the compressor's prompt format."""

import random

from memosight.server.context.examples import MIN_ROW, context_examples, cursor_cut
from memosight.server.documents import Document

from .test_packing import PIECES, python_module


def test_cursor_cut_removes_exactly_the_middle():
    lines = python_module(10).split("\n")
    rng = random.Random(3)
    for row in range(MIN_ROW, len(lines)):
        text, cursor, middle = cursor_cut(lines, row, rng)
        assert text[:cursor] + middle + text[cursor:] == "\n".join(lines)
        assert text[:cursor].count("\n") == row  # the cursor stays on its line
        assert "\n".join(lines[:row]) in text[:cursor]


def test_examples_are_packed_contexts_around_the_removed_text():
    docs = [Document(f"file:///pkg/m{i}.py", python_module(30 + i), "python") for i in range(3)]
    examples = list(context_examples(docs, PIECES, random.Random(0), per_file=6, truncated_share=0.5))
    assert len(examples) >= 12
    assert {e.compressed for e in examples} == {True, False}
    for e in examples:
        assert e.middle.strip()
        assert PIECES(e.prefix) + PIECES(e.suffix) <= 1024
        # The prompt stops where the middle starts: the cursor's line up to it, then the middle.
        assert any(e.prefix.split("\n")[-1] + e.middle in d.text for d in docs)
    # The compressor elides far code in these 200+-line files: the marker is in the prompt.
    assert any("# ..." in e.prefix for e in examples if e.compressed)
