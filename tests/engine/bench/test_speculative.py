"""The speculative benchmark: which methods run, the figures it computes from their tokens and
times (checked on a clock that ticks one second a reading), its prompts, the keystroke reuse it
measures, and the report it prints. The command line's end-to-end runs are in
tests/server/commands/test_bench_speculative.py."""

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest

from memosight.engine import load_engine
from memosight.engine.bench import speculative as S
from memosight.engine.drafts import SOURCES
from memosight.engine.drafts.model import DraftModel

from ...conftest import SAMPLE_CODE


@pytest.fixture
def engine(tiny_model_dir):
    return load_engine(str(tiny_model_dir), device="cpu", dtype="float32")


@pytest.fixture
def corpus(code_corpus) -> Path:
    # cut points need files of 2 kB; the fixture's are smaller
    (code_corpus / "long.py").write_text("\n\n".join(f.read_text() for f in sorted(code_corpus.iterdir())))
    return code_corpus


def test_every_draft_source_has_a_method_and_every_method_names_real_sources():
    names = {source.name for source in SOURCES} | {DraftModel.name}
    spec = [m for m in S.METHODS if m.startswith("spec_")]
    assert {f"spec_{name}" for name in names} <= set(spec) and "spec_all" in spec
    for method in spec:
        assert set(S._names(method)) <= names | {"*"}, method  # a typo would silently drop the method
    assert S._names("spec_all") == ("*",)
    assert S._names("spec_ngram") == ("ngram",)
    assert S._names("spec_draft_ngram") == ("draft_model", "ngram")
    assert S.METHODS[0] == "hf_greedy" and len(set(S.METHODS)) == len(S.METHODS)


class HalfGreedy:
    """A stand-in for llama.cpp: the engine's greedy tokens, but only half of them."""

    def __init__(self, engine, made):
        self.engine, self.made = engine, made

    def __call__(self, gguf, threads, prompt_lookup=False):
        self.made.append((gguf, threads, prompt_lookup))
        return self

    def prefill(self, ids):
        self.made.append(("prefill", len(ids)))

    def generate(self, ids, n, eos_ids):
        return self.engine.generate(ids, n, speculative=False)[: n // 2]

    def close(self):
        self.made.append("closed")


def test_figures_are_tokens_over_seconds_and_ratios_to_the_baselines(engine, corpus, monkeypatch):
    # Every reading of the clock is one second later: each method's prefill and decoding of each
    # prompt take one second, so the rates are known from the token counts alone.
    ticks = itertools.count()
    monkeypatch.setattr(S, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    made = []
    monkeypatch.setattr(S, "LlamaCppDecoder", HalfGreedy(engine, made))
    monkeypatch.setattr(S, "native_bin_dir", lambda: None)  # no native llama-server: its method is dropped
    monkeypatch.setattr(S, "build_flags", lambda: "fake build")
    done = []
    summary = S.run_speculative(engine, corpus, prompts=2, min_new=8, max_new=8, prompt_chars=400,
                                gguf="/models/m.gguf", progress=lambda i, total: done.append((i, total)),
                                methods=("hf_greedy", "hf_assisted", "llama_greedy", "llama_server", "plain",
                                         "spec_ngram", "spec_heads", "spec_all"))
    rows = {row["method"]: row for row in summary["methods"]}
    # no draft model (hf_assisted), no heads file (spec_heads), no native build (llama_server)
    assert list(rows) == ["hf_greedy", "llama_greedy", "plain", "spec_ngram", "spec_all"]
    assert done == [(1, 2), (2, 2)] and summary["prompts"] == 2 and summary["new_tokens"] == [8, 8]
    assert made[0] == (Path("/models/m.gguf"), summary["threads"], False) and made[-1] == "closed"
    prefills = [m[1] for m in made if m[0] == "prefill"]  # all but the last prompt token, once a prompt
    low, high = summary["prompt_tokens"]
    assert len(prefills) == 2 and all(low - 1 <= n <= high - 1 for n in prefills)
    for name in ("hf_greedy", "plain", "spec_ngram", "spec_all"):  # 8 tokens a prompt, 1 s each way
        row = rows[name]
        assert (row["tokens_per_s"], row["tokens_per_s_with_prefill"]) == (8.0, 4.0), name
        assert (row["speedup"], row["speedup_with_prefill"]) == (1.0, 1.0), name
        assert (row["vs_llama_cpp"], row["vs_llama_cpp_with_prefill"]) == (2.0, 2.0), name
        assert row["exact_match"] == row["plain_match"] == 1.0, name
    llama = rows["llama_greedy"]  # half the tokens in the same time
    assert (llama["tokens_per_s"], llama["speedup"], llama["vs_llama_cpp"]) == (4.0, 0.5, 1.0)
    assert (llama["exact_match"], llama["plain_match"], llama["tokens_per_step"]) == (0.0, 0.0, None)
    assert rows["spec_all"]["tokens_per_step"] >= 1.0
    assert summary["gguf"] == "/models/m.gguf"
    assert summary["llama_cpp"] == {"baseline": "llama_greedy", "llama_server": None,
                                    "llama_cpp_python_build": "fake build"}


def test_without_a_gguf_llama_cpp_is_left_out_and_the_engine_keeps_the_combined_speculator(engine, corpus):
    original = engine.speculator
    summary = S.run_speculative(engine, corpus, prompts=2, min_new=4, max_new=6, prompt_tokens=48,
                                methods=("hf_greedy", "llama_greedy", "llama_prompt_lookup", "plain", "spec_all"))
    assert [row["method"] for row in summary["methods"]] == ["hf_greedy", "plain", "spec_all"]
    assert summary["gguf"] is None and summary["llama_cpp"] is None
    assert all(row["vs_llama_cpp"] is None for row in summary["methods"])
    assert summary["prompt_tokens"][1] <= 48
    # the engine is left with spec_all's speculator: every source, each a copy of its own
    assert engine.speculator is not original
    assert [d.name for d in engine.speculator.drafters] == [d.name for d in original.drafters]
    assert not {id(d) for d in engine.speculator.drafters} & {id(d) for d in original.drafters}


def test_the_prompt_is_the_engines_own_and_is_cut_from_its_far_ends_to_the_token_limit(engine):
    text = SAMPLE_CODE * 4
    cut = text.index("def ", 2000) + 4
    whole = S._prompt(engine, text, cut, 600, 0)
    assert whole == engine.prompt_ids(text[cut - 600:cut], text[cut:cut + 1000])
    short = S._prompt(engine, text, cut, 600, 60)
    assert 30 <= len(short) <= 60  # shrunk to the limit, not far below it
    assert text[cut - 12:cut] in engine.decode(short)  # the text nearest the cursor is kept
    assert len(S._prompt(engine, text, cut, 600, 1)) > 1  # an unreachable limit still ends


def test_keystroke_reuse_counts_the_cached_tokens_a_typed_character_keeps(engine, tmp_path):
    path = tmp_path / "f.py"
    path.write_text(SAMPLE_CODE * 3)
    reuse = S._keystroke_reuse(engine, path, 200)
    assert reuse["reused_tokens"] + reuse["prefilled_tokens"] == reuse["prompt_tokens"]
    assert reuse["prompt_tokens"] >= 190 and 0 < reuse["prefilled_tokens"] <= 10


ROW = {"method": "spec_all", "tokens_per_s": 40.5, "speedup": 2.1, "tokens_per_step": 2.5, "exact_match": 1.0,
       "plain_match": 1.0, "tokens_per_s_with_prefill": 20.0, "speedup_with_prefill": 1.5, "vs_llama_cpp": 1.2,
       "vs_llama_cpp_with_prefill": 0.9, "sources": {"ngram": {"accepted": 3, "drafted": 10},
                                                    "heads": {"accepted": 1, "drafted": 4}},
       "head_accuracy": [0.5, 0.25]}
SUMMARY = {"model": "tiny", "device": "cpu", "dtype": "float32", "threads": 2, "prompts": 4, "gguf": "/m.gguf",
           "llama_cpp": {"baseline": "llama_server", "llama_server": "/bin/llama-server",
                         "llama_cpp_python_build": None},
           "prompt_tokens": [100, 300], "new_tokens": [8, 16], "methods": [ROW],
           "keystroke_reuse": {"prompt_tokens": 500, "reused_tokens": 498, "prefilled_tokens": 2},
           "floor": {"plain_ms_per_token": 12.0, "floor_ms": 3.0, "weight_mb": 250.0, "kv_mb": 4.0,
                     "cached_tokens": 200, "read_gb_per_s": 9.5, "times_floor": 4.0},
           "peak_memory_mb": 512.3}


def test_render_prints_the_setup_the_baseline_the_table_and_each_sources_acceptance():
    lines = S.render(SUMMARY).split("\n")
    assert lines[0] == ("model tiny  device cpu  dtype float32  threads 2  prompts 4 of 100-300 tokens  "
                        "new tokens 8-16  llama.cpp on /m.gguf")
    assert lines[1] == "vs llama.cpp: against llama_server (llama-server built natively for this CPU)"
    assert lines[2].split() == ["method", "tok/s", "speedup", "tok/step", "=", "greedy", "=", "plain", "tok/s",
                                "+prefill", "speedup", "+prefill", "vs", "llama.cpp", "vs", "llama.cpp", "+prefill"]
    assert lines[4].split() == ["spec_all", "40.5", "2.100", "2.500", "1.000", "1.000", "20.0", "1.500", "1.200",
                                "0.900"]
    assert "  spec_all: accepted/drafted nodes: ngram 3/10, heads 1/4; head top-1: 0.50 0.25" in lines
    assert "keystroke on a 500-token prompt: prefilled 2 tokens (498 reused)" in lines
    assert ("plain step 12.0 ms a token against a memory floor of 3.0 ms (250.0 MB of weights + 4.0 MB of KV at "
            "200 tokens, read at 9.5 GB/s measured): 4.0x the floor") in lines
    assert lines[-1] == "peak memory: 512.3 MB"


def test_render_without_llama_cpp_or_a_floor_leaves_their_parts_out():
    summary = {**SUMMARY, "gguf": None, "llama_cpp": None, "floor": None,
               "methods": [{**ROW, "sources": None, "head_accuracy": None}]}
    out = S.render(summary)
    assert "vs llama.cpp" not in out and "llama.cpp on" not in out
    assert "memory floor" not in out and "accepted/drafted" not in out
    assert out.split("\n")[1].split()[0] == "method"  # the table follows the setup line


def test_the_baseline_line_says_which_llama_cpp_and_how_it_was_built():
    native = S._baseline_line({"baseline": "llama_server", "llama_server": "/b/llama-server",
                               "llama_cpp_python_build": "llama-cpp-python 0.3.36: AVX2 = 1"})
    assert native == ("vs llama.cpp: against llama_server (llama-server built natively for this CPU); "
                      "llama-cpp-python's build: llama-cpp-python 0.3.36: AVX2 = 1")
    wheel = S._baseline_line({"baseline": "llama_greedy", "llama_server": None, "llama_cpp_python_build": None})
    assert wheel == ("vs llama.cpp: against llama_greedy (llama-cpp-python in-process: no native build here, "
                     "run engine/bench/build_llama_cpp.sh)")


def test_on_the_llamacpp_runtime_its_plain_loop_is_the_reference_and_the_transformers_methods_sit_out(
        embedded_gguf, corpus):
    pytest.importorskip("llama_cpp")
    engine = load_engine(str(embedded_gguf), runtime="llamacpp")
    summary = S.run_speculative(engine, corpus, prompts=2, min_new=8, max_new=16,
                                methods=("hf_greedy", "plain", "spec_ngram"))
    rows = {row["method"]: row for row in summary["methods"]}
    assert set(rows) == {"plain", "spec_ngram"} and summary["runtime"] == "llamacpp"
    assert summary["baseline"] == "plain" and rows["plain"]["speedup"] == 1.0
    assert rows["spec_ngram"]["plain_match"] == rows["spec_ngram"]["exact_match"] == 1.0  # lossless on the runtime
    assert summary["keystroke_reuse"]["reused_tokens"] > 0
