"""The benchmarks' shared pieces: which corpus files they read, where they put the cursor, and the
plain text tables they print."""

import random

import pytest

from memosight.engine.bench.common import cut_points, source_files, table

from ...conftest import SAMPLE_CODE


def test_source_files_are_big_enough_source_files_in_a_stable_order(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.rs").write_text("x" * 3000)
    (tmp_path / "a.py").write_text("x" * 2000)  # exactly the floor: kept
    (tmp_path / "sub" / "d.go").write_text("x" * 2500)
    (tmp_path / "notes.txt").write_text("x" * 3000)  # not source
    (tmp_path / "small.py").write_text("x" * 1999)  # too small to cut prompts from
    (tmp_path / "folder.py").mkdir()  # a folder that looks like a file
    assert source_files(tmp_path) == [tmp_path / "a.py", tmp_path / "b.rs", tmp_path / "sub" / "d.go"]
    assert source_files(tmp_path, max_files=2) == [tmp_path / "a.py", tmp_path / "b.rs"]
    assert tmp_path / "small.py" in source_files(tmp_path, min_chars=100)


def test_source_files_say_what_is_wrong_with_the_corpus(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        source_files(tmp_path / "missing")
    (tmp_path / "tiny.py").write_text("pass\n")
    with pytest.raises(FileNotFoundError, match="no source files of at least 2000 bytes"):
        source_files(tmp_path)


def test_cut_points_alternate_line_starts_after_the_indentation_and_mid_line_positions():
    # The first line takes the first 200 characters: no cursor goes there (no context before it).
    text = "# " + "x" * 250 + "\n" + "    a = 1\n" + "\n" + "b = 2\n"
    starts = {253 + 4, 253 + 10 + 1}  # "a" after its indentation, "b"; the blank line has none
    points = cut_points(text, 6, random.Random(0))
    assert len(points) == 6
    for i, p in enumerate(points):
        line_start = text.rfind("\n", 0, p) + 1
        line_end = text.index("\n", p)
        first = line_start + len(text[line_start:line_end]) - len(text[line_start:line_end].lstrip())
        if i % 2 == 0:
            assert p in starts
        else:  # somewhere on such a line, from its first character to its last
            assert first in starts and first <= p < line_end


def test_cut_points_are_reproducible_from_the_seed_and_none_in_a_short_text():
    a = cut_points(SAMPLE_CODE, 10, random.Random(3))
    assert a == cut_points(SAMPLE_CODE, 10, random.Random(3))
    assert len(a) == 10 and all(200 < p < len(SAMPLE_CODE) for p in a)
    assert all(not SAMPLE_CODE[p].isspace() for p in a[::2])  # line starts are after the indentation
    assert cut_points("def f():\n    return 1\n", 4, random.Random(0)) == []


def test_table_left_aligns_the_first_column_and_headers_right_aligns_figures():
    rows = [{"method": "plain", "tok": 12.345, "x": None}, {"method": "spec_all", "tok": 3.0, "x": 7}]
    assert table(rows, [("method", "method"), ("tok", "tok/s"), ("x", "x")]).split("\n") == [
        "method    tok/s  x",
        "--------  -----  -",
        "plain      12.3  -",  # 10 or more: one decimal; missing: "-"
        "spec_all  3.000  7",  # under 10: three decimals
    ]


def test_table_formats_negative_and_boolean_cells():
    out = table([{"a": -12.345, "b": True, "c": -0.5}], [("a", "a"), ("b", "b"), ("c", "c")])
    assert out.split("\n")[2] == "-12.3  True  -0.500"
