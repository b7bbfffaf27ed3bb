"""Training the draft heads by self-distillation, the base model frozen.

The target of head k at position t is the base model's own greedy prediction for token t+1+k (its
argmax at position t+k), not the corpus token: what decides acceptance is agreement with the base
model, whatever the base model would write. Per-head losses are weighted by decay**k, since a later
head only pays off when every earlier one was right.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..drafts.heads import DraftHeads, HeadsConfig


@dataclass
class HeadsTrainConfig:
    num_heads: int = 4  # K
    num_layers: int = 1  # residual blocks per head
    seq_len: int = 256  # tokens per training window
    batch: int = 8  # windows per step
    steps: int = 600  # optimizer steps
    lr: float = 1e-3  # peak learning rate (cosine decay after warmup)
    warmup: int = 30  # warmup steps
    decay: float = 0.8  # per-head loss weight decay**k
    positions: int = 512  # positions per step whose head logits are scored (the vocab projection dominates)
    seed: int = 1337
    checkpoint_every: int = 100


@dataclass
class HeadsState:
    step: int = 0
    elapsed_s: float = 0.0
    losses: list = field(default_factory=list)


def windows_from_texts(tokenizer, texts: list[str], seq_len: int, eos_id: int, *, fim_prompt=None,
                       fim_rate: float = 0.0, seed: int = 0, fim_chars: int = 800) -> torch.Tensor:
    """Token windows (N, seq_len) of the texts, one after another, each text ended by EOS.

    With `fim_prompt(prefix, suffix) -> ids` (the engine's own prompt format), a share `fim_rate` of
    pieces of about `fim_chars` characters are written as the engine will prompt: the heads then
    learn from the hidden states they will see behind a fill-in-the-middle prompt."""
    from .model import fim_split, split_into_chunks

    rng = random.Random(seed)
    ids: list[int] = []
    for text in texts:
        if fim_prompt is None or fim_rate <= 0:
            ids.extend(tokenizer.encode(text, add_special_tokens=False))
            ids.append(eos_id)
            continue
        for chunk in split_into_chunks(text, fim_chars):
            if rng.random() < fim_rate:
                prefix, middle, suffix = fim_split(chunk, rng)
                ids.extend(fim_prompt(prefix, suffix))
                ids.extend(tokenizer.encode(middle, add_special_tokens=False))
            else:
                ids.extend(tokenizer.encode(chunk, add_special_tokens=False))
            ids.append(eos_id)
    n = len(ids) // seq_len
    return torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)


@torch.no_grad()
def base_outputs(model, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen base model's last hidden state (B, T, H) and greedy next tokens (B, T)."""
    hidden = model.base_model(input_ids=windows).last_hidden_state
    greedy = model.get_output_embeddings()(hidden).argmax(dim=-1)
    return hidden, greedy


def head_losses(heads: DraftHeads, lm_head, hidden: torch.Tensor, greedy: torch.Tensor,
                positions: int | None = None, generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """Cross-entropy of head k (1-based) against greedy[:, t+k], at `positions` random positions t
    (all of them when None) below T - K, so every head sees the same positions."""
    k_heads = len(heads.heads)
    b, t, h = hidden.shape
    flat = hidden[:, : t - k_heads].reshape(-1, h)  # (B*(T-K), H)
    index = torch.arange(flat.shape[0], device=hidden.device)
    if positions is not None and positions < len(index):
        index = torch.randperm(len(index), generator=generator)[:positions].to(hidden.device)
    rows, cols = index // (t - k_heads), index % (t - k_heads)
    out = heads(flat[index])  # (K, P, H)
    return [F.cross_entropy(lm_head(out[k - 1]).float(), greedy[rows, cols + k]) for k in range(1, k_heads + 1)]


@torch.no_grad()
def head_accuracy(heads: DraftHeads, model, windows: torch.Tensor, batch: int = 8) -> list[dict]:
    """Per head: top-1 and top-3 agreement with the base model's greedy token."""
    k_heads = heads.config.num_heads
    top1 = [0] * k_heads
    top3 = [0] * k_heads
    total = [0] * k_heads
    lm_head = model.get_output_embeddings()
    for i in range(0, len(windows), batch):
        hidden, greedy = base_outputs(model, windows[i:i + batch])
        out = heads(hidden)
        for k in range(1, k_heads + 1):
            logits = lm_head(out[k - 1][:, :-k])
            target = greedy[:, k:]
            best3 = logits.topk(3, dim=-1).indices
            top1[k - 1] += int((best3[..., 0] == target).sum())
            top3[k - 1] += int((best3 == target[..., None]).any(-1).sum())
            total[k - 1] += target.numel()
    return [{"head": k + 1, "top1": round(top1[k] / max(1, total[k]), 4), "top3": round(top3[k] / max(1, total[k]), 4)}
            for k in range(k_heads)]


def lr_at(step: int, cfg: HeadsTrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train_heads(model, heads: DraftHeads, windows: torch.Tensor, cfg: HeadsTrainConfig, state: HeadsState,
                optimizer: torch.optim.Optimizer, checkpoint, progress=None) -> None:
    """The flat loop: sample a batch, run the frozen base, step the heads; checkpoint now and then."""
    model.eval()
    heads.train()
    lm_head = model.get_output_embeddings()
    weights = [cfg.decay ** k for k in range(cfg.num_heads)]
    start = time.perf_counter() - state.elapsed_s
    while state.step < cfg.steps:
        rng = random.Random(cfg.seed * 1_000_003 + state.step)  # the batch depends on the step only: resumable
        batch = windows[[rng.randrange(len(windows)) for _ in range(cfg.batch)]]
        hidden, greedy = base_outputs(model, batch)
        losses = head_losses(heads, lm_head, hidden, greedy, cfg.positions,
                             torch.Generator().manual_seed(cfg.seed + state.step))
        loss = sum(w * l for w, l in zip(weights, losses)) / sum(weights)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(state.step, cfg)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        state.step += 1
        state.elapsed_s = time.perf_counter() - start
        loss_value = float(loss.detach())
        state.losses.append(round(loss_value, 4))
        if progress is not None:
            progress.update(1)
            progress.set_postfix(loss=f"{loss_value:.3f}", heads=" ".join(f"{float(l.detach()):.2f}" for l in losses))
        if state.step % cfg.checkpoint_every == 0 or state.step == cfg.steps:
            checkpoint(state)


def new_heads(model, cfg: HeadsTrainConfig) -> DraftHeads:
    torch.manual_seed(cfg.seed)
    config = HeadsConfig(model.config.hidden_size, cfg.num_heads, cfg.num_layers)
    return DraftHeads(config)


def save_checkpoint(path: Path, heads: DraftHeads, optimizer, state: HeadsState) -> None:
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / "heads_state.pt.tmp"
    torch.save({"heads": heads.state_dict(), "config": heads.config.__dict__, "optimizer": optimizer.state_dict(),
                "state": state.__dict__}, tmp)
    tmp.replace(path / "heads_state.pt")  # atomic: an interrupted save never corrupts the checkpoint


def load_checkpoint(path: Path, heads: DraftHeads, optimizer) -> HeadsState:
    data = torch.load(path / "heads_state.pt", weights_only=False)
    heads.load_state_dict(data["heads"])
    optimizer.load_state_dict(data["optimizer"])
    return HeadsState(**data["state"])
