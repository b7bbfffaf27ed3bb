"""Models of a known shape with random weights, for speed only (`bench speculative --shape`).

The GPU machine cannot fetch Qwen2.5-Coder's weights, and a tokens-per-second figure depends on the
shape, not on the values: the configs below are the published ones, the weights random (seed 0),
the tokenizer another model's (any with fewer ids than the shape's vocabulary). What such a model
writes means nothing, and drafts are rarely accepted: read plain decoding's rows only.
"""

from __future__ import annotations

from pathlib import Path

QWEN2 = dict(architectures=["Qwen2ForCausalLM"], hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000.0,
             max_position_embeddings=32768, tie_word_embeddings=True, vocab_size=151936)
SHAPES = {
    "qwen2.5-coder-0.5b": dict(QWEN2, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                               num_attention_heads=14, num_key_value_heads=2),
    "qwen2.5-coder-1.5b": dict(QWEN2, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                               num_attention_heads=12, num_key_value_heads=2),
}


def random_model(shape: str, tokenizer_source: str | None, folder: Path) -> Path:
    """`shape`'s model with random weights (bfloat16) and `tokenizer_source`'s tokenizer (default:
    the embedded model's), written to `folder` once."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: choose from {', '.join(SHAPES)}")
    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from ..loading.torch_load import default_model_dir

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source or str(default_model_dir()))
    if len(tokenizer) > SHAPES[shape]["vocab_size"]:
        raise ValueError(f"the tokenizer has {len(tokenizer)} ids, over the shape's {SHAPES[shape]['vocab_size']}")
    eos = tokenizer.eos_token_id
    config = Qwen2Config(**SHAPES[shape], bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # half the memory while it is made
    try:
        model = Qwen2ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = eos
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
