"""`memosight train heads`: trains, resumes, and ships the heads beside the model."""

import json

import torch
from memosight.engine import load_engine
from memosight.server.cli import main


def test_train_heads_runs_resumes_and_ships_beside_the_model(tmp_path, own_model_dir, code_corpus):
    model_dir, corpus = own_model_dir, code_corpus
    common = ["train", "heads", "--model", str(model_dir), "--corpus", str(corpus), "--out", str(tmp_path / "run"),
              "--seq-len", "64", "--batch", "2", "--heads", "3", "--checkpoint-every", "2"]
    assert main(common + ["--steps", "2"]) == 0
    first = torch.load(tmp_path / "run" / "heads_state.pt", weights_only=False)["state"]
    assert first["step"] == 2
    assert main(common + ["--steps", "4", "--resume"]) == 0
    report = json.loads((tmp_path / "run" / "heads_report.json").read_text())
    assert report["steps"] == 4 and len(report["heads"]) == 3
    assert all(0.0 <= h["top1"] <= h["top3"] <= 1.0 for h in report["heads"])
    engine = load_engine(str(model_dir), device="cpu")
    drafter = engine.speculator.drafter("heads")
    assert drafter is not None and drafter.heads.config.num_heads == 3
    ids = engine.prompt_ids("def add(a, b):\n    return", "")
    assert engine.generate(ids, 12) == engine.generate(ids, 12, speculative=False)


def test_train_heads_errors_are_one_line(tmp_path, own_model_dir, capsys):
    assert main(["train", "heads", "--model", str(own_model_dir), "--out", str(tmp_path / "r"), "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err
