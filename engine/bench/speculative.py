"""`memosight bench speculative --corpus DIR [--json]`: speculative decoding against plain greedy.

Side by side in one run, same model, dtype and device, prompts cut from real source files:
transformers `generate` greedy (the baseline), transformers prompt-lookup decoding, our plain loop,
and our speculative loop with each draft source alone and all combined. Methods take turns on every
prompt, so machine noise falls on all of them alike; each speculative method keeps its draft
controller from prompt to prompt, as the engine does from request to request.

Each method first prefills all but the last prompt token into its own cache (transformers' forward
and DynamicCache for the transformers methods), timed apart from decoding. The main figures are
decoding from that cache, which is what speculation changes and what a keystroke costs once the KV
cache is reused; the figures with prefill add each method's prefill time (a cold prompt).
transformers' prompt-lookup decoding goes wrong when handed a prefilled cache (its output stops
matching greedy), so it runs from the bare prompt and its decoding time is its total time less
transformers' prefill of the same prompt, measured just before it.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", required=True, help="folder of source files (held-out code)")
    parser.add_argument("--model", help="model folder or hub id (default: the embedded model)")
    parser.add_argument("--device", default=None, help="auto, cpu, cuda")
    parser.add_argument("--dtype", default="float32", help="float32 (exact) | bfloat16 | float16")
    parser.add_argument("--prompts", type=int, default=24, help="number of cursor positions")
    parser.add_argument("--min-new", type=int, default=32)
    parser.add_argument("--max-new", type=int, default=128)
    parser.add_argument("--prompt-chars", type=int, default=4000, help="text before the cursor in the prompt")
    parser.add_argument("--methods", default="all", help="comma list, or 'all'")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")


METHODS = ("hf_greedy", "hf_prompt_lookup", "plain", "spec_heads", "spec_ngram", "spec_table", "spec_lookahead",
           "spec_all")


def run(args: argparse.Namespace) -> int:
    import torch

    from .. import kv
    from ..decode import DraftController, SpecStats
    from ..loading import ModelLoadError, load_engine
    from .common import cut_points, source_files, table

    try:
        engine = load_engine(args.model, device=args.device, dtype=args.dtype)
    except ModelLoadError as exc:
        print(f"memosight: {exc}", file=sys.stderr)
        return 2
    methods = METHODS if args.methods == "all" else tuple(m.strip() for m in args.methods.split(","))
    all_drafters = {"ngram": next(d for d in engine.drafters if d.name == "ngram"), "lookahead": engine.lookahead,
                    "table": engine.table_drafter, "heads": engine.heads_drafter}  # the engine's order
    methods = tuple(m for m in methods if not m.startswith("spec_") or m == "spec_all"
                    or all_drafters.get(m.removeprefix("spec_")) is not None)
    rng = random.Random(args.seed)
    prompts = []
    files = source_files(args.corpus)
    rng.shuffle(files)
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for cut in cut_points(text, 2, rng):
            prefix, suffix = text[max(0, cut - args.prompt_chars):cut], text[cut:cut + 1000]
            prompts.append((engine.prompt_ids(prefix, suffix), rng.randint(args.min_new, args.max_new)))
        if len(prompts) >= args.prompts:
            break
    prompts = prompts[: args.prompts]
    model, eos = engine.model, sorted(engine.eos_ids)

    def hf(ids, n, **kw):
        out = model.generate(torch.tensor([ids], device=engine.device), max_new_tokens=n, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos[0], **kw)
        return out[0, len(ids):].tolist()

    def sync() -> None:
        if engine.device.type == "cuda":
            torch.cuda.synchronize()

    @torch.inference_mode()
    def prefill(method, ids) -> dict:
        """All but the last prompt token into the method's cache: what a keystroke finds cached."""
        if method.startswith("hf_"):
            return kv.transformers_prefill(model, ids[:-1])
        engine.prompt_cache.clear()
        engine.prompt_cache.prefill_hidden(model, ids[:-1])
        return {}

    results = {m: {"seconds": 0.0, "prefill_seconds": 0.0, "tokens": 0, "match": 0} for m in methods}
    stats_of = {m: SpecStats() for m in methods}
    # One draft controller per method for the whole run, as the engine keeps one across requests:
    # what it learns about the sources (which pay, which cost more time than they save) carries over.
    controllers = {m: DraftController() for m in methods}
    reference: list[list[int]] = []
    for i, (ids, n) in enumerate(prompts):
        reference.append(hf(ids, n))  # also warms up this prompt length
        order = list(methods)
        rng.shuffle(order)
        for method in order:
            sync()
            start = time.perf_counter()
            cached = prefill(method, ids)
            sync()  # GPU work is asynchronous: the clock must wait for it
            decoding = time.perf_counter()
            if method == "hf_greedy":
                out = hf(ids, n, **cached)
            elif method == "hf_prompt_lookup":
                # Its candidate generator goes wrong on a prefilled cache (the output stops matching
                # greedy), so it runs from the bare prompt, and its own prefill is taken off below.
                out = hf(ids, n, prompt_lookup_num_tokens=10)
            elif method == "plain":
                out = engine.generate(ids, n, speculative=False)
            else:
                names = list(all_drafters) if method == "spec_all" else [method.removeprefix("spec_")]
                engine.drafters = [all_drafters[k] for k in names if all_drafters[k] is not None]
                engine.spec_stats, engine.controller = stats_of[method], controllers[method]
                out = engine.generate(ids, n, speculative=True)
            sync()
            prefill_seconds = decoding - start
            decode_seconds = time.perf_counter() - decoding
            if method == "hf_prompt_lookup":  # the same prefill happened inside generate
                decode_seconds = max(decode_seconds - prefill_seconds, 1e-9)
            results[method]["seconds"] += decode_seconds
            results[method]["prefill_seconds"] += prefill_seconds
            results[method]["tokens"] += len(out)
            results[method]["match"] += int(out == reference[i])
        print(f"\rprompt {i + 1}/{len(prompts)}", end="", file=sys.stderr)
    print(file=sys.stderr)
    def rate(r, with_prefill=False):
        seconds = r["seconds"] + (r["prefill_seconds"] if with_prefill else 0.0)
        return r["tokens"] / seconds if seconds else 0.0

    base = results.get("hf_greedy")
    rows = []
    for method in methods:
        r = results[method]
        s = stats_of[method].to_json() if method.startswith("spec") else None
        rows.append({
            "method": method, "tokens_per_s": round(rate(r), 1),
            "speedup": round(rate(r) / rate(base), 3) if base else None,
            "tokens_per_s_with_prefill": round(rate(r, True), 1),
            "speedup_with_prefill": round(rate(r, True) / rate(base, True), 3) if base else None,
            "tokens_per_step": s["tokens_per_step"] if s else None,
            "exact_match": round(r["match"] / len(prompts), 4),
            "sources": s["sources"] if s else None, "head_accuracy": s["head_accuracy"] if s else None,
        })
    longest = max(files[:50], key=lambda f: f.stat().st_size)
    reuse = _keystroke_reuse(engine, longest, 1500)
    peak_mb = (torch.cuda.max_memory_allocated() / 2**20 if engine.device.type == "cuda"
               else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    summary = {"model": engine.name, "device": str(engine.device), "dtype": str(engine.dtype).removeprefix("torch."),
               "threads": torch.get_num_threads(), "prompts": len(prompts),
               "new_tokens": [args.min_new, args.max_new], "methods": rows, "keystroke_reuse": reuse,
               "peak_memory_mb": round(peak_mb, 1)}
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"model {summary['model']}  device {summary['device']}  dtype {summary['dtype']}  threads "
          f"{summary['threads']}  prompts {len(prompts)}  new tokens {args.min_new}-{args.max_new}")
    print(table(rows, [("method", "method"), ("tokens_per_s", "tok/s"), ("speedup", "speedup"),
                       ("tokens_per_step", "tok/step"), ("exact_match", "= greedy"),
                       ("tokens_per_s_with_prefill", "tok/s +prefill"), ("speedup_with_prefill", "speedup +prefill")]))
    print("tok/s: decoding with the prompt already cached (as after a keystroke); +prefill: the whole prompt "
          "prefilled first, each method with its own forward")
    for row in rows:
        if row["sources"]:
            acc = ", ".join(f"{k} {v['accepted']}/{v['drafted']}" for k, v in row["sources"].items())
            heads = " ".join(f"{a:.2f}" for a in row["head_accuracy"] or [])
            print(f"  {row['method']}: accepted/drafted nodes: {acc}" + (f"; head top-1: {heads}" if heads else ""))
    print(f"keystroke on a {reuse['prompt_tokens']}-token prompt: prefilled {reuse['prefilled_tokens']} tokens "
          f"({reuse['reused_tokens']} reused)")
    print(f"peak memory: {summary['peak_memory_mb']} MB")
    return 0


def _keystroke_reuse(engine, path, prompt_tokens: int) -> dict:
    """Prefill a ~`prompt_tokens` prompt, then the same prompt with one more character typed."""
    text = path.read_text(encoding="utf-8", errors="replace")
    ids = engine.encode(text)[:prompt_tokens]
    prefix = engine.decode(ids)
    engine.prompt_cache.clear()
    engine.generate(engine.prompt_ids(prefix), 4)
    before = engine.prompt_cache.reused_tokens
    typed = engine.prompt_ids(prefix + "x")
    engine.generate(typed, 4)
    reused = engine.prompt_cache.reused_tokens - before
    return {"prompt_tokens": len(typed), "reused_tokens": reused, "prefilled_tokens": len(typed) - reused}
