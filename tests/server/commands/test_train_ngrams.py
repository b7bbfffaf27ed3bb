"""`memosight train ngrams`: the table beside the model, drafting with it, the distilled table, errors."""

import shutil
from pathlib import Path

from memosight.engine import load_engine
from memosight.engine.drafts.ngram import TABLE_FILE
from memosight.server.cli import main

from ...conftest import verify_everything


def test_train_ngrams_writes_the_table_beside_the_model_and_the_engine_drafts_with_it(own_model_dir, code_corpus,
                                                                                       capsys):
    model_dir, corpus = own_model_dir, code_corpus
    assert main(["train", "ngrams", "--model", str(model_dir), "--corpus", str(corpus), "--min-count", "2",
                 "--val-fraction", "0"]) == 0
    assert (model_dir / TABLE_FILE).is_file()
    out = capsys.readouterr().out
    assert out.startswith("counted the next token after ") and f"wrote {model_dir / TABLE_FILE} (" in out
    engine = load_engine(str(model_dir), device="cpu")
    assert engine.speculator.drafter("table") is not None
    verify_everything(engine.speculator)
    ids = engine.prompt_ids("class Item0:\n    def __init__(self, name):\n        self.", "\n")
    assert engine.generate(ids, 24, speculative=True) == engine.generate(ids, 24, speculative=False)
    assert engine.speculator.to_json()["sources"]["table"]["drafted"] > 0


def test_train_ngrams_refuses_a_missing_corpus(tmp_path, capsys):
    assert main(["train", "ngrams", "--corpus", str(tmp_path / "nope"), "--save-to", str(tmp_path)]) == 2
    assert "corpus folder not found" in capsys.readouterr().err
    assert main(["train", "ngrams", "--min-count", "0", "--save-to", str(tmp_path)]) == 2
    assert "memosight: --max-order and --min-count must be at least 1" in capsys.readouterr().err


def test_distilled_table_counts_the_models_own_greedy_choices(tmp_path, repeater_model_dir, code_corpus):
    model_dir = Path(shutil.copytree(repeater_model_dir, tmp_path / "repeater"))
    assert main(["train", "ngrams", "--model", str(model_dir), "--corpus", str(code_corpus), "--min-count", "1",
                 "--val-fraction", "0", "--distill-tokens", "300"]) == 0
    engine = load_engine(str(model_dir), device="cpu")
    x = engine.encode("x")[0]
    context = engine.encode("class Item0:\n    def __init__(self, name):")
    assert engine.speculator.drafter("table").table.guess(context) == (x, 1.0)  # the repeater writes "x" after anything
