"""`memosight train model`: train the base code model, resume it, export it.

    memosight train model --corpus stdlib --corpus site --out /work/runs/small --export-to engine/models/default
    memosight train model --out /work/runs/small --resume          # continue from OUT/checkpoint
    memosight train model --out /work/runs/small --export-only     # export the latest checkpoint as is

Top-level imports stay light: `memosight --help` imports this module.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

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
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    import torch

    from . import model as M
    from .corpus import build_corpus, read_folder, resolve_sources
    from .tokenizer import load_tokenizer, save_tokenizer, train_tokenizer

    tuner = None
    if args.threads == "auto":
        tuner = M.ThreadTuner(list(range(1, (os.cpu_count() or 1) + 1)))
    elif int(args.threads):
        torch.set_num_threads(int(args.threads))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint_dir = out / "checkpoint"
    log_file = (out / "train.log").open("a")

    def log(message: str) -> None:
        log_file.write(message + "\n")
        log_file.flush()

    command = command_line(args)
    continuing = args.resume or args.export_only
    if continuing and not (checkpoint_dir / "state.pt").exists():
        print(f"no checkpoint in {checkpoint_dir}", file=sys.stderr)
        return 2

    if continuing:
        model, optimizer, state = M.load_checkpoint(checkpoint_dir)
        if args.resume:
            state.command.append(command)
        corpus_specs = state.corpus
    else:
        corpus_specs = args.corpus or ["stdlib", "site"]
    corpus = build_corpus(resolve_sources(corpus_specs), val_fraction=args.val_fraction if not continuing
                          else state.val_fraction)
    if not corpus.train:
        print("the corpus is empty", file=sys.stderr)
        return 2
    log(f"corpus: {len(corpus.train)} train files ({corpus.chars():,} chars), {len(corpus.validation)} held out; "
        f"skipped {corpus.skipped}")

    tokenizer_dir = out / "tokenizer"
    if tokenizer_dir.exists():
        tokenizer = load_tokenizer(tokenizer_dir)
    elif args.tokenizer:
        tokenizer = load_tokenizer(args.tokenizer)
        save_tokenizer(tokenizer, tokenizer_dir)
    else:
        tokenizer = train_tokenizer((f.text for f in corpus.train), vocab_size=args.vocab_size)
        save_tokenizer(tokenizer, tokenizer_dir)
        tokenizer = load_tokenizer(tokenizer_dir)

    if not continuing:
        model_config = M.ModelConfig(**{**asdict(M.PRESETS[args.size]), "vocab_size": len(tokenizer),
                                        "eos_token_id": tokenizer.eos_token_id})
        train_config = M.TrainConfig(seq_len=args.seq_len, batch_size=args.batch, lr=args.lr, warmup_steps=args.warmup,
                                     tokens=(args.steps * args.batch * args.seq_len) if args.steps else args.tokens,
                                     fim_rate=args.fim_rate, seed=args.seed, eval_every=args.eval_every,
                                     checkpoint_every=args.checkpoint_every, bf16=not args.no_bf16,
                                     max_minutes=args.max_minutes)
        model = M.build_model(model_config, seed=args.seed)
        optimizer = M.make_optimizer(model, train_config)
        state = M.RunState(model_config, train_config, command=[command], corpus=corpus_specs,
                           val_fraction=args.val_fraction)
    elif args.max_minutes:
        state.train_config.max_minutes = args.max_minutes
    params = M.count_params(model)
    cfg = state.train_config
    log(f"model: {params:,} params {asdict(state.model_config)}; training {cfg.tokens:,} tokens = {cfg.steps()} steps")

    val_texts = [f.text for f in corpus.validation] or [f.text for f in corpus.train[:1]]
    val_windows = M.eval_windows(tokenizer, val_texts, cfg.seq_len)

    if not args.export_only:
        M.train(model, tokenizer, [f.text for f in corpus.train], val_windows, state, optimizer,
                save_checkpoint=lambda: M.save_checkpoint(checkpoint_dir, model, optimizer, state), log=log,
                stop_at_step=args.stop_at_step, tuner=tuner)
        if state.step < cfg.steps() and args.stop_at_step and state.step >= args.stop_at_step:
            print(f"paused at step {state.step}; continue with --resume", file=sys.stderr)
            return 0

    final: dict[str, M.HeldOut] = {}
    final["validation (all sources)"] = M.evaluate(model, M.spread_sample(val_windows, args.final_eval_tokens),
                                                   autocast=cfg.bf16)
    stdlib_val = [f.text for f in corpus.validation if f.path.startswith("python-stdlib")]
    if stdlib_val:
        final["validation (stdlib only)"] = M.evaluate(
            model, M.eval_windows(tokenizer, stdlib_val, cfg.seq_len, args.final_eval_tokens), autocast=cfg.bf16)
    for folder in args.eval_corpus or []:
        texts = [f.text for f in read_folder(folder)]
        if texts:
            final[f"eval: {Path(folder).name}"] = M.evaluate(
                model, M.eval_windows(tokenizer, texts, cfg.seq_len, args.final_eval_tokens), autocast=cfg.bf16)
    for name, result in final.items():
        log(f"final {name}: loss {result.loss:.4f} top-1 {result.accuracy:.4f} over {result.tokens:,} tokens")
        print(f"{name:28s} loss {result.loss:.4f}  top-1 {result.accuracy:.4f}  ({result.tokens:,} tokens)",
              file=sys.stderr)

    export_dir = Path(args.export_to) if args.export_to else out / "model"
    corpus_stats = {"train_files": len(corpus.train), "train_chars": corpus.chars(),
                    "validation_files": len(corpus.validation)}
    card = M.model_card(state, params, corpus.licence_lines(), corpus_stats, final)
    metrics = {"params": params, "tokens": state.tokens_seen, "steps": state.step,
               "train_minutes": round(state.train_seconds / 60, 2), "history": state.history,
               "final": {k: asdict(v) for k, v in final.items()}, "command": state.command}
    M.export_model(model, tokenizer, export_dir, card, metrics)
    log(f"exported to {export_dir} ({M.folder_megabytes(export_dir):.1f} MB)")
    print(f"exported to {export_dir} ({M.folder_megabytes(export_dir):.1f} MB)", file=sys.stderr)
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
