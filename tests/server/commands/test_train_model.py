"""`memosight train model`: a tiny end-to-end run, exact resume, export, errors, a light --help."""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch
from memosight.server.cli import main

STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture()
def tiny_corpus(tmp_path) -> Path:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("textwrap.py", "heapq.py", "bisect.py", "shlex.py", "fnmatch.py", "colorsys.py", "keyword.py"):
        shutil.copy(STDLIB / name, corpus / name)
    return corpus


def tiny_run(corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "model", "--corpus", str(corpus), "--out", str(out), "--size", "tiny", "--steps", "4",
            "--seq-len", "32", "--batch", "2", "--vocab-size", "300", "--warmup", "1", "--checkpoint-every", "2",
            "--eval-every", "2", "--val-fraction", "0.3", "--final-eval-tokens", "2000", "--threads", "1", *extra]


def test_training_runs_end_to_end_and_exports_a_loadable_model(tiny_corpus, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, export = tmp_path / "run", tmp_path / "export"
    assert main(tiny_run(tiny_corpus, out, "--export-to", str(export))) == 0

    assert (out / "checkpoint" / "state.pt").exists() and (out / "tokenizer" / "tokenizer.json").exists()
    tokenizer = AutoTokenizer.from_pretrained(export)
    model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == model.generation_config.pad_token_id
    assert "<fim_middle>" in tokenizer.get_vocab()
    card = (export / "README.md").read_text()
    assert "PSF" not in card and "Held-out evaluation" in card and "--size tiny" in card
    sources = card.split("## Data sources and licences")[1].split("##")[0]
    assert f"- {tiny_corpus.name} (a folder given on the command line): as given" in sources
    assert str(tiny_corpus) not in sources  # named, never given as a path of the machine that trained
    metrics = json.loads((export / "training_metrics.json").read_text())
    assert metrics["steps"] == 4 and metrics["tokens"] == 4 * 2 * 32
    err = capsys.readouterr().err
    assert "validation (all sources)     loss " in err and f"exported to {export} (" in err


def test_resume_continues_exactly_where_the_checkpoint_left_off(tiny_corpus, tmp_path, capsys):
    straight, paused = tmp_path / "straight", tmp_path / "paused"
    assert main(tiny_run(tiny_corpus, straight)) == 0
    assert main(tiny_run(tiny_corpus, paused, "--stop-at-step", "2")) == 0
    assert "paused at step 2; continue with --resume" in capsys.readouterr().err
    assert torch.load(paused / "checkpoint" / "state.pt", weights_only=False)["run_state"]["step"] == 2
    assert main(tiny_run(tiny_corpus, paused, "--resume")) == 0

    a = torch.load(straight / "checkpoint" / "state.pt", weights_only=False)
    b = torch.load(paused / "checkpoint" / "state.pt", weights_only=False)
    assert b["run_state"]["step"] == 4
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(a["optimizer"]["state"][i]["exp_avg"], b["optimizer"]["state"][i]["exp_avg"])
               for i in a["optimizer"]["state"])


def test_export_only_needs_a_checkpoint(tiny_corpus, tmp_path, capsys):
    assert main(tiny_run(tiny_corpus, tmp_path / "empty", "--export-only")) == 2
    assert "memosight: no checkpoint in" in capsys.readouterr().err
    assert main(tiny_run(tiny_corpus, tmp_path / "r", "--threads", "many")) == 2
    assert "--threads many" in capsys.readouterr().err


def test_module_imports_no_torch_at_top_level():
    import subprocess
    import sys

    # Building the parser imports every command module, the train commands and the benchmarks among them.
    code = ("import sys, memosight.server.commands.train_model, memosight.server.commands.train_heads, "
            "memosight.server.commands.train_ngrams; from memosight.server.cli import build_parser; "
            "build_parser(); print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
