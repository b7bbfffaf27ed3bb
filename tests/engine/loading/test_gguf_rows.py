"""Rows of a GGUF file's token matrices read alone, and its tensors found from the header alone."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is in the dev extras")


def test_the_header_alone_finds_every_tensor_where_gguf_reader_does(embedded_gguf):
    from gguf import GGUFReader
    from memosight.engine.loading.gguf import tensor_elements, tensor_infos

    infos = tensor_infos(embedded_gguf)
    tensors = GGUFReader(str(embedded_gguf)).tensors
    assert set(infos) == {t.name for t in tensors}
    for t in tensors:
        assert infos[t.name].start == t.data_offset and infos[t.name].kind == t.tensor_type
        assert list(infos[t.name].shape) == [int(n) for n in t.shape]
    assert tensor_elements(embedded_gguf) == sum(int(t.n_elements) for t in tensors)


def test_rows_are_the_models_own_and_give_llama_cpps_logits(embedded_gguf):
    from memosight.engine.loading.gguf_rows import GgufRows
    from memosight.engine import load_engine
    from memosight.engine.runtime.llamacpp import LlamaCppRuntime

    rows = GgufRows(embedded_gguf)
    model = load_engine(device="cpu", dtype="float32", runtime="torch").model  # the model the file was exported from
    ids = [0, 7, 1234, rows.vocab_size - 1]
    assert np.array_equal(rows.embedding_rows(ids), model.get_input_embeddings().weight[ids].detach().numpy())
    assert np.array_equal(rows.embedding(1234), rows.embedding_rows([1234])[0])
    runtime = LlamaCppRuntime(embedded_gguf, threads=1, n_ctx=256, hidden=True)
    try:
        hidden, logits = runtime.append(1234)
        assert hidden.shape == (rows.hidden_size,)
        # the final hidden state times the output rows: llama.cpp's logits, to float32 rounding
        assert np.allclose(rows.output_rows(range(rows.vocab_size)) @ hidden, logits, atol=1e-3)
    finally:
        runtime.close()
