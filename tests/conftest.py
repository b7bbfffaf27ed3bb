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


def verify_everything(speculator):
    """Drafting that does not depend on this machine's timing: every step drafts, no source is
    paused for its time, and every drafted node goes into the verification pass, whatever it costs
    here. For tests about what the sources draft; how much drafting pays is tested apart
    (tests/engine/test_sizing.py, the controller's tests in test_speculate.py)."""
    speculator.sizer.choose = lambda tree: list(range(len(tree)))
    speculator.controller.explore_every = 1
    speculator.controller.min_asks = 10**9
    return speculator


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
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

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
    """The tiny Llama at `model_dir` written as a GGUF file, by the project's own exporter (what
    llama.cpp's converter writes: llama.* hyperparameters, the BPE tokenizer, q/k rows reordered)."""
    from types import SimpleNamespace

    from memosight.engine.loading.export_gguf import export_gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = SimpleNamespace(model=AutoModelForCausalLM.from_pretrained(model_dir),
                            tokenizer=AutoTokenizer.from_pretrained(model_dir), name="tiny-llama")
    export_gguf(model, path)
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


@pytest.fixture(scope="session")
def llama_server(embedded_gguf):
    """llama-cpp-python's server (OpenAI endpoints; a dev dependency): (its /v1 URL, its log)."""
    pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python[server] is in the dev extras")
    from memosight.engine.bench.llama_server import free_port

    port, log_path = free_port(), embedded_gguf.parent / "llama-cpp-python.log"
    url = f"http://127.0.0.1:{port}/v1"
    process, log = _serve([sys.executable, "-m", "llama_cpp.server", "--model", str(embedded_gguf), "--port", str(port),
                           "--n_ctx", "2048", "--n_threads", "1"], f"{url}/models", log_path)
    yield url, log_path
    process.terminate()
    process.wait(10)
    log.close()


@pytest.fixture(scope="session")
def llama_cpp_server(embedded_gguf):
    """llama.cpp's own `llama-server` (it serves /infill): $MEMOSIGHT_LLAMA_SERVER, the native build of
    engine/bench/build_llama_cpp.sh for this CPU, or `llama-server` on the PATH; no wheel ships it,
    so the tests that need it skip where it was not built. (its base URL, its log)."""
    import shutil

    from memosight.engine.bench.llama_server import free_port, native_bin_dir, repack_flags

    native = native_bin_dir()
    binary = os.environ.get("MEMOSIGHT_LLAMA_SERVER") or (native and str(native / "llama-server")) \
        or shutil.which("llama-server")
    if not binary:
        pytest.skip("llama.cpp's llama-server is not built here (run engine/bench/build_llama_cpp.sh, or set "
                    "MEMOSIGHT_LLAMA_SERVER to one)")
    port, log_path = free_port(), embedded_gguf.parent / "llama-server.log"
    url = f"http://127.0.0.1:{port}"
    process, log = _serve([binary, "-m", str(embedded_gguf), "--port", str(port), "-c", "2048", "-t", "1",
                           "-np", "1", *repack_flags()], f"{url}/health", log_path)
    yield url, log_path
    process.terminate()
    process.wait(10)
    log.close()
