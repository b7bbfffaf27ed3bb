"""The quality benchmark's pieces: sampled lines and the greedy line completer."""

from __future__ import annotations

import random

from memosight.engine.bench import quality
from memosight.engine.protocol import CompletionRequest, RequestOptions, StopRule

CODE = "import os\n\n\ndef join(a, b):\n    return os.path.join(a, b)\n\n\nclass Box:\n    def __init__(self, x):\n        self.x = x\n"


def test_sampled_lines_put_the_cursor_after_the_indentation():
    samples = quality.sample_lines("m.py", CODE, per_file=10, rng=random.Random(0))
    by_line = {s.line: s for s in samples}
    assert by_line[5].target == "return os.path.join(a, b)" and by_line[5].prefix.endswith("\n    ")
    assert by_line[5].suffix.startswith("\n\n\nclass Box")
    for s in samples:
        assert s.prefix + s.target + s.suffix == CODE


def test_line_completer_is_greedy_until_the_line_ends(tiny_model_dir):
    import torch

    from memosight.engine import load_engine

    engine = load_engine(str(tiny_model_dir), device="cpu")
    completer = quality.LineCompleter(engine, prefix_tokens=64, suffix_tokens=16, max_new_tokens=12)
    prefix = "def join(a, b):\n    return"
    ids = engine.encode(prefix)
    expected = engine.model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
    text = engine.tokenizer.decode(expected)
    eos = engine.tokenizer.decode([engine.tokenizer.eos_token_id])
    assert completer.complete(prefix, heal=False) == text.split(eos)[0].split("\n")[0]
    # healed (the prompt backs up before "return"): what the engine's own healing gives for the
    # same cut and rule, so the completer passes the option through rather than dropping it
    healed = engine.stream(CompletionRequest(prefix, "", max_new_tokens=12, stop=StopRule(single_line=True),
                                             options=RequestOptions(heal=True, fim=False))).result().text
    assert completer.complete(prefix) == healed and "\n" not in healed


def test_correct_prefix_counts_matching_characters():
    assert quality.correct_prefix("return x + 1", "return x - 1") == 9 and quality.correct_prefix("", "x") == 0


def test_int8_is_read_against_float32_on_the_same_windows(tiny_model_dir, tmp_path):
    from memosight.engine import load_engine

    from ...conftest import SAMPLE_CODE

    (tmp_path / "a.py").write_text(SAMPLE_CODE)
    float32 = load_engine(str(tiny_model_dir), device="cpu")
    itself = quality.run_quality(str(tmp_path), float32, seq_len=64, lines_per_file=0, reference=float32)
    assert itself.agreement_with_reference == 1.0 and itself.reference_loss == itself.loss
    assert itself.reference_dtype == itself.dtype == "float32"
    int8 = load_engine(str(tiny_model_dir), device="cpu", dtype="int8")
    report = quality.run_quality(str(tmp_path), int8, seq_len=64, lines_per_file=0, reference=float32)
    assert report.dtype == "int8" and report.reference_bits_per_char == itself.bits_per_char
    assert 0.0 < report.agreement_with_reference <= 1.0
    assert "next token as float32's" in quality.format_table(report)
