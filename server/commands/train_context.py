"""`memosight train context`: fine-tune a model on prompts in the compressor's own format, resumable.

    memosight train context --out /work/runs/ctx                       # the embedded model, stdlib + site
    memosight train context --model DIR --corpus DIR --out RUN --save-to DIR
    memosight train context --out RUN --resume

A model pretrained on whole files has never seen a packed context: elision markers, definitions
pulled from far above or from other files, the cursor's function last. This builds examples with the
server's compressor at random cursors of the training corpus (most compressed, some plainly
truncated), the text the user writes next as the target, and trains the model to write it and stop.
The same corpus split as `memosight train model` keeps held-out files out; their middle loss is
measured before and after. The result is a complete model folder (the base's draft heads and n-gram
table are copied: still lossless, but retrain them for this model with `train heads` / `train ngrams`).

Measured on the embedded model (600 steps, 48 min on 2 CPU threads): held-out middle loss 4.09 -> 3.67
nats/token and plain held-out loss 3.446 -> 3.424, yet fewer characters accepted in `bench replay`
(251 against 286 over 14 functions): it suggests more often and is right less often. So the shipped
model is not fine-tuned this way; try it on a bigger model, and check `bench replay` before shipping.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

from .common import CommandError, say, step_progress

DEFAULT_CORPUS = ("stdlib", "site")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="base model folder or hub id (default: the embedded model)")
    parser.add_argument("--corpus", action="append", metavar="DIR|stdlib|site",
                        help="training code (repeatable): a folder, 'stdlib' or 'site' (default: both)")
    parser.add_argument("--out", required=True, metavar="DIR", help="run folder for examples and checkpoints")
    parser.add_argument("--save-to", metavar="DIR", help="where the fine-tuned model goes (default: OUT/model)")
    parser.add_argument("--per-file", type=int, default=8, help="cursor positions per training file (default 8)")
    parser.add_argument("--max-files", type=int, default=2000, help="cap on training files used (default 2000)")
    parser.add_argument("--truncated-share", type=float, default=0.3,
                        help="share of examples with plain truncation instead of the compressor (default 0.3)")
    parser.add_argument("--eval-examples", type=int, default=300, help="held-out examples scored (default 300)")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--prompt-weight", type=float, default=0.1,
                        help="loss weight of prompt tokens against the middle's 1 (default 0.1)")
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    parser.add_argument("--device", default=None, help="auto, cpu, cuda (default auto)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="continue from OUT/finetune_state.pt")


def run(args: argparse.Namespace) -> int:
    from memosight.engine.train.finetune import FinetuneConfig, run_finetune

    cfg = FinetuneConfig(steps=args.steps, batch=args.batch, lr=args.lr, warmup=args.warmup,
                         prompt_weight=args.prompt_weight, seed=args.seed)
    with step_progress("train context") as on_step:
        report = run_finetune(args.model, Path(args.out), cfg, lambda count_tokens: _examples(count_tokens, args),
                              device=args.device, threads=args.threads, checkpoint_every=args.checkpoint_every,
                              resume=args.resume, save_to=Path(args.save_to) if args.save_to else None,
                              command=" ".join(sys.argv), log=say, progress=on_step)
    print(f"held-out middle loss {report['held_out_middle_loss_before']} -> {report['held_out_middle_loss_after']} "
          f"nats/token; model saved to {report['saved_to']}")
    return 0


def _examples(count_tokens, args) -> tuple[list, list]:
    """(training, held-out) lists of (prefix, suffix, middle), packed by the server's compressor."""
    import random

    from memosight.engine.train.corpus import build_corpus, resolve_sources

    from ..context.examples import context_examples

    corpus = build_corpus(resolve_sources(args.corpus or DEFAULT_CORPUS), val_fraction=0.03)
    if not corpus.train:
        raise CommandError(f"no training files found in {args.corpus or DEFAULT_CORPUS}")
    rng = random.Random(args.seed)
    train_files = rng.sample(corpus.train, min(args.max_files, len(corpus.train)))
    start = time.perf_counter()

    def build(files, per_file: int, limit: int | None = None) -> list:
        examples = context_examples(_documents(files), count_tokens, rng, per_file=per_file,
                                    truncated_share=args.truncated_share)
        return [(e.prefix, e.suffix, e.middle) for e in itertools.islice(examples, limit)]

    train, held_out = build(train_files, args.per_file), build(corpus.validation, 4, args.eval_examples)
    say(f"examples built in {time.perf_counter() - start:.0f} s")
    return train, held_out


def _documents(files) -> list:
    from ..languages import LANGUAGES_BY_SUFFIX
    from ..documents import Document

    docs = []
    for f in files:
        language = LANGUAGES_BY_SUFFIX.get(Path(f.path).suffix)
        if language:
            docs.append(Document("file:///corpus/" + f.path, f.text, language))
    return docs
