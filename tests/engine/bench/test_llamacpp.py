"""llama.cpp in-process for `bench speculative`: finding the GGUF a model came from, the build label,
and the decoder's calls into llama-cpp-python (checked against a stand-in module, so that they are
tested where the wheel is not built; one test runs the real one where it is)."""

import json
import sys
from types import ModuleType, SimpleNamespace

import pytest

from memosight.engine.bench import llamacpp
from memosight.engine.bench.llamacpp import LlamaCppDecoder, build_flags, gguf_of

from .decoding import cold_warm_short


def test_gguf_of_reads_the_marker_the_gguf_loader_writes(tmp_path):
    gguf = tmp_path / "model.Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF")
    model = tmp_path / "model"
    model.mkdir()
    assert gguf_of(None) is None and gguf_of("") is None
    assert gguf_of(str(model)) is None  # no marker: not loaded from a GGUF
    (model / "memosight.json").write_text(json.dumps({"gguf_file": str(gguf)}))
    assert gguf_of(str(model)) == gguf
    (model / "memosight.json").write_text(json.dumps({"gguf_file": str(tmp_path / "moved.gguf")}))
    assert gguf_of(str(model)) is None  # the file it names is gone
    (model / "memosight.json").write_text(json.dumps({"fim_order": "spm"}))
    assert gguf_of(str(model)) is None


class FakeLlama:
    """Records what LlamaCppDecoder asks of llama_cpp.Llama; generates a fixed token stream."""

    made: list = []

    def __init__(self, **kwargs):
        import llama_cpp.llama_cpp as native

        self.kwargs = kwargs
        self.extra_bufts_while_built = native.llama_model_default_params().use_extra_bufts
        self.calls: list = []
        FakeLlama.made.append(self)

    def reset(self):
        self.calls.append(("reset",))

    def eval(self, ids):
        self.calls.append(("eval", list(ids)))

    def generate(self, ids, **sampling):
        self.calls.append(("generate", list(ids), sampling))
        yield from [5, 6, 2, 7, 8, 9]
        raise AssertionError("the decoder must stop before the stream ends")

    def close(self):
        self.calls.append(("close",))


class FakeLookup:
    def __init__(self, num_pred_tokens):
        self.num_pred_tokens = num_pred_tokens


@pytest.fixture
def fake_llama_cpp(monkeypatch):
    """Stand-ins for llama_cpp, llama_cpp.llama_cpp and llama_cpp.llama_speculative."""
    package, native, speculative = (ModuleType(n) for n in ("llama_cpp", "llama_cpp.llama_cpp",
                                                             "llama_cpp.llama_speculative"))
    package.__path__ = []
    package.__version__ = "0.3.36"
    package.Llama = FakeLlama
    package.llama_print_system_info = lambda: b"CPU : SSE3 = 1 | AVX2 = 1 |\n AMX_INT8 = 1 | "
    package.llama_cpp, package.llama_speculative = native, speculative
    native.llama_model_default_params = lambda: SimpleNamespace(use_extra_bufts=True)
    speculative.LlamaPromptLookupDecoding = FakeLookup
    for module in (package, native, speculative):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    FakeLlama.made = []
    return native


def test_build_flags_label_the_wheels_cpu_features_on_one_line(fake_llama_cpp, monkeypatch):
    assert build_flags() == "llama-cpp-python 0.3.36: CPU : SSE3 = 1 | AVX2 = 1 | AMX_INT8 = 1 |"
    sys.modules["llama_cpp"].llama_print_system_info = lambda: "AVX = 1"  # some versions return str
    assert build_flags() == "llama-cpp-python 0.3.36: AVX = 1"
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails: not installed
    assert build_flags() == "not installed"


def test_the_decoder_is_built_on_the_file_with_the_thread_count_and_no_extra_buffers(fake_llama_cpp, tmp_path):
    defaults = fake_llama_cpp.llama_model_default_params
    decoder = LlamaCppDecoder(tmp_path / "m.gguf", threads=3)
    assert decoder.llm.kwargs == {"model_path": str(tmp_path / "m.gguf"), "n_ctx": 4096, "n_threads": 3,
                                  "n_threads_batch": 3, "n_batch": 512, "verbose": False, "draft_model": None}
    # off while llama.cpp read its defaults (its extra buffer types crashed decoding here), restored after
    assert decoder.llm.extra_bufts_while_built is False
    assert fake_llama_cpp.llama_model_default_params is defaults and defaults().use_extra_bufts is True
    lookup = LlamaCppDecoder(tmp_path / "m.gguf", threads=1, prompt_lookup=True, n_ctx=512)
    assert lookup.llm.kwargs["n_ctx"] == 512 and lookup.llm.kwargs["draft_model"].num_pred_tokens == 10


def test_the_default_parameters_are_restored_when_loading_fails(fake_llama_cpp, tmp_path, monkeypatch):
    defaults = fake_llama_cpp.llama_model_default_params

    def broken(**kwargs):
        raise ValueError("Failed to load model from file")

    monkeypatch.setattr(sys.modules["llama_cpp"], "Llama", broken)
    with pytest.raises(ValueError):
        LlamaCppDecoder(tmp_path / "bad.gguf", threads=1)
    assert fake_llama_cpp.llama_model_default_params is defaults


def test_without_the_wheel_the_decoder_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(RuntimeError, match=r"pip install 'memosight\[dev\]'"):
        LlamaCppDecoder(tmp_path / "m.gguf", threads=1)


def test_prefill_starts_a_fresh_cache_with_the_prompt(fake_llama_cpp, tmp_path):
    decoder = LlamaCppDecoder(tmp_path / "m.gguf", threads=1)
    decoder.prefill([1, 2, 3])
    decoder.prefill([])  # an empty prompt: only the reset (llama.cpp refuses to eval nothing)
    assert decoder.llm.calls == [("reset",), ("eval", [1, 2, 3]), ("reset",)]


def test_generate_is_greedy_and_stops_at_eos_included_or_at_the_limit(fake_llama_cpp, tmp_path):
    decoder = LlamaCppDecoder(tmp_path / "m.gguf", threads=1)
    assert decoder.generate([1, 2], 10, eos_ids={2}) == [5, 6, 2]
    assert decoder.generate([1, 2], 2, eos_ids={2}) == [5, 6]
    (_, ids, sampling), *_ = [c for c in decoder.llm.calls if c[0] == "generate"]
    assert ids == [1, 2]
    assert sampling == {"top_k": 1, "top_p": 1.0, "min_p": 0.0, "temp": 0.0, "repeat_penalty": 1.0}
    calls = len(decoder.llm.calls)
    assert decoder.generate([1, 2], 0, eos_ids={2}) == [] and len(decoder.llm.calls) == calls  # not even started
    decoder.close()
    assert decoder.llm.calls[-1] == ("close",)


def test_the_real_llama_cpp_decodes_greedily_from_a_cached_prompt(tiny_model_dir, tiny_gguf):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is in the dev extras")
    from memosight.engine import load_engine

    engine = load_engine(str(tiny_model_dir), device="cpu", dtype="float32")
    ids = engine.prompt_ids("def add(a, b):\n    return a +", "\n")
    decoder = LlamaCppDecoder(tiny_gguf, threads=1, n_ctx=512)
    cold, warm, short = cold_warm_short(decoder, ids, 8, engine.eos_ids)
    assert 0 < len(cold) <= 8 and warm == cold and short == cold[:3]
    # the same float weights and ids: llama.cpp's greedy tokens are the engine's, bar float rounding
    ours = engine.generate(ids, 8, speculative=False)
    assert sum(a == b for a, b in zip(ours, cold)) >= len(cold) // 2


def test_the_module_names_llama_cpp_only_inside_functions():
    # Importing the bench must not need the wheel (it is a dev extra built from source).
    assert "llama_cpp" not in vars(llamacpp)
