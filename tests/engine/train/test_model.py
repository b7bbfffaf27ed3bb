"""`memosight train model`: FIM samples, packing, a tiny end-to-end run, exact resume, export."""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch

from memosight.engine.train import run_model
from memosight.engine.train.model import TrainConfig, fim_split, lr_at, pack_windows, sample_pieces, split_into_chunks

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def test_fim_split_covers_the_text_and_sample_formats():
    text = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n"
    rng = random.Random(0)
    for _ in range(200):
        prefix, middle, suffix = fim_split(text, rng)
        assert prefix + middle + suffix == text
    assert sample_pieces(text, rng, fim_rate=0.0, spm_rate=0.0) == [text, "<|endoftext|>"]
    psm = sample_pieces(text, rng, fim_rate=1.0, spm_rate=0.0)
    assert psm[0] == "<fim_prefix>" and psm[2] == "<fim_suffix>" and psm[4] == "<fim_middle>"
    spm = sample_pieces(text, rng, fim_rate=1.0, spm_rate=1.0)
    assert spm[:2] == ["<fim_prefix>", "<fim_suffix>"] and spm[3] == "<fim_middle>"
    assert spm[4] + spm[2] == text  # prefix + middle, then the suffix


def test_chunks_are_line_aligned_and_windows_are_packed():
    text = "".join(f"line_{i} = {i}\n" for i in range(500))
    chunks = split_into_chunks(text, max_chars=1000)
    assert "".join(chunks) == text and all(c.endswith("\n") and len(c) <= 1000 for c in chunks)
    assert pack_windows(list(range(10)), 3).tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(tokens=100 * 8 * 1024, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(1e-4) and lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(100, cfg) == pytest.approx(1e-4)
    timed = TrainConfig(tokens=100 * 8 * 1024, warmup_steps=10, lr=1e-3, max_minutes=1.0)
    assert lr_at(20, timed, elapsed_s=60.0) == pytest.approx(1e-4)  # out of time: fully decayed


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    run_model.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture()
def tiny_corpus(tmp_path) -> Path:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("textwrap.py", "heapq.py", "bisect.py", "shlex.py", "fnmatch.py", "colorsys.py", "keyword.py"):
        shutil.copy(STDLIB / name, corpus / name)
    return corpus


def tiny_run(corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["--corpus", str(corpus), "--out", str(out), "--size", "tiny", "--steps", "4", "--seq-len", "32",
            "--batch", "2", "--vocab-size", "300", "--warmup", "1", "--checkpoint-every", "2", "--eval-every", "2",
            "--val-fraction", "0.3", "--final-eval-tokens", "2000", "--threads", "1", *extra]


def test_training_runs_end_to_end_and_exports_a_loadable_model(tiny_corpus, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, export = tmp_path / "run", tmp_path / "export"
    assert run_model.run(parse(tiny_run(tiny_corpus, out, "--export-to", str(export)))) == 0

    assert (out / "checkpoint" / "state.pt").exists() and (out / "tokenizer" / "tokenizer.json").exists()
    tokenizer = AutoTokenizer.from_pretrained(export)
    model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == model.generation_config.pad_token_id
    assert "<fim_middle>" in tokenizer.get_vocab()
    card = (export / "README.md").read_text()
    assert "PSF" not in card and "Held-out evaluation" in card and "--size tiny" in card
    metrics = json.loads((export / "training_metrics.json").read_text())
    assert metrics["steps"] == 4 and metrics["tokens"] == 4 * 2 * 32


def test_resume_continues_exactly_where_the_checkpoint_left_off(tiny_corpus, tmp_path):
    straight, paused = tmp_path / "straight", tmp_path / "paused"
    assert run_model.run(parse(tiny_run(tiny_corpus, straight))) == 0
    assert run_model.run(parse(tiny_run(tiny_corpus, paused, "--stop-at-step", "2"))) == 0
    assert torch.load(paused / "checkpoint" / "state.pt", weights_only=False)["run_state"]["step"] == 2
    assert run_model.run(parse(tiny_run(tiny_corpus, paused, "--resume"))) == 0

    a = torch.load(straight / "checkpoint" / "state.pt", weights_only=False)
    b = torch.load(paused / "checkpoint" / "state.pt", weights_only=False)
    assert b["run_state"]["step"] == 4
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_export_only_needs_a_checkpoint(tiny_corpus, tmp_path):
    assert run_model.run(parse(tiny_run(tiny_corpus, tmp_path / "empty", "--export-only"))) == 2


def test_module_imports_no_torch_at_top_level():
    import subprocess
    import sys

    code = "import sys, memosight.engine.train.run_model, memosight.engine.bench.quality; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
