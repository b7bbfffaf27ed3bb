from memosight.server.bench.lsp_text import LspText


def test_lines_end_at_lf_crlf_or_cr_only():
    text = LspText("a\r\nb\rc\nd\u2028e")
    assert [content for _, content in text.lines()] == ["a", "b", "c", "d\u2028e"]
    assert text.line_starts() == [0, 3, 5, 7]


def test_a_column_counts_utf16_units_and_a_position_past_the_end_means_the_end():
    text = LspText("😀x\nab")
    assert text.offset(0, 2) == 1  # after the astral character: two UTF-16 units, one code point
    assert text.position(0, 1) == (0, 2)
    assert text.offset(0, 99) == 2 and text.offset(7, 0) == len("😀x\nab")


def test_an_edit_replaces_its_range():
    text = LspText("def f(x):\n    return x\n")
    text.apply((1, 11), (1, 12), "x + 1")
    assert text.text == "def f(x):\n    return x + 1\n"
