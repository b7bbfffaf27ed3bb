"""`memosight train ngrams`: the corpus n-gram table that drafts where the prompt has no match.

    memosight train ngrams --distill-tokens 3000000 --min-count 5               # the embedded model's
    memosight train ngrams --model DIR --corpus DIR [--save-to DIR]             # any model's tokenizer

Counts what follows every context of 1..4 tokens in the training split of the corpus (the same
split `train model` uses, so held-out files stay unseen) and saves draft_ngrams.npz beside the model.
With --distill-tokens it counts the model's own greedy choice after each context instead of the
corpus's next token: verification accepts exactly that, and on held-out code such a table's guesses
were accepted 1.8x as often (first guess right 50% of the time against 39%).
Top-level imports stay light: `memosight --help` imports this module.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model folder or hub id whose tokenizer to use (default: the embedded model)")
    parser.add_argument("--corpus", action="append", metavar="DIR|stdlib|site",
                        help="code to count (repeatable): a folder, 'stdlib' or 'site' (default: stdlib and site)")
    parser.add_argument("--save-to", metavar="DIR", help="where draft_ngrams.npz goes (default: the model folder)")
    parser.add_argument("--max-order", type=int, default=4, help="longest context in tokens (default 4)")
    parser.add_argument("--min-count", type=int, default=8,
                        help="contexts seen fewer times are dropped (default 8: a smaller file, the same hits)")
    parser.add_argument("--val-fraction", type=float, default=0.03, help="files held out, as in train model")
    parser.add_argument("--distill-tokens", type=int, default=0, metavar="N",
                        help="count the model's own greedy choice after each position instead of the corpus's next "
                             "token, over N corpus tokens (windows spread evenly): what verification accepts. "
                             "Runs the model over them (about 4,000 tokens/s on one CPU core for the embedded one)")
    parser.add_argument("--device", default=None, help="for --distill-tokens: auto, cpu, cuda")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..drafts.ngram import NgramTable
    from ..loading import DEFAULT_MODEL_DIR, ModelLoadError, load_tokenizer
    from .corpus import build_corpus, resolve_sources

    if args.max_order < 1 or args.min_count < 1:
        print("memosight: --max-order and --min-count must be at least 1", file=sys.stderr)
        return 2
    try:
        tokenizer = load_tokenizer(args.model)
        corpus = build_corpus(resolve_sources(args.corpus or ["stdlib", "site"]), val_fraction=args.val_fraction)
    except (ModelLoadError, FileNotFoundError) as exc:
        print(f"memosight: {exc}", file=sys.stderr)
        return 2
    if not corpus.train:
        print("memosight: the corpus is empty; give a folder of source code", file=sys.stderr)
        return 2
    save_to = Path(args.save_to) if args.save_to else (Path(args.model) if args.model else DEFAULT_MODEL_DIR)
    if not save_to.is_dir():
        print(f"memosight: {save_to} is not a folder; pass --save-to DIR", file=sys.stderr)
        return 2
    started = time.perf_counter()
    end = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    texts = [f.text for f in corpus.train]
    encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    tokens = np.fromiter((t for ids in encoded for t in (*ids, end)), dtype=np.int64)
    following = None
    if args.distill_tokens > 0:
        tokens, following = greedy_choices(args.model, args.device, tokens, args.distill_tokens)
    table = NgramTable.build(tokens, max_order=args.max_order, min_count=args.min_count, following=following)
    path = table.save(save_to)
    sizes = ", ".join(f"{n}-token {len(keys):,}" for n, (keys, _, _) in sorted(table.orders.items()))
    counted = "the model's greedy choices at" if following is not None else "the next token after"
    print(f"counted {counted} {len(tokens):,} positions of {len(texts):,} files in {time.perf_counter() - started:.0f} s; "
          f"kept {len(table):,} contexts ({sizes}); wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


def greedy_choices(model: str | None, device: str | None, tokens, budget: int, window: int = 1024):
    """Windows of `tokens` spread evenly over the stream, up to `budget` tokens, and the model's
    greedy next token at each of their positions."""
    import numpy as np
    import torch
    from tqdm import tqdm

    from .. import kv
    from ..loading import load_engine

    engine = load_engine(model, device=device, dtype="float32")
    window = min(window, getattr(engine.model.config, "max_position_embeddings", None) or window)
    starts = list(range(0, max(1, len(tokens) - window), window))
    keep = max(1, min(len(starts), budget // window))
    starts = [starts[round(i * len(starts) / keep)] for i in range(keep)]
    lm_head = engine.model.get_output_embeddings()
    windows, choices = [], []
    with torch.inference_mode():
        for start in tqdm(starts, desc="greedy choices", unit="window", file=sys.stderr):
            piece = tokens[start:start + window]
            ids = torch.tensor([piece.tolist()], device=engine.device)
            hidden = kv.forward_hidden(engine.model, ids, kv.new_cache(engine.model))
            windows.append(piece)
            choices.append(lm_head(hidden[0]).argmax(-1).cpu().numpy())
    return np.concatenate(windows), np.concatenate(choices)
