"""Shared fixtures: tiny models built from a config (no download), saved to a temporary folder."""

from __future__ import annotations

import os
import sys
import time
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
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

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


def build_tiny_gguf(path: Path, model_dir: Path) -> Path:
    """The tiny Llama at `model_dir` written as a GGUF file, the way llama.cpp's converter writes
    one: llama.* hyperparameters, the byte-level BPE tokenizer, q/k rows in llama.cpp's order."""
    import json

    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir)
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    tokens = sorted(tokenizer.get_vocab(), key=tokenizer.get_vocab().get)
    writer.add_token_list(tokens)
    special = set(tokenizer.all_special_ids)
    writer.add_token_types([3 if i in special else 1 for i in range(len(tokens))])  # 3: control
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(tokenizer.eos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)

    def llama_cpp_order(w, heads: int):  # the rotary halves interleaved, as llama.cpp stores q and k
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for key, value in model.state_dict().items():
        weight = value.detach().float()
        if key == "model.embed_tokens.weight":
            name = "token_embd.weight"
        elif key == "model.norm.weight":
            name = "output_norm.weight"
        elif key == "lm_head.weight":
            name = "output.weight"
        else:
            layer, rest = key.split(".")[2], ".".join(key.split(".")[3:-1])
            name = f"blk.{layer}.{names[rest]}.weight"
            if rest == "self_attn.q_proj":
                weight = llama_cpp_order(weight, cfg.num_attention_heads)
            elif rest == "self_attn.k_proj":
                weight = llama_cpp_order(weight, cfg.num_key_value_heads)
        writer.add_tensor(name, weight.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory, tiny_model_dir) -> Path:
    return build_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.Q0.gguf", tiny_model_dir)


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


# --- real llama.cpp servers, serving the embedded model exported to GGUF ----------------------------

@pytest.fixture(scope="session")
def embedded_gguf(tmp_path_factory) -> Path:
    """The embedded model written by `memosight export gguf`."""
    from memosight.server.cli import main

    model = tmp_path_factory.mktemp("gguf") / "memosight.gguf"
    assert main(["export", "gguf", "--out", str(model)]) == 0
    return model


def _serve(command: list[str], ready_url: str, log_path: Path):
    """Start a server process, wait until `ready_url` answers; returns the process and its log file."""
    import subprocess
    import urllib.request

    log = open(log_path, "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(ready_url, timeout=1)
            return process, log
        except OSError:
            assert process.poll() is None, log_path.read_text()[-2000:]
            assert time.monotonic() < deadline, f"{command[0]} did not start"
            time.sleep(0.3)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def llama_server(embedded_gguf):
    """llama-cpp-python's server (OpenAI endpoints; a dev dependency): (its /v1 URL, its log)."""
    pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] is in the dev extras")
    port, log_path = _free_port(), embedded_gguf.parent / "llama-cpp-python.log"
    url = f"http://127.0.0.1:{port}/v1"
    process, log = _serve([sys.executable, "-m", "llama_cpp.server", "--model", str(embedded_gguf), "--port", str(port),
                           "--n_ctx", "2048", "--n_threads", "1"], f"{url}/models", log_path)
    yield url, log_path
    process.terminate()
    process.wait(10)
    log.close()


@pytest.fixture(scope="session")
def llama_cpp_server(embedded_gguf):
    """llama.cpp's own `llama-server` (it serves /infill): $MEMOSIGHT_LLAMA_SERVER or `llama-server` on
    the PATH; no wheel ships it, so the tests that need it skip where it was not built (the README
    says how). (its base URL, its log)."""
    import shutil

    binary = os.environ.get("MEMOSIGHT_LLAMA_SERVER") or shutil.which("llama-server")
    if not binary:
        pytest.skip("llama.cpp's llama-server is not built here (set MEMOSIGHT_LLAMA_SERVER to it)")
    port, log_path = _free_port(), embedded_gguf.parent / "llama-server.log"
    url = f"http://127.0.0.1:{port}"
    process, log = _serve([binary, "-m", str(embedded_gguf), "--port", str(port), "-c", "2048", "-t", "1",
                           "-np", "1"], f"{url}/health", log_path)
    yield url, log_path
    process.terminate()
    process.wait(10)
    log.close()
