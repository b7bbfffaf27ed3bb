"""How every trainer (base model, draft heads, draft model, fine-tune) steps: the one training loop
(`fit`), AdamW and the warmup + cosine learning-rate schedule, one copy of each. A trainer is a
configuration of them: its loss for a step, its schedule, what it does after a step.

The trainers differ only in their knobs: the base model and the fine-tune decay to a floor of
`min_lr_ratio * lr`, the heads to zero (`min_lr_ratio=0.0` gives exactly the values of the heads'
former `lr * 0.5 * (1 + cos)`, since scaling by 0.5 and adding 0.0 round the same way); the base
model can also follow a wall-clock budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Schedule:
    lr: float  # peak learning rate
    warmup: int  # linear warmup steps, from lr / warmup up to lr
    steps: int  # the step at which the cosine reaches its floor
    min_lr_ratio: float = 0.0  # the floor, as a share of lr
    max_minutes: float = 0.0  # wall-clock budget: decay follows time where it is further along; 0 = none


def lr_at(step: int, schedule: Schedule, elapsed_s: float = 0.0) -> float:
    """Linear warmup, then cosine decay. With a wall-clock budget the decay follows whichever of
    step progress and time progress is further, so a run cut by time still ends fully decayed."""
    s = schedule
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = min(1.0, (step - s.warmup) / max(1, s.steps - s.warmup))
    if s.max_minutes:
        progress = max(progress, min(1.0, elapsed_s / (s.max_minutes * 60)))
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def adamw(params: Iterable[torch.nn.Parameter], lr: float, *, weight_decay: float = 0.0, beta2: float = 0.999,
          decay_matrices_only: bool = False, fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW over `params`. With `decay_matrices_only`, two groups: weight decay on matrices only,
    never on norms and biases. The group layout is part of every checkpoint's optimizer state, so a
    trainer must keep its own (one group for heads and fine-tune, two for the base model)."""
    params = list(params)
    if decay_matrices_only:
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    else:
        groups = [{"params": params, "weight_decay": weight_decay}]
    # fused=None lets torch pick its multi-tensor kernel on CUDA; the base model's trainer passes False
    # (the single-tensor kernel) as it always has, so its runs stay bit-identical.
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, beta2), fused=fused)


def optimizer_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, lr: float,
                   clip_params: Iterable[torch.nn.Parameter] | None = None, clip: float = 0.0) -> None:
    """One update at learning rate `lr`: gradients of `loss` (their norm clipped to `clip` over
    `clip_params` where given), then the step."""
    set_lr(optimizer, lr)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(clip_params, clip)
    optimizer.step()


def fit(optimizer: torch.optim.Optimizer, schedule: Schedule, state, last_step: int,
        loss_at: Callable[[int], torch.Tensor], after_step: Callable[[torch.Tensor, float], bool | None], *,
        clip_params: Iterable[torch.nn.Parameter] | None = None, clip: float = 0.0,
        elapsed_s: Callable[[], float] = lambda: 0.0,
        step_context: Callable[[], AbstractContextManager] = nullcontext) -> None:
    """The training loop. From `state.step` to `last_step`: the loss of the step (`loss_at(step)`:
    its batch depends on the seed and the step only, so a resumed run draws the same batches), one
    update at the schedule's rate for that step (`elapsed_s()`: the seconds a wall-clock budget
    counts), `state.step += 1`, then `after_step(loss, lr)` (figures, progress, checkpoints), which
    returns True to stop early. `step_context()` wraps each step's work (a thread-count measurement)."""
    while state.step < last_step:
        with step_context():
            lr = lr_at(state.step, schedule, elapsed_s())
            loss = loss_at(state.step)
            optimizer_step(optimizer, loss, lr, clip_params, clip)
        state.step += 1
        if after_step(loss, lr):
            break
