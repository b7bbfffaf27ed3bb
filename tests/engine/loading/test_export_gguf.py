"""`memosight export gguf`: llama.cpp computes the same next-token logits from the file as
transformers from the model, token for token (the same ids in: its own tokenizer may split a few
words differently, see engine/loading/export_gguf.py)."""

import numpy as np
import pytest
import torch
from memosight.engine import load_engine
from memosight.engine.loading.export_gguf import export_gguf


def test_llama_cpp_reads_the_exported_model_as_transformers_computes_it(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is in the dev extras")
    engine = load_engine(runtime="torch")  # the weights are read from torch
    report = export_gguf(engine, tmp_path / "m.gguf")
    assert report["fim"] == "starcoder" and report["layers"] == engine.model.config.num_hidden_layers
    ids = engine.tokenizer.encode("import os\n\n\ndef read_lines(path):\n    with open(path) as f:\n", add_special_tokens=False)
    with torch.no_grad():
        expected = engine.model(input_ids=torch.tensor([ids])).logits[0].numpy()
    model = llama_cpp.Llama(str(tmp_path / "m.gguf"), n_ctx=256, logits_all=True, verbose=False, n_threads=1)
    model.eval(ids)
    got = np.array(model.scores[:len(ids)])
    assert (got.argmax(-1) == expected.argmax(-1)).all()
    assert np.abs(got - expected).max() < 1e-2 * np.abs(expected).max()
    vocab = engine.tokenizer.get_vocab()
    assert model.metadata["tokenizer.ggml.fim_pre_token_id"] == str(vocab["<fim_prefix>"])  # /infill's prompt
    assert model.metadata["tokenizer.ggml.fim_mid_token_id"] == str(vocab["<fim_middle>"])
    assert model.token_eos() == engine.tokenizer.eos_token_id
