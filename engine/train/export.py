"""Exporting a trained model: a folder that `from_pretrained` loads, and its model card.

The card says what the model is and how it was made, measured in the same run: size, training
tokens and time, knobs, held-out results, the command. Its sources are named by package and
version (`flask 3.1.3 (site-packages)`), never by a path of the machine that trained it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .corpus import Source
    from .run import HeldOut, RunState


def export_model(model, tokenizer, out_dir: Path, card: str, metrics: dict) -> None:
    """save_pretrained in bf16 safetensors + tokenizer + model card; loads with from_pretrained."""
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


def model_card(state: RunState, params: int, sources: Iterable[Source], corpus_stats: dict,
               final: dict[str, HeldOut]) -> str:
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
        *[f"- {source.origin}: {source.licence}" for source in sources],
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
