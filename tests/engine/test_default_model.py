"""The embedded default model ships with the package, loads offline and completes code."""

from __future__ import annotations

from pathlib import Path

import torch

import memosight.engine.models as models

from ..conftest import verify_everything

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
    # plain transformers, greedy in float32: the line the shipped model writes (as KNOWN_COMPLETIONS below)
    assert tokenizer.decode(new_tokens).split("\n")[0].strip() == "self.x = x"


# Greedy decoding in float32 on the CPU is deterministic: these are what the shipped model writes.
KNOWN_COMPLETIONS = [
    ("if __name__ == '__main__':\n    ", "\n", "unittest.main()"),
    ("    def name(self):\n        return self.", "\n", "name"),
    ("import sys\n\n\ndef main():\n    args = sys.argv[1:]\n    ", "\n", "if not isinstance(args, str):"),
    ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        ", "\n", "self.x = x"),
]


def test_the_default_model_writes_its_known_completions_with_and_without_speculation():
    from memosight.engine import load_engine

    engine = load_engine(device="cpu")
    verify_everything(engine.speculator)
    assert engine.name == "default" and engine.fim.has_fim
    for prefix, suffix, expected in KNOWN_COMPLETIONS:
        assert engine.complete(prefix, suffix, max_new_tokens=16, single_line=True).text == expected, prefix
        ids = engine.prompt_ids(prefix, suffix)
        assert engine.generate(ids, 24, speculative=True) == engine.generate(ids, 24, speculative=False)
    drafted = engine.speculator.to_json()["sources"]
    assert drafted and sum(s["accepted"] for s in drafted.values()) > 0  # the shipped draft files draft
