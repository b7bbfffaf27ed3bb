import time

from memosight.engine.protocol import StopRule
from memosight.engine.text.stops import StreamState, apply_stop_rule, held_back, stream_pieces, stream_text


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


def _stream(pieces: list[str], stop, started: float, delay_s: float = 0.0):
    """stream_text over `pieces` as if each were a token, `delay_s` apart."""
    def tokens():
        for i in range(len(pieces)):
            time.sleep(delay_s)
            yield i

    state = StreamState(started=started)
    text = "".join(stream_text(tokens(), lambda ids: "".join(pieces[i] for i in ids), stop, set(), state))
    return text, state


def test_a_multi_line_completion_over_its_time_budget_ends_at_its_last_complete_line():
    pieces = ["    a = 1", "\n", "    b = ", "2", "\n", "    c = 3", "\n"]
    budget = StopRule(block_indent=0, time_budget_ms=1.0)
    text, state = _stream(pieces, budget, started=time.perf_counter() - 1.0)  # already over
    assert (text, state.stop_reason) == ("    a = 1", "time_budget")
    relaxed = StopRule(block_indent=0, time_budget_ms=60_000.0)
    text, state = _stream(pieces, relaxed, started=time.perf_counter())
    assert text == "    a = 1\n    b = 2\n    c = 3" and state.stop_reason == "max_tokens"  # no trailing blank
    # a single line over its budget ends where it got to (a line that never ends would run to the
    # cap); its budget counts from its first token, so a slow prefill alone does not cut it short
    generous = StopRule(single_line=True, time_budget_ms=500.0)  # far less than the second spent before
    text, state = _stream(["x = ", "compute(", "a, b", ")"], generous, started=time.perf_counter() - 1.0)
    assert (text, state.stop_reason) == ("x = compute(a, b)", "max_tokens")
    single = StopRule(single_line=True, time_budget_ms=8.0)
    text, state = _stream(["x = ", "compute(", "a, b", ")"], single, started=time.perf_counter(), delay_s=0.005)
    assert state.stop_reason == "time_budget" and text in ("x = compute(", "x = compute(a, b")
    text, state = _stream(pieces, StopRule(single_line=True, time_budget_ms=60_000.0), started=time.perf_counter())
    assert (text, state.stop_reason) == ("    a = 1", "newline")


def test_streamed_pieces_never_include_text_a_stop_rule_later_cuts():
    pieces = ["print(", "x", ")", ")", " # done"]
    text, state = _stream(pieces, StopRule(single_line=True, suffix_line=")"), started=time.perf_counter())
    assert (text, state.stop_reason) == ("print(x)", "suffix")  # the second ")" repeats the line's rest


def test_text_pieces_from_a_server_stop_at_the_first_newline_and_close_their_source():
    closed = []

    def server_pieces():
        try:
            yield from ["    return a", " + b\n", "\n", "def more():"]
        finally:
            closed.append(True)  # a remote stream closes its connection here

    state = StreamState()
    pieces = list(stream_pieces(server_pieces(), StopRule(single_line=True), state))
    assert "".join(pieces) == "    return a + b" == state.text
    assert state.stop_reason == "newline" and closed == [True] and state.tokens == 2


def test_a_completion_never_ends_in_blanks_and_none_is_ever_streamed():
    for rule in (StopRule(), StopRule(block_indent=0), StopRule(stop_strings=("\n\n\n",))):
        state = StreamState()
        pieces = list(stream_pieces(iter(["return x", "  \n", "\n  ", " "]), rule, state))
        assert "".join(pieces) == "return x" == state.text


def test_text_pieces_that_end_without_a_rule_are_all_kept():
    state = StreamState()
    assert "".join(stream_pieces(iter(["x = ", "1"]), StopRule(), state)) == "x = 1"
    assert state.stop_reason == "max_tokens"


def test_leading_whitespace_the_document_has_at_the_cursor_is_dropped_as_it_streams():
    rule = StopRule(single_line=True, after_whitespace=True)
    assert apply_stop_rule("    return x\n", rule).text == "return x"
    assert apply_stop_rule("\t return x", rule).text == "return x"
    assert apply_stop_rule(" return x", StopRule(single_line=True)).text == " return x"  # not asked: kept
    state = StreamState()
    pieces = list(stream_pieces(["  ", "  ret", "urn x", "\n  y"], rule, state))
    assert "".join(pieces) == "return x" and state.text == "return x"


def test_no_tokenizer_leaves_a_stray_space_after_an_indentation(tiny_models):
    # token healing cuts the indentation and lets the model choose a longer whitespace token first:
    # the rule removes what the document already has, whatever the tokenizer's whitespace tokens
    from memosight.engine import load_engine

    prefixes = ["def f(x):\n    ", "class A:\n    def g(self):\n        ", "if x:\n\t", "x = "]
    for arch, folder in tiny_models.items():
        engine = load_engine(str(folder))
        for prefix in prefixes:
            text = engine.complete(prefix, max_new_tokens=8, stop=StopRule(single_line=True, after_whitespace=True)).text
            assert not text.startswith((" ", "\t")), (arch, prefix, text)
        engine.close()
