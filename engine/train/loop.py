"""Training the base model, nanoGPT's train.py: the knobs (`TrainConfig`), held-out evaluation, the
flat training loop, its checkpoint, and `run_training`, a whole run from corpus to exported folder.

A run resumes exactly: an epoch's data depends only on (seed, epoch), the checkpoint holds the
weights, the optimizer and both RNG states, and the schedule is a function of the step (and of the
time spent, which the checkpoint also holds), so a paused and resumed run ends bit for bit where an
uninterrupted one does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..loading.threads import ThreadChooser
from ..protocol import EngineError
from . import Progress, checkpoint
from .corpus import Corpus, build_corpus, read_folder, resolve_sources
from .data import epoch_windows, eval_windows, spread_sample
from .export import export_model, folder_megabytes, model_card
from .model import PRESETS, ModelConfig, build_model, count_params
from .optim import adamw, fit
from .run import HeldOut, RunState, TrainConfig
from .tokenizer import load_tokenizer, save_tokenizer, train_tokenizer

CHECKPOINT_FILE = "state.pt"  # in RUN/checkpoint/
AUTO_THREADS_PROBE_EVERY = 40  # steps between tries of another thread count under --threads auto


# ----------------------------------------------------------------------------- knobs
def make_optimizer(model, cfg: TrainConfig) -> torch.optim.AdamW:
    return adamw(model.parameters(), cfg.lr, weight_decay=cfg.weight_decay, beta2=cfg.beta2,
                 decay_matrices_only=True, fused=False)


# ----------------------------------------------------------------------------- evaluation
def evaluate(model, windows: torch.Tensor, batch_size: int = 8, autocast: bool = True) -> HeldOut:
    return evaluate_with_predictions(model, windows, batch_size, autocast)[0]


@torch.no_grad()
def evaluate_with_predictions(model, windows: torch.Tensor, batch_size: int = 8,
                              autocast: bool = True) -> tuple[HeldOut, torch.Tensor]:
    """The held-out figures and the greedy next token at every position (N, T): two models (a
    dtype and its float original) compare on them."""
    model.eval()
    total_loss, correct, count, predicted = 0.0, 0, 0, []
    for i in range(0, len(windows), batch_size):
        batch = windows[i : i + batch_size]
        x, y = batch[:, :-1], batch[:, 1:]  # (B, T)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast and x.device.type == "cpu"):
            logits = model(input_ids=x).logits  # (B, T, V)
        logits = logits.float()
        total_loss += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        predicted.append(logits.argmax(-1))
        correct += (predicted[-1] == y).sum().item()
        count += y.numel()
    model.train()
    held_out = HeldOut(total_loss / max(count, 1), correct / max(count, 1), count)
    return held_out, torch.cat(predicted) if predicted else torch.empty(0, 0, dtype=torch.long)


# ----------------------------------------------------------------------------- the loop
def train(model, tokenizer, train_texts: list[str], val_windows: torch.Tensor, state: RunState,
          optimizer: torch.optim.Optimizer, save_checkpoint: Callable[[], None], log: Callable[[str], None],
          stop_at_step: int | None = None, threads: ThreadChooser | None = None,
          progress: Progress | None = None) -> None:
    """The training loop. Resumes at `state.step`: the data of an epoch depends only on (seed, epoch).
    `stop_at_step` pauses the run there (with a checkpoint), to be resumed later. `threads` picks
    the CPU thread count of each step by measurement (None: leave it as it is)."""
    cfg = state.train_config
    schedule = cfg.schedule()
    total_steps = cfg.steps()
    last_step = min(total_steps, stop_at_step or total_steps)
    windows_cache: dict[int, torch.Tensor] = {}

    def windows_of(epoch: int) -> torch.Tensor:
        if epoch not in windows_cache:
            windows_cache.clear()
            windows_cache[epoch] = epoch_windows(tokenizer, train_texts, cfg.seq_len, cfg.seed, epoch,
                                                 cfg.fim_rate, cfg.spm_rate)
        return windows_cache[epoch]

    steps_per_epoch = max(1, len(windows_of(0)) // cfg.batch_size)
    model.train()
    started = time.time()
    base_seconds = state.train_seconds
    tokens_per_step = cfg.batch_size * cfg.seq_len
    window = {"t0": time.time(), "step0": state.step}

    def loss_at(step: int) -> torch.Tensor:
        epoch, index = divmod(step, steps_per_epoch)
        data = windows_of(epoch)
        batch = data[torch.arange(index * cfg.batch_size, (index + 1) * cfg.batch_size) % len(data)]  # (B, T+1)
        x, y = batch[:, :-1], batch[:, 1:]  # (B, T)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            logits = model(input_ids=x).logits  # (B, T, V)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def after_step(loss: torch.Tensor, lr: float) -> bool:
        epoch = (state.step - 1) // steps_per_epoch
        state.tokens_seen += tokens_per_step
        state.train_seconds = base_seconds + (time.time() - started)
        speed = (state.step - window["step0"]) * tokens_per_step / max(1e-6, time.time() - window["t0"])
        if progress:
            figures = dict(loss=f"{loss.item():.3f}", lr=f"{lr:.1e}", tok_s=f"{speed:,.0f}", epoch=epoch)
            if cfg.max_minutes:  # a bar's own ETA counts steps; a time budget ends the run sooner
                figures["budget_left"] = f"{max(0.0, cfg.max_minutes - state.train_seconds / 60):.0f}min"
            progress(state.step, total_steps, figures)
        if state.step % 50 == 0:
            window.update(t0=time.time(), step0=state.step)
            steps_per_s = {t: round(1000 / ms, 3) for t, ms in threads.ms_per_unit.items()} if threads else {}
            log(f"step {state.step}/{total_steps} epoch {epoch} loss {loss.item():.4f} lr {lr:.2e} "
                f"tok/s {speed:,.0f} tokens {state.tokens_seen:,} elapsed {state.train_seconds / 60:.1f} min"
                + (f" threads {threads.best} (steps/s by threads {steps_per_s})" if threads else ""))
        if cfg.eval_every and (state.step % cfg.eval_every == 0 or state.step == total_steps):
            result = evaluate(model, val_windows[: max(1, cfg.eval_tokens // (cfg.seq_len + 1))], autocast=cfg.bf16)
            state.history.append({"step": state.step, "tokens": state.tokens_seen, "loss": round(result.loss, 4),
                                  "accuracy": round(result.accuracy, 4)})
            log(f"eval step {state.step}: held-out loss {result.loss:.4f} top-1 {result.accuracy:.4f}")
        out_of_time = cfg.max_minutes and state.train_seconds > cfg.max_minutes * 60
        if state.step % cfg.checkpoint_every == 0 or state.step == last_step or out_of_time:
            save_checkpoint()
        if out_of_time:
            log(f"stopping at step {state.step}: the {cfg.max_minutes:g}-minute budget is spent")
        return bool(out_of_time)

    fit(optimizer, schedule, state, last_step, loss_at, after_step, clip_params=list(model.parameters()),
        clip=cfg.grad_clip, elapsed_s=lambda: state.train_seconds,
        step_context=(lambda: threads.measured(1, restore=False)) if threads else contextlib.nullcontext)


def save_checkpoint(path: Path, model, optimizer, state: RunState) -> None:
    run_state = {**asdict(state), "model_config": asdict(state.model_config),
                 "train_config": asdict(state.train_config)}
    checkpoint.save(path / CHECKPOINT_FILE, "model", model, optimizer, run_state=run_state,
                    rng={"torch": torch.get_rng_state(), "python": random.getstate()})


def load_checkpoint(path: Path):
    """-> (model, optimizer, RunState) restored exactly."""
    payload = checkpoint.read(path / CHECKPOINT_FILE)
    raw = payload["run_state"]
    state = RunState(**{**raw, "model_config": ModelConfig(**raw["model_config"]),
                        "train_config": TrainConfig(**raw["train_config"])})
    model = build_model(state.model_config, seed=state.train_config.seed)
    optimizer = make_optimizer(model, state.train_config)
    checkpoint.restore(payload, "model", model, optimizer)
    torch.set_rng_state(payload["rng"]["torch"])
    random.setstate(payload["rng"]["python"])
    return model, optimizer, state


# ----------------------------------------------------------------------------- a whole run
@dataclass
class RunReport:
    """What a `run_training` call did, for the command to print."""

    step: int
    paused: bool  # stopped at stop_at_step before the last step: nothing evaluated or exported
    final: dict[str, HeldOut] = field(default_factory=dict)  # held-out results at export, by data set
    export_dir: Path | None = None
    megabytes: float = 0.0  # size of the exported folder


def run_training(out: Path, train_config: TrainConfig, *, corpus_specs: list[str] | None = None, size: str = "small",
                 val_fraction: float = 0.03, vocab_size: int = 12_288, tokenizer_from: str | None = None,
                 threads: int | str = 0, stop_at_step: int | None = None, resume: bool = False,
                 export_only: bool = False, export_to: Path | None = None, final_eval_tokens: int = 400_000,
                 eval_corpus: list[str] | None = None, command: str = "",
                 progress: Progress | None = None) -> RunReport:
    """Train (or resume, or only export) the base model in the run folder `out`: tokenizer/,
    checkpoint/, train.log; then evaluate it on held-out data and export it with its card to
    `export_to` (default out/model). A resumed run takes its knobs and corpus from the checkpoint,
    all but `max_minutes`. `corpus_specs`: the --corpus values (default stdlib and site); `threads`:
    a count, 0 = torch's default, or "auto" (measured per step). Raises EngineError for what the
    user can fix."""
    chooser = None
    if threads == "auto":
        chooser = ThreadChooser(range(1, (os.cpu_count() or 1) + 1), probe_every=AUTO_THREADS_PROBE_EVERY)
    elif int(threads):
        torch.set_num_threads(int(threads))
    out.mkdir(parents=True, exist_ok=True)
    checkpoint_dir = out / "checkpoint"
    def log(message: str) -> None:
        with (out / "train.log").open("a") as log_file:  # a line at a time: a killed run loses nothing
            log_file.write(message + "\n")

    continuing = resume or export_only
    if continuing and not (checkpoint_dir / CHECKPOINT_FILE).exists():
        raise EngineError(f"no checkpoint in {checkpoint_dir}")
    if continuing:
        model, optimizer, state = load_checkpoint(checkpoint_dir)
        if resume:
            state.command.append(command)
        corpus_specs, val_fraction = state.corpus, state.val_fraction  # the same files, the same split
    else:
        corpus_specs = corpus_specs or ["stdlib", "site"]
    corpus = build_corpus(resolve_sources(corpus_specs), val_fraction=val_fraction)
    if not corpus.train:
        raise EngineError("the corpus is empty")
    log(f"corpus: {len(corpus.train)} train files ({corpus.chars():,} chars), {len(corpus.validation)} held out; "
        f"skipped {corpus.skipped}")

    tokenizer = run_tokenizer(out / "tokenizer", corpus, tokenizer_from, vocab_size)

    if not continuing:
        model_config = dataclasses.replace(PRESETS[size], vocab_size=len(tokenizer),
                                           eos_token_id=tokenizer.eos_token_id)
        model = build_model(model_config, seed=train_config.seed)
        optimizer = make_optimizer(model, train_config)
        state = RunState(model_config, train_config, command=[command], corpus=corpus_specs, val_fraction=val_fraction)
    elif train_config.max_minutes:
        state.train_config.max_minutes = train_config.max_minutes
    params = count_params(model)
    cfg = state.train_config
    log(f"model: {params:,} params {asdict(state.model_config)}; training {cfg.tokens:,} tokens = {cfg.steps()} steps")

    val_texts = [f.text for f in corpus.validation] or [f.text for f in corpus.train[:1]]
    val_windows = eval_windows(tokenizer, val_texts, cfg.seq_len)

    if not export_only:
        train(model, tokenizer, [f.text for f in corpus.train], val_windows, state, optimizer,
              save_checkpoint=lambda: save_checkpoint(checkpoint_dir, model, optimizer, state), log=log,
              stop_at_step=stop_at_step, threads=chooser, progress=progress)
        if state.step < cfg.steps() and stop_at_step and state.step >= stop_at_step:
            return RunReport(state.step, paused=True)

    report = RunReport(state.step, paused=False)
    report.final = final_evaluation(model, tokenizer, corpus, val_windows, cfg, final_eval_tokens, eval_corpus or [])
    for name, result in report.final.items():
        log(f"final {name}: loss {result.loss:.4f} top-1 {result.accuracy:.4f} over {result.tokens:,} tokens")

    report.export_dir = export_to or out / "model"
    corpus_stats = {"train_files": len(corpus.train), "train_chars": corpus.chars(),
                    "validation_files": len(corpus.validation)}
    card = model_card(state, params, corpus.sources, corpus_stats, report.final)
    metrics = {"params": params, "tokens": state.tokens_seen, "steps": state.step,
               "train_minutes": round(state.train_seconds / 60, 2), "history": state.history,
               "final": {k: asdict(v) for k, v in report.final.items()}, "command": state.command}
    export_model(model, tokenizer, report.export_dir, card, metrics)
    report.megabytes = folder_megabytes(report.export_dir)
    log(f"exported to {report.export_dir} ({report.megabytes:.1f} MB)")
    return report


def run_tokenizer(folder: Path, corpus: Corpus, tokenizer_from: str | None, vocab_size: int):
    """The run's own tokenizer: the one saved in the run folder, else a copy of `tokenizer_from`,
    else one trained on the corpus (and reloaded from disk, as a resumed run will see it)."""
    if folder.exists():
        return load_tokenizer(folder)
    if tokenizer_from:
        tokenizer = load_tokenizer(tokenizer_from)
        save_tokenizer(tokenizer, folder)
        return tokenizer
    save_tokenizer(train_tokenizer((f.text for f in corpus.train), vocab_size=vocab_size), folder)
    return load_tokenizer(folder)


def final_evaluation(model, tokenizer, corpus: Corpus, val_windows: torch.Tensor, cfg: TrainConfig, max_tokens: int,
                     eval_corpus: list[str]) -> dict[str, HeldOut]:
    """Held-out results at export: all held-out files, the standard library's alone, each extra folder."""
    final = {"validation (all sources)": evaluate(model, spread_sample(val_windows, max_tokens), autocast=cfg.bf16)}
    stdlib_val = [f.text for f in corpus.validation if f.path.startswith("python-stdlib")]
    if stdlib_val:
        final["validation (stdlib only)"] = evaluate(
            model, eval_windows(tokenizer, stdlib_val, cfg.seq_len, max_tokens), autocast=cfg.bf16)
    for folder in eval_corpus:
        texts = [f.text for f in read_folder(folder)]
        if texts:
            final[f"eval: {Path(folder).name}"] = evaluate(
                model, eval_windows(tokenizer, texts, cfg.seq_len, max_tokens), autocast=cfg.bf16)
    return final
