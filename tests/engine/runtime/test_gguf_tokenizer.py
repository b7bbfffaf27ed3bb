"""A GGUF file's own tokenizer through llama.cpp: the same ids as the model's transformers tokenizer
for ordinary text, special tokens in a user's text kept as text, each token's bytes, FIM names."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is in the dev extras")


@pytest.fixture(scope="module")
def tokenizer(embedded_gguf):
    from memosight.engine.runtime.gguf_tokenizer import GgufTokenizer
    from memosight.engine.runtime.llamacpp import LlamaCppRuntime

    runtime = LlamaCppRuntime(embedded_gguf, threads=1, n_ctx=256)
    yield GgufTokenizer(runtime.L, runtime.vocab)
    runtime.close()


def test_text_round_trips_and_special_tokens_in_text_stay_text(tokenizer):
    text = "def add(a, b):\n    return a + b  # é😀\n"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    fim = tokenizer.get_vocab().get("<fim_prefix>")
    assert fim is not None and fim in tokenizer.special_ids
    assert fim not in tokenizer.encode("x = '<fim_prefix>'")  # a user's text never makes a control token
    assert tokenizer.decode([fim]) == "<fim_prefix>"  # written by name, as transformers decodes


def test_each_token_spells_its_bytes_and_special_tokens_none(tokenizer):
    pieces = tokenizer.pieces()
    assert len(pieces) == len(tokenizer)
    ids = tokenizer.encode("    return total")
    assert b"".join(pieces[i] for i in ids) == b"    return total"
    assert all(pieces[i] == b"" for i in tokenizer.special_ids)


def test_the_file_says_where_generation_ends(tokenizer):
    assert tokenizer.eos_token_id is not None and tokenizer.eos_token_id in tokenizer.end_ids
