"""The base model's training data: FIM samples, line-aligned chunks, packed windows."""

from __future__ import annotations

import random

from memosight.engine.train.data import epoch_windows, fim_split, pack_windows, sample_pieces, split_into_chunks


def test_fim_split_covers_the_text_and_sample_formats():
    text = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n"
    rng = random.Random(0)
    for _ in range(200):
        prefix, middle, suffix = fim_split(text, rng)
        assert prefix + middle + suffix == text
    assert sample_pieces(text, rng, fim_rate=0.0, spm_rate=0.0) == [text, "<|endoftext|>"]
    psm = sample_pieces(text, rng, fim_rate=1.0, spm_rate=0.0)
    assert psm[0] == "<fim_prefix>" and psm[2] == "<fim_suffix>" and psm[4] == "<fim_middle>"
    spm = sample_pieces(text, rng, fim_rate=1.0, spm_rate=1.0)
    assert spm[:2] == ["<fim_prefix>", "<fim_suffix>"] and spm[3] == "<fim_middle>"
    assert spm[4] + spm[2] == text  # prefix + middle, then the suffix


def test_chunks_are_line_aligned_and_windows_are_packed():
    text = "".join(f"line_{i} = {i}\n" for i in range(500))
    chunks = split_into_chunks(text, max_chars=1000)
    assert "".join(chunks) == text and all(c.endswith("\n") and len(c) <= 1000 for c in chunks)
    assert pack_windows(list(range(10)), 3).tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_an_epochs_windows_depend_only_on_seed_and_epoch(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = [f"def f{i}(x):\n    return x + {i}\n" * 3 for i in range(20)]
    first = epoch_windows(tokenizer, texts, 16, seed=1, epoch=0, fim_rate=0.5, spm_rate=0.5)
    assert first.shape[1] == 17  # seq_len + 1: inputs and their next tokens
    assert first.equal(epoch_windows(tokenizer, texts, 16, seed=1, epoch=0, fim_rate=0.5, spm_rate=0.5))
    assert not first.equal(epoch_windows(tokenizer, texts, 16, seed=1, epoch=1, fim_rate=0.5, spm_rate=0.5))
