"""Shared fixtures: tiny models built from a config (no download), saved to a temporary folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TESTS = Path(__file__).parent
SAMPLE_CODE = (TESTS / "data" / "sample.py").read_text()
FIM_TOKENS = ["<|endoftext|>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>"]


def build_tokenizer(folder: Path, fim: bool = True, vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = FIM_TOKENS if fim else ["<|endoftext|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([SAMPLE_CODE] * 3, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(folder)
    return fast


def build_tiny_model(folder: Path, arch: str = "llama", fim: bool = True, seed: int = 0) -> Path:
    """A randomly initialised model of `arch` with a small byte-level tokenizer, saved with save_pretrained."""
    import torch
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(folder, fim=fim)
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    torch.manual_seed(seed)
    if arch == "llama":
        config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                             bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
        model = LlamaForCausalLM(config)
    elif arch == "qwen2":
        config = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                             bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
        model = Qwen2ForCausalLM(config)
    elif arch == "gpt2":
        config = GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=4096,
                            bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
        model = GPT2LMHeadModel(config)
    else:
        raise ValueError(arch)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    return {arch: build_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}"), arch, fim=(arch != "gpt2"))
            for arch in ("llama", "qwen2", "gpt2")}


def build_repeater_model(folder: Path, token_text: str = "x") -> Path:
    """A GPT-2 whose final layer norm outputs a constant, so it emits `token_text` forever.

    Deterministic and never stops on its own: what cancellation and supersede tests need.
    """
    import torch

    build_tiny_model(folder, "gpt2", fim=False)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    (token,) = tokenizer.encode(token_text)
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(model.transformer.wte.weight[token] * 50)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def repeater_model_dir(tmp_path_factory) -> Path:
    return build_repeater_model(tmp_path_factory.mktemp("repeater"))


@pytest.fixture
def own_model_dir(tmp_path, tiny_model_dir) -> Path:
    """A private copy of the tiny model, for tests that write beside it (heads, n-gram tables)."""
    import shutil

    return Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))


@pytest.fixture
def code_corpus(tmp_path) -> Path:
    """A folder of a few distinct Python files (the sample with renamed classes)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"m{i}.py").write_text(SAMPLE_CODE.replace("Item", f"Item{i}"))
    return corpus
