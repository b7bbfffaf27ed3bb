"""The one learning-rate schedule and AdamW that every trainer uses."""

from __future__ import annotations

import pytest
import torch

from memosight.engine.train.finetune import FinetuneConfig
from memosight.engine.train.heads import HeadsTrainConfig
from memosight.engine.train.loop import TrainConfig
from memosight.engine.train.optim import Schedule, adamw, lr_at, set_lr


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(tokens=100 * 8 * 1024, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1).schedule()
    assert lr_at(0, cfg) == pytest.approx(1e-4) and lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(100, cfg) == pytest.approx(1e-4)
    timed = TrainConfig(tokens=100 * 8 * 1024, warmup_steps=10, lr=1e-3, max_minutes=1.0).schedule()
    assert lr_at(20, timed, elapsed_s=60.0) == pytest.approx(1e-4)  # out of time: fully decayed


def test_each_trainer_keeps_its_own_floor():
    heads = HeadsTrainConfig(steps=100, warmup=10, lr=1e-3).schedule()
    assert lr_at(100, heads) == 0.0 and lr_at(55, heads) == pytest.approx(5e-4)  # the heads decay to zero
    finetune = FinetuneConfig(steps=100, warmup=10, lr=1e-3, min_lr_ratio=0.1).schedule()
    assert lr_at(100, finetune) == pytest.approx(1e-4) and lr_at(5000, finetune) == pytest.approx(1e-4)
    assert lr_at(99, Schedule(1e-3, warmup=0, steps=100)) > 0.0  # no warmup: the cosine from step 0


def test_adamw_decays_matrices_only_when_asked_and_set_lr_moves_every_group():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    split = adamw(model.parameters(), 1e-3, weight_decay=0.1, beta2=0.95, decay_matrices_only=True)
    assert [len(g["params"]) for g in split.param_groups] == [1, 3]  # the weight matrix; biases and norm
    assert [g["weight_decay"] for g in split.param_groups] == [0.1, 0.0]
    assert split.param_groups[0]["betas"] == (0.9, 0.95)
    single = adamw(model.parameters(), 1e-3)
    assert len(single.param_groups) == 1 and single.param_groups[0]["weight_decay"] == 0.0
    set_lr(split, 5e-4)
    assert all(g["lr"] == 5e-4 for g in split.param_groups)


def test_the_one_loop_steps_from_the_state_clips_and_stops_when_asked():
    import types

    import torch

    from memosight.engine.train.optim import Schedule, adamw, fit

    weight = torch.nn.Parameter(torch.tensor([10.0]))
    optimizer = adamw([weight], 0.1)
    state = types.SimpleNamespace(step=3)  # resumed at step 3
    seen, rates = [], []

    def loss_at(step):
        seen.append(step)
        return (weight * 100) ** 2  # a huge gradient: clipped to 1 below

    def after_step(loss, lr):
        rates.append(lr)
        assert weight.grad.norm() <= 1.0 + 1e-6
        return state.step == 6  # stop early

    fit(optimizer, Schedule(lr=0.1, warmup=0, steps=100), state, 10, loss_at, after_step, clip_params=[weight], clip=1.0)
    assert seen == [3, 4, 5] and state.step == 6 and weight.item() < 10.0
    assert rates[0] > rates[-1]  # the schedule at each step's own number (cosine decay)
