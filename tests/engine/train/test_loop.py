"""The base model's training run: the loop with measured thread counts, errors the user can fix."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import pytest
import torch

from memosight.engine.protocol import EngineError
from memosight.engine.train.loop import TrainConfig, load_checkpoint, run_training

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def tiny_config(**changes) -> TrainConfig:
    return TrainConfig(seq_len=32, batch_size=2, tokens=4 * 2 * 32, warmup_steps=1, checkpoint_every=2,
                       eval_every=2, **changes)


def test_auto_threads_measure_every_step_and_the_run_pauses_with_a_checkpoint(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("textwrap.py", "heapq.py", "bisect.py", "shlex.py"):
        shutil.copy(STDLIB / name, corpus / name)
    before = torch.get_num_threads()
    steps = []
    report = run_training(tmp_path / "run", tiny_config(), corpus_specs=[str(corpus)], size="tiny", vocab_size=300,
                          val_fraction=0.3, threads="auto", stop_at_step=3,
                          progress=lambda step, total, figures: steps.append((step, total, sorted(figures))))
    torch.set_num_threads(before)
    assert report.paused and report.step == 3 and report.export_dir is None
    assert steps == [(s, 4, ["epoch", "loss", "lr", "tok_s"]) for s in (1, 2, 3)]
    _, _, state = load_checkpoint(tmp_path / "run" / "checkpoint")
    assert state.step == 3 and [h["step"] for h in state.history] == [2]


def test_what_the_user_can_fix_is_an_engine_error(tmp_path):
    with pytest.raises(EngineError, match="no checkpoint in"):
        run_training(tmp_path / "run", tiny_config(), export_only=True)
    with pytest.raises(EngineError, match="corpus folder not found"):
        run_training(tmp_path / "run", tiny_config(), corpus_specs=[str(tmp_path / "missing")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineError, match="the corpus is empty"):
        run_training(tmp_path / "run", tiny_config(), corpus_specs=[str(tmp_path / "empty")])
