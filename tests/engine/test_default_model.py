"""The embedded default model ships with the package, loads offline and completes code."""

from __future__ import annotations

from pathlib import Path

import torch

import memosight.engine.models as models

DEFAULT = Path(models.__file__).parent / "default"


def test_the_default_model_folder_is_complete_and_small():
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "README.md"):
        assert (DEFAULT / name).is_file(), name
    assert sum(f.stat().st_size for f in DEFAULT.rglob("*") if f.is_file()) <= 40 * 1024 * 1024
    card = (DEFAULT / "README.md").read_text()
    assert "PSF" in card and "Held-out evaluation" in card


def test_the_default_model_loads_offline_and_completes_a_fim_prompt():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(DEFAULT)
    model = AutoModelForCausalLM.from_pretrained(DEFAULT, dtype=torch.float32).eval()
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id is not None
    assert all(t in tokenizer.get_vocab() for t in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))

    prompt = "<fim_prefix>class Point:\n    def __init__(self, x, y):\n        self.x = x\n        <fim_suffix>\n<fim_middle>"
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    new_tokens = out[0, ids.shape[1]:]
    assert 0 < len(new_tokens) <= 8
    assert isinstance(tokenizer.decode(new_tokens), str)
