"""Fine-tuning a causal LM on (prefix, suffix, middle) examples rendered with the engine's own FIM
prompt: the middle and an end token carry full weight, the prompt a small one (so the model also
keeps reading the prompt's format as code). The examples come from the caller; the engine never
sees how their contexts were built.

    rows = [encode_example(engine, prefix, suffix, middle) for ...]
    finetune(engine.model, rows, FinetuneConfig(steps=800), state)
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F


@dataclass
class FinetuneConfig:
    steps: int = 800
    batch: int = 8
    lr: float = 1e-4
    warmup: int = 50  # Adam's first steps move every weight by ~lr whatever its gradient: ramp up
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0  # a short run from a trained model: no pull towards zero
    prompt_weight: float = 0.1  # loss weight of prompt tokens relative to the middle's
    max_middle_tokens: int = 64
    seed: int = 0


@dataclass
class Row:
    ids: list[int]
    middle_start: int  # ids[middle_start:] is the middle (and its end token)


@dataclass
class FinetuneState:
    step: int = 0
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)  # step, loss of the middle tokens


def encode_example(engine, prefix: str, suffix: str, middle: str, max_middle_tokens: int = 64) -> Row:
    """The prompt the engine would send for (prefix, suffix), then the middle and an end token (the
    model learns to stop where the suffix takes over). A middle cut at the cap gets no end token."""
    prompt = engine.prompt_ids(prefix, suffix)
    target = engine.encode(middle)[:max_middle_tokens]
    if len(target) < max_middle_tokens:
        target.append(min(engine.eos_ids))
    return Row(prompt + target, len(prompt))


def batch_tensors(rows: list[Row], pad_id: int, prompt_weight: float):
    """-> ids (right-padded), per-position loss weights for predicting ids[:, 1:], and which of those
    positions predict the middle."""
    length = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    weights = torch.zeros((len(rows), length - 1))
    middle = torch.zeros((len(rows), length - 1), dtype=torch.bool)
    for i, row in enumerate(rows):
        n = len(row.ids)
        ids[i, :n] = torch.tensor(row.ids)
        weights[i, :row.middle_start - 1] = prompt_weight  # predicting prompt tokens 1..start-1
        weights[i, row.middle_start - 1:n - 1] = 1.0  # predicting the middle
        middle[i, row.middle_start - 1:n - 1] = True
    return ids, weights, middle


def row_losses(model, rows: list[Row], pad_id: int, prompt_weight: float):
    """(weighted mean loss over the batch, summed middle nats, middle tokens)."""
    device = next(model.parameters()).device
    ids, weights, middle = (t.to(device) for t in batch_tensors(rows, pad_id, prompt_weight))
    # Padding only ever follows a row's tokens, so causal attention alone keeps it out of their view
    # (and its weight is 0): no attention mask, which keeps SDPA on its fast causal path.
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = model(input_ids=ids).logits
    nats = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")
    loss = (nats * weights).sum() / weights.sum()
    return loss, float(nats.detach()[middle].sum()), int(middle.sum())


@torch.no_grad()
def middle_loss(model, rows: list[Row], pad_id: int, batch: int = 8) -> float:
    """Mean nats per middle token: the held-out measure of a fine-tune."""
    was_training = model.training
    model.eval()
    nats = tokens = 0
    for start in range(0, len(rows), batch):
        _, n, t = row_losses(model, rows[start:start + batch], pad_id, 0.0)
        nats, tokens = nats + n, tokens + t
    model.train(was_training)
    return nats / max(1, tokens)


def lr_at(step: int, cfg: FinetuneConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model, cfg: FinetuneConfig) -> torch.optim.AdamW:
    for p in model.parameters():
        p.requires_grad_(True)
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def finetune(model, rows: list[Row], pad_id: int, cfg: FinetuneConfig, state: FinetuneState, optimizer,
             on_step: Callable[[FinetuneState, float], None] | None = None) -> FinetuneState:
    """Train from state.step to cfg.steps on random batches of `rows` (the batch order depends only
    on the seed and the step, so a resumed run draws the same batches)."""
    model.train()
    while state.step < cfg.steps:
        rng = random.Random(cfg.seed * 1_000_003 + state.step)
        batch = [rows[rng.randrange(len(rows))] for _ in range(cfg.batch)]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(state.step, cfg)
        start = time.perf_counter()
        loss, nats, tokens = row_losses(model, batch, pad_id, cfg.prompt_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        state.seconds += time.perf_counter() - start
        state.step += 1
        state.history.append({"step": state.step, "middle_loss": round(nats / max(1, tokens), 4)})
        if on_step:
            on_step(state, float(loss.detach()))
    model.eval()
    return state


def save_state(path: Path, model, optimizer, cfg: FinetuneConfig, state: FinetuneState) -> None:
    path.mkdir(parents=True, exist_ok=True)
    payload = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
               "config": asdict(cfg), "state": asdict(state)}
    tmp = path / "finetune_state.pt.tmp"
    torch.save(payload, tmp)
    os.replace(tmp, path / "finetune_state.pt")  # a crash mid-write never leaves a broken checkpoint


def load_state(path: Path, model, optimizer) -> tuple[FinetuneConfig, FinetuneState]:
    payload = torch.load(path / "finetune_state.pt", map_location="cpu", weights_only=False)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    return FinetuneConfig(**payload["config"]), FinetuneState(**payload["state"])
