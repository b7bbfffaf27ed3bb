"""`memosight export gguf` (export_gguf.py): its arguments, a missing folder refused before any model
loads, and a tiny Llama written at the asked dtype, read back with gguf's own reader. What llama.cpp
computes from such a file is tests/engine/test_export_gguf.py's."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from memosight.server.commands import export_gguf
from memosight.server.commands.common import CommandError


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    export_gguf.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_arguments_default_to_the_embedded_model_in_float32_and_refuse_other_dtypes(capsys):
    args = parse(["--out", "m.gguf"])
    assert (args.out, args.model, args.dtype) == ("m.gguf", None, "float32")
    for argv in (["--out", "m.gguf", "--dtype", "int8"], ["--model", "x"]):  # not a dtype it writes; no --out
        with pytest.raises(SystemExit) as exit:
            parse(argv)
        assert exit.value.code == 2
    capsys.readouterr()


def test_an_out_folder_that_does_not_exist_is_refused_before_a_model_loads(tmp_path, monkeypatch):
    import memosight.engine as loading

    def never(*args, **kwargs):
        raise AssertionError("a model was loaded for an --out that cannot be written")

    monkeypatch.setattr(loading, "load_engine", never)
    out = tmp_path / "missing" / "m.gguf"
    with pytest.raises(CommandError, match="does not exist") as error:
        export_gguf.run(parse(["--out", str(out)]))
    assert repr(str(out)) in str(error.value)


def test_a_tiny_llama_is_written_in_float16_with_its_tokenizer_and_fim_tokens(tmp_path, tiny_model_dir, capsys):
    from gguf import GGMLQuantizationType, GGUFReader
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "tiny.gguf"
    assert export_gguf.run(parse(["--out", str(out), "--model", str(tiny_model_dir), "--dtype", "float16"])) == 0
    report = json.loads(capsys.readouterr().out)  # one JSON line on stdout: what was written
    vocab = AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    size = max(model.config.vocab_size, max(vocab.values()) + 1)
    assert report == {"path": str(out), "bytes": out.stat().st_size, "fim": "starcoder", "vocab": size,
                      "layers": model.config.num_hidden_layers}

    reader = GGUFReader(out)
    field = lambda key: reader.get_field(key).contents()  # noqa: E731
    assert field("general.architecture") == "llama"
    assert (field("llama.block_count"), field("llama.embedding_length")) == (2, 64)
    tokens = field("tokenizer.ggml.tokens")
    assert len(tokens) == size and all(tokens[i] == text for text, i in vocab.items())
    # /infill builds the model's own FIM prompt from these ids
    assert field("tokenizer.ggml.fim_pre_token_id") == vocab["<fim_prefix>"]
    assert field("tokenizer.ggml.fim_mid_token_id") == vocab["<fim_middle>"]

    tensors = {t.name: t for t in reader.tensors}
    assert not model.config.tie_word_embeddings  # so the output layer is a tensor of its own
    # embedding, final norm, output layer; 9 a layer (q, k, v, o, gate, up, down and the two norms)
    assert len(tensors) == 3 + 9 * model.config.num_hidden_layers and "blk.1.ffn_down.weight" in tensors
    # --dtype float16 reached the writer: matrices in float16, norms kept in float32 as llama.cpp expects
    assert {t.tensor_type for name, t in tensors.items() if len(t.shape) == 2} == {GGMLQuantizationType.F16}
    assert {t.tensor_type for name, t in tensors.items() if len(t.shape) == 1} == {GGMLQuantizationType.F32}
    embedding = model.model.embed_tokens.weight.detach().numpy()
    written = np.asarray(tensors["token_embd.weight"].data).reshape(embedding.shape)
    assert np.array_equal(written, embedding.astype(np.float16))  # the weights as loaded, in float16
    output = model.lm_head.weight.detach().numpy()
    assert np.array_equal(np.asarray(tensors["output.weight"].data).reshape(output.shape), output.astype(np.float16))
