from memosight.engine.request import StopRule
from memosight.engine.stops import apply_stop_rule, held_back


def test_single_line_cuts_at_newline():
    cut = apply_stop_rule("return a + b\n    pass", StopRule(single_line=True))
    assert (cut.text, cut.reason) == ("return a + b", "newline")


def test_never_repeats_the_rest_of_the_line():
    rule = StopRule(suffix_line="):")
    assert apply_stop_rule("self, name):", rule).text == "self, name"
    assert apply_stop_rule("self, name", rule).reason is None


def test_nested_closer_is_not_mistaken_for_the_suffix():
    rule = StopRule(suffix_line=")")
    assert apply_stop_rule("len(items)", rule).reason is None
    assert apply_stop_rule("len(items))", rule).text == "len(items)"


def test_multi_line_stops_before_the_next_line_after_the_cursor():
    rule = StopRule(next_suffix_line="    return total")
    cut = apply_stop_rule("for x in xs:\n        total += x\n    return total\n", rule)
    assert cut.text == "for x in xs:\n        total += x"
    assert cut.reason == "suffix"


def test_stop_strings():
    assert apply_stop_rule("abc\n\n\ndef", StopRule(stop_strings=("\n\n\n",))).text == "abc"


def test_streaming_holds_back_a_possible_suffix_start():
    rule = StopRule(suffix_line=")")
    assert held_back("foo(a", rule) == 0
    assert held_back("foo(a)", rule) == 1
    assert held_back("x ", StopRule()) == 1


def test_block_end_stops_at_the_first_dedented_line():
    rule = StopRule(block_indent=4)
    text = "\n        total = 0\n        return total\n    def other(self):\n"
    cut = apply_stop_rule(text, rule)
    assert cut.text == "\n        total = 0\n        return total"
    assert cut.reason == "block_end"


def test_multi_line_streaming_holds_back_what_a_rule_may_still_cut():
    rule = StopRule(suffix_line="):", next_suffix_line="    return x", block_indent=0)
    assert held_back("foo)", rule) == 1  # ")" may be the start of the rest of the line
    text = "a\n\n"
    assert held_back(text, rule) >= 2  # blank lines at the end are trimmed, never streamed
