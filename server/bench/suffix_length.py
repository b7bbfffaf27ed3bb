"""`memosight bench context --suffix-lengths 0,16,32,64,256`: what the text after the cursor is worth,
by its length in tokens.

The FIM prompt puts the suffix behind the typed text, so every keystroke before it prefills the
suffix again (its cells were computed against the old prefix: reusing them costs NLL +37%,
measured): its length is latency, one token's prefill per token on every keystroke. This measures
what each length gives in quality: the true next line's loss (nats per token, and bits per
character of the line) under one prefix (the packed one at the budget) with the suffix the server
packs under each bound (`suffix_tokens`), paired against the longest, at cursors mid-function (the
rest of the function after the cursor) and at a function's end (nothing of it after the cursor).
"""

from __future__ import annotations

import math
import random

from ..context.near import function_rows
from ..context.packing import ContextCompressor, bounded_share
from ..documents import Document
from .context_measures import Tally, code_positions, line_being_written, paired_loss_difference


def where(doc: Document, cursor: int, row: int) -> str:
    """mid_function: code of the cursor's function comes after its line; function_end: none does;
    outside: no function around the cursor."""
    start, end = function_rows(doc.language, doc.text, doc.snapshot()[1], cursor, row)
    if start is None:
        return "outside"
    lines = doc.text.split("\n")[row + 1:end + 1]
    return "mid_function" if any(line.strip() for line in lines) else "function_end"


def suffix_lengths(files: list[Document], args, count_tokens, engine, rng: random.Random,
                   lengths: list[int]) -> dict:
    lengths = sorted(set(lengths))
    compressor = ContextCompressor()
    tallies: dict[str, dict[int, Tally]] = {}
    suffix_tokens: dict[int, list[int]] = {n: [] for n in lengths}
    chars = {}
    for doc, row in code_positions(files, rng)[:args.em_positions]:
        true_line, current, cursor = line_being_written(doc, row)
        group = where(current, cursor, row)
        prefix = compressor.build(current, cursor, args.budget, args.suffix_share, count_tokens).prefix
        for n in lengths:  # shortest first: the prompt's head stays in the KV cache from one to the next
            share = bounded_share(args.suffix_share, n, args.budget)
            suffix = compressor.build(current, cursor, args.budget, share, count_tokens).suffix
            nats, tokens = engine.continuation_loss(prefix, suffix, true_line)
            suffix_tokens[n].append(count_tokens(suffix) if suffix else 0)
            result = {"file": doc.path, "nats": nats, "tokens": tokens, "prompt_tokens": 0,
                      "true_chars": len(true_line.strip())}
            for name in ("all", group):
                tallies.setdefault(name, {}).setdefault(n, Tally()).add(result)
        for name in ("all", group):
            chars[name] = chars.get(name, 0) + len(true_line)
    longest = lengths[-1]
    out = {}
    for name, by_length in tallies.items():
        base = by_length[longest]
        out[name] = {str(n): {"positions": t.n, "line_loss": round(t.nats / t.tokens, 4) if t.tokens else None,
                              "bits_per_char": round(t.nats / math.log(2) / chars[name], 4) if chars[name] else None,
                              **({"loss_minus_longest": d["loss_minus_packed"], "ci95": d["ci95"]}
                                 if n != longest and (d := paired_loss_difference(base, t)) else {})}
                     for n, t in by_length.items()}
    return {"budget": args.budget, "suffix_share": args.suffix_share, "lengths": lengths,
            "suffix_tokens_mean": {str(n): round(sum(v) / len(v), 1) if v else 0 for n, v in suffix_tokens.items()},
            "by_cursor": out}


def table(out: dict) -> str:
    lines = [f"the suffix's length (budget {out['budget']}, at most {out['suffix_share']} of it after the cursor): "
             "the true next line's loss under one prefix",
             f"{'cursors':<24} {'suffix_tokens':>13} {'mean tokens':>11} {'loss':>7} {'bits/char':>9} "
             f"{'vs longest':>10}   95% interval"]
    for name, by_length in out["by_cursor"].items():
        for i, (n, t) in enumerate(by_length.items()):
            label = f"{name} ({t['positions']})" if i == 0 else ""
            versus = f"{t['loss_minus_longest']:+.4f}" if "loss_minus_longest" in t else "-"
            interval = f"[{t['ci95'][0]:+.4f}, {t['ci95'][1]:+.4f}]" if "ci95" in t else ""
            lines.append(f"{label:<24} {n:>13} {out['suffix_tokens_mean'][n]:>11} {t['line_loss']:>7} "
                         f"{t['bits_per_char']:>9} {versus:>10}   {interval}")
    return "\n".join(lines)
