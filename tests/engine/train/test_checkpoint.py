"""Checkpoints: written atomically under the trainer's keys, restored exactly."""

from __future__ import annotations

import torch

from memosight.engine.train import checkpoint


def test_a_checkpoint_restores_weights_and_optimizer_state(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    checkpoint.save(tmp_path / "run" / "state.pt", "model", model, optimizer, state={"step": 1})

    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["state.pt"]  # no .tmp left behind
    payload = torch.load(tmp_path / "run" / "state.pt", weights_only=False)
    assert set(payload) == {"model", "optimizer", "state"}

    again = torch.nn.Linear(3, 2)
    again_opt = torch.optim.AdamW(again.parameters(), lr=0.1)
    assert checkpoint.load(tmp_path / "run" / "state.pt", "model", again, again_opt)["state"] == {"step": 1}
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], again_opt.state_dict()["state"][0]["exp_avg"])
