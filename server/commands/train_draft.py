"""`memosight train draft`: train a draft model for a target by distillation, resumable.

    memosight train draft --target smollm2-135m --corpus DIR --out /work/runs/draft
    memosight train draft --target DIR --out RUN --resume

The draft is the target's architecture, smaller (`--layers`, `--hidden`; by default a fifth of its
layers at half its width), with its tokenizer; it learns the target's top-k next-token distribution,
computed once and stored in the run folder (engine/train/draft.py). The draft is saved to
OUT/draft, ready for `draft_model = "OUT/draft"`. Prints its held-out agreement with the target's
greedy token, then the report as one JSON line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import say, step_progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", help="the target model: folder, hub id, .gguf or a packaged name "
                                         "(default: the embedded model)")
    parser.add_argument("--corpus", action="append", metavar="DIR|stdlib|site",
                        help="training code (repeatable): a folder, 'stdlib' or 'site' (default: stdlib)")
    parser.add_argument("--out", required=True, metavar="DIR", help="run folder (checkpoints, the draft)")
    parser.add_argument("--layers", type=int, default=0, help="draft layers (default: a fifth of the target's)")
    parser.add_argument("--hidden", type=int, default=0, help="draft width (default: half the target's)")
    parser.add_argument("--device", default=None, help="auto, cpu, cuda (default auto)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--top-k", type=int, default=16, help="target logits kept per position (default 16)")
    parser.add_argument("--save-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--max-files", type=int, default=2000, help="cap on corpus files read")
    parser.add_argument("--max-windows", type=int, default=0,
                        help="cap on training windows (the target runs once over each; default: all)")
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = every core)")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/draft_state.pt")


def command_line(args: argparse.Namespace) -> str:
    """The command that made a draft, for its model card."""
    words = ["memosight train draft"] + [f"--target {args.target}"] * bool(args.target)
    words += [f"--corpus {c}" for c in args.corpus or []]
    for flag in ("layers", "hidden", "steps", "batch", "seq_len", "lr", "top_k", "max_files", "max_windows", "seed"):
        words.append(f"--{flag.replace('_', '-')} {getattr(args, flag)}")
    return " ".join(words + [f"--out {args.out}"])


def run(args: argparse.Namespace) -> int:
    from memosight.engine.train.draft import DraftTrainConfig, run_draft

    cfg = DraftTrainConfig(layers=args.layers, hidden=args.hidden, seq_len=args.seq_len, batch=args.batch,
                           steps=args.steps, lr=args.lr, top_k=args.top_k, seed=args.seed, max_windows=args.max_windows,
                           checkpoint_every=args.checkpoint_every)
    with step_progress("draft") as on_step:
        report = run_draft(args.target, Path(args.out), cfg, corpus_specs=args.corpus, device=args.device,
                           threads=args.threads, max_files=args.max_files, resume=args.resume,
                           save_dtype=args.save_dtype, command=command_line(args), log=say, progress=on_step)
    print(f"held-out agreement with the target's greedy token: {report['heldout_greedy_agreement']}")
    print(json.dumps(report))
    return 0
