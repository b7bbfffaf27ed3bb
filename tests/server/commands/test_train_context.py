"""`memosight train context`: examples from a corpus, fine-tune, resume, a complete model folder."""

import json

from memosight.engine import load_engine
from memosight.server.cli import main


def test_train_context_fine_tunes_resumes_and_writes_a_loadable_model(tmp_path, own_model_dir, code_corpus):
    # The sample files are short: make them long enough to have far context (MIN_ROW lines down).
    for path in code_corpus.iterdir():
        path.write_text(path.read_text() * 4)
    (own_model_dir / "memosight.json").write_text('{"fim_order": "spm"}')
    out = tmp_path / "run"
    common = ["train", "context", "--model", str(own_model_dir), "--corpus", str(code_corpus), "--out", str(out),
              "--per-file", "4", "--eval-examples", "8", "--batch", "2", "--warmup", "1", "--checkpoint-every", "1"]
    assert main(common + ["--steps", "2"]) == 0
    assert main(common + ["--steps", "3", "--resume"]) == 0
    report = json.loads((out / "finetune_report.json").read_text())
    assert report["steps"] == 3 and report["train_examples"] > 0
    # Four files leave no held-out split (3% by content hash): the report says so instead of a number.
    assert report["held_out_middle_loss_before"] is None and report["held_out_middle_loss_after"] is None
    saved = out / "model"
    assert (saved / "memosight.json").read_text() == (own_model_dir / "memosight.json").read_text()
    engine = load_engine(str(saved), device="cpu")
    ids = engine.prompt_ids("def add(a, b):\n    return", "")
    assert engine.generate(ids, 8) == engine.generate(ids, 8, speculative=False)


def test_train_context_errors_are_one_line(tmp_path, own_model_dir, capsys):
    assert main(["train", "context", "--model", str(own_model_dir), "--out", str(tmp_path / "r"), "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err
    assert main(["train", "context", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "r")]) == 2
    assert "does not exist" in capsys.readouterr().err
