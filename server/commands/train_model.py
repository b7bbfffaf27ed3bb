"""`memosight train model`: train the base code model (FIM objective), resume it, export it.

    memosight train model --corpus stdlib --corpus site --out /work/runs/small --export-to engine/models/default
    memosight train model --out /work/runs/small --resume          # continue from OUT/checkpoint
    memosight train model --out /work/runs/small --export-only     # export the latest checkpoint as is

The run folder holds tokenizer/, checkpoint/ (model, optimizer, step, RNG states) and train.log; a
paused or interrupted run resumes exactly where it stopped. At export the model is evaluated on
held-out files (and on any --eval-corpus) and saved with a model card (engine/train/export.py).
"""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from .common import CommandError, say, step_progress

CORPUS_HELP = ("source of training code; repeatable. 'stdlib' = the Python standard library of this "
               "interpreter (PSF licence), 'site' = a curated list of permissively licensed installed "
               "packages (see engine/train/corpus.py), anything else = a folder of .py files "
               "(default: stdlib and site)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", action="append", metavar="DIR|stdlib|site", help=CORPUS_HELP)
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="run folder: tokenizer/, checkpoint/ (model, optimizer, step, RNG), train.log")
    parser.add_argument("--export-to", metavar="DIR",
                        help="where the final model goes (save_pretrained + tokenizer + README.md); default OUT/model")
    parser.add_argument("--size", default="small", choices=("tiny", "small", "base"), help="model preset (default small)")
    parser.add_argument("--tokens", type=int, default=20_000_000, help="training tokens (default 20M)")
    parser.add_argument("--steps", type=int, help="optimizer steps (overrides --tokens)")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per training window (default 1024)")
    parser.add_argument("--batch", type=int, default=8, help="windows per step (default 8)")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default 2e-3)")
    parser.add_argument("--warmup", type=int, default=100, help="warmup steps (default 100)")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--fim-rate", type=float, default=0.5, help="share of FIM samples (default 0.5)")
    parser.add_argument("--vocab-size", type=int, default=12_288, help="BPE vocabulary when a tokenizer is trained")
    parser.add_argument("--tokenizer", metavar="DIR", help="reuse this tokenizer instead of training one")
    parser.add_argument("--val-fraction", type=float, default=0.03, help="files held out by content hash")
    parser.add_argument("--eval-every", type=int, default=200, help="steps between quick held-out evaluations")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints")
    parser.add_argument("--max-minutes", type=float, default=0.0,
                        help="wall-clock budget: the cosine LR schedule follows step or time progress, whichever "
                        "is further, and training stops (with a checkpoint) when it is spent; 0 = none")
    parser.add_argument("--final-eval-tokens", type=int, default=400_000, help="cap on tokens per final evaluation")
    parser.add_argument("--eval-corpus", action="append", metavar="DIR",
                        help="extra folder to report held-out loss/accuracy on at export; repeatable")
    parser.add_argument("--threads", default="0", help="torch CPU threads: N, 0 = torch default, or 'auto' "
                        "(re-measure every 40 steps which count is fastest on a shared CPU)")
    parser.add_argument("--stop-at-step", type=int, help="pause at this step (checkpoint, no export); resume later")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint exactly")
    parser.add_argument("--export-only", action="store_true",
                        help="export the latest checkpoint without training further")
    parser.add_argument("--no-bf16", action="store_true", help="train in float32 instead of bf16 autocast")


def run(args: argparse.Namespace) -> int:
    if args.threads != "auto" and not args.threads.isdigit():
        raise CommandError(f"--threads {args.threads}: give a number of threads, 0 (torch's default) or 'auto'")
    threads = args.threads if args.threads == "auto" else int(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    from memosight.engine.train.loop import TrainConfig, run_training

    config = TrainConfig(seq_len=args.seq_len, batch_size=args.batch, lr=args.lr, warmup_steps=args.warmup,
                         tokens=(args.steps * args.batch * args.seq_len) if args.steps else args.tokens,
                         fim_rate=args.fim_rate, seed=args.seed, eval_every=args.eval_every,
                         checkpoint_every=args.checkpoint_every, bf16=not args.no_bf16, max_minutes=args.max_minutes)
    with step_progress("train model") as on_step:
        report = run_training(
            Path(args.out), config, corpus_specs=args.corpus, size=args.size, val_fraction=args.val_fraction,
            vocab_size=args.vocab_size, tokenizer_from=args.tokenizer, eval_corpus=args.eval_corpus,
            final_eval_tokens=args.final_eval_tokens, threads=threads,
            stop_at_step=args.stop_at_step, resume=args.resume, export_only=args.export_only,
            export_to=Path(args.export_to) if args.export_to else None, command=command_line(args), progress=on_step)
    if report.paused:
        say(f"paused at step {report.step}; continue with --resume")
        return 0
    for name, result in report.final.items():
        say(f"{name:28s} loss {result.loss:.4f}  top-1 {result.accuracy:.4f}  ({result.tokens:,} tokens)")
    say(f"exported to {report.export_dir} ({report.megabytes:.1f} MB)")
    return 0


def command_line(args: argparse.Namespace) -> str:
    """The options this run was given, as one `memosight train model ...` line for the model card."""
    parts = ["memosight", "train", "model"]
    for key, value in vars(args).items():
        if key.startswith("_") or key in ("command", "train_command") or value in (None, False):
            continue
        flag = "--" + key.replace("_", "-")
        for item in value if isinstance(value, list) else [value]:
            parts += [flag] if item is True else [flag, str(item)]
    return " ".join(shlex.quote(p) for p in parts)
