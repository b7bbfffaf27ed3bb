"""`memosight bench context --recompute 0,4,8,16,32,all`: what a keystroke's moved cells cost in
quality, by how many tokens of each moved run it computes again.

A key typed before the FIM suffix moves the suffix's tokens; on llama.cpp the engine moves their
cached cells into place (computed against the old text) past each run's first R tokens, which it
computes again (engine/runtime/llamacpp_prompt.py). Here, at real cursors of held-out code, the
user has typed part of a line and types a burst more (--burst-chars, default 1-6 characters): the
cache holds the prompt before the burst, computed exactly, and is brought to the prompt after it the
keystroke's way. Scored against a fresh prefill of the same prompt, paired: the rest of the true
line's loss (nats per token) and how many of its first tokens greedy decoding gets right. By cursor:
writing a line inside a function (code of it follows), and new code at a function's end (none does).
The default R is the smallest within 1% of fresh's loss with the same greedy agreement, on both.
"""

from __future__ import annotations

import random

from ..context.packing import ContextCompressor, bounded_share
from ..documents import Document
from .context_measures import Tally, code_positions, line_being_written, paired_loss_difference
from .suffix_length import where

ALL = 1 << 20  # "all": every token after the common prefix computed, on the keystroke's own path
GROUPS = ("mid_function", "function_end")


def recompute_counts(value: str) -> list[int]:
    counts = []
    for v in value.split(","):
        v = v.strip()
        if v:
            counts.append(ALL if v == "all" else int(v))
    if not counts or min(counts) < 0:
        raise ValueError(value)
    return sorted(set(counts))


def keystroke_cells(files: list[Document], args, count_tokens, engine, rng: random.Random,
                    recomputes: list[int]) -> dict:
    compressor = ContextCompressor()
    share = bounded_share(args.suffix_share, args.suffix_tokens, args.budget)
    labels = ["fresh"] + [label(r) for r in recomputes]
    tallies = {g: {name: Tally() for name in labels} for g in GROUPS}
    right = {g: {name: [] for name in labels} for g in GROUPS}
    low, high = args.burst_chars
    for doc, row in code_positions(files, rng):
        if min(t.n for by in tallies.values() for t in by.values()) >= args.em_positions // 2:
            break
        true_line, current, cursor = line_being_written(doc, row)
        body = true_line.lstrip()
        indent = true_line[:len(true_line) - len(body)]
        burst = rng.randint(low, high)
        if len(body) < burst + 4:
            continue
        typed = rng.randint(burst, len(body) - 4)  # at least 4 characters left to score
        docs = [(Document(doc.uri, current.text[:cursor] + indent + body[:chars] + current.text[cursor:], doc.language),
                 cursor + len(indent) + chars) for chars in (typed - burst, typed)]
        group = where(docs[1][0], docs[1][1], row)  # with the line partly typed, in its function
        if group not in tallies or tallies[group]["fresh"].n >= args.em_positions // 2:
            continue
        prompts = []
        for text, at in docs:
            packed = compressor.build(text, at, args.budget, share, count_tokens)
            prompts.append((packed.prefix, packed.suffix))
        rest = body[typed:]
        for name, r in [("fresh", None)] + [(label(r), r) for r in recomputes]:
            nats, tokens, first_right = engine.keystroke_loss(prompts[0], prompts[1], rest, r)
            tallies[group][name].add({"file": doc.path, "nats": nats, "tokens": tokens, "prompt_tokens": 0,
                                      "true_chars": len(rest)})
            right[group][name].append(first_right)
    return summary(tallies, right, recomputes, args)


def label(r: int) -> str:
    return "all" if r >= ALL else str(r)


def summary(tallies: dict, right: dict, recomputes: list[int], args) -> dict:
    out = {}
    for group, by_name in tallies.items():
        fresh = by_name["fresh"]
        base_loss = fresh.nats / fresh.tokens if fresh.tokens else None
        rows = {}
        for name, t in by_name.items():
            loss = t.nats / t.tokens if t.tokens else None
            lead = right[group][name]
            rows[name] = {"cursors": t.n, "loss": round(loss, 4) if loss is not None else None,
                          "vs_fresh_pct": round(100 * (loss - base_loss) / base_loss, 2) if base_loss and loss else None,
                          "greedy_right": round(sum(lead) / len(lead), 3) if lead else None}
            if name != "fresh" and (d := paired_loss_difference(fresh, t)):
                rows[name].update({"minus_fresh": d["loss_minus_packed"], "ci95": d["ci95"]})
        out[group] = rows
    return {"budget": args.budget, "burst_chars": list(args.burst_chars), "by_cursor": out,
            "chosen": choose(out, [label(r) for r in recomputes])}


def choose(by_cursor: dict, labels: list[str]) -> str | None:
    """The smallest R within 1% of fresh's loss whose greedy agreement is fresh's (within 2%), at
    every kind of cursor."""
    for name in labels:
        rows = [group[name] for group in by_cursor.values() if group["fresh"]["cursors"]]
        if rows and all(r["vs_fresh_pct"] is not None and r["vs_fresh_pct"] <= 1.0 for r in rows) and all(
                (g[name]["greedy_right"] or 0) >= 0.98 * (g["fresh"]["greedy_right"] or 0)
                for g in by_cursor.values() if g["fresh"]["cursors"]):
            return name
    return None


def table(out: dict) -> str:
    lines = [f"a keystroke's moved cells (budget {out['budget']}, bursts of {out['burst_chars'][0]}-"
             f"{out['burst_chars'][1]} characters): the rest of the true line, against a fresh prefill",
             f"{'cursors':<22} {'recompute':>9} {'loss':>7} {'vs fresh':>9} {'greedy right':>12}   95% interval"]
    for group, rows in out["by_cursor"].items():
        for i, (name, r) in enumerate(rows.items()):
            head = f"{group} ({r['cursors']})" if i == 0 else ""
            pct = f"{r['vs_fresh_pct']:+.2f}%" if r["vs_fresh_pct"] is not None and name != "fresh" else "-"
            interval = f"[{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}]" if "ci95" in r else ""
            lines.append(f"{head:<22} {name:>9} {r['loss']!s:>7} {pct:>9} {r['greedy_right']!s:>12}   {interval}")
    lines.append(f"chosen: {out['chosen'] or 'none within 1%'}")
    return "\n".join(lines)
