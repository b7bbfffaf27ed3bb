"""Fine-tuning a causal LM on (prefix, suffix, middle) examples rendered with the engine's own FIM
prompt: the middle and an end token carry full weight, the prompt a small one (so the model also
keeps reading the prompt's format as code). The examples come from the caller; the engine never
sees how their contexts were built.

    rows = [encode_example(engine, prefix, suffix, middle) for ...]
    finetune(engine.model, rows, FinetuneConfig(steps=800), state)
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..protocol import EngineError, EngineSpec
from . import Progress, checkpoint
from .optim import Schedule, adamw, fit

CHECKPOINT_FILE = "finetune_state.pt"  # in the run folder


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

    def schedule(self) -> Schedule:
        return Schedule(self.lr, self.warmup, self.steps, self.min_lr_ratio)


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


def make_optimizer(model, cfg: FinetuneConfig) -> torch.optim.AdamW:
    for p in model.parameters():  # the engine loads its model frozen, for inference
        p.requires_grad_(True)
    return adamw(model.parameters(), cfg.lr, weight_decay=cfg.weight_decay)


def finetune(model, rows: list[Row], pad_id: int, cfg: FinetuneConfig, state: FinetuneState, optimizer,
             on_step: Callable[[FinetuneState, float], None] | None = None) -> FinetuneState:
    """Train from state.step to cfg.steps on random batches of `rows` (the batch order depends only
    on the seed and the step, so a resumed run draws the same batches)."""
    model.train()
    step_figures = {}

    def loss_at(step: int) -> torch.Tensor:
        rng = random.Random(cfg.seed * 1_000_003 + step)
        batch = [rows[rng.randrange(len(rows))] for _ in range(cfg.batch)]
        step_figures["start"] = time.perf_counter()
        loss, step_figures["nats"], step_figures["tokens"] = row_losses(model, batch, pad_id, cfg.prompt_weight)
        return loss

    def after_step(loss: torch.Tensor, lr: float) -> None:
        state.seconds += time.perf_counter() - step_figures["start"]
        state.history.append({"step": state.step,
                              "middle_loss": round(step_figures["nats"] / max(1, step_figures["tokens"]), 4)})
        if on_step:
            on_step(state, float(loss.detach()))

    fit(optimizer, cfg.schedule(), state, cfg.steps, loss_at, after_step, clip_params=list(model.parameters()),
        clip=1.0)
    model.eval()
    return state


def save_checkpoint(path: Path, model, optimizer, cfg: FinetuneConfig, state: FinetuneState) -> None:
    checkpoint.save(path / CHECKPOINT_FILE, "model", model, optimizer, config=asdict(cfg), state=asdict(state))


def load_checkpoint(path: Path, model, optimizer) -> tuple[FinetuneConfig, FinetuneState]:
    payload = checkpoint.load(path / CHECKPOINT_FILE, "model", model, optimizer)
    return FinetuneConfig(**payload["config"]), FinetuneState(**payload["state"])


# ----------------------------------------------------------------------------- a whole run
COPIED_FILES = ("memosight.json", "draft_heads.safetensors", "draft_heads.json", "draft_ngrams.npz")
Examples = list[tuple[str, str, str]]  # (prefix, suffix, middle)


def run_finetune(model: str | None, out: Path, cfg: FinetuneConfig,
                 make_examples: Callable[[Callable[[str], int]], tuple[Examples, Examples]], *,
                 device: str | None = None, threads: int = 0, checkpoint_every: int = 100, resume: bool = False,
                 save_to: Path | None = None, command: str = "", log: Callable[[str], None] = print,
                 progress: Progress | None = None) -> dict:
    """Fine-tune `model` (None: the embedded one) on the (training, held-out) examples that
    `make_examples(count_tokens)` returns, checkpointing in `out` (resumable), and save a complete
    model folder to `save_to` (default out/model). `progress(step, total, figures)` hears of every
    step. Returns the report; raises EngineError (the loader's ModelLoadError is one) with a
    message for the user."""
    import json
    import shutil

    from ..loading.torch_load import load_on_torch
    from .export import export_model

    if resume and not (out / CHECKPOINT_FILE).is_file():
        raise EngineError(f"nothing to resume in {out} (no {CHECKPOINT_FILE}); run without --resume")
    engine = load_on_torch(EngineSpec(model, device=device, dtype="float32"))
    torch.set_num_threads(threads or torch.get_num_threads())
    out.mkdir(parents=True, exist_ok=True)
    examples_file = out / "examples.pt"
    if examples_file.is_file():  # a resumed run trains on exactly the same examples
        saved = torch.load(examples_file, weights_only=False)
        train_rows, eval_rows = saved["train"], saved["eval"]
    else:
        train, held_out = make_examples(engine.count_tokens)
        encode = lambda examples: [encode_example(engine, *e, cfg.max_middle_tokens) for e in examples]  # noqa: E731
        train_rows, eval_rows = encode(train), encode(held_out)
        torch.save({"train": train_rows, "eval": eval_rows}, examples_file)
    log(f"{len(train_rows)} training examples, {len(eval_rows)} held-out")
    if not train_rows:
        raise EngineError("no training examples: give a corpus with longer source files")

    pad_id = min(engine.eos_ids)
    # A small corpus may hold no file out: the report then says None instead of a number.
    held_out_loss = lambda: round(middle_loss(engine.model, eval_rows, pad_id), 4) if eval_rows else None  # noqa: E731
    optimizer = make_optimizer(engine.model, cfg)
    report_file = out / "finetune_report.json"
    if resume:
        saved_cfg, state = load_checkpoint(out, engine.model, optimizer)
        cfg.seed = saved_cfg.seed  # the batch order must not change under a resumed run
        report = json.loads(report_file.read_text())
    else:
        state = FinetuneState()
        report = {"held_out_middle_loss_before": held_out_loss(), "train_examples": len(train_rows),
                  "held_out_examples": len(eval_rows), "command": command}
        report_file.write_text(json.dumps(report, indent=2) + "\n")

    def on_step(state: FinetuneState, loss: float) -> None:
        if progress:
            progress(state.step, cfg.steps, dict(loss=f"{loss:.3f}", middle=state.history[-1]["middle_loss"]))
        if state.step % checkpoint_every == 0 or state.step == cfg.steps:
            save_checkpoint(out, engine.model, optimizer, cfg, state)

    finetune(engine.model, train_rows, pad_id, cfg, state, optimizer, on_step)
    report.update({"held_out_middle_loss_after": held_out_loss(), "steps": state.step,
                   "train_minutes": round(state.seconds / 60, 1), **asdict(cfg)})
    report_file.write_text(json.dumps(report, indent=2) + "\n")

    save_to = save_to or out / "model"
    card = (f"# {engine.name}, fine-tuned on packed contexts\n\n`{command}`\n\n"
            f"Held-out middle loss: {report['held_out_middle_loss_before']} -> "
            f"{report['held_out_middle_loss_after']} nats/token.\n")
    export_model(engine.model, engine.tokenizer, save_to, card, report)
    base = Path(engine.model_dir) if engine.model_dir else None
    for name in COPIED_FILES:  # the prompt options, and draft files that still decode losslessly
        if base and (base / name).is_file() and base.resolve() != save_to.resolve():
            shutil.copy(base / name, save_to / name)
            (save_to / name).chmod(0o644)
    report["saved_to"] = str(save_to)
    return report
