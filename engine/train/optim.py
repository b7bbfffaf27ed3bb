"""How every trainer (base model, draft heads, fine-tune) steps: AdamW and the warmup + cosine
learning-rate schedule, one copy of each.

The trainers differ only in their knobs: the base model and the fine-tune decay to a floor of
`min_lr_ratio * lr`, the heads to zero (`min_lr_ratio=0.0` gives exactly the values of the heads'
former `lr * 0.5 * (1 + cos)`, since scaling by 0.5 and adding 0.0 round the same way); the base
model can also follow a wall-clock budget.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
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


def optimizer_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, lr: float) -> None:
    """One update at learning rate `lr`: gradients of `loss`, then the step."""
    set_lr(optimizer, lr)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
