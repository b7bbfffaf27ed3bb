"""Fine-tuning on (prefix, suffix, middle) examples."""

import pytest
import torch

from memosight.engine import load_engine
from memosight.engine.train import finetune as F


def test_rows_weight_the_middle_and_end_with_the_end_token(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu", dtype="float32")
    row = F.encode_example(engine, "def add(a, b):\n    ", "\n", "return a + b")
    prompt = engine.prompt_ids("def add(a, b):\n    ", "\n")
    assert row.ids[:row.middle_start] == prompt
    assert row.ids[row.middle_start:] == engine.encode("return a + b") + [min(engine.eos_ids)]
    capped = F.encode_example(engine, "x = ", "", "1 + 2 + 3 + 4", max_middle_tokens=2)
    assert capped.ids[capped.middle_start:] == engine.encode("1 + 2 + 3 + 4")[:2]  # cut: no end token
    short = F.Row([5, 6, 7], 2)
    ids, weights, middle = F.batch_tensors([row, short], pad_id=0, prompt_weight=0.1)
    assert ids.shape == (2, len(row.ids)) and ids[1, 3:].eq(0).all()
    assert middle[0].sum() == len(row.ids) - row.middle_start
    assert weights[0, 0] == 0.1 and weights[0, -1] == 1.0
    assert middle[1].tolist()[:2] == [False, True] and weights[1, 2:].eq(0).all()  # padding weighs nothing


def test_finetune_learns_the_middle_and_resumes_exactly(tmp_path, tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu", dtype="float32")
    rows = [F.encode_example(engine, f"def f{i}(x):\n    ", "\n", "return x * 2") for i in range(4)]
    pad = min(engine.eos_ids)
    before = F.middle_loss(engine.model, rows, pad)
    cfg = F.FinetuneConfig(steps=30, batch=4, lr=3e-3, warmup=2, seed=1)
    opt = F.make_optimizer(engine.model, cfg)
    state = F.finetune(engine.model, rows, pad, cfg, F.FinetuneState(), opt)
    assert state.step == 30 and len(state.history) == 30
    assert F.middle_loss(engine.model, rows, pad) < before * 0.5

    # A run killed after its step-3 checkpoint, resumed, ends where an uninterrupted run does.
    def fresh():
        e = load_engine(str(tiny_model_dir), device="cpu", dtype="float32")
        c = F.FinetuneConfig(steps=6, batch=2, lr=1e-3, warmup=1, seed=2)
        return e, c, F.make_optimizer(e.model, c)

    whole, cfg, opt = fresh()
    F.finetune(whole.model, rows, pad, cfg, F.FinetuneState(), opt)

    def killed_after_checkpoint(state, loss):
        if state.step == 3:
            F.save_checkpoint(tmp_path, part.model, part_opt, part_cfg, state)
            raise KeyboardInterrupt

    part, part_cfg, part_opt = fresh()
    with pytest.raises(KeyboardInterrupt):
        F.finetune(part.model, rows, pad, part_cfg, F.FinetuneState(), part_opt, killed_after_checkpoint)
    again, _, again_opt = fresh()
    cfg_loaded, state_loaded = F.load_checkpoint(tmp_path, again.model, again_opt)
    assert state_loaded.step == 3
    F.finetune(again.model, rows, pad, cfg_loaded, state_loaded, again_opt)
    for a, b in zip(whole.model.parameters(), again.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
