"""Training the draft heads of any model by self-distillation, the base model frozen.

The target of head k at position t is the base model's own greedy prediction k places after the
root (its argmax at position t+k), not the corpus token: what decides acceptance is agreement with
the base model, whatever it would write. The heads see the hidden state at t and, with
`token_input`, the token at t+1 (the root at drafting time; in training the corpus token, which is
what the greedy labels after it were conditioned on). Per-head losses are weighted by decay**k,
since a later head only pays off when every earlier one was right (Medusa).

A run has three stages, each resumable from the run folder:
  features   the base model runs once over the corpus windows; its last hidden states (float16)
             and greedy next tokens are stored in shards (features/), so training never runs it
  vocabulary the N tokens the base model writes most often there (their share of the labels is
             reported: it bounds what the heads can get right)
  training   the flat loop over stored features, checkpointed (heads_state.pt)
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..drafts.head_layers import DraftHeads
from ..drafts.heads_files import HeadsConfig
from ..protocol import EngineError
from . import Progress, checkpoint
from .corpus import build_corpus, resolve_sources
from .data import fim_split, split_into_chunks
from .heads_base import llamacpp_base, torch_base
from .optim import Schedule, adamw, fit

CHECKPOINT_FILE = "heads_state.pt"  # in the run folder
FEATURES_DIR = "features"  # in the run folder: windows.pt and shard-NNNN.pt
WINDOWS_PER_SHARD = 64


@dataclass
class HeadsTrainConfig:
    num_heads: int = 4  # K
    num_layers: int = 1  # residual blocks per head
    vocab_size: int = -1  # N frequent tokens in the heads' own output layer; 0: the base lm_head; -1: 8192
    #                       for a model of more than 16k tokens, else 0
    token_input: bool = True  # the heads see the root token's embedding
    inner_size: int = -1  # a block's inner width; 0: Medusa's one-matrix block; -1: twice the hidden size
    #                       (SmolLM2, 400 steps at lr 1e-3: head 1 top-1 0.362 with 4x the hidden size,
    #                       0.329 with Medusa's block; 2x keeps a drafting step cheap)
    seq_len: int = 256  # tokens per training window
    max_windows: int = 0  # cap on training windows (the base model runs once per token of them); 0: all
    batch: int = 2048  # positions per step
    steps: int = 600  # optimizer steps
    lr: float = 3e-3  # peak learning rate (cosine decay after warmup; SmolLM2, 400 steps: head 1 top-1 0.37
    #                  at 3e-3, 0.33 at 1e-3)
    warmup: int = 30  # warmup steps
    decay: float = 0.8  # per-head loss weight decay**k
    seed: int = 1337
    checkpoint_every: int = 100
    bf16: bool | None = None  # the heads' matrix products in bfloat16 (None: where the device has fast
    #                           bf16 kernels; measured here with AMX: 0.85 s a step against 1.85 in float32)

    def schedule(self) -> Schedule:
        return Schedule(self.lr, self.warmup, self.steps)  # decays to zero

    def vocab_for(self, model_vocab: int) -> int:
        if self.vocab_size >= 0:
            return min(self.vocab_size, model_vocab)
        return 8192 if model_vocab > 16384 else 0


@dataclass
class HeadsState:
    step: int = 0
    elapsed_s: float = 0.0
    losses: list = field(default_factory=list)


@dataclass
class Features:
    """What the base model computed once over the windows: the training data of the heads."""

    tokens: torch.Tensor  # (N, T) the windows
    hidden: torch.Tensor  # (N, T, H) float16: the last hidden state after each token
    greedy: torch.Tensor  # (N, T) the base model's greedy next token after each position
    seconds: float = 0.0  # what computing them took the base model (over every run that computed a part)

    def __len__(self) -> int:
        return len(self.tokens)


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


def compute_features(outputs: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]], windows: torch.Tensor,
                     folder: Path, batch: int = 4, progress: Progress | None = None) -> Features:
    """The base model's `outputs` (windows -> hidden states, greedy tokens: heads_base.py) over
    `windows`, stored in shards under `folder`; a shard already there (of these very windows) is
    read back, so an interrupted run goes on where it stopped."""
    folder.mkdir(parents=True, exist_ok=True)
    index, timing = folder / "windows.pt", folder / "seconds.json"
    if index.exists() and not torch.equal(torch.load(index, weights_only=True), windows):
        for stale in [*folder.glob("shard-*.pt"), timing]:  # another corpus or split: start over
            stale.unlink(missing_ok=True)
    torch.save(windows, index)
    seconds = json.loads(timing.read_text())["seconds"] if timing.exists() else 0.0
    hidden, greedy = [], []
    shards = range(0, len(windows), WINDOWS_PER_SHARD)
    for n, start in enumerate(shards):
        file = folder / f"shard-{n:04d}.pt"
        if not file.exists():
            started = time.perf_counter()
            part = windows[start:start + WINDOWS_PER_SHARD]
            outs = [outputs(part[i:i + batch]) for i in range(0, len(part), batch)]
            shard = {"hidden": torch.cat([h for h, _ in outs]).half().cpu(),
                     "greedy": torch.cat([g for _, g in outs]).int().cpu()}
            tmp = file.with_name(file.name + ".tmp")
            torch.save(shard, tmp)
            os.replace(tmp, file)
            seconds += time.perf_counter() - started
            timing.write_text(json.dumps({"seconds": round(seconds, 1)}))  # the model's time, over every run
        shard = torch.load(file, weights_only=True)
        hidden.append(shard["hidden"])
        greedy.append(shard["greedy"])
        if progress:
            progress(min(start + WINDOWS_PER_SHARD, len(windows)), len(windows), {"stage": "base model"})
    return Features(windows, torch.cat(hidden), torch.cat(greedy), seconds)


def frequent_tokens(greedy: torch.Tensor, vocab_size: int, model_vocab: int) -> tuple[torch.Tensor, dict]:
    """The `vocab_size` tokens the base model writes most often (ids, most frequent first), and
    the share of its greedy tokens each of several vocabulary sizes would cover."""
    counts = torch.bincount(greedy.flatten().long(), minlength=model_vocab)
    order = torch.argsort(counts, descending=True, stable=True)
    cumulative = torch.cumsum(counts[order], 0).double() / max(1, int(counts.sum()))
    coverage = {str(n): round(float(cumulative[min(n, model_vocab) - 1]), 4)
                for n in (1024, 2048, 4096, 8192, 16384, 32768) if n <= model_vocab}
    return order[:vocab_size].sort().values, coverage


class LabelMap:
    """Token id -> column of the heads' output layer (-100 for a token outside it: not scored)."""

    def __init__(self, vocab_ids: torch.Tensor | None, model_vocab: int):
        self.table = None
        if vocab_ids is not None:
            self.table = torch.full((model_vocab,), -100, dtype=torch.long)
            self.table[vocab_ids] = torch.arange(len(vocab_ids))

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens.long() if self.table is None else self.table[tokens.long()]


def sample_positions(features: Features, count: int, k_heads: int, rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` random (window, position) pairs with K labels after them inside the window."""
    n, t = features.tokens.shape
    rows = torch.randint(0, n, (count,), generator=rng)
    cols = torch.randint(0, t - k_heads - 1, (count,), generator=rng)
    return rows, cols


def head_inputs(features: Features, rows: torch.Tensor, cols: torch.Tensor, embed, k_heads: int,
                labels: LabelMap) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Hidden states at t, the root token's embedding (the token at t+1), and the labels (K, P):
    the greedy token after position t+k for head k."""
    hidden = features.hidden[rows, cols].float()
    token = embed(features.tokens[rows, cols + 1]).float() if embed is not None else None
    targets = torch.stack([labels(features.greedy[rows, cols + k]) for k in range(1, k_heads + 1)])
    return hidden, token, targets


def head_losses(heads: DraftHeads, lm_head, hidden: torch.Tensor, token: torch.Tensor | None,
                targets: torch.Tensor) -> list[torch.Tensor]:
    logits = heads.logits(heads(hidden, token), lm_head)  # (K, P, V')
    return [F.cross_entropy(logits[k].float(), targets[k], ignore_index=-100) for k in range(len(targets))]


@torch.no_grad()
def head_accuracy(heads: DraftHeads, lm_head, embed, features: Features, labels: LabelMap,
                  positions: int = 8192, seed: int = 0) -> list[dict]:
    """Per head: top-1 and top-3 agreement with the base model's greedy token, and `chain`: the
    share of positions where this head and every one before it are right (what a single drafted
    chain of k tokens needs to be accepted)."""
    k_heads = heads.config.num_heads
    rows, cols = sample_positions(features, positions, k_heads, torch.Generator().manual_seed(seed))
    hidden, token, targets = head_inputs(features, rows, cols, embed, k_heads, labels)
    logits = heads.logits(heads(hidden, token), lm_head)
    best3 = logits.topk(3, dim=-1).indices  # (K, P, 3)
    right = best3[..., 0] == targets
    chain = torch.cumprod(right.int(), dim=0)
    return [{"head": k + 1, "top1": round(float(right[k].float().mean()), 4),
             "top3": round(float((best3[k] == targets[k, :, None]).any(-1).float().mean()), 4),
             "chain": round(float(chain[k].float().mean()), 4)} for k in range(k_heads)]


def train_heads(heads: DraftHeads, lm_head, embed, features: Features, labels: LabelMap, cfg: HeadsTrainConfig,
                state: HeadsState, optimizer: torch.optim.Optimizer, save: Callable[[HeadsState], None],
                progress: Progress | None = None) -> None:
    """The flat loop: sample positions, step the heads; checkpoint now and then."""
    heads.train()
    device = next(heads.parameters()).device
    bf16 = fast_bf16(device) if cfg.bf16 is None else cfg.bf16
    weights = [cfg.decay ** k for k in range(cfg.num_heads)]
    start = time.perf_counter() - state.elapsed_s
    per_head = []

    def loss_at(step: int) -> torch.Tensor:
        rng = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)  # the batch depends on the step only
        rows, cols = sample_positions(features, cfg.batch, cfg.num_heads, rng)
        hidden, token, targets = head_inputs(features, rows, cols, embed, cfg.num_heads, labels)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            per_head[:] = head_losses(heads, lm_head, hidden.to(device), None if token is None else token.to(device),
                                      targets.to(device))
        return sum(w * l for w, l in zip(weights, per_head)) / sum(weights)

    def after_step(loss: torch.Tensor, lr: float) -> None:
        state.elapsed_s = time.perf_counter() - start
        loss_value = float(loss.detach())
        state.losses.append(round(loss_value, 4))
        if progress:
            progress(state.step, cfg.steps,
                     dict(loss=f"{loss_value:.3f}", heads=" ".join(f"{float(l.detach()):.2f}" for l in per_head)))
        if state.step % cfg.checkpoint_every == 0 or state.step == cfg.steps:
            save(state)

    fit(optimizer, cfg.schedule(), state, cfg.steps, loss_at, after_step)


def fast_bf16(device: torch.device) -> bool:
    """Whether bfloat16 matrix products are fast here: CUDA, or a CPU with AMX or AVX512-BF16."""
    if device.type == "cuda":
        return True
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


def new_heads(hidden: int, output_rows: Callable[[torch.Tensor], torch.Tensor], cfg: HeadsTrainConfig,
              vocab_ids: torch.Tensor | None = None) -> DraftHeads:
    """Heads on a base model's hidden states of size `hidden`; with `vocab_ids`, their output layer
    is the model's own output rows of those ids (`output_rows`), frozen (so head k starts as the
    model's next-token guess)."""
    torch.manual_seed(cfg.seed)
    size = 0 if vocab_ids is None else len(vocab_ids)
    inner = 2 * hidden if cfg.inner_size < 0 else cfg.inner_size
    heads = DraftHeads(HeadsConfig(hidden, cfg.num_heads, cfg.num_layers, size, cfg.token_input, inner))
    if vocab_ids is not None:
        heads.vocab_ids.copy_(vocab_ids)
        with torch.no_grad():
            heads.out.weight.copy_(output_rows(vocab_ids).to(heads.out.weight.dtype))
    return heads


def make_optimizer(heads: DraftHeads, cfg: HeadsTrainConfig) -> torch.optim.AdamW:
    return adamw([p for p in heads.parameters() if p.requires_grad], cfg.lr, weight_decay=0.0)


def save_checkpoint(path: Path, heads: DraftHeads, optimizer, state: HeadsState) -> None:
    checkpoint.save(path / CHECKPOINT_FILE, "heads", heads, optimizer, config=asdict(heads.config),
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
              max_files: int = 2000, resume: bool = False, command: str = "", log: Callable[[str], None] = print,
              progress: Progress | None = None, runtime: str = "torch") -> dict:
    """Train draft heads for `model` (None: the embedded one) on `corpus_specs` (default stdlib),
    in `out` (features and checkpoints, resumable), and save them beside the model (or to
    `save_to`) with a model card. Returns the report, also written to out/heads_report.json. Raises
    EngineError (the loader's ModelLoadError is one) with a message for the user. `runtime`: the one
    whose hidden states the heads learn from and will read ("torch" or "llamacpp": heads_base.py)."""
    if resume and not (out / CHECKPOINT_FILE).exists():
        raise EngineError(f"nothing to resume in {out} (no {CHECKPOINT_FILE})")
    if runtime == "llamacpp":
        base = llamacpp_base(model, threads, cfg.seq_len)
        torch.set_num_threads(threads or os.cpu_count() or 1)
    else:
        base = torch_base(model, device, threads)
    engine, tokenizer = base.engine, base.engine.tokenizer
    save_to = save_to or base.save_to
    if save_to is None:
        raise EngineError(f"{model} is not a folder on this machine; pass --save-to DIR")
    train_files, val_files = split_files(corpus_specs, cfg.seed, max_files)
    eos = min(engine.eos_ids) if engine.eos_ids else 0
    # Prompts in the engine's own format: what the heads see at a cursor (plain prefix for non-FIM models).
    fim = {"fim_prompt": engine.prompt_ids, "fim_rate": fim_rate, "seed": cfg.seed} if engine.fim.has_fim else {}

    def windows_of(files) -> torch.Tensor:
        return windows_from_texts(tokenizer, [f.text for f in files], cfg.seq_len, eos, **fim)

    windows = windows_of(train_files)
    windows = windows[:cfg.max_windows] if cfg.max_windows else windows
    val_windows = windows_of(val_files)[:64]
    if len(windows) == 0:
        raise EngineError("the corpus is too small for one training window; give more code")

    out.mkdir(parents=True, exist_ok=True)
    log(f"the base model over {len(windows)} windows of {cfg.seq_len} tokens ({len(train_files)} files), "
        f"stored in {out / FEATURES_DIR}")
    features = compute_features(base.outputs, windows, out / FEATURES_DIR, progress=progress)
    val_features = compute_features(base.outputs, val_windows, out / (FEATURES_DIR + "-heldout"))
    feature_seconds = features.seconds + val_features.seconds

    model_vocab = base.vocab_size
    vocab_size = cfg.vocab_for(model_vocab)
    vocab_ids, coverage = frequent_tokens(features.greedy, vocab_size or model_vocab, model_vocab)
    vocab_ids = vocab_ids if vocab_size else None
    labels = LabelMap(vocab_ids, model_vocab)
    log(f"the base model's greedy tokens covered by its most frequent N: {coverage}")

    if vocab_ids is None and base.lm_head is None:
        raise EngineError(f"a vocabulary of {model_vocab} tokens is too big for heads over all of it; pass --vocab N")
    heads = new_heads(base.hidden_size, base.output_rows, cfg, vocab_ids).to(engine.device)
    lm_head = base.lm_head if heads.out is None else None
    embed = base.embed if cfg.token_input else None
    optimizer = make_optimizer(heads, cfg)
    state = load_checkpoint(out, heads, optimizer) if resume else HeadsState()
    log(f"training {cfg.num_heads} heads (output over {vocab_size or model_vocab} tokens, "
        f"{'with' if cfg.token_input else 'without'} the root token); step {state.step}/{cfg.steps}")
    train_heads(heads, lm_head, embed, features, labels, cfg, state, optimizer,
                lambda s: save_checkpoint(out, heads, optimizer, s), progress)
    heads.eval()
    accuracy = head_accuracy(heads, lm_head, embed, val_features, labels) if len(val_features) else []
    report = {"model": model or "the embedded model", "runtime": base.runtime, "steps": state.step, "train_seconds": round(state.elapsed_s, 1),
              "feature_seconds": round(feature_seconds, 1), "heads": accuracy, "saved_to": str(save_to),
              "windows": len(windows), "seq_len": cfg.seq_len, "training_tokens": len(windows) * cfg.seq_len,
              "files": len(train_files), "corpus": corpus_specs or ["stdlib"], "vocab_size": vocab_size,
              "vocab_coverage": coverage, "token_input": cfg.token_input, "num_layers": cfg.num_layers,
              "inner_size": heads.config.inner_size,
              "final_loss": state.losses[-1] if state.losses else None, "fim_rate": fim_rate if fim else 0.0,
              "parameters": sum(p.numel() for p in heads.parameters() if p.requires_grad), "command": command}
    heads.save(save_to, extra={"trained": {k: report[k] for k in ("model", "runtime", "corpus", "training_tokens", "steps",
                                                                   "heads", "vocab_coverage")}}, dtype=torch.bfloat16)
    (save_to / "HEADS.md").write_text(model_card(report))
    (out / "heads_report.json").write_text(json.dumps(report, indent=2))
    return report


RUNTIME_NAMES = {"torch": "transformers", "llamacpp": "llama.cpp"}


def model_card(report: dict) -> str:
    """What the heads are, what they learnt from and how well they agree with their model."""
    rows = "\n".join(f"| {h['head']} | {h['top1']:.3f} | {h['top3']:.3f} | {h['chain']:.3f} |" for h in report["heads"])
    vocab = (f"their own output layer over the {report['vocab_size']} tokens the model writes most often "
             f"(those cover {report['vocab_coverage'].get(str(report['vocab_size']), '?')} of its greedy tokens "
             "on the training code)") if report["vocab_size"] else "the model's own output layer"
    return f"""# Draft heads for {report['model']}

{len(report['heads'])} Medusa-style heads ({report['num_layers']} residual block each, \
{f"inner width {report['inner_size']}" if report['inner_size'] else "Medusa's one-matrix block"}; \
{report['parameters'] / 1e6:.2f}M trained parameters in all, stored in bfloat16) on the model's last hidden state \
as {RUNTIME_NAMES.get(report.get("runtime", "torch"), "transformers")} computes it\
{', seeing the certain next token too' if report['token_input'] else ''}, with {vocab}. Head k guesses \
the token k places after the next one; MemoSight's speculative decoding verifies every guess with the \
model itself, so completions are exactly its greedy ones.

- Data: {', '.join(report['corpus'])} ({report['files']} files, {report['windows']} windows of \
{report['seq_len']} tokens = {report['training_tokens']:,} tokens; {report['fim_rate']:.0%} in the \
engine's fill-in-the-middle format), labelled by the model's own greedy tokens (self-distillation).
- Training: {report['steps']} steps, {report['train_seconds']} s (the model's pass over the data: \
{report['feature_seconds']} s), final loss {report['final_loss']}.
- Command: `{report['command'] or 'memosight train heads'}`

Held-out agreement with the model's greedy token (chain: this head and every one before it right):

| head | top-1 | top-3 | chain |
|---|---|---|---|
{rows}
"""
