"""engine/decoding/attention.py: what the lines above a row attend to, per earlier line."""

import pytest
from memosight.engine import load_engine

LINES = [f"def step_{i}(items):\n    return sum(items) * {i}" for i in range(12)]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return load_engine(str(tiny_model_dir), device="cpu", runtime="torch")


def test_shares_cover_the_lines_before_the_query_and_nothing_after_the_row(engine):
    text = "\n".join(LINES)
    row = 16
    first, shares = engine.line_attention(text, [row], query_lines=4)[row]
    assert first == 0 and len(shares) == row - 4  # the lines before the 4 query lines
    assert all(s >= 0 for s in shares) and 0 < sum(shares) <= 1 + 1e-5
    # Causal: what is at and below the row (the line being written) cannot change the figures.
    lines = text.split("\n")
    changed = "\n".join(lines[:row] + ["    raise SystemExit('other text')"] + lines[row + 1:])
    assert engine.line_attention(changed, [row], query_lines=4)[row] == (first, shares)
    assert engine.model.config._attn_implementation != "eager"  # restored after the pass


def test_a_short_window_starts_later_and_rows_without_lines_above_are_left_out(engine):
    text = "\n".join(LINES)
    first, shares = engine.line_attention(text, [20], query_lines=4, window_tokens=60)[20]
    assert first > 0 and first + len(shares) == 16
    assert engine.line_attention(text, [0, 3], query_lines=4) == {}  # no lines before the query
