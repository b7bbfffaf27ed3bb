"""Writing a Llama-family model as a GGUF file that llama.cpp serves (`memosight export gguf`).

Weights go as float32 (or float16) tensors under llama.cpp's names; the tokenizer (byte-level BPE:
tokens, merges, special tokens) and its FIM tokens go in the metadata, so llama.cpp's `/infill`
renders the model's own fill-in-the-middle prompt. Two conversions matter:
- llama.cpp applies rotary embeddings to interleaved pairs, transformers to the two halves of each
  head, so the q and k projections' rows are reordered to give the same attention;
- llama.cpp splits text with one of its built-in pre-tokenizer regexes, not the tokenizer.json's own;
  "gpt-2" is the closest to a byte-level BPE, so a model whose tokenizer splits differently (the
  embedded one joins `_` into words) sees a few words split otherwise on the server.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..protocol import EngineError
from ..text.fim import TEMPLATES

SUPPORTED = {"LlamaForCausalLM"}


def _interleave_rope_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a q/k projection from transformers' half-split rotary layout to llama.cpp's pairs."""
    out, cols = weight.shape
    return weight.reshape(heads, 2, out // heads // 2, cols).transpose(1, 2).reshape(out, cols)


def _tensors(model) -> dict[str, torch.Tensor]:
    c = model.config
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    if "lm_head.weight" in sd and not c.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    names = {"self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        out[f"blk.{i}.attn_q.weight"] = _interleave_rope_rows(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads)
        out[f"blk.{i}.attn_k.weight"] = _interleave_rope_rows(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads)
        out[f"blk.{i}.attn_v.weight"] = sd[p + "self_attn.v_proj.weight"]
        for hf, gg in names.items():
            out[f"blk.{i}.{gg}.weight"] = sd[p + hf + ".weight"]
    return out


def export_gguf(engine, out: Path, dtype: str = "float32") -> dict:
    """Write `engine.model` and its tokenizer to `out` (a .gguf file). Returns what was written."""
    import gguf

    model, tokenizer = engine.model, engine.tokenizer
    if model is None:
        raise EngineError("export gguf reads the weights from the torch runtime; load the model with runtime=\"torch\"")
    c = model.config
    if type(model).__name__ not in SUPPORTED or getattr(c, "attention_bias", False):
        raise EngineError(f"export gguf writes Llama models without attention bias; {type(model).__name__} is not one")
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    if spec["model"]["type"] != "BPE":
        raise EngineError("export gguf writes byte-level BPE tokenizers only")
    vocab = tokenizer.get_vocab()
    size = max(c.vocab_size, max(vocab.values()) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, i in vocab.items():
        tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for added in spec.get("added_tokens", []):
        types[added["id"]] = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges", [])]

    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(engine.name if isinstance(engine.name, str) else "memosight")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float((getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "float32" else gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    writer.add_eos_token_id(eos)
    writer.add_bos_token_id(tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos)
    writer.add_add_bos_token(tokenizer.bos_token_id is not None)
    writer.add_pad_token_id(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    fim = next((t for t in TEMPLATES if all(x in vocab for x in (t.prefix_token, t.suffix_token, t.middle_token))), None)
    if fim is not None:
        writer.add_uint32(gguf.Keys.Tokenizer.FIM_PRE_ID, vocab[fim.prefix_token])
        writer.add_uint32(gguf.Keys.Tokenizer.FIM_SUF_ID, vocab[fim.suffix_token])
        writer.add_uint32(gguf.Keys.Tokenizer.FIM_MID_ID, vocab[fim.middle_token])
        if "<file_sep>" in vocab:
            writer.add_uint32(gguf.Keys.Tokenizer.FIM_SEP_ID, vocab["<file_sep>"])
    np_dtype = np.float32 if dtype == "float32" else np.float16
    for name, tensor in _tensors(model).items():
        keep_f32 = tensor.ndim == 1  # norms stay float32, as llama.cpp expects
        writer.add_tensor(name, tensor.numpy().astype(np.float32 if keep_f32 else np_dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"path": str(out), "bytes": out.stat().st_size, "fim": fim.name if fim else None,
            "vocab": size, "layers": c.num_hidden_layers}
