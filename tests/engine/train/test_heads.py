"""Training draft heads: separate blocks that start as identity, and a loop that resumes exactly."""

import pytest
import torch

from memosight.engine import load_engine
from memosight.engine.train import heads as H


def test_a_run_killed_after_its_checkpoint_resumes_where_an_uninterrupted_one_ends(tmp_path, tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu", dtype="float32")
    windows = H.windows_from_texts(engine.tokenizer, [f"def f{i}(x):\n    return x * {i}\n" * 4 for i in range(8)],
                                   16, min(engine.eos_ids))
    cfg = H.HeadsTrainConfig(num_heads=2, seq_len=16, batch=2, steps=4, warmup=1, positions=8, checkpoint_every=2)

    def fresh():
        heads = H.new_heads(engine.model, cfg)
        return heads, H.make_optimizer(heads, cfg)

    whole, whole_opt = fresh()
    H.train_heads(engine.model, whole, windows, cfg, H.HeadsState(), whole_opt, save=lambda state: None)

    def killed_after_checkpoint(state):
        H.save_checkpoint(tmp_path, part, part_opt, state)
        raise KeyboardInterrupt

    part, part_opt = fresh()
    with pytest.raises(KeyboardInterrupt):
        H.train_heads(engine.model, part, windows, cfg, H.HeadsState(), part_opt, save=killed_after_checkpoint)
    again, again_opt = fresh()
    state = H.load_checkpoint(tmp_path, again, again_opt)
    assert state.step == 2
    H.train_heads(engine.model, again, windows, cfg, state, again_opt, save=lambda state: None)
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), again.parameters()))
