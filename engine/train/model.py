"""The MemoSight base model: a small Llama, its config and presets, built from scratch.

The rest of its training reads like nanoGPT's train.py, one job per module: data.py (the FIM
samples and packed windows), loop.py (the training loop, evaluation, a whole run), export.py (the
exported folder and its model card); optim.py and checkpoint.py are shared with the other trainers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


# ----------------------------------------------------------------------------- model config
@dataclass
class ModelConfig:
    vocab_size: int = 12_288  # must equal len(tokenizer)
    n_layer: int = 6  # transformer blocks
    n_head: int = 8  # query heads
    n_kv_head: int = 4  # key/value heads (grouped-query attention; fewer = smaller KV cache)
    n_embd: int = 256  # hidden size
    ffn_dim: int = 768  # SwiGLU inner size
    max_position_embeddings: int = 4096  # what the config allows; the model was trained on seq_len
    rope_theta: float = 10_000.0  # RoPE base
    eos_token_id: int = 0  # <|endoftext|>, also the padding token


PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(n_layer=2, n_head=2, n_kv_head=1, n_embd=32, ffn_dim=64),  # tests only
    "small": ModelConfig(),  # ~6M params with a 12k vocab: the shipped default on a 2-core CPU budget
    "base": ModelConfig(n_layer=8, n_head=8, n_kv_head=4, n_embd=384, ffn_dim=1024),
}


def llama_config(cfg: ModelConfig):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.n_embd,
        intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_kv_head,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        rms_norm_eps=1e-5,
        initializer_range=0.02,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.eos_token_id,
    )


def build_model(cfg: ModelConfig, seed: int = 0):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(cfg))
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.pad_token_id = cfg.eos_token_id
    model.generation_config.bos_token_id = None
    return model


def count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())  # tied embeddings are counted once
