"""`memosight train heads`: train the draft heads of a model (base frozen), resumable.

    memosight train heads --corpus stdlib --out /work/runs/heads                 # the embedded model
    memosight train heads --model smollm2-135m --out RUN                         # a GGUF file, a folder, an id
    memosight train heads --model DIR --corpus DIR --out RUN --save-to DIR
    memosight train heads --model DIR --out RUN --resume

Each head learns, by self-distillation, the base model's own greedy token 1..K positions after the
next one (engine/train/heads.py). The base model runs once over the corpus and its hidden states are
stored in the run folder, so a resumed or repeated run does not run it again. They learn from the
hidden states of the runtime the model will run on (`--runtime`: llama.cpp for a GGUF file on a
CPU) and are saved where the engine finds them on it (llama.cpp: the cache's heads/llamacpp/<file>-<hash>;
torch: beside the model, for a GGUF file its dequantized folder), with a model card (HEADS.md). Prints each head's held-out agreement with greedy, then the
report as one JSON line (`--json`: only that).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import say, step_progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model folder or hub id (default: the embedded model)")
    parser.add_argument("--corpus", action="append", metavar="DIR|stdlib|site",
                        help="training code (repeatable): a folder, 'stdlib' or 'site' (default: stdlib)")
    parser.add_argument("--out", required=True, metavar="DIR", help="run folder for checkpoints")
    parser.add_argument("--save-to", metavar="DIR", help="where the heads go (default: the model folder)")
    parser.add_argument("--device", default=None, help="auto, cpu, cuda (default auto)")
    parser.add_argument("--runtime", choices=("auto", "torch", "llamacpp"), default="auto",
                        help="whose hidden states the heads learn from and will read (default: the one the engine "
                             "runs the model on: llama.cpp for a GGUF file on a CPU, else torch)")
    parser.add_argument("--heads", type=int, default=4, help="number of heads K (default 4)")
    parser.add_argument("--layers", type=int, default=1, help="residual blocks per head (default 1)")
    parser.add_argument("--vocab", type=int, default=-1, metavar="N",
                        help="the heads' own output layer over the N tokens the model writes most often; 0: the "
                             "model's whole lm_head (default: 8192 for a vocabulary over 16k tokens, else 0)")
    parser.add_argument("--inner", type=int, default=-1, metavar="W",
                        help="a block's inner width (0: Medusa's one-matrix block; default: twice the hidden size)")
    parser.add_argument("--no-token-input", action="store_true",
                        help="plain Medusa heads: do not show them the certain next token")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=2048, help="positions per step (default 2048)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--max-windows", type=int, default=0,
                        help="cap on training windows of --seq-len tokens (the model runs once over them; 0: all)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--fim-rate", type=float, default=0.5,
                        help="share of training pieces in the engine's fill-in-the-middle prompt format (default 0.5)")
    parser.add_argument("--decay", type=float, default=0.8, help="per-head loss weight decay**k (default 0.8)")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--max-files", type=int, default=2000, help="cap on corpus files read")
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/heads_state.pt")
    parser.add_argument("--json", action="store_true", help="print only the report, as one JSON line")


def command_line(args: argparse.Namespace) -> str:
    """The command that made the heads, for their model card."""
    words = ["memosight train heads"] + [f"--model {args.model}"] * bool(args.model) + [f"--runtime {args.runtime}"]
    words += [f"--corpus {c}" for c in args.corpus or []]
    for flag in ("heads", "layers", "inner", "vocab", "steps", "batch", "seq_len", "max_windows", "lr", "fim_rate", "max_files",
                 "seed"):
        words.append(f"--{flag.replace('_', '-')} {getattr(args, flag)}")
    return " ".join(words + ["--no-token-input"] * args.no_token_input + [f"--out {args.out}"])


def run(args: argparse.Namespace) -> int:
    from memosight.engine.train.heads import HeadsTrainConfig, run_heads
    from memosight.engine.train.heads_base import heads_runtime

    cfg = HeadsTrainConfig(num_heads=args.heads, num_layers=args.layers, vocab_size=args.vocab,
                           token_input=not args.no_token_input, inner_size=args.inner, seq_len=args.seq_len, max_windows=args.max_windows,
                           batch=args.batch, steps=args.steps, lr=args.lr, decay=args.decay, seed=args.seed,
                           checkpoint_every=args.checkpoint_every)
    command = command_line(args)
    with step_progress("heads") as on_step:
        report = run_heads(args.model, Path(args.out), cfg, corpus_specs=args.corpus,
                           save_to=Path(args.save_to) if args.save_to else None, device=args.device,
                           threads=args.threads, fim_rate=args.fim_rate, max_files=args.max_files, resume=args.resume,
                           command=command, log=say, progress=on_step,
                           runtime=heads_runtime(args.model, args.device, args.runtime))
    if not args.json:
        for row in report["heads"]:
            print(f"head {row['head']}: top-1 {row['top1']:.3f}  top-3 {row['top3']:.3f}  chain {row['chain']:.3f}")
    print(json.dumps(report))
    return 0
