"""Where a completion ends: single line or block, the stop rule, the token limit."""

from memosight.server.config import Settings
from memosight.server.documents import Document
from memosight.server.request.mode import SINGLE_LINE_MAX_TOKENS, completion_ending


def mode_at(text: str, marker: str = "|", language: str = "python", multiline: str = "auto"):
    cursor = text.index(marker)
    doc = Document("file:///a.py", text.replace(marker, ""), language)
    ending = completion_ending(doc, cursor, Settings(multiline=multiline))
    return ending.stop, ending.multiline


def test_mid_line_is_single_line_and_never_repeats_the_rest_of_the_line():
    rule, multiline = mode_at("print(ite|)\n")
    assert not multiline and rule.single_line and rule.suffix_line == ")"


def test_after_a_block_opener_is_multi_line_to_the_end_of_the_block():
    rule, multiline = mode_at("class A:\n    def f(self):|\n\n    def g(self):\n        pass\n")
    assert multiline and not rule.single_line
    assert rule.block_indent == 4
    assert rule.next_suffix_line == "    def g(self):"


def test_blank_line_below_an_opener_is_multi_line():
    _, multiline = mode_at("def f(x):\n    |\n")
    assert multiline


def test_braces_open_blocks_in_other_languages():
    _, multiline = mode_at("function f(x) {|\n}\n", language="javascript")
    assert multiline


def test_multiline_setting_overrides_auto():
    assert mode_at("def f(x):|\n", multiline="never")[1] is False
    assert mode_at("x = |\n", multiline="always")[1] is True


def test_a_single_line_gets_fewer_tokens_than_a_block():
    doc = Document("file:///a.py", "x = \ndef f(x):\n", "python")
    line = completion_ending(doc, 4, Settings(max_new_tokens=64))
    block = completion_ending(doc, len(doc.text) - 1, Settings(max_new_tokens=64))
    assert (line.multiline, line.max_new_tokens) == (False, SINGLE_LINE_MAX_TOKENS)
    assert (block.multiline, block.max_new_tokens) == (True, 64)


def test_multi_line_completions_carry_the_latency_budget():
    text = "def f(x):\n    \n"
    doc = Document("file:///a.py", text, "python")
    block = completion_ending(doc, len("def f(x):\n    "), Settings(latency_budget_ms=90))
    assert block.multiline and block.stop.time_budget_ms == 90
    line = completion_ending(doc, len("def f("), Settings(latency_budget_ms=90))
    assert not line.multiline and line.stop.single_line


def test_whitespace_before_the_cursor_is_not_suggested_again():
    rule, _ = mode_at("def f(x):\n    |\n")  # after the indentation: multi-line, block below the opener
    assert rule.after_whitespace
    assert mode_at("x = |1\n")[0].after_whitespace
    assert not mode_at("x =|\n")[0].after_whitespace  # " 1" is right here
    assert not mode_at("def f(x):\n    return 1\n|")[0].after_whitespace  # column 0: the indentation is wanted
