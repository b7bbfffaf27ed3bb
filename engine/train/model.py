"""The MemoSight base model: a small Llama trained from scratch on code with a FIM objective.

Read top to bottom: the model config, the FIM sample format, the packed data, evaluation, the
training loop (knobs in `TrainConfig`), checkpoints, export. `run_model.py` is only the CLI glue.

Sample formats (StarCoder special tokens; E = <|endoftext|>):
    plain  {code}E
    PSM    <fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>{middle}E
    SPM    <fim_prefix><fim_suffix>{suffix}<fim_middle>{prefix}{middle}E
Samples are packed back to back into fixed-length windows; the loss is next-token cross-entropy
on every position.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from .tokenizer import EOS, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX


# ----------------------------------------------------------------------------- model config
@dataclass
class ModelConfig:
    vocab_size: int = 12_288  # must equal len(tokenizer)
    n_layer: int = 6  # transformer blocks
    n_head: int = 8  # query heads
    n_kv_head: int = 4  # key/value heads (grouped-query attention; fewer = smaller KV cache)
    n_embd: int = 256  # hidden size
    ffn_dim: int = 768  # SwiGLU inner size
    max_position_embeddings: int = 4096  # what the config allows; the model was trained on seq_len
    rope_theta: float = 10_000.0  # RoPE base
    eos_token_id: int = 0  # <|endoftext|>, also the padding token


PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(n_layer=2, n_head=2, n_kv_head=1, n_embd=32, ffn_dim=64),  # tests only
    "small": ModelConfig(),  # ~6M params with a 12k vocab: the shipped default on a 2-core CPU budget
    "base": ModelConfig(n_layer=8, n_head=8, n_kv_head=4, n_embd=384, ffn_dim=1024),
}


def llama_config(cfg: ModelConfig):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.n_embd,
        intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_kv_head,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        rms_norm_eps=1e-5,
        initializer_range=0.02,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.eos_token_id,
    )


def build_model(cfg: ModelConfig, seed: int = 0):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(cfg))
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.pad_token_id = cfg.eos_token_id
    model.generation_config.bos_token_id = None
    return model


def count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())  # tied embeddings are counted once


# ----------------------------------------------------------------------------- FIM samples
def fim_split(text: str, rng: random.Random) -> tuple[str, str, str]:
    """Cut `text` into prefix/middle/suffix at character positions.

    Half the time the middle is a random span (StarCoder); otherwise it starts at a random
    position and runs to the end of its line or a few lines further, as when a cursor sits
    mid-line and the user wants the rest of the line or the next statements."""
    if rng.random() < 0.5:
        a, b = sorted(rng.randrange(len(text) + 1) for _ in range(2))
    else:
        a = rng.randrange(len(text) + 1)
        b = a
        for _ in range(rng.choice((1, 1, 1, 2, 3, 5))):
            nl = text.find("\n", b)
            b = len(text) if nl < 0 else nl + 1
            if rng.random() < 0.5 and b < len(text):  # the middle often excludes the newline
                b -= 1
                break
    return text[:a], text[a:b], text[b:]


def sample_pieces(text: str, rng: random.Random, fim_rate: float, spm_rate: float) -> list[str]:
    """One document as a list of pieces; special tokens are pieces of their own."""
    if rng.random() >= fim_rate:
        return [text, EOS]
    prefix, middle, suffix = fim_split(text, rng)
    if rng.random() < spm_rate:
        # StarCoder SPM: prefix and middle are tokenized as one run, as the model will generate them
        return [FIM_PREFIX, FIM_SUFFIX, suffix, FIM_MIDDLE, prefix + middle, EOS]
    return [FIM_PREFIX, prefix, FIM_SUFFIX, suffix, FIM_MIDDLE, middle, EOS]


def split_into_chunks(text: str, max_chars: int) -> list[str]:
    """Line-aligned pieces of at most ~max_chars, so that a FIM sample fits in one window."""
    if len(text) <= max_chars:
        return [text]
    chunks, start = [], 0
    while start < len(text):
        end = min(len(text), start + max_chars)
        if end < len(text):
            nl = text.rfind("\n", start + max_chars // 2, end)
            end = nl + 1 if nl >= 0 else end
        chunks.append(text[start:end])
        start = end
    return chunks


def encode_pieces(tokenizer, docs: list[list[str]]) -> list[int]:
    """Concatenate the token ids of every document; specials map to their ids directly."""
    specials = {t: tokenizer.convert_tokens_to_ids(t) for t in (EOS, FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE)}
    plain = [p for doc in docs for p in doc if p not in specials and p]
    encoded = iter(tokenizer(plain, add_special_tokens=False, verbose=False)["input_ids"]) if plain else iter(())
    ids: list[int] = []
    for doc in docs:
        for piece in doc:
            if piece in specials:
                ids.append(specials[piece])
            elif piece:
                ids.extend(next(encoded))
    return ids


def pack_windows(ids: list[int], window: int) -> torch.Tensor:
    """(N, window) non-overlapping windows of the token stream; the ragged tail is dropped."""
    n = len(ids) // window
    return torch.tensor(ids[: n * window], dtype=torch.long).view(n, window)


def epoch_windows(tokenizer, texts: list[str], seq_len: int, seed: int, epoch: int,
                  fim_rate: float, spm_rate: float) -> torch.Tensor:
    """The training windows of one epoch, (N, seq_len + 1); deterministic in (seed, epoch)."""
    rng = random.Random(seed * 1_000_003 + epoch)
    chunks = [c for t in texts for c in split_into_chunks(t, max_chars=int(seq_len * 3.2))]
    rng.shuffle(chunks)
    docs = [sample_pieces(c, rng, fim_rate, spm_rate) for c in chunks]
    return pack_windows(encode_pieces(tokenizer, docs), seq_len + 1)


def eval_windows(tokenizer, texts: list[str], seq_len: int, max_tokens: int | None = None) -> torch.Tensor:
    """Held-out windows: plain left-to-right documents, in a fixed order, no FIM."""
    windows = pack_windows(encode_pieces(tokenizer, [[t, EOS] for t in texts]), seq_len + 1)
    return spread_sample(windows, max_tokens) if max_tokens else windows


def spread_sample(windows: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """At most max_tokens worth of windows, evenly spaced so that every part of the data counts."""
    n = max(1, max_tokens // windows.shape[1])
    if n >= len(windows):
        return windows
    return windows[torch.linspace(0, len(windows) - 1, n).long()]


# ----------------------------------------------------------------------------- evaluation
@dataclass
class HeldOut:
    loss: float  # mean next-token cross-entropy (nats)
    accuracy: float  # top-1 next-token accuracy
    tokens: int  # predictions scored


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, batch_size: int = 8, autocast: bool = True) -> HeldOut:
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    for i in range(0, len(windows), batch_size):
        batch = windows[i : i + batch_size]
        x, y = batch[:, :-1], batch[:, 1:]  # (B, T)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast and x.device.type == "cpu"):
            logits = model(input_ids=x).logits  # (B, T, V)
        logits = logits.float()
        total_loss += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
        count += y.numel()
    model.train()
    return HeldOut(total_loss / max(count, 1), correct / max(count, 1), count)


# ----------------------------------------------------------------------------- training
@dataclass
class TrainConfig:
    seq_len: int = 1024  # tokens per training window
    batch_size: int = 8  # windows per optimizer step
    tokens: int = 20_000_000  # total training tokens; sets the number of steps and the LR schedule
    lr: float = 2e-3  # peak learning rate (AdamW)
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 100  # linear warmup
    weight_decay: float = 0.1  # on matrices only, not norms
    beta2: float = 0.95
    grad_clip: float = 1.0
    fim_rate: float = 0.5  # share of samples in FIM format
    spm_rate: float = 0.5  # share of FIM samples in SPM order (the rest PSM)
    seed: int = 1337  # model init, data order and FIM splits
    eval_every: int = 200  # steps between quick held-out evaluations
    eval_tokens: int = 60_000  # held-out tokens for the quick evaluations
    checkpoint_every: int = 100  # steps between checkpoints
    bf16: bool = True  # bf16 autocast (CPU)
    max_minutes: float = 0.0  # wall-clock budget: the LR decays to its floor and training stops by then; 0 = none

    def steps(self) -> int:
        return max(1, self.tokens // (self.batch_size * self.seq_len))


class ThreadTuner:
    """Picks the torch CPU thread count that trains fastest right now.

    On a shared machine, a second busy process can make every multi-threaded kernel wait for the
    thread that lost its core; then fewer threads are faster. Every `probe_every` steps the tuner
    runs `probe_len` steps with each other count and keeps the fastest (timings are per step)."""

    def __init__(self, choices: list[int], probe_every: int = 40, probe_len: int = 4):
        self.choices, self.probe_every, self.probe_len = choices, probe_every, probe_len
        self.best = max(choices)
        self.speed: dict[int, float] = {}  # threads -> steps per second, latest probe
        self.current = torch.get_num_threads()
        self._samples: dict[int, list[float]] = {}

    def threads_for(self, step: int) -> int:
        slot = step % self.probe_every
        if slot < self.probe_len * len(self.choices):
            return self.choices[slot // self.probe_len]
        return self.best

    def record(self, step: int, threads: int, seconds: float) -> None:
        slot = step % self.probe_every
        if slot % self.probe_len == 0:  # the first step after a switch pays for thread start-up
            return
        if slot < self.probe_len * len(self.choices):
            self._samples.setdefault(threads, []).append(seconds)
        if slot == self.probe_len * len(self.choices) - 1 and self._samples:
            self.speed = {t: len(v) / sum(v) for t, v in self._samples.items()}
            self.best = max(self.speed, key=self.speed.get)
            self._samples = {}

    def apply(self, threads: int) -> None:
        if threads != self.current:
            torch.set_num_threads(threads)
            self.current = threads


def lr_at(step: int, cfg: TrainConfig, elapsed_s: float = 0.0) -> float:
    """Linear warmup, then cosine decay. With a wall-clock budget the decay follows whichever of
    step progress and time progress is further, so a run cut by time still ends fully decayed."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps() - cfg.warmup_steps))
    if cfg.max_minutes:
        progress = max(progress, min(1.0, elapsed_s / (cfg.max_minutes * 60)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model, cfg: TrainConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2), fused=False)


@dataclass
class RunState:
    """Everything a checkpoint holds besides the tensors; also what the model card reports."""

    model_config: ModelConfig
    train_config: TrainConfig
    step: int = 0
    tokens_seen: int = 0
    train_seconds: float = 0.0  # wall time spent in the training loop, summed over resumes
    command: list[str] = field(default_factory=list)  # one entry per launch (first, then resumes)
    history: list[dict] = field(default_factory=list)  # quick evaluations: step, tokens, loss, accuracy
    corpus: list[str] = field(default_factory=list)  # the --corpus values, reused on resume
    val_fraction: float = 0.03  # share of files held out by content hash


def train(model, tokenizer, train_texts: list[str], val_windows: torch.Tensor, state: RunState,
          optimizer: torch.optim.Optimizer, save_checkpoint: Callable[[], None], log: Callable[[str], None],
          stop_at_step: int | None = None, tuner: ThreadTuner | None = None) -> None:
    """The training loop. Resumes at `state.step`: the data of an epoch depends only on (seed, epoch).
    `stop_at_step` pauses the run there (with a checkpoint), to be resumed later."""
    from tqdm import tqdm

    cfg = state.train_config
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
    bar = tqdm(total=total_steps, initial=state.step, unit="step", file=sys.stderr, dynamic_ncols=True,
               mininterval=2.0)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    window_t0, window_step0 = time.time(), state.step
    while state.step < last_step:
        epoch, index = divmod(state.step, steps_per_epoch)
        data = windows_of(epoch)
        rows = torch.arange(index * cfg.batch_size, (index + 1) * cfg.batch_size) % len(data)
        batch = data[rows]  # (B, T+1)
        x, y = batch[:, :-1], batch[:, 1:]  # (B, T)

        if tuner:
            threads = tuner.threads_for(state.step)
            tuner.apply(threads)
        step_t0 = time.time()
        lr = lr_at(state.step, cfg, state.train_seconds)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            logits = model(input_ids=x).logits  # (B, T, V)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()

        if tuner:
            tuner.record(state.step, threads, time.time() - step_t0)
        state.step += 1
        state.tokens_seen += tokens_per_step
        state.train_seconds = base_seconds + (time.time() - started)
        speed = (state.step - window_step0) * tokens_per_step / max(1e-6, time.time() - window_t0)
        postfix = dict(loss=f"{loss.item():.3f}", lr=f"{lr:.1e}", tok_s=f"{speed:,.0f}", epoch=epoch)
        if cfg.max_minutes:  # the bar's own ETA counts steps; a time budget ends the run sooner
            postfix["budget_left"] = f"{max(0.0, cfg.max_minutes - state.train_seconds / 60):.0f}min"
        bar.set_postfix(**postfix, refresh=False)
        bar.update(1)
        if state.step % 50 == 0:
            window_t0, window_step0 = time.time(), state.step
            log(f"step {state.step}/{total_steps} epoch {epoch} loss {loss.item():.4f} lr {lr:.2e} "
                f"tok/s {speed:,.0f} tokens {state.tokens_seen:,} elapsed {state.train_seconds / 60:.1f} min"
                + (f" threads {tuner.best} (steps/s by threads {tuner.speed})" if tuner else ""))
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
            break
    bar.close()


# ----------------------------------------------------------------------------- checkpoints
def save_checkpoint(path: Path, model, optimizer, state: RunState) -> None:
    path.mkdir(parents=True, exist_ok=True)
    payload = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "run_state": {**asdict(state), "model_config": asdict(state.model_config),
                      "train_config": asdict(state.train_config)},
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
    }
    tmp = path / "state.pt.tmp"
    torch.save(payload, tmp)
    os.replace(tmp, path / "state.pt")  # a crash mid-write never leaves a broken checkpoint


def load_checkpoint(path: Path):
    """-> (model, optimizer, RunState) restored exactly."""
    payload = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    raw = payload["run_state"]
    state = RunState(**{**raw, "model_config": ModelConfig(**raw["model_config"]),
                        "train_config": TrainConfig(**raw["train_config"])})
    model = build_model(state.model_config, seed=state.train_config.seed)
    model.load_state_dict(payload["model"])
    optimizer = make_optimizer(model, state.train_config)
    optimizer.load_state_dict(payload["optimizer"])
    torch.set_rng_state(payload["rng"]["torch"])
    random.setstate(payload["rng"]["python"])
    return model, optimizer, state


# ----------------------------------------------------------------------------- export
def export_model(model, tokenizer, out_dir: Path, card: str, metrics: dict) -> None:
    """save_pretrained in bf16 safetensors + tokenizer + model card; loads with from_pretrained."""
    import copy

    out_dir.mkdir(parents=True, exist_ok=True)
    shipped = copy.deepcopy(model).to(torch.bfloat16)
    shipped.config.dtype = torch.bfloat16
    shipped.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    (out_dir / "README.md").write_text(card)
    (out_dir / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    for path in out_dir.iterdir():
        path.chmod(0o644)  # save_pretrained writes the weights 0600; package data must be readable


def folder_megabytes(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def model_card(state: RunState, params: int, licences: Iterable[str], corpus_stats: dict,
               final: dict[str, HeldOut], export_dir: Path | None = None) -> str:
    m, t = state.model_config, state.train_config
    lines = [
        "# MemoSight default code model",
        "",
        "A small Llama-architecture causal LM trained from scratch on CPU for code completion in",
        "MemoSight, with a fill-in-the-middle objective (StarCoder special tokens, PSM and SPM).",
        "Prompt format: `<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>`; the model writes the",
        "middle and then `<|endoftext|>`. Plain left-to-right prompts work too.",
        "",
        "## Model",
        "",
        f"- Parameters: {params:,} ({m.n_layer} layers, hidden {m.n_embd}, {m.n_head} heads / {m.n_kv_head} KV heads, "
        f"SwiGLU {m.ffn_dim}, tied embeddings)",
        f"- Vocabulary: {m.vocab_size:,} byte-level BPE tokens (trained on the same corpus)",
        f"- Trained context: {t.seq_len} tokens (RoPE theta {m.rope_theta:g}; the config allows "
        f"{m.max_position_embeddings}, but quality beyond {t.seq_len} tokens is untested)",
        "- Weights: bfloat16 safetensors",
        "",
        "## Training",
        "",
        f"- Tokens: {state.tokens_seen:,} ({state.step:,} steps of {t.batch_size} x {t.seq_len} tokens)",
        f"- Wall time: {state.train_seconds / 60:.1f} min on CPU (bf16 autocast)",
        f"- Optimizer: AdamW, peak LR {t.lr:g}, {t.warmup_steps} warmup steps, cosine to {t.min_lr_ratio:g}x, "
        f"weight decay {t.weight_decay:g}, grad clip {t.grad_clip:g}",
        f"- FIM rate {t.fim_rate:g} (SPM share {t.spm_rate:g}), seed {t.seed}",
        f"- Corpus: {corpus_stats.get('train_files', 0):,} training files, {corpus_stats.get('train_chars', 0):,} "
        f"characters; {corpus_stats.get('validation_files', 0):,} held-out files (split by content hash)",
        "",
        "## Data sources and licences",
        "",
        *[f"- {line}" for line in licences],
        "",
        "Excluded on purpose (used for evaluation): attrs, click, requests (and anything vendoring them).",
        "",
        "## Held-out evaluation (measured at export)",
        "",
        "| data | tokens | loss | top-1 next-token accuracy |",
        "|---|---:|---:|---:|",
        *[f"| {name} | {r.tokens:,} | {r.loss:.4f} | {r.accuracy:.4f} |" for name, r in final.items()],
        "",
        "## Command",
        "",
        *[f"    {c}" for c in state.command],
        "",
    ]
    return "\n".join(lines)
