"""Training the draft heads by self-distillation, the base model frozen.

The target of head k at position t is the base model's own greedy prediction for token t+1+k (its
argmax at position t+k), not the corpus token: what decides acceptance is agreement with the base
model, whatever the base model would write. Per-head losses are weighted by decay**k, since a later
head only pays off when every earlier one was right. `run_heads` is a whole run: the corpus as
windows in the engine's own prompt format, the loop (resumable), the heads saved beside the model.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..drafts.heads import DraftHeads, HeadsConfig
from ..loading import load_engine
from ..protocol import EngineError
from . import Progress, checkpoint
from .corpus import build_corpus, resolve_sources
from .data import fim_split, split_into_chunks
from .optim import Schedule, adamw, lr_at, optimizer_step

CHECKPOINT_FILE = "heads_state.pt"  # in the run folder


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

    def schedule(self) -> Schedule:
        return Schedule(self.lr, self.warmup, self.steps)  # decays to zero


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


def train_heads(model, heads: DraftHeads, windows: torch.Tensor, cfg: HeadsTrainConfig, state: HeadsState,
                optimizer: torch.optim.Optimizer, save: Callable[[HeadsState], None],
                progress: Progress | None = None) -> None:
    """The flat loop: sample a batch, run the frozen base, step the heads; checkpoint now and then."""
    model.eval()
    heads.train()
    lm_head = model.get_output_embeddings()
    weights = [cfg.decay ** k for k in range(cfg.num_heads)]
    schedule = cfg.schedule()
    start = time.perf_counter() - state.elapsed_s
    while state.step < cfg.steps:
        rng = random.Random(cfg.seed * 1_000_003 + state.step)  # the batch depends on the step only: resumable
        batch = windows[[rng.randrange(len(windows)) for _ in range(cfg.batch)]]
        hidden, greedy = base_outputs(model, batch)
        losses = head_losses(heads, lm_head, hidden, greedy, cfg.positions,
                             torch.Generator().manual_seed(cfg.seed + state.step))
        loss = sum(w * l for w, l in zip(weights, losses)) / sum(weights)
        optimizer_step(optimizer, loss, lr_at(state.step, schedule))
        state.step += 1
        state.elapsed_s = time.perf_counter() - start
        loss_value = float(loss.detach())
        state.losses.append(round(loss_value, 4))
        if progress:
            progress(state.step, cfg.steps,
                    dict(loss=f"{loss_value:.3f}", heads=" ".join(f"{float(l.detach()):.2f}" for l in losses)))
        if state.step % cfg.checkpoint_every == 0 or state.step == cfg.steps:
            save(state)


def new_heads(model, cfg: HeadsTrainConfig) -> DraftHeads:
    torch.manual_seed(cfg.seed)
    config = HeadsConfig(model.config.hidden_size, cfg.num_heads, cfg.num_layers)
    return DraftHeads(config)


def make_optimizer(heads: DraftHeads, cfg: HeadsTrainConfig) -> torch.optim.AdamW:
    return adamw(heads.parameters(), cfg.lr, weight_decay=0.0)


def save_checkpoint(path: Path, heads: DraftHeads, optimizer, state: HeadsState) -> None:
    checkpoint.save(path / CHECKPOINT_FILE, "heads", heads, optimizer, config=heads.config.__dict__,
                    state=state.__dict__)


def load_checkpoint(path: Path, heads: DraftHeads, optimizer) -> HeadsState:
    return HeadsState(**checkpoint.load(path / CHECKPOINT_FILE, "heads", heads, optimizer)["state"])


def split_files(corpus_specs: list[str] | None, seed: int, max_files: int) -> tuple[list, list]:
    """(training files, up to `max_files` in a seeded order; held-out files, at most 60) of a corpus
    (default: the standard library). What every distilling trainer reads."""
    corpus = build_corpus(resolve_sources(corpus_specs or ["stdlib"]))
    train_files = sorted(corpus.train, key=lambda f: f.path)
    random.Random(seed).shuffle(train_files)
    train_files = train_files[:max_files]
    return train_files, sorted(corpus.validation, key=lambda f: f.path)[:60] or train_files[-20:]


# ----------------------------------------------------------------------------- a whole run
def run_heads(model: str | None, out: Path, cfg: HeadsTrainConfig, *, corpus_specs: list[str] | None = None,
              save_to: Path | None = None, device: str | None = None, threads: int = 0, fim_rate: float = 0.5,
              max_files: int = 2000, resume: bool = False, log: Callable[[str], None] = print,
              progress: Progress | None = None) -> dict:
    """Train draft heads for `model` (None: the embedded one) on `corpus_specs` (default stdlib),
    checkpointing in `out` (resumable), and save them beside the model (or to `save_to`). Returns the
    report, also written to out/heads_report.json. Raises EngineError (the loader's ModelLoadError
    is one) with a message for the user."""
    if resume and not (out / CHECKPOINT_FILE).exists():
        raise EngineError(f"nothing to resume in {out} (no {CHECKPOINT_FILE})")
    if threads:
        torch.set_num_threads(threads)
    engine = load_engine(model, device=device, dtype="float32")
    # load_engine picks the threads for decoding; training wants the asked-for count, or every core.
    torch.set_num_threads(threads or os.cpu_count() or 1)
    base, tokenizer = engine.model, engine.tokenizer
    for p in base.parameters():
        p.requires_grad_(False)
    save_to = save_to or (Path(engine.model_dir) if engine.model_dir else None)
    if save_to is None:
        raise EngineError(f"{model} is not a folder on this machine; pass --save-to DIR")
    train_files, val_files = split_files(corpus_specs, cfg.seed, max_files)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    # Prompts in the engine's own format: what the heads see at a cursor (plain prefix for non-FIM models).
    fim = {"fim_prompt": engine.prompt_ids, "fim_rate": fim_rate, "seed": cfg.seed} if engine.fim.name != "plain" else {}

    def windows_of(files) -> torch.Tensor:
        return windows_from_texts(tokenizer, [f.text for f in files], cfg.seq_len, eos, **fim)

    windows = windows_of(train_files).to(engine.device)
    val_windows = windows_of(val_files)[:64].to(engine.device)
    if len(windows) == 0:
        raise EngineError("the corpus is too small for one training window; give more code")

    out.mkdir(parents=True, exist_ok=True)
    heads = new_heads(base, cfg).to(engine.device)
    optimizer = make_optimizer(heads, cfg)
    state = load_checkpoint(out, heads, optimizer) if resume else HeadsState()
    log(f"training {cfg.num_heads} heads on {len(windows)} windows of {cfg.seq_len} tokens "
        f"({len(train_files)} files); step {state.step}/{cfg.steps}")
    train_heads(base, heads, windows, cfg, state, optimizer, lambda s: save_checkpoint(out, heads, optimizer, s),
                progress)
    heads.eval()
    accuracy = head_accuracy(heads, base, val_windows) if len(val_windows) else []
    save_to.mkdir(parents=True, exist_ok=True)
    heads.save(save_to)
    report = {"steps": state.step, "train_seconds": round(state.elapsed_s, 1), "heads": accuracy,
              "saved_to": str(save_to), "windows": len(windows), "seq_len": cfg.seq_len}
    (out / "heads_report.json").write_text(json.dumps(report, indent=2))
    return report
