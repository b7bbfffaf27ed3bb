"""The measurements of `memosight bench context` (context_measures.py), function by function: which
files are open and which project a file is in, what counts as code and as a far identifier, the
tallies and their paired loss difference, the next line under a context (a scripted engine), the
variants asked for, recall, needles and prefix stability while typing."""

from __future__ import annotations

import argparse
import os
import random
from pathlib import Path

import pytest

from memosight.server.commands.common import CommandError
from memosight.server.bench.context_measures import (
    FAR_LINES,
    PROXY_TOKEN,
    Tally,
    _category,
    _correct_prefix,
    _far_identifiers,
    _is_code,
    _length_group,
    _next_line,
    _open_files,
    _recall,
    _variants,
    needle_figures,
    paired_loss_difference,
    project_root,
    recall_and_match,
    typing_stability,
)
from memosight.server.context.packed import PackedContext
from memosight.server.context.packing import CONTIGUOUS_NEAR, NEAR_PREFIX_SHARE
from memosight.server.context.regions import WEIGHTS, without
from memosight.server.documents import Document

WORDS = lambda text: len(text.split())  # noqa: E731 - a stand-in tokenizer whose counts are easy to follow
SAMPLE = (Path(__file__).parents[2] / "data" / "sample.py").read_text()


def doc(path: str, text: str = "", language: str = "python") -> Document:
    return Document(f"file://{path}", text, language)


def test_open_files_are_the_package_siblings_of_the_same_language_imported_ones_first():
    main = doc("/p/pkg/main.py", "from helpers import x\nimport _private\n")
    files = [main, doc("/p/pkg/z_used.py"), doc("/p/pkg/helpers.py"), doc("/p/pkg/a_util.py"),
             doc("/p/pkg/_private.py"), doc("/p/pkg/style.js", language="javascript"), doc("/p/other/helpers.py")]
    # the leading underscore aside, `_private` is imported; then the rest by path; never itself
    assert [f.path for f in _open_files(main, files, 10)] == [
        "/p/pkg/_private.py", "/p/pkg/helpers.py", "/p/pkg/a_util.py", "/p/pkg/z_used.py"]
    assert [f.path for f in _open_files(main, files, 1)] == ["/p/pkg/_private.py"]


def test_a_files_project_is_the_corpus_folder_holding_it(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "attrs" / "src").mkdir(parents=True)
    (corpus / "attrs" / "src" / "x.py").write_text("")
    (corpus / "top.py").write_text("")
    (tmp_path / "outside.py").write_text("")
    os.symlink(tmp_path / "outside.py", corpus / "link.py")
    assert project_root(corpus, corpus / "attrs" / "src" / "x.py") == corpus / "attrs"
    assert project_root(corpus, corpus / "top.py") == corpus  # a file at the top: the corpus itself
    assert project_root(corpus, corpus / "link.py") == corpus  # a link out of the corpus


def test_comments_and_strings_are_not_code():
    text = '# a comment\nx = 1\ndef f():\n    """A docstring\n    of two lines.\n    """\n    return "a string"\n'
    tree = doc("/p/m.py", text).tree
    lines = text.split("\n")
    assert [_is_code(tree, row, lines[row]) for row in range(7)] == [False, True, True, False, False, False, True]


def test_far_identifiers_are_first_seen_more_than_far_lines_up_or_defined_in_another_file():
    lines = ["import os", "LIMIT = 3", "key = lambda v: v"] + ["x = 1"] * 40
    row = len(lines)
    true_line = "total = LIMIT + os.getpid() + helper(x, key=lambda v: v)"
    # total and getpid are new; helper comes from an open file; lambda is a Python keyword
    assert _far_identifiers(lines, row, true_line, "python", {"helper"}) == {"LIMIT", "os", "key", "v", "x", "helper"}
    assert "lambda" in _far_identifiers(lines, row, true_line, "javascript", set())
    # the same line FAR_LINES rows lower down: x was first seen only 30 lines up, no longer far
    assert "x" not in _far_identifiers(lines[:3 + FAR_LINES], 3 + FAR_LINES, true_line, "python", set())


def test_a_next_line_is_in_the_category_of_what_it_uses():
    assert _category("n = helper(LIMIT)", {"LIMIT"}, {"helper"}, set()) == "other_file"
    # a name this file defines too is not the other file's
    assert _category("n = helper(LIMIT)", {"LIMIT"}, {"helper"}, {"helper"}) == "far"
    assert _category("n = helper(LIMIT)", set(), {"helper"}, {"helper"}) == "near"


def test_files_are_grouped_by_length_at_300_and_600_lines():
    assert [_length_group(n) for n in (10, 299, 300, 599, 600, 5000)] == [
        "lines<300", "lines<300", "lines300-599", "lines300-599", "lines600+", "lines600+"]


def test_correct_prefixes():
    # indentation aside: the characters right before the first wrong one
    assert _correct_prefix("  return x + 2\n", "    return x + 1") == len("return x + ")
    assert _correct_prefix("return x + 1", "    return x + 1") == len("return x + 1")


def result(file, nats, tokens, prompt_tokens, true_chars, **generated) -> dict:
    return {"file": file, "nats": nats, "tokens": tokens, "prompt_tokens": prompt_tokens, "true_chars": true_chars,
            **generated}


def test_a_tally_adds_up_losses_and_the_generated_lines_figures():
    tally = Tally()
    tally.add(result("a.py", 2.0, 4, 100, 10, hit=True, chars=10, ms=30.0, first_token_ms=5.0))
    tally.add(result("b.py", 6.0, 4, 120, 10, hit=False, chars=3, ms=50.0, first_token_ms=7.0))
    tally.add(result("b.py", 0.0, 2, 90, 5, hit=False, chars=0, ms=10.0, first_token_ms=2.0))
    assert tally.to_json() == {"positions": 3, "line_loss": 0.8,  # 8 nats over 10 tokens
                               "prompt_tokens_p50": 100, "exact_match": 0.3333, "exact_lines": 1, "prefix_chars": 13,
                               "prefix_chars_share": 0.52, "first_request_ms_p50": 30.0, "first_token_ms_p50": 5.0}
    assert tally.losses == [("a.py", 2.0, 4), ("b.py", 6.0, 4), ("b.py", 0.0, 2)]
    only_loss = Tally()
    only_loss.add(result("a.py", 3.0, 6, 50, 10))  # --no-generate: the loss alone
    assert only_loss.to_json() == {"positions": 1, "line_loss": 0.5, "prompt_tokens_p50": 50}
    assert Tally().to_json() == {"positions": 0, "line_loss": None, "prompt_tokens_p50": None}


def tally_of(losses) -> Tally:
    tally = Tally()
    for file, nats, tokens in losses:
        tally.add(result(file, nats, tokens, 10, 10))
    return tally


def test_the_paired_loss_difference_resamples_files_not_cursors():
    base = tally_of([("a.py", 1.0, 2), ("a.py", 2.0, 2), ("b.py", 1.0, 4)])
    other = tally_of([("a.py", 0.5, 2), ("a.py", 1.5, 2), ("b.py", 1.0, 4)])
    out = paired_loss_difference(base, other)
    # a.py: 1 nat fewer over 4 tokens; b.py: the same over 4: -1/8 per token in all
    assert out["loss_minus_packed"] == -0.125
    low, high = out["ci95"]
    # a resample is a.py twice (-0.25), b.py twice (0) or one of each (-0.125): the interval spans them
    assert (low, high) == (-0.25, 0.0)
    assert paired_loss_difference(base, other) == out  # seeded: the same figures every run
    assert paired_loss_difference(Tally(), Tally()) == {}
    with pytest.raises(AssertionError, match="same cursors"):
        paired_loss_difference(base, tally_of([("c.py", 1.0, 2), ("a.py", 2.0, 2), ("b.py", 1.0, 4)]))
    with pytest.raises(ValueError):  # not the same number of cursors
        paired_loss_difference(base, tally_of([("a.py", 1.0, 2)]))


def test_recall_is_a_share_of_the_total_with_the_ratio_of_the_two_contexts():
    assert _recall("far_only_", {"compressed": 3, "truncated": 2}, 4) == {
        "far_only_recall_compressed": 0.75, "far_only_recall_truncated": 0.5, "far_only_recall_ratio": 1.5}
    assert _recall("", {"compressed": 0, "truncated": 0}, 0) == {
        "recall_compressed": None, "recall_truncated": None, "recall_ratio": None}


def test_the_next_line_is_its_loss_and_the_models_greedy_line_asked_cold(scripted_engine):
    class Engine(scripted_engine):
        def continuation_loss(self, prefix, suffix, line):
            self.scored = (prefix, suffix, line)
            return 3.5, 7

    context = PackedContext("def f(x):\n    ", "\n\nprint(f(1))\n", 9)
    engine = Engine("return x + 2\nmore", repeat=False)
    out = _next_line(engine, context, "    return x + 1", generate=True)
    assert engine.scored == (context.prefix, context.suffix, "    return x + 1")
    (request,) = engine.requests
    assert (request.prefix, request.suffix, request.max_new_tokens) == (context.prefix, context.suffix, 48)
    assert request.stop.single_line and request.options.cold  # one line, the whole prompt prefilled
    assert {k: v for k, v in out.items() if k not in ("ms", "first_token_ms")} == {
        "nats": 3.5, "tokens": 7, "prompt_tokens": 9, "true_chars": 12, "hit": False, "chars": 11,
        "text": "return x + 2"}
    assert out["ms"] >= out["first_token_ms"] >= 0

    right = _next_line(Engine("return x + 1\n", repeat=False), context, "    return x + 1", generate=True)
    assert right["hit"] is True and right["chars"] == 12  # indentation aside, the whole line
    quiet = Engine("x")
    assert set(_next_line(quiet, context, "    return x + 1", generate=False)) == {
        "nats", "tokens", "prompt_tokens", "true_chars"} and quiet.requests == []


def test_variants_set_weights_shares_and_contiguity_and_unknown_keys_are_named():
    args = argparse.Namespace(ablate=["docstrings"], variant=["wide:contiguous=0,near_prefix_share=0.5,used_body=2.5",
                                                              "fim:suffix_share=0.4", "on:contiguous=1",
                                                              "off:contiguous=False", "no:contiguous=no",
                                                              "s32:suffix_tokens=32"], suffix_share=0.25)
    compressors, shares = _variants(args, None, 512)
    assert list(compressors) == ["compressed", "compressed_no_docstrings", "wide", "fim", "on", "off", "no", "s32"]
    assert compressors["off"].contiguous_near is False and compressors["no"].contiguous_near is False
    assert compressors["compressed"].weights is None  # the default weights
    assert compressors["compressed_no_docstrings"].weights == without(["docstrings"])
    wide = compressors["wide"]
    assert (wide.near_prefix_share, wide.contiguous_near, wide.attention) == (0.5, False, None)
    assert wide.weights == {**WEIGHTS, "used_body": 2.5}
    assert (compressors["fim"].near_prefix_share, compressors["fim"].contiguous_near) == (NEAR_PREFIX_SHARE,
                                                                                          CONTIGUOUS_NEAR)
    assert compressors["on"].contiguous_near is True
    assert shares.pop("fim") == 0.4
    assert int(512 * shares.pop("s32")) == 32  # the server's bound, as a share of this budget
    assert shares == {}  # only the variants that set their own
    for spec, message in (("v:speed=3", "unknown key 'speed'"), ("a:attention=256", "attention needs a model")):
        with pytest.raises(CommandError, match=message):
            _variants(argparse.Namespace(ablate=[], variant=[spec]), None, 512)


def test_an_attention_variant_asks_the_model_once_per_text_and_row():
    class Engine:
        def __init__(self):
            self.asked = []

        def line_attention(self, text, rows, window_tokens):
            self.asked.append((text, rows, window_tokens))
            return {rows[0]: (rows[0], [0.5])}

    engine = Engine()
    compressors, _ = _variants(argparse.Namespace(ablate=[], variant=["att:attention=256"]), engine, 512)
    attended = compressors["att"].attention
    assert attended("a = 1\nb = 2\n", 1) == (1, [0.5])
    assert attended("a = 1\nb = 2\n", 1) == (1, [0.5])  # remembered: the model is not asked again
    assert attended("a = 1\nb = 2\n", 0) == (0, [0.5])
    assert engine.asked == [("a = 1\nb = 2\n", [1], 256), ("a = 1\nb = 2\n", [0], 256)]


def test_recall_and_match_counts_the_far_names_at_each_cursor_and_forgets_the_rows_it_drew(tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    # rows 40..49 use `value`, first seen at row 1; row 50 also LIMIT, seen only at row 0
    main_text = "LIMIT = 7\n" + "value = 1\n" * 49 + "total = LIMIT + value\n"
    (project / "main.py").write_text(main_text)
    (project / "helpers.py").write_text("def helper():\n    return 1\n")
    files = [Document(p.resolve().as_uri(), p.read_text(), "python") for p in sorted(project.iterdir())]
    args = argparse.Namespace(max_positions=100, ablate=[], variant=[], open_files=3, corpus=str(tmp_path),
                              suffix_share=0.25, em_positions=0, cursors_out=None)
    out = recall_and_match(files, args, WORDS, None, random.Random(0), 64)
    # the cursors: rows FAR_LINES + 10 = 40 to 50, each line code of 4 characters or more
    assert out["positions"] == 11
    # far: `value` at each cursor (10 + 1), LIMIT at row 50; far only (absent from the 30 lines above): LIMIT
    assert (out["far_identifiers"], out["far_only_identifiers"], out["origin_identifiers"]) == (12, 1, 12)
    # 64 words of plain truncation reach some 16 lines up: never LIMIT's line
    assert out["recall_truncated"] == round(11 / 12, 4) and out["far_only_recall_truncated"] == 0.0
    assert out["origin_recall_truncated"] == round(11 / 12, 4)
    assert round(11 / 12, 4) <= out["recall_compressed"] <= 1.0
    assert "next_line" not in out and "em_positions" not in out  # no model: no next-line figures
    # the open file's row drawn for a cursor stood for that cursor's editor only
    assert all(f.recent_rows == () for f in files)
    assert recall_and_match(files, argparse.Namespace(**{**vars(args), "max_positions": 4}), WORDS, None,
                            random.Random(0), 64)["positions"] == 4


def test_needles_far_up_the_file_and_in_another_open_file_are_found():
    args = argparse.Namespace(budget=256, suffix_share=0.25, open_files=3)
    files = [doc("/p/pkg/sample.py", SAMPLE), doc("/p/pkg/app.js", "function f() {}\n", "javascript")]
    # two cases per Python file (the constant, the helper); other languages have none
    assert needle_figures(files, args, WORDS) == {"needle_cases": 2, "needle_found": 2}
    assert needle_figures(files[1:], args, WORDS) == {"needle_cases": 0, "needle_found": 0}


def test_typing_stability_types_six_lines_of_the_longest_python_file():
    body = "".join(f"def step_{i}(items):\n    total = 0\n    for item in items:\n"
                   f"        total += item * {i} + offset_{i}\n    return total\n\n\n" for i in range(10, 50))
    files = [doc("/p/short.py", "x = 1\n"), doc("/p/long.py", body), doc("/p/big.js", body * 2, "javascript")]
    args = argparse.Namespace(budget=128, suffix_share=0.25, seed=0)
    out = typing_stability(files, args, WORDS, PROXY_TOKEN.findall)
    typed = len("total += item * 10 + offset_10")  # every line that can be drawn is this long
    assert out["typing_keystrokes"] == 6 * typed and out["file_lines"] == body.count("\n") + 1
    # the packed prompt keeps more of its start from one key to the next than a window sliding over the text
    assert 0 <= out["stability_truncated"] < out["stability_compressed"] <= 1
    assert 0 < out["build_ms_p50"] <= out["build_ms_p95"] and 0 < out["build_cold_ms_p50"] <= out["build_cold_ms_max"]
    # nothing to type: no Python file, or none with an indented line past row 200
    assert typing_stability(files[2:], args, WORDS, PROXY_TOKEN.findall) == {}
    assert typing_stability(files[:1], args, WORDS, PROXY_TOKEN.findall) == {}
