"""Heads trained on the llama.cpp runtime's own hidden states: features from llama.cpp, the heads
saved where the engine looks for that file on that runtime, then found at load and fed the
runtime's hidden states, with the output still plain greedy decoding's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python is in the dev extras")

CODE = '''def read_lines(path):
    with open(path) as f:
        return [line.rstrip("\\n") for line in f]


def write_lines(path, lines):
    with open(path, "w") as f:
        for line in lines:
            f.write(line + "\\n")
'''


def test_llamacpp_features_are_the_runtimes_own_outputs(embedded_gguf):
    from memosight.engine.train.heads_base import llamacpp_base

    base = llamacpp_base(str(embedded_gguf), threads=1, seq_len=32)
    ids = base.engine.encode(CODE)[:32]
    hidden, greedy = base.outputs(torch.tensor([ids, ids[::-1]]))
    assert hidden.shape == (2, 32, base.hidden_size) and greedy.shape == (2, 32)
    runtime = base.engine.runtime  # the engine's own runtime, one token at a time
    runtime.clear()
    _, logits = runtime.prefill_hidden(ids)
    assert int(np.argmax(logits)) == int(greedy[0, -1])
    assert base.output_rows(torch.tensor([3, 5])).shape == (2, base.hidden_size)


def test_heads_trained_on_llamacpp_are_found_at_load_and_read_its_hidden_states(embedded_gguf, tmp_path,
                                                                               monkeypatch):
    from memosight.engine import load_engine
    from memosight.engine.runtime import llamacpp_kernels
    from memosight.engine.train.heads import HeadsTrainConfig, run_heads

    monkeypatch.setenv("MEMOSIGHT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(llamacpp_kernels, "PADDING_PAYS", 100.0)  # lossless whatever a busy machine's timings say
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(12):
        (corpus / f"m{i}.py").write_text(CODE.replace("lines", f"rows{i}") * 3)
    cfg = HeadsTrainConfig(num_heads=2, seq_len=64, batch=64, steps=4, warmup=1, max_windows=8, checkpoint_every=2,
                           bf16=False)
    report = run_heads(str(embedded_gguf), tmp_path / "run", cfg, corpus_specs=[str(corpus)], runtime="llamacpp",
                       threads=1, log=lambda line: None)
    assert report["runtime"] == "llamacpp" and report["steps"] == 4
    assert (tmp_path / "cache" / "heads" / "llamacpp").is_dir()

    engine = load_engine(str(embedded_gguf), runtime="llamacpp")
    heads = engine.speculator.drafter("heads")
    assert heads is not None and engine.runtime.with_hidden
    seen = []
    propose = heads.propose
    monkeypatch.setattr(heads, "propose", lambda state: seen.append(np.asarray(state.hidden).shape) or propose(state))
    ids = engine.encode(CODE * 2 + "def count_lines(path):\n    return len(read_lines(")
    plain = engine.generate(ids, 32, speculative=False)
    assert engine.generate(ids, 32, speculative=True) == plain
    assert seen and all(shape == (heads.heads.config.hidden_size,) for shape in seen)
