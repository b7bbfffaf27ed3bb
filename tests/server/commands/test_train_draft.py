"""`memosight train draft`: distils a smaller draft from a target, resumes, and the draft drafts."""

import json

import torch
from memosight.engine import load_engine
from memosight.engine.train.draft import distillation_loss, draft_config
from memosight.server.cli import main


def test_train_draft_runs_resumes_and_drafts_for_its_target(tmp_path, tiny_model_dir, code_corpus):
    run = tmp_path / "run"
    common = ["train", "draft", "--target", str(tiny_model_dir), "--corpus", str(code_corpus), "--out", str(run),
              "--seq-len", "64", "--batch", "2", "--top-k", "4", "--checkpoint-every", "2"]
    assert main(common + ["--steps", "2"]) == 0
    assert torch.load(run / "draft_state.pt", weights_only=False)["state"]["step"] == 2
    assert main(common + ["--steps", "4", "--resume"]) == 0
    report = json.loads((run / "draft_report.json").read_text())
    assert report["steps"] == 4 and report["parameters"] < report["target_parameters"]
    assert 0.0 <= report["heldout_greedy_agreement"] <= 1.0
    card = (run / "draft" / "README.md").read_text()
    assert f"agreement with the target's greedy token: {report['heldout_greedy_agreement']}" in card
    assert "--steps 4" in card and str(code_corpus) in card
    engine = load_engine(str(tiny_model_dir), draft_model=report["saved_to"])
    ids = engine.prompt_ids("def add(a, b):\n    return", "")
    assert engine.generate(ids, 12) == engine.generate(ids, 12, speculative=False)


def test_the_draft_is_the_target_smaller_with_its_vocabulary(tiny_model_dir):
    from transformers import AutoConfig

    target = AutoConfig.from_pretrained(tiny_model_dir)
    config = draft_config(target)
    assert config.vocab_size == target.vocab_size and config.num_hidden_layers == 1
    assert config.hidden_size == target.hidden_size // 2 and config.head_dim == target.hidden_size // 4


def test_the_loss_is_lowest_where_the_draft_agrees_with_the_target():
    values = torch.tensor([[[3.0, 1.0]]])
    indices = torch.tensor([[[2, 0]]])
    agreeing = torch.tensor([[[0.0, 0.0, 5.0]]])
    disagreeing = torch.tensor([[[5.0, 0.0, 0.0]]])
    assert distillation_loss(agreeing, values, indices) < distillation_loss(disagreeing, values, indices)
