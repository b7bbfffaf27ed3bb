"""Training a draft model by distillation from its target.

The draft is the target's architecture, smaller (fewer and narrower layers), with the target's
tokenizer, so its guesses are the target's tokens. What it learns is the target's next-token
distribution, not the corpus: the target's top-k logits at every position of the training windows
are computed once, before training, and stored in the run folder, so the target runs once per token
of data however many steps follow. The loss is the cross-entropy of the draft's distribution
against the target's top-k (renormalised). At the end: held-out agreement of the draft's greedy
token with the target's, the number that decides acceptance. `run_draft` is a whole run.
"""

from __future__ import annotations

import copy
import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..loading.torch_load import load_on_torch
from ..protocol import EngineError, EngineSpec
from . import Progress, checkpoint
from .heads import split_files, windows_from_texts
from .optim import Schedule, adamw, fit

CHECKPOINT_FILE = "draft_state.pt"  # in the run folder
TEACHER_FILE = "teacher_topk.pt"  # the target's top-k over the training windows, computed once


@dataclass
class DraftTrainConfig:
    layers: int = 0  # 0: a fifth of the target's, at least 1
    hidden: int = 0  # 0: half the target's width (with its layers a fifth: about a tenth of its weights)
    seq_len: int = 256
    batch: int = 8
    steps: int = 600
    lr: float = 1e-3
    warmup: int = 30
    top_k: int = 16  # target logits kept per position
    max_windows: int = 0  # 0: every training window; else the first N (the target runs once per token of them)
    seed: int = 1337
    checkpoint_every: int = 100

    def schedule(self) -> Schedule:
        return Schedule(self.lr, self.warmup, self.steps)


@dataclass
class DraftState:
    step: int = 0
    elapsed_s: float = 0.0
    losses: list = field(default_factory=list)


def draft_config(target_config, layers: int = 0, hidden: int = 0):
    """The target's config, smaller: `layers` layers of width `hidden` (0: the defaults above), the
    head size kept, the vocabulary and positions unchanged."""
    if not hasattr(target_config, "intermediate_size"):
        raise EngineError(f"train draft builds drafts for Llama-style targets (Llama, Qwen2, Mistral); "
                          f"{target_config.model_type} is not one")
    config = copy.deepcopy(target_config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    layers = layers or max(1, config.num_hidden_layers // 5)
    hidden = hidden or max(head_dim, config.hidden_size // 2 // head_dim * head_dim)
    if hidden % head_dim:
        raise EngineError(f"the draft width {hidden} must be a multiple of the target's head size {head_dim}")
    heads = hidden // head_dim
    kv_ratio = max(1, config.num_attention_heads // getattr(config, "num_key_value_heads", config.num_attention_heads))
    config.num_hidden_layers = layers
    config.hidden_size = hidden
    config.num_attention_heads = heads
    config.num_key_value_heads = max(1, heads // kv_ratio) if heads % max(1, heads // kv_ratio) == 0 else heads
    config.head_dim = head_dim
    config.intermediate_size = config.intermediate_size * hidden // target_config.hidden_size
    return config


@torch.no_grad()
def teacher_topk(model, windows: torch.Tensor, k: int, batch: int = 8,
                 progress: Progress | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's top-k logits (N, T, k) in float16 and their token ids (N, T, k)."""
    values, indices = [], []
    for i in range(0, len(windows), batch):
        logits = model(input_ids=windows[i:i + batch]).logits
        top = logits.float().topk(k, dim=-1)
        values.append(top.values.half().cpu())
        indices.append(top.indices.int().cpu())
        if progress:
            progress(min(i + batch, len(windows)), len(windows), {"stage": "target top-k"})
    return torch.cat(values), torch.cat(indices)


@torch.no_grad()
def init_embeddings_from_target(draft, target) -> None:
    """Start the draft's token embeddings (and output layer) as the target's, projected onto their
    top principal directions: a narrower draft then begins knowing which tokens are alike, and
    with tied embeddings its logits start as the target's on the projected hidden state."""
    source = target.get_input_embeddings().weight.float()
    width = draft.get_input_embeddings().weight.shape[1]
    _, _, v = torch.linalg.svd(source[:min(len(source), 16384)], full_matrices=False)  # a sample is enough
    basis = v[:width].T  # (target width, draft width)
    draft.get_input_embeddings().weight.copy_(source @ basis)
    out_d, out_t = draft.get_output_embeddings(), target.get_output_embeddings()
    if out_d is not None and out_t is not None and out_d.weight is not draft.get_input_embeddings().weight:
        out_d.weight.copy_(out_t.weight.float()[:len(out_d.weight)] @ basis)


def distillation_loss(logits: torch.Tensor, values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the draft's distribution against the target's top-k, renormalised."""
    target = torch.softmax(values.float(), dim=-1)
    log_q = torch.log_softmax(logits.float(), dim=-1).gather(-1, indices.long())
    return -(target * log_q).sum(-1).mean()


@torch.no_grad()
def agreement(draft, indices: torch.Tensor, windows: torch.Tensor, batch: int = 8) -> float:
    """Share of positions where the draft's greedy token is the target's."""
    same = total = 0
    for i in range(0, len(windows), batch):
        guess = draft(input_ids=windows[i:i + batch]).logits.argmax(-1).cpu()
        same += int((guess == indices[i:i + batch, :, 0]).sum())
        total += guess.numel()
    return round(same / max(1, total), 4)


def run_draft(target: str | None, out: Path, cfg: DraftTrainConfig, *, corpus_specs: list[str] | None = None,
              device: str | None = None, threads: int = 0, max_files: int = 2000, resume: bool = False,
              save_dtype: str = "bfloat16", command: str = "", log=print, progress: Progress | None = None) -> dict:
    """Train a draft for `target` on `corpus_specs`, checkpointing in `out` (resumable); the draft
    is saved to out/draft (save_pretrained, with the target's tokenizer). Returns the report, also
    written to out/draft_report.json."""
    from transformers import AutoModelForCausalLM

    if resume and not (out / CHECKPOINT_FILE).exists():
        raise EngineError(f"nothing to resume in {out} (no {CHECKPOINT_FILE})")
    engine = load_on_torch(EngineSpec(target, device=device, dtype="float32"))
    torch.set_num_threads(threads or os.cpu_count() or 1)
    teacher, tokenizer = engine.model, engine.tokenizer
    train_files, val_files = split_files(corpus_specs, cfg.seed, max_files)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    windows = windows_from_texts(tokenizer, [f.text for f in train_files], cfg.seq_len, eos)
    windows = windows[:cfg.max_windows] if cfg.max_windows else windows
    val_windows = windows_from_texts(tokenizer, [f.text for f in val_files], cfg.seq_len, eos)[:64]
    if len(windows) == 0:
        raise EngineError("the corpus is too small for one training window; give more code")
    out.mkdir(parents=True, exist_ok=True)

    stored = torch.load(out / TEACHER_FILE, weights_only=True) if (out / TEACHER_FILE).exists() else None
    if stored is not None and tuple(stored["indices"].shape) == (len(windows), cfg.seq_len, cfg.top_k):
        log(f"reusing the target's top-{cfg.top_k} stored in {out / TEACHER_FILE}")  # same corpus, same split
        values, indices = stored["values"], stored["indices"]
    else:
        log(f"computing the target's top-{cfg.top_k} on {len(windows)} windows of {cfg.seq_len} tokens")
        values, indices = teacher_topk(teacher, windows.to(engine.device), cfg.top_k, progress=progress)
        torch.save({"values": values, "indices": indices}, out / TEACHER_FILE)
    _, val_indices = teacher_topk(teacher, val_windows.to(engine.device), 1) if len(val_windows) else (None, None)

    torch.manual_seed(cfg.seed)
    config = draft_config(teacher.config, cfg.layers, cfg.hidden)
    draft = AutoModelForCausalLM.from_config(config).to(engine.device)
    if not resume:
        init_embeddings_from_target(draft, teacher)
    optimizer = adamw(draft.parameters(), cfg.lr, weight_decay=0.0)
    state = DraftState(**checkpoint.load(out / CHECKPOINT_FILE, "model", draft, optimizer)["state"]) if resume \
        else DraftState()
    params = sum(p.numel() for p in draft.parameters())
    target_params = sum(p.numel() for p in teacher.parameters())
    log(f"draft: {config.num_hidden_layers} layers of {config.hidden_size}, {params / 1e6:.2f}M parameters "
        f"({params / target_params:.0%} of the target's); step {state.step}/{cfg.steps}")
    del engine, teacher  # the target's work is done: its top-k is stored

    start = time.perf_counter() - state.elapsed_s
    draft.train()

    def loss_at(step: int) -> torch.Tensor:
        pick = random.Random(cfg.seed * 1_000_003 + step)  # the batch depends on the step only
        rows = [pick.randrange(len(windows)) for _ in range(cfg.batch)]
        logits = draft(input_ids=windows[rows].to(draft.device)).logits
        return distillation_loss(logits, values[rows].to(draft.device), indices[rows].to(draft.device))

    def after_step(loss: torch.Tensor, lr: float) -> None:
        state.elapsed_s = time.perf_counter() - start
        state.losses.append(round(float(loss.detach()), 4))
        if progress:
            progress(state.step, cfg.steps, {"loss": f"{state.losses[-1]:.3f}"})
        if state.step % cfg.checkpoint_every == 0 or state.step == cfg.steps:
            checkpoint.save(out / CHECKPOINT_FILE, "model", draft, optimizer, state=state.__dict__)

    fit(optimizer, cfg.schedule(), state, cfg.steps, loss_at, after_step)
    draft.eval()
    agree = agreement(draft, val_indices, val_windows.to(draft.device)) if val_indices is not None else None
    folder = out / "draft"
    draft.to(getattr(torch, save_dtype)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    report = {"steps": state.step, "train_seconds": round(state.elapsed_s, 1), "parameters": params,
              "target_parameters": target_params, "layers": config.num_hidden_layers, "hidden": config.hidden_size,
              "heldout_greedy_agreement": agree, "final_loss": state.losses[-1] if state.losses else None,
              "windows": len(windows), "seq_len": cfg.seq_len, "saved_to": str(folder), "dtype": save_dtype}
    report["corpus"] = corpus_specs or ["stdlib"]
    report["target"] = target or "the embedded model"
    (out / "draft_report.json").write_text(json.dumps(report, indent=2))
    (folder / "README.md").write_text(model_card(report, command))
    return report


def model_card(report: dict, command: str) -> str:
    """The draft's README: what it is for, what it learnt from, how it was made and how well it
    agrees with its target."""
    return f"""# Draft model for {report['target']}

A {report['parameters'] / 1e6:.1f}M-parameter causal LM ({report['layers']} layers of {report['hidden']}), \
{report['parameters'] / report['target_parameters']:.0%} of its target's parameters, with the target's \
tokenizer, distilled from the target's top-k next-token distributions by `memosight train draft`. \
It only proposes tokens: MemoSight's speculative decoding verifies every one with the target, so \
completions are exactly the target's greedy ones.

- Use: `draft_model = "<this folder>"` beside `model = "{report['target']}"`.
- Data: {', '.join(report['corpus'])} ({report['windows']} windows of {report['seq_len']} tokens), \
labelled by the target.
- Training: {report['steps']} steps, {report['train_seconds']} s, final distillation loss {report['final_loss']}.
- Held-out agreement with the target's greedy token: {report['heldout_greedy_agreement']}.
- Weights: {report['dtype']}.
- Command: `{command or 'memosight train draft'}`
"""
