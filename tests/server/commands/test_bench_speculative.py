"""`memosight bench speculative` runs every method side by side and reports the same greedy output."""

import json

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
