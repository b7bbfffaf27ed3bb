"""Which runtime runs a model, and why: llama.cpp for a GGUF file on a CPU, torch otherwise, and
torch with the reason when llama-cpp-python cannot run."""

from __future__ import annotations

import pytest

from memosight.engine import EngineSpec, ModelLoadError
from memosight.engine.runtime import choice


def test_auto_runs_a_gguf_file_on_llamacpp_and_anything_else_on_torch(embedded_gguf, tiny_model_dir, monkeypatch):
    monkeypatch.setattr(choice, "_cuda_available", lambda: False)
    monkeypatch.setattr(choice, "llamacpp_unavailable", lambda: None)
    gguf = choice.choose(EngineSpec(str(embedded_gguf)))
    assert gguf.runtime == "llamacpp" and "GGUF" in gguf.why
    assert choice.choose(EngineSpec(str(tiny_model_dir))).runtime == "torch"
    assert choice.choose(EngineSpec(None)).runtime == "torch"  # the embedded model, a folder
    assert choice.choose(EngineSpec(str(embedded_gguf), runtime="torch")).runtime == "torch"
    assert choice.choose(EngineSpec(str(embedded_gguf), device="cuda")).runtime == "torch"


def test_without_llama_cpp_a_gguf_file_runs_on_torch_and_the_reason_is_given(embedded_gguf, monkeypatch):
    monkeypatch.setattr(choice, "_cuda_available", lambda: False)
    monkeypatch.setattr(choice, "llamacpp_unavailable", lambda: "llama-cpp-python is not available (no module)")
    auto = choice.choose(EngineSpec(str(embedded_gguf)))
    assert auto.runtime == "torch" and "llama-cpp-python is not available" in auto.why
    with pytest.raises(ModelLoadError, match="runtime \"llamacpp\".*not available.*runtime = \"torch\""):
        choice.choose(EngineSpec(str(embedded_gguf), runtime="llamacpp"))


def test_what_llamacpp_cannot_run_is_a_clear_error(embedded_gguf):
    with pytest.raises(ModelLoadError, match="draft model"):
        choice.choose(EngineSpec(str(embedded_gguf), draft_model="smollm2-135m-draft", runtime="llamacpp"))
    with pytest.raises(ModelLoadError, match="unknown runtime 'tpu'"):
        choice.choose(EngineSpec(str(embedded_gguf), runtime="tpu"))


def test_an_engine_says_which_runtime_runs_it_and_why(embedded_gguf, tiny_model_dir):
    pytest.importorskip("llama_cpp")
    from memosight.engine import load_engine

    status = load_engine(str(embedded_gguf), runtime="llamacpp").status()
    assert status["runtime"] == "llamacpp" and status["runtime_choice"]["asked"] == "llamacpp"
    assert status["dtype"] == "all F32"  # the file's own weight type
    torch_status = load_engine(str(tiny_model_dir), device="cpu").status()
    assert torch_status["runtime"] == "torch" and "not a GGUF file" in torch_status["runtime_choice"]["why"]
