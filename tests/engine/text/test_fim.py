"""FIM templates detected from a tokenizer's vocabulary, rendered by id."""

import pytest
from memosight.engine.text.fim import PLAIN, detect_template, end_token_ids, render_ids

STYLES = {
    "starcoder": ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<|endoftext|>", "<file_sep>"],
    "qwen": ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|endoftext|>", "<|fim_pad|>"],
    "deepseek": ["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", "<｜end▁of▁sentence｜>"],
    "codellama": ["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"],
}


def vocab_of(tokens: list[str]) -> dict[str, int]:
    return {t: 100 + i for i, t in enumerate(tokens)}


def fake_encode(text: str) -> list[int]:
    return [ord(c) % 100 for c in text]


@pytest.mark.parametrize("style", sorted(STYLES))
def test_each_style_is_detected_and_rendered_prefix_suffix_middle(style):
    vocab = vocab_of(STYLES[style])
    template = detect_template(vocab)
    assert template.name == style
    ids = render_ids(template, fake_encode, vocab, "ab", "cd")
    pre, suf, mid = (vocab[t] for t in (template.prefix_token, template.suffix_token, template.middle_token))
    assert ids[0] == pre and ids[-1] == mid and suf in ids
    assert end_token_ids(template, vocab)  # the middle has an end besides EOS


def test_spm_puts_the_suffix_first():
    vocab = vocab_of(STYLES["starcoder"])
    template = detect_template(vocab)
    ids = render_ids(template, fake_encode, vocab, "ab", "cd", order="spm")
    assert ids == [vocab["<fim_prefix>"], vocab["<fim_suffix>"], *fake_encode("cd"), vocab["<fim_middle>"],
                   *fake_encode("ab")]


def test_a_model_without_fim_tokens_gets_the_plain_prefix():
    assert detect_template({"a": 1}) is PLAIN
    assert render_ids(PLAIN, fake_encode, {}, "ab", "cd", bos_id=7) == [7, *fake_encode("ab")]
