"""`memosight bench speculative` runs every method side by side and reports the same greedy output."""

import json

import pytest

from memosight.server.cli import main


def test_bench_speculative_reports_every_method_with_and_without_prefill(own_model_dir, code_corpus, capsys):
    model_dir, corpus = own_model_dir, code_corpus
    (corpus / "long.py").write_text("\n\n".join(f.read_text() for f in sorted(corpus.iterdir())))  # cut points need 2 kB
    assert main(["train", "ngrams", "--model", str(model_dir), "--corpus", str(corpus), "--min-count", "2",
                 "--val-fraction", "0"]) == 0
    capsys.readouterr()
    assert main(["bench", "speculative", "--model", str(model_dir), "--corpus", str(corpus), "--prompts", "2",
                 "--min-new", "8", "--max-new", "12", "--prompt-chars", "600", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    rows = {row["method"]: row for row in summary["methods"]}
    assert set(rows) == {"hf_greedy", "hf_prompt_lookup", "plain", "spec_ngram", "spec_table", "spec_lookahead",
                         "spec_all"}  # no heads in this model folder: no spec_heads
    assert rows["hf_greedy"]["speedup"] == 1.0
    for row in rows.values():
        assert row["exact_match"] == row["plain_match"] == 1.0, row["method"]  # float32: every method is greedy
        assert row["tokens_per_s"] > 0 and row["tokens_per_s_with_prefill"] < row["tokens_per_s"]
    assert rows["spec_all"]["tokens_per_step"] >= 1.0
    assert summary["keystroke_reuse"]["prefilled_tokens"] < summary["keystroke_reuse"]["prompt_tokens"]


def test_bench_speculative_with_a_draft_model_adds_it_and_transformers_assisted_generation(
        tiny_model_dir, code_corpus, tmp_path, capsys):
    from ...conftest import build_tiny_model

    draft = build_tiny_model(tmp_path / "draft", "llama", seed=1)
    (code_corpus / "long.py").write_text("\n\n".join(f.read_text() for f in sorted(code_corpus.iterdir())))
    assert main(["bench", "speculative", "--model", str(tiny_model_dir), "--draft-model", str(draft),
                 "--corpus", str(code_corpus), "--prompts", "2", "--min-new", "8", "--max-new", "12",
                 "--prompt-chars", "600", "--methods", "hf_greedy,hf_assisted,spec_draft_model,spec_draft_ngram,spec_all",
                 "--json"]) == 0
    rows = {row["method"]: row for row in json.loads(capsys.readouterr().out)["methods"]}
    assert set(rows) == {"hf_greedy", "hf_assisted", "spec_draft_model", "spec_draft_ngram", "spec_all"}
    for row in rows.values():
        assert row["exact_match"] == 1.0, row["method"]


def test_bench_speculative_int8_is_lossless_against_its_own_plain_greedy(tiny_model_dir, code_corpus, capsys):
    (code_corpus / "long.py").write_text("\n\n".join(f.read_text() for f in sorted(code_corpus.iterdir())))
    assert main(["bench", "speculative", "--model", str(tiny_model_dir), "--dtype", "int8", "--corpus",
                 str(code_corpus), "--prompts", "2", "--min-new", "8", "--max-new", "12", "--prompt-chars", "600",
                 "--methods", "hf_greedy,plain,spec_ngram,spec_all", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["dtype"] == "int8"
    for row in summary["methods"]:
        if row["method"] != "hf_greedy":
            assert row["plain_match"] == 1.0, row["method"]


def test_bench_speculative_runs_llama_cpp_in_process_on_the_same_gguf(embedded_gguf, code_corpus, capsys):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is in the dev extras")
    (code_corpus / "long.py").write_text("\n\n".join(f.read_text() for f in sorted(code_corpus.iterdir())))
    assert main(["bench", "speculative", "--gguf", str(embedded_gguf), "--corpus", str(code_corpus), "--prompts", "2",
                 "--min-new", "8", "--max-new", "12", "--prompt-tokens", "96", "--threads", "1",
                 "--methods", "hf_greedy,llama_greedy,llama_prompt_lookup,plain,spec_all", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["threads"] == 1 and summary["gguf"] == str(embedded_gguf)
    assert summary["prompt_tokens"][1] <= 96
    rows = {row["method"]: row for row in summary["methods"]}
    assert set(rows) == {"hf_greedy", "llama_greedy", "llama_prompt_lookup", "plain", "spec_all"}
    assert rows["llama_greedy"]["vs_llama_cpp"] == 1.0
    for name in ("llama_greedy", "llama_prompt_lookup"):
        assert rows[name]["tokens_per_s"] > 0 and rows[name]["tokens_per_s_with_prefill"] < rows[name]["tokens_per_s"]
    # the same weights (exported in float), the same ids: llama.cpp's greedy is ours, bar float rounding
    assert rows["llama_greedy"]["plain_match"] >= 0.5
    assert rows["llama_prompt_lookup"]["plain_match"] == rows["llama_greedy"]["plain_match"]


def test_bench_speculative_names_a_missing_gguf(code_corpus, capsys):
    assert main(["bench", "speculative", "--gguf", "/no/such.gguf", "--corpus", str(code_corpus)]) == 2
    assert "--gguf" in capsys.readouterr().err
