"""`memosight bench quality` on a tiny folder with a tiny model: the report and its JSON keys."""

from __future__ import annotations

import json

from memosight.server.cli import main

CODE = "import os\n\n\ndef join(a, b):\n    return os.path.join(a, b)\n\n\nclass Box:\n    def __init__(self, x):\n        self.x = x\n"


def test_bench_prints_one_json_object(tiny_model_dir, tmp_path, capsys):
    (tmp_path / "m.py").write_text(CODE)
    (tmp_path / "n.py").write_text(CODE.replace("Box", "Crate"))
    assert main(["bench", "quality", "--corpus", str(tmp_path), "--model", str(tiny_model_dir), "--json",
                 "--max-new-tokens", "4", "--lines-per-file", "2", "--seq-len", "32"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"loss", "bits_per_char", "top1_accuracy", "next_line_exact", "next_line_exact_unhealed",
            "next_line_prefix_chars", "next_line_fim_exact", "next_line_samples", "files", "tokens"} <= report.keys()
    assert report["files"] == 2 and report["next_line_samples"] == 4 and report["loss"] > 0


def test_bench_quality_refuses_a_missing_corpus_in_one_line(tiny_model_dir, tmp_path, capsys):
    assert main(["bench", "quality", "--corpus", str(tmp_path / "nope"), "--model", str(tiny_model_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memosight: corpus folder") and err.count("\n") == 1


def test_bench_quality_runs_a_model_without_fim_tokens(tiny_models, tmp_path, capsys):
    (tmp_path / "m.py").write_text(CODE)
    assert main(["bench", "quality", "--corpus", str(tmp_path), "--model", str(tiny_models["gpt2"]), "--json",
                 "--max-new-tokens", "4", "--lines-per-file", "2", "--seq-len", "32"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["next_line_fim_exact"] is None and report["next_line_samples"] == 2 and report["bits_per_char"] > 0
